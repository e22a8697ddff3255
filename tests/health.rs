//! Black-box tests of the health model: a browned-out backend is ejected
//! fast and rejoins slowly; a deep queue costs traffic without ejection;
//! 429s never eject; more than half the pool bad means panic mode, not an
//! outage; capability tiers and the floor model under the global breaker.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use support::*;

/// The issue's rules with test-sized times: probes every second (10 s
/// would only make the tests slow), an ejection watched for 3 s, the
/// watch-list backoff from 1 s to 4 s, a 5 s canary ramped over 10 s.
const HEALTH: &str = r#"
[health]
interval = "1s"
stable_interval = "3s"
timeout = "1s"
slow_start = "2s"
ejection_time = "3s"
watch_interval = "1s"
max_watch_interval = "4s"
canary_time = "5s"
rejoin_ramp = "10s"
"#;

async fn backend(gw: &NodeProcess, name: &str) -> Value {
    let v = gw.admin_get("/admin/v1/backends").await;
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no backend {name} in {v}"))
}

/// Who served each request, and when it finished.
#[derive(Default)]
struct Served {
    log: Mutex<Vec<(Instant, String)>>,
    failures: AtomicUsize,
}

impl Served {
    /// `name`'s share of the requests that finished in `[from, to)`, and
    /// how many finished there.
    fn share(&self, name: &str, from: Instant, to: Instant) -> (f64, usize) {
        let log = self.log.lock();
        let window: Vec<_> = log.iter().filter(|(t, _)| *t >= from && *t < to).collect();
        let mine = window.iter().filter(|(_, b)| b == name).count();
        (mine as f64 / window.len().max(1) as f64, window.len())
    }
}

/// Steady load: `workers` loops of small chat requests until `stop`.
fn load(
    gw: &Arc<NodeProcess>,
    workers: usize,
    stop: &Arc<AtomicBool>,
) -> (Arc<Served>, Vec<tokio::task::JoinHandle<()>>) {
    let served = Arc::new(Served::default());
    let handles = (0..workers)
        .map(|_| {
            let (gw, stop, served) = (Arc::clone(gw), Arc::clone(stop), Arc::clone(&served));
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
                    let status = resp.status();
                    let backend = resp
                        .headers()
                        .get("x-zonegate-backend")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let body = resp.text().await.unwrap_or_default();
                    match (status.as_u16(), backend) {
                        (200, Some(b)) => served.log.lock().push((Instant::now(), b)),
                        _ => {
                            eprintln!("client request failed: {status} {body}");
                            served.failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        })
        .collect();
    (served, handles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brownout_is_ejected_fast_and_rejoins_slowly_without_failing_a_request() {
    let a = Mock::start("a", "az-a", &[MODEL]).await;
    let b = Mock::start("b", "az-a", &[MODEL]).await;
    let sick = Mock::start("sick", "az-a", &[MODEL]).await;
    let rest: String = [&a, &b, &sick]
        .iter()
        .map(|m| m.backend_toml(&[MODEL]))
        .collect();
    let gw = Arc::new(NodeProcess::start("az-a", &format!("{rest}{HEALTH}")).await);
    let stop = Arc::new(AtomicBool::new(false));
    let (served, workers) = load(&gw, 4, &stop);

    // Steady state first: the sick-to-be backend takes its share.
    eventually(
        Duration::from_secs(30),
        "sick backend takes traffic",
        || {
            let served = Arc::clone(&served);
            async move {
                let now = Instant::now();
                served.share("sick", now - Duration::from_secs(3), now).0 > 0.15
            }
        },
    )
    .await;

    sick.faults(json!({"latency_ms": 1500, "error_rate": 0.5}))
        .await;
    let browned = Instant::now();
    eventually(
        Duration::from_secs(30),
        "brownout share under 5% within 30 s",
        || {
            let served = Arc::clone(&served);
            async move {
                let now = Instant::now();
                let (share, n) = served.share("sick", now - Duration::from_secs(3), now);
                n >= 30 && share < 0.05
            }
        },
    )
    .await;
    eprintln!("brownout contained after {:?}", browned.elapsed());
    eventually(Duration::from_secs(30), "sick backend ejected", || async {
        backend(&gw, "sick").await["health_state"] == "down"
    })
    .await;

    sick.faults(json!({"latency_ms": 0, "error_rate": 0.0}))
        .await;
    let recovered = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (early, n) = served.share("sick", recovered, recovered + Duration::from_secs(5));
    assert!(n >= 30, "too little load to judge: {n} requests");
    assert!(
        early < 0.10,
        "a recovered backend must not get its full share at once: {early:.3}"
    );
    eventually(
        Duration::from_secs(90),
        "recovered backend back above 10% within 90 s",
        || {
            let served = Arc::clone(&served);
            async move {
                let now = Instant::now();
                let (share, n) = served.share("sick", now - Duration::from_secs(3), now);
                n >= 30 && share > 0.10
            }
        },
    )
    .await;
    eprintln!("recovered share back after {:?}", recovered.elapsed());

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(
        served.failures.load(Ordering::SeqCst),
        0,
        "no client request fails"
    );
    let events = gw.admin_get("/admin/v1/events").await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["backend"] == "sick")
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"rejoined"), "{events}");
    assert!(kinds.iter().any(|k| k.starts_with("ejected_")), "{events}");
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "zonegate_backend_ejections_total",
            &["backend=\"sick\""]
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_gets_less_traffic_than_its_peers_and_is_never_ejected() {
    let a = Mock::start("a", "az-a", &[MODEL]).await;
    let b = Mock::start("b", "az-a", &[MODEL]).await;
    let deep = Mock::start("deep", "az-a", &[MODEL]).await;
    deep.faults(json!({"queue_depth": 64})).await;
    let rest: String = [&a, &b, &deep]
        .iter()
        .map(|m| m.backend_toml(&[MODEL]))
        .collect();
    // Weighted random shows the health weight alone: the mock's queue adds
    // no latency, and p2c's pair comparison on sequential requests follows
    // sub-millisecond latency noise (a real deep queue shows in latency
    // too, which p2c then avoids on its own).
    let model = format!("[[models]]\nname = \"{MODEL}\"\nbalance = \"random\"\n");
    let gw = NodeProcess::start("az-a", &format!("{rest}{model}{HEALTH}")).await;

    eventually(
        Duration::from_secs(30),
        "deep queue scored down",
        || async {
            let d = backend(&gw, "deep").await;
            let peer = backend(&gw, "a").await;
            d["health_state"] == "degraded"
                && d["effective_weight"] == 0.6
                && peer["effective_weight"] == 1.0
        },
    )
    .await;
    let d = backend(&gw, "deep").await;
    assert_eq!(d["components"]["queue"], 0.0, "{d}");
    assert_eq!(
        d["components"]["errors"],
        Value::Null,
        "no traffic yet: {d}"
    );
    assert_eq!(d["last_probe"]["scraped"]["queue_depth"], 64.0, "{d}");
    assert!(d["score"].as_f64().unwrap() < 85.0, "{d}");
    let peer = backend(&gw, "a").await;
    assert_eq!(peer["health_state"], "healthy", "{peer}");
    assert_eq!(peer["effective_weight"], 1.0, "{peer}");

    let mut counts = std::collections::HashMap::<String, usize>::new();
    for _ in 0..300 {
        let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let name = resp.headers()["x-zonegate-backend"]
            .to_str()
            .unwrap()
            .to_owned();
        *counts.entry(name).or_default() += 1;
    }
    let n = |k: &str| counts.get(k).copied().unwrap_or(0);
    assert!(
        n("deep") < n("a") && n("deep") < n("b"),
        "deep queue should get less than each peer: {counts:?}"
    );
    assert!(n("deep") > 0, "degraded, not ejected: {counts:?}");
    assert_eq!(backend(&gw, "deep").await["ejections"], 0);
    let metrics = gw.metrics().await;
    for name in [
        "zonegate_backend_health_score",
        "zonegate_backend_state",
        "zonegate_probe_duration_seconds_count",
    ] {
        assert!(
            metric_sum(&metrics, name, &["backend=\"deep\""]) > 0.0,
            "{name} missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_never_ejects() {
    let busy = Mock::start("busy", "az-a", &[MODEL]).await;
    let calm = Mock::start("calm", "az-a", &[MODEL]).await;
    // A 1 s Retry-After keeps the busy backend in rotation to answer 429
    // again and again.
    busy.faults(json!({"error_rate": 1.0, "error_status": 429, "retry_after": 1}))
        .await;
    let rest = format!(
        "{}{}{HEALTH}",
        busy.backend_toml(&[MODEL]),
        calm.backend_toml(&[MODEL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answered = busy.stats().await["requests"].as_u64().unwrap();
    assert!(
        answered >= 5,
        "the busy backend was asked repeatedly: {answered}"
    );
    let b = backend(&gw, "busy").await;
    assert_eq!(b["state"], "up", "{b}");
    assert_eq!(b["ejections"], 0, "{b}");
    assert_ne!(b["health_state"], "down", "{b}");
    let events = gw.admin_get("/admin/v1/events").await;
    assert_eq!(events["events"].as_array().unwrap().len(), 0, "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_half_the_pool_bad_is_panic_mode_not_an_outage() {
    // Every health endpoint fails, yet every backend serves: the classic
    // case of a health signal that is wrong for all at once.
    let mocks = [
        Mock::start("p1", "az-a", &[MODEL]).await,
        Mock::start("p2", "az-a", &[MODEL]).await,
        Mock::start("p3", "az-a", &[MODEL]).await,
    ];
    for m in &mocks {
        m.faults(json!({"unhealthy": true})).await;
    }
    let rest: String = mocks.iter().map(|m| m.backend_toml(&[MODEL])).collect();
    // Weighted random, so the test sees the panic weights themselves.
    let model = format!("[[models]]\nname = \"{MODEL}\"\nbalance = \"random\"\n");
    let gw = NodeProcess::start("az-a", &format!("{rest}{model}{HEALTH}")).await;

    eventually(Duration::from_secs(30), "panic mode", || async {
        metric_sum(
            &gw.metrics().await,
            "zonegate_pool_panic",
            &["zone=\"az-a\""],
        ) == 1.0
    })
    .await;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..60 {
        let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "panic mode routes, never an outage");
        seen.insert(
            resp.headers()["x-zonegate-backend"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(seen.len(), 3, "routes over all of them: {seen:?}");
    let all = gw.admin_get("/admin/v1/backends").await;
    let down = all["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["state"] == "down")
        .count();
    assert!(down <= 1, "at most 50% of 3 ejected: {all}");
    let events = gw.admin_get("/admin/v1/events").await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"panic_entered"), "{events}");
    assert!(kinds.contains(&"ejection_refused"), "{events}");

    for m in &mocks {
        m.faults(json!({"unhealthy": false})).await;
    }
    eventually(Duration::from_secs(60), "panic mode ends", || async {
        metric_sum(
            &gw.metrics().await,
            "zonegate_pool_panic",
            &["zone=\"az-a\""],
        ) == 0.0
    })
    .await;
}

const BIG: &str = "qwen25-72b-instruct";
const SMALL: &str = "qwen25-3b-instruct";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_below_the_required_tier_is_skipped_with_no_capable_model() {
    let mut big = Mock::start("big", "az-a", &[BIG]).await;
    let small = Mock::start("small", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\ntier = 3\nfallback = [\"{SMALL}\"]\n\n\
         [[models]]\nname = \"{SMALL}\"\ntier = 1\n{HEALTH}",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL]),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let ask = |tier: Option<&str>| {
        let mut req = gw
            .chat()
            .json(&json!({"model": BIG, "max_tokens": 2, "messages": []}));
        if let Some(t) = tier {
            req = req.header("x-zonegate-min-tier", t);
        }
        req.send()
    };
    let resp = ask(Some("3")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-model"], BIG);

    big.kill().await;
    // Without a minimum the fallback answers...
    let resp = ask(None).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-model"], SMALL);
    // ...with one above the fallback's tier, a clear 503 instead.
    for _ in 0..3 {
        let resp = ask(Some("2")).await.unwrap();
        assert_eq!(resp.status(), 503);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_capable_model", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(SMALL),
            "{v}"
        );
    }
    let resp = ask(Some("9")).await.unwrap();
    assert_eq!(resp.status(), 503, "no model at tier 9 at all");
    let resp = ask(Some("high")).await.unwrap();
    assert_eq!(resp.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_sends_models_without_a_healthy_backend_to_the_floor_model() {
    const OTHER: &str = "llama-8b";
    let primary = Mock::start("primary", "az-a", &[MODEL]).await;
    let other = Mock::start("other", "az-a", &[OTHER]).await;
    let floor = Mock::start("floor", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}{}{HEALTH}floor_model = \"{SMALL}\"\n",
        primary.backend_toml(&[MODEL]),
        other.backend_toml(&[OTHER]),
        floor.backend_toml(&[SMALL]),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
    assert_eq!(resp.headers()["x-zonegate-model"], MODEL);

    // One model of three (33% > 30%) loses its only backend's health.
    primary.faults(json!({"unhealthy": true})).await;
    eventually(Duration::from_secs(30), "breaker opens", || async {
        gw.admin_get("/admin/v1/backends").await["breaker_open"] == true
    })
    .await;
    let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-model"], SMALL);
    assert!(resp.headers()["x-zonegate-route"]
        .to_str()
        .unwrap()
        .contains("floor-model"));
    let resp = gw
        .chat()
        .json(&json!({"model": OTHER, "max_tokens": 2, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["x-zonegate-model"],
        OTHER,
        "healthy models stay"
    );

    primary.faults(json!({"unhealthy": false})).await;
    eventually(Duration::from_secs(60), "breaker closes", || async {
        gw.admin_get("/admin/v1/backends").await["breaker_open"] == false
    })
    .await;
    let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
    assert_eq!(resp.headers()["x-zonegate-model"], MODEL);
    let events = gw.admin_get("/admin/v1/events").await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"breaker_opened") && kinds.contains(&"breaker_closed"),
        "{events}"
    );
}
