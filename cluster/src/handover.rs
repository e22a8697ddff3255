//! Leadership handover: a draining leader makes a caught-up voter leader
//! before it stops, instead of leaving the group to wait out its lease.
//!
//! openraft 0.9 has no `transfer_leader`, and a follower refuses votes while
//! the leader's lease holds (`election_timeout_max` after its last
//! heartbeat), so a leader that just stops leaves the group leaderless for
//! the lease plus an election timeout. The handover uses what 0.9 does
//! have:
//! 1. the leader turns its own elections off (it is going away) and waits
//!    until a voter has matched its whole log;
//! 2. it asks that voter to campaign now (`PATH_ELECT`, signed like every
//!    RPC; the voter obeys only the leader it follows);
//! 3. the candidate's vote request reaches the leader, whose own vote was
//!    last renewed when it was elected, not by heartbeats: past the lease it
//!    grants the vote and steps down. Candidate and old leader are a quorum
//!    of three voters.
//!
//! A leader elected less than a lease ago refuses that first campaign, but
//! steps down on the candidate's higher term; with nobody leading, the
//! candidate is asked again and then gets its vote.
//!
//! With four or more voters the other followers' leases still refuse the
//! candidate; the leader then steps down on the candidate's higher term and
//! the group elects after the usual timeouts. If no voter takes over within
//! the limit the caller stops its Raft member (the old behaviour).

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::ServerState;
use tokio::time::Instant;

use crate::network::Network;
use crate::roster::Roster;
use crate::types::alias::Raft;
use crate::view::NodeId;

/// How a handover ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handover {
    /// This node did not lead: nothing to hand over.
    NotLeader,
    /// This node is the only voter: nobody to hand over to.
    Alone,
    /// `to` leads now; `after` since the handover began.
    Transferred { to: NodeId, after: Duration },
    /// No voter took over within the limit; why.
    Failed(String),
}

/// How long a campaign request may take to answer.
const ELECT_TIMEOUT: Duration = Duration::from_millis(500);
/// A candidate that has not won by then is asked again (its first
/// campaign may have met this node's own fresh lease).
const ASK_AGAIN: Duration = Duration::from_millis(100);

/// The voter to hand over to: one that has matched the leader's whole
/// log (a candidate with less log would be refused), lowest id first.
pub(crate) fn candidate(
    me: NodeId,
    voters: impl IntoIterator<Item = NodeId>,
    matched: &BTreeMap<NodeId, Option<u64>>,
    last_log_index: Option<u64>,
) -> Option<NodeId> {
    voters
        .into_iter()
        .filter(|v| *v != me)
        .find(|v| matched.get(v).copied().flatten() >= last_log_index && last_log_index.is_some())
}

/// Hands leadership to a caught-up voter within `within`; see the module.
/// The caller turns this node's elections off first: it is draining.
pub(crate) async fn hand_over(
    raft: &Raft,
    network: &Network,
    roster: &Roster,
    me: NodeId,
    within: Duration,
) -> Handover {
    let began = Instant::now();
    let mut metrics = raft.metrics();
    let (quorum_ack, other_voters) = {
        let m = metrics.borrow();
        if m.state != ServerState::Leader {
            return Handover::NotLeader;
        }
        let voters = m.membership_config.membership().voter_ids();
        (
            m.millis_since_quorum_ack,
            voters.filter(|v| *v != me).count(),
        )
    };
    if other_voters == 0 {
        return Handover::Alone;
    }
    // A leader cut off from its quorum has nobody to hand over to (the
    // whole group stopping, or a partition): no point waiting.
    if quorum_ack.is_none_or(|ms| Duration::from_millis(ms) > within) {
        return Handover::Failed("no quorum acknowledged this leader recently".into());
    }
    let deadline = began + within;
    let mut asked: Option<(NodeId, Instant)> = None;
    let mut last_refusal = String::from("no voter has caught up with the leader's log");
    loop {
        let (state, leader, pick) = {
            let m = metrics.borrow_and_update();
            let matched: BTreeMap<NodeId, Option<u64>> = m
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
                .unwrap_or_default();
            let voters = m.membership_config.membership().voter_ids();
            let pick = candidate(me, voters, &matched, m.last_log_index);
            (m.state, m.current_leader, pick)
        };
        if let Some(to) = leader.filter(|l| *l != me && state != ServerState::Leader) {
            return Handover::Transferred {
                to,
                after: began.elapsed(),
            };
        }
        if Instant::now() >= deadline {
            return Handover::Failed(last_refusal);
        }
        let due = asked.is_none_or(|(_, at)| at.elapsed() >= ASK_AGAIN);
        let ask = match (state == ServerState::Leader, pick, asked) {
            (true, Some(to), _) => Some(to),
            // Replication of the last entries is under way; a heartbeat
            // carries them to the voters sooner.
            (true, None, _) => {
                let _ = raft.trigger().heartbeat().await;
                None
            }
            // The first campaign lost (this node was elected less than a
            // lease ago and refused it) and this node stepped down on the
            // candidate's higher term: nobody leads, so the candidate may
            // campaign again, and this time gets this node's vote.
            (false, _, Some((to, _))) if leader.is_none() => Some(to),
            _ => None,
        };
        if let Some(to) = ask.filter(|_| due) {
            asked = Some((to, Instant::now()));
            if let Some(err) = ask_to_campaign(network, roster, to).await {
                last_refusal = err;
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), metrics.changed()).await;
    }
}

/// Asks `to` to campaign; `Some(why)` when it said no or could not be
/// reached.
async fn ask_to_campaign(network: &Network, roster: &Roster, to: NodeId) -> Option<String> {
    let Some(member) = roster.get(to) else {
        return Some(format!("member {to} has no address"));
    };
    match network
        .post_empty(
            to,
            &member.raft_addr,
            crate::network::PATH_ELECT,
            ELECT_TIMEOUT,
        )
        .await
    {
        Ok((202, ..)) => {
            tracing::info!(to, "handover: asked member {to} to campaign");
            None
        }
        Ok((status, ..)) => Some(format!("member {to} refused to campaign ({status})")),
        Err(e) => Some(format!("member {to} unreachable: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_candidate_has_matched_the_whole_log() {
        let matched = BTreeMap::from([(2, Some(9)), (3, Some(10)), (4, None)]);
        assert_eq!(candidate(1, [1, 2, 3, 4], &matched, Some(10)), Some(3));
        // Lowest id among the caught-up ones; never the leader itself.
        let all = BTreeMap::from([(1, Some(10)), (2, Some(10)), (3, Some(10))]);
        assert_eq!(candidate(1, [1, 2, 3], &all, Some(10)), Some(2));
        // Nobody caught up, or no log at all: nobody.
        assert_eq!(candidate(1, [1, 2], &matched, Some(10)), None);
        assert_eq!(candidate(1, [1, 2], &BTreeMap::new(), None), None);
        // A learner is not a voter.
        assert_eq!(candidate(1, [1], &all, Some(10)), None);
    }
}
