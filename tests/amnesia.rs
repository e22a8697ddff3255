//! No amnesia (issue 10, item 3): a member whose data_dir was wiped
//! refuses to start instead of rejoining silently with an empty store;
//! `serve --rejoin` brings it back as a learner that catches up and is
//! then promoted; an acknowledged decision survives on every node.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

async fn local(node: &NodeProcess) -> Value {
    node.admin_get("/admin/v1/cluster?scope=local").await
}

/// Runs `zonegate serve` for member `me` in `dir` and expects it to exit
/// (it refuses to start); returns its stderr.
async fn refused_start(
    dir: &std::path::Path,
    me: &MemberSpec,
    members: &[MemberSpec],
    rest: &str,
) -> String {
    let path = write_member_config(dir, me, members, rest);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin())
            .env("ZONEGATE_CLUSTER_SECRET", CLUSTER_SECRET)
            .env("RUST_LOG", "warn,openraft=off")
            .args(["serve", "--config"])
            .arg(&path)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a member without its store exits instead of serving")
    .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_refuses_to_start_and_rejoins_with_rejoin_keeping_every_decision() {
    let mut cluster = TestCluster::start(1, "").await;
    let rest = cluster.rest.clone();
    let leader = cluster.leader().await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (paused, wiped) = (others[0], others[1]);
    cluster.all_at(0).await;
    // Let heartbeats tell every member who holds the cluster id.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let id = local(cluster.node(leader)).await["cluster_id"].clone();
    assert!(id.is_string(), "the cluster has an id: {id}");

    // Pause one follower; commit a failover on the leader (with the other).
    signal(cluster.node(paused).pid().unwrap(), "-STOP");
    // (Retried while an election is under way: nothing was written then.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let resp = client()
            .post(format!("{}/admin/v1/failover", cluster.node(leader).admin))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"from": "az-a", "to": "az-b", "reason": "acknowledged"}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        if status == 200 {
            break;
        }
        assert!(
            status == 503 && tokio::time::Instant::now() < deadline,
            "{status} {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // kill -9 all three; wipe one follower's data_dir.
    let mut dirs = std::collections::BTreeMap::new();
    for id in 1..=3u64 {
        let node = cluster.nodes[id as usize - 1].take().unwrap();
        dirs.insert(id, node.kill_keeping_data().await);
    }
    std::fs::remove_dir_all(dirs[&wiped].path().join("data")).unwrap();

    // The paused one comes back with its (older) store; the wiped one
    // refuses to start, naming the fix.
    let spec = |id: u64| cluster.members[id as usize - 1].clone();
    let p = NodeProcess::start_member_in(
        dirs.remove(&paused).unwrap(),
        &spec(paused),
        &cluster.members,
        &rest,
    )
    .await;
    cluster.nodes[paused as usize - 1] = Some(p);
    let err = refused_start(dirs[&wiped].path(), &spec(wiped), &cluster.members, &rest).await;
    assert!(err.contains("lost its Raft state"), "{err}");
    assert!(err.contains("--rejoin"), "{err}");
    assert!(!dirs[&wiped].path().join("data/CLUSTER_ID").exists());

    // Alone, the paused member cannot commit anything.
    let resp = client()
        .post(format!("{}/admin/v1/freeze", cluster.node(paused).admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"reason": "must not commit"}))
        .send()
        .await
        .unwrap();
    assert_ne!(resp.status(), 200, "{}", resp.text().await.unwrap());

    // The old leader returns: the two agree on a leader holding the failover.
    let l = NodeProcess::start_member_in(
        dirs.remove(&leader).unwrap(),
        &spec(leader),
        &cluster.members,
        &rest,
    )
    .await;
    cluster.nodes[leader as usize - 1] = Some(l);
    cluster.leader().await;
    cluster.all_at(1).await;

    // --rejoin: a learner first, then a voter again, holding everything.
    let w = NodeProcess::start_member_with(
        dirs.remove(&wiped).unwrap(),
        &spec(wiped),
        &cluster.members,
        &rest,
        &["--rejoin"],
    )
    .await;
    cluster.nodes[wiped as usize - 1] = Some(w);
    let was_learner = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    eventually(
        Duration::from_secs(60),
        "the rejoined member votes again",
        || {
            let admin = cluster.node(wiped).admin.clone();
            let seen = was_learner.clone();
            async move {
                let v = get_json(
                    &format!("{admin}/admin/v1/cluster?scope=local"),
                    Some(ADMIN_TOKEN),
                )
                .await;
                let voter = v["voters"]
                    .as_array()
                    .is_some_and(|vs| vs.iter().any(|x| *x == wiped));
                if v["rejoining"] == true
                    && !voter
                    && v["voters"].as_array().is_some_and(|vs| !vs.is_empty())
                {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                v["rejoining"] == false && voter
            }
        },
    )
    .await;
    assert!(
        was_learner.load(std::sync::atomic::Ordering::Relaxed),
        "the rejoining member was never seen as a learner"
    );
    cluster.all_at(1).await;
    for node in cluster.running() {
        let v = local(node).await;
        assert_eq!(v["cluster_id"], id, "{v}");
        assert_eq!(v["zones"]["az-a"]["status"], "failed_over", "{v}");
        let history = node.admin_get("/admin/v1/decisions").await;
        assert_eq!(
            history["decisions"][0]["reason"], "acknowledged",
            "{history}"
        );
    }
    // And the three decide together again.
    let resp = client()
        .post(format!("{}/admin/v1/freeze", cluster.node(wiped).admin))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"reason": "after the rejoin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    cluster.all_at(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_replaced_behind_its_marker_is_reported_as_corrupted_not_opened_empty() {
    let member = MemberSpec::new(1, "az-a");
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        "[[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"{MODEL}\"]\n"
    );
    let members = vec![member.clone()];
    let node = NodeProcess::start_member_in(dir, &member, &members, &rest).await;
    let id = node.admin.clone();
    eventually(Duration::from_secs(30), "a one-node cluster forms", || {
        let id = id.clone();
        async move {
            get_json(
                &format!("{id}/admin/v1/cluster?scope=local"),
                Some(ADMIN_TOKEN),
            )
            .await["cluster_id"]
                .is_string()
        }
    })
    .await;
    let dir = node.kill_keeping_data().await;
    std::fs::remove_dir_all(dir.path().join("data/raft.sled")).unwrap();
    let path = write_member_config(dir.path(), &member, &members, &rest);
    let out = tokio::process::Command::new(bin())
        .env("ZONEGATE_CLUSTER_SECRET", CLUSTER_SECRET)
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("raft.sled"), "{err}");
    assert!(err.contains("corrupted or was replaced"), "{err}");
    assert!(err.contains("CLUSTER_ID"), "{err}");
}
