//! The route table: logical model → per-zone pools of backends, each pool
//! with its balancer state; and the zone plan for one request. Built once
//! from config and swapped whole; the request path only reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use zonegate_cluster::{ClusterView, ZoneId};

use crate::backend::Backend;
use crate::balance::{self, Candidates, Ring, SmoothWrr};
use crate::config::{Balance, Config, CrossZone, ModelConfig};
use crate::request::RequestClass;

/// Every model's pools, and every backend once (for health and admin).
#[derive(Debug)]
pub struct Routes {
    pub models: HashMap<String, ModelRoute>,
    pub backends: Vec<Arc<Backend>>,
}

#[derive(Debug)]
pub struct ModelRoute {
    pub cfg: ModelConfig,
    /// One pool per zone that has a backend for this model, by zone name.
    pub pools: Vec<ZonePool>,
}

/// The backends of one model in one zone.
#[derive(Debug)]
pub struct ZonePool {
    pub zone: ZoneId,
    pub backends: Vec<Arc<Backend>>,
    max_weight: f64,
    ring: Option<Ring>,
    wrr: Mutex<SmoothWrr>,
    /// Requests in flight through this pool, for the ring's load bound.
    in_flight: Arc<AtomicU64>,
}

/// How a backend was chosen; becomes part of `x-zonegate-route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickReason {
    P2c,
    RoundRobin,
    Random,
    Ring,
}

impl PickReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::P2c => "p2c",
            PickReason::RoundRobin => "round_robin",
            PickReason::Random => "random",
            PickReason::Ring => "ring",
        }
    }
}

/// The pickers' view of a pool for one request: backends that are down,
/// cooling down after a 429, or already tried for this request weigh zero.
struct PickView<'a> {
    pool: &'a ZonePool,
    now_ms: u64,
    tried: &'a [usize],
}

impl Candidates for PickView<'_> {
    fn len(&self) -> usize {
        self.pool.backends.len()
    }

    fn weight(&self, i: usize) -> f64 {
        let b = &self.pool.backends[i];
        if !b.is_usable(self.now_ms) || self.tried.contains(&(Arc::as_ptr(b) as usize)) {
            return 0.0;
        }
        f64::from(b.weight)
    }

    fn max_weight(&self) -> f64 {
        self.pool.max_weight
    }

    fn cost(&self, i: usize) -> f64 {
        self.pool.backends[i].cost(self.now_ms)
    }

    fn in_flight(&self, i: usize) -> u64 {
        self.pool.backends[i].in_flight()
    }
}

/// Holds one request's place in a pool's in-flight count.
#[derive(Debug)]
pub struct PoolGuard(Arc<AtomicU64>);

impl Drop for PoolGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ZonePool {
    fn new(zone: ZoneId, backends: Vec<Arc<Backend>>, balance: Balance, cfg: &Config) -> Self {
        // Sessions use the ring whatever the model's policy when zone pins
        // are on, so every pool needs one then.
        let ring = (balance == Balance::Ring || cfg.affinity.zone_pin).then(|| {
            Ring::new(
                backends.iter().map(|b| (b.name.as_str(), b.weight)),
                cfg.balance.vnodes,
                cfg.balance.load_factor,
            )
        });
        Self {
            zone,
            max_weight: backends
                .iter()
                .map(|b| f64::from(b.weight))
                .fold(0.0, f64::max),
            wrr: Mutex::new(SmoothWrr::new(backends.len())),
            backends,
            ring,
            in_flight: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The share of this pool's weight that could take a request now.
    pub fn usable_share(&self, now_ms: u64) -> f64 {
        let total: u32 = self.backends.iter().map(|b| b.weight).sum();
        let usable: u32 = self
            .backends
            .iter()
            .filter(|b| b.is_usable(now_ms))
            .map(|b| b.weight)
            .sum();
        if total == 0 {
            0.0
        } else {
            f64::from(usable) / f64::from(total)
        }
    }

    /// Whether any backend here could take a new request now.
    pub fn has_usable(&self, now_ms: u64) -> bool {
        self.backends.iter().any(|b| b.is_usable(now_ms))
    }

    /// Picks a backend not in `tried`. `session` is the hashed session key;
    /// without one the ring policy falls back to p2c.
    pub fn pick(
        &self,
        balance: Balance,
        session: Option<u64>,
        now_ms: u64,
        tried: &[usize],
        rng: &mut fastrand::Rng,
    ) -> Option<(Arc<Backend>, PickReason)> {
        let view = PickView {
            pool: self,
            now_ms,
            tried,
        };
        let (i, reason) = match (balance, &self.ring, session) {
            (Balance::Ring, Some(ring), Some(key)) => {
                let total = self.in_flight.load(Ordering::Relaxed);
                (ring.pick(&view, key, total)?, PickReason::Ring)
            }
            (Balance::RoundRobin, ..) => (self.wrr.lock().pick(&view)?, PickReason::RoundRobin),
            (Balance::Random, ..) => (balance::weighted_draw(&view, rng)?, PickReason::Random),
            _ => (balance::p2c(&view, rng)?, PickReason::P2c),
        };
        Some((Arc::clone(&self.backends[i]), reason))
    }

    pub fn enter(&self) -> PoolGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        PoolGuard(Arc::clone(&self.in_flight))
    }
}

impl Routes {
    /// Builds the table from config, reusing the live [`Backend`]s of
    /// `previous` by name so their signals survive a rebuild.
    pub fn build(cfg: &Config, previous: Option<&Routes>) -> Routes {
        let backends: Vec<Arc<Backend>> = cfg
            .backends
            .iter()
            .map(|bc| {
                previous
                    .and_then(|p| p.backends.iter().find(|b| b.name == bc.name))
                    .filter(|b| b.authority == bc.authority && b.zone == bc.zone)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Backend::new(bc)))
            })
            .collect();
        let models = cfg
            .models
            .iter()
            .map(|m| {
                let mut by_zone: Vec<(ZoneId, Vec<Arc<Backend>>)> = Vec::new();
                for (bc, b) in cfg.backends.iter().zip(&backends) {
                    if !bc.models.contains(&m.name) {
                        continue;
                    }
                    match by_zone.iter_mut().find(|(z, _)| *z == b.zone) {
                        Some((_, list)) => list.push(Arc::clone(b)),
                        None => by_zone.push((b.zone.clone(), vec![Arc::clone(b)])),
                    }
                }
                by_zone.sort_by(|a, b| a.0.cmp(&b.0));
                let pools = by_zone
                    .into_iter()
                    .map(|(zone, list)| ZonePool::new(zone, list, m.balance, cfg))
                    .collect();
                (
                    m.name.clone(),
                    ModelRoute {
                        cfg: m.clone(),
                        pools,
                    },
                )
            })
            .collect();
        Routes { models, backends }
    }

    pub fn model(&self, name: &str) -> Option<&ModelRoute> {
        self.models.get(name)
    }

    /// Logical model names, sorted.
    pub fn model_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.models.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

impl ModelRoute {
    pub fn pool(&self, zone: &ZoneId) -> Option<&ZonePool> {
        self.pools.iter().find(|p| &p.zone == zone)
    }
}

/// Which zones one request may use, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZonePlan {
    /// The zone that serves the request: its home, or the target of a
    /// committed failover of its home.
    pub effective: ZoneId,
    /// Zones it may fall back to when `effective` cannot serve it.
    pub fallbacks: Vec<ZoneId>,
    /// Zones that could have served it but the request class forbids.
    pub withheld: Vec<ZoneId>,
}

/// Plans the zones for a request homed in `home`. Only active zones are
/// fallback targets; a long request never leaves its effective zone unless
/// policy says `all` (a committed failover is not a fallback: it moves the
/// effective zone itself, for every request).
pub fn plan_zones(
    home: &ZoneId,
    view: &ClusterView,
    zones: &[ZoneId],
    class: RequestClass,
    policy: CrossZone,
) -> ZonePlan {
    let effective = view.effective_zone(home).clone();
    let others = zones
        .iter()
        .filter(|z| **z != effective && view.is_active(z))
        .cloned();
    let allowed = match policy {
        CrossZone::None => false,
        CrossZone::Short => class == RequestClass::Short,
        CrossZone::All => true,
    };
    let (fallbacks, withheld) = if allowed {
        (others.collect(), Vec::new())
    } else {
        (Vec::new(), others.collect())
    };
    ZonePlan {
        effective,
        fallbacks,
        withheld,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zonegate_cluster::ZoneStatus;

    fn zones() -> Vec<ZoneId> {
        ["az-a", "az-b", "az-c"].map(ZoneId::new).to_vec()
    }

    #[test]
    fn zone_plan_table() {
        let z = zones();
        let mut failed = ClusterView::initial(&z);
        failed.zones.insert(
            z[0].clone(),
            ZoneStatus::FailedOver {
                target: z[1].clone(),
            },
        );
        let initial = ClusterView::initial(&z);
        use RequestClass::{Long, Short};
        let (none, short, all) = (CrossZone::None, CrossZone::Short, CrossZone::All);
        // (view, class, policy, effective zone, fallbacks, withheld)
        type Case<'a> = (
            &'a ClusterView,
            RequestClass,
            CrossZone,
            &'a str,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            (&initial, Short, short, "az-a", &["az-b", "az-c"], &[]),
            (&initial, Long, short, "az-a", &[], &["az-b", "az-c"]),
            (&initial, Long, all, "az-a", &["az-b", "az-c"], &[]),
            (&initial, Short, none, "az-a", &[], &["az-b", "az-c"]),
            // A failover moves every request, long ones included, and the
            // failed-over zone is never a fallback target.
            (&failed, Long, short, "az-b", &[], &["az-c"]),
            (&failed, Short, short, "az-b", &["az-c"], &[]),
        ];
        for (view, class, policy, eff, fb, wh) in cases {
            let plan = plan_zones(&z[0], view, &z, *class, *policy);
            let names = |v: &[ZoneId]| v.iter().map(|z| z.to_string()).collect::<Vec<_>>();
            assert_eq!(plan.effective.as_str(), *eff, "{class:?} {policy:?}");
            assert_eq!(names(&plan.fallbacks), *fb, "{class:?} {policy:?}");
            assert_eq!(names(&plan.withheld), *wh, "{class:?} {policy:?}");
        }
    }
}
