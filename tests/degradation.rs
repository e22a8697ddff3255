//! Black-box test of a silent downgrade (issue 46, item 4): a model's
//! primary backend answers 503, its fallback carries the load, clients see
//! no error; the node's `zonegate_model_answers_total` then puts the
//! model's fallback share past the `ZonegateSilentDowngrade` threshold
//! (the recording rule `zonegate:model_fallback_ratio:rate10m` over the
//! scraped counters).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::json;
use support::*;

const SMALL: &str = "qwen-small";

/// The share of `model`'s answers given by a fallback or the floor model,
/// as the recording rule computes it (from counters that started at 0).
fn fallback_share(metrics: &str, model: &str) -> f64 {
    let m = format!("model=\"{model}\"");
    let all = metric_sum(metrics, "zonegate_model_answers_total", &[&m]);
    let down = metric_sum(
        metrics,
        "zonegate_model_answers_total",
        &[&m, "link=\"fallback\""],
    ) + metric_sum(
        metrics,
        "zonegate_model_answers_total",
        &[&m, "link=\"floor\""],
    );
    down / all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_downgrade_puts_the_fallback_share_past_the_alert_threshold() {
    let primary = Mock::start("az-a-1", "az-a", &[MODEL]).await;
    let small = Mock::start("az-a-2", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}\n[[models]]\nname = \"{MODEL}\"\nfallback = [\"{SMALL}\"]\n",
        primary.backend_toml(&[MODEL]),
        small.backend_toml(&[SMALL]),
    );
    let node = NodeProcess::start("az-a", &rest).await;
    // Healthy: the model answers itself.
    for _ in 0..5 {
        let r = node.chat().json(&chat_body(8, false)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(!r.headers()["x-zonegate-route"]
            .to_str()
            .unwrap()
            .contains("fallback"));
    }
    assert_eq!(fallback_share(&node.metrics().await, MODEL), 0.0);
    // The primary backend answers 503: the fallback carries the load and
    // every client still gets 200.
    primary
        .faults(json!({"error_rate": 1.0, "error_status": 503}))
        .await;
    for _ in 0..30 {
        let r = node.chat().json(&chat_body(8, false)).send().await.unwrap();
        assert_eq!(r.status(), 200, "a silent downgrade shows no error");
    }
    let metrics = node.metrics().await;
    let share = fallback_share(&metrics, MODEL);
    assert!(
        share > 0.2,
        "ZonegateSilentDowngrade's threshold (0.2) is passed: share {share}\n{metrics}"
    );
    // The rule reads exactly these series.
    let rules = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml"),
    )
    .unwrap();
    assert!(rules.contains(
        r#"sum by (job, model) (rate(zonegate_model_answers_total{link=~"fallback|floor"}[10m]))"#
    ));
    assert!(rules.contains("expr: zonegate:model_fallback_ratio:rate10m > 0.2"));
    node.kill().await;
}
