//! Black-box tests of the control plane: three gateway processes, one Raft
//! voter per zone, operated with `zonegate ctl`. Decisions replicate to
//! every node, traffic follows them, safety rules refuse with their names,
//! and a kill -9 of the leader loses nothing.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use zonegate::tools::spawn::{spawn_listening, Spawned};

fn long_request() -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "a long answer, please"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_fail_over_and_back_and_every_node_follows() {
    let mut cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // Unauthenticated and under-privileged writes change nothing.
    let url = format!("{}/admin/v1/failover", cluster.node(1).admin);
    let body = json!({"from": "az-a", "to": "az-b"});
    let resp = client().post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = client()
        .post(&url)
        .bearer_auth(VIEWER_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "forbidden", "{v}");
    // Raft RPCs without the cluster secret are refused too.
    let raft = &cluster.members[0].raft;
    assert_eq!(unsigned_raft_vote(raft, None).await, 401);
    assert_eq!(unsigned_raft_vote(raft, Some("wrong")).await, 401);
    cluster.all_at(0).await;

    // A dry run says what would move and writes nothing.
    let preview = ctl_json(
        &cluster.node(1).admin,
        &["failover", "--from", "az-a", "--to", "az-b", "--dry-run"],
    )
    .await;
    assert_eq!(preview["dry_run"], true);
    cluster.all_at(0).await;

    // Sent to a follower, the write is forwarded to the leader.
    let admin = cluster.node(follower).admin.clone();
    let v = ctl_json(
        &admin,
        &[
            "failover", "--from", "az-a", "--to", "az-b", "--reason", "drill",
        ],
    )
    .await;
    assert_eq!(v["version"], 1, "{v}");
    cluster.all_at(1).await;

    // A long request entering az-a is served in az-b, stamped with version 1.
    let resp = cluster
        .node(1)
        .chat()
        .json(&long_request())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-zone"], "az-b");
    assert_eq!(resp.headers()["x-zonegate-decision-version"], "1");

    // Stale compare-and-set and a second failover of az-a are refused by name.
    let (code, _, err) = ctl(
        &admin,
        &[
            "failover",
            "--from",
            "az-c",
            "--to",
            "az-b",
            "--if-version",
            "0",
        ],
    )
    .await;
    assert!(code != 0 && err.contains("stale_version"), "{err}");
    let (code, _, err) = ctl(&admin, &["failover", "--from", "az-a", "--to", "az-c"]).await;
    assert!(code != 0 && err.contains("already_failed_over"), "{err}");

    // az-c follows too; then az-b is the last serving zone and cannot go.
    let v = ctl_json(
        &admin,
        &[
            "failover",
            "--from",
            "az-c",
            "--to",
            "az-b",
            "--if-version",
            "1",
        ],
    )
    .await;
    assert_eq!(v["version"], 2);
    let (code, _, err) = ctl(&admin, &["failover", "--from", "az-b", "--to", "az-a"]).await;
    assert!(
        code != 0,
        "failing over the last serving zone must be refused"
    );
    assert!(err.contains("last_serving_zone"), "{err}");

    // Failback restores az-a.
    assert_eq!(
        ctl_json(&admin, &["failback", "--zone", "az-a"]).await["version"],
        3
    );
    assert_eq!(
        ctl_json(&admin, &["failback", "--zone", "az-c"]).await["version"],
        4
    );
    cluster.all_at(4).await;
    let resp = cluster
        .node(1)
        .chat()
        .json(&long_request())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-zonegate-zone"], "az-a");
    assert_eq!(resp.headers()["x-zonegate-decision-version"], "4");

    // The human table shows every node at the same version.
    let (code, out, err) = ctl(&cluster.node(1).admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("decision version: 4"), "{out}");

    // kill -9 the leader: the others elect a new one and keep every decision.
    let old = cluster.nodes[leader as usize - 1].take().unwrap();
    old.kill().await;
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    let survivor = cluster.node(new_leader).admin.clone();
    let history = get_json(&format!("{survivor}/admin/v1/decisions"), Some(ADMIN_TOKEN)).await;
    let versions: Vec<u64> = history["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![4, 3, 2, 1]);
    // And the survivors still decide.
    assert_eq!(
        ctl_json(&survivor, &["freeze", "--reason", "after the drill"]).await["version"],
        5
    );
    cluster.all_at(5).await;
    let metrics = cluster.node(new_leader).metrics().await;
    assert_eq!(metric_sum(&metrics, "zonegate_raft_is_leader", &[]), 1.0);
    assert!(
        metric_sum(
            &metrics,
            "zonegate_decisions_total",
            &["outcome=\"applied\""]
        ) >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_the_cluster_secret_refuses_to_start() {
    let m = MemberSpec::new(1, "az-a");
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}[[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"{MODEL}\"]\n",
        base_toml("az-a", &dir.path().join("data"), ""),
        members_toml(std::slice::from_ref(&m)),
    );
    let path = dir.path().join("g.toml");
    std::fs::write(&path, config).unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("ZONEGATE_CLUSTER_SECRET")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ZONEGATE_CLUSTER_SECRET"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_zones_get_their_quorum_from_a_witness_that_serves_no_traffic() {
    let a = Mock::start("a1", "az-a", &[MODEL]).await;
    let b = Mock::start("b1", "az-b", &[MODEL]).await;
    let backends = format!("{}{}", a.backend_toml(&[MODEL]), b.backend_toml(&[MODEL]));
    let members = vec![
        MemberSpec::new(1, "az-a"),
        MemberSpec::new(2, "az-b"),
        MemberSpec::new(3, "az-w").with_role("witness"),
    ];
    let node_a = NodeProcess::start_member(&members[0], &members, &backends).await;
    let _node_b = NodeProcess::start_member(&members[1], &members, &backends).await;
    let witness = NodeProcess::start_member(&members[2], &members, "").await;

    let resp = client()
        .get(format!("{}/readyz", witness.data))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503, "a witness is never ready for traffic");
    let resp = witness
        .chat()
        .json(&chat_body(4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);

    // The witness's zone is no failover target; az-b is.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (code, err) = loop {
        let (code, _, err) = ctl(
            &node_a.admin,
            &["failover", "--from", "az-a", "--to", "az-w"],
        )
        .await;
        if code == 0 || !err.contains("no_leader") || tokio::time::Instant::now() > deadline {
            break (code, err);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(code != 0 && err.contains("unknown_zone"), "{err}");
    let v = ctl_json(
        &node_a.admin,
        &["failover", "--from", "az-a", "--to", "az-b"],
    )
    .await;
    assert_eq!(v["version"], 1);
    eventually(
        Duration::from_secs(20),
        "az-a's node to route to az-b",
        || {
            let req = node_a.chat().json(&long_request());
            async move {
                let resp = req.send().await.unwrap();
                resp.headers()["x-zonegate-zone"] == "az-b"
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_restarted_from_its_data_dir_catches_up() {
    let mut cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    let admin = cluster.node(leader).admin.clone();
    assert_eq!(ctl_json(&admin, &["freeze"]).await["version"], 1);
    cluster.all_at(1).await;

    // kill -9 a follower; the others keep deciding without it.
    let dir = cluster.nodes[victim as usize - 1]
        .take()
        .unwrap()
        .kill_keeping_data()
        .await;
    assert_eq!(
        ctl_json(&admin, &["failover", "--from", "az-a", "--to", "az-b"]).await["version"],
        2
    );
    assert_eq!(
        ctl_json(&admin, &["failback", "--zone", "az-a"]).await["version"],
        3
    );

    // Restarted on the same data_dir, it resumes (no second initialisation)
    // and catches up on what it missed.
    let me = cluster.members[victim as usize - 1].clone();
    let rest = cluster.rest.clone();
    let node = NodeProcess::start_member_in(dir, &me, &cluster.members, &rest).await;
    cluster.nodes[victim as usize - 1] = Some(node);
    cluster.all_at(3).await;
    let history = get_json(
        &format!("{}/admin/v1/decisions", cluster.node(victim).admin),
        Some(ADMIN_TOKEN),
    )
    .await;
    let kinds: Vec<&str> = history["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["failback", "failover", "freeze"]);
}

/// Starts `zonegate serve` from `dir/gateway.toml` (a member's config
/// kept from [`NodeProcess::kill_keeping_data`]) with a short drain and
/// `env`, its log appended to `dir/stderr.log`; the child is kept so the
/// test can wait for its exit.
async fn serve_member(dir: &std::path::Path, env: &[(&str, String)]) -> Spawned {
    let mut cmd = member_command(dir, env);
    cmd.stdin(std::process::Stdio::null());
    spawn_listening(cmd, 2, Duration::from_secs(60))
        .await
        .expect("member starts")
}

fn member_command(dir: &std::path::Path, env: &[(&str, String)]) -> tokio::process::Command {
    let path = dir.join("gateway.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    if !config.contains("drain_grace") {
        let config = config.replacen(
            "[node]\n",
            "[node]\ndrain_grace = \"3s\"\ndrain_timeout = \"2s\"\n",
            1,
        );
        std::fs::write(&path, config).unwrap();
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .unwrap();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.env("RUST_LOG", "warn,openraft=off")
        .env("ZONEGATE_CLUSTER_SECRET", CLUSTER_SECRET)
        .stderr(log)
        .arg("serve")
        .arg("--config")
        .arg(&path);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

async fn local_status(admin: &str) -> Value {
    get_json(
        &format!("{admin}/admin/v1/cluster?scope=local"),
        Some(ADMIN_TOKEN),
    )
    .await
}

/// The disk under a member's data_dir fills up (`fill`), then is freed
/// (`free`): the member's Raft stops for good on its first failed write;
/// it says so once, fails readiness at once, stops serving after the
/// grace and exits non-zero; restarted while the disk is full it refuses
/// to start with the reason; restarted with space freed it catches up.
/// Before, the member lived on as a zombie: ready, serving a view that no
/// longer followed the cluster, deaf to SIGTERM.
async fn a_full_disk_stops_the_member_which_then_rejoins(
    cluster: &mut TestCluster,
    victim: u64,
    dir: &std::path::Path,
    env: &[(&str, String)],
    fill: &dyn Fn(),
    free: &dyn Fn(),
) {
    let leader = cluster.leader().await;
    assert_ne!(leader, victim);
    let admin = cluster.node(leader).admin.clone();
    let mut proc = serve_member(dir, env).await;
    let (data, victim_admin) = (proc.urls[0].clone(), proc.urls[1].clone());
    let readyz = format!("{data}/readyz");
    eventually(
        Duration::from_secs(30),
        "the member to catch up and be ready",
        || {
            let (readyz, victim_admin) = (readyz.clone(), victim_admin.clone());
            async move {
                let ready = client()
                    .get(&readyz)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                ready && local_status(&victim_admin).await["decision_version"] == 1
            }
        },
    )
    .await;

    fill();
    // Decisions keep coming; the member's first append after the disk
    // filled fails.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut freeze = false;
    let refusal = loop {
        let _ = ctl(&admin, &[if freeze { "freeze" } else { "unfreeze" }]).await;
        freeze = !freeze;
        let resp = client().get(&readyz).send().await.unwrap();
        if resp.status() == 503 {
            break resp.text().await.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the member stayed ready with a full disk"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let failed_at = tokio::time::Instant::now();
    assert!(
        refusal.contains("control plane stopped for good (no_space)"),
        "{refusal}"
    );
    let metrics = client()
        .get(format!("{victim_admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric_sum(&metrics, "zonegate_cluster_fatal", &["reason=\"no_space\""]),
        1.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("zonegate_data_dir_free_bytes "),
        "{metrics}"
    );

    // The others decide on without it.
    let failover = ctl_json(&admin, &["failover", "--from", "az-a", "--to", "az-b"]).await;
    let version = failover["version"].as_u64().unwrap();

    // After the grace it serves no data-plane traffic, then exits non-zero.
    eventually(
        Duration::from_secs(30),
        "the member to stop serving",
        || {
            let data = data.clone();
            async move {
                client()
                    .post(format!("{data}/v1/chat/completions"))
                    .bearer_auth(API_KEY)
                    .json(&chat_body(4, false))
                    .send()
                    .await
                    .is_err()
            }
        },
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(60), proc.child.wait())
        .await
        .expect("the member exits after its drain")
        .unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}");
    // Grace 3 s + drain_timeout 2 s + the bound, with room for a busy host.
    assert!(
        failed_at.elapsed() < Duration::from_secs(40),
        "{:?}",
        failed_at.elapsed()
    );
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert_eq!(
        log.matches(
            "the control plane stopped for good: this node's view no longer follows the cluster"
        )
        .count(),
        1,
        "logged once: {log}"
    );

    // Restarted with the disk still full: it refuses, saying why.
    let mut again = member_command(dir, env);
    again
        .stdout(std::process::Stdio::null())
        .stdin(std::process::Stdio::null());
    let status = tokio::time::timeout(Duration::from_secs(60), again.status())
        .await
        .expect("a member on a full disk exits at once")
        .unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    let said = log.lines().last().unwrap_or_default();
    assert!(
        said.contains("cannot start the control plane") && said.contains("is full"),
        "{said}"
    );

    // Space freed: it starts, rejoins and catches up.
    free();
    let proc = serve_member(dir, env).await;
    let victim_admin = proc.urls[1].clone();
    eventually(
        Duration::from_secs(30),
        "the restarted member to catch up",
        || {
            let victim_admin = victim_admin.clone();
            async move { local_status(&victim_admin).await["decision_version"] == version }
        },
    )
    .await;
    let ready = client()
        .get(format!("{}/readyz", proc.urls[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

/// Item 2's always-run variant: the test-only store fault
/// (`ZONEGATE_DEBUG_STORE_FAULT=enospc:FILE`, honoured by debug builds)
/// fails every flush with ENOSPC while FILE exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_store_fails_with_enospc_drains_exits_non_zero_and_rejoins_once_freed() {
    let mut cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    assert_eq!(
        ctl_json(&cluster.node(leader).admin, &["freeze"]).await["version"],
        1
    );
    cluster.all_at(1).await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    let dir = cluster.nodes[victim as usize - 1]
        .take()
        .unwrap()
        .kill_keeping_data()
        .await;
    let flag = dir.path().join("disk-full");
    let env = [(
        "ZONEGATE_DEBUG_STORE_FAULT",
        format!("enospc:{}", flag.display()),
    )];
    a_full_disk_stops_the_member_which_then_rejoins(
        &mut cluster,
        victim,
        dir.path(),
        &env,
        &|| std::fs::write(&flag, "").unwrap(),
        &|| std::fs::remove_file(&flag).unwrap(),
    )
    .await;
}

/// Unmounts a test's tmpfs when dropped (lazily: a child may still hold
/// it for a moment).
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Item 2 on a real small filesystem: the member's data_dir on a 64 MiB
/// tmpfs, filled to the last byte. Needs `mount -t tmpfs` (root); skipped
/// with a note where the machine does not allow it (the store-fault
/// variant above always runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_a_full_tmpfs_drains_exits_non_zero_and_rejoins_once_freed() {
    let scratch = tempfile::tempdir().unwrap();
    let mnt = scratch.path().join("tmpfs");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: this machine does not allow `mount -t tmpfs` (needs root); the store-fault variant covers the behaviour");
        return;
    }
    let _unmount = Mounted(mnt.clone());
    let mut cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    assert_eq!(
        ctl_json(&cluster.node(leader).admin, &["freeze"]).await["version"],
        1
    );
    cluster.all_at(1).await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    let dir = cluster.nodes[victim as usize - 1]
        .take()
        .unwrap()
        .kill_keeping_data()
        .await;
    // Its store moves onto the small filesystem.
    let data = dir.path().join("data");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", data.display()))
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(copied.success());
    let path = dir.path().join("gateway.toml");
    let config = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&data.display().to_string(), &mnt.display().to_string());
    std::fs::write(&path, config).unwrap();
    let filler = mnt.join("filler");
    let fill = || {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 1 << 20];
        while f.write_all(&chunk).is_ok() {}
        // The last partial chunk.
        while f.write_all(&chunk[..4096]).is_ok() {}
        let _ = f.sync_all();
    };
    a_full_disk_stops_the_member_which_then_rejoins(
        &mut cluster,
        victim,
        dir.path(),
        &[],
        &fill,
        &|| std::fs::remove_file(&filler).unwrap(),
    )
    .await;
}
