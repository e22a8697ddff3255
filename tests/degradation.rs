//! Black-box test of a silent downgrade (issue 46, item 4): a model's
//! primary backend answers 503, its fallback carries the load, clients see
//! no error. The live node's `/metrics` is scraped during the run; the
//! recorded counters become a `promtool test rules` case (the values at
//! each scrape, on the shipped 15 s scrape interval) against the shipped
//! `deploy/prometheus/alerts.yml`: `ZonegateSilentDowngrade`'s expression
//! is false while the model is healthy, turns true within its `for`
//! window of the downgrade, and the alert fires at the end of that window.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const SMALL: &str = "qwen-small";
const ALERT: &str = "ZonegateSilentDowngrade";
/// The scrape (and rule evaluation) interval of the shipped Prometheus
/// config: one recorded scrape is one step of this on promtool's clock.
const SCRAPE_S: u64 = 15;
/// Requests between two scrapes: 2 a second on the scrape clock, past the
/// alert's 0.5 a second floor.
const PER_SCRAPE: usize = 30;
/// Scrapes of the healthy model before the downgrade.
const HEALTHY: usize = 2;

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

/// The `zonegate_model_answers_total` samples of one scrape, by label set
/// (as written between the braces).
fn answers(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("zonegate_model_answers_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once("} ")?;
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// `n` chat requests, 6 at a time over one keep-alive client; each must
/// answer 200.
async fn load(client: &reqwest::Client, url: &str, n: usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (client, url, next) = (client.clone(), url.to_owned(), Arc::clone(&next));
        tasks.spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = client
                    .post(&url)
                    .bearer_auth(API_KEY)
                    .json(&chat_body(8, false))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "a silent downgrade shows no error");
                r.bytes().await.unwrap();
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
}

/// The alert's rule in the shipped file: its expression and `for`.
fn alert_rule(path: &std::path::Path) -> (String, Duration) {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rule = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .find(|r| r["alert"].as_str() == Some(ALERT))
        .unwrap();
    (
        rule["expr"].as_str().unwrap().to_owned(),
        humantime::parse_duration(rule["for"].as_str().unwrap()).unwrap(),
    )
}

/// A promtool unit test of `rules` over the recorded `scrapes` (one per
/// [`SCRAPE_S`], the downgrade from scrape [`HEALTHY`] on): the alert's
/// expression holds no sample at the last healthy scrape and one by its
/// `for` window after the downgrade, when the alert is pending; one `for`
/// window later it fires.
fn promtool_case(
    rules: &std::path::Path,
    scrapes: &[BTreeMap<String, f64>],
    instance: &str,
    (expr, window): (&str, Duration),
) -> Value {
    let mut series: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (i, scrape) in scrapes.iter().enumerate() {
        for labels in scrape.keys() {
            series.entry(labels).or_insert_with(|| vec!["_".into(); i]);
        }
        for (labels, values) in series.iter_mut() {
            // A series not yet exported is missing from the scrape.
            values.push(scrape.get(*labels).map_or("_".into(), |v| v.to_string()));
            assert_eq!(values.len(), i + 1);
        }
    }
    let input: Vec<Value> = series
        .iter()
        .map(|(labels, values)| {
            json!({
                "series": format!(
                    "zonegate_model_answers_total{{job=\"zonegate\",instance=\"{instance}\",{labels}}}"
                ),
                "values": values.join(" "),
            })
        })
        .collect();
    let at = |s: u64| format!("{s}s");
    let downgrade = HEALTHY as u64 * SCRAPE_S;
    let window = window.as_secs();
    let alert_labels = |state: &str| {
        format!(
            "ALERTS{{alertname=\"{ALERT}\",alertstate=\"{state}\",job=\"zonegate\",model=\"{MODEL}\",severity=\"warning\"}}"
        )
    };
    let holds = format!("count by (job, model) ({expr})");
    let alerts = format!("ALERTS{{alertname=\"{ALERT}\"}}");
    json!({
        "rule_files": [rules],
        "evaluation_interval": at(SCRAPE_S),
        "tests": [{
            "interval": at(SCRAPE_S),
            "input_series": input,
            "promql_expr_test": [
                {"expr": holds, "eval_time": at(downgrade - SCRAPE_S), "exp_samples": []},
                {"expr": alerts, "eval_time": at(downgrade - SCRAPE_S), "exp_samples": []},
                {"expr": holds, "eval_time": at(downgrade + window), "exp_samples": [
                    {"labels": format!("{{job=\"zonegate\",model=\"{MODEL}\"}}"), "value": 1}
                ]},
                {"expr": alerts, "eval_time": at(downgrade + window), "exp_samples": [
                    {"labels": alert_labels("pending"), "value": 1}
                ]},
                {"expr": alerts, "eval_time": at(downgrade + 2 * window), "exp_samples": [
                    {"labels": alert_labels("firing"), "value": 1}
                ]},
            ],
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_downgrade_fires_its_alert_in_promtool_over_the_live_nodes_scrapes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("deploy/prometheus/alerts.yml");
    let (expr, window) = alert_rule(&rules);
    let primary = Mock::start("az-a-1", "az-a", &[MODEL]).await;
    let small = Mock::start("az-a-2", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}\n[[models]]\nname = \"{MODEL}\"\nfallback = [\"{SMALL}\"]\n",
        primary.backend_toml(&[MODEL]),
        small.backend_toml(&[SMALL]),
    );
    let node = NodeProcess::start("az-a", &rest).await;
    let (c, url) = (client(), format!("{}/v1/chat/completions", node.data));
    // Healthy: the model answers itself.
    let mut scrapes = Vec::new();
    load(&c, &url, 5).await;
    for i in 0..HEALTHY {
        if i > 0 {
            load(&c, &url, PER_SCRAPE).await;
        }
        scrapes.push(node.metrics().await);
    }
    assert_eq!(fallback_share(&scrapes[HEALTHY - 1], MODEL), 0.0);
    // The primary backend answers 503: the fallback carries the load and
    // every client still gets 200. Scraped until the alert's `for` window
    // has passed twice on the scrape clock.
    primary
        .faults(json!({"error_rate": 1.0, "error_status": 503}))
        .await;
    let steps = 2 * window.as_secs() / SCRAPE_S + 1;
    for _ in 0..steps {
        load(&c, &url, PER_SCRAPE).await;
        scrapes.push(node.metrics().await);
    }
    let last = scrapes.last().unwrap();
    let share = fallback_share(last, MODEL);
    assert!(
        share > 0.2,
        "ZonegateSilentDowngrade's threshold (0.2) is passed: share {share}\n{last}"
    );
    let Some(promtool) = tool("promtool") else {
        node.kill().await;
        return;
    };
    let recorded: Vec<BTreeMap<String, f64>> = scrapes.iter().map(|m| answers(m)).collect();
    let instance = node.admin.trim_start_matches("http://").to_owned();
    let case = promtool_case(&rules, &recorded, &instance, (&expr, window));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("live.test.yml");
    std::fs::write(&file, serde_yaml::to_string(&case).unwrap()).unwrap();
    let out = std::process::Command::new(promtool)
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("SUCCESS"),
        "promtool over the live run's scrapes:\n{text}\n{}",
        serde_yaml::to_string(&case).unwrap()
    );
    println!(
        "{} scrapes of the live node: {ALERT} pending {}s and firing {}s after the downgrade (fallback share {share:.2})",
        recorded.len(),
        window.as_secs(),
        2 * window.as_secs()
    );
    node.kill().await;
}
