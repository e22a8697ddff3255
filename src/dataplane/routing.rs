//! The route table: logical model → per-zone pools of backends, each pool
//! with its balancer state and health flags (panic mode, the weight bound
//! the pickers sample under); the global breaker; and the zone plan for one
//! request. Built once from config and swapped whole; the request path only
//! reads it, the health task keeps its atomics current.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter};
use zonegate_cluster::{ClusterView, ZoneId};

use crate::clock::now_ms;
use crate::config::{
    Balance, Config, CrossZone, HealthConfig, ModelConfig, MAX_RING_POINTS,
    MAX_RING_POINTS_PER_POOL,
};
use crate::dataplane::backend::Backend;
use crate::dataplane::balance::{self, Candidates, Ring, SmoothWrr};
use crate::dataplane::request::RequestClass;
use crate::telemetry::Metrics;

/// Every model's pools, and every backend once (for health and admin).
#[derive(Debug)]
pub struct Routes {
    pub models: HashMap<String, ModelRoute>,
    pub backends: Vec<Arc<Backend>>,
    /// Open while more than `breaker_percent` of models have no healthy
    /// backend: their requests go to the floor model.
    breaker_open: AtomicBool,
    /// Serialises score ejections so two backends of one pool cannot both
    /// pass the cap check at once. Never held across an await.
    eject_lock: Mutex<()>,
}

#[derive(Debug)]
pub struct ModelRoute {
    pub cfg: ModelConfig,
    /// The model's name, shared by every request it serves (metric labels,
    /// the access line) instead of copied.
    pub name: Arc<str>,
    /// The model's name as a response header value.
    pub name_value: Option<http::HeaderValue>,
    /// One pool per zone that has a backend for this model, by zone name.
    pub pools: Vec<ZonePool>,
    /// The zones of `pools`, in the same order.
    pub zones: Vec<ZoneId>,
    /// Metric handles of this model, made on first use: the request path
    /// bumps them without a label lookup.
    handles: OnceLock<ModelHandles>,
    /// No backend of this model in any zone is healthy (all ejected or due
    /// for ejection), as of the last health sweep.
    unhealthy: AtomicBool,
}

/// The backends of one model in one zone.
#[derive(Debug)]
pub struct ZonePool {
    pub zone: ZoneId,
    pub backends: Vec<Arc<Backend>>,
    /// Upper bound of the weights in use (f64 bits), for rejection sampling.
    max_weight: AtomicU64,
    /// More backends look bad than the cap lets go: route over all of them
    /// by score instead of over the few left.
    panic: AtomicBool,
    /// Mean fresh latency EWMA of the pool's backends (f64 bits, 0 when
    /// none is fresh): the cost basis of a backend without recent samples.
    typical_latency_ms: AtomicU64,
    /// Shared with the pool of the same model and zone in the previous
    /// table when its backends are the same: a ring is most of a build's
    /// work (vnodes hashed and sorted per backend).
    ring: Option<Arc<Ring>>,
    wrr: Mutex<SmoothWrr>,
    /// Requests in flight through this pool, for the ring's load bound.
    in_flight: Arc<AtomicU64>,
    /// Per backend (same order): its metric handles for this model.
    handles: Vec<OnceLock<AttemptHandles>>,
    /// The identities (as `Attempts::tried` holds them) of backends that
    /// serve chat completions only (Anthropic): left out of embeddings
    /// and legacy completions. Empty for most pools.
    pub chat_only: Vec<usize>,
}

/// A model's metric handles, by tenant where the label has one.
#[derive(Debug)]
pub struct ModelHandles {
    pub duration: Histogram,
    pub ttft: Histogram,
    /// By tenant index, each made on the tenant's first answer from this
    /// model ([`ModelHandles::tenant`]): made for every tenant at once,
    /// they cost the model's first request after each config change ~28k
    /// instructions per tenant (2.9 × 10⁹ at 100,000 tenants) and put
    /// three series per tenant per model on `/metrics`, used or not.
    by_tenant: Vec<OnceLock<TenantHandles>>,
    /// `zonegate_model_answers_total{link="primary"}` of this model, made
    /// on its first answer as the model asked for (a model only ever
    /// reached as a fallback gets no such series).
    answered: OnceLock<IntCounter>,
}

/// One tenant's metric handles for one model.
#[derive(Debug)]
pub struct TenantHandles {
    /// `zonegate_tokens_total{kind="prompt"}` and `{kind="completion"}`.
    pub tokens: (IntCounter, IntCounter),
    /// `zonegate_requests_total{outcome="ok"}`.
    pub ok: IntCounter,
}

impl ModelHandles {
    /// The handles of tenant `index` (of `tenants`, the config the table
    /// was built with) for `model`, made on first use.
    pub fn tenant(
        &self,
        index: usize,
        tenants: &[crate::config::Tenant],
        model: &str,
        metrics: &Metrics,
    ) -> Option<&TenantHandles> {
        let t = tenants.get(index)?;
        Some(self.by_tenant.get(index)?.get_or_init(|| {
            TenantHandles {
                tokens: (
                    metrics
                        .tokens
                        .with_label_values(&[&t.name, model, "prompt"]),
                    metrics
                        .tokens
                        .with_label_values(&[&t.name, model, "completion"]),
                ),
                ok: metrics.requests.with_label_values(&[&t.name, model, "ok"]),
            }
        }))
    }

    /// `zonegate_model_answers_total{model, link="primary"}`: the model
    /// answered as the model the client asked for.
    pub fn answered_as_asked(&self, model: &str, metrics: &Metrics) -> &IntCounter {
        self.answered
            .get_or_init(|| metrics.model_answers.with_label_values(&[model, "primary"]))
    }
}

/// One backend's metric handles for one model.
#[derive(Debug)]
pub struct AttemptHandles {
    pub ok: IntCounter,
    pub first_byte: Histogram,
}

/// How a backend was chosen; becomes part of `x-zonegate-route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickReason {
    P2c,
    RoundRobin,
    Random,
    Ring,
    /// A half-open trial of an ejected backend.
    Trial,
}

impl PickReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PickReason::P2c => "p2c",
            PickReason::RoundRobin => "round_robin",
            PickReason::Random => "random",
            PickReason::Ring => "ring",
            PickReason::Trial => "trial",
        }
    }
}

/// The pickers' view of a pool for one request. A backend weighs its
/// effective weight (config × state × ramp, 0 while ejected), or in panic
/// mode its score-based weight times its recent success; unreachable (a
/// refused connect), cooling down after a 429 or already tried for this
/// request, zero ([`Backend::pick_weight`]). Every read is an atomic load:
/// no lock, no allocation.
struct PickView<'a> {
    pool: &'a ZonePool,
    now_ms: u64,
    tried: &'a [usize],
    panic: bool,
    max_weight: f64,
    typical_latency_ms: f64,
}

impl Candidates for PickView<'_> {
    fn len(&self) -> usize {
        self.pool.backends.len()
    }

    fn weight(&self, i: usize) -> f64 {
        let b = &self.pool.backends[i];
        if self.tried.contains(&(Arc::as_ptr(b) as usize)) {
            return 0.0;
        }
        b.pick_weight(self.panic, self.now_ms)
    }

    fn max_weight(&self) -> f64 {
        self.max_weight
    }

    /// In flight (this one included) × latency, where a backend without
    /// recent latency samples is taken to be as fast as its pool typically
    /// is, so its weight alone decides how often it is tried; before the
    /// pool has a typical latency, an untried backend is worth a trial
    /// (like Peak-EWMA's decay toward zero), so p2c learns its latency
    /// instead of judging it by a prior. In panic mode, divided by recent
    /// success ([`Backend::pick_cost`]).
    fn cost(&self, i: usize) -> f64 {
        self.pool.backends[i].pick_cost(self.panic, self.now_ms, self.typical_latency_ms)
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
    /// The metric handles of backend `i` of this pool for `model`.
    pub fn handles(&self, i: usize, model: &str, metrics: &Metrics) -> &AttemptHandles {
        self.handles[i].get_or_init(|| {
            let b = &self.backends[i];
            AttemptHandles {
                ok: metrics.forward_attempts.with_label_values(&[
                    model,
                    &b.name,
                    b.zone.as_str(),
                    "ok",
                ]),
                first_byte: metrics.first_byte.with_label_values(&[model, &b.name]),
            }
        })
    }

    /// `previous`: this model's pool in this zone in the table being
    /// replaced, whose ring is kept if it has the same backends.
    fn new(
        zone: ZoneId,
        backends: Vec<Arc<Backend>>,
        balance: Balance,
        cfg: &Config,
        previous: Option<&ZonePool>,
    ) -> Self {
        // Sessions use the ring whatever the model's policy when zone pins
        // are on, so every pool needs one then.
        let ring = (balance == Balance::Ring || cfg.affinity.zone_pin).then(|| {
            let (vnodes, load_factor) = (cfg.balance.vnodes, cfg.balance.load_factor);
            let members = || backends.iter().map(|b| (b.name.as_str(), b.weight));
            let Some((before, ring)) = previous.and_then(|p| {
                let ring = p
                    .ring
                    .as_ref()
                    .filter(|r| r.built_with(vnodes, load_factor))?;
                Some((&p.backends, ring))
            }) else {
                return Arc::new(Ring::new(members(), vnodes, load_factor));
            };
            let same = before.len() == backends.len()
                && before.iter().zip(&backends).all(|(a, b)| Arc::ptr_eq(a, b));
            if same {
                Arc::clone(ring)
            } else {
                // A few backends came or went: the old points are kept.
                let before = before.iter().map(|b| (b.name.as_str(), b.weight));
                Arc::new(ring.rebuilt(before, members()))
            }
        });
        Self {
            zone,
            max_weight: AtomicU64::new(
                backends
                    .iter()
                    .map(|b| b.effective_weight())
                    .fold(0.0, f64::max)
                    .to_bits(),
            ),
            panic: AtomicBool::new(false),
            typical_latency_ms: AtomicU64::new(0),
            wrr: Mutex::new(SmoothWrr::new(backends.len())),
            handles: backends.iter().map(|_| OnceLock::new()).collect(),
            chat_only: backends
                .iter()
                .filter(|b| !b.serves(crate::dataplane::provider::Endpoint::Embeddings))
                .map(|b| Arc::as_ptr(b) as usize)
                .collect(),
            backends,
            ring,
            in_flight: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The share of this pool's configured weight that could take a
    /// request now, at its effective (health-scaled) weight.
    pub fn usable_share(&self, now_ms: u64) -> f64 {
        let total: f64 = self.backends.iter().map(|b| f64::from(b.weight)).sum();
        let usable: f64 = self
            .backends
            .iter()
            .filter(|b| b.is_usable(now_ms))
            .map(|b| b.effective_weight())
            .sum();
        if total > 0.0 {
            usable / total
        } else {
            0.0
        }
    }

    fn view<'a>(&'a self, now_ms: u64, tried: &'a [usize]) -> PickView<'a> {
        PickView {
            pool: self,
            now_ms,
            tried,
            panic: self.panic.load(Ordering::Relaxed),
            max_weight: f64::from_bits(self.max_weight.load(Ordering::Relaxed)),
            typical_latency_ms: f64::from_bits(self.typical_latency_ms.load(Ordering::Relaxed)),
        }
    }

    /// Whether any backend here could take a new request now.
    pub fn has_usable(&self, now_ms: u64) -> bool {
        let view = self.view(now_ms, &[]);
        (0..self.backends.len()).any(|i| view.weight(i) > 0.0)
    }

    /// Whether the pool routes in panic mode.
    pub fn in_panic(&self) -> bool {
        self.panic.load(Ordering::Relaxed)
    }

    /// Backends ejected now.
    fn ejected(&self) -> usize {
        self.backends.iter().filter(|b| !b.is_up()).count()
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
    ) -> Option<(usize, PickReason)> {
        let view = self.view(now_ms, tried);
        let (i, reason) = match (balance, &self.ring, session) {
            (Balance::Ring, Some(ring), Some(key)) => {
                let total = self.in_flight.load(Ordering::Relaxed);
                (ring.pick(&view, key, total)?, PickReason::Ring)
            }
            (Balance::RoundRobin, ..) => (self.wrr.lock().pick(&view)?, PickReason::RoundRobin),
            (Balance::Random, ..) => (balance::weighted_draw(&view, rng)?, PickReason::Random),
            _ => (balance::p2c(&view, rng)?, PickReason::P2c),
        };
        Some((i, reason))
    }

    /// Requests in flight through this pool.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn enter(&self) -> PoolGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        PoolGuard(Arc::clone(&self.in_flight))
    }
}

/// A route table too costly for a node to build: which key drives the
/// cost, and by how much it is over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct TooCostly {
    pub key: String,
    pub reason: String,
}

/// `items` by `key`, for one lookup each: a search of the list per
/// lookup made a rebuild quadratic in the backends (10⁸ name comparisons
/// at 10,000).
fn by_key<'a, T, K: Hash + Eq>(items: &'a [T], key: impl Fn(&'a T) -> K) -> HashMap<K, &'a T> {
    items.iter().map(|t| (key(t), t)).collect()
}

/// Models × backends a route table may be built from.
pub const MAX_MODEL_BACKEND_PAIRS: u64 = 10_000_000;

/// Ring points the route table of `cfg` holds, counted before anything is
/// built: per pool (one model in one zone) vnodes × the sum of its
/// backends' weights, where the pool has a ring (the model balances by
/// ring, or zone pins are on). More than [`MAX_RING_POINTS_PER_POOL`] in
/// one pool or [`MAX_RING_POINTS`] in all is refused: every node builds
/// every ring at every config change.
pub fn ring_points(cfg: &Config) -> Result<u64, TooCostly> {
    // Building looks at every backend for every model.
    let pairs = (cfg.models.len() as u64).saturating_mul(cfg.backends.len() as u64);
    if pairs > MAX_MODEL_BACKEND_PAIRS {
        return Err(TooCostly {
            key: "models".into(),
            reason: format!(
                "{} models × {} backends = {pairs} pairs to route, more than the {MAX_MODEL_BACKEND_PAIRS} a node builds at a config change",
                cfg.models.len(),
                cfg.backends.len()
            ),
        });
    }
    let vnodes = u64::from(cfg.balance.vnodes);
    let mut total = 0u64;
    for m in &cfg.models {
        if !(m.balance == Balance::Ring || cfg.affinity.zone_pin) {
            continue;
        }
        let mut by_zone: HashMap<&ZoneId, u64> = HashMap::new();
        for b in cfg.backends.iter().filter(|b| b.models.contains(&m.name)) {
            let w = by_zone.entry(&b.zone).or_default();
            *w = w.saturating_add(u64::from(b.weight.max(1)));
        }
        for (zone, weight) in by_zone {
            let points = vnodes.saturating_mul(weight);
            if points > MAX_RING_POINTS_PER_POOL {
                return Err(TooCostly {
                    key: "balance.vnodes".into(),
                    reason: format!(
                        "model {} in zone {zone}: vnodes ({vnodes}) × its backends' weights ({weight}) = {points} ring points, more than the {MAX_RING_POINTS_PER_POOL} one pool may hold; lower balance.vnodes or the weights",
                        m.name
                    ),
                });
            }
            total = total.saturating_add(points);
        }
    }
    if total > MAX_RING_POINTS {
        return Err(TooCostly {
            key: "balance.vnodes".into(),
            reason: format!(
                "the route table would hold {total} ring points over all models and zones, more than the {MAX_RING_POINTS} a node builds at a config change; lower balance.vnodes or the weights"
            ),
        });
    }
    Ok(total)
}

impl Routes {
    /// [`Routes::build`] within the cost cap ([`ring_points`]): what a node
    /// builds from a config it did not write (the cluster's), and what the
    /// leader's dry run builds before committing one.
    pub fn try_build(cfg: &Config, previous: Option<&Routes>) -> Result<Routes, TooCostly> {
        ring_points(cfg)?;
        Ok(Self::build(cfg, previous))
    }

    /// Builds the table from config, reusing the live [`Backend`]s of
    /// `previous` by name so their signals survive a rebuild. Builds
    /// whatever it is given: a config from outside goes through
    /// [`Routes::try_build`].
    pub fn build(cfg: &Config, previous: Option<&Routes>) -> Routes {
        let live = previous.map_or_else(HashMap::new, |p| {
            by_key(&p.backends, |b: &Arc<Backend>| b.name.as_str())
        });
        let backends: Vec<Arc<Backend>> = cfg
            .backends
            .iter()
            .map(|bc| {
                live.get(bc.name.as_str())
                    .filter(|b| {
                        b.authority == bc.authority
                            && b.zone == bc.zone
                            && b.scheme == bc.scheme
                            && b.tls == bc.tls
                            && b.weight == bc.weight
                            && b.provider == bc.provider
                            && b.probe_interval == bc.probe_interval
                    })
                    .map(|b| Arc::clone(b))
                    .unwrap_or_else(|| Arc::new(Backend::new(bc, &cfg.health, now_ms())))
            })
            .collect();
        // Each model's backends in config order, from one pass over them
        // (not one pass per model).
        let mut serving: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, bc) in cfg.backends.iter().enumerate() {
            for m in &bc.models {
                let list = serving.entry(m.as_str()).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        let models = cfg
            .models
            .iter()
            .map(|m| {
                let mut by_zone: Vec<(ZoneId, Vec<Arc<Backend>>)> = Vec::new();
                for &i in serving.get(m.name.as_str()).map_or(&[][..], Vec::as_slice) {
                    let b = &backends[i];
                    match by_zone.iter_mut().find(|(z, _)| *z == b.zone) {
                        Some((_, list)) => list.push(Arc::clone(b)),
                        None => by_zone.push((b.zone.clone(), vec![Arc::clone(b)])),
                    }
                }
                by_zone.sort_by(|a, b| a.0.cmp(&b.0));
                let before = previous.and_then(|p| p.models.get(&m.name));
                let pools = by_zone
                    .into_iter()
                    .map(|(zone, list)| {
                        let was = before.and_then(|r| r.pools.iter().find(|p| p.zone == zone));
                        ZonePool::new(zone, list, m.balance, cfg, was)
                    })
                    .collect();
                let pools: Vec<ZonePool> = pools;
                (
                    m.name.clone(),
                    ModelRoute {
                        name: m.name.as_str().into(),
                        name_value: crate::dataplane::forward::shared_value(&m.name),
                        cfg: m.clone(),
                        zones: pools.iter().map(|p| p.zone.clone()).collect(),
                        pools,
                        handles: OnceLock::new(),
                        unhealthy: AtomicBool::new(false),
                    },
                )
            })
            .collect();
        Routes {
            models,
            backends,
            breaker_open: AtomicBool::new(false),
            eject_lock: Mutex::new(()),
        }
    }

    /// Requests in flight to backends through any pool (each attempt is in
    /// one pool), for the retry budget. O(pools): read per retry, never per
    /// request.
    pub fn requests_in_flight(&self) -> u64 {
        self.models
            .values()
            .flat_map(|m| &m.pools)
            .map(ZonePool::in_flight)
            .fold(0, u64::saturating_add)
    }

    /// Whether the global breaker is open.
    pub fn breaker_open(&self) -> bool {
        self.breaker_open.load(Ordering::Relaxed)
    }

    /// Runs one health evaluation while no other can run, so two backends
    /// of one pool never both pass the ejection cap at once (the ejection
    /// is published before the lock is released). Held for microseconds,
    /// never across an await.
    pub fn serialised<R>(&self, f: impl FnOnce() -> R) -> R {
        let _serial = self.eject_lock.lock();
        f()
    }

    /// Whether ejecting `backend` now keeps every pool it serves within
    /// `max_ejected_percent`. Call inside [`Routes::serialised`].
    pub fn may_eject(&self, backend: &Backend, cfg: &HealthConfig) -> bool {
        self.pools_of(backend)
            .all(|p| p.ejected() < allowed_ejections(p.backends.len(), cfg))
    }

    /// Whether failing real requests may eject `backend`: within the same
    /// cap, except that a pool may always lose one (Envoy's outlier
    /// detection does the same), so a lone backend that fails every request
    /// is taken out and its model served by the fallback chain while
    /// half-open trials watch for its recovery.
    pub fn may_eject_passive(&self, backend: &Backend, cfg: &HealthConfig) -> bool {
        self.pools_of(backend)
            .all(|p| p.ejected() < allowed_ejections(p.backends.len(), cfg).max(1))
    }

    fn pools_of<'a>(&'a self, backend: &'a Backend) -> impl Iterator<Item = &'a ZonePool> + 'a {
        self.models
            .values()
            .flat_map(|m| &m.pools)
            .filter(move |p| p.backends.iter().any(|b| std::ptr::eq(&**b, backend)))
    }

    /// Republishes every backend's weights as of `now_ms` (ramps move with
    /// time), recomputes each pool's panic flag and weight bound, and the
    /// global breaker. Returns what changed, for the caller to report.
    pub fn sweep(&self, now_ms: u64, cfg: &HealthConfig) -> Sweep {
        let mut bad: HashMap<usize, bool> = HashMap::with_capacity(self.backends.len());
        for b in &self.backends {
            bad.insert(Arc::as_ptr(b) as usize, b.refresh(now_ms, cfg));
        }
        let is_bad = |b: &Arc<Backend>| {
            bad.get(&(Arc::as_ptr(b) as usize))
                .copied()
                .unwrap_or(false)
        };
        let mut out = Sweep::default();
        let mut unhealthy_models = 0usize;
        for (name, model) in &self.models {
            let mut healthy = false;
            for pool in &model.pools {
                let n = pool.backends.len();
                let bad_n = pool.backends.iter().filter(|b| is_bad(b)).count();
                healthy |= bad_n < n;
                // Panic only where it changes something: some bad backend
                // could still take traffic by score.
                let panic = bad_n > allowed_ejections(n, cfg)
                    && pool
                        .backends
                        .iter()
                        .any(|b| is_bad(b) && b.panic_weight() > 0.0);
                let max = pool
                    .backends
                    .iter()
                    .map(|b| {
                        if panic {
                            b.panic_weight()
                        } else {
                            b.effective_weight()
                        }
                    })
                    .fold(0.0, f64::max);
                pool.max_weight.store(max.to_bits(), Ordering::Relaxed);
                let fresh: Vec<f64> = pool
                    .backends
                    .iter()
                    .filter_map(|b| b.fresh_latency_ms(now_ms))
                    .collect();
                let typical = if fresh.is_empty() {
                    0.0
                } else {
                    fresh.iter().sum::<f64>() / fresh.len() as f64
                };
                pool.typical_latency_ms
                    .store(typical.to_bits(), Ordering::Relaxed);
                if pool.panic.swap(panic, Ordering::Relaxed) != panic {
                    out.panics.push(PanicChange {
                        model: name.clone(),
                        zone: pool.zone.clone(),
                        on: panic,
                        bad: bad_n,
                        of: n,
                    });
                }
            }
            model.unhealthy.store(!healthy, Ordering::Relaxed);
            unhealthy_models += usize::from(!healthy);
        }
        let total = self.models.len().max(1);
        let open = unhealthy_models as f64 * 100.0 / total as f64 > cfg.breaker_percent;
        if self.breaker_open.swap(open, Ordering::Relaxed) != open {
            out.breaker = Some(BreakerChange {
                open,
                unhealthy: unhealthy_models,
                of: self.models.len(),
            });
        }
        out
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
    /// This model's metric handles (`tenants` in config order).
    pub fn handles(&self, metrics: &Metrics, tenants: &[crate::config::Tenant]) -> &ModelHandles {
        self.handles.get_or_init(|| {
            let name = self.cfg.name.as_str();
            ModelHandles {
                duration: metrics.request_duration.with_label_values(&[name]),
                ttft: metrics.ttft.with_label_values(&[name]),
                by_tenant: tenants.iter().map(|_| OnceLock::new()).collect(),
                answered: OnceLock::new(),
            }
        })
    }

    pub fn pool(&self, zone: &ZoneId) -> Option<&ZonePool> {
        self.pools.iter().find(|p| &p.zone == zone)
    }

    /// No healthy backend in any zone, as of the last health sweep.
    pub fn is_unhealthy(&self) -> bool {
        self.unhealthy.load(Ordering::Relaxed)
    }

    /// The tier a request's minimum is compared with (undeclared: 0).
    pub fn tier(&self) -> u32 {
        self.cfg.tier.unwrap_or(0)
    }
}

/// How many of a pool's `n` backends the health model may eject on score.
pub fn allowed_ejections(n: usize, cfg: &HealthConfig) -> usize {
    (n as f64 * cfg.max_ejected_percent / 100.0).floor() as usize
}

/// What a health sweep changed.
#[derive(Debug, Default)]
pub struct Sweep {
    pub panics: Vec<PanicChange>,
    pub breaker: Option<BreakerChange>,
}

#[derive(Debug)]
pub struct PanicChange {
    pub model: String,
    pub zone: ZoneId,
    pub on: bool,
    pub bad: usize,
    pub of: usize,
}

#[derive(Debug)]
pub struct BreakerChange {
    pub open: bool,
    pub unhealthy: usize,
    pub of: usize,
}

/// Which zones one request may use, in order: borrowed from the view and
/// the model's zones, which outlive the request's attempts (a zone's name
/// is shared text: a copy is a reference count taken and dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZonePlan<'v> {
    /// The zone that serves the request: its home, or the target of a
    /// committed failover of its home.
    pub effective: &'v ZoneId,
    /// Zones it may fall back to when `effective` cannot serve it.
    pub fallbacks: Vec<&'v ZoneId>,
    /// Zones that could have served it but the request class forbids.
    pub withheld: Vec<&'v ZoneId>,
}

/// Plans the zones for a request homed in `home`. Only active zones are
/// fallback targets; a long request never leaves its effective zone unless
/// policy says `all` (a committed failover is not a fallback: it moves the
/// effective zone itself, for every request).
pub fn plan_zones<'v>(
    home: &'v ZoneId,
    view: &'v ClusterView,
    zones: &'v [ZoneId],
    class: RequestClass,
    policy: CrossZone,
) -> ZonePlan<'v> {
    let effective = view.effective_zone(home);
    let others = zones
        .iter()
        .filter(|z| *z != effective && view.is_active(z));
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

impl<'v> ZonePlan<'v> {
    /// The zones to try `model` in: the effective zone, then the allowed
    /// fallback zones (ordered only if the effective zone cannot answer:
    /// most requests never need them). An effective zone whose pool is in
    /// panic (more of it looks bad than `max_ejected_percent` lets go)
    /// comes last when the request may cross zones: a whole zone failing
    /// is what cross-zone fallback is for, and panic routing there would
    /// only spend the retry budget on backends known to be bad. The data
    /// plane and `ctl explain` both take their order from here.
    pub fn order<'p>(
        &'p self,
        cfg: &'p Config,
        model: &'p ModelRoute,
    ) -> impl Iterator<Item = &'v ZoneId> + Send + 'p {
        let effective = self.effective;
        let fallbacks = &self.fallbacks;
        let others =
            std::iter::once_with(move || order_fallbacks(cfg, model, effective, fallbacks.clone()))
                .flatten();
        let panics = !fallbacks.is_empty() && model.pool(effective).is_some_and(|p| p.in_panic());
        if panics {
            either::Either::Left(others.chain(std::iter::once(effective)))
        } else {
            either::Either::Right(std::iter::once(effective).chain(others))
        }
    }
}

/// Cross-zone fallback targets in preference order: the configured
/// `[zones.<z>] fallback_order` first, then the others by how much of their
/// pool for this model can take traffic now (the healthiest first).
fn order_fallbacks<'z>(
    cfg: &Config,
    model: &ModelRoute,
    effective: &ZoneId,
    mut zones: Vec<&'z ZoneId>,
) -> Vec<&'z ZoneId> {
    let preferred = cfg.fallback_order.get(effective);
    let now = now_ms();
    let rank = |z: &ZoneId| {
        let configured = preferred
            .and_then(|p| p.iter().position(|x| x == z))
            .unwrap_or(usize::MAX);
        let usable = model.pool(z).map_or(0.0, |p| p.usable_share(now));
        (configured, std::cmp::Reverse((usable * 1000.0) as u64))
    };
    zones.sort_by_key(|z| rank(z));
    zones
}

#[cfg(test)]
mod tests;
