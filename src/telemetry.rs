//! Prometheus metrics (every name `zonegate_*`, labels bounded) and tracing
//! set-up. Metric handles are cheap clones of one registry.

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global tracing subscriber. `RUST_LOG` overrides the level
/// (default `info`, with openraft's chatty internals at `warn`); per-request
/// access lines use target `zonegate::access`, operator writes
/// `zonegate::audit`.
pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// All metrics of one node.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    /// Client requests by final outcome.
    pub requests: IntCounterVec,
    /// Whole-request latency as the client saw it.
    pub request_duration: HistogramVec,
    /// Each attempt on a backend, by outcome.
    pub forward_attempts: IntCounterVec,
    /// Time from sending to a backend until its first body byte.
    pub first_byte: HistogramVec,
    pub retries: IntCounterVec,
    pub retry_budget_exhausted: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub stream_aborts: IntCounterVec,
    pub backend_in_flight: IntGaugeVec,
    pub backend_up: IntGaugeVec,
    /// Ejections by cause (`score`, `passive`).
    pub backend_ejections: IntCounterVec,
    pub probe_duration: HistogramVec,
    /// Smoothed health score, 0–100.
    pub backend_health_score: GaugeVec,
    /// 0 unknown, 1 healthy, 2 degraded, 3 unstable, 4 down.
    pub backend_state: IntGaugeVec,
    /// Config weight × state multiplier × ramp, as the pickers see it.
    pub backend_effective_weight: GaugeVec,
    /// Every health event by kind (state changes included).
    pub health_events: IntCounterVec,
    /// 1 while a model's pool in a zone routes in panic mode.
    pub pool_panic: IntGaugeVec,
    /// 1 while the global breaker sends unhealthy models to the floor model.
    pub breaker_open: IntGauge,
    pub decision_version: IntGauge,
    pub raft_term: IntGauge,
    pub raft_is_leader: IntGauge,
    pub raft_last_quorum_ack_ms: IntGauge,
    pub decisions: IntCounterVec,
    pub zone_health_score: GaugeVec,
    pub failover_detect_seconds: Gauge,
    pub failover_fail_static_periods: IntGauge,
    pub failover_auto_decisions: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(c.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(g.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    g
}

fn float_gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(g.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    g
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        labels,
    )
    .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(h.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    h
}

impl Metrics {
    /// Registers every metric in a fresh registry. Names and label sets are
    /// constants, so a failure here is a programming error caught by tests.
    #[allow(clippy::panic)]
    pub fn new() -> Self {
        let r = Registry::new();
        let decision_version = IntGauge::new(
            "zonegate_decision_version",
            "Version of the last control-plane decision this node routes with",
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        r.register(Box::new(decision_version.clone()))
            .unwrap_or_else(|e| panic!("metric: {e}"));
        let plain = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
            r.register(Box::new(g.clone()))
                .unwrap_or_else(|e| panic!("metric {name}: {e}"));
            g
        };
        let zone_health_score = GaugeVec::new(
            Opts::new(
                "zonegate_zone_health_score",
                "The leader's zone score (0-1) and its components, latest period",
            ),
            &["zone", "component"],
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        r.register(Box::new(zone_health_score.clone()))
            .unwrap_or_else(|e| panic!("metric: {e}"));
        let failover_detect_seconds = Gauge::new(
            "zonegate_failover_detect_seconds",
            "From the first bad period to the commit of the last automatic failover this node proposed",
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        r.register(Box::new(failover_detect_seconds.clone()))
            .unwrap_or_else(|e| panic!("metric: {e}"));
        let raft_term = plain(
            "zonegate_raft_term",
            "Current Raft term as this node sees it",
        );
        let raft_is_leader = plain(
            "zonegate_raft_is_leader",
            "1 while this node leads the Raft group",
        );
        let raft_last_quorum_ack_ms = plain(
            "zonegate_raft_last_quorum_ack_ms",
            "On the leader: ms since a quorum last acknowledged it (-1 elsewhere)",
        );
        let breaker_open = IntGauge::new(
            "zonegate_health_breaker_open",
            "1 while requests for models without a healthy backend go to the floor model",
        )
        .unwrap_or_else(|e| panic!("metric: {e}"));
        r.register(Box::new(breaker_open.clone()))
            .unwrap_or_else(|e| panic!("metric: {e}"));
        Self {
            requests: counter(
                &r,
                "zonegate_requests_total",
                "Client requests by final outcome",
                &["tenant", "model", "outcome"],
            ),
            request_duration: histogram(
                &r,
                "zonegate_request_duration_seconds",
                "Whole-request latency seen by the client",
                &["model"],
            ),
            forward_attempts: counter(
                &r,
                "zonegate_forward_attempts_total",
                "Attempts on backends by outcome",
                &["model", "backend", "zone", "outcome"],
            ),
            first_byte: histogram(
                &r,
                "zonegate_forward_first_byte_seconds",
                "Time to a backend's first body byte",
                &["model", "backend"],
            ),
            retries: counter(
                &r,
                "zonegate_forward_retries_total",
                "Attempts after the first, per model",
                &["model"],
            ),
            retry_budget_exhausted: counter(
                &r,
                "zonegate_retry_budget_exhausted_total",
                "Retries refused by the retry budget",
                &["model"],
            ),
            fallbacks: counter(
                &r,
                "zonegate_fallbacks_total",
                "Requests served by a fallback (model or cross-zone)",
                &["kind", "class"],
            ),
            stream_aborts: counter(
                &r,
                "zonegate_stream_aborts_total",
                "Responses cut after the first byte (never retried)",
                &["model", "backend", "reason"],
            ),
            backend_in_flight: gauge(
                &r,
                "zonegate_backend_in_flight",
                "Requests in flight per backend",
                &["backend"],
            ),
            backend_up: gauge(
                &r,
                "zonegate_backend_up",
                "1 while a backend takes traffic, 0 while ejected",
                &["backend", "zone"],
            ),
            backend_ejections: counter(
                &r,
                "zonegate_backend_ejections_total",
                "Backend ejections by cause (score, passive)",
                &["backend", "zone", "cause"],
            ),
            backend_health_score: float_gauge(
                &r,
                "zonegate_backend_health_score",
                "Smoothed backend health score, 0-100",
                &["backend", "zone"],
            ),
            backend_state: gauge(
                &r,
                "zonegate_backend_state",
                "Backend health state: 0 unknown, 1 healthy, 2 degraded, 3 unstable, 4 down",
                &["backend", "zone"],
            ),
            backend_effective_weight: float_gauge(
                &r,
                "zonegate_backend_effective_weight",
                "Config weight x state multiplier x slow-start/canary ramp",
                &["backend", "zone"],
            ),
            health_events: counter(
                &r,
                "zonegate_health_events_total",
                "Health events by kind (state changes, ejections, rejoins, panic, breaker)",
                &["kind"],
            ),
            pool_panic: gauge(
                &r,
                "zonegate_pool_panic",
                "1 while a model's pool in a zone routes over all backends by score",
                &["model", "zone"],
            ),
            breaker_open,
            probe_duration: histogram(
                &r,
                "zonegate_probe_duration_seconds",
                "Active health probe latency",
                &["backend"],
            ),
            decisions: counter(
                &r,
                "zonegate_decisions_total",
                "Decisions proposed through this node's admin API, by outcome",
                &["kind", "outcome"],
            ),
            zone_health_score,
            failover_detect_seconds,
            failover_fail_static_periods: plain(
                "zonegate_failover_fail_static_periods",
                "Periods this node's detector found every zone bad and decided nothing",
            ),
            failover_auto_decisions: gauge(
                &r,
                "zonegate_failover_auto_decisions",
                "Automatic decisions this node proposed, by outcome (proposed, applied, refused)",
                &["outcome"],
            ),
            decision_version,
            raft_term,
            raft_is_leader,
            raft_last_quorum_ack_ms,
            registry: r,
        }
    }

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
