//! What each tenant spent on each model, by the hour, in memory: this
//! node's answers (and on the leader, the cluster's, from the nodes'
//! reports) for `GET /admin/v1/spend?since=…`. A ring of hourly buckets
//! per (tenant, model) covers [`KEEP_HOURS`]; older spend is forgotten
//! (Prometheus keeps `zonegate_spend_total` for longer views). The counts
//! start at zero when the process starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

/// Hours of spend kept: 32 days, so `since=31d` (a month) is answered.
pub const KEEP_HOURS: u64 = 32 * 24;

const HOUR_MS: u64 = 3_600_000;

/// Hourly buckets: `(hour since the epoch, nano-units)`, indexed by the
/// hour modulo [`KEEP_HOURS`]; a bucket of an older hour is stale.
struct Ring(Box<[(u64, u64)]>);

impl Ring {
    fn new() -> Self {
        Ring(vec![(u64::MAX, 0); KEEP_HOURS as usize].into_boxed_slice())
    }

    fn add(&mut self, hour: u64, nanos: u64) {
        let slot = &mut self.0[(hour % KEEP_HOURS) as usize];
        if slot.0 != hour {
            *slot = (hour, 0);
        }
        slot.1 = slot.1.saturating_add(nanos);
    }

    /// The sum over the hours `from..=to`.
    fn sum(&self, from: u64, to: u64) -> u64 {
        self.0
            .iter()
            .filter(|(h, _)| *h != u64::MAX && *h >= from && *h <= to)
            .fold(0u64, |acc, (_, n)| acc.saturating_add(*n))
    }
}

/// Spend by (tenant, model), by the hour.
#[derive(Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
}

/// Tenant → model → what: looked up by `&str`, names allocated once.
type ByName<T> = HashMap<Arc<str>, HashMap<Arc<str>, T>>;

#[derive(Default)]
struct Inner {
    rings: ByName<Ring>,
    /// Spend since the last [`Ledger::take_pending`]: what this node's
    /// next demand report carries to the leader.
    pending: ByName<u64>,
}

/// The entry of (`tenant`, `model`) in `map`, made on first use.
fn entry<'m, T>(
    map: &'m mut ByName<T>,
    tenant: &str,
    model: &str,
    new: impl FnOnce() -> T,
) -> &'m mut T {
    if !map.contains_key(tenant) {
        map.insert(tenant.into(), HashMap::new());
    }
    let models = map.get_mut(tenant).expect("inserted above");
    if !models.contains_key(model) {
        models.insert(model.into(), new());
    }
    models.get_mut(model).expect("inserted above")
}

/// One (tenant, model) line of an answer, in nano-units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Line {
    pub tenant: String,
    pub model: String,
    pub nanos: u64,
}

impl Ledger {
    /// Adds `nanos` spent by `tenant` on `model` at `now_ms`.
    pub fn record(&self, tenant: &str, model: &str, nanos: u64, now_ms: u64) {
        if nanos == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        let p = entry(&mut inner.pending, tenant, model, || 0);
        *p = p.saturating_add(nanos);
        entry(&mut inner.rings, tenant, model, Ring::new).add(now_ms / HOUR_MS, nanos);
    }

    /// Adds what a node reported (the leader's cluster-wide view); nothing
    /// pending, it is not reported again.
    pub fn record_reported(&self, tenant: &str, model: &str, nanos: u64, now_ms: u64) {
        self.record_apart(tenant, model, nanos, now_ms);
    }

    /// Adds spend that no demand report carries and no budget reads (a
    /// shadow copy's, under the shadow's name): kept for
    /// [`Ledger::since`] only.
    pub fn record_apart(&self, tenant: &str, model: &str, nanos: u64, now_ms: u64) {
        if nanos == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        entry(&mut inner.rings, tenant, model, Ring::new).add(now_ms / HOUR_MS, nanos);
    }

    /// The spend since the last call, per tenant: (model, nano-units).
    pub fn take_pending(&self) -> BTreeMap<Arc<str>, Vec<(String, u64)>> {
        let pending = std::mem::take(&mut self.inner.lock().pending);
        pending
            .into_iter()
            .map(|(t, models)| {
                let mut v: Vec<(String, u64)> = models
                    .into_iter()
                    .map(|(m, n)| (m.to_string(), n))
                    .collect();
                v.sort();
                (t, v)
            })
            .collect()
    }

    /// Spend from the hour that holds `since_ms` to `now_ms`, per (tenant,
    /// model) in name order; only `tenant`'s when given. Resolution is the
    /// hour: the first hour counts whole.
    pub fn since(&self, since_ms: u64, now_ms: u64, tenant: Option<&str>) -> Vec<Line> {
        let (from, to) = (since_ms / HOUR_MS, now_ms / HOUR_MS);
        let inner = self.inner.lock();
        let mut out: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (t, models) in inner.rings.iter() {
            if tenant.is_some_and(|want| want != &**t) {
                continue;
            }
            for (m, ring) in models {
                let n = ring.sum(from, to);
                if n > 0 {
                    out.insert((t, m), n);
                }
            }
        }
        out.into_iter()
            .map(|((t, m), nanos)| Line {
                tenant: t.to_owned(),
                model: m.to_owned(),
                nanos,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_is_summed_per_tenant_and_model_over_the_hours_asked_for() {
        let l = Ledger::default();
        let (a, b, m) = ("a", "b", "m");
        let day = 24 * HOUR_MS;
        let now = 100 * day;
        l.record(a, m, 5, now);
        l.record(a, m, 7, now - HOUR_MS);
        l.record(b, m, 1, now - 2 * day);
        l.record(b, m, 0, now);
        let line = |t: &str, n| Line {
            tenant: t.into(),
            model: "m".into(),
            nanos: n,
        };
        assert_eq!(l.since(now - day, now, None), [line("a", 12)]);
        assert_eq!(l.since(now, now, None), [line("a", 5)]);
        assert_eq!(
            l.since(now - 3 * day, now, None),
            [line("a", 12), line("b", 1)]
        );
        assert_eq!(l.since(now - 3 * day, now, Some("b")), [line("b", 1)]);
        // A bucket KEEP_HOURS later reuses the slot: the old hour is gone.
        let later = now + KEEP_HOURS * HOUR_MS;
        l.record(a, m, 1, later);
        assert_eq!(l.since(now, later, Some("a")), [line("a", 1)]);
        let pending = l.take_pending();
        assert_eq!(pending[a], [("m".to_owned(), 5 + 7 + 1)]);
        assert_eq!(pending[b], [("m".to_owned(), 1)]);
        assert!(l.take_pending().is_empty(), "taken once");
        // What the leader heard is counted, not reported again.
        l.record_reported("c", "m", 3, now);
        assert_eq!(l.since(now, now, Some("c")), [line("c", 3)]);
        assert!(l.take_pending().is_empty());
    }
}
