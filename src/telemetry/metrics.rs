//! Prometheus metrics: every name `zonegate_*`, labels bounded. Metric
//! handles are cheap clones of one registry.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
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
/// and labels, so the whole table reads in one screen.
macro_rules! metrics {
    ($($(#[$doc:meta])* $field:ident: $kind:ident = $name:literal, $help:literal, [$($label:literal),*];)*) => {
        /// All metrics of one node.
        #[derive(Clone, Debug)]
        pub struct Metrics {
            registry: Registry,
            $($(#[$doc])* pub $field: $kind,)*
        }

        impl Metrics {
            /// Registers every metric in a fresh registry.
            pub fn new() -> Self {
                let registry = Registry::new();
                Self {
                    $($field: register(&registry, $name, $help, &[$($label),*]),)*
                    registry,
                }
            }
        }
    };
}

metrics! {
    /// Client requests by final outcome.
    requests: IntCounterVec = "zonegate_requests_total", "Client requests by final outcome", ["tenant", "model", "outcome"];
    /// Whole-request latency as the client saw it.
    request_duration: HistogramVec = "zonegate_request_duration_seconds", "Whole-request latency seen by the client", ["model"];
    /// Each attempt on a backend, by outcome.
    forward_attempts: IntCounterVec = "zonegate_forward_attempts_total", "Attempts on backends by outcome", ["model", "backend", "zone", "outcome"];
    /// Time from sending to a backend until its first body byte.
    first_byte: HistogramVec = "zonegate_forward_first_byte_seconds", "Time to a backend's first body byte", ["model", "backend"];
    retries: IntCounterVec = "zonegate_forward_retries_total", "Attempts after the first, per model", ["model"];
    retry_budget_exhausted: IntCounterVec = "zonegate_retry_budget_exhausted_total", "Retries refused by the retry budget", ["model"];
    fallbacks: IntCounterVec = "zonegate_fallbacks_total", "Requests served by a fallback (model or cross-zone)", ["kind", "class"];
    stream_aborts: IntCounterVec = "zonegate_stream_aborts_total", "Upstream streams that broke after the first byte, by reason", ["model", "backend", "reason"];
    /// Continuations of broken streams (`continued`, `unavailable`).
    stream_continuations: IntCounterVec = "zonegate_stream_continuations_total", "Broken streams continued on another backend or model, by outcome", ["model", "outcome"];
    backend_in_flight: IntGaugeVec = "zonegate_backend_in_flight", "Requests in flight per backend", ["backend"];
    backend_up: IntGaugeVec = "zonegate_backend_up", "1 while a backend takes traffic, 0 while ejected", ["backend", "zone"];
    /// Ejections by cause (`score`, `passive`).
    backend_ejections: IntCounterVec = "zonegate_backend_ejections_total", "Backend ejections by cause (score, passive)", ["backend", "zone", "cause"];
    probe_duration: HistogramVec = "zonegate_probe_duration_seconds", "Active health probe latency", ["backend"];
    /// Smoothed health score, 0–100.
    backend_health_score: GaugeVec = "zonegate_backend_health_score", "Smoothed backend health score, 0-100", ["backend", "zone"];
    /// 0 unknown, 1 healthy, 2 degraded, 3 unstable, 4 down.
    backend_state: IntGaugeVec = "zonegate_backend_state", "Backend health state: 0 unknown, 1 healthy, 2 degraded, 3 unstable, 4 down", ["backend", "zone"];
    /// Config weight × state multiplier × ramp, as the pickers see it.
    backend_effective_weight: GaugeVec = "zonegate_backend_effective_weight", "Config weight x state multiplier x slow-start/canary ramp", ["backend", "zone"];
    /// Every health event by kind (state changes included).
    health_events: IntCounterVec = "zonegate_health_events_total", "Health events by kind (state changes, ejections, rejoins, panic, breaker)", ["kind"];
    /// 1 while a model's pool in a zone routes in panic mode.
    pool_panic: IntGaugeVec = "zonegate_pool_panic", "1 while a model's pool in a zone routes over all backends by score", ["model", "zone"];
    /// 1 while the global breaker sends unhealthy models to the floor model.
    breaker_open: IntGauge = "zonegate_health_breaker_open", "1 while requests for models without a healthy backend go to the floor model", [];
    decision_version: IntGauge = "zonegate_decision_version", "Version of the last control-plane decision this node routes with", [];
    raft_term: IntGauge = "zonegate_raft_term", "Current Raft term as this node sees it", [];
    raft_is_leader: IntGauge = "zonegate_raft_is_leader", "1 while this node leads the Raft group", [];
    raft_last_quorum_ack_ms: IntGauge = "zonegate_raft_last_quorum_ack_ms", "On the leader: ms since a quorum last acknowledged it (-1 elsewhere)", [];
    raft_rpc_refused: IntCounterVec = "zonegate_raft_rpc_refused_total", "Raft RPCs and values refused before reaching Raft, by reason (bad_secret, not_a_member, sender_mismatch, bad_body, newer_format)", ["reason"];
    cluster_view_age: Gauge = "zonegate_cluster_view_age_seconds", "Time since this node last heard from a leader with a quorum (-1 before it ever did)", [];
    cluster_leader_contact: IntGauge = "zonegate_cluster_leader_contact", "1 while this node heard from a leader with a quorum within three election timeouts", [];
    decisions: IntCounterVec = "zonegate_decisions_total", "Decisions proposed through this node's admin API, by outcome", ["kind", "outcome"];
    zone_health_score: GaugeVec = "zonegate_zone_health_score", "The leader's zone score (0-1) and its components, latest period", ["zone", "component"];
    failover_detect_seconds: Gauge = "zonegate_failover_detect_seconds", "From the first bad period to the commit of the last automatic failover this node proposed", [];
    failover_fail_static_periods: IntGauge = "zonegate_failover_fail_static_periods", "Periods this node's detector found every zone bad and decided nothing", [];
    failover_auto_decisions: IntGaugeVec = "zonegate_failover_auto_decisions", "Automatic decisions this node proposed, by outcome (proposed, applied, refused)", ["outcome"];
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(line.starts_with("zonegate_"), "{line}");
        }
        assert!(text.contains("zonegate_requests_total{model=\"m\",outcome=\"ok\",tenant=\"t\"} 1"));
    }
}
