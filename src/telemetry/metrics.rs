//! Prometheus metrics: every name `zonegate_*` (plus the standard
//! `process_*`), base units, `_total` counters, bounded labels. Metric
//! handles are cheap clones of one registry. `docs/src/metrics.md` documents
//! each one; a test keeps the table and the conventions in step.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// A metric family that can be built from a name, help text and label
/// names (empty for a plain metric).
trait Family: Collector + Clone + Sized + 'static {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self>;
}

impl Family for IntCounterVec {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        IntCounterVec::new(Opts::new(name, help), labels)
    }
}

impl Family for CounterVec {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        CounterVec::new(Opts::new(name, help), labels)
    }
}

impl Family for IntGaugeVec {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        IntGaugeVec::new(Opts::new(name, help), labels)
    }
}

impl Family for GaugeVec {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        GaugeVec::new(Opts::new(name, help), labels)
    }
}

impl Family for HistogramVec {
    fn build(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<Self> {
        HistogramVec::new(
            HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            labels,
        )
    }
}

impl Family for IntCounter {
    fn build(name: &str, help: &str, _: &[&str]) -> prometheus::Result<Self> {
        IntCounter::new(name, help)
    }
}

impl Family for IntGauge {
    fn build(name: &str, help: &str, _: &[&str]) -> prometheus::Result<Self> {
        IntGauge::new(name, help)
    }
}

impl Family for Gauge {
    fn build(name: &str, help: &str, _: &[&str]) -> prometheus::Result<Self> {
        Gauge::new(name, help)
    }
}

/// Builds one family and registers it. Names and label sets are constants,
/// so a failure is a programming error that `Metrics::new`'s test catches.
#[allow(clippy::panic)]
fn register<F: Family>(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> F {
    let family = F::build(name, help, labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(family.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    family
}

/// Declares `Metrics`: one line per metric with its field, type, name, help
/// and labels, so the whole table reads in one screen. Also declares
/// [`DECLARED`], the table itself, for the conventions test and the docs.
macro_rules! metrics {
    ($($(#[$doc:meta])* $field:ident: $kind:ident = $name:literal, $help:literal, [$($label:literal),*];)*) => {
        /// All metrics of one node.
        #[derive(Clone, Debug)]
        pub struct Metrics {
            registry: Registry,
            /// Scrape-time updates (gauges read from live state, counters
            /// mirrored from the control plane's totals) run one at a time.
            scrape: Arc<Mutex<()>>,
            $($(#[$doc])* pub $field: $kind,)*
        }

        impl Metrics {
            /// Registers every metric in a fresh registry, with
            /// `zonegate_build_info` set and the process collector.
            pub fn new() -> Self {
                let registry = Registry::new();
                let m = Self {
                    $($field: register(&registry, $name, $help, &[$($label),*]),)*
                    scrape: Arc::new(Mutex::new(())),
                    registry,
                };
                m.build_info.with_label_values(&[VERSION, commit()]).set(1);
                register_process_collector(&m.registry);
                m
            }
        }

        /// Every declared metric: (name, kind, labels).
        pub const DECLARED: &[(&str, Kind, &[&str])] = &[
            $(($name, Kind::$kind, &[$($label),*]),)*
        ];
    };
}

/// The Prometheus type of a declared metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub enum Kind {
    IntCounter,
    IntCounterVec,
    CounterVec,
    IntGaugeVec,
    GaugeVec,
    HistogramVec,
    IntGauge,
    Gauge,
}

impl Kind {
    /// The `# TYPE` word of the exposition format.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::IntCounter | Kind::IntCounterVec | Kind::CounterVec => "counter",
            Kind::HistogramVec => "histogram",
            Kind::IntGaugeVec | Kind::GaugeVec | Kind::IntGauge | Kind::Gauge => "gauge",
        }
    }
}

/// The crate version, for `zonegate_build_info`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from: `ZONEGATE_GIT_COMMIT` at build
/// time (the container build and CI set it), else `unknown`. An environment
/// variable rather than a build script that runs git: a script keyed on the
/// branch ref would relink the crate on every commit, and container builds
/// have no `.git` anyway.
pub fn commit() -> &'static str {
    option_env!("ZONEGATE_GIT_COMMIT").unwrap_or("unknown")
}

/// `process_*` (CPU seconds, resident and virtual memory, open and maximum
/// file descriptors, start time, threads): the standard unprefixed names
/// every exporter uses, so stock dashboards and alerts work. The one
/// exception to `zonegate_*`. Linux only (read from /proc).
fn register_process_collector(registry: &Registry) {
    #[cfg(target_os = "linux")]
    if let Err(e) = registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    )) {
        tracing::warn!("process metrics unavailable: {e}");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = registry;
}

// Naming: `zonegate_<subsystem>_<name>_<base unit>[_total]`; seconds, ratios
// 0-1 (`_ratio`), counters end in `_total`, a state is a 0/1 gauge with a
// `state`/`status` label, labels bounded (config names, fixed words).
metrics! {
    /// `{version, commit}` = 1.
    build_info: IntGaugeVec = "zonegate_build_info", "Build of this binary: version and git commit (value 1)", ["version", "commit"];
    /// Client requests by final outcome.
    requests: IntCounterVec = "zonegate_requests_total", "Client requests by final outcome", ["tenant", "model", "outcome"];
    /// Whole-request latency as the client saw it.
    request_duration: HistogramVec = "zonegate_request_duration_seconds", "Whole-request latency seen by the client", ["model"];
    /// Streams: from the request's arrival to the first content chunk sent
    /// to the client. Fed by the data plane (see the README's table).
    ttft: HistogramVec = "zonegate_ttft_seconds", "Streaming requests: time from arrival to the first token chunk sent to the client", ["model"];
    /// Tokens from the backend's `usage` (kind `prompt` or `completion`).
    tokens: IntCounterVec = "zonegate_tokens_total", "Tokens reported in backends' usage, by tenant and kind (prompt, completion)", ["tenant", "model", "kind"];
    /// What answered requests cost (`dataplane::cost`), in base units of
    /// the config's currency, by the model and zone that answered.
    spend: CounterVec = "zonegate_spend_total", "What answered requests cost on this node, in base units of the configured currency (e.g. USD), by tenant, answering model and zone", ["tenant", "model", "zone"];
    /// What shadow copies' answers cost, at their target backends' prices:
    /// apart from `spend` (no tenant's spend, no budget).
    shadow_spend: CounterVec = "zonegate_shadow_spend_total", "What shadow copies' answers cost on this node, in base units of the configured currency, by shadow, target model and the zone of the backend that answered; never part of a tenant's spend or budget", ["shadow", "model", "zone"];
    /// Requests refused (or downgraded) for a tenant's budget.
    budget_exceeded: IntCounterVec = "zonegate_budget_exceeded_total", "Requests over their tenant's budget on this node, by period (day, month) and action (rejected, cheapest)", ["tenant", "period", "action"];
    /// A tenant's budget allocation left on this node.
    budget_remaining: GaugeVec = "zonegate_budget_remaining", "What this node may still spend of a tenant's budget in the current period (its allocation from the leader less its spend), in base units of the currency", ["tenant", "period"];
    /// Answers by how the answering model got into the request's chain.
    model_answers: IntCounterVec = "zonegate_model_answers_total", "Answered requests by requested model and how the answering model was reached (primary, fallback, floor, context, budget)", ["model", "link"];
    /// Requests a tenant's quota admitted on this node.
    quota_admitted: IntCounterVec = "zonegate_quota_admitted_total", "Requests admitted by the tenant's quota on this node", ["tenant"];
    /// Requests refused by a quota or by capacity shedding, by reason.
    quota_rejected: IntCounterVec = "zonegate_quota_rejected_total", "Requests refused on this node by a quota (rpm, tpm, concurrency, model_rpm, model_tpm) or zone capacity (shed_p1, shed_p2, capacity_full)", ["tenant", "reason"];
    /// Each node's allocation of a tenant's quota, as this node computes it.
    quota_allocation: IntGaugeVec = "zonegate_quota_allocation", "A node's allocation of a tenant's quota in its effective zone, by unit (rpm, tpm, concurrency)", ["tenant", "zone", "node", "unit"];
    /// Capacity units in flight over this node's share of a zone's units.
    zone_capacity_used: GaugeVec = "zonegate_zone_capacity_used_ratio", "Capacity units in flight from this node over its share of the zone's units (0-1)", ["zone"];
    /// Requests that waited for a zone's units, by how the wait ended.
    zone_queued: IntCounterVec = "zonegate_zone_queued_total", "Requests that waited for a zone's capacity units on this node, by how the wait ended (granted, timeout, displaced by a higher priority)", ["zone", "outcome"];
    /// Each attempt on a backend, by outcome.
    forward_attempts: IntCounterVec = "zonegate_forward_attempts_total", "Attempts on backends by outcome", ["model", "backend", "zone", "outcome"];
    /// Time from sending to a backend until its first body byte.
    first_byte: HistogramVec = "zonegate_forward_first_byte_seconds", "Time to a backend's first body byte", ["model", "backend"];
    retries: IntCounterVec = "zonegate_forward_retries_total", "Attempts after the first, per model", ["model"];
    /// Requests that reached a rule and met its `match` (the share's base).
    rule_evaluated: IntCounterVec = "zonegate_rule_evaluated_total", "Requests that reached a traffic rule and met its match (the base of its percent)", ["rule"];
    /// ...of which the rule routed (its percent took them).
    rule_matched: IntCounterVec = "zonegate_rule_matched_total", "Requests a traffic rule routed to its route_to model", ["rule"];
    /// Shadow copies by outcome.
    shadow_requests: IntCounterVec = "zonegate_shadow_requests_total", "Shadow copies by outcome (ok, error, timeout, skipped_in_flight, skipped_quota, no_backend)", ["shadow", "outcome"];
    /// Compared pairs.
    shadow_comparisons: IntCounterVec = "zonegate_shadow_comparisons_total", "Primary and shadow pairs compared, by result (agree, disagree)", ["shadow", "result"];
    /// Time to first byte of each side of a pair.
    shadow_first_byte: HistogramVec = "zonegate_shadow_first_byte_seconds", "Time to the first byte of the primary and of its shadow copy (side)", ["shadow", "side"];
    /// Mean token-set Jaccard similarity of recent pairs that both answered 2xx.
    shadow_similarity: GaugeVec = "zonegate_shadow_similarity_ratio", "Mean token-set Jaccard similarity of the shadow's last 1024 compared 2xx pairs (0-1)", ["shadow"];
    /// Finished spans not exported: the queue was full or the export failed.
    trace_spans_dropped: IntCounter = "zonegate_trace_spans_dropped_total", "Finished trace spans dropped: the export queue was full or their export to the collector failed", [];
    /// Finished spans the collector accepted.
    trace_spans_exported: IntCounter = "zonegate_trace_spans_exported_total", "Finished trace spans the OTLP collector accepted", [];
    retry_budget_exhausted: IntCounterVec = "zonegate_retry_budget_exhausted_total", "Retries refused by the retry budget", ["model"];
    fallbacks: IntCounterVec = "zonegate_fallbacks_total", "Requests served by a fallback (model or cross-zone)", ["kind", "class"];
    stream_aborts: IntCounterVec = "zonegate_stream_aborts_total", "Upstream streams that broke after the first byte, by reason", ["model", "backend", "reason"];
    /// Continuations of broken streams (`continued`, `unavailable`).
    stream_continuations: IntCounterVec = "zonegate_stream_continuations_total", "Broken streams continued on another backend or model, by outcome", ["model", "outcome"];
    backend_in_flight: IntGaugeVec = "zonegate_backend_in_flight_requests", "Requests in flight per backend", ["backend", "zone"];
    backend_up: IntGaugeVec = "zonegate_backend_up", "1 while a backend takes traffic, 0 while ejected", ["backend", "zone"];
    /// Ejections by cause (`score`, `passive`).
    backend_ejections: IntCounterVec = "zonegate_backend_ejections_total", "Backend ejections by cause (score, passive, credentials)", ["backend", "zone", "cause"];
    probe_duration: HistogramVec = "zonegate_probe_duration_seconds", "Active health probe latency", ["backend"];
    /// Smoothed health score, 0–100.
    backend_health_score: GaugeVec = "zonegate_backend_health_score", "Smoothed backend health score, 0-100", ["backend", "zone"];
    /// 1 for the backend's current state, 0 for the other four.
    backend_state: IntGaugeVec = "zonegate_backend_state", "Backend health state: 1 for the current state (unknown, healthy, degraded, unstable, down), 0 for the others", ["backend", "zone", "state"];
    /// Config weight × state multiplier × ramp, as the pickers see it.
    backend_effective_weight: GaugeVec = "zonegate_backend_effective_weight", "Config weight x state multiplier x slow-start/canary ramp", ["backend", "zone"];
    /// Every health event by kind (state changes included).
    /// From a backend's ejection to its rejoin, as this node saw it.
    ejection_duration: HistogramVec = "zonegate_backend_ejection_duration_seconds", "Time from a backend's ejection to its rejoin on this node, by zone", ["zone"];
    health_events: IntCounterVec = "zonegate_health_events_total", "Health events by kind (state changes, ejections, rejoins, panic, breaker)", ["kind"];
    /// 1 while a model's pool in a zone routes in panic mode.
    pool_panic: IntGaugeVec = "zonegate_pool_panic", "1 while a model's pool in a zone routes over all backends by score", ["model", "zone"];
    /// Backends of a model's pool in a zone, and how many of them are up.
    pool_backends: IntGaugeVec = "zonegate_pool_backends", "Backends of a model's pool in a zone", ["model", "zone"];
    pool_backends_up: IntGaugeVec = "zonegate_pool_backends_up", "Backends of a model's pool in a zone that take traffic (not ejected)", ["model", "zone"];
    /// 1 while the global breaker sends unhealthy models to the floor model.
    breaker_open: IntGauge = "zonegate_health_breaker_open", "1 while requests for models without a healthy backend go to the floor model", [];
    /// Committed config versions this node could not apply.
    config_apply_failed: IntCounter = "zonegate_config_apply_failed_total", "Committed config versions this node could not apply (it kept routing with its last good config)", [];
    decision_version: IntGauge = "zonegate_decision_version", "Version of the last control-plane decision this node routes with", [];
    /// 1 for each zone's current status in this node's view.
    zone_status: IntGaugeVec = "zonegate_zone_status", "Zone status in this node's view: 1 for the current status (active, failed_over, draining), 0 for the others", ["zone", "status"];
    raft_term: IntGauge = "zonegate_raft_term", "Current Raft term as this node sees it", [];
    raft_is_leader: IntGauge = "zonegate_raft_is_leader", "1 while this node leads the Raft group", [];
    raft_has_leader: IntGauge = "zonegate_raft_has_leader", "1 while this node knows a Raft leader", [];
    raft_applied_index: IntGauge = "zonegate_raft_applied_index", "Last Raft log index this node applied", [];
    raft_quorum_ack_age: Gauge = "zonegate_raft_quorum_ack_age_seconds", "On the leader: seconds since a quorum last acknowledged it (0 on other nodes)", [];
    raft_rpc_refused: IntCounterVec = "zonegate_raft_rpc_refused_total", "Raft RPCs and values refused before reaching Raft, by reason (unsigned, unknown_key, bad_signature, stale, replayed, bad_certificate, slow_body, not_a_member, sender_mismatch, bad_body, wrong_cluster, amnesia, newer_format)", ["reason"];
    listener_connections: IntGaugeVec = "zonegate_listener_connections", "Open connections per listener (data, admin, raft)", ["listener"];
    listener_connection_limit: IntGaugeVec = "zonegate_listener_connection_limit", "Connection budget per listener: past it new connections are closed at accept", ["listener"];
    listener_accepted: IntCounterVec = "zonegate_listener_accepted_total", "Connections accepted within the listener's budget", ["listener"];
    listener_refused: IntCounterVec = "zonegate_listener_refused_total", "Connections closed at accept because the listener's budget was full", ["listener"];
    listener_closed: IntCounterVec = "zonegate_listener_closed_total", "Connections closed by the listener, by reason (idle, header_timeout, send_timeout, tls_failed, per_ip_limit: at accept, its source address at max_connections_per_ip)", ["listener", "reason"];
    listener_thread_connections: IntGaugeVec = "zonegate_listener_thread_connections", "Open connections per data-plane thread (a thread two or more over the least busy hands new ones to it)", ["listener", "thread"];
    heap_trims: IntCounter = "zonegate_heap_trims_total", "Times the node gave the allocator's free memory back to the system after a flood of connections or streams ended", [];
    heap_released: IntCounter = "zonegate_heap_released_bytes_total", "Resident memory given back to the system by those trims (the fall in RSS across each)", [];
    listener_handed_over: IntCounterVec = "zonegate_listener_handed_over_total", "Connections a data-plane thread accepted and handed to a less busy one", ["listener"];
    cluster_view_age: Gauge = "zonegate_cluster_view_age_seconds", "Time since this node last heard from a leader with a quorum (-1 before it ever did)", [];
    cluster_leader_contact: IntGauge = "zonegate_cluster_leader_contact", "1 while this node heard from a leader with a quorum within three election timeouts", [];
    /// 1 for the reason once the Raft member stopped for good.
    cluster_fatal: IntGaugeVec = "zonegate_cluster_fatal", "1 once this node's Raft member stopped for good, by reason (no_space, storage, panicked): readiness fails, it stops serving after drain_grace and exits non-zero", ["reason"];
    data_dir_free_bytes: IntGauge = "zonegate_data_dir_free_bytes", "Bytes available under node.data_dir, where the Raft store writes (a full disk stops the control plane)", [];
    decisions: IntCounterVec = "zonegate_decisions_total", "Decisions proposed through this node's admin API, by outcome", ["kind", "outcome"];
    zone_health_score: GaugeVec = "zonegate_zone_health_score", "The leader's zone score (0-1) for the latest assessed period (failover below the cutoff, 0.4 by default)", ["zone"];
    zone_error_ratio: GaugeVec = "zonegate_zone_error_ratio", "The leader's view of a zone's gateway error ratio, latest period", ["zone"];
    zone_timeout_ratio: GaugeVec = "zonegate_zone_timeout_ratio", "The leader's view of a zone's downstream timeout ratio, latest period", ["zone"];
    zone_gpu_health_ratio: GaugeVec = "zonegate_zone_gpu_health_ratio", "The leader's view of a zone's backend health (0-1), latest period", ["zone"];
    failover_detect_seconds: Gauge = "zonegate_failover_detect_seconds", "From the first bad period to the commit of the last automatic failover this node proposed", [];
    failover_fail_static: IntGauge = "zonegate_failover_fail_static", "1 while this node's detector finds every zone bad and decides nothing (fail static)", [];
    failover_fail_static_periods: IntCounter = "zonegate_failover_fail_static_periods_total", "Periods this node's detector found every zone bad and decided nothing", [];
    failover_auto_decisions: IntCounterVec = "zonegate_failover_auto_decisions_total", "Automatic decisions this node proposed, by outcome (proposed, applied, refused)", ["outcome"];
    /// 1 from SIGTERM until exit.
    draining: IntGauge = "zonegate_node_draining", "1 while this node drains before exiting (readiness fails)", [];
    raft_handovers: IntCounterVec = "zonegate_raft_handovers_total", "Leadership handovers by a draining leader, by outcome (transferred, failed: its Raft member stopped instead)", ["outcome"];
    /// Data-plane requests being served (streams until their last byte).
    in_flight: IntGauge = "zonegate_node_in_flight_requests", "Data-plane requests in flight on this node, streams until their last byte", [];
    /// Streams the drain ended with the SSE error event at `drain_timeout`.
    drain_cut_streams: IntCounter = "zonegate_drain_cut_streams_total", "Streams still open at drain_timeout, ended with the SSE error event", [];
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Holds scrape-time updates to one at a time (two concurrent scrapes
    /// would otherwise add a mirrored counter's delta twice).
    pub fn scrape_guard(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.scrape.lock()
    }
}

/// Sets a counter to a total kept elsewhere (the control plane counts its
/// automatic decisions): adds the difference, never goes down. Call under
/// [`Metrics::scrape_guard`].
pub fn mirror(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

/// Sets a 0/1 state gauge: 1 for `current`, 0 for every other of `states`.
/// `labels` are the leading labels; the state is the last one.
pub fn set_state(gauge: &IntGaugeVec, labels: &[&str], states: &[&str], current: &str) {
    let mut all: Vec<&str> = labels.to_vec();
    all.push("");
    let last = all.len() - 1;
    for s in states {
        all[last] = s;
        gauge.with_label_values(&all).set(i64::from(*s == current));
    }
}

/// Removes every series of `family` whose `label` value `keep` rejects:
/// the gauges of backends and zones that are gone stop being exported.
pub fn retain<T: MetricVecBuilder>(
    family: &MetricVec<T>,
    label: &str,
    keep: impl Fn(&str) -> bool,
) {
    for mf in family.collect() {
        for m in mf.get_metric() {
            let labels: HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get(label).is_some_and(|v| !keep(v)) {
                let _ = family.remove(&labels);
            }
        }
    }
}

/// The longest label value a client can influence (a model name in a
/// request, say): [`bounded_label`] cuts longer ones.
pub const MAX_LABEL_BYTES: usize = 128;

/// The `model` label of a request for a model no route knows: one series,
/// whatever names clients send (a name per request would be a series per
/// request, kept for the process's life).
pub const UNKNOWN_MODEL: &str = "(unknown)";

/// `value` cut to [`MAX_LABEL_BYTES`] at a character boundary: a label
/// value that reached a metric from a request never weighs more, even
/// when a check upstream that should have bounded it did not.
pub fn bounded_label(value: &str) -> &str {
    if value.len() <= MAX_LABEL_BYTES {
        return value;
    }
    let mut end = MAX_LABEL_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// Labels that would make a series per request or per user: never used.
const UNBOUNDED_LABELS: &[&str] = &[
    "request_id",
    "session",
    "session_id",
    "user",
    "trace_id",
    "url",
    "path",
    "key",
];

/// Why a metric's name, type or labels break the Prometheus conventions
/// zonegate follows, or `None`: `zonegate_` (or the standard `process_`)
/// prefix, snake case, base units (seconds, bytes, ratios 0-1), counters
/// and only counters end in `_total`, histograms of seconds or bytes,
/// bounded labels.
pub fn convention_violation(name: &str, prometheus_type: &str, labels: &[&str]) -> Option<String> {
    let bad = |why: &str| Some(format!("{name} ({prometheus_type}): {why}"));
    if !(name.starts_with("zonegate_") || name.starts_with("process_")) {
        return bad("not named zonegate_*");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || name.contains("__")
        || name.ends_with('_')
    {
        return bad("not snake_case");
    }
    const NOT_BASE_UNITS: &[&str] = &[
        "ms",
        "milliseconds",
        "us",
        "microseconds",
        "ns",
        "nanoseconds",
        "minutes",
        "hours",
        "days",
        "percent",
        "pct",
        "kb",
        "mb",
        "gb",
        "kilobytes",
        "megabytes",
        "gigabytes",
    ];
    if let Some(unit) = name.split('_').find(|w| NOT_BASE_UNITS.contains(w)) {
        return bad(&format!(
            "unit `{unit}` is not a base unit (seconds, bytes, ratio)"
        ));
    }
    let total = name.ends_with("_total");
    match prometheus_type {
        "counter" if !total => return bad("a counter must end in _total"),
        "counter" => {}
        _ if total => return bad("only counters end in _total"),
        "histogram" | "summary" if !(name.ends_with("_seconds") || name.ends_with("_bytes")) => {
            return bad("a histogram measures seconds or bytes and says so")
        }
        "gauge" | "histogram" | "summary" | "untyped" => {}
        other => return bad(&format!("unknown type {other}")),
    }
    if let Some(l) = labels.iter().find(|l| UNBOUNDED_LABELS.contains(l)) {
        return bad(&format!("label `{l}` is unbounded"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_metric_follows_the_conventions() {
        let broken: Vec<_> = DECLARED
            .iter()
            .filter_map(|(name, kind, labels)| {
                convention_violation(name, kind.prometheus_type(), labels)
            })
            .collect();
        assert!(broken.is_empty(), "{broken:#?}");
    }

    #[test]
    fn conventions_catch_the_old_mistakes() {
        for (name, ty, labels) in [
            ("zonegate_raft_last_quorum_ack_ms", "gauge", &[][..]),
            ("zonegate_failover_auto_decisions", "counter", &[]),
            ("zonegate_requests", "counter", &[]),
            ("zonegate_up_total", "gauge", &[]),
            ("zonegate_latency", "histogram", &[]),
            ("gateway_requests_total", "counter", &[]),
            ("zonegate_requests_total", "counter", &["request_id"]),
            ("zonegate_kv_percent", "gauge", &[]),
        ] {
            assert!(
                convention_violation(name, ty, labels).is_some(),
                "{name} passed"
            );
        }
        assert_eq!(
            convention_violation("zonegate_requests_total", "counter", &["model"]),
            None
        );
        assert_eq!(
            convention_violation("process_cpu_seconds_total", "counter", &[]),
            None
        );
    }

    /// Every exported family has the type the table declares, and every
    /// name on the page is declared (or a standard `process_*`).
    #[test]
    fn exposition_matches_the_table() {
        let m = Metrics::new();
        m.requests.with_label_values(&["t", "m", "ok"]).inc();
        m.failover_fail_static_periods.inc();
        let text = m.render();
        let mut seen = 0;
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut words = line.split_whitespace().skip(2);
            let (name, ty) = (words.next().unwrap(), words.next().unwrap());
            assert_eq!(convention_violation(name, ty, &[]), None);
            if let Some((_, kind, _)) = DECLARED.iter().find(|(n, _, _)| *n == name) {
                assert_eq!(kind.prometheus_type(), ty, "{name}");
                seen += 1;
            } else {
                assert!(name.starts_with("process_"), "{name} is not declared");
            }
        }
        assert!(seen >= 10, "{text}");
    }

    #[test]
    fn build_info_names_version_and_commit() {
        let text = Metrics::new().render();
        let line = format!(
            "zonegate_build_info{{commit=\"{}\",version=\"{VERSION}\"}} 1",
            commit()
        );
        assert!(text.contains(&line), "{text}");
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }

    #[test]
    fn state_gauge_has_one_current_state() {
        let m = Metrics::new();
        let states = ["healthy", "down"];
        set_state(&m.backend_state, &["b", "az-a"], &states, "healthy");
        set_state(&m.backend_state, &["b", "az-a"], &states, "down");
        let g = |s| m.backend_state.with_label_values(&["b", "az-a", s]).get();
        assert_eq!((g("healthy"), g("down")), (0, 1));
    }

    #[test]
    fn mirrored_counter_never_goes_down() {
        let m = Metrics::new();
        mirror(&m.failover_fail_static_periods, 3);
        mirror(&m.failover_fail_static_periods, 2);
        mirror(&m.failover_fail_static_periods, 5);
        assert_eq!(m.failover_fail_static_periods.get(), 5);
    }

    #[test]
    fn retain_drops_series_of_gone_backends() {
        let m = Metrics::new();
        for b in ["keep", "gone"] {
            m.backend_up.with_label_values(&[b, "az-a"]).set(1);
            set_state(
                &m.backend_state,
                &[b, "az-a"],
                &["healthy", "down"],
                "healthy",
            );
        }
        retain(&m.backend_up, "backend", |b| b == "keep");
        retain(&m.backend_state, "backend", |b| b == "keep");
        let text = m.render();
        assert!(text.contains("backend=\"keep\""), "{text}");
        assert!(!text.contains("backend=\"gone\""), "{text}");
    }

    #[test]
    fn label_values_a_client_can_influence_are_capped() {
        assert_eq!(bounded_label("qwen25-7b-instruct"), "qwen25-7b-instruct");
        let long = "m".repeat(2 << 20);
        assert_eq!(bounded_label(&long).len(), MAX_LABEL_BYTES);
        // Cut at a character boundary, never inside one.
        let wide = "é".repeat(MAX_LABEL_BYTES);
        let cut = bounded_label(&wide);
        assert_eq!(cut.len(), MAX_LABEL_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
        let odd = format!("x{wide}");
        assert_eq!(bounded_label(&odd).len(), MAX_LABEL_BYTES - 1);
    }

    #[test]
    fn every_metric_is_named_zonegate() {
        let m = Metrics::new();
        m.requests.with_label_values(&["t", "m", "ok"]).inc();
        m.backend_up.with_label_values(&["b", "az-a"]).set(1);
        let text = m.render();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(
                line.starts_with("zonegate_") || line.starts_with("process_"),
                "{line}"
            );
        }
        assert!(text.contains("zonegate_requests_total{model=\"m\",outcome=\"ok\",tenant=\"t\"} 1"));
    }
}
