//! Requests in flight against a limit: a count taken and released
//! atomically, with the decision and the taking one step.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests in flight against a limit.
#[derive(Debug)]
pub struct Occupancy {
    pub(super) limit: AtomicU64,
    pub(super) used: AtomicU64,
}

impl Occupancy {
    pub(super) fn unlimited() -> Self {
        Self {
            limit: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
        }
    }

    pub(super) fn set_limit(&self, limit: Option<u64>) {
        self.limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Takes `n` if they fit under the limit.
    pub(super) fn acquire(&self, n: u64) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u.saturating_add(n) <= limit).then(|| u + n)
            })
            .is_ok()
    }

    pub(super) fn release(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}
