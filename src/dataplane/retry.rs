//! The retry budget, in Envoy's shape: the retries running at once may be
//! at most `ratio` of the requests in flight, but never fewer than
//! `min_concurrent` of them, so a failing fleet is not buried under its own
//! retries and a quiet client always gets its retry. Counts are live, not
//! a window: a burst of failures spends nothing that a later request
//! misses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How many retries may run at once while `active` requests are in flight.
/// Pure; `ratio` is a validated share in [0, 1] (anything else counts as 0).
pub fn allowed(active: u64, ratio: f64, min_concurrent: u32) -> u64 {
    let ratio = if ratio.is_finite() {
        ratio.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // f64 → u64 saturates; a share of a u64 fits.
    let by_ratio = (active as f64 * ratio).floor() as u64;
    by_ratio.max(u64::from(min_concurrent))
}

/// The node's retries in flight. Shared by every data-plane thread: it is
/// touched only when a retry starts or ends, never by a request that needs
/// none.
#[derive(Debug, Default)]
pub struct RetryBudget {
    running: Arc<AtomicU64>,
}

impl RetryBudget {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a retry if fewer than [`allowed`] run now; the retry counts
    /// until the returned guard drops. `active`: the requests in flight,
    /// the one asking included.
    pub fn try_retry(&self, active: u64, ratio: f64, min_concurrent: u32) -> Option<Retrying> {
        let cap = allowed(active, ratio, min_concurrent);
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        Some(Retrying(Arc::clone(&self.running)))
    }

    /// Retries running now.
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Acquire)
    }
}

/// One retry's place in the budget, given back on drop.
#[derive(Debug)]
pub struct Retrying(Arc<AtomicU64>);

impl Drop for Retrying {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_is_a_share_of_active_requests_with_a_floor() {
        // (active, ratio, floor, allowed)
        for (active, ratio, floor, want) in [
            (0, 0.2, 3, 3),
            (1, 0.2, 3, 3),
            (10, 0.2, 3, 3),
            (100, 0.2, 3, 20),
            (1_000, 0.2, 10, 200),
            (99, 0.2, 0, 19),
            (100, 0.0, 0, 0),
            (100, 1.0, 0, 100),
            (u64::MAX, 1.0, 0, u64::MAX),
            (u64::MAX, 0.5, 0, u64::MAX / 2 + 1),
            (100, f64::NAN, 2, 2),
            (100, 7.0, 0, 100),
        ] {
            assert_eq!(
                allowed(active, ratio, floor),
                want,
                "{active} active at {ratio} with floor {floor}"
            );
        }
    }

    #[test]
    fn retries_running_at_once_are_capped_and_given_back() {
        let b = RetryBudget::new();
        // 100 requests in flight at 20%: 20 retries at once, not 21.
        let held: Vec<Retrying> = (0..25).filter_map(|_| b.try_retry(100, 0.2, 3)).collect();
        assert_eq!(held.len(), 20);
        assert_eq!(b.running(), 20);
        assert!(b.try_retry(100, 0.2, 3).is_none());
        drop(held);
        assert_eq!(b.running(), 0);
        assert!(b.try_retry(100, 0.2, 3).is_some(), "given back on drop");
    }

    #[test]
    fn a_quiet_client_always_gets_its_retry() {
        // One request at a time, each retried: the old per-window floor ran
        // out after 20 retries in 10 s; a floor of concurrent retries never
        // does.
        let b = RetryBudget::new();
        for i in 0..10_000 {
            let retry = b.try_retry(1, 0.2, 3);
            assert!(retry.is_some(), "retry {i} refused");
        }
        assert_eq!(b.running(), 0);
    }

    #[test]
    fn the_floor_holds_while_the_share_is_smaller() {
        let b = RetryBudget::new();
        let held: Vec<Retrying> = (0..10).filter_map(|_| b.try_retry(2, 0.2, 3)).collect();
        assert_eq!(held.len(), 3);
        // More requests in flight raise the cap for the next retry.
        assert!(b.try_retry(2, 0.2, 3).is_none());
        assert!(b.try_retry(40, 0.2, 3).is_some());
    }
}
