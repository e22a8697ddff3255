//! Black-box tests of retries at the edges: a dead backend in a pool that
//! routes in panic mode must not swallow requests while a healthy backend
//! is left, and a primary that accepts connections and never answers is
//! tried once before the fallback model answers.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// Test-sized health: probes several times a second, an ejection after
/// three failed requests, and one that lasts the whole run.
const FAST_HEALTH: &str = r#"
[health]
interval = "300ms"
stable_interval = "1s"
timeout = "500ms"
slow_start = "1s"
passive_failures = 3
ejection_time = "60s"
"#;

/// Requests sent one after another once the pool is in trouble.
const REQUESTS: usize = 165;
/// Runs of the whole scenario, each with its own backends and gateway.
const RUNS: usize = 20;
/// Runs at once.
const PARALLEL_RUNS: usize = 4;

/// Sends one small chat request, in `session` if given (sessions are
/// placed by consistent hashing, so a spread of them reaches every
/// backend whatever p2c thinks of it); returns its status, the backend
/// that answered (if any) and the body.
async fn ask(gw: &NodeProcess, session: Option<usize>) -> (u16, Option<String>, String) {
    let mut req = gw.chat().json(&chat_body(2, false));
    if let Some(s) = session {
        req = req.header("x-session-id", format!("s{s}"));
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let backend = resp
        .headers()
        .get("x-zonegate-backend")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, backend, resp.text().await.unwrap_or_default())
}

async fn health_state(gw: &NodeProcess, name: &str) -> String {
    let v = gw.admin_get("/admin/v1/backends").await;
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .map(|b| b["health_state"].as_str().unwrap_or("").to_owned())
        .unwrap_or_else(|| panic!("no backend {name} in {v}"))
}

/// One run of the scenario: three backends; `bad` answers 500 until it is
/// ejected; `dead` serves (so its latency is fresh and low: the cheapest
/// of the pool to p2c) and is then killed, which leaves the pool with more
/// bad backends than the cap lets go (panic mode). Returns the failures of
/// the requests that follow, which the healthy backend must all answer.
async fn dead_backend_run(run: usize) -> Vec<String> {
    let bad = Mock::start("bad", "az-a", &[MODEL]).await;
    let mut dead = Mock::start("dead", "az-a", &[MODEL]).await;
    let good = Mock::start("good", "az-a", &[MODEL]).await;
    // The healthy backend is the slower one, so a dead backend judged by
    // load and latency alone looks the better pick.
    good.faults(json!({"latency_ms": 10})).await;
    let rest: String = [&bad, &dead, &good]
        .iter()
        .map(|m| m.backend_toml(&[MODEL]))
        .collect();
    let gw = NodeProcess::start("az-a", &format!("{rest}{FAST_HEALTH}")).await;

    // Warm up until `dead` has answered recently, and often enough that
    // its latency is its own rather than its first connection's.
    let started = Instant::now();
    let mut served_by_dead = 0;
    for session in 0..300 {
        let (status, backend, body) = ask(&gw, Some(session)).await;
        assert_eq!(status, 200, "run {run}: warm-up failed: {body}");
        if backend.as_deref() == Some("dead") {
            served_by_dead += 1;
            if served_by_dead >= 10 {
                break;
            }
        }
    }
    assert!(
        served_by_dead >= 10,
        "run {run}: `dead` served {served_by_dead}"
    );
    let warm = started.elapsed();

    // `bad` fails every request until it is ejected; its requests are
    // retried elsewhere.
    bad.faults(json!({"error_rate": 1.0, "error_status": 500}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut session = 1_000;
    while health_state(&gw, "bad").await != "down" {
        assert!(Instant::now() < deadline, "run {run}: `bad` never ejected");
        session += 1;
        let (status, _, body) = ask(&gw, Some(session)).await;
        assert_eq!(
            status, 200,
            "run {run}: a request failed while `bad` failed: {body}"
        );
    }

    let ejected = started.elapsed();
    dead.kill().await;
    let mut failures = Vec::new();
    for i in 0..REQUESTS {
        let (status, backend, body) = ask(&gw, None).await;
        if status != 200 || backend.as_deref() != Some("good") {
            failures.push(format!(
                "run {run} request {i}: {status} from {backend:?}: {body}"
            ));
        }
    }
    eprintln!(
        "run {run}: warm {warm:?}, `bad` out at {ejected:?}, {REQUESTS} requests done at {:?}",
        started.elapsed()
    );
    gw.kill().await;
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_in_a_panicking_pool_never_swallows_a_request() {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut failed_runs = 0;
    // A few runs at once: each has its own backends and gateway, and a
    // run waits on its requests far more than it computes.
    let mut runs: tokio::task::JoinSet<Vec<String>> = tokio::task::JoinSet::new();
    for run in 0..RUNS {
        if runs.len() >= PARALLEL_RUNS {
            let f = runs.join_next().await.unwrap().unwrap();
            failed_runs += usize::from(!f.is_empty());
            failures.extend(f);
        }
        runs.spawn(dead_backend_run(run));
    }
    while let Some(f) = runs.join_next().await {
        let f = f.unwrap();
        failed_runs += usize::from(!f.is_empty());
        failures.extend(f);
    }
    eprintln!(
        "{RUNS} runs in {:?}, {failed_runs} with failures",
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} requests failed in {failed_runs} of {RUNS} runs; the first: {:#?}",
        failures.len(),
        RUNS * REQUESTS,
        &failures[..failures.len().min(5)]
    );
}

const BIG: &str = "big";
const SMALL: &str = "small";

fn stream_body(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 4,
        "stream": true,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_lone_primary_is_tried_once_before_the_fallback_model() {
    let silent = Mock::start("silent", "az-a", &[BIG]).await;
    let fallback = Mock::start("fb", "az-a", &[SMALL]).await;
    silent.faults(json!({"hang": true})).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nttft_timeout = \"1s\"\nfallback = [\"{SMALL}\"]\n",
        silent.backend_toml(&[BIG]),
        fallback.backend_toml(&[SMALL]),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let started = Instant::now();
    let resp = gw.chat().json(&stream_body(BIG)).send().await.unwrap();
    let took = started.elapsed();
    assert_eq!(resp.status(), 200);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (backend, route) = (header("x-zonegate-backend"), header("x-zonegate-route"));
    let body = resp.text().await.unwrap();
    assert_eq!(backend, "fb", "the fallback answered: {route} {body}");
    assert!(route.contains("fallback-model"), "{route}");
    assert!(
        route.contains("retry:1"),
        "one failed attempt before: {route}"
    );
    assert_eq!(
        silent.stats().await["requests"],
        1,
        "the silent backend is tried once (answered after {took:?}, route {route})"
    );
}
