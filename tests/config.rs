//! The replicated routing config, against real processes: applied through
//! any node, validated on the leader, followed by every node without a
//! restart (live backends keep their state), rolled back, refused by its
//! safety rules unless forced; a node with an older file follows the
//! cluster; a standalone node reloads its file on SIGHUP.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

async fn config_of(node: &NodeProcess) -> Value {
    node.admin_get("/admin/v1/config").await
}

/// The config version a node answers requests with.
async fn served_version(node: &NodeProcess) -> Option<String> {
    let resp = node.chat().json(&chat_body(8, false)).send().await.ok()?;
    resp.headers()
        .get("x-zonegate-config-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn backend_state(node: &NodeProcess, name: &str) -> Option<String> {
    let v = node.admin_get("/admin/v1/backends").await;
    v["backends"]
        .as_array()?
        .iter()
        .find(|b| b["name"] == name)
        .map(|b| b["state"].as_str().unwrap_or_default().to_owned())
}

async fn all_serve(cluster: &TestCluster, version: &str) {
    let nodes: Vec<&NodeProcess> = cluster.running().collect();
    eventually(
        Duration::from_secs(20),
        &format!("every node routes with config version {version}"),
        || async {
            for n in &nodes {
                if served_version(n).await.as_deref() != Some(version) {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_applied_through_a_follower_reaches_every_node_and_rolls_back() {
    let cluster = TestCluster::start(
        2,
        "[health]\ninterval = \"200ms\"\nstable_interval = \"1s\"\n",
    )
    .await;
    let leader = cluster.leader().await;
    // The first leader seeded config version 1 from its file.
    all_serve(&cluster, "1").await;
    let follower = cluster.node(if leader == 1 { 2 } else { 1 });

    // An ejected backend stays ejected across the change.
    cluster.mocks["az-c-2"]
        .faults(json!({"unhealthy": true}))
        .await;
    eventually(
        Duration::from_secs(30),
        "az-c-2 is ejected everywhere",
        || async {
            for n in cluster.running() {
                if backend_state(n, "az-c-2").await.as_deref() != Some("down") {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // A steady trickle of requests, none of which may fail.
    let trickle_node = cluster.node(3).data.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let resp = client()
                    .post(format!("{trickle_node}/v1/chat/completions"))
                    .bearer_auth(API_KEY)
                    .json(&chat_body(8, false))
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status() == 200 => ok += 1,
                    Ok(r) => {
                        let version = r.headers().get("x-zonegate-config-version").cloned();
                        failed.push(format!(
                            "{} {version:?} {}",
                            r.status(),
                            r.text().await.unwrap_or_default()
                        ))
                    }
                    Err(e) => failed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, failed)
        })
    };

    // Add a backend in az-b through a follower.
    let extra = Mock::start("az-b-9", "az-b", &[MODEL]).await;
    let current = config_of(follower).await["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v2.toml");
    std::fs::write(
        &file,
        format!("{current}\n{}", extra.backend_toml(&[MODEL])),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let (code, out, err) = ctl(&follower.admin, &["config", "diff", file]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("+name = \"az-b-9\""), "{out}");
    let (code, out, err) = ctl(
        &follower.admin,
        &["config", "apply", file, "--reason", "more az-b"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("config version 2"), "{out}");
    let committed = std::time::Instant::now();
    all_serve(&cluster, "2").await;
    eprintln!(
        "config version 2 served by every node {:?} after the commit",
        committed.elapsed()
    );
    for n in cluster.running() {
        assert!(
            backend_state(n, "az-b-9").await.is_some(),
            "az-b-9 on {}",
            n.admin
        );
        assert_eq!(backend_state(n, "az-c-2").await.as_deref(), Some("down"));
    }
    // The az-b node sends traffic to the new backend.
    eventually(Duration::from_secs(30), "az-b-9 serves", || async {
        let _ = cluster
            .in_zone("az-b")
            .chat()
            .json(&chat_body(8, false))
            .send()
            .await;
        extra.stats().await["requests"].as_u64().unwrap_or(0) > 0
    })
    .await;

    // A stale --if-version, an invalid key, and each safety rule refuse,
    // changing nothing.
    let (code, _, err) = ctl(
        &follower.admin,
        &["config", "apply", file, "--if-version", "1"],
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("stale_version"), "{err}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{current}\n[retry]\nbudget_ratio = 7.0\n")).unwrap();
    let (code, _, err) = ctl(&follower.admin, &["config", "apply", bad.to_str().unwrap()]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("submitted config") && err.contains("retry.budget_ratio"),
        "{err}"
    );
    let mut without_az_c: toml::Table = current.parse().unwrap();
    if let Some(toml::Value::Array(backends)) = without_az_c.get_mut("backends") {
        backends.retain(|b| b.get("zone").and_then(|z| z.as_str()) != Some("az-c"));
    }
    let emptied = dir.path().join("emptied.toml");
    std::fs::write(&emptied, toml::to_string(&without_az_c).unwrap()).unwrap();
    let (code, out, _) = ctl(
        &follower.admin,
        &["config", "apply", emptied.to_str().unwrap(), "--dry-run"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("zone_emptied") && out.contains("- az-c/"),
        "{out}"
    );
    let (code, _, err) = ctl(
        &follower.admin,
        &["config", "apply", emptied.to_str().unwrap()],
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("zone_emptied"), "{err}");
    let keyless = dir.path().join("keyless.toml");
    std::fs::write(
        &keyless,
        current.replace(
            &zonegate::config::sha256_hex(API_KEY),
            &zonegate::config::sha256_hex("another-key"),
        ),
    )
    .unwrap();
    // The rule knows deptA's traffic once the leader heard a report of it.
    let keyless = keyless.to_str().unwrap().to_owned();
    eventually(
        Duration::from_secs(20),
        "the leader saw deptA's traffic",
        || async {
            let (_, out, _) =
                ctl(&follower.admin, &["config", "apply", &keyless, "--dry-run"]).await;
            out.contains("tenant_keys_removed")
        },
    )
    .await;
    let (code, _, err) = ctl(&follower.admin, &["config", "apply", &keyless]).await;
    assert_eq!(code, 1);
    assert!(err.contains("tenant_keys_removed"), "{err}");
    all_serve(&cluster, "2").await;
    // --force overrides a rule.
    let (code, out, err) = ctl(
        &follower.admin,
        &["config", "apply", emptied.to_str().unwrap(), "--force"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    all_serve(&cluster, "3").await;
    for n in cluster.running() {
        assert_eq!(
            backend_state(n, "az-c-1").await,
            None,
            "removed on {}",
            n.admin
        );
    }

    // Roll back to version 1: the routing of the beginning, as version 4.
    let (code, out, err) = ctl(&follower.admin, &["config", "rollback", "--to", "1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    all_serve(&cluster, "4").await;
    for n in cluster.running() {
        assert_eq!(backend_state(n, "az-b-9").await, None);
        assert!(backend_state(n, "az-c-1").await.is_some());
    }
    let (_, history, _) = ctl(&follower.admin, &["config", "history"]).await;
    assert!(
        history.contains("rollback to config version 1"),
        "{history}"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = trickle.await.unwrap();
    assert!(ok > 0);
    assert!(
        failed.is_empty(),
        "{} of {} trickled requests failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
}

/// Config v2, applied with `ctl` through the leader: v1 plus backend
/// `az-a-9`, which no node's file names. Returns the leader and the new
/// backend's mock (keep it alive).
async fn apply_an_extra_backend(cluster: &TestCluster) -> (u64, Mock) {
    let leader = cluster.leader().await;
    all_serve(cluster, "1").await;
    let entry = cluster.node(leader).admin.clone();
    let current = cluster.node(leader).admin_get("/admin/v1/config").await["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let extra = Mock::start("az-a-9", "az-a", &[MODEL]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("v2.toml");
    std::fs::write(
        &file,
        format!("{current}\n{}", extra.backend_toml(&[MODEL])),
    )
    .unwrap();
    let (code, out, err) = ctl(&entry, &["config", "apply", file.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{out}{err}");
    all_serve(cluster, "2").await;
    (leader, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_with_an_older_file_routes_with_the_clusters_config() {
    let mut cluster = TestCluster::start(1, "").await;
    let (_, _extra) = apply_an_extra_backend(&cluster).await;

    // Node 1 restarts with its old file (no az-a-9).
    let dir1 = cluster.nodes[0].take().unwrap().kill_keeping_data().await;
    let rest = cluster.rest.clone();
    let me = cluster.members[0].clone();
    let node = NodeProcess::start_member_logging(dir1, &me, &cluster.members, &rest).await;
    cluster.nodes[0] = Some(node);
    all_serve(&cluster, "2").await;
    assert!(backend_state(cluster.node(1), "az-a-9").await.is_some());
    let log = std::fs::read_to_string(cluster.node(1).dir.path().join("stderr.log")).unwrap();
    assert!(
        log.contains("differs from the cluster's config") && log.contains("backends"),
        "{log}"
    );
}

/// The replicated config lives in the Raft state: a member whose disk was
/// wiped comes back with `--rejoin` and its old file, and routes with the
/// cluster's config (including a backend its file never named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_rejoins_with_the_clusters_config() {
    let mut cluster = TestCluster::start(1, "").await;
    let (leader, _extra) = apply_an_extra_backend(&cluster).await;

    // A follower loses its disk (kill -9, data_dir wiped) and rejoins with
    // its old file.
    let wiped = (1..=3u64).find(|id| *id != leader).unwrap();
    let i = wiped as usize - 1;
    let dir = cluster.nodes[i].take().unwrap().kill_keeping_data().await;
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    let rest = cluster.rest.clone();
    let me = cluster.members[i].clone();
    let node =
        NodeProcess::start_member_with(dir, &me, &cluster.members, &rest, &["--rejoin"]).await;
    cluster.nodes[i] = Some(node);
    all_serve(&cluster, "2").await;
    assert!(
        backend_state(cluster.node(wiped), "az-a-9").await.is_some(),
        "the rejoined member knows the backend only the cluster's config names"
    );
    let v = config_of(cluster.node(wiped)).await;
    assert_eq!(v["version"], 2, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_node_reloads_its_file_on_sighup_and_keeps_it_when_invalid() {
    let a = Mock::start("a-1", "az-a", &[MODEL]).await;
    let b = Mock::start("a-2", "az-a", &[MODEL]).await;
    let node = NodeProcess::start("az-a", &a.backend_toml(&[MODEL])).await;
    let path = node.dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let pid = node.pid().unwrap().to_string();
    let hup = || async {
        let ok = tokio::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .await
            .unwrap();
        assert!(ok.success());
    };
    std::fs::write(&path, format!("{text}\n{}", b.backend_toml(&[MODEL]))).unwrap();
    hup().await;
    eventually(Duration::from_secs(20), "a-2 is loaded", || async {
        backend_state(&node, "a-2").await.is_some()
    })
    .await;
    // An invalid file: the node keeps its config and serves on.
    std::fs::write(&path, format!("{text}\n[retry]\nbudget_ratio = 9\n")).unwrap();
    hup().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(backend_state(&node, "a-2").await.is_some());
    let resp = node.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// `[balance] vnodes = 100000000` passed the dry run, committed, and every
/// node died building its rings (and again at every restart). Now the dry
/// run and the apply refuse it naming the key, and a config whose keys are
/// each within bounds but whose rings are too costly is refused by rule
/// `too_costly`, `--force` or not. Nothing is committed either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_no_node_could_build_is_refused_by_the_dry_run_and_the_apply() {
    let cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    all_serve(&cluster, "1").await;
    let entry = cluster.node(leader).admin.clone();
    let current = config_of(cluster.node(leader)).await["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.toml");
    std::fs::write(&huge, format!("{current}\n[balance]\nvnodes = 100000000\n")).unwrap();
    let mut costly: toml::Table = current.parse().unwrap();
    for b in costly["backends"].as_array_mut().unwrap() {
        b.as_table_mut()
            .unwrap()
            .insert("weight".into(), toml::Value::Integer(10_000));
    }
    let mut balance = toml::Table::new();
    balance.insert("vnodes".into(), toml::Value::Integer(10_000));
    costly.insert("balance".into(), toml::Value::Table(balance));
    let costly_file = dir.path().join("costly.toml");
    std::fs::write(&costly_file, toml::to_string(&costly).unwrap()).unwrap();
    for (file, want) in [(&huge, "balance.vnodes"), (&costly_file, "too_costly")] {
        let f = file.to_str().unwrap();
        for args in [
            vec!["config", "apply", "--dry-run", f],
            vec!["config", "apply", f],
            vec!["config", "apply", "--force", f],
        ] {
            let (code, out, err) = ctl(&entry, &args).await;
            assert_ne!(code, 0, "{args:?}: {out}{err}");
            assert!(
                format!("{out}{err}").contains(want),
                "{args:?} should name {want}: {out}{err}"
            );
        }
    }
    let (code, out, err) = ctl(
        &entry,
        &[
            "--json",
            "config",
            "apply",
            "--dry-run",
            costly_file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(code, 1, "refused by a rule: {out}{err}");
    // Nothing committed; every node still serves, at version 1.
    assert_eq!(config_of(cluster.node(leader)).await["config_version"], 1);
    all_serve(&cluster, "1").await;
}

/// A committed config that one node cannot build (a panic injected in its
/// build by the debug-only `ZONEGATE_DEBUG_FAIL_CONFIG_APPLY`) leaves that
/// node on its last good config, ready and serving, visible in `ctl
/// status` and its metrics; the rest of the cluster applies it, and the
/// next version reaches the node again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_one_node_cannot_build_leaves_it_on_its_last_config() {
    const MARKER: &str = "fails-on-node-2";
    // Read by debug builds only; the marker keeps other tests' nodes
    // (started from this process) unaffected.
    std::env::set_var("ZONEGATE_DEBUG_FAIL_CONFIG_APPLY", format!("2:{MARKER}"));
    let cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    all_serve(&cluster, "1").await;
    let entry = cluster.node(leader).admin.clone();
    let current = config_of(cluster.node(leader)).await["toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2.toml");
    std::fs::write(
        &v2,
        format!(
            "{current}\n[[tenants]]\nname = \"{MARKER}\"\nkey_sha256 = \"{}\"\n",
            zonegate::config::sha256_hex("another-key")
        ),
    )
    .unwrap();
    let (code, out, err) = ctl(&entry, &["config", "apply", v2.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{out}{err}");
    let node2 = cluster.node(2);
    eventually(
        Duration::from_secs(30),
        "node 2 reports it could not apply version 2",
        || async {
            let v = node2.admin_get("/admin/v1/cluster?scope=local").await;
            v["config_failure"]["version"] == 2 && v["config_failure"]["kept"] == 1
        },
    )
    .await;
    for n in [1, 3] {
        let node = cluster.node(n);
        eventually(
            Duration::from_secs(20),
            "the others apply version 2",
            || async { served_version(node).await.as_deref() == Some("2") },
        )
        .await;
    }
    // Node 2: still up, ready, serving with version 1, and saying why.
    assert_eq!(served_version(node2).await.as_deref(), Some("1"));
    let ready = client()
        .get(format!("{}/readyz", node2.data))
        .send()
        .await
        .unwrap();
    assert!(ready.status().is_success(), "{}", ready.status());
    let local = node2.admin_get("/admin/v1/cluster?scope=local").await;
    assert_eq!(local["config_version"], 1, "{local}");
    assert!(
        local["config_failure"]["reason"]
            .as_str()
            .unwrap()
            .contains("injected failure"),
        "{local}"
    );
    assert_eq!(
        metric_sum(
            &node2.metrics().await,
            "zonegate_config_apply_failed_total",
            &[]
        ),
        1.0
    );
    let (code, out, err) = ctl(&entry, &["status"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("2 "))
        .unwrap_or_else(|| panic!("no row for node 2:\n{out}"));
    assert!(row.contains("v2 FAILED (kept v1)"), "{out}");
    // The cluster still decides: the next version commits and reaches
    // every node, node 2 included.
    let v3 = dir.path().join("v3.toml");
    std::fs::write(&v3, format!("{current}\n[balance]\nvnodes = 170\n")).unwrap();
    let (code, out, err) = ctl(&entry, &["config", "apply", v3.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{out}{err}");
    all_serve(&cluster, "3").await;
    let local = node2.admin_get("/admin/v1/cluster?scope=local").await;
    assert!(local["config_failure"].is_null(), "{local}");
}

/// Viewers read every tenant's API-key digest (unsalted SHA-256, so weak
/// keys can be guessed offline) in `/admin/v1/config`; only operators may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_read_the_config_without_api_key_digests() {
    let mock = Mock::start("az-a-1", "az-a", &[MODEL]).await;
    let node = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    let digest = zonegate::config::sha256_hex(API_KEY);
    let url = format!("{}/admin/v1/config", node.admin);
    let operator = get_json(&url, Some(ADMIN_TOKEN)).await;
    assert!(
        operator["toml"].as_str().unwrap().contains(&digest),
        "{operator}"
    );
    let viewer = get_json(&url, Some(VIEWER_TOKEN)).await;
    let toml = viewer["toml"].as_str().unwrap();
    assert!(!viewer.to_string().contains(&digest), "{viewer}");
    assert!(toml.contains("redacted"), "{toml}");
    assert!(toml.contains("deptA"), "the rest is shown: {toml}");
}
