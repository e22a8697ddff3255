//! Membership operations, black-box: three gateway processes (one voter
//! per zone) grow a fourth member as a learner, promote it, lose a voter
//! to `ctl members remove`, and re-address a member, while a trickle of
//! operator writes keeps committing. Refusals carry their rule's name.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// `ctl` refuses with exit 1 and names `rule`.
async fn ctl_refused(admin: &str, args: &[&str], rule: &str) {
    let (code, out, err) = ctl(admin, args).await;
    assert_eq!(code, 1, "ctl {args:?} should be refused: {out}{err}");
    assert!(
        err.contains(rule),
        "ctl {args:?}: expected rule {rule}: {err}"
    );
}

fn member(members: &Value, id: u64) -> Option<&Value> {
    members["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["id"] == id))
}

/// Polls `ctl members` until `check` holds for member `id`.
async fn member_becomes(admin: &str, id: u64, what: &str, check: impl Fn(&Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out, _) = ctl(admin, &["--json", "members"]).await;
        let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        if code == 0 && member(&v, id).is_some_and(&check) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "member {id} never became {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `admin`'s status until its `bootstrap_differs` mentions `text`
/// (a follower applies a change soon after the leader answered).
async fn poll_differs(admin: &str, text: &str) {
    let url = format!("{admin}/admin/v1/cluster");
    eventually(Duration::from_secs(20), text, || {
        let url = url.clone();
        async move {
            let status = get_json(&url, Some(ADMIN_TOKEN)).await;
            status["bootstrap_differs"].to_string().contains(text)
        }
    })
    .await;
}

/// Polls until every admin names the same leader; returns it.
async fn agreed_leader(admins: &[String]) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut leaders = Vec::new();
        for a in admins {
            let v = get_json(
                &format!("{a}/admin/v1/cluster?scope=local"),
                Some(ADMIN_TOKEN),
            )
            .await;
            leaders.push(v["leader"].as_u64());
        }
        if let Some(Some(l)) = leaders.first() {
            if leaders.iter().all(|x| *x == Some(*l)) {
                return *l;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no agreed leader: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Operator writes every 250 ms (freeze / unfreeze) through any node that
/// answers; counts commits and remembers the longest time without one.
struct Trickle {
    admins: Arc<Mutex<Vec<String>>>,
    commits: Arc<AtomicU64>,
    longest_gap_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Trickle {
    fn start(admins: Vec<String>) -> Trickle {
        let admins = Arc::new(Mutex::new(admins));
        let commits = Arc::new(AtomicU64::new(0));
        let longest_gap_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (admins, commits, gap, stop) = (
                admins.clone(),
                commits.clone(),
                longest_gap_ms.clone(),
                stop.clone(),
            );
            async move {
                let mut frozen = false;
                let mut last = tokio::time::Instant::now();
                let mut turn = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let list = admins.lock().unwrap().clone();
                    let admin = &list[turn % list.len()];
                    turn += 1;
                    let verb = if frozen { "unfreeze" } else { "freeze" };
                    let resp = client()
                        .post(format!("{admin}/admin/v1/{verb}"))
                        .bearer_auth(ADMIN_TOKEN)
                        .json(&json!({"reason": "trickle"}))
                        .timeout(Duration::from_secs(15))
                        .send()
                        .await;
                    if let Ok(r) = resp {
                        let status = r.status();
                        let v: Value = r.json().await.unwrap_or(Value::Null);
                        let code = v["error"]["code"].as_str().unwrap_or_default();
                        if status.is_success() {
                            commits.fetch_add(1, Ordering::SeqCst);
                            let since = last.elapsed().as_millis() as u64;
                            gap.fetch_max(since, Ordering::SeqCst);
                            last = tokio::time::Instant::now();
                            frozen = !frozen;
                        } else if code == "already_frozen" || code == "not_frozen" {
                            frozen = !frozen;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        });
        Trickle {
            admins,
            commits,
            longest_gap_ms,
            stop,
            task,
        }
    }

    fn set_admins(&self, admins: Vec<String>) {
        *self.admins.lock().unwrap() = admins;
    }

    /// Waits until at least one more write committed than `before`.
    async fn commits_after(&self, before: u64, phase: &str) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.commits.load(Ordering::SeqCst);
            if now > before {
                return now;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no write committed after {phase}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_promoted_removed_and_readdressed_while_decisions_commit() {
    let mut cluster = TestCluster::start(1, "").await;
    let leader = cluster.leader().await;
    let admin_of = |c: &TestCluster, id: u64| c.node(id).admin.clone();
    let trickle = Trickle::start((1..=3).map(|id| admin_of(&cluster, id)).collect());
    let mut commits = trickle.commits_after(0, "start").await;
    // Node 2 is never removed or moved; it forwards to the leader when it
    // does not lead.
    let ask = admin_of(&cluster, 2);
    let _ = leader;

    // The list: three voters, with match index and lag on the leader.
    // (A follower's match index is known once its first append answered.)
    for id in 1..=3 {
        member_becomes(&ask, id, "a voter with a match index", |m| {
            m["role"] == "voter" && m["lag"].is_u64()
        })
        .await;
    }
    let (code, table, _) = ctl(&ask, &["members"]).await;
    assert_eq!(code, 0);
    assert!(
        table.contains("MATCHED") && table.contains("LAG"),
        "{table}"
    );

    // Refused: a node id in use; the last voter of a zone; an unknown id.
    let spec4 = MemberSpec::new(4, "az-a").with_role("learner");
    let add = |s: &MemberSpec, role: &'static str| -> Vec<String> {
        [
            "members",
            "add",
            "--id",
            &s.id.to_string(),
            "--zone",
            &s.zone,
            "--raft",
            &s.raft,
            "--admin",
            &s.admin,
            "--role",
            role,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let reuse = MemberSpec::new(2, "az-b");
    ctl_refused(&ask, &args(&add(&reuse, "learner")), "node_id_reused").await;
    ctl_refused(
        &ask,
        &["members", "remove", "--id", "3"],
        "zone_needs_voter",
    )
    .await;
    ctl_refused(&ask, &["members", "promote", "--id", "9"], "unknown_member").await;

    // 1. A fourth node joins as a learner and catches up.
    let mut everyone = cluster.members.clone();
    everyone.push(spec4.clone());
    // The same backends as the others (their configs' `rest`).
    let mut names: Vec<&String> = cluster.mocks.keys().collect();
    names.sort();
    let rest: String = names
        .into_iter()
        .map(|n| cluster.mocks[n].backend_toml(&[MODEL]))
        .collect();
    let mut node4 = Some(NodeProcess::start_member(&spec4, &everyone, &rest).await);
    ctl_json_led(&ask, &args(&add(&spec4, "learner"))).await;
    member_becomes(&ask, 4, "a caught-up learner", |m| {
        m["role"] == "learner" && m["lag"].as_u64().is_some_and(|l| l <= 8)
    })
    .await;
    commits = trickle.commits_after(commits, "adding a learner").await;
    // The bootstrap list of nodes 1-3 does not hold node 4: status says so.
    poll_differs(&ask, "member 4 (az-a, learner)").await;

    // 2. Promoted to a voter.
    ctl_json_led(&ask, &["members", "promote", "--id", "4"]).await;
    member_becomes(&ask, 4, "a voter", |m| m["role"] == "voter").await;
    // Its record says voter too (a rejoin restores that role).
    poll_differs(&ask, "member 4 (az-a, voter)").await;
    commits = trickle.commits_after(commits, "promoting").await;

    // 3. A voter of az-a (which keeps one) is removed, then stopped.
    let leader = cluster.leader().await;
    let victim = if leader == 1 { 4 } else { 1 };
    let victim_arg = victim.to_string();
    ctl_json_led(&ask, &["members", "remove", "--id", &victim_arg]).await;
    let list = ctl_json(&ask, &["members"]).await;
    assert!(member(&list, victim).is_none(), "{list}");
    if victim == 4 {
        node4.take().unwrap().kill().await;
    } else {
        cluster.nodes[0].take().unwrap().kill().await;
    }
    let mut running: Vec<u64> = [1, 2, 3, 4]
        .into_iter()
        .filter(|id| *id != victim)
        .collect();
    let admin_of_any = |c: &TestCluster, n4: &Option<NodeProcess>, id: u64| {
        if id == 4 {
            n4.as_ref().unwrap().admin.clone()
        } else {
            admin_of(c, id)
        }
    };
    trickle.set_admins(
        running
            .iter()
            .map(|id| admin_of_any(&cluster, &node4, *id))
            .collect(),
    );
    commits = trickle.commits_after(commits, "removing a voter").await;
    // Its id is never reused.
    let again = MemberSpec::new(victim, "az-a");
    ctl_refused(&ask, &args(&add(&again, "learner")), "node_id_reused").await;

    // 4. A follower voter is re-addressed: stopped, re-addressed, started
    //    on its new addresses with its data.
    let admins: Vec<String> = running
        .iter()
        .map(|id| admin_of_any(&cluster, &node4, *id))
        .collect();
    let leader = agreed_leader(&admins).await;
    let moved = *running
        .iter()
        .find(|id| **id != leader && **id != 2)
        .unwrap();
    let asker = ask.clone();
    trickle.set_admins(
        running
            .iter()
            .filter(|id| **id != moved)
            .map(|id| admin_of_any(&cluster, &node4, *id))
            .collect(),
    );
    let old_spec = everyone.iter().find(|m| m.id == moved).unwrap().clone();
    let new_spec = MemberSpec {
        role: "voter",
        ..MemberSpec::new(moved, &old_spec.zone)
    };
    let dir = if moved == 4 {
        node4.take().unwrap().kill_keeping_data().await
    } else {
        cluster.nodes[moved as usize - 1]
            .take()
            .unwrap()
            .kill_keeping_data()
            .await
    };
    let moved_arg = moved.to_string();
    ctl_json_led(
        &asker,
        &[
            "members",
            "readdress",
            "--id",
            &moved_arg,
            "--raft",
            &new_spec.raft,
            "--admin",
            &new_spec.admin,
        ],
    )
    .await;
    commits = trickle.commits_after(commits, "re-addressing").await;
    let now_members: Vec<MemberSpec> = everyone
        .iter()
        .filter(|m| m.id != victim)
        .map(|m| {
            if m.id == moved {
                new_spec.clone()
            } else {
                m.clone()
            }
        })
        .collect();
    let restarted = NodeProcess::start_member_in(dir, &new_spec, &now_members, &rest).await;
    let restarted_admin = restarted.admin.clone();
    if moved == 4 {
        node4 = Some(restarted);
    } else {
        cluster.nodes[moved as usize - 1] = Some(restarted);
    }
    member_becomes(&asker, moved, "caught up at its new address", |m| {
        m["raft_addr"] == new_spec.raft.as_str() && m["lag"].as_u64().is_some_and(|l| l <= 8)
    })
    .await;
    running.sort_unstable();
    trickle.set_admins(
        running
            .iter()
            .map(|id| admin_of_any(&cluster, &node4, *id))
            .collect(),
    );
    commits = trickle
        .commits_after(commits, "restarting the re-addressed member")
        .await;

    // Stop the writes; every running member converges on the same version.
    trickle.stop.store(true, Ordering::SeqCst);
    trickle.task.await.unwrap();
    let gap = trickle.longest_gap_ms.load(Ordering::SeqCst);
    let admins: Vec<String> = running
        .iter()
        .map(|id| admin_of_any(&cluster, &node4, *id))
        .collect();
    let version = get_json(&format!("{asker}/admin/v1/cluster"), Some(ADMIN_TOKEN)).await
        ["decision_version"]
        .as_u64()
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "every member at one version",
        || {
            let admins = admins.clone();
            async move {
                for a in admins {
                    let v = get_json(
                        &format!("{a}/admin/v1/cluster?scope=local"),
                        Some(ADMIN_TOKEN),
                    )
                    .await;
                    if v["decision_version"].as_u64() < Some(version) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    let v = get_json(
        &format!("{restarted_admin}/admin/v1/cluster?scope=local"),
        Some(ADMIN_TOKEN),
    )
    .await;
    assert!(v["leader"].is_u64(), "{v}");
    eprintln!("membership test: {commits} commits, longest gap between commits {gap} ms");
    // Decisions kept committing: never a stretch without one longer than
    // a leader election and a membership commit on a busy host.
    assert!(gap < 15_000, "no commit for {gap} ms");
}
