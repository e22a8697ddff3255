//! What this node saw of each zone during the current reporting period:
//! for the requests whose effective zone was Z, how many Z served, how many
//! it failed, and how many it never answered in time. The control plane
//! turns these into zone scores on the leader.
//!
//! A request that Z could not answer at all (no usable backend, or every
//! attempt there timed out) counts as an error *and* a timeout: the client
//! would have waited in vain without cross-zone fallback. A request Z
//! answered with an error counts as an error only.

use std::sync::atomic::{AtomicU64, Ordering};

use zonegate_cluster::ZoneId;

/// How a request's effective zone did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneResult {
    /// A backend of the zone answered.
    Served,
    /// Backends of the zone answered with errors (5xx, resets).
    Failed,
    /// The zone gave no answer in time: nothing usable, or timeouts only.
    Unanswered,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
}

/// One zone's counts over a period.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ZoneCounts {
    pub requests: u64,
    pub errors: u64,
    pub timeouts: u64,
}

impl ZoneCounts {
    pub fn error_rate(&self) -> f64 {
        ratio(self.errors, self.requests)
    }

    pub fn timeout_rate(&self) -> f64 {
        ratio(self.timeouts, self.requests)
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// Per-zone counters, lock-free on the request path. The zone set is fixed
/// at start (every zone of the config); other zones are ignored.
#[derive(Debug)]
pub struct ZoneStats {
    /// Sorted by zone, once each. A deployment has a handful of zones:
    /// comparing a few short names costs less than hashing one.
    zones: Box<[(ZoneId, Counters)]>,
}

impl ZoneStats {
    pub fn new<'a>(zones: impl IntoIterator<Item = &'a ZoneId>) -> Self {
        let mut zones: Vec<(ZoneId, Counters)> = zones
            .into_iter()
            .map(|z| (z.clone(), Counters::default()))
            .collect();
        zones.sort_by(|a, b| a.0.cmp(&b.0));
        zones.dedup_by(|a, b| a.0 == b.0);
        Self {
            zones: zones.into(),
        }
    }

    pub fn record(&self, zone: &ZoneId, result: ZoneResult) {
        let Some((_, c)) = self.zones.iter().find(|(z, _)| z == zone) else {
            return;
        };
        c.requests.fetch_add(1, Ordering::Relaxed);
        if result != ZoneResult::Served {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        if result == ZoneResult::Unanswered {
            c.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts since the last call, per zone (sorted), and resets them.
    pub fn take(&self) -> Vec<(ZoneId, ZoneCounts)> {
        self.zones
            .iter()
            .map(|(z, c)| {
                (
                    z.clone(),
                    ZoneCounts {
                        requests: c.requests.swap(0, Ordering::Relaxed),
                        errors: c.errors.swap(0, Ordering::Relaxed),
                        timeouts: c.timeouts.swap(0, Ordering::Relaxed),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_errors_and_timeouts_per_zone_and_resets() {
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        let stats = ZoneStats::new([&a, &b]);
        stats.record(&a, ZoneResult::Served);
        stats.record(&a, ZoneResult::Failed);
        stats.record(&a, ZoneResult::Unanswered);
        stats.record(&a, ZoneResult::Unanswered);
        stats.record(&ZoneId::new("elsewhere"), ZoneResult::Failed);
        let taken = stats.take();
        let (_, ca) = &taken[0];
        assert_eq!((ca.requests, ca.errors, ca.timeouts), (4, 3, 2));
        assert_eq!(ca.error_rate(), 0.75);
        assert_eq!(ca.timeout_rate(), 0.5);
        assert_eq!(taken[1].1, ZoneCounts::default());
        assert_eq!(stats.take()[0].1, ZoneCounts::default(), "take resets");
    }

    #[test]
    fn zones_are_counted_once_each_and_taken_in_order() {
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        let stats = ZoneStats::new([&b, &a, &b]);
        stats.record(&b, ZoneResult::Served);
        let taken = stats.take();
        let zones: Vec<&ZoneId> = taken.iter().map(|(z, _)| z).collect();
        assert_eq!(zones, [&a, &b]);
        assert_eq!(taken[1].1.requests, 1);
    }
}
