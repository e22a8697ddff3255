//! Graceful drain of the real binary: SIGTERM under load fails no request
//! that was accepted, ends streams still open at `drain_timeout` with the
//! SSE error event, exits 0; a draining leader hands over leadership.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use tokio::process::Command;
use zonegate::tools::spawn::{spawn_listening, Spawned};

const LONG_MODEL: &str = "long-model";

fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -TERM {pid} failed");
}

/// Starts `zonegate serve` on `config` (written under `dir`), keeping the
/// child so the test can signal it and read its exit status.
async fn serve(dir: &tempfile::TempDir, config: &str) -> (Spawned, String, String) {
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(bin());
    cmd.env("RUST_LOG", "info,openraft=off");
    cmd.arg("serve").arg("--config").arg(&path);
    let proc = spawn_listening(cmd, 2, Duration::from_secs(60))
        .await
        .expect("gateway starts");
    let (data, admin) = (proc.urls[0].clone(), proc.urls[1].clone());
    (proc, data, admin)
}

/// Reads a response body chunk by chunk until it ends or the connection
/// breaks; returns the text and whether it ended cleanly.
async fn read_all(mut resp: reqwest::Response) -> (String, bool) {
    let mut text = String::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => return (text, true),
            Err(_) => return (text, false),
        }
    }
}

fn stream_body(model: &str, max_tokens: u64) -> serde_json::Value {
    json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": true,
        "messages": [{"role": "user", "content": "hello"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_fails_no_accepted_request_and_cuts_only_streams_past_the_timeout() {
    // `fast` answers the load (200 ms each) and a 1.6 s stream; `slow`
    // streams a chunk every second, so its stream outlives the drain.
    let fast = Mock::start("fast", "az-a", &[MODEL]).await;
    let slow = Mock::start("slow", "az-a", &[LONG_MODEL]).await;
    fast.faults(json!({"latency_ms": 200, "stream_interval_ms": 100}))
        .await;
    slow.faults(json!({"stream_interval_ms": 1000})).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let grace = Duration::from_millis(1500);
    let timeout = Duration::from_secs(4);
    let config = format!(
        "{}{}{}",
        base_toml(
            "az-a",
            &dir.path().join("data"),
            "drain_grace = \"1500ms\"\ndrain_timeout = \"4s\"\n"
        ),
        fast.backend_toml(&[MODEL]),
        slow.backend_toml(&[LONG_MODEL]),
    );
    let (mut proc, data, admin) = serve(&dir, &config).await;
    let chat_url = format!("{data}/v1/chat/completions");
    eventually(Duration::from_secs(30), "node ready", || {
        let url = format!("{data}/readyz");
        async move {
            client()
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await;

    // The long stream and the short one start before the signal.
    let long = client()
        .post(&chat_url)
        .bearer_auth(API_KEY)
        .json(&stream_body(LONG_MODEL, 64))
        .send()
        .await
        .expect("long stream starts");
    assert_eq!(long.status(), 200);
    let long = tokio::spawn(read_all(long));
    let short = client()
        .post(&chat_url)
        .bearer_auth(API_KEY)
        .json(&stream_body(MODEL, 16))
        .send()
        .await
        .expect("short stream starts");
    assert_eq!(short.status(), 200);
    let short = tokio::spawn(read_all(short));
    // The gauge is read from the drain's count at scrape time: the two
    // streams are in flight (a non-streamed request of the load may be too).
    let text = client()
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .expect("admin reachable")
        .text()
        .await
        .expect("metrics text");
    let in_flight = metric_sum(&text, "zonegate_node_in_flight_requests", &[]);
    assert!(in_flight >= 2.0, "in flight: {in_flight}");

    // Load: six loops of non-streaming requests that keep sending until
    // shortly before the grace ends (a request sent after the listener
    // closed is refused, never accepted, and is not this test's concern).
    let stop_sending = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for _ in 0..6 {
        let (url, stop) = (chat_url.clone(), Arc::clone(&stop_sending));
        loops.push(tokio::spawn(async move {
            let mut results = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let r = client()
                    .post(&url)
                    .bearer_auth(API_KEY)
                    .json(&chat_body(8, false))
                    .send()
                    .await;
                let outcome = match r {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        match resp.text().await {
                            Ok(_) => Ok(status),
                            Err(e) => Err(format!("body: {e}")),
                        }
                    }
                    Err(e) => Err(format!("send: {e}")),
                };
                results.push(outcome);
            }
            results
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;

    let pid = proc.child.id().expect("node running");
    let signalled = Instant::now();
    sigterm(pid);

    // Readiness fails at once, while the data plane still serves.
    let ready_url = format!("{data}/readyz");
    eventually(Duration::from_secs(2), "readyz fails after SIGTERM", || {
        let url = ready_url.clone();
        async move {
            client()
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == 503)
        }
    })
    .await;
    let readyz_failed_after = signalled.elapsed();

    tokio::time::sleep(grace.saturating_sub(Duration::from_millis(400))).await;
    stop_sending.store(true, Ordering::SeqCst);
    let mut served = 0;
    for l in loops {
        for r in l.await.expect("load loop") {
            assert_eq!(r, Ok(200), "an accepted request failed during the drain");
            served += 1;
        }
    }
    assert!(served >= 12, "the load ran ({served} requests)");

    let (short_text, short_clean) = short.await.expect("short stream task");
    assert!(
        short_clean && short_text.contains("data: [DONE]"),
        "a stream that ends within drain_timeout completes: {short_text}"
    );
    let (long_text, long_clean) = long.await.expect("long stream task");
    assert!(
        long_text.contains("\"code\":\"node_draining\""),
        "the stream open at drain_timeout ends with the error event: {long_text}"
    );
    assert!(
        !long_text.contains("[DONE]"),
        "a cut stream never says [DONE]"
    );
    assert!(!long_clean, "a cut stream ends with an aborted connection");

    let status = tokio::time::timeout(Duration::from_secs(30), proc.child.wait())
        .await
        .expect("node exits after the drain")
        .expect("exit status");
    let exited_after = signalled.elapsed();
    assert!(status.success(), "drained node exits 0: {status:?}");
    assert!(
        exited_after >= grace + timeout,
        "the stream held the node for the whole drain_timeout ({exited_after:?})"
    );
    eprintln!(
        "drain: readyz failed {readyz_failed_after:?} after SIGTERM; {served} requests served, none failed; exited after {exited_after:?} (grace {grace:?} + timeout {timeout:?})"
    );
    assert!(
        client().get(&ready_url).send().await.is_err(),
        "nothing listens after exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_exits_right_after_the_grace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mock = Mock::start("m", "az-a", &[MODEL]).await;
    let config = format!(
        "{}{}",
        base_toml(
            "az-a",
            &dir.path().join("data"),
            "drain_grace = \"500ms\"\n"
        ),
        mock.backend_toml(&[MODEL]),
    );
    let (mut proc, _data, _admin) = serve(&dir, &config).await;
    let signalled = Instant::now();
    sigterm(proc.child.id().expect("running"));
    let status = tokio::time::timeout(Duration::from_secs(20), proc.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(status.success(), "{status:?}");
    // Not held for the 30 s drain_timeout when nothing is in flight.
    assert!(
        signalled.elapsed() < Duration::from_secs(15),
        "{:?}",
        signalled.elapsed()
    );
}

/// At SIGTERM the draining leader asks a caught-up voter to campaign and
/// grants it its vote (`cluster/src/handover.rs`): another member leads
/// during the old leader's grace, before it exits, by a handover rather
/// than by waiting out the old leader's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_leader_hands_over_leadership_before_it_exits() {
    let cluster = TestCluster::start(1, "").await;
    let old = cluster.leader().await;
    let node = cluster.node(old);
    let others: Vec<String> = cluster
        .running()
        .filter(|n| n.admin != node.admin)
        .map(|n| n.admin.clone())
        .collect();
    let signalled = Instant::now();
    sigterm(node.pid().expect("leader running"));
    let new_leader = loop {
        let mut seen = Vec::new();
        for admin in &others {
            let v = get_json(
                &format!("{admin}/admin/v1/cluster?scope=local"),
                Some(ADMIN_TOKEN),
            )
            .await;
            seen.push(v["leader"].as_u64());
        }
        if let Some(Some(l)) = seen.first() {
            if *l != old && seen.iter().all(|s| *s == Some(*l)) {
                break *l;
            }
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(15),
            "no new leader after the old one drained: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elected_after = signalled.elapsed();
    // The drain grace (5 s by default) has not ended: the old leader still
    // serves data-plane requests while another member leads.
    let resp = node
        .chat()
        .json(&chat_body(4, false))
        .send()
        .await
        .expect("draining node still serves");
    assert_eq!(resp.status(), 200);
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "checked within the grace"
    );
    let metrics = node.metrics().await;
    assert_eq!(metric_sum(&metrics, "zonegate_raft_is_leader", &[]), 0.0);
    assert_eq!(metric_sum(&metrics, "zonegate_node_draining", &[]), 1.0);
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_raft_handovers_total",
            &["outcome=\"transferred\""]
        ),
        1.0,
        "the leader handed over rather than stopping its Raft member"
    );
    eprintln!("leader {old} drained; node {new_leader} leads {elected_after:?} after SIGTERM");
    // Decisions still commit without it.
    let resp = client()
        .post(format!("{}/admin/v1/freeze", others[0]))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"reason": "drain test"}))
        .send()
        .await
        .expect("admin reachable");
    assert!(
        resp.status().is_success(),
        "{}",
        resp.text().await.unwrap_or_default()
    );
}

/// SIGTERM always ends the process within `drain_grace + drain_timeout`
/// plus a small bound, whatever the control plane's state. Here its
/// store's `fsync` never returns (the test-only fault
/// `ZONEGATE_DEBUG_STORE_FAULT=hang:FILE`, a disk that stopped answering):
/// openraft's core waits on it for good, and so did the node, at exit, for
/// the stuck thread (alive long after SIGTERM, holding sled's lock so a
/// replacement could not start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_node_whose_control_plane_is_wedged_within_the_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let me = MemberSpec::new(1, "az-a");
    let mock = Mock::start("m", "az-a", &[MODEL]).await;
    let path = write_member_config(
        dir.path(),
        &me,
        std::slice::from_ref(&me),
        &mock.backend_toml(&[MODEL]),
    );
    let config = std::fs::read_to_string(&path).unwrap().replacen(
        "[node]\n",
        "[node]\ndrain_grace = \"1s\"\ndrain_timeout = \"2s\"\n",
        1,
    );
    std::fs::write(&path, config).unwrap();
    let wedge = dir.path().join("wedge");
    let mut cmd = Command::new(bin());
    cmd.env("RUST_LOG", "info,openraft=off")
        .env("ZONEGATE_CLUSTER_SECRET", CLUSTER_SECRET)
        .env(
            "ZONEGATE_DEBUG_STORE_FAULT",
            format!("hang:{}", wedge.display()),
        )
        .arg("serve")
        .arg("--config")
        .arg(&path);
    let mut proc = spawn_listening(cmd, 2, Duration::from_secs(60))
        .await
        .expect("gateway starts");
    let admin = proc.urls[1].clone();
    eventually(Duration::from_secs(30), "the only member to lead", || {
        let admin = admin.clone();
        async move {
            get_json(
                &format!("{admin}/admin/v1/cluster?scope=local"),
                Some(ADMIN_TOKEN),
            )
            .await["leader"]
                == 1
        }
    })
    .await;
    // The next write wedges the store: its flush never returns.
    std::fs::write(&wedge, "").unwrap();
    let write = tokio::spawn(
        client()
            .post(format!("{admin}/admin/v1/freeze"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"reason": "wedge the store"}))
            .send(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let signalled = Instant::now();
    sigterm(proc.child.id().expect("running"));
    let status = tokio::time::timeout(Duration::from_secs(60), proc.child.wait())
        .await
        .expect("SIGTERM ends the process even with a wedged control plane")
        .expect("status");
    let took = signalled.elapsed();
    write.abort();
    // grace 1 s + drain_timeout 2 s + the 15 s bound, and a margin for a
    // busy host.
    assert!(took < Duration::from_secs(25), "{took:?} {status:?}");
    eprintln!("exited {took:?} after SIGTERM with a wedged control plane: {status:?}");
}
