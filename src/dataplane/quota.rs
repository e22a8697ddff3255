//! Local quota enforcement on the request path: each tenant's allocation
//! on this node (rpm and tpm buckets, a concurrency gauge), the models'
//! per-zone limits, and priority shedding against this node's share of a
//! zone's capacity units. Allocations come from the view (the pure
//! arithmetic in `zonegate_cluster::quota`); admission takes no lock shared
//! across tenants and does no I/O.
//!
//! The buckets are a small hand-written GCRA rather than `governor`:
//! allocations change with every rebalance and failover, and governor's
//! limiters have a fixed quota (a new limiter would forget the tenant's
//! debt); tokens are charged at admission as an estimate and corrected on
//! completion, which needs a bucket that can be credited and debited by
//! any amount; and the `x-ratelimit-*` headers need the remaining amount
//! and the reset time, which governor does not expose. The state is one
//! atomic "theoretical arrival time" per bucket (`gcra`); the in-flight
//! counts are `occupancy`, the response headers `headers`; this file holds
//! the limiters and admission.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use prometheus::IntCounter;
use zonegate_cluster::quota::RebalancePlan;
use zonegate_cluster::quota::{self as arith, Shed};
use zonegate_cluster::{
    ClusterView, Limits, NodeId, Priority, TenantDemand, TenantQuota, Unit, ZoneId,
};

use crate::config::{Config, QuotaConfig};
use crate::dataplane::error::ApiError;
use crate::dataplane::request::RequestClass;
use crate::telemetry::metrics::Metrics;

mod gcra;
pub mod headers;
mod occupancy;
pub mod zone;

pub use gcra::{Charge, Gcra, Wait};
use headers::{push_reset, push_u64, REQUEST_HEADERS, TOKEN_HEADERS};
pub use headers::{reset_text, set_headers, RateHeaders};
pub use occupancy::Occupancy;
pub use zone::{Units, ZoneCapacity};

/// Output tokens assumed for a request that names no maximum.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// Prompt tokens estimated from the body: about four bytes per token.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The tokens charged at admission: the prompt estimated from the body
/// size, plus the output the request asks for at most.
pub fn estimate_tokens(body_len: usize, max_tokens: Option<u64>) -> u64 {
    (body_len as u64 / BYTES_PER_TOKEN).saturating_add(max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS))
}

/// One tenant on this node: its buckets, its gauge, its metric handles.
pub struct TenantLimiter {
    pub quota: TenantQuota,
    pub rpm: Gcra,
    pub tpm: Gcra,
    pub concurrency: Occupancy,
    admitted: IntCounter,
    metrics: Metrics,
    /// This period's requests that reached the stage, and those admitted:
    /// the demand this node reports to the leader.
    offered_now: AtomicU64,
    admitted_now: AtomicU64,
}

impl TenantLimiter {
    /// This period's demand, and a new period begins.
    pub fn take_demand(&self) -> TenantDemand {
        TenantDemand {
            tenant: self.quota.tenant.clone(),
            offered: self.offered_now.swap(0, Ordering::Relaxed),
            admitted: self.admitted_now.swap(0, Ordering::Relaxed),
            spend: Default::default(),
        }
    }

    /// The demand since the last call; `None` for a tenant that had none,
    /// unless `always`.
    fn take_demand_of(&self, always: bool) -> Option<TenantDemand> {
        let d = self.take_demand();
        (always || d.offered > 0).then_some(d)
    }

    /// Whether any of the tenant's units is limited (its responses then
    /// carry the `x-ratelimit-*` headers).
    pub fn limited(&self) -> bool {
        !self.quota.global.is_unlimited()
    }

    fn reject(&self, reason: &'static str) {
        self.metrics
            .quota_rejected
            .with_label_values(&[&self.quota.tenant, reason])
            .inc();
    }

    /// OpenAI's rate-limit headers from this node's buckets at `now`
    /// (only for the units the tenant limits), written straight into a
    /// response's headers: this runs for every response of a limited
    /// tenant.
    ///
    /// The values are written into one buffer and each header holds a
    /// slice of it: one allocation instead of six (measured with
    /// `benches/callgrind.sh`: six `format!`/`From<u64>` values cost ~5k
    /// instructions per response, most of the quota stage's cost).
    pub fn write_headers(&self, out: &mut HeaderMap, now: u64) {
        let mut buf = bytes::BytesMut::with_capacity(64);
        let mut spans: [(usize, usize); 6] = [(0, 0); 6];
        let mut names: [Option<&HeaderName>; 6] = [None; 6];
        let mut n = 0;
        for (bucket, header_names) in [(&self.rpm, &REQUEST_HEADERS), (&self.tpm, &TOKEN_HEADERS)] {
            if let Some((limit, remaining, reset)) = bucket.state(now) {
                let [l, r, t] = header_names;
                for (name, v, reset) in [(l, limit, false), (r, remaining, false), (t, reset, true)]
                {
                    let start = buf.len();
                    if reset {
                        push_reset(&mut buf, v);
                    } else {
                        push_u64(&mut buf, v);
                    }
                    spans[n] = (start, buf.len());
                    names[n] = Some(name);
                    n += 1;
                }
            }
        }
        let all = buf.freeze();
        for (name, (start, end)) in names.iter().zip(spans).take(n) {
            if let (Some(name), Ok(v)) =
                (name, HeaderValue::from_maybe_shared(all.slice(start..end)))
            {
                out.insert((*name).clone(), v);
            }
        }
    }

    /// The same headers as a map of their own (for errors).
    pub fn headers(&self, now: u64) -> RateHeaders {
        let mut out = HeaderMap::with_capacity(6);
        self.write_headers(&mut out, now);
        out
    }
}

/// One model's per-zone limits, this node's part.
struct ModelLimiter {
    limits: Limits,
    rpm: Gcra,
    tpm: Gcra,
}

/// Everything this node enforces, rebuilt in place when the view changes.
pub struct Quotas {
    node: NodeId,
    zone: ZoneId,
    /// Serving members and their home zones (standalone: this node alone).
    nodes: Vec<(NodeId, ZoneId)>,
    long_units: u64,
    /// How long a request may wait for a zone's units (`[quotas] queue_timeout`).
    queue_timeout: std::time::Duration,
    /// By tenant index in config order.
    pub tenants: Vec<Arc<TenantLimiter>>,
    models: BTreeMap<String, Arc<ModelLimiter>>,
    pub zones: BTreeMap<ZoneId, Arc<ZoneCapacity>>,
    /// The view the allocations were computed from (its decision version).
    applied: AtomicU64,
    refresh: Mutex<()>,
    /// The latest computed table, for the admin API.
    pub table: arc_swap::ArcSwap<Table>,
    metrics: Metrics,
}

/// The allocations as of one view, for the admin API and the metrics.
#[derive(Debug, Default)]
pub struct Table {
    pub decision_version: u64,
    /// By tenant index: every node's allocation and the overflows.
    pub tenants: Vec<(Vec<arith::NodeAllocation>, Vec<arith::Overflow>)>,
    /// The decision version each overflow (tenant index, failed zone)
    /// began with: its log line's `version`.
    pub overflow_since: BTreeMap<(usize, ZoneId), u64>,
}

/// What a request was admitted with; releases its concurrency and capacity
/// units when dropped, and corrects its token charge once it is settled.
pub struct Admission {
    tenant: Arc<TenantLimiter>,
    model: Option<Arc<ModelLimiter>>,
    /// The zone's capacity units it holds, given back when it is dropped.
    _units: Option<Units>,
    concurrency: bool,
    /// Tokens estimated at admission, and their prompt part.
    estimate: u64,
    prompt: u64,
    /// What the tenant's and the model's token buckets charged; `None`
    /// once settled (or never charged).
    charged: Option<(Charge, Charge)>,
    /// When it was admitted (its headers' `now`).
    at: u64,
    /// The tenant's budget reservation (`dataplane::budget`), settled to
    /// the answer's cost.
    pub budget: Option<crate::dataplane::budget::Hold>,
}

impl Admission {
    /// The tokens estimated at admission (what an answer without `usage`
    /// is priced from).
    pub fn estimate(&self) -> crate::dataplane::cost::Estimate {
        crate::dataplane::cost::Estimate {
            prompt: self.prompt,
            max_output: self.estimate.saturating_sub(self.prompt),
        }
    }

    /// Writes the tenant's `x-ratelimit-*` headers (nothing for an
    /// unlimited tenant) into a response's headers.
    pub fn write_headers(&self, out: &mut HeaderMap) {
        if self.tenant.limited() {
            self.tenant.write_headers(out, self.at);
        }
    }

    /// Corrects the token charge at the response's end: to the answer's
    /// `usage` (prompt + completion) when it reported one, else to an
    /// estimate from the bytes the client got, never above the admission's
    /// estimate (an event stream's framing is not text).
    pub fn finish(&mut self, usage: Option<u64>, delivered: u64) {
        let tokens = usage.unwrap_or_else(|| {
            self.prompt
                .saturating_add(delivered / BYTES_PER_TOKEN)
                .min(self.estimate)
        });
        self.settle(tokens);
    }

    /// Corrects the token charges to what the answer used (once): each
    /// bucket against what it charged, never refunding more than that.
    pub fn settle(&mut self, tokens: u64) {
        let Some((tenant, model)) = self.charged.take() else {
            return;
        };
        self.tenant.tpm.settle(tenant, tokens);
        if let Some(m) = &self.model {
            m.tpm.settle(model, tokens);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        // Nothing answered (or the answer never reported an end): the
        // estimate is refunded; the request itself still counted.
        self.settle(0);
        if self.concurrency {
            self.tenant.concurrency.release(1);
        }
    }
}

/// What admission needs to know of a request.
pub struct Ask<'a> {
    pub tenant_index: usize,
    pub model: &'a str,
    pub class: RequestClass,
    pub body_len: usize,
    pub max_tokens: Option<u64>,
    /// The zone the request will be served in (its effective home zone).
    pub zone: &'a ZoneId,
}

impl Quotas {
    pub fn new(cfg: &Config, view: &ClusterView, metrics: &Metrics) -> Self {
        let mut nodes: Vec<(NodeId, ZoneId)> = cfg
            .members
            .iter()
            .filter(|m| m.role != zonegate_cluster::Role::Witness)
            .map(|m| (m.id, m.zone.clone()))
            .collect();
        // Standalone, or a member this config does not list (added at run
        // time): this node counts in its zone's group rather than holding
        // nothing or everything.
        let witness = cfg
            .members
            .iter()
            .any(|m| m.id == cfg.node.id && m.role == zonegate_cluster::Role::Witness);
        if !witness && !nodes.iter().any(|(n, _)| *n == cfg.node.id) {
            nodes.push((cfg.node.id, cfg.node.zone.clone()));
        }
        let burst_of = |i: usize| {
            cfg.tenant_bursts
                .get(i)
                .copied()
                .unwrap_or(QuotaConfig::DEFAULT_BURST)
        };
        let tenants = cfg
            .tenant_quotas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                Arc::new(TenantLimiter {
                    quota: q.clone(),
                    rpm: Gcra::new(burst_of(i)),
                    tpm: Gcra::new(burst_of(i)),
                    concurrency: Occupancy::unlimited(),
                    admitted: metrics.quota_admitted.with_label_values(&[&q.tenant]),
                    metrics: metrics.clone(),
                    offered_now: AtomicU64::new(0),
                    admitted_now: AtomicU64::new(0),
                })
            })
            .collect();
        let models = cfg
            .models
            .iter()
            .filter(|m| !m.limits.is_unlimited())
            .map(|m| {
                let l = Arc::new(ModelLimiter {
                    limits: m.limits,
                    rpm: Gcra::new(QuotaConfig::DEFAULT_BURST),
                    tpm: Gcra::new(QuotaConfig::DEFAULT_BURST),
                });
                (m.name.clone(), l)
            })
            .collect();
        let mut totals: BTreeMap<ZoneId, u64> = BTreeMap::new();
        for b in &cfg.backends {
            *totals.entry(b.zone.clone()).or_default() += u64::from(b.capacity.unwrap_or(0));
        }
        let zones = totals
            .into_iter()
            .map(|(zone, total)| {
                let queued = !cfg.quotas.queue_timeout.is_zero();
                let c = ZoneCapacity::new(&zone, total, cfg.quotas.p0_reserve, queued, metrics);
                (zone, Arc::new(c))
            })
            .collect();
        let q = Self {
            node: cfg.node.id,
            zone: cfg.node.zone.clone(),
            nodes,
            long_units: u64::from(cfg.quotas.long_request_units),
            queue_timeout: cfg.quotas.queue_timeout,
            tenants,
            models,
            zones,
            applied: AtomicU64::new(u64::MAX),
            refresh: Mutex::new(()),
            table: arc_swap::ArcSwap::from_pointee(Table::default()),
            metrics: metrics.clone(),
        };
        q.refresh(view);
        q
    }

    /// Recomputes every allocation when `view` is newer than the one they
    /// were computed from: one atomic load per request otherwise. Another
    /// thread already recomputing is not waited for (its result lands a
    /// moment later; until then the previous allocation holds).
    pub fn refresh(&self, view: &ClusterView) {
        if self.applied.load(Ordering::Acquire) == view.decision_version {
            return;
        }
        let Some(_guard) = self.refresh.try_lock() else {
            return;
        };
        if self.applied.load(Ordering::Acquire) == view.decision_version {
            return;
        }
        let statuses = &view.zones;
        let groups = arith::groups(&self.nodes, statuses);
        let my_zone = view.effective_zone(&self.zone).clone();
        let group_size = groups.get(&my_zone).map_or(1, |g| g.len().max(1));
        let mut table = Table {
            decision_version: view.decision_version,
            tenants: Vec::with_capacity(self.tenants.len()),
            overflow_since: BTreeMap::new(),
        };
        self.metrics.quota_allocation.reset();
        for t in &self.tenants {
            let (allocs, overflows) = arith::allocate(
                &t.quota,
                statuses,
                &self.nodes,
                view.quota.get(&t.quota.tenant),
            );
            let mine = allocs
                .iter()
                .find(|a| a.node == self.node)
                .map(|a| a.limits)
                .unwrap_or_default();
            let mine = if t.quota.global.is_unlimited() {
                Limits::default()
            } else {
                mine
            };
            t.rpm.set_limit(mine.rpm);
            t.tpm.set_limit(mine.tpm);
            t.concurrency.set_limit(mine.concurrency);
            if !t.quota.global.is_unlimited() {
                for a in &allocs {
                    for unit in Unit::ALL {
                        if let Some(v) = a.limits.get(unit) {
                            self.metrics
                                .quota_allocation
                                .with_label_values(&[
                                    &t.quota.tenant,
                                    a.zone.as_str(),
                                    &a.node.to_string(),
                                    unit.name(),
                                ])
                                .set(i64::try_from(v).unwrap_or(i64::MAX));
                        }
                    }
                }
            }
            // One line per tenant when its overflow begins (not again for
            // each later decision while it lasts).
            let before = self.table.load();
            let index = table.tenants.len();
            for o in &overflows {
                let known = before
                    .tenants
                    .get(index)
                    .is_some_and(|(_, old)| old.iter().any(|p| p.from == o.from && p.to == o.to));
                let key = (index, o.from.clone());
                let since = match before.overflow_since.get(&key) {
                    Some(v) if known => *v,
                    _ => {
                        tracing::info!(target: "zonegate::quota", "{}", o.line(view.decision_version));
                        view.decision_version
                    }
                };
                table.overflow_since.insert(key, since);
            }
            table.tenants.push((allocs, overflows));
        }
        // Model limits and capacity are per zone: this node's part is an
        // equal split over the nodes that serve its effective zone.
        let equal = vec![1.0; group_size];
        let my_index = groups
            .get(&my_zone)
            .and_then(|g| g.iter().position(|n| *n == self.node))
            .unwrap_or(0);
        for m in self.models.values() {
            let part = m.limits.split(&equal)[my_index];
            m.rpm.set_limit(part.rpm);
            m.tpm.set_limit(part.tpm);
        }
        for (zone, c) in &self.zones {
            let size = groups.get(zone).map_or(0, |g| g.len());
            let share = match groups
                .get(zone)
                .and_then(|g| g.iter().position(|n| *n == self.node))
            {
                Some(i) => arith::split(c.total, &vec![1.0; size])[i],
                // Not serving this zone: its requests here are not counted.
                None => c.total,
            };
            c.share.store(share, Ordering::Relaxed);
            c.share_changed();
        }
        self.table.store(Arc::new(table));
        self.applied.store(view.decision_version, Ordering::Release);
    }

    /// The request stage, right after authentication: every request of
    /// the tenant counts against its rpm, whatever becomes of it (an
    /// unknown model, a bad body, a refusal by a later limit), so no kind
    /// of request escapes the rate. Refused when the rpm bucket is over.
    pub fn count_request(&self, tenant_index: usize, now: u64) -> Result<(), ApiError> {
        let Some(t) = self.tenants.get(tenant_index) else {
            return Err(ApiError::Internal("tenant without quota state".into()));
        };
        if let Err(w) = t.rpm.take(now, 1) {
            t.offered_now.fetch_add(1, Ordering::Relaxed);
            t.reject("rpm");
            return Err(self.limited(t, "rpm", "requests", w.0, now));
        }
        Ok(())
    }

    /// The quota stage (after [`count_request`](Self::count_request)):
    /// admits a request or says why not, at once. Order: zone capacity
    /// (priority shedding), concurrency, tokens, then the model's limits; a
    /// refusal undoes what earlier checks took (but the request's rpm count).
    pub fn admit(&self, ask: &Ask<'_>, now: u64) -> Result<Admission, ApiError> {
        let t = self.tenant(ask)?;
        let units = match self.zone_units(ask) {
            None => None,
            Some((zone, n)) => match zone.take(t.quota.priority, n) {
                Ok(units) => Some(units),
                Err(shed) => return Err(self.shed(t, shed, ask.zone, now)),
            },
        };
        self.admit_holding(t, ask, now, units)
    }

    /// [`admit`](Self::admit), but a request short of zone capacity waits
    /// up to `[quotas] queue_timeout` for units (never past `deadline`, its
    /// own), in priority order ([`zone`]); `now` is read again after a wait.
    pub async fn admit_or_wait(
        &self,
        ask: &Ask<'_>,
        now: u64,
        deadline: tokio::time::Instant,
    ) -> Result<Admission, ApiError> {
        let t = self.tenant(ask)?;
        let Some((zone, n)) = self.zone_units(ask) else {
            return self.admit_holding(t, ask, now, None);
        };
        let p = t.quota.priority;
        let (units, now) = match zone.take(p, n) {
            Ok(units) => (units, now),
            Err(shed) if self.queue_timeout.is_zero() => {
                return Err(self.shed(t, shed, ask.zone, now))
            }
            Err(_) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let wait = self.queue_timeout.min(left);
                let waited = Box::pin(zone.take_or_wait(p, n, wait)).await;
                let now = crate::clock::now_ns().max(now);
                match waited {
                    Ok(units) => (units, now),
                    Err(shed) => return Err(self.shed(t, shed, ask.zone, now)),
                }
            }
        };
        self.admit_holding(t, ask, now, Some(units))
    }

    fn tenant(&self, ask: &Ask<'_>) -> Result<&Arc<TenantLimiter>, ApiError> {
        self.tenants
            .get(ask.tenant_index)
            .ok_or_else(|| ApiError::Internal("tenant without quota state".into()))
    }

    /// The zone whose units the request takes, and how many (none when
    /// the zone declares no capacity).
    fn zone_units(&self, ask: &Ask<'_>) -> Option<(&Arc<ZoneCapacity>, u64)> {
        let zone = self.zones.get(ask.zone).filter(|z| z.total > 0)?;
        let units = match ask.class {
            RequestClass::Short => 1,
            RequestClass::Long => self.long_units,
        };
        Some((zone, units))
    }

    /// The refusal for zone capacity, counted under its reason.
    fn shed(&self, t: &TenantLimiter, shed: Shed, zone: &ZoneId, now: u64) -> ApiError {
        t.offered_now.fetch_add(1, Ordering::Relaxed);
        let reason = match shed {
            Shed::Priority(Priority::P2) => "shed_p2",
            Shed::Priority(Priority::P1) => "shed_p1",
            _ => "capacity_full",
        };
        t.reject(reason);
        let message = match shed {
            Shed::Full => format!("zone {zone} is at capacity; please retry shortly"),
            Shed::Priority(p) => format!(
                "zone {zone} is short of capacity: {p} requests are shed first; please retry shortly"
            ),
        };
        self.refusal(
            t,
            ApiError::CapacityExceeded {
                message,
                full: shed == Shed::Full,
                retry_after_s: 1,
                headers: Box::default(),
            },
            now,
        )
    }

    /// The stages after zone capacity, for a request holding `units`.
    fn admit_holding(
        &self,
        t: &Arc<TenantLimiter>,
        ask: &Ask<'_>,
        now: u64,
        units: Option<Units>,
    ) -> Result<Admission, ApiError> {
        let estimate = estimate_tokens(ask.body_len, ask.max_tokens);
        t.offered_now.fetch_add(1, Ordering::Relaxed);
        let mut adm = Admission {
            tenant: Arc::clone(t),
            model: self.models.get(ask.model).cloned(),
            _units: units,
            concurrency: false,
            estimate,
            prompt: ask.body_len as u64 / BYTES_PER_TOKEN,
            charged: None,
            at: now,
            budget: None,
        };
        if !t.concurrency.acquire(1) {
            t.reject("concurrency");
            return Err(self.limited(t, "concurrency", "requests", 1, now));
        }
        adm.concurrency = true;
        let tenant_tokens = match t.tpm.take(now, estimate) {
            Ok(c) => c,
            Err(w) => {
                t.reject("tpm");
                return Err(self.limited(t, "tpm", "tokens", w.0, now));
            }
        };
        let model_tokens = match &adm.model {
            None => Charge::default(),
            Some(m) => {
                let taken = m.rpm.take(now, 1).map_err(|w| ("model_rpm", "requests", w));
                let taken = taken.and_then(|requests| {
                    m.tpm.take(now, estimate).map_err(|w| {
                        m.rpm.settle(requests, 0);
                        ("model_tpm", "tokens", w)
                    })
                });
                match taken {
                    Ok(tokens) => tokens,
                    Err((reason, what, w)) => {
                        t.tpm.settle(tenant_tokens, 0);
                        t.reject(reason);
                        return Err(self.limited(t, reason, what, w.0, now));
                    }
                }
            }
        };
        adm.charged = Some((tenant_tokens, model_tokens));
        t.admitted.inc();
        t.admitted_now.fetch_add(1, Ordering::Relaxed);
        Ok(adm)
    }

    /// Every tenant's demand since the last call (the reporter's source):
    /// limited tenants always (the rebalance weighs them), others when
    /// they had traffic (the leader's config rules ask who did).
    pub fn take_demand(tenants: &[Arc<TenantLimiter>]) -> Vec<TenantDemand> {
        tenants
            .iter()
            .filter_map(|t| t.take_demand_of(t.limited()))
            .collect()
    }

    /// What the leader's rebalance needs from this node's config.
    pub fn rebalance_plan(&self, cfg: &Config) -> RebalancePlan {
        RebalancePlan {
            tenants: cfg.tenant_quotas.clone(),
            nodes: self.nodes.clone(),
            node_floor: cfg.quotas.node_floor,
            drift_threshold: cfg.quotas.drift_threshold,
            interval_ms: u64::try_from(cfg.quotas.rebalance_interval.as_millis())
                .unwrap_or(u64::MAX),
        }
    }

    /// The tenant's headers for any other response (errors included).
    pub fn headers(&self, tenant_index: usize, now: u64) -> RateHeaders {
        match self.tenants.get(tenant_index) {
            Some(t) if t.limited() => t.headers(now),
            _ => HeaderMap::new(),
        }
    }

    fn refusal(&self, t: &TenantLimiter, mut e: ApiError, now: u64) -> ApiError {
        if t.limited() {
            if let ApiError::CapacityExceeded { headers, .. }
            | ApiError::RateLimited { headers, .. } = &mut e
            {
                **headers = t.headers(now);
            }
        }
        e
    }

    fn limited(
        &self,
        t: &TenantLimiter,
        reason: &'static str,
        what: &'static str,
        wait_ns: u64,
        now: u64,
    ) -> ApiError {
        let retry_after_s = wait_ns.div_ceil(1_000_000_000).max(1);
        let limit = match reason {
            "concurrency" => t.concurrency.limit.load(Ordering::Relaxed),
            "rpm" => t.rpm.limit().unwrap_or(0),
            "tpm" => t.tpm.limit().unwrap_or(0),
            _ => 0,
        };
        let message = match reason {
            "concurrency" => format!(
                "Rate limit reached for {} on concurrent requests on this gateway node: Limit {limit}. Please try again when a request finishes.",
                t.quota.tenant
            ),
            "rpm" | "tpm" => format!(
                "Rate limit reached for {} on {} per min ({}) on this gateway node: Limit {limit}. Please try again in {}.",
                t.quota.tenant,
                what,
                reason.to_uppercase(),
                reset_text(wait_ns)
            ),
            _ => format!(
                "Rate limit reached for the requested model on {what} per min in this zone. Please try again in {}.",
                reset_text(wait_ns)
            ),
        };
        let mut e = self.refusal(
            t,
            ApiError::RateLimited {
                message,
                kind: what,
                retry_after_s,
                headers: Box::default(),
            },
            now,
        );
        // The unit that refused has nothing left to give now, whatever is
        // left of its minute (that comes back after Retry-After).
        let exhausted = match reason {
            "rpm" => Some(&REQUEST_HEADERS[1]),
            "tpm" => Some(&TOKEN_HEADERS[1]),
            _ => None,
        };
        if let (Some(name), ApiError::RateLimited { headers, .. }) = (exhausted, &mut e) {
            if headers.contains_key(name) {
                headers.insert(name.clone(), HeaderValue::from_static("0"));
            }
        }
        e
    }
}

#[cfg(test)]
mod tests;
