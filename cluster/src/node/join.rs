//! Joining the group: the start-up identity check (a node that lost its
//! store never forms a second cluster), formation by the lowest-id voter,
//! a rejoining node's way back to its configured role, and the leader
//! adding configured learners.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::RaftError;
use openraft::ServerState;
use tokio::sync::watch;

use super::{ClusterError, ClusterNode};
use crate::identity::Identity;
use crate::network::Network;
use crate::types::alias::Raft;
use crate::types::Member;
use crate::view::NodeId;

impl ClusterNode {
    /// The lowest-id voting member forms the cluster, once: only while its
    /// store is pristine, and always with the same voter set.
    /// `may_form` is false once members answered with a cluster id: a
    /// node without a store then waits to be contacted, it never forms a
    /// second cluster.
    pub(super) async fn initialize_if_first(&self, may_form: bool) -> Result<(), ClusterError> {
        let voters: BTreeMap<NodeId, Member> = self
            .members
            .iter()
            .filter(|(_, m)| m.role.votes())
            .map(|(id, m)| (*id, m.clone()))
            .collect();
        if voters.keys().next() != Some(&self.id) {
            return Ok(());
        }
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        if initialized {
            if self.identity.cluster_id().is_none() {
                // A store from before cluster ids: give the cluster one.
                let id = self
                    .identity
                    .form()
                    .await
                    .map_err(|e| ClusterError::Identity(e.to_string()))?;
                tracing::info!(cluster_id = %id, "gave the existing cluster an id");
            }
            return Ok(());
        }
        if !may_form {
            return Ok(());
        }
        let cluster_id = self
            .identity
            .form()
            .await
            .map_err(|e| ClusterError::Identity(e.to_string()))?;
        match self.raft.initialize(voters).await {
            Ok(()) => {
                tracing::info!(node_id = self.id, %cluster_id, "formed the cluster");
                Ok(())
            }
            // Someone already wrote a log here: the cluster exists.
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(ClusterError::Raft(e.to_string())),
        }
    }
}

/// What the start-up identity check found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Pristine {
    /// No cluster is known yet: the lowest-id voter may form it.
    MayForm,
    /// A cluster exists (this node holds its id, or members answered
    /// with one): never form another.
    Exists,
}

/// The start-up half of the amnesia check (the run-time half is in
/// [`Identity::on_request`]). A node without a store asks every member
/// for its cluster id: if one knows this node held the id, its store was
/// lost, and it starts only with `--rejoin`. A node with a store checks
/// that the members it reaches name the same cluster.
pub(super) async fn check_identity(
    network: &Network,
    identity: &Identity,
    members: &BTreeMap<NodeId, Member>,
    me: NodeId,
    rejoin: bool,
) -> Result<Pristine, ClusterError> {
    let mut asks = tokio::task::JoinSet::new();
    for m in members.values().filter(|m| m.id != me) {
        let (network, id, addr) = (network.clone(), m.id, m.raft_addr.clone());
        asks.spawn(async move {
            let answer = network
                .post_empty(id, &addr, crate::network::PATH_HELLO, HELLO_TIMEOUT)
                .await;
            (id, answer)
        });
    }
    let answers: Vec<(NodeId, String, BTreeSet<NodeId>)> = asks
        .join_all()
        .await
        .into_iter()
        .filter_map(|(id, a)| match a {
            Ok((200, cluster, joined)) if !cluster.is_empty() => Some((
                id,
                cluster,
                joined.split(',').filter_map(|s| s.parse().ok()).collect(),
            )),
            _ => None,
        })
        .collect();
    if let Some(ours) = identity.cluster_id() {
        if let Some((peer, theirs, _)) = answers.iter().find(|(_, c, _)| *c != ours) {
            return Err(ClusterError::Identity(format!(
                "this node's store belongs to cluster {ours} but member {peer} is in cluster {theirs}: the data_dir is from another cluster. Fix: point node.data_dir at this cluster's store, or move it away and start with `zonegate serve --rejoin`"
            )));
        }
        if rejoin {
            tracing::info!("--rejoin ignored: this node holds its store (cluster {ours})");
        }
        return Ok(Pristine::Exists);
    }
    if rejoin {
        identity
            .set_rejoining(true)
            .await
            .map_err(|e| ClusterError::Identity(e.to_string()))?;
        tracing::info!(
            "rejoining: a learner until caught up, then promoted to its configured role"
        );
        return Ok(Pristine::Exists);
    }
    if let Some((peer, cluster, _)) = answers.iter().find(|(_, _, j)| j.contains(&me)) {
        return Err(ClusterError::Identity(format!(
            "node {me} lost its Raft state: its data_dir holds none, but member {peer} knows it as a member of cluster {cluster} that held Raft state before. Refusing to start with an empty store (acknowledged decisions could be lost). Fix: restore its data_dir if you can; otherwise start it with `zonegate serve --rejoin` (it catches up as a learner and is then promoted to its configured role)"
        )));
    }
    Ok(if answers.is_empty() {
        Pristine::MayForm
    } else {
        Pristine::Exists
    })
}

/// How long the start-up check waits for each member's answer.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_millis(500);

/// On a rejoining node: ask the leader, every half second, for the next
/// step (made a learner, then promoted once caught up) until this node
/// is back in its configured role; then it may vote and campaign again.
/// It takes no append until a leader answered that it is a learner
/// (`Identity::admits`), so it may not know the leader: then it asks
/// every member (the leader answers, the others refuse).
pub(super) async fn rejoin_loop(
    raft: Raft,
    identity: Arc<Identity>,
    network: Network,
    members: Arc<BTreeMap<NodeId, Member>>,
    me: NodeId,
    mut stop: watch::Receiver<bool>,
) {
    let configured_votes = members.get(&me).is_some_and(|m| m.role.votes());
    let mut was_learner = false;
    loop {
        let (asked, is_voter, is_learner) = {
            let m = raft.metrics().borrow().clone();
            let membership = m.membership_config.membership();
            let is_voter = membership.voter_ids().any(|id| id == me);
            let is_learner = !is_voter && membership.get_node(&me).is_some();
            // Addresses as the applied membership has them (a member
            // added, or readdressed, after this node's
            // `[[cluster.members]]` was written), else as configured.
            let address = |id: NodeId| {
                membership
                    .get_node(&id)
                    .or_else(|| members.get(&id))
                    .map(|m| (id, m.raft_addr.clone()))
            };
            let asked: Vec<(NodeId, String)> = match m.current_leader.filter(|l| *l != me) {
                Some(leader) => address(leader).into_iter().collect(),
                None => {
                    let ids: BTreeSet<NodeId> = membership
                        .nodes()
                        .map(|(id, _)| *id)
                        .chain(members.keys().copied())
                        .filter(|id| *id != me)
                        .collect();
                    ids.into_iter().filter_map(address).collect()
                }
            };
            (asked, is_voter, is_learner)
        };
        was_learner |= is_learner;
        let done = if configured_votes {
            was_learner && is_voter
        } else {
            is_learner
        };
        if done {
            if identity.set_rejoining(false).await.is_ok() {
                tracing::info!(node_id = me, "rejoined: back in its configured role");
                return;
            }
        } else {
            let mut asked: std::collections::VecDeque<(NodeId, String)> = asked.into();
            let mut seen: BTreeSet<NodeId> = asked.iter().map(|(id, _)| *id).collect();
            while let Some((to, addr)) = asked.pop_front() {
                match network
                    .post_empty_for_body(to, &addr, crate::network::PATH_REJOIN, HELLO_TIMEOUT)
                    .await
                {
                    // The leader answered; `learner TERM NODE`: a learner in
                    // its committed membership, whose appends may come.
                    Ok((202, body)) => {
                        let text = String::from_utf8_lossy(&body);
                        let mut words = text.split_whitespace();
                        if let (Some("learner"), Some(Ok(term)), Some(Ok(node))) = (
                            words.next(),
                            words.next().map(str::parse::<u64>),
                            words.next().map(str::parse::<NodeId>),
                        ) {
                            identity.admitted_by(term, node);
                        }
                        break;
                    }
                    // `leader ID ADDR`: not the leader, but it names one
                    // (perhaps added after this node's config was written).
                    Ok((409, body)) => {
                        let text = String::from_utf8_lossy(&body);
                        let mut words = text.split_whitespace();
                        if let (Some("leader"), Some(Ok(id)), Some(addr)) = (
                            words.next(),
                            words.next().map(str::parse::<NodeId>),
                            words.next(),
                        ) {
                            if id != me && seen.insert(id) {
                                asked.push_front((id, addr.to_owned()));
                            }
                        }
                    }
                    Ok((status, body)) => tracing::debug!(
                        to,
                        status,
                        answer = %String::from_utf8_lossy(&body),
                        "rejoin request not taken; retrying"
                    ),
                    Err(e) => tracing::debug!(error = %e, "rejoin request failed; retrying"),
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// On the leader, add configured learners missing from the membership, one
/// change at a time; retried while any is missing.
pub(super) async fn keep_learners(
    raft: Raft,
    identity: Arc<Identity>,
    me: NodeId,
    learners: Vec<Member>,
    mut stop: watch::Receiver<bool>,
) {
    if learners.is_empty() {
        return;
    }
    let mut metrics = raft.metrics();
    loop {
        let missing = {
            let m = metrics.borrow_and_update();
            let leading = m.state == ServerState::Leader && m.current_leader == Some(me);
            // A learner that held the cluster's state and is missing was
            // removed by an operator (`ctl members remove`): not re-added.
            let joined = identity.current().joined;
            leading
                .then(|| {
                    learners
                        .iter()
                        .filter(|l| !joined.contains(&l.id))
                        .find(|l| m.membership_config.membership().get_node(&l.id).is_none())
                        .cloned()
                })
                .flatten()
        };
        if let Some(learner) = missing {
            match raft.add_learner(learner.id, learner.clone(), false).await {
                Ok(_) => {
                    tracing::info!(learner = learner.id, zone = %learner.zone, "learner added");
                    continue;
                }
                Err(e) => {
                    // E.g. another membership change in progress: retry
                    // after a pause rather than spin.
                    tracing::debug!(learner = learner.id, error = %e, "adding learner failed");
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}
