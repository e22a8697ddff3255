//! Proposing a command on the leader: the check-quorum guard, the leader's
//! time stamp, and waiting for the applied outcome. The node's `propose`
//! and the failover leader loop both go through `Proposer`; the loop sees
//! it only as `Propose`, so it depends on no node or network code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::{leader_clock, millis, unix_ms_on};
use crate::command::{Command, Outcome, RejectRule, Rejection};
use crate::state::{ClusterState, Preview};
use crate::types::alias::{Raft, RaftMetrics};
use crate::types::Member;
use crate::view::NodeId;

/// A committed, applied decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub version: u64,
}

/// Why a proposal did not (knowingly) apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// Another node leads; forward to its admin address.
    #[error("node {leader} is the leader; send the decision there")]
    NotLeader {
        leader: NodeId,
        admin_addr: Option<String>,
    },
    /// No leader that can commit is known (election under way, or this
    /// leader has lost its quorum). Nothing was written.
    #[error("no leader with a quorum right now; retry shortly")]
    NoLeader,
    /// Committed and applied, and a safety rule refused it on every node.
    #[error("refused by rule {rule}: {message}")]
    Rejected { rule: RejectRule, message: String },
    /// The entry was handed to Raft but its commit could not be confirmed
    /// (no answer in time, or the leader stopped or lost its leadership
    /// before answering): it may have committed, or may still. Never
    /// report this as a failure; the payload says which version to check.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(Unconfirmed),
    /// The Raft node stopped or its storage failed.
    #[error("raft node failed: {0}")]
    Fatal(String),
}

/// A write whose outcome is unknown, and how to find it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unconfirmed {
    /// Why the commit was not confirmed.
    pub why: &'static str,
    /// How long the proposer waited.
    pub waited: Duration,
    /// The decision version the write takes if it committed and nothing
    /// else came first: look for it (or a later one with this write's
    /// actor and reason) in the decision history.
    pub check_version: u64,
}

impl std::fmt::Display for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the decision was submitted but {} (after {:?}); it may have committed as version {} or later: check `zonegate ctl decisions` before retrying",
            self.why, self.waited, self.check_version
        )
    }
}

impl ProposeError {
    /// The rule name when a safety rule refused the decision.
    pub fn rule(&self) -> Option<RejectRule> {
        match self {
            ProposeError::Rejected { rule, .. } => Some(*rule),
            _ => None,
        }
    }
}

/// The check-quorum guard. openraft 0.9 has no check-quorum: a leader cut
/// off from its quorum still believes it leads. `millis_since_quorum_ack`
/// is `Some` only on a leader that a quorum has acknowledged at least once
/// in its term, so `None` on a leader means "not yet heard from a quorum":
/// it must not propose either. Followers are not judged here (openraft
/// itself answers them with `ForwardToLeader`).
pub(crate) fn quorum_lost(m: &RaftMetrics, election_timeout_max: Duration) -> bool {
    m.state == ServerState::Leader
        && m.millis_since_quorum_ack
            .is_none_or(|ms| ms > millis(election_timeout_max))
}

/// What the failover leader loop needs to commit a decision.
pub(crate) trait Propose: Send + Sync + 'static {
    /// Propose `cmd`; `Ok` means committed and applied as that version.
    fn propose(&self, cmd: Command) -> impl Future<Output = Result<Applied, ProposeError>> + Send;
}

/// Proposes on the local Raft node.
#[derive(Clone)]
pub(crate) struct Proposer {
    pub raft: Raft,
    /// How long to wait for the entry to apply before `OutcomeUnknown`.
    pub propose_timeout: Duration,
    /// The check-quorum window (the election timeout's upper bound).
    pub election_timeout_max: Duration,
    /// Where to point callers when another node leads.
    pub members: crate::roster::Roster,
    /// The applied state, for the dry run before proposing.
    pub state_rx: watch::Receiver<Arc<ClusterState>>,
    /// Held from the final stamp until Raft has the entry, so this
    /// process hands its commands to Raft in the order of their stamps
    /// (see [`Proposer::write`]).
    pub append_order: Arc<tokio::sync::Mutex<()>>,
}

impl From<Rejection> for ProposeError {
    fn from(r: Rejection) -> Self {
        ProposeError::Rejected {
            rule: r.rule,
            message: r.message,
        }
    }
}

impl Proposer {
    /// Refuse on a leader without a recent quorum ack. A leader elected
    /// moments ago has not heard its first ack yet: wait for it, at most one
    /// election timeout, rather than answer `NoLeader` to every write in
    /// the first milliseconds of a term.
    pub(crate) async fn check_quorum(&self) -> Result<(), ProposeError> {
        let mut metrics = self.raft.metrics();
        let first_ack = metrics
            .wait_for(|m| m.state != ServerState::Leader || m.millis_since_quorum_ack.is_some());
        // A timeout or a stopped node: the check below decides.
        let _ = tokio::time::timeout(self.election_timeout_max, first_ack).await;
        let m = metrics.borrow();
        if quorum_lost(&m, self.election_timeout_max) {
            return Err(ProposeError::NoLeader);
        }
        Ok(())
    }

    pub(crate) fn not_leader_for(
        &self,
        leader: Option<NodeId>,
        node: Option<Member>,
    ) -> ProposeError {
        self.not_leader(leader, node)
    }

    fn not_leader(&self, leader: Option<NodeId>, node: Option<Member>) -> ProposeError {
        match leader {
            Some(leader) => ProposeError::NotLeader {
                leader,
                admin_addr: self
                    .members
                    .get(leader)
                    .map(|m| m.admin_addr.clone())
                    .or_else(|| node.map(|n| n.admin_addr)),
            },
            None => ProposeError::NoLeader,
        }
    }

    /// Dry-run `cmd` against everything committed before now: confirm
    /// leadership with a quorum and wait until this node applied up to its
    /// commit index (openraft's linearizable read), then check the rules.
    /// A command the rules refuse is refused here and never enters the log.
    /// Returns the version the command would take.
    async fn dry_run(&self, cmd: &Command) -> Result<u64, ProposeError> {
        Ok(self.preview(cmd).await?.version)
    }

    /// The dry run's answer in full: what `cmd` would do against everything
    /// committed before now, read on the leader after openraft's
    /// linearizable read. A follower answers `NotLeader` (its own applied
    /// state may lag the leader's, e.g. not yet hold the zones learned from
    /// the formation entry); the caller forwards.
    pub(crate) async fn preview(&self, cmd: &Command) -> Result<Preview, ProposeError> {
        self.ensure_read().await?;
        Ok(self.state_rx.borrow().check(cmd)?)
    }

    /// Confirm leadership with a quorum and wait until this node applied
    /// up to the leader's read index (openraft's linearizable read).
    pub(crate) async fn ensure_read(&self) -> Result<(), ProposeError> {
        let read = tokio::time::timeout(self.propose_timeout, self.raft.ensure_linearizable());
        match read.await {
            Ok(Ok(_)) => {}
            // Nothing was written: no leader that can commit right now.
            Err(_) | Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                return Err(ProposeError::NoLeader)
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                return Err(self.not_leader(f.leader_id, f.leader_node))
            }
            Ok(Err(RaftError::Fatal(e))) => return Err(ProposeError::Fatal(e.to_string())),
        }
        Ok(())
    }

    async fn write(&self, cmd: Command) -> Result<Applied, ProposeError> {
        cmd.validate()?;
        self.check_quorum().await?;
        // The leader's wall clock (for the history and the wall-clock dwell
        // rule) and its monotonic clock (for the dwell clock).
        let me = self.raft.metrics().borrow().id;
        let check_version = self
            .dry_run(&cmd.clone().clocked(unix_ms_on(me), leader_clock(me)))
            .await?;
        // Stamped again, for good, under `append_order`, and handed to
        // Raft before the lock is released: this leader's entries reach
        // the log in the order of their stamps. The dwell clock reads an
        // entry at the newest stamp of its leader applied so far
        // (`state::DwellClock`): were a command stamped before the dry run
        // (a quorum round trip) appended after a concurrent one stamped
        // later, it would be measured at the later stamp and could pass
        // its dwell up to that round trip early. A later stamp than the
        // dry run's only lengthens a dwell. (The simulation checks the
        // order, `check::stamp_order`: without the lock, seeds
        // 2004000..2005000 broke it in 10 of 1,000 runs, by up to 127 ms.)
        let order = self.append_order.lock().await;
        let cmd = cmd.clocked(unix_ms_on(me), leader_clock(me));
        // The simulation notes the stamp's true time (its dwell check).
        #[cfg(feature = "sim")]
        crate::sim::stamped(&cmd);
        // Until Raft has the entry nothing is written: a failure here is
        // what it says. From then on, only an answer from Raft is a fact.
        // `client_write_ff` returns once the entry is queued to Raft's
        // core, which appends in the order it receives.
        let answer = self
            .raft
            .client_write_ff(cmd)
            .await
            .map_err(|e| ProposeError::Fatal(e.to_string()))?;
        drop(order);
        let started = tokio::time::Instant::now();
        // The planted bug (feature `sim-bug-ack-before-commit`, switched
        // on by the simulation's test of its checker): acknowledge once
        // the entry is in the leader's log, before any quorum has it.
        #[cfg(feature = "sim-bug-ack-before-commit")]
        if crate::sim::bug() {
            drop(answer);
            return Ok(Applied {
                version: check_version,
            });
        }
        let answer = tokio::time::timeout(self.propose_timeout, answer).await;
        let unknown = |why| {
            ProposeError::OutcomeUnknown(Unconfirmed {
                why,
                waited: started.elapsed(),
                check_version,
            })
        };
        match answer {
            Err(_) => Err(unknown("no commit was confirmed in time")),
            Ok(Err(_)) => Err(unknown("the raft node stopped before confirming it")),
            Ok(Ok(Ok(resp))) => match resp.data.outcome {
                Some(Outcome::Applied { version }) => Ok(Applied { version }),
                Some(Outcome::Rejected { rule, message }) => {
                    Err(ProposeError::Rejected { rule, message })
                }
                None => Err(ProposeError::Fatal(
                    "a command entry applied without an outcome".into(),
                )),
            },
            // openraft answers this for an entry it never appended (not the
            // leader) or one it removed from its log as conflicting, which
            // therefore never committed: not written, forward.
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                Err(self.not_leader(f.leader_id, f.leader_node))
            }
            Ok(Ok(Err(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(ProposeError::Fatal(e.to_string()))
            }
        }
    }
}

impl Propose for Proposer {
    async fn propose(&self, cmd: Command) -> Result<Applied, ProposeError> {
        let kind = cmd.kind();
        let result = self.write(cmd).await;
        // The dwell clock's ticks are no decision: not worth an INFO line
        // each period of a dwell.
        let tick = matches!(kind, "tick");
        match &result {
            Ok(a) if tick => tracing::debug!(kind, version = a.version, "tick committed"),
            Ok(a) => tracing::info!(kind, version = a.version, "decision committed"),
            Err(e) if tick => tracing::debug!(kind, error = %e, "tick not committed"),
            Err(e) => tracing::info!(kind, error = %e, "decision not committed"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_without_a_recent_quorum_ack_must_not_propose() {
        let max = Duration::from_millis(600);
        let metrics = |state, ack| {
            let mut m = RaftMetrics::new_initial(1);
            m.state = state;
            m.millis_since_quorum_ack = ack;
            m
        };
        let cases = [
            (ServerState::Leader, None, true),
            (ServerState::Leader, Some(0), false),
            (ServerState::Leader, Some(600), false),
            (ServerState::Leader, Some(601), true),
            (ServerState::Follower, None, false),
            (ServerState::Candidate, None, false),
        ];
        for (state, ack, lost) in cases {
            assert_eq!(
                quorum_lost(&metrics(state, ack), max),
                lost,
                "{state:?} {ack:?}"
            );
        }
    }
}
