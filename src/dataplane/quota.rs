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
//! atomic "theoretical arrival time" per bucket.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use prometheus::{Gauge, IntCounter};
use zonegate_cluster::quota::RebalancePlan;
use zonegate_cluster::quota::{self as arith, Shed};
use zonegate_cluster::{
    ClusterView, Limits, NodeId, Priority, TenantDemand, TenantQuota, Unit, ZoneId,
};

use crate::config::Config;
use crate::dataplane::error::ApiError;
use crate::dataplane::request::RequestClass;
use crate::telemetry::metrics::Metrics;

const MINUTE_NS: u64 = 60_000_000_000;

/// How far ahead of now a bucket may run and still admit: the burst a
/// bucket allows is one second of its rate (plus one request).
const TOLERANCE_NS: u64 = 1_000_000_000;

/// Output tokens assumed for a request that names no maximum.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// Prompt tokens estimated from the body: about four bytes per token.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The tokens charged at admission: the prompt estimated from the body
/// size, plus the output the request asks for at most.
pub fn estimate_tokens(body_len: usize, max_tokens: Option<u64>) -> u64 {
    (body_len as u64 / BYTES_PER_TOKEN).saturating_add(max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS))
}

/// A GCRA bucket of `limit` units per minute. `tat` is the theoretical
/// arrival time (ns on the monotonic clock): the bucket admits while it is
/// at most `TOLERANCE_NS` ahead of now, then moves it by the cost. A cost
/// is charged whole even past the tolerance (debt), so a request larger than
/// the burst is still admitted once the bucket is clear, and later requests
/// wait it out. Pure given `now`.
#[derive(Debug, Default)]
pub struct Gcra {
    /// Units per minute; `u64::MAX` when unlimited.
    limit: AtomicU64,
    tat: AtomicU64,
}

/// A refusal by one bucket: how long until it admits again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait(pub u64);

impl Gcra {
    fn unlimited() -> Self {
        Self {
            limit: AtomicU64::new(u64::MAX),
            tat: AtomicU64::new(0),
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

    /// Nanoseconds per unit; at least 1, so a limit above 60 billion per
    /// minute acts as one unit per nanosecond (far past any real traffic).
    fn interval(limit: u64) -> u64 {
        (MINUTE_NS / limit.max(1)).max(1)
    }

    /// Admits `cost` units at `now`, or says how long to wait. A cost is
    /// capped at one minute of the allocation, so no request blocks its
    /// tenant for longer than a minute.
    pub fn take(&self, now: u64, cost: u64) -> Result<(), Wait> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == u64::MAX {
            return Ok(());
        }
        if limit == 0 {
            return Err(Wait(MINUTE_NS));
        }
        let step = Self::interval(limit).saturating_mul(cost.min(limit));
        self.tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                (tat <= now.saturating_add(TOLERANCE_NS)).then(|| tat.max(now).saturating_add(step))
            })
            .map(|_| ())
            .map_err(|tat| Wait(tat.saturating_sub(now.saturating_add(TOLERANCE_NS))))
    }

    /// Corrects an earlier charge by `delta` units (negative: a refund).
    pub fn adjust(&self, delta: i64) {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == u64::MAX || limit == 0 || delta == 0 {
            return;
        }
        let step = Self::interval(limit).saturating_mul(delta.unsigned_abs().min(limit));
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(if delta > 0 {
                    tat.saturating_add(step)
                } else {
                    tat.saturating_sub(step)
                })
            });
    }

    /// (limit, remaining now, time until the bucket is full) for headers.
    pub fn state(&self, now: u64) -> Option<(u64, u64, u64)> {
        let limit = self.limit()?;
        if limit == 0 {
            return Some((0, 0, MINUTE_NS));
        }
        let tat = self.tat.load(Ordering::Acquire);
        let interval = Self::interval(limit);
        let room = now.saturating_add(TOLERANCE_NS).saturating_sub(tat);
        let remaining = if tat <= now.saturating_add(TOLERANCE_NS) {
            (room / interval + 1).min(limit)
        } else {
            0
        };
        Some((limit, remaining, tat.saturating_sub(now)))
    }
}

/// Requests in flight against a limit.
#[derive(Debug)]
pub struct Occupancy {
    limit: AtomicU64,
    used: AtomicU64,
}

impl Occupancy {
    fn unlimited() -> Self {
        Self {
            limit: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
        }
    }

    fn set_limit(&self, limit: Option<u64>) {
        self.limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Takes `n` if they fit under the limit.
    fn acquire(&self, n: u64) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u.saturating_add(n) <= limit).then(|| u + n)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
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

/// A limited tenant's `x-ratelimit-*` headers.
pub type RateHeaders = HeaderMap;

static REQUEST_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];

static TOKEN_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// A duration as OpenAI writes its resets: `20ms`, `1.5s`, `6m0s`.
pub fn reset_text(ns: u64) -> String {
    let mut b = bytes::BytesMut::new();
    push_reset(&mut b, ns);
    String::from_utf8_lossy(&b).into_owned()
}

/// Appends `ns` as a reset duration (see [`reset_text`]), with integer
/// arithmetic only: it runs for every response of a limited tenant.
fn push_reset(b: &mut bytes::BytesMut, ns: u64) {
    let ms = ns.div_ceil(1_000_000);
    if ms < 1000 {
        push_u64(b, ms);
        b.extend_from_slice(b"ms");
    } else if ms < 60_000 {
        push_u64(b, ms / 1000);
        let mut frac = ms % 1000;
        if frac != 0 {
            b.extend_from_slice(b".");
            // Three digits, trailing zeros dropped.
            let mut digits: usize = 3;
            while frac % 10 == 0 {
                frac /= 10;
                digits -= 1;
            }
            for _ in 0..digits.saturating_sub(decimal_len(frac)) {
                b.extend_from_slice(b"0");
            }
            push_u64(b, frac);
        }
        b.extend_from_slice(b"s");
    } else {
        push_u64(b, ms / 60_000);
        b.extend_from_slice(b"m");
        push_u64(b, (ms % 60_000) / 1000);
        b.extend_from_slice(b"s");
    }
}

fn decimal_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

/// Appends `v` in decimal.
fn push_u64(b: &mut bytes::BytesMut, v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = v;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    b.extend_from_slice(&digits[i..]);
}

/// Adds the headers to a response.
pub fn set_headers(headers: &mut HeaderMap, values: &RateHeaders) {
    for (name, value) in values {
        headers.insert(name.clone(), value.clone());
    }
}

/// One model's per-zone limits, this node's part.
struct ModelLimiter {
    limits: Limits,
    rpm: Gcra,
    tpm: Gcra,
}

/// This node's share of one zone's capacity units.
pub struct ZoneCapacity {
    /// Sum of the zone's backends' `capacity` (0: undeclared, no shedding).
    pub total: u64,
    /// This node's share of `total` (its group shares the zone's units).
    pub share: AtomicU64,
    pub used: Occupancy,
    ratio: Gauge,
}

impl ZoneCapacity {
    fn publish(&self) {
        let share = self.share.load(Ordering::Relaxed);
        if share > 0 {
            self.ratio.set(self.used.used() as f64 / share as f64);
        }
    }
}

/// Everything this node enforces, rebuilt in place when the view changes.
pub struct Quotas {
    node: NodeId,
    zone: ZoneId,
    /// Serving members and their home zones (standalone: this node alone).
    nodes: Vec<(NodeId, ZoneId)>,
    long_units: u64,
    p0_reserve: f64,
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
    zone: Option<(Arc<ZoneCapacity>, u64)>,
    concurrency: bool,
    /// Tokens charged at admission, and their prompt part.
    estimate: u64,
    prompt: u64,
    settled: bool,
    /// When it was admitted (its headers' `now`).
    at: u64,
}

impl Admission {
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

    /// Corrects the token charge to what the answer used.
    pub fn settle(&mut self, tokens: u64) {
        if self.settled {
            return;
        }
        self.settled = true;
        let delta = tokens as i64 - self.estimate as i64;
        self.tenant.tpm.adjust(delta);
        if let Some(m) = &self.model {
            m.tpm.adjust(delta);
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
        if let Some((zone, units)) = &self.zone {
            zone.used.release(*units);
            zone.publish();
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
        let tenants = cfg
            .tenant_quotas
            .iter()
            .map(|q| {
                Arc::new(TenantLimiter {
                    quota: q.clone(),
                    rpm: Gcra::unlimited(),
                    tpm: Gcra::unlimited(),
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
                    rpm: Gcra::unlimited(),
                    tpm: Gcra::unlimited(),
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
                let c = Arc::new(ZoneCapacity {
                    total,
                    share: AtomicU64::new(total),
                    used: Occupancy::unlimited(),
                    ratio: metrics
                        .zone_capacity_used
                        .with_label_values(&[zone.as_str()]),
                });
                (zone, c)
            })
            .collect();
        let q = Self {
            node: cfg.node.id,
            zone: cfg.node.zone.clone(),
            nodes,
            long_units: u64::from(cfg.quotas.long_request_units),
            p0_reserve: cfg.quotas.p0_reserve,
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
            c.publish();
        }
        self.table.store(Arc::new(table));
        self.applied.store(view.decision_version, Ordering::Release);
    }

    /// The quota stage: admits a request or says why not. Order: zone
    /// capacity (priority shedding), concurrency, requests, tokens, then
    /// the model's limits; a refusal undoes what earlier checks took.
    pub fn admit(&self, ask: &Ask<'_>, now: u64) -> Result<Admission, ApiError> {
        let Some(t) = self.tenants.get(ask.tenant_index) else {
            return Err(ApiError::Internal("tenant without quota state".into()));
        };
        let estimate = estimate_tokens(ask.body_len, ask.max_tokens);
        t.offered_now.fetch_add(1, Ordering::Relaxed);
        let mut adm = Admission {
            tenant: Arc::clone(t),
            model: self.models.get(ask.model).cloned(),
            zone: None,
            concurrency: false,
            estimate: 0,
            prompt: ask.body_len as u64 / BYTES_PER_TOKEN,
            settled: true,
            at: now,
        };
        if let Some(zone) = self.zones.get(ask.zone).filter(|z| z.total > 0) {
            let units = match ask.class {
                RequestClass::Short => 1,
                RequestClass::Long => self.long_units,
            };
            let share = zone.share.load(Ordering::Relaxed);
            match arith::shed(
                t.quota.priority,
                zone.used.used(),
                units,
                share,
                self.p0_reserve,
            ) {
                Some(shed) => {
                    let reason = match shed {
                        Shed::Priority(Priority::P2) => "shed_p2",
                        Shed::Priority(Priority::P1) => "shed_p1",
                        _ => "capacity_full",
                    };
                    t.reject(reason);
                    return Err(self.refusal(t, ApiError::CapacityExceeded {
                        message: match shed {
                            Shed::Full => format!(
                                "zone {} is at capacity; please retry shortly",
                                ask.zone
                            ),
                            Shed::Priority(p) => format!(
                                "zone {} is short of capacity: {p} requests are shed first; please retry shortly",
                                ask.zone
                            ),
                        },
                        full: shed == Shed::Full,
                        retry_after_s: 1,
                        headers: Box::default(),
                    }, now));
                }
                None => {
                    zone.used.acquire(units);
                    zone.publish();
                    adm.zone = Some((Arc::clone(zone), units));
                }
            }
        }
        if !t.concurrency.acquire(1) {
            t.reject("concurrency");
            return Err(self.limited(t, "concurrency", "requests", 1, now));
        }
        adm.concurrency = true;
        if let Err(w) = t.rpm.take(now, 1) {
            t.reject("rpm");
            return Err(self.limited(t, "rpm", "requests", w.0, now));
        }
        if let Err(w) = t.tpm.take(now, estimate) {
            t.rpm.adjust(-1);
            t.reject("tpm");
            return Err(self.limited(t, "tpm", "tokens", w.0, now));
        }
        if let Some(m) = &adm.model {
            let failed = match m.rpm.take(now, 1) {
                Err(w) => Some(("model_rpm", "requests", w)),
                Ok(()) => match m.tpm.take(now, estimate) {
                    Err(w) => {
                        m.rpm.adjust(-1);
                        Some(("model_tpm", "tokens", w))
                    }
                    Ok(()) => None,
                },
            };
            if let Some((reason, what, w)) = failed {
                t.rpm.adjust(-1);
                t.tpm.adjust(-(estimate as i64));
                t.reject(reason);
                return Err(self.limited(t, reason, what, w.0, now));
            }
        }
        adm.estimate = estimate;
        adm.settled = false;
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
        self.refusal(
            t,
            ApiError::RateLimited {
                message,
                kind: what,
                retry_after_s,
                headers: Box::default(),
            },
            now,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn gcra_admits_the_rate_plus_one_second_of_burst() {
        let g = Gcra::unlimited();
        g.set_limit(Some(600)); // 10 per second
        let start = 100 * S;
        let mut admitted = 0;
        // 30 s at 40 requests per second.
        for i in 0..1200u64 {
            if g.take(start + i * S / 40, 1).is_ok() {
                admitted += 1;
            }
        }
        // 300 by the rate, plus the burst of ~11.
        assert!((300..=312).contains(&admitted), "{admitted}");
    }

    #[test]
    fn gcra_charges_large_costs_as_debt_and_reports_the_wait() {
        let g = Gcra::unlimited();
        g.set_limit(Some(6000)); // 100 tokens per second
        let now = 10 * S;
        assert_eq!(g.take(now, 1000), Ok(()));
        // 10 s of debt: the next request waits 9 s (one second tolerance).
        let w = g.take(now, 1).unwrap_err();
        assert_eq!(w, Wait(9 * S));
        // A refund of 900 tokens clears most of it.
        g.adjust(-900);
        assert_eq!(g.take(now, 1), Ok(()));
        let (limit, remaining, _) = g.state(now).unwrap();
        assert_eq!(limit, 6000);
        assert!(remaining <= 100, "{remaining}");
    }

    #[test]
    fn gcra_without_allocation_admits_nothing_and_unlimited_everything() {
        let g = Gcra::unlimited();
        assert!(g.take(0, u64::MAX).is_ok());
        assert_eq!(g.state(0), None);
        g.set_limit(Some(0));
        assert!(g.take(5 * S, 1).is_err());
    }

    #[test]
    fn huge_limits_do_not_divide_by_zero() {
        let g = Gcra::unlimited();
        g.set_limit(Some(u64::MAX - 1));
        assert!(g.take(S, u64::MAX).is_ok());
        assert!(g.state(S).is_some());
        g.adjust(-5);
    }

    #[test]
    fn a_cost_is_capped_at_one_minute_of_allocation() {
        let g = Gcra::unlimited();
        g.set_limit(Some(60));
        assert!(g.take(0, u64::MAX).is_ok());
        // Charged 60 (one minute), not u64::MAX: clear after 59 s (one
        // second of tolerance).
        assert!(g.take(58 * S, 1).is_err());
        assert!(g.take(59 * S, 1).is_ok());
    }

    #[test]
    fn reset_is_written_like_openai() {
        let cases = [
            (0, "0ms"),
            (20_000_000, "20ms"),
            (1_500_000_000, "1.5s"),
            (2_000_000_000, "2s"),
            (360 * S, "6m0s"),
            (61_250_000_000, "1m1s"),
            (1_050_000_000, "1.05s"),
            (1_005_000_000, "1.005s"),
            (10_100_000_000, "10.1s"),
            (999_999_999, "1s"),
            (u64::MAX, "307445734m33s"),
        ];
        for (ns, want) in cases {
            assert_eq!(reset_text(ns), want, "{ns}");
        }
    }

    const CONFIG: &str = r#"
        [node]
        id = 1
        zone = "az-a"
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        data_dir = "data/node-1"

        [[tenants]]
        name = "gold"
        key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
        priority = "P0"
        quota = { rpm = 120, tpm = 12000, concurrency = 4 }

        [[tenants]]
        name = "bulk"
        key_sha256 = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"
        priority = "P2"
        quota = { rpm = 6000 }

        [[tenants]]
        name = "free"
        key_sha256 = "baa5a0964d3320fbc0c6a922140453c8513ea24ab8fd0577034804a967248096"

        [[backends]]
        name = "a1"
        zone = "az-a"
        url = "http://127.0.0.1:8000"
        models = ["m"]
        capacity = 10

        [[backends]]
        name = "b1"
        zone = "az-b"
        url = "http://127.0.0.1:8001"
        models = ["m"]
        capacity = 10
    "#;

    fn quotas() -> (Quotas, ClusterView) {
        let cfg = Config::parse("t.toml", CONFIG).unwrap();
        let zones = [ZoneId::new("az-a"), ZoneId::new("az-b")];
        let view = ClusterView::initial(&zones);
        (Quotas::new(&cfg, &view, &Metrics::new()), view)
    }

    fn ask<'a>(tenant: usize, class: RequestClass, zone: &'a ZoneId) -> Ask<'a> {
        Ask {
            tenant_index: tenant,
            model: "m",
            class,
            body_len: 400,
            max_tokens: Some(100),
            zone,
        }
    }

    #[test]
    fn a_standalone_node_enforces_its_zones_share() {
        let (q, _) = quotas();
        // Equal shares over the two serving zones: half of each limit.
        assert_eq!(q.tenants[0].rpm.limit(), Some(60));
        assert_eq!(q.tenants[0].tpm.limit(), Some(6000));
        assert_eq!(q.tenants[1].rpm.limit(), Some(3000));
        assert_eq!(q.tenants[2].rpm.limit(), None);
    }

    #[test]
    fn concurrency_is_released_when_the_admission_ends() {
        let (q, _) = quotas();
        let a = ZoneId::new("az-a");
        let held: Vec<Admission> = (0..2)
            .map(|i| q.admit(&ask(0, RequestClass::Short, &a), i * S).unwrap())
            .collect();
        // concurrency 2 on this node (half of 4).
        let e = q
            .admit(&ask(0, RequestClass::Short, &a), 3 * S)
            .err()
            .unwrap();
        assert_eq!(e.code(), "rate_limit_exceeded");
        assert_eq!(e.kind(), "requests");
        drop(held);
        assert!(q.admit(&ask(0, RequestClass::Short, &a), 4 * S).is_ok());
    }

    #[test]
    fn over_the_rate_is_a_429_with_the_tenants_headers() {
        let (q, _) = quotas();
        let a = ZoneId::new("az-a");
        let now = 1000 * S;
        let mut admitted = 0;
        let mut last = None;
        for _ in 0..10 {
            match q.admit(&ask(0, RequestClass::Short, &a), now) {
                Ok(adm) => {
                    admitted += 1;
                    let mut h = HeaderMap::new();
                    adm.write_headers(&mut h);
                    assert!(h.contains_key("x-ratelimit-limit-requests"));
                    // Ends at once, so concurrency never binds.
                }
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        // 60 rpm is one a second; one second of tolerance admits two at once.
        assert_eq!(admitted, 2);
        let Some(ApiError::RateLimited {
            headers,
            retry_after_s,
            ..
        }) = last
        else {
            panic!("expected a rate limit, got {last:?}")
        };
        assert!(retry_after_s >= 1);
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok().map(str::to_owned))
        };
        assert_eq!(get("x-ratelimit-limit-requests").as_deref(), Some("60"));
        assert_eq!(get("x-ratelimit-remaining-requests").as_deref(), Some("0"));
        assert_eq!(get("x-ratelimit-limit-tokens").as_deref(), Some("6000"));
        assert!(get("x-ratelimit-reset-tokens").is_some());
        // Unlimited tenants carry no headers.
        assert!(q.headers(2, now).is_empty());
    }

    #[test]
    fn usage_corrects_the_token_charge() {
        let (q, _) = quotas();
        let a = ZoneId::new("az-a");
        let t = &q.tenants[0];
        let now = 1000 * S;
        // 6000 tpm on this node: 10 ms per token. The reset time is the
        // charge outstanding.
        let debt = |t: &TenantLimiter| {
            // Keep the request bucket (60 rpm) out of this test.
            t.rpm.adjust(-1);
            t.tpm.state(now).unwrap().2 / 1_000_000
        };
        let mut adm = q.admit(&ask(0, RequestClass::Short, &a), now).unwrap();
        assert_eq!(debt(t), 2000, "200 tokens estimated");
        // The answer used far fewer tokens than estimated.
        adm.finish(Some(20), 0);
        drop(adm);
        assert_eq!(debt(t), 200);
        // Without usage: the prompt estimate plus the bytes delivered / 4.
        let mut adm = q.admit(&ask(0, RequestClass::Short, &a), now).unwrap();
        assert_eq!(debt(t), 2200);
        adm.finish(None, 40);
        drop(adm);
        assert_eq!(debt(t), 200 + 1100);
        // Never above the estimate, whatever the stream's framing weighed.
        t.tpm.adjust(-130);
        let mut adm = q.admit(&ask(0, RequestClass::Short, &a), now).unwrap();
        adm.finish(None, 1 << 20);
        drop(adm);
        assert_eq!(debt(t), 2000);
        // A request that never got an answer gives its estimate back.
        t.tpm.adjust(-200);
        drop(q.admit(&ask(0, RequestClass::Short, &a), now).unwrap());
        assert_eq!(debt(t), 0);
    }

    #[test]
    fn capacity_sheds_p2_first_and_keeps_the_reserve_for_p0() {
        let (q, _) = quotas();
        let a = ZoneId::new("az-a");
        let now = 1000 * S;
        // 10 units in az-a; P2 stops at 6, P1 at 8, P0 at 10.
        let long = q.admit(&ask(1, RequestClass::Long, &a), now).unwrap(); // 4
        let short = q.admit(&ask(1, RequestClass::Short, &a), now).unwrap(); // 5
        let e = q.admit(&ask(1, RequestClass::Long, &a), now).err().unwrap();
        assert!(
            matches!(e, ApiError::CapacityExceeded { full: false, .. }),
            "{e:?}"
        );
        assert_eq!(e.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code(), "capacity_exceeded");
        let gold = q.admit(&ask(0, RequestClass::Long, &a), now).unwrap(); // 9
        let e = q.admit(&ask(0, RequestClass::Long, &a), now).err().unwrap();
        assert!(
            matches!(e, ApiError::CapacityExceeded { full: true, .. }),
            "{e:?}"
        );
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        drop((long, short, gold));
        assert_eq!(q.zones[&a].used.used(), 0);
        assert!(q.admit(&ask(1, RequestClass::Long, &a), now).is_ok());
    }

    #[test]
    fn a_failover_into_this_zone_lifts_the_allocation_and_failback_restores_it() {
        let (q, view) = quotas();
        let before = q.tenants[0].rpm.limit();
        let mut failed = view.clone();
        failed.decision_version = 1;
        failed.zones.insert(
            ZoneId::new("az-b"),
            zonegate_cluster::ZoneStatus::FailedOver {
                target: ZoneId::new("az-a"),
            },
        );
        q.refresh(&failed);
        assert_eq!(q.tenants[0].rpm.limit(), Some(120));
        assert_eq!(q.table.load().tenants[0].1.len(), 1, "one overflow");
        let mut back = view;
        back.decision_version = 2;
        q.refresh(&back);
        assert_eq!(q.tenants[0].rpm.limit(), before);
        assert!(q.table.load().tenants[0].1.is_empty());
    }

    #[test]
    fn the_estimate_is_body_over_four_plus_the_requested_output() {
        assert_eq!(estimate_tokens(400, Some(50)), 150);
        assert_eq!(estimate_tokens(400, None), 100 + DEFAULT_OUTPUT_TOKENS);
    }
}
