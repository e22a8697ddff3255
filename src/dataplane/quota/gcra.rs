//! The GCRA bucket: `limit` units per minute as one atomic theoretical
//! arrival time, charged whole at admission ([`Charge`]) and settled by
//! any amount on completion; pure given `now`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(super) const MINUTE_NS: u64 = 60_000_000_000;

/// A settled answer is charged at most this many minutes of the
/// allocation: a usage report past it is a backend's garbage, and would
/// otherwise block the tenant on this node for years.
pub(super) const MAX_SETTLE_MINUTES: u64 = 60;

/// Nanoseconds in `d`, saturating.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A GCRA bucket of `limit` units per minute. `tat` is the theoretical
/// arrival time (ns on the monotonic clock): every unit charged moves it
/// one interval (a minute over the limit) later; the bucket admits while
/// it is at most `tolerance` (the tenant's `burst`) ahead of now. A cost
/// is charged whole even past the tolerance (debt), so a request larger
/// than the burst is still admitted once the bucket is clear, and later
/// requests wait it out. Pure given `now`.
#[derive(Debug)]
pub struct Gcra {
    /// Units per minute; `u64::MAX` when unlimited.
    pub(super) limit: AtomicU64,
    pub(super) tat: AtomicU64,
    /// How far ahead of now the bucket may run and still admit (ns).
    pub(super) tolerance: u64,
}

/// A refusal by one bucket: how long until it admits again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait(pub u64);

/// What one [`Gcra::take`] charged: the units and the limit they were
/// charged at (their interval), so that settling moves the bucket back by
/// exactly what was charged, whatever the limit is by then. The default
/// charged nothing (an unlimited bucket).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub(super) units: u64,
    /// 0: nothing was charged.
    pub(super) limit: u64,
}

impl Charge {
    pub fn units(&self) -> u64 {
        self.units
    }
}

impl Gcra {
    /// An unlimited bucket that, once limited, admits `burst` of its
    /// allocation at once.
    pub fn new(burst: Duration) -> Self {
        Self {
            limit: AtomicU64::new(u64::MAX),
            tat: AtomicU64::new(0),
            tolerance: nanos(burst),
        }
    }

    /// Sets the allocation; the debt (`tat`) carries over.
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn limit(&self) -> Option<u64> {
        match self.limit.load(Ordering::Relaxed) {
            u64::MAX => None,
            l => Some(l),
        }
    }

    /// The burst: how far ahead of now the bucket may run (ns).
    pub fn tolerance(&self) -> u64 {
        self.tolerance
    }

    /// Nanoseconds per unit; at least 1, so a limit above 60 billion per
    /// minute acts as one unit per nanosecond (far past any real traffic).
    pub(super) fn interval(limit: u64) -> u64 {
        (MINUTE_NS / limit.max(1)).max(1)
    }

    /// Admits `cost` units at `now`, or says how long to wait. The charge
    /// is capped at one minute of the allocation (an estimate such as a
    /// huge `max_tokens` blocks its tenant for at most a minute until the
    /// answer settles it).
    pub fn take(&self, now: u64, cost: u64) -> Result<Charge, Wait> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == u64::MAX {
            return Ok(Charge::default());
        }
        if limit == 0 {
            return Err(Wait(MINUTE_NS));
        }
        let units = cost.min(limit);
        let step = Self::interval(limit).saturating_mul(units);
        let ahead = now.saturating_add(self.tolerance);
        self.tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                (tat <= ahead).then(|| tat.max(now).saturating_add(step))
            })
            .map(|_| Charge { units, limit })
            .map_err(|tat| Wait(tat.saturating_sub(ahead)))
    }

    /// Corrects `charge` (from this bucket's [`take`](Self::take)) to
    /// `used` units: refunds what was charged beyond them (never more
    /// than was charged), or charges what they used beyond the charge (up
    /// to `MAX_SETTLE_MINUTES` of the allocation), at the interval the
    /// charge was taken at.
    pub fn settle(&self, charge: Charge, used: u64) {
        if charge.limit == 0 {
            return;
        }
        let interval = Self::interval(charge.limit);
        let used = used.min(charge.limit.saturating_mul(MAX_SETTLE_MINUTES));
        let (more, units) = if used >= charge.units {
            (true, used - charge.units)
        } else {
            (false, charge.units - used)
        };
        if units == 0 {
            return;
        }
        let step = interval.saturating_mul(units);
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(if more {
                    tat.saturating_add(step)
                } else {
                    tat.saturating_sub(step)
                })
            });
    }

    /// (limit, remaining, reset) as OpenAI means them, for the headers:
    /// of this node's allocation per minute, what is left unused in the
    /// minute window ending now (the units still outstanding on the
    /// bucket are the window's use), and the time until the bucket is
    /// full again. The burst only says how much of it may go at once.
    pub fn state(&self, now: u64) -> Option<(u64, u64, u64)> {
        let limit = self.limit()?;
        if limit == 0 {
            return Some((0, 0, MINUTE_NS));
        }
        let outstanding = self.tat.load(Ordering::Acquire).saturating_sub(now);
        let used = outstanding.div_ceil(Self::interval(limit));
        Some((limit, limit.saturating_sub(used), outstanding))
    }
}
