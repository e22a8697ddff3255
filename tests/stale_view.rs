//! Stale-view visibility and RPC refusals (issue 10, items 8 and 5): a
//! node cut off from any leader with a quorum says so in its metrics, in
//! `ctl status`, and (with `ready_requires_leader`) in `/readyz`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_leader_is_marked_stale_and_refused_rpcs_are_counted() {
    let mut cluster = TestCluster::start(1, "[cluster]\nready_requires_leader = true\n").await;
    let leader = cluster.leader().await;
    cluster.all_at(0).await;
    let survivor = (1..=3).find(|id| *id != leader).unwrap();

    // Fresh: leader contact, a young view, ready.
    let node = cluster.node(survivor);
    let m = node.metrics().await;
    assert_eq!(
        metric_sum(&m, "zonegate_cluster_leader_contact", &[]),
        1.0,
        "{m}"
    );
    let age = metric_sum(&m, "zonegate_cluster_view_age_seconds", &[]);
    assert!((0.0..1.0).contains(&age), "view age {age}");
    let ready = client()
        .get(format!("{}/readyz", node.data))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    // An unsigned call (the old cleartext-secret header means nothing) is
    // refused and counted.
    let raft = &cluster.members[survivor as usize - 1].raft;
    assert_eq!(unsigned_raft_vote(raft, Some("wrong")).await, 401);
    let m = node.metrics().await;
    assert!(
        metric_sum(
            &m,
            "zonegate_raft_rpc_refused_total",
            &["reason=\"unsigned\""]
        ) >= 1.0,
        "{m}"
    );

    // Kill the two others: no leader with a quorum any more.
    for id in (1..=3).filter(|id| *id != survivor) {
        cluster.nodes[id as usize - 1].take().unwrap().kill().await;
    }
    let node = cluster.node(survivor);
    eventually(
        Duration::from_secs(30),
        "the survivor's view turns stale",
        || async {
            let m = node.metrics().await;
            metric_sum(&m, "zonegate_cluster_leader_contact", &[]) == 0.0
                && metric_sum(&m, "zonegate_cluster_view_age_seconds", &[]) > 1.8
        },
    )
    .await;
    let ready = client()
        .get(format!("{}/readyz", node.data))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["error"]["code"], "stale_view", "{body}");
    let (_, text, _) = ctl(&node.admin, &["status"]).await;
    assert!(text.contains("STALE"), "{text}");
    // It still serves with its last view (fail static).
    let resp = node.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}
