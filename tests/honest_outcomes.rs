//! Honest outcomes (issue 10, item 7): a write whose commit could not be
//! confirmed answers 504 `outcome_unknown` with the version to check, on
//! any node, and `zonegate ctl` exits 3 for it (1 refused, 2 unreachable
//! before sending). The race of killing the leader right after a follower
//! forwarded a write to it never answers "failed" for a write that
//! committed.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A fake admin API on 127.0.0.1: reads one request, then answers with
/// `answer` (raw HTTP) or, when `None`, closes the connection unanswered.
async fn fake_admin(answer: Option<&'static str>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = conn.read(&mut buf).await;
            if let Some(a) = answer {
                let _ = conn.write_all(a.as_bytes()).await;
            }
            drop(conn);
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_exit_codes_say_whether_a_write_may_have_committed() {
    // Nothing listening: nothing was sent.
    let closed = zonegate::tools::spawn::concrete_addr("127.0.0.1:0").unwrap();
    let (code, _, err) = ctl(&format!("http://{closed}"), &["freeze"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nothing was sent"), "{err}");

    // The request went out and the connection closed unanswered.
    let admin = fake_admin(None).await;
    let (code, _, err) = ctl(&admin, &["freeze", "--reason", "x"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("outcome unknown"), "{err}");
    assert!(err.contains("ctl --admin"), "{err}");
    assert!(err.contains("decisions"), "{err}");

    // A node's own 504 outcome_unknown, with the version to check.
    let body = r#"{"error":{"message":"outcome unknown: the decision was submitted but no commit was confirmed in time","type":"server_error","param":null,"code":"outcome_unknown","check_version":7}}"#;
    let answer: &'static str = Box::leak(
        format!(
            "HTTP/1.1 504 Gateway Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_boxed_str(),
    );
    let admin = fake_admin(Some(answer)).await;
    let (code, _, err) = ctl(&admin, &["failover", "--from", "a", "--to", "b"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("version 7"), "{err}");
    assert!(err.contains("decisions"), "{err}");

    // A read that loses its answer changed nothing: 2, not 3.
    let admin = fake_admin(None).await;
    let (code, _, err) = ctl(&admin, &["decisions"]).await;
    assert_eq!(code, 2, "{err}");

    // Bad usage.
    let (code, _, _) = ctl(&admin, &["failover", "--from", "a"]).await;
    assert_eq!(code, 2);
}

/// Polls until every running node reports the same decision version three
/// times in a row, 200 ms apart; returns node 1's (or the first running
/// node's) local view.
async fn settled(cluster: &TestCluster) -> Value {
    let mut same = 0;
    let mut last = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut views = Vec::new();
        for n in cluster.running() {
            views.push(n.admin_get("/admin/v1/cluster?scope=local").await);
        }
        let versions: Vec<&Value> = views.iter().map(|v| &v["decision_version"]).collect();
        let agreed = versions.iter().all(|v| *v == versions[0])
            && views.iter().all(|v| v["leader"].is_u64())
            && views.iter().all(|v| v["leader"] == views[0]["leader"]);
        if agreed && last.as_ref() == Some(versions[0]) {
            same += 1;
        } else {
            same = 0;
        }
        last = Some(versions[0].clone());
        if same >= 2 {
            return views.swap_remove(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cluster did not settle: {versions:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_after_a_forwarded_write_never_answers_failed_for_a_committed_write() {
    const ROUNDS: u64 = 20;
    let mut cluster = TestCluster::start(1, "").await;
    let rest = cluster.rest.clone();
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    for round in 0..ROUNDS {
        let leader = cluster.leader().await;
        let view = settled(&cluster).await;
        let follower = (1..=3).find(|id| *id != leader).unwrap();
        let reason = format!("race-{round}");
        let (path, body) = if view["zones"]["az-a"]["status"] == "active" {
            (
                "failover",
                json!({"from": "az-a", "to": "az-b", "reason": reason}),
            )
        } else {
            ("failback", json!({"zone": "az-a", "reason": reason}))
        };
        let send = client()
            .post(format!("{}/admin/v1/{path}", cluster.node(follower).admin))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send();
        let answer = tokio::spawn(async move {
            let resp = send.await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        });
        // Kill -9 the leader right after the follower forwarded the write:
        // 0–12 ms later, so some rounds kill before the commit and some
        // after it.
        tokio::time::sleep(Duration::from_millis(round % 7 * 2)).await;
        let dir = cluster.nodes[leader as usize - 1]
            .take()
            .unwrap()
            .kill_keeping_data()
            .await;
        let (status, answer) = answer.await.unwrap();

        // Bring the old leader back and let a new leader commit (or drop)
        // whatever was in flight; then the history is the truth.
        let me = cluster.members[leader as usize - 1].clone();
        let node = NodeProcess::start_member_in(dir, &me, &cluster.members, &rest).await;
        cluster.nodes[leader as usize - 1] = Some(node);
        cluster.leader().await;
        settled(&cluster).await;
        let history = cluster
            .node(follower)
            .admin_get("/admin/v1/decisions")
            .await;
        let committed = history["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["reason"] == reason.as_str());

        let code = answer["error"]["code"].as_str().unwrap_or("-").to_owned();
        *tally
            .entry(format!("{status} {code} committed={committed}"))
            .or_default() += 1;
        match status {
            200 => assert!(
                committed,
                "round {round}: 200 for a write not in the history"
            ),
            504 => {
                assert_eq!(code, "outcome_unknown", "round {round}: {answer}");
                assert!(
                    answer["error"]["check_version"].is_u64(),
                    "round {round}: no version to check: {answer}"
                );
            }
            _ => assert!(
                !committed,
                "round {round}: answered {status} ({answer}) for a write that committed"
            ),
        }
    }
    eprintln!("outcomes over {ROUNDS} rounds: {tally:#?}");

    // And ctl exits 1 for a rule's refusal, 0 for a commit.
    let view = settled(&cluster).await;
    let admin = cluster.node(1).admin.clone();
    let active = view["zones"]["az-a"]["status"] == "active";
    let refused: &[&str] = if active {
        &["failback", "--zone", "az-a"]
    } else {
        &["failover", "--from", "az-a", "--to", "az-b"]
    };
    let (code, _, err) = ctl(&admin, refused).await;
    assert_eq!(code, 1, "{err}");
    let (code, out, err) = ctl(&admin, &["freeze"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("committed"), "{out}");
}
