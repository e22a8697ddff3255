//! Security on the wire, against real `zonegate` processes: HTTPS and
//! HTTP/2 on the data plane, mutual TLS between members, signed Raft calls
//! that cannot be replayed or forged, key rotation without a flag day, and
//! listeners that shed idle, slow and excess connections.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use support::tls::TestCa;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zonegate_net::sign::{self, Call, KeyRing, Purpose, SIGNATURE_HEADER};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A config tail: `mock` as the backend, HTTPS with `cert` and `key`.
fn tls_rest(mock: &Mock, cert: &std::path::Path, key: &std::path::Path) -> String {
    format!(
        "{}\n[node.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        mock.backend_toml(&[MODEL]),
        cert.display(),
        key.display()
    )
}

fn https_client(ca: &TestCa) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POSTs a chat request over HTTP/2 (negotiated by ALPN) to `url`;
/// returns the negotiated protocol, the HTTP version, status and headers.
async fn h2_chat(url: &str, ca: &TestCa) -> (Option<Vec<u8>>, http::Version, u16, http::HeaderMap) {
    let addr = url.trim_start_matches("https://");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(zonegate_net::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let body = serde_json::to_vec(&chat_body(16, false)).unwrap();
    let req = http::Request::post("https://localhost/v1/chat/completions")
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    (
        alpn,
        resp.version(),
        resp.status().as_u16(),
        resp.headers().clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_plane_speaks_https_and_http2_and_drops_plain_http_cleanly() {
    let ca = TestCa::new("test CA");
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = ca.write(certs.path(), "gateway", &["gateway.test"]);
    let mock = Mock::start("a-1", "az-a", &[MODEL]).await;
    let rest = tls_rest(&mock, &cert, &key);
    let node = NodeProcess::start("az-a", &rest).await;
    assert!(node.data.starts_with("https://"), "{}", node.data);

    let resp = https_client(&ca)
        .post(format!("{}/v1/chat/completions", node.data))
        .bearer_auth(API_KEY)
        .json(&chat_body(16, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_11);

    let (alpn, version, status, headers) = h2_chat(&node.data, &ca).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(version, http::Version::HTTP_2);
    assert_eq!(status, 200);
    // The backend's headers and zonegate's reach an HTTP/2 client too.
    assert_eq!(headers["x-zonegate-backend"], "a-1", "{headers:?}");
    assert_eq!(headers["x-zonegate-zone"], "az-a");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.contains_key("x-request-id"));

    // Plain HTTP to the TLS port: a prompt failure, never a hang.
    let plain = node.data.replace("https://", "http://");
    let started = Instant::now();
    let answer = client()
        .get(format!("{plain}/healthz"))
        .timeout(Duration::from_secs(20))
        .send()
        .await;
    match answer {
        Ok(r) => panic!("plain HTTP got an answer from the TLS port: {}", r.status()),
        Err(e) => assert!(!e.is_timeout(), "plain HTTP hung: {e}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    eventually(
        Duration::from_secs(10),
        "the failed handshake is counted",
        || async {
            metric_sum(
                &node.metrics().await,
                "zonegate_listener_closed_total",
                &["listener=\"data\"", "reason=\"tls_failed\""],
            ) >= 1.0
        },
    )
    .await;
    // And the port still serves TLS.
    let resp = https_client(&ca)
        .get(format!("{}/healthz", node.data))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Three members over mutual TLS, each in its own directory with its own
/// certificate (`node-<id>.zonegate`) and the cluster CA.
async fn mtls_cluster(ca: &TestCa, admin_tls: bool) -> TestCluster {
    let mut mocks = std::collections::HashMap::new();
    let mut rest = String::new();
    for z in ZONES {
        let m = Mock::start(&format!("{z}-1"), z, &[MODEL]).await;
        rest.push_str(&m.backend_toml(&[MODEL]));
        mocks.insert(m.name.clone(), m);
    }
    rest.push_str(
        "\n[cluster.tls]\ncert = \"member.crt\"\nkey = \"member.key\"\nclient_ca = \"ca.crt\"\n",
    );
    if admin_tls {
        // The member certificate serves the admin API too: forwarded
        // writes check the leader's name like Raft calls do; callers must
        // present a certificate from the cluster CA.
        rest.push_str(
            "\n[admin.tls]\ncert = \"member.crt\"\nkey = \"member.key\"\nclient_ca = \"ca.crt\"\n",
        );
    }
    let members = MemberSpec::one_per_zone();
    let mut nodes = Vec::new();
    for m in &members {
        let dir = tempfile::tempdir().unwrap();
        ca.write(dir.path(), "member", &[&format!("node-{}.zonegate", m.id)]);
        nodes.push(Some(
            NodeProcess::start_member_in(dir, m, &members, &rest).await,
        ));
    }
    TestCluster {
        members,
        rest,
        nodes,
        mocks,
    }
}

async fn decide(node: &NodeProcess, what: &str) -> u64 {
    let resp = client()
        .post(format!("{}/admin/v1/{what}", node.admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"reason": "security test"}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{what}: {body}");
    body["version"].as_u64().expect("a decision version")
}

/// A Raft call as `sender` would sign it with `secret`, at `ts_ms`.
fn signed_call(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    sender: u64,
    secret: &str,
    ts_ms: u64,
) -> (reqwest::RequestBuilder, String) {
    let ring = KeyRing::derive(secret, Purpose::Raft).unwrap();
    let call = Call {
        method: "POST",
        path,
        node: sender,
    };
    let header = sign::sign_call(&ring, call, b"", ts_ms).header();
    let req = client
        .post(format!("{url}{path}"))
        .header("x-zonegate-node-id", sender.to_string())
        .header(SIGNATURE_HEADER, header.clone());
    (req, header)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_over_mutual_tls_commit_and_refuse_strangers_and_impostors() {
    let ca = mtls_ca();
    let cluster = mtls_cluster(&ca, false).await;
    let leader = cluster.leader().await;
    let v = decide(cluster.node(leader), "freeze").await;
    cluster.all_at(v).await;

    let target = cluster.members[0].raft.clone();
    let url = format!("https://{target}");
    let hello = "/raft/v1/hello";
    // A certificate from another CA: the handshake fails.
    let stranger_ca = TestCa::new("another CA");
    let stranger = stranger_ca.issue(&["node-2.zonegate"]);
    let identity =
        reqwest::Identity::from_pem(format!("{}{}", stranger.cert, stranger.key).as_bytes())
            .unwrap();
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .identity(identity)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let (req, _) = signed_call(&c, &url, hello, 2, CLUSTER_SECRET, now_ms());
    assert!(
        req.send().await.is_err(),
        "a stranger's certificate is refused"
    );

    // A valid certificate (member 2) claiming member 3, signed with the
    // right secret: refused, because the certificate names another member.
    let member2 = ca.issue(&["node-2.zonegate"]);
    let identity =
        reqwest::Identity::from_pem(format!("{}{}", member2.cert, member2.key).as_bytes()).unwrap();
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .identity(identity)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let (req, _) = signed_call(&c, &url, hello, 3, CLUSTER_SECRET, now_ms());
    assert_eq!(req.send().await.unwrap().status(), 403);
    // The same certificate speaking for itself is a member.
    let (req, _) = signed_call(&c, &url, hello, 2, CLUSTER_SECRET, now_ms());
    assert_eq!(req.send().await.unwrap().status(), 200);
    let refused = metric_sum(
        &cluster.node(1).metrics().await,
        "zonegate_raft_rpc_refused_total",
        &["reason=\"bad_certificate\""],
    );
    assert!(refused >= 1.0, "{refused}");

    // Nothing changed: the cluster still commits, with the same leader.
    let v = decide(cluster.node(leader), "unfreeze").await;
    cluster.all_at(v).await;
    assert_eq!(cluster.leader().await, leader);
}

fn mtls_ca() -> TestCa {
    TestCa::new("cluster CA")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_calls_cannot_be_replayed_forged_or_used_to_fill_memory() {
    let cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    let target = cluster
        .members
        .iter()
        .find(|m| m.id != leader)
        .unwrap()
        .clone();
    let url = format!("http://{}", target.raft);
    let hello = "/raft/v1/hello";
    let c = client();

    // A member's call is accepted once; the same bytes again are not.
    let (req, captured) = signed_call(&c, &url, hello, leader, CLUSTER_SECRET, now_ms());
    assert_eq!(req.send().await.unwrap().status(), 200);
    let replay = c
        .post(format!("{url}{hello}"))
        .header("x-zonegate-node-id", leader.to_string())
        .header(SIGNATURE_HEADER, captured.clone());
    let resp = replay.send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.text().await.unwrap().contains("replayed"));

    // Signed 31 s ago: stale, even never seen before.
    let (req, _) = signed_call(&c, &url, hello, leader, CLUSTER_SECRET, now_ms() - 31_000);
    assert_eq!(req.send().await.unwrap().status(), 401);
    // The right key id with a wrong MAC.
    let (_, good) = signed_call(&c, &url, hello, leader, CLUSTER_SECRET, now_ms());
    let forged = format!("{}{}", &good[..good.len() - 4], "0000");
    let resp = c
        .post(format!("{url}{hello}"))
        .header("x-zonegate-node-id", leader.to_string())
        .header(SIGNATURE_HEADER, forged)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // The old cleartext-secret header means nothing.
    let resp = c
        .post(format!("{url}{hello}"))
        .header("x-zonegate-node-id", leader.to_string())
        .header("x-zonegate-cluster-secret", CLUSTER_SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    // Declared 60 MiB bodies without valid auth are answered before a byte
    // of them is read, and do not grow the node.
    let pid = cluster.node(target.id).pid().unwrap();
    let before = rss_kib(pid);
    let mut held = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..8 {
        let mut s = TcpStream::connect(&target.raft).await.unwrap();
        let head = format!(
            "POST /raft/v1/append HTTP/1.1\r\nhost: x\r\nx-zonegate-node-id: {leader}\r\ncontent-length: {}\r\n\r\n",
            60 * 1024 * 1024
        );
        let started = Instant::now();
        s.write_all(head.as_bytes()).await.unwrap();
        // Some of the body, as an attacker would keep sending it.
        let _ = s.write_all(&vec![7u8; 1024 * 1024]).await;
        let mut answer = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut answer))
            .await
            .expect("an answer, not a wait for the body")
            .unwrap_or(0);
        slowest = slowest.max(started.elapsed());
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
        held.push(s);
    }
    let after = rss_kib(pid);
    eprintln!(
        "unauthenticated 60 MiB bodies: slowest answer {slowest:?}, RSS {before} -> {after} KiB"
    );
    assert!(
        after.saturating_sub(before) < 16 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
    drop(held);

    let v = decide(cluster.node(leader), "freeze").await;
    cluster.all_at(v).await;
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The zone a request was answered from, sending `pin` if given.
async fn served_zone(
    node: &NodeProcess,
    session: &str,
    pin: Option<&str>,
) -> (String, Option<String>) {
    let mut req = node
        .chat()
        .header("x-session-id", session)
        .json(&chat_body(16, false));
    if let Some(p) = pin {
        req = req.header("x-zonegate-pin", p);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    (
        header("x-zonegate-zone").unwrap_or_default(),
        header("x-zonegate-pin"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_cluster_secret_one_node_at_a_time_keeps_committing() {
    const NEW: &str = "the-new-cluster-secret-2026";
    let mut cluster = TestCluster::start(1, "").await;
    let rest = cluster.rest.clone();
    // A session pinned to az-a by a token signed with the old key.
    let (zone, pin) = served_zone(cluster.in_zone("az-a"), "s-rotation", None).await;
    assert_eq!(zone, "az-a");
    let pin = pin.expect("a pin token");
    let (zone, _) = served_zone(cluster.in_zone("az-b"), "s-rotation", Some(&pin)).await;
    assert_eq!(zone, "az-a", "the pin is honoured on another node");

    // Formed, and every member holds the membership, before any restart.
    let leader = cluster.leader().await;
    let mut version = decide(cluster.node(leader), "freeze").await;
    cluster.all_at(version).await;
    for secret in [format!("{NEW},{CLUSTER_SECRET}"), NEW.to_owned()] {
        for id in 1..=3u64 {
            let dir = cluster.nodes[id as usize - 1]
                .take()
                .unwrap()
                .kill_keeping_data()
                .await;
            let me = cluster.members[id as usize - 1].clone();
            let node =
                NodeProcess::start_member_secret(dir, &me, &cluster.members, &rest, &[], &secret)
                    .await;
            cluster.nodes[id as usize - 1] = Some(node);
            // A quorum commits after every step (a node still on the
            // other key may lag until its turn).
            version = commit_on_a_quorum(&cluster, version).await;
            if secret.contains(',') && id == 2 {
                let (zone, _) =
                    served_zone(cluster.in_zone("az-b"), "s-rotation", Some(&pin)).await;
                assert_eq!(
                    zone, "az-a",
                    "an old-key pin holds while the old key is listed"
                );
            }
        }
    }
    cluster.all_at(version).await;
    let (zone, _) = served_zone(cluster.in_zone("az-b"), "s-rotation", Some(&pin)).await;
    assert_eq!(zone, "az-b", "the old key is gone, and its pins with it");
}

/// Proposes freeze/unfreeze through every node until one commits, and
/// waits for two nodes to apply it; returns its version.
async fn commit_on_a_quorum(cluster: &TestCluster, after: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    // Version 1 froze; odd versions froze, even ones unfroze.
    let what = if after % 2 == 1 { "unfreeze" } else { "freeze" };
    loop {
        for node in cluster.running() {
            let resp = client()
                .post(format!("{}/admin/v1/{what}", node.admin))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"reason": "rotation"}))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            let Ok(resp) = resp else { continue };
            if resp.status() != 200 {
                continue;
            }
            let v = resp.json::<serde_json::Value>().await.unwrap()["version"]
                .as_u64()
                .unwrap();
            let mut applied = 0;
            for _ in 0..100 {
                applied = 0;
                for n in cluster.running() {
                    let s = get_json(
                        &format!("{}/admin/v1/cluster?scope=local", n.admin),
                        Some(ADMIN_TOKEN),
                    )
                    .await;
                    if s["decision_version"].as_u64() >= Some(v) {
                        applied += 1;
                    }
                }
                if applied >= 2 {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("version {v} reached only {applied} nodes");
        }
        if Instant::now() > deadline {
            for n in cluster.running() {
                let s = get_json(
                    &format!("{}/admin/v1/cluster?scope=local", n.admin),
                    Some(ADMIN_TOKEN),
                )
                .await;
                eprintln!("at the deadline: {s}");
            }
            panic!("nothing committed after {after}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slow_and_excess_connections_are_shed_while_admin_and_raft_answer() {
    let fds = zonegate_net::listen::raise_fd_limit();
    if fds < 8_000 {
        eprintln!("SKIPPED: this test needs 8,000 open files, the limit is {fds}");
        return;
    }
    let m = MemberSpec::new(1, "az-a");
    let mock = Mock::start("a-1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}\n[node.limits]\nmax_connections = 2600\nheader_read_timeout = \"2s\"\nidle_timeout = \"4s\"\n",
        mock.backend_toml(&[MODEL])
    );
    let node = NodeProcess::start_member(&m, std::slice::from_ref(&m), &rest).await;
    let addr = node.data.trim_start_matches("http://").to_owned();

    // 2,000 silent connections and 200 that trickle a request head.
    let mut silent = Vec::new();
    for _ in 0..2_000 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let trickle = tokio::spawn(async move {
        for i in 0..20 {
            for s in &mut slow {
                let _ = s.write_all(format!("x-slow-{i}: 1\r\n").as_bytes()).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        slow
    });
    // A normal request still gets through.
    let resp = node
        .chat()
        .json(&chat_body(16, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let slow = trickle.await.unwrap();
    // Every one of them is closed by its timeout: reads see the end.
    for (kind, mut conns) in [("silent", silent), ("slowloris", slow)] {
        for s in &mut conns {
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "a {kind} connection was left open");
        }
    }
    let text = node.metrics().await;
    let closed = |reason: &str| {
        metric_sum(
            &text,
            "zonegate_listener_closed_total",
            &["listener=\"data\"", &format!("reason=\"{reason}\"")],
        )
    };
    // A connection's first head is due from accept: the silent ones are
    // closed by the header-read timeout too, not held for the idle one.
    assert!(
        closed("header_timeout") >= 2_200.0,
        "{}",
        closed("header_timeout")
    );

    // A flood past the data plane's budget: the excess is closed at
    // accept, and the admin API and Raft keep answering.
    let mut flood = Vec::new();
    for _ in 0..3_000 {
        if let Ok(s) = TcpStream::connect(&addr).await {
            flood.push(s);
        }
    }
    eventually(Duration::from_secs(20), "the excess is refused", || async {
        metric_sum(
            &node.metrics().await,
            "zonegate_listener_refused_total",
            &["listener=\"data\""],
        ) >= 300.0
    })
    .await;
    let status = get_json(
        &format!("{}/admin/v1/cluster?scope=local", node.admin),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(status["leader"].as_u64(), Some(1), "{status}");
    let (req, _) = signed_call(
        &client(),
        &format!("http://{}", m.raft),
        "/raft/v1/hello",
        1,
        CLUSTER_SECRET,
        now_ms(),
    );
    assert_eq!(req.send().await.unwrap().status(), 200);
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_api_over_tls_forwards_writes_to_the_leader_over_mutual_tls() {
    let ca = mtls_ca();
    let cluster = mtls_cluster(&ca, true).await;
    // The operator's certificate, from the cluster CA.
    let operator = ca.issue(&["oncall.example"]);
    let operator_pem = format!("{}{}", operator.cert, operator.key);
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .identity(reqwest::Identity::from_pem(operator_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // Without a client certificate the admin API is closed.
    assert!(https_client(&ca)
        .get(format!("{}/admin/v1/whoami", cluster.node(1).admin))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .is_err());
    let follower_admin = cluster.node(1).admin.clone();
    assert!(follower_admin.starts_with("https://"), "{follower_admin}");
    // Wait until node 1 sees a leader other than itself and reaches it.
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    eventually(
        Duration::from_secs(30),
        "node 1 follows a reachable leader",
        || {
            let (https, url) = (https.clone(), format!("{follower_admin}/admin/v1/cluster"));
            let seen = Arc::clone(&seen);
            async move {
                let Ok(resp) = https.get(&url).bearer_auth(ADMIN_TOKEN).send().await else {
                    return false;
                };
                let v: serde_json::Value = resp.json().await.unwrap_or_default();
                let l = v["leader"].as_u64().unwrap_or(0);
                let all_reachable = v["nodes"]
                    .as_array()
                    .is_some_and(|n| n.len() == 3 && n.iter().all(|m| m["reachable"] == true));
                seen.store(l, std::sync::atomic::Ordering::Relaxed);
                l != 0 && all_reachable
            }
        },
    )
    .await;
    let leader = seen.load(std::sync::atomic::Ordering::Relaxed);
    let entry = if leader == 1 { 2 } else { 1 };
    let resp = https
        .post(format!("{}/admin/v1/freeze", cluster.node(entry).admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"reason": "forwarded over TLS"}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leader"].as_u64(), Some(leader), "{body}");

    // The operator's command line trusts the CA from ZONEGATE_CA_FILE and
    // presents the certificate of ZONEGATE_CLIENT_CERT.
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let cert_file = dir.path().join("operator.pem");
    std::fs::write(&cert_file, &operator_pem).unwrap();
    let out = ctl_command(&cluster.node(entry).admin)
        .arg("status")
        .env("ZONEGATE_CA_FILE", &ca_file)
        .env("ZONEGATE_CLIENT_CERT", &cert_file)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("frozen"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_backend_is_verified_against_its_configured_ca() {
    // A zonegate node serving HTTPS is the backend of another node: the
    // second reaches it over TLS, verifying its certificate.
    let ca = TestCa::new("backend CA");
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = ca.write(certs.path(), "backend", &["vllm.internal"]);
    let mock = Mock::start("a-1", "az-a", &[MODEL]).await;
    let tls_backend = NodeProcess::start("az-a", &tls_rest(&mock, &cert, &key)).await;
    let port = tls_backend.data.rsplit(':').next().unwrap().to_owned();
    let front = |tls: String| {
        format!(
            "[[backends]]\nname = \"over-tls\"\nzone = \"az-a\"\nurl = \"https://127.0.0.1:{port}\"\nmodels = [\"{MODEL}\"]\nhealth_path = \"/healthz\"\ntls = {tls}\n"
        )
    };
    let verified = NodeProcess::start(
        "az-a",
        &front(format!(
            "{{ ca = \"{}\", server_name = \"vllm.internal\" }}",
            certs.path().join("ca.crt").display()
        )),
    )
    .await;
    // The front node never forwards its client's API key, so the backend
    // node answers 401 itself: the answer crossed the TLS hop.
    let resp = verified
        .chat()
        .json(&chat_body(16, false))
        .send()
        .await
        .unwrap();
    let backend = resp.headers().get("x-zonegate-backend").cloned();
    let body = resp.text().await.unwrap();
    assert_eq!(
        backend.as_ref().and_then(|v| v.to_str().ok()),
        Some("over-tls"),
        "{body}"
    );
    assert!(body.contains("missing_api_key"), "{body}");

    // Trusting another CA, the same backend is refused: no answer from it.
    let other = TestCa::new("another CA");
    let other_dir = tempfile::tempdir().unwrap();
    other.write(other_dir.path(), "unused", &[]);
    let refused = NodeProcess::start(
        "az-a",
        &front(format!(
            "{{ ca = \"{}\" }}",
            other_dir.path().join("ca.crt").display()
        )),
    )
    .await;
    let resp = refused
        .chat()
        .json(&chat_body(16, false))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_server_error(), "{}", resp.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_to_new_connections_without_a_restart() {
    let old_ca = TestCa::new("old CA");
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = old_ca.write(certs.path(), "gateway", &[]);
    let mock = Mock::start("a-1", "az-a", &[MODEL]).await;
    let node = NodeProcess::start("az-a", &tls_rest(&mock, &cert, &key)).await;
    let old_client = https_client(&old_ca);
    let health = format!("{}/healthz", node.data);
    assert_eq!(old_client.get(&health).send().await.unwrap().status(), 200);

    // Replace the files (a new key from a new CA); the node notices.
    let new_ca = TestCa::new("new CA");
    let leaf = new_ca.issue(&[]);
    std::fs::write(&key, leaf.key).unwrap();
    std::fs::write(&cert, leaf.cert).unwrap();
    let new_client = https_client(&new_ca);
    eventually(
        Duration::from_secs(30),
        "the new certificate is served",
        || {
            let (c, url) = (new_client.clone(), health.clone());
            async move { c.get(&url).send().await.is_ok_and(|r| r.status() == 200) }
        },
    )
    .await;
    // The connection opened before the change was not dropped.
    assert_eq!(old_client.get(&health).send().await.unwrap().status(), 200);
    // A new connection trusting only the old CA no longer gets through.
    assert!(https_client(&old_ca).get(&health).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tokens_bound_to_networks_and_metrics_behind_a_token() {
    let mock = Mock::start("a-1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}\n[[admin.tokens]]\nname = \"office\"\nsha256 = \"{}\"\nrole = \"viewer\"\nallow_from = [\"10.0.0.0/8\"]\n\n[[admin.tokens]]\nname = \"local\"\nsha256 = \"{}\"\nrole = \"viewer\"\nallow_from = [\"127.0.0.0/8\", \"::1\"]\n\n[admin]\nmetrics_auth = true\n",
        mock.backend_toml(&[MODEL]),
        zonegate::config::sha256_hex("office-token"),
        zonegate::config::sha256_hex("local-token"),
    );
    let node = NodeProcess::start("az-a", &rest).await;
    let get = |path: &str, token: Option<&str>| {
        let mut req = client().get(format!("{}{path}", node.admin));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    // A token from outside its networks is refused; inside, accepted.
    assert_eq!(
        get("/admin/v1/whoami", Some("office-token"))
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        get("/admin/v1/whoami", Some("local-token"))
            .await
            .unwrap()
            .status(),
        200
    );
    // /metrics needs a token now.
    assert_eq!(get("/metrics", None).await.unwrap().status(), 401);
    let resp = get("/metrics", Some(VIEWER_TOKEN)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp
        .text()
        .await
        .unwrap()
        .contains("zonegate_listener_connections"));
}
