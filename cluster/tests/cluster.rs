//! In-process clusters on real loopback sockets with a network you can cut:
//! election, ordered replication, minority partitions, leader loss,
//! restarts from `data_dir`, learners and witnesses, RPC authentication.
//!
//! Every wait polls for a condition with a generous deadline; nothing
//! asserts on a fixed sleep, so a busy 2-core machine only makes it slower.

// clippy's allow-unwrap-in-tests covers `#[test]` functions, not the
// helpers of an integration test file; here a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zonegate_cluster::network::{NODE_HEADER, PATH_REPORT, PATH_VOTE, SIGNATURE_HEADER};
use zonegate_cluster::{
    codec, ClusterConfig, ClusterNode, Command, Decision, Evidence, FailoverConfig, FaultTable,
    Member, NodeId, Origin, ProposeError, RaftListen, RejectRule, Role, Timing, ZoneId,
    ZoneObservation, ZoneStatus,
};
use zonegate_net::listen::Limits;
use zonegate_net::sign::{self, Call, KeyRing, Purpose};

const DEADLINE: Duration = Duration::from_secs(20);
const SECRET: &str = "test-cluster-secret";

fn z(name: &str) -> ZoneId {
    ZoneId::new(name)
}

fn freeze() -> Command {
    Command::decide(Decision::Freeze, "test", "freeze")
}

fn unfreeze() -> Command {
    Command::decide(Decision::Unfreeze, "test", "unfreeze")
}

fn failover(from: &str, to: &str) -> Command {
    Command::decide(
        Decision::Failover {
            from: z(from),
            to: z(to),
        },
        "test",
        format!("{from} -> {to}"),
    )
}

fn failback(zone: &str) -> Command {
    Command::decide(Decision::Failback { zone: z(zone) }, "test", "recovered")
}

/// Poll `check` every 20 ms until it yields a value, or panic after the
/// deadline naming what was awaited.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct TestCluster {
    timing: Timing,
    members: Vec<Member>,
    nodes: BTreeMap<NodeId, Option<ClusterNode>>,
    dirs: BTreeMap<NodeId, tempfile::TempDir>,
    faults: Arc<FaultTable>,
}

impl TestCluster {
    /// Start one node per `(zone, role)`, ids from 1, on 127.0.0.1:0.
    async fn start(layout: &[(&str, Role)]) -> Self {
        Self::start_with(
            layout,
            Timing {
                propose_timeout: Duration::from_secs(3),
                ..Timing::default()
            },
        )
        .await
    }

    async fn start_with(layout: &[(&str, Role)], timing: Timing) -> Self {
        Self::start_with_faults(layout, timing, Arc::new(FaultTable::new())).await
    }

    /// Like `start_with`, with links cut before any node starts.
    async fn start_with_faults(
        layout: &[(&str, Role)],
        timing: Timing,
        faults: Arc<FaultTable>,
    ) -> Self {
        let mut listeners = BTreeMap::new();
        let mut members = Vec::new();
        for (i, (zone, role)) in layout.iter().enumerate() {
            let id = i as NodeId + 1;
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            members.push(Member {
                id,
                zone: z(zone),
                raft_addr: listener.local_addr().unwrap().to_string(),
                admin_addr: format!("127.0.0.1:{}", 19000 + id),
                role: *role,
            });
            listeners.insert(id, listener);
        }
        let mut cluster = TestCluster {
            timing,
            members,
            nodes: BTreeMap::new(),
            dirs: BTreeMap::new(),
            faults,
        };
        for (id, listener) in listeners {
            cluster.dirs.insert(id, tempfile::tempdir().unwrap());
            let node = cluster.start_node(id, RaftListen::Listener(listener)).await;
            cluster.nodes.insert(id, Some(node));
        }
        cluster
    }

    async fn start_node(&self, id: NodeId, listen: RaftListen) -> ClusterNode {
        let me = self.members.iter().find(|m| m.id == id).unwrap();
        ClusterNode::start(ClusterConfig {
            node_id: id,
            zone: me.zone.clone(),
            members: self.members.clone(),
            data_dir: self.dirs[&id].path().to_path_buf(),
            secret: SECRET.to_string(),
            raft_listen: listen,
            timing: self.timing.clone(),
            faults: Some(self.faults.clone()),
            rejoin: false,
            tls: None,
            limits: Limits::with_max(256),
        })
        .await
        .unwrap()
    }

    fn ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }

    fn node(&self, id: NodeId) -> &ClusterNode {
        self.nodes[&id].as_ref().expect("node is running")
    }

    fn running(&self) -> Vec<&ClusterNode> {
        self.nodes.values().flatten().collect()
    }

    /// The leader every node in `among` agrees on, itself leading.
    fn agreed_leader(&self, among: &[NodeId]) -> Option<NodeId> {
        let leader = self.node(among[0]).status().leader?;
        let agreed = among
            .iter()
            .all(|id| self.node(*id).status().leader == Some(leader));
        (agreed && among.contains(&leader) && self.node(leader).status().is_leader)
            .then_some(leader)
    }

    async fn wait_leader(&self, among: &[NodeId]) -> NodeId {
        eventually("a leader all nodes agree on", || self.agreed_leader(among)).await
    }

    async fn wait_version(&self, ids: &[NodeId], version: u64) {
        for id in ids {
            let node = self.node(*id);
            eventually(&format!("node {id} to apply version {version}"), || {
                (node.view().borrow().decision_version >= version).then_some(())
            })
            .await;
        }
    }

    /// Propose on whoever leads, retrying while there is no leader (an
    /// election under load); returns the first real answer.
    async fn propose(&self, cmd: Command) -> Result<u64, ProposeError> {
        let running: Vec<NodeId> = self.running().iter().map(|n| n.id()).collect();
        self.propose_on(&running, cmd).await
    }

    /// [`Self::propose`] on whichever of `among` leads (e.g. the majority
    /// side of a partition, whose old leader still believes it leads).
    async fn propose_on(&self, among: &[NodeId], cmd: Command) -> Result<u64, ProposeError> {
        let start = Instant::now();
        loop {
            let leader = among
                .iter()
                .map(|id| self.node(*id))
                .find(|n| n.status().is_leader);
            if let Some(leader) = leader {
                match leader.propose(cmd.clone()).await {
                    Err(ProposeError::NotLeader { .. } | ProposeError::NoLeader) => {}
                    answer => return answer.map(|a| a.version),
                }
            }
            assert!(start.elapsed() < DEADLINE, "no leader accepted {cmd:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`Self::propose`] that must apply.
    async fn must_propose(&self, cmd: Command) -> u64 {
        match self.propose(cmd.clone()).await {
            Ok(version) => version,
            Err(e) => panic!("proposing {cmd:?}: {e}"),
        }
    }

    /// [`Self::propose`] that must be refused by `rule`.
    async fn must_refuse(&self, cmd: Command, rule: RejectRule) {
        match self.propose(cmd.clone()).await {
            Err(e) => assert_eq!(e.rule(), Some(rule), "{cmd:?}: {e}"),
            Ok(v) => panic!("{cmd:?} applied as version {v}, expected {rule}"),
        }
    }

    async fn stop(&mut self, id: NodeId) -> SocketAddr {
        let node = self.nodes.get_mut(&id).unwrap().take().unwrap();
        let addr = node.raft_addr();
        node.shutdown().await.unwrap();
        addr
    }

    async fn restart(&mut self, id: NodeId, addr: SocketAddr) {
        let node = self.start_node(id, RaftListen::Addr(addr)).await;
        self.nodes.insert(id, Some(node));
    }

    async fn shutdown(mut self) {
        for id in self.ids() {
            if let Some(node) = self.nodes.get_mut(&id).unwrap().take() {
                node.shutdown().await.unwrap();
            }
        }
    }
}

fn three_zones() -> [(&'static str, Role); 3] {
    [
        ("az-a", Role::Voter),
        ("az-b", Role::Voter),
        ("az-c", Role::Voter),
    ]
}

/// A call as member `sender` would send it: signed with `secret`'s Raft
/// key, or unsigned without a secret.
fn signed(
    req: reqwest::RequestBuilder,
    secret: Option<&str>,
    sender: &str,
    path: &str,
    body: Vec<u8>,
) -> reqwest::RequestBuilder {
    let mut req = req.header(NODE_HEADER, sender);
    if let Some(s) = secret {
        let ring = KeyRing::derive(s, Purpose::Raft).unwrap();
        let call = Call {
            method: "POST",
            path,
            node: sender.parse().unwrap_or(0),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        req = req.header(
            SIGNATURE_HEADER,
            sign::sign_call(&ring, call, &body, now).header(),
        );
    }
    req.body(body)
}

async fn with_timeout<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .expect("test finished within two minutes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_one_leader_and_replicate_decisions_in_order() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let leaders = ids
            .iter()
            .filter(|id| cluster.node(**id).status().is_leader)
            .count();
        assert_eq!(leaders, 1, "exactly one leader");

        // A follower refuses and names the leader to forward to.
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        match cluster.node(follower).propose(freeze()).await {
            Err(ProposeError::NotLeader {
                leader: l,
                admin_addr,
            }) => {
                assert_eq!(l, leader);
                assert_eq!(admin_addr, Some(format!("127.0.0.1:{}", 19000 + leader)));
            }
            other => panic!("expected NotLeader, got {other:?}"),
        }

        let cmds = [
            failover("az-a", "az-b"),
            freeze(),
            failover("az-b", "az-c"),
            unfreeze(),
            failback("az-a"),
        ];
        let mut commit_ms = Vec::new();
        for (i, cmd) in cmds.iter().enumerate() {
            let started = Instant::now();
            let version = cluster.must_propose(cmd.clone()).await;
            commit_ms.push(started.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(version, i as u64 + 1, "versions are consecutive");
        }
        eprintln!("commit latency on 3 nodes (ms): {commit_ms:.1?}");

        // A refusal comes back with its rule and changes nothing.
        cluster
            .must_refuse(failover("az-a", "az-a"), RejectRule::SameZone)
            .await;
        cluster
            .must_refuse(
                failover("az-c", "az-b").if_version(2),
                RejectRule::StaleVersion,
            )
            .await;

        cluster.wait_version(&ids, 5).await;
        // A dry run on any node previews without writing anything.
        let preview = cluster
            .node(follower)
            .dry_run(&failover("az-c", "az-a"))
            .unwrap();
        assert_eq!(preview.version, 6);
        let moved: Vec<&str> = preview.changes.iter().map(|c| c.zone.as_str()).collect();
        assert_eq!(
            moved,
            ["az-b", "az-c"],
            "az-b pointed at az-c and follows it"
        );
        assert_eq!(
            cluster
                .node(follower)
                .dry_run(&failback("az-c"))
                .unwrap_err()
                .rule,
            RejectRule::NotFailedOver
        );
        let reference = cluster.node(leader).decisions(100);
        let versions: Vec<u64> = reference.iter().map(|d| d.version).collect();
        assert_eq!(versions, [5, 4, 3, 2, 1]);
        assert!(reference.iter().all(|d| d.at_ms > 0), "leader stamped time");
        for id in &ids {
            let node = cluster.node(*id);
            assert_eq!(node.decisions(100), reference, "node {id} history");
            let view = node.view().borrow().clone();
            assert_eq!(view.decision_version, 5);
            assert_eq!(view.zones[&z("az-a")], ZoneStatus::Active);
            assert_eq!(
                view.zones[&z("az-b")],
                ZoneStatus::FailedOver { target: z("az-c") }
            );
        }
        cluster.shutdown().await;
    })
    .await;
}

/// Regression (control_plane's flaky dry run, `unknown_zone … known zones: `):
/// a dry run checked against the receiving node's own applied state saw no
/// zones on a node that had not applied the formation entry yet. It is now
/// answered on the leader after a linearizable read; elsewhere it says
/// where the leader is (or that none is known), never a rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_is_never_answered_from_a_state_that_has_not_applied_formation() {
    with_timeout(async {
        let mut layout = three_zones().to_vec();
        layout.push(("az-a", Role::Learner));
        // Node 4 (a learner) hears nothing from anyone: it never applies
        // the formation entry, so its own state knows no zones.
        let faults = Arc::new(FaultTable::new());
        for from in 1..=3 {
            faults.block(from, 4);
        }
        let timing = Timing {
            propose_timeout: Duration::from_secs(3),
            ..Timing::default()
        };
        let cluster = TestCluster::start_with_faults(&layout, timing, faults).await;
        let voters = [1, 2, 3];
        let leader = cluster.wait_leader(&voters).await;
        let cmd = failover("az-a", "az-b");
        assert!(cluster.node(4).state_snapshot().zones().is_empty());
        // The old answer: a refusal by a rule that does not hold.
        assert_eq!(
            cluster.node(4).dry_run(&cmd).map_err(|r| r.rule),
            Err(RejectRule::UnknownZone)
        );
        match cluster.node(4).preview(&cmd).await {
            Err(ProposeError::NoLeader | ProposeError::NotLeader { .. }) => {}
            other => panic!("a node without the formation entry answered {other:?}"),
        }
        // Every voter answers with the leader's state (or points to it).
        for id in voters {
            match cluster.node(id).preview(&cmd).await {
                Ok(p) => {
                    assert_eq!(id, leader);
                    assert_eq!(p.version, 1);
                }
                Err(ProposeError::NotLeader { leader: l, .. }) => assert_eq!(l, leader),
                other => panic!("node {id} answered {other:?}"),
            }
        }
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_partition_cannot_commit_keeps_its_view_and_catches_up_when_healed() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        cluster.wait_leader(&ids).await;
        assert_eq!(cluster.must_propose(freeze()).await, 1);
        cluster.wait_version(&ids, 1).await;

        // Cut the leader off: it still believes it leads (0.9 has no
        // check-quorum) but can never commit.
        let old = cluster.agreed_leader(&ids).unwrap();
        cluster.faults.isolate(old, &ids);
        let majority: Vec<NodeId> = ids.iter().copied().filter(|id| *id != old).collect();
        let minority_try = cluster
            .node(old)
            .propose(failover("az-a", "az-b").with_evidence("from the minority"))
            .await;
        assert!(
            matches!(
                minority_try,
                Err(ProposeError::NoLeader | ProposeError::OutcomeUnknown(_))
            ),
            "an isolated leader cannot commit: {minority_try:?}"
        );

        let new = cluster.wait_leader(&majority).await;
        assert_ne!(new, old);
        let version = cluster
            .propose_on(&majority, failover("az-b", "az-c"))
            .await
            .unwrap();
        assert_eq!(version, 2);
        cluster.wait_version(&majority, 2).await;

        // The minority keeps executing the last decision it applied.
        let stale = cluster.node(old).view().borrow().clone();
        assert_eq!(stale.decision_version, 1);
        assert_eq!(stale.zones[&z("az-b")], ZoneStatus::Active);
        // A follower cut off alone cannot commit either.
        let follower = *majority.iter().find(|id| **id != new).unwrap();
        cluster.faults.heal();
        cluster.faults.isolate(follower, &ids);
        assert!(cluster.node(follower).propose(unfreeze()).await.is_err());
        cluster.faults.heal();

        // Healed: the old leader steps down, drops its uncommitted entry and
        // catches up.
        cluster.wait_leader(&ids).await;
        cluster.wait_version(&ids, 2).await;
        let reference = cluster.node(new).decisions(100);
        assert!(reference
            .iter()
            .all(|d| d.evidence.as_deref() != Some("from the minority")));
        for id in &ids {
            assert_eq!(cluster.node(*id).decisions(100), reference, "node {id}");
        }
        cluster.shutdown().await;
    })
    .await;
}

/// A follower that heard nothing for several election timeouts (cut off
/// here; paused by SIGSTOP in the `follower-pause` drill) used to
/// campaign on its own (openraft 0.9 has no pre-vote): its term climbed
/// while it was away, and once back its higher term unseated the healthy
/// leader (a drill saw term 10 → 12). With the pre-vote round it never
/// campaigns while the others hear from the leader: no node's term moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_and_back_does_not_raise_the_term_or_unseat_the_leader() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        assert_eq!(cluster.must_propose(freeze()).await, 1);
        let term = cluster.node(leader).status().term;
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        cluster.faults.isolate(follower, &ids);
        // Twice the latest a follower would have campaigned (the lease,
        // 600 ms, plus a random timeout of at most 600 ms); longer only
        // loads the machine the other tests share.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            cluster.node(follower).status().term,
            term,
            "the cut-off follower campaigned"
        );
        cluster.faults.heal();
        // Back: it hears the leader again.
        eventually("the follower to hear from the leader", || {
            cluster
                .node(follower)
                .leader_contact()
                .then_some(())
                .filter(|()| cluster.node(follower).status().leader == Some(leader))
        })
        .await;
        tokio::time::sleep(cluster.node(follower).stale_after()).await;
        for id in &ids {
            let s = cluster.node(*id).status();
            assert_eq!(s.term, term, "node {id}'s term moved");
            assert_eq!(s.leader, Some(leader), "node {id}");
        }
        assert_eq!(cluster.must_propose(unfreeze()).await, 2);
        cluster.wait_version(&ids, 2).await;
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_loss_elects_a_new_leader_without_losing_decisions_and_restart_resumes() {
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let old = cluster.wait_leader(&ids).await;
        for cmd in [failover("az-a", "az-b"), freeze(), failback("az-a")] {
            cluster.must_propose(cmd).await;
        }

        let addr = cluster.stop(old).await;
        let stopped_at = Instant::now();
        let rest: Vec<NodeId> = ids.iter().copied().filter(|id| *id != old).collect();
        let new = cluster.wait_leader(&rest).await;
        eprintln!(
            "new leader {new} elected {} ms after leader {old} stopped",
            stopped_at.elapsed().as_millis()
        );
        assert_ne!(new, old);
        // The new leader may learn the last commit index only after it wins;
        // every committed decision is applied there all the same.
        cluster.wait_version(&rest, 3).await;
        assert_eq!(
            cluster.node(new).decisions(10).len(),
            3,
            "no committed decision lost"
        );
        assert_eq!(cluster.must_propose(unfreeze()).await, 4);
        cluster.wait_version(&rest, 4).await;

        // The old leader restarts from its data_dir: its applied state is
        // there at once, and it catches up on what it missed.
        cluster.restart(old, addr).await;
        assert!(cluster.node(old).view().borrow().decision_version >= 3);
        cluster.wait_version(&ids, 4).await;
        let reference = cluster.node(new).decisions(100);
        assert_eq!(cluster.node(old).decisions(100), reference);
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_from_data_dir_resumes_without_reinitialising() {
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        cluster.wait_leader(&ids).await;
        cluster.must_propose(failover("az-c", "az-a")).await;
        cluster.must_propose(freeze()).await;
        cluster.wait_version(&ids, 2).await;
        let term_before = cluster.node(ids[0]).status().term;
        let history = cluster.node(ids[0]).decisions(100);

        let mut addrs = BTreeMap::new();
        for id in &ids {
            addrs.insert(*id, cluster.stop(*id).await);
        }
        for id in &ids {
            cluster.restart(*id, addrs[id]).await;
            assert_eq!(cluster.node(*id).view().borrow().decision_version, 2);
        }
        cluster.wait_leader(&ids).await;
        for id in &ids {
            let status = cluster.node(*id).status();
            assert!(status.term >= term_before, "terms never go back");
            assert_eq!(cluster.node(*id).decisions(100), history);
        }
        assert_eq!(cluster.must_propose(unfreeze()).await, 3);
        cluster.wait_version(&ids, 3).await;
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learners_receive_decisions_and_a_witness_zone_serves_nothing() {
    with_timeout(async {
        let cluster = TestCluster::start(&[
            ("az-a", Role::Voter),
            ("az-b", Role::Voter),
            ("az-w", Role::Witness),
            ("az-a", Role::Learner),
        ])
        .await;
        let voters = [1, 2, 3];
        cluster.wait_leader(&voters).await;
        let learner = cluster.node(4);
        eventually("the learner to join the membership", || {
            let s = cluster.node(cluster.agreed_leader(&voters)?).status();
            s.members.iter().all(|m| m.in_membership).then_some(())
        })
        .await;

        assert_eq!(cluster.must_propose(failover("az-a", "az-b")).await, 1);
        cluster.wait_version(&[1, 2, 3, 4], 1).await;
        let view = learner.view().borrow().clone();
        assert_eq!(
            view.zones.keys().cloned().collect::<Vec<_>>(),
            vec![z("az-a"), z("az-b")],
            "the witness's zone is not a serving zone"
        );
        cluster
            .must_refuse(failover("az-b", "az-w"), RejectRule::UnknownZone)
            .await;
        cluster
            .must_refuse(failover("az-b", "az-a"), RejectRule::LastServingZone)
            .await;
        assert!(!learner.status().is_leader);
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpc_without_the_secret_or_with_a_forged_sender_is_refused_and_changes_nothing() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let target = *ids.iter().find(|id| **id != leader).unwrap();
        let before = cluster.node(target).status();
        let url = format!("http://{}{PATH_VOTE}", cluster.node(target).raft_addr());

        // A vote for a far higher term would depose the leader if accepted.
        let forged = |candidate: NodeId| {
            codec::encode(&openraft::raft::VoteRequest::<NodeId> {
                vote: openraft::Vote::new(before.term + 100, candidate),
                last_log_id: None,
            })
            .unwrap()
        };
        let client = reqwest::Client::new();
        let send = |secret: Option<&str>, sender: &str, body: Vec<u8>| {
            signed(client.post(&url), secret, sender, PATH_VOTE, body).send()
        };
        // (name, secret, sender header, body, expected HTTP status)
        type Case<'a> = (&'a str, Option<&'a str>, String, Vec<u8>, u16);
        let cases: Vec<Case> = vec![
            ("no secret", None, leader.to_string(), forged(leader), 401),
            (
                "wrong secret",
                Some("a-guessed-secret-value"),
                leader.to_string(),
                forged(leader),
                401,
            ),
            ("unknown sender", Some(SECRET), "99".into(), forged(99), 403),
            (
                "sender speaking for another",
                Some(SECRET),
                target.to_string(),
                forged(leader),
                403,
            ),
            (
                "garbage body",
                Some(SECRET),
                leader.to_string(),
                vec![1, 2, 3],
                400,
            ),
        ];
        for (name, secret, sender, body, status) in cases {
            let resp = send(secret, &sender, body).await.unwrap();
            assert_eq!(resp.status().as_u16(), status, "{name}");
        }

        let after = cluster.node(target).status();
        assert_eq!(after.term, before.term, "term unchanged");
        assert_eq!(
            cluster.agreed_leader(&ids),
            Some(leader),
            "leader unchanged"
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_compacted_log_catches_up_from_a_snapshot() {
    with_timeout(async {
        let timing = Timing {
            snapshot_every_logs: 10,
            ..Timing::default()
        };
        let mut cluster = TestCluster::start_with(&three_zones(), timing).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let behind = *ids.iter().find(|id| **id != leader).unwrap();
        let behind_last = cluster.node(behind).status().last_log_index.unwrap_or(0);
        let addr = cluster.stop(behind).await;
        for i in 0..40 {
            let cmd = if i % 2 == 0 { freeze() } else { unfreeze() };
            cluster.must_propose(cmd).await;
        }
        let running: Vec<NodeId> = ids.iter().copied().filter(|id| *id != behind).collect();
        let leader = cluster.wait_leader(&running).await;
        // Once the leader has purged past the stopped node's last entry, the
        // only way to catch up is the snapshot RPC.
        eventually("the leader to compact its log", || {
            let m = cluster.node(leader).raft_metrics().borrow().clone();
            m.purged.filter(|p| p.index > behind_last).map(|_| ())
        })
        .await;

        cluster.restart(behind, addr).await;
        cluster.wait_version(&ids, 40).await;
        let installed = cluster.node(behind).raft_metrics().borrow().snapshot;
        assert!(installed.is_some_and(|s| s.index > behind_last));
        assert_eq!(
            cluster.node(behind).decisions(100),
            cluster.node(leader).decisions(100)
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_decisions_apply_on_every_node_in_order() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let mut views: Vec<_> = ids.iter().map(|id| cluster.node(*id).view()).collect();
        let mut commit = Vec::new();
        let mut everywhere = Vec::new();
        for i in 0..100u64 {
            let cmd = if i % 2 == 0 { freeze() } else { unfreeze() };
            let started = Instant::now();
            let version = cluster.must_propose(cmd).await;
            commit.push(started.elapsed());
            assert_eq!(version, i + 1);
            // Measured from propose's return, as an operator's `ctl` sees it.
            let committed = Instant::now();
            for view in &mut views {
                view.wait_for(|v| v.decision_version >= version)
                    .await
                    .unwrap();
            }
            everywhere.push(committed.elapsed());
        }
        let pct = |v: &mut Vec<Duration>, p: usize| {
            v.sort();
            v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1000.0
        };
        eprintln!(
            "100 decisions on 3 nodes: commit p50 {:.1} ms p99 {:.1} ms; applied on every node after commit p50 {:.1} ms p99 {:.1} ms",
            pct(&mut commit, 50),
            pct(&mut commit, 99),
            pct(&mut everywhere, 50),
            pct(&mut everywhere, 99)
        );
        let history = cluster.node(leader).decisions(1000);
        assert_eq!(history.len(), 100);
        for id in &ids {
            let theirs = cluster.node(*id).decisions(1000);
            assert!(
                theirs == history,
                "node {id} history differs: {} entries, newest version {:?}",
                theirs.len(),
                theirs.first().map(|d| d.version)
            );
        }
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn invalid_configs_fail_at_start_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let member = |id: NodeId, role: Role| Member {
        id,
        zone: z("az-a"),
        raft_addr: "127.0.0.1:1".into(),
        admin_addr: "127.0.0.1:2".into(),
        role,
    };
    let config = |node_id: NodeId, members: Vec<Member>, secret: &str| ClusterConfig {
        node_id,
        zone: z("az-a"),
        members,
        data_dir: dir.path().to_path_buf(),
        secret: secret.into(),
        raft_listen: RaftListen::Addr("127.0.0.1:0".parse().unwrap()),
        timing: Timing::default(),
        faults: None,
        rejoin: false,
        tls: None,
        limits: Limits::with_max(256),
    };
    let cases = [
        (
            "not a member",
            config(9, vec![member(1, Role::Voter)], "s"),
            "not among",
        ),
        (
            "empty secret",
            config(1, vec![member(1, Role::Voter)], ""),
            "secret",
        ),
        (
            "duplicate id",
            config(
                1,
                vec![member(1, Role::Voter), member(1, Role::Learner)],
                "s",
            ),
            "twice",
        ),
        (
            "no voter",
            config(1, vec![member(1, Role::Learner)], "s"),
            "no voter",
        ),
    ];
    for (name, cfg, needle) in cases {
        match ClusterNode::start(cfg).await {
            Err(e) => assert!(e.to_string().contains(needle), "{name}: {e}"),
            Ok(_) => panic!("{name}: started"),
        }
    }
}

/// Short periods so a test sees several per second.
const PERIOD: Duration = Duration::from_millis(200);

fn fast_failover() -> FailoverConfig {
    FailoverConfig {
        period: PERIOD,
        ..FailoverConfig::default()
    }
}

/// Every node reports only its own zone: healthy, or all errors and
/// timeouts with dead GPUs while its zone is in `bad`.
fn report_own_zone(node: &ClusterNode, bad: Arc<std::sync::Mutex<Option<ZoneId>>>) {
    let zone = node.zone().clone();
    node.set_observation_source(Arc::new(move || {
        let failing = bad.lock().unwrap().as_ref() == Some(&zone);
        let (rate, gpu) = if failing { (1.0, 0.0) } else { (0.0, 1.0) };
        vec![ZoneObservation {
            zone: zone.clone(),
            gw_error_rate: rate,
            timeout_rate: rate,
            gpu_health: gpu,
            requests: 50,
        }]
    }));
}

/// The newest automatic failover in `node`'s history, with its evidence.
fn auto_failover_of(node: &ClusterNode) -> Option<(zonegate_cluster::DecisionRecord, Evidence)> {
    let record = node.decisions(100).into_iter().find(|d| {
        d.origin == Origin::Automatic && matches!(d.decision, Decision::Failover { .. })
    })?;
    let evidence = serde_json::from_str(record.evidence.as_deref()?).ok()?;
    Some((record, evidence))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_reported_bad_is_failed_over_automatically_with_evidence() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let bad = Arc::new(std::sync::Mutex::new(None));
        for node in cluster.running() {
            node.set_failover_config(fast_failover()).unwrap();
            report_own_zone(node, bad.clone());
        }
        let leader = cluster.wait_leader(&ids).await;
        // Healthy zones: the leader scores every zone and decides nothing.
        eventually("the leader to score all three zones", || {
            let h = cluster.node(leader).zone_health();
            (h.len() == 3 && h.iter().all(|z| z.score == Some(1.0))).then_some(())
        })
        .await;
        tokio::time::sleep(PERIOD * 5).await;
        assert_eq!(cluster.node(leader).status().decision_version, 0);

        *bad.lock().unwrap() = Some(z("az-a"));
        let onset = Instant::now();
        let leader_node = cluster.node(leader);
        let (record, evidence) =
            eventually("an automatic failover of az-a", || auto_failover_of(leader_node)).await;
        let detected = onset.elapsed();
        // The record is applied before the leader's loop hears its commit
        // answer and counts it: wait for the count, not for luck.
        let status = eventually("the leader to count its applied decision", || {
            let s = leader_node.failover_status();
            (s.auto_applied == 1).then_some(s)
        })
        .await;
        eprintln!(
            "fault onset to committed automatic failover: {:.0} ms (budget {:.0} ms); detector's own measure (first bad period to commit): {:?}",
            detected.as_secs_f64() * 1000.0,
            (PERIOD * 3 + Duration::from_secs(2)).as_secs_f64() * 1000.0,
            status.last_detect_latency
        );
        assert!(
            detected <= PERIOD * 3 + Duration::from_secs(2),
            "detected after {detected:?}"
        );
        assert_eq!(
            record.decision,
            Decision::Failover {
                from: z("az-a"),
                to: z("az-b")
            },
            "equal healthy targets: the first by name"
        );
        assert_eq!(record.actor, format!("detector:{leader}"));
        assert_eq!(evidence.zone, z("az-a"));
        assert!(evidence.periods.len() >= 3, "{evidence:?}");
        assert!(evidence
            .periods
            .iter()
            .all(|p| p.score.is_some_and(|s| s < 0.4)));
        assert_eq!(status.auto_applied, 1);
        assert!(status.last_detect_latency.is_some());

        // Every node applies it; followers learn the scores from the
        // leader's answers to their reports.
        cluster.wait_version(&ids, record.version).await;
        for id in &ids {
            let view = cluster.node(*id).view().borrow().clone();
            assert_eq!(
                view.zones[&z("az-a")],
                ZoneStatus::FailedOver { target: z("az-b") }
            );
        }
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        eventually("a follower to know az-a's score", || {
            let h = cluster.node(follower).zone_health();
            h.iter()
                .any(|z| z.zone.as_str() == "az-a" && z.score.is_some_and(|s| s < 0.4))
                .then_some(())
        })
        .await;

        // az-a stays bad and recovers: with auto_failback off (the
        // default) nothing more is decided.
        tokio::time::sleep(PERIOD * 5).await;
        *bad.lock().unwrap() = None;
        tokio::time::sleep(PERIOD * 10).await;
        let view = cluster.node(leader).view().borrow().clone();
        assert_eq!(view.decision_version, record.version);
        // While the failover's dwell runs the leader ticks: the replicated
        // dwell clock moves by what the leader measured, on every node,
        // and the ticks take no decision version.
        eventually("the dwell clock to move on every node", || {
            let clocks: Vec<u64> = ids
                .iter()
                .map(|id| cluster.node(*id).state_snapshot().dwell_clock().elapsed_ms)
                .collect();
            clocks.iter().all(|c| *c >= 1_000).then_some(())
        })
        .await;
        assert_eq!(
            cluster.node(leader).view().borrow().decision_version,
            record.version
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_decides_from_the_reports_history() {
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let bad = Arc::new(std::sync::Mutex::new(None));
        for node in cluster.running() {
            node.set_failover_config(fast_failover()).unwrap();
            report_own_zone(node, bad.clone());
        }
        let old = cluster.wait_leader(&ids).await;
        // The old leader sees the zone fail but may not decide (its limit
        // allows no automatic failover): it holds the decision back.
        cluster
            .node(old)
            .set_failover_config(FailoverConfig {
                max_auto_failed_over: 0,
                ..fast_failover()
            })
            .unwrap();
        let failing = *ids.iter().find(|id| **id != old).unwrap();
        let failing_zone = cluster.node(failing).zone().clone();
        *bad.lock().unwrap() = Some(failing_zone.clone());
        eventually("the old leader to count three bad periods", || {
            let h = cluster.node(old).zone_health();
            h.iter()
                .any(|z| z.zone == failing_zone && z.bad_periods >= 3)
                .then_some(())
        })
        .await;
        assert_eq!(cluster.node(old).status().decision_version, 0);

        let stopped_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let stopped = Instant::now();
        cluster.stop(old).await;
        let rest: Vec<NodeId> = ids.iter().copied().filter(|id| *id != old).collect();
        let new = cluster.wait_leader(&rest).await;
        let elected = stopped.elapsed();
        let elected_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let (record, evidence) = eventually("the new leader's automatic failover", || {
            auto_failover_of(cluster.node(new))
        })
        .await;
        let decided = stopped.elapsed();
        eprintln!(
            "leader stopped -> new leader {:.0} ms -> automatic failover committed {:.0} ms",
            elected.as_secs_f64() * 1000.0,
            decided.as_secs_f64() * 1000.0
        );
        assert_eq!(record.actor, format!("detector:{new}"));
        assert_eq!(evidence.zone, failing_zone);
        assert!(evidence.periods.len() >= 3);
        // Decided from history: the run includes periods that ended
        // before the new leader led (reports go to the leader only, so it
        // knows those from the reports' history). On a busy machine the
        // election itself can take several periods, so the bound is the
        // election, not the old leader's stop.
        let oldest = evidence
            .periods
            .iter()
            .map(|p| p.period_end_ms)
            .min()
            .unwrap();
        assert!(
            oldest < elected_ms,
            "oldest evidence period ended at {oldest}, the new leader was seen at {elected_ms} (old one stopped at {stopped_ms})"
        );
        assert!(
            decided <= elected + PERIOD * 3 + Duration::from_secs(2),
            "{decided:?}"
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_reports_need_the_secret_and_their_own_sender() {
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let url = format!("http://{}{PATH_REPORT}", cluster.node(leader).raft_addr());
        let report = |node: NodeId| {
            codec::encode(&zonegate_cluster::Report {
                node,
                period_end_ms: 1000,
                zones: Vec::new(),
                history: Vec::new(),
                demand: Vec::new(),
            })
            .unwrap()
        };
        let client = reqwest::Client::new();
        // (name, secret, sender header, body, expected HTTP status)
        let cases: Vec<(&str, &str, NodeId, Vec<u8>, u16)> = vec![
            ("wrong secret", "a-guessed-secret-value", 2, report(2), 401),
            ("unknown sender", SECRET, 99, report(99), 403),
            ("report naming another node", SECRET, 2, report(3), 403),
            ("garbage body", SECRET, 2, vec![7, 7, 7], 400),
            ("a member's own report", SECRET, 2, report(2), 200),
        ];
        for (name, secret, sender, body, status) in cases {
            let resp = signed(
                client.post(&url),
                Some(secret),
                &sender.to_string(),
                PATH_REPORT,
                body,
            )
            .send()
            .await
            .unwrap();
            assert_eq!(resp.status().as_u16(), status, "{name}");
            if status == 200 {
                let ack: zonegate_cluster::ReportAck =
                    codec::decode(&resp.bytes().await.unwrap()).unwrap();
                assert!(ack.leader, "the leader ingests reports");
            }
        }
        cluster.shutdown().await;
    })
    .await;
}

/// Bodies no Raft endpoint may choke on: empty, garbage, issue 10's
/// 12-byte report whose zone name claims 2^50 bytes, a length bomb at the
/// front, a valid vote request cut short, and one a byte too long.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let vote = codec::encode(&openraft::raft::VoteRequest::<NodeId> {
        vote: openraft::Vote::new(1, 1),
        last_log_id: None,
    })
    .unwrap();
    // 0xFF: no bincode value starts with it (not a varint, not an option
    // tag). A 0 would make a vote request a whole report in format 2 (a
    // report ends with its demand list, and 0 is an empty one).
    let mut long = vote.clone();
    long.push(0xFF);
    vec![
        ("empty", Vec::new()),
        ("garbage", b"\x07\x07\x07 not bincode at all".to_vec()),
        (
            "issue 10's 12 bytes",
            vec![0x03, 0x00, 0x01, 0xfd, 0, 0, 0, 0, 0, 0, 0x04, 0x00],
        ),
        (
            "length bomb up front",
            [0xfd].into_iter().chain([0xff; 8]).chain([0; 4]).collect(),
        ),
        ("truncated", vote[..vote.len() - 1].to_vec()),
        ("trailing byte", long),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_on_every_raft_endpoint_get_400_and_the_node_keeps_committing() {
    use zonegate_cluster::network::{PATH_APPEND, PATH_SNAPSHOT};
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        let client = reqwest::Client::new();
        for target in [leader, follower] {
            let addr = cluster.node(target).raft_addr();
            for path in [PATH_APPEND, PATH_VOTE, PATH_SNAPSHOT, PATH_REPORT] {
                for (name, body) in hostile_bodies() {
                    let resp = signed(
                        client.post(format!("http://{addr}{path}")),
                        Some(SECRET),
                        &leader.to_string(),
                        path,
                        body,
                    )
                    .send()
                    .await
                    .unwrap();
                    assert_eq!(resp.status().as_u16(), 400, "{name} on {path} of {target}");
                }
            }
        }
        let version = cluster.must_propose(freeze()).await;
        cluster.wait_version(&ids, version).await;
        cluster.shutdown().await;
    })
    .await;
}

/// A member campaigns at the request of the leader it follows, never at a
/// follower's; the leader's handover makes a caught-up voter leader, and
/// decisions commit on both sides of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_can_hand_over_and_a_handover_loses_no_decision() {
    use zonegate_cluster::network::PATH_ELECT;
    use zonegate_cluster::Handover;
    with_timeout(async {
        let cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let before = cluster.must_propose(freeze()).await;
        let followers: Vec<NodeId> = ids.iter().copied().filter(|id| *id != leader).collect();
        let term = cluster.node(leader).status().term;
        let client = reqwest::Client::new();
        let target = cluster.node(followers[0]).raft_addr();
        let elect = |sender: NodeId, secret: Option<&'static str>| {
            signed(
                client.post(format!("http://{target}{PATH_ELECT}")),
                secret,
                &sender.to_string(),
                PATH_ELECT,
                Vec::new(),
            )
            .send()
        };
        assert_eq!(
            elect(followers[1], Some(SECRET)).await.unwrap().status(),
            409
        );
        assert_eq!(elect(leader, None).await.unwrap().status(), 401);
        assert_eq!(
            cluster.node(leader).status().term,
            term,
            "nobody campaigned"
        );
        assert!(cluster.node(leader).status().is_leader);

        // Not a leader: nothing to hand over.
        assert_eq!(
            cluster.node(followers[0]).hand_over().await,
            Handover::NotLeader
        );
        let to = match cluster.node(leader).hand_over().await {
            Handover::Transferred { to, .. } => to,
            other => panic!("handover failed: {other:?}"),
        };
        assert!(followers.contains(&to), "{to} is a follower of {leader}");
        assert_eq!(cluster.wait_leader(&ids).await, to);
        assert!(cluster.node(to).status().term > term);
        let after = cluster.must_propose(unfreeze()).await;
        assert_eq!(after, before + 1, "no decision lost or doubled");
        cluster.wait_version(&ids, after).await;
        cluster.shutdown().await;
    })
    .await;
}

/// The only voter has nobody to hand over to, and says so at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_voter_has_nobody_to_hand_over_to() {
    use zonegate_cluster::Handover;
    with_timeout(async {
        let cluster = TestCluster::start(&[("az-a", Role::Voter)]).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        assert_eq!(cluster.node(leader).hand_over().await, Handover::Alone);
        assert!(cluster.node(leader).status().is_leader, "it still leads");
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_answering_length_bombs_does_not_take_the_leader_down() {
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        // Whatever now listens on the stopped member's port answers every
        // call with 200 and issue 10's 12 bytes.
        let addr = cluster.stop(follower).await;
        let impostor = tokio::net::TcpListener::bind(addr).await.unwrap();
        let app = axum::Router::new()
            .fallback(|| async { vec![0x03u8, 0x00, 0x01, 0xfd, 0, 0, 0, 0, 0, 0, 0x04, 0x00] });
        let server = tokio::spawn(async move { axum::serve(impostor, app).await });
        let majority: Vec<NodeId> = ids.iter().copied().filter(|id| *id != follower).collect();
        // Long enough for many replication attempts at the impostor.
        for cmd in [freeze(), unfreeze(), failover("az-a", "az-b")] {
            cluster.propose_on(&majority, cmd).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cluster.wait_version(&majority, 3).await;
        server.abort();
        let _ = server.await;
        cluster.restart(follower, addr).await;
        cluster.wait_version(&ids, 3).await;
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_and_oversized_writes_never_enter_the_log_and_a_follower_down_meanwhile_catches_up()
{
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let leader = cluster.wait_leader(&ids).await;
        let version = cluster.must_propose(freeze()).await;
        cluster.wait_version(&ids, version).await;
        let follower = *ids.iter().find(|id| **id != leader).unwrap();
        let addr = cluster.stop(follower).await;
        let majority: Vec<NodeId> = ids.iter().copied().filter(|id| *id != follower).collect();
        let log_index = || {
            let leader = majority
                .iter()
                .find(|id| cluster.node(**id).status().is_leader)
                .unwrap();
            cluster.node(*leader).status().last_log_index
        };
        let before = log_index();
        // Issue 10's 40 refused failovers, each with a 1.9 MiB reason.
        let huge = "r".repeat(1_900_000);
        for i in 0..40 {
            let cmd = Command::decide(
                Decision::Failover {
                    from: z("az-a"),
                    to: z("az-a"),
                },
                "test",
                huge.clone(),
            );
            match cluster.propose_on(&majority, cmd).await {
                Err(e) => assert_eq!(e.rule(), Some(RejectRule::TooLong), "write {i}: {e}"),
                Ok(v) => panic!("an oversized write applied as version {v}"),
            }
        }
        // Small writes the safety rules refuse are refused before the log.
        for (cmd, rule) in [
            (freeze(), RejectRule::AlreadyFrozen),
            (failback("az-b"), RejectRule::NotFailedOver),
            (failover("az-a", "az-a"), RejectRule::SameZone),
            (failover("az-a", "az-x"), RejectRule::UnknownZone),
            (unfreeze().if_version(0), RejectRule::StaleVersion),
        ] {
            match cluster.propose_on(&majority, cmd.clone()).await {
                Err(e) => assert_eq!(e.rule(), Some(rule), "{cmd:?}: {e}"),
                Ok(v) => panic!("{cmd:?} applied as version {v}"),
            }
        }
        assert_eq!(log_index(), before, "no refused write entered the log");

        let started = Instant::now();
        cluster.restart(follower, addr).await;
        let version = cluster.must_propose(unfreeze()).await;
        cluster.wait_version(&ids, version).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "caught up in {:?}",
            started.elapsed()
        );
        cluster.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_mid_write_never_answers_failed_for_a_committed_write() {
    with_timeout(async {
        let mut cluster = TestCluster::start(&three_zones()).await;
        let ids = cluster.ids();
        let mut rng = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        let (mut applied, mut unknown, mut not_written) = (0, 0, 0);
        for round in 0..20 {
            let leader = cluster.wait_leader(&ids).await;
            let node = cluster.nodes.get_mut(&leader).unwrap().take().unwrap();
            let addr = node.raft_addr();
            let reason = format!("race {round}");
            let decision = match node.view().borrow().automation {
                zonegate_cluster::Automation::Frozen => Decision::Unfreeze,
                zonegate_cluster::Automation::Auto => Decision::Freeze,
            };
            let cmd = Command::decide(decision, "race", reason.clone());
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Stop the leader 0-4 ms into the write: before, during or
            // after its commit.
            let delay = Duration::from_micros(rng % 4000);
            let (answer, stopped) = tokio::join!(node.propose(cmd), async {
                tokio::time::sleep(delay).await;
                node.shutdown().await
            });
            stopped.unwrap();
            drop(node);
            cluster.restart(leader, addr).await;

            // Settle: a leader, and every node applied everything it has.
            let now_leader = cluster.wait_leader(&ids).await;
            eventually("every node applied the leader's log", || {
                let last = cluster.node(now_leader).status().last_log_index;
                ids.iter()
                    .all(|id| cluster.node(*id).status().last_applied_index == last)
                    .then_some(())
            })
            .await;
            let committed = cluster
                .node(now_leader)
                .decisions(100)
                .iter()
                .any(|d| d.reason == reason);
            match answer {
                Ok(_) => {
                    assert!(committed, "round {round}: applied but not in the history");
                    applied += 1;
                }
                Err(ProposeError::OutcomeUnknown(u)) => {
                    assert!(u.check_version > 0, "round {round}: {u}");
                    unknown += 1;
                }
                Err(e) => {
                    assert!(!committed, "round {round}: answered `{e}` but it committed");
                    not_written += 1;
                }
            }
        }
        eprintln!(
            "20 races: {applied} applied, {unknown} outcome unknown, {not_written} not written"
        );
        cluster.shutdown().await;
    })
    .await;
}
