//! Black-box tests of the multi-zone data plane: zone-pinned sessions (a
//! signed pin token brings a session home from any node), sticky backends
//! within the home zone, and cross-zone fallback for short requests only.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stick_to_their_zone_and_backend_and_pins_travel_between_nodes() {
    let cluster = TestCluster::start(2, "").await;
    let a = cluster.in_zone("az-a");

    // One session, 30 requests: one zone, one backend, a pin token each time.
    let mut backend = None;
    let mut token = String::new();
    for _ in 0..30 {
        let resp = a
            .chat()
            .header("x-session-id", "chat-42")
            .json(&chat_body(8, false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");
        let b = header(&resp, "x-zonegate-backend");
        assert_eq!(
            backend.get_or_insert(b.clone()),
            &b,
            "the session moved backends"
        );
        token = header(&resp, "x-zonegate-pin");
        assert!(token.starts_with("v2:"), "a pin token is issued: {token:?}");
    }

    // Entering at az-b's node with the token: served at home, in az-a.
    let b_node = cluster.in_zone("az-b");
    let resp = b_node
        .chat()
        .header("x-session-id", "chat-42")
        .header("x-zonegate-pin", &token)
        .json(&chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-zonegate-zone"),
        "az-a",
        "the pin brings the session home"
    );
    assert_eq!(
        Some(header(&resp, "x-zonegate-backend")),
        backend,
        "and to the same backend"
    );

    // Node az-b now remembers the pin too, even without the token.
    let resp = b_node
        .chat()
        .header("x-session-id", "chat-42")
        .json(&chat_body(8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");

    // The `user` field is a session key too; a forged token is ignored.
    let forged = token.replace(":az-a:", ":az-c:");
    let body = json!({"model": MODEL, "max_tokens": 8, "user": "someone-new", "messages": []});
    let resp = b_node
        .chat()
        .header("x-zonegate-pin", forged)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "a forged pin is never an error");
    assert_eq!(
        header(&resp, "x-zonegate-zone"),
        "az-b",
        "a forged pin is ignored"
    );

    // 100 sessions spread over both backends of the zone.
    let mut used = HashSet::new();
    for s in 0..100 {
        let resp = a
            .chat()
            .header("x-session-id", format!("session-{s}"))
            .json(&chat_body(4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(header(&resp, "x-zonegate-zone"), "az-a");
        used.insert(header(&resp, "x-zonegate-backend"));
    }
    assert_eq!(
        used,
        HashSet::from(["az-a-1".to_owned(), "az-a-2".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_home_zone_down_only_short_requests_cross_zones() {
    let mut cluster = TestCluster::start(2, "").await;
    let a_admin = cluster.in_zone("az-a").admin.clone();
    // Automation frozen: nothing but the fallback rules act here.
    let frozen = loop {
        let resp = client()
            .post(format!("{a_admin}/admin/v1/freeze"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"reason": "test"}))
            .send()
            .await
            .unwrap();
        if resp.status() != 503 {
            break resp.json::<Value>().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(frozen["committed"], true, "{frozen}");

    for name in ["az-a-1", "az-a-2"] {
        cluster.mocks.get_mut(name).unwrap().kill().await;
    }
    let a = cluster.in_zone("az-a");
    for _ in 0..20 {
        let resp = a.chat().json(&chat_body(64, false)).send().await.unwrap();
        assert_eq!(
            resp.status(),
            200,
            "{}",
            resp.text().await.unwrap_or_default()
        );
        assert_ne!(header(&resp, "x-zonegate-zone"), "az-a");
        assert!(header(&resp, "x-zonegate-route").contains("fallback:cross-zone"));
    }
    let long =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "tell me everything"}]});
    let resp = a.chat().json(&long).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "zone_unavailable", "{v}");
    let metrics = a.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "zonegate_fallbacks_total",
            &["kind=\"cross_zone\"", "class=\"short\""]
        ) >= 20.0
    );
}

/// Polls a node's history (every 100 ms, up to `within`) for the first
/// decision of `kind`.
async fn await_decision(admin: &str, kind: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(d) = decisions(admin)
            .await
            .into_iter()
            .find(|d| d["kind"] == kind)
        {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "no {kind} decision within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sets the error rate of every mock backend of `zone`.
async fn set_zone_error_rate(cluster: &TestCluster, zone: &str, rate: f64) {
    for (name, mock) in &cluster.mocks {
        if name.starts_with(&format!("{zone}-")) {
            mock.faults(json!({"error_rate": rate})).await;
        }
    }
}

/// The decisions a node has applied, newest first.
async fn decisions(admin: &str) -> Vec<Value> {
    get_json(&format!("{admin}/admin/v1/decisions"), Some(ADMIN_TOKEN)).await["decisions"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_fails_a_broken_zone_over_while_short_requests_keep_succeeding() {
    // 1 s periods: a failover is due within 3 × 1 s + 2 s of the fault.
    let cluster = TestCluster::start(2, "[failover]\nperiod = \"1s\"\nmin_periods = 3\n").await;
    let a = cluster.in_zone("az-a");
    let a_admin = a.admin.clone();

    // Steady short load entering at az-a.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (req, stop, ok, failed) = (a.chat(), stop.clone(), ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let sent = req
                    .try_clone()
                    .unwrap()
                    .json(&chat_body(32, false))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        decisions(&a_admin).await.is_empty(),
        "a healthy cluster decides nothing"
    );

    // Both az-a backends start failing everything.
    let fault_at = Instant::now();
    set_zone_error_rate(&cluster, "az-a", 1.0).await;
    let failover = await_decision(&a_admin, "failover", Duration::from_secs(60)).await;
    let detected = fault_at.elapsed();
    eprintln!("automatic failover of az-a committed {detected:?} after the fault");
    assert_eq!(
        failover["decision"]["failover"]["from"], "az-a",
        "{failover}"
    );
    assert_eq!(failover["origin"], "automatic", "{failover}");
    assert!(
        failover["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("below_cutoff")),
        "{failover}"
    );
    // The budget is min_periods × period + 2 s; the poll above adds ~0.1 s
    // and a busy machine may add more, so allow one extra period.
    assert!(
        detected <= Duration::from_secs(6),
        "failover took {detected:?}"
    );

    // Long requests follow the decision.
    let long = json!({"model": MODEL, "messages": [{"role": "user", "content": "a long story"}]});
    let resp = a.chat().json(&long).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_ne!(header(&resp, "x-zonegate-zone"), "az-a");

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(ok > 0);
    assert!(
        failed * 100 <= ok + failed,
        "{failed} of {} short requests failed",
        ok + failed
    );

    // az-a recovers; with auto_failback off nothing fails back on its own.
    set_zone_error_rate(&cluster, "az-a", 0.0).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let cluster_view = get_json(&format!("{a_admin}/admin/v1/cluster"), Some(ADMIN_TOKEN)).await;
    assert_eq!(
        cluster_view["zones"]["az-a"]["status"], "failed_over",
        "{cluster_view}"
    );
    assert_eq!(decisions(&a_admin).await.len(), 1, "no automatic failback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_failback_on_a_recovered_zone_is_failed_back_by_the_leader() {
    // Test-sized times: 1 s periods and probes, a 2 s dwell and watch time.
    let extra = r#"
[failover]
period = "1s"
auto_failback = true
failback_periods = 2
dwell = "2s"

[health]
interval = "1s"
stable_interval = "2s"
ejection_time = "2s"
watch_interval = "1s"
max_watch_interval = "2s"
healthy_threshold = 2
"#;
    let cluster = TestCluster::start(2, extra).await;
    let a = cluster.in_zone("az-a");
    let admin = a.admin.clone();
    cluster.leader().await;

    // Short requests entering at az-a while both its backends fail.
    set_zone_error_rate(&cluster, "az-a", 1.0).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !decisions(&admin)
        .await
        .iter()
        .any(|d| d["kind"] == "failover")
    {
        assert!(Instant::now() < deadline, "no automatic failover of az-a");
        let _ = a.chat().json(&chat_body(16, false)).send().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // az-a heals: its backends rejoin on their probes, and after two good
    // periods (and the dwell) the leader gives az-a its traffic back.
    set_zone_error_rate(&cluster, "az-a", 0.0).await;
    let failback = await_decision(&admin, "failback", Duration::from_secs(60)).await;
    assert_eq!(failback["origin"], "automatic", "{failback}");
    assert!(
        failback["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("above_failback_threshold")),
        "{failback}"
    );
    cluster.all_at(2).await;
    let resp = a
        .chat()
        .json(&json!({"model": MODEL, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(&resp, "x-zonegate-zone"),
        "az-a",
        "a long request is served at home again"
    );
}
