//! Elections with a pre-vote round: a voter campaigns only after a quorum
//! of voters (itself included) said they heard from no live leader within
//! the election timeout.
//!
//! openraft 0.9 has neither PreVote nor CheckQuorum. Its own timer lets a
//! follower that was paused (SIGSTOP, a VM stall) or cut off campaign the
//! moment it runs again, with a higher term: the healthy leader, whose own
//! vote was renewed only at its election, grants the vote past its lease
//! and steps down, or steps down when the candidate's higher term reaches
//! it (a drill measured term 10 → 12 and a new leader for a follower that
//! resumed). So openraft's election timer is off (`Config::enable_elect =
//! false`) and [`run`] drives elections instead, as etcd's PreVote does:
//!
//! 1. the timer is openraft's own (the leader lease plus a random election
//!    timeout after the last word from a leader; only the random timeout
//!    when no leader was ever committed), restarted by every append a
//!    leader sends here, by leading, and by every round;
//! 2. when it fires, every other voter is asked `POST /raft/v1/prevote`
//!    (signed like every Raft RPC; no term changes anywhere): a voter
//!    answers 409 when it heard from a live leader within
//!    `election_timeout_max` (a follower: an append from its leader; a
//!    leader: a quorum's acknowledgement, or none yet in a term just
//!    begun), else 200 naming its last log entry;
//! 3. a 200 counts as a grant only when the candidate's log is at least as
//!    up to date as the one it names (as the Raft thesis's pre-vote, §9.6;
//!    a 200 without a body, from a build before this check, counts as
//!    before); with a quorum of grants (its own included) it campaigns
//!    (`Raft::trigger().elect()`), otherwise it waits for the next timeout.
//!
//! The log check matters because openraft refuses a vote for a candidate
//! whose log is behind without adopting the candidate's term: with
//! enough such candidates granting each other's rounds, each campaign
//! raised the term past the up-to-date voters', which then campaigned
//! with a term already spent, round after round (the simulation's seed 46:
//! six voters, three behind and one rejoining, term 2 to 161 without a
//! leader that lasted).
//!
//! A candidate that resumes from a pause therefore asks, hears that the
//! leader is alive, and waits for its heartbeat: the term never moves. A
//! dead or paused leader answers nobody and its followers stopped hearing
//! it, so they grant each other's rounds and elect after the same timeouts
//! as before (the round ends as soon as a quorum granted). Chosen over a
//! bare heard-from-leader window on the candidate because the candidate's
//! own window is exactly what a pause makes stale: only the others know
//! whether the leader is alive. The leader's handover (`crate::handover`)
//! asks its successor to campaign directly (`PATH_ELECT`): a leader giving
//! up its place needs no pre-vote.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::identity::Identity;
use crate::lock::lock;
use crate::network::{Network, PATH_PREVOTE};
use crate::roster::Roster;
use crate::types::alias::{LogId, Raft};
use crate::view::NodeId;

/// Whether this node may campaign at all (a draining node may not; it
/// still votes). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Campaigns(Arc<AtomicBool>);

impl Campaigns {
    pub(crate) fn allowed() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// From now on this node never campaigns (until it restarts).
    pub(crate) fn stop(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    pub(crate) fn may(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A pre-vote answer from a voter's point of view: whether it heard from
/// a live leader within `window`. Pure.
///
/// - A leader is live while a quorum acknowledged it within the window,
///   and while no quorum acknowledged it yet in its term (it was elected
///   a moment ago: a candidate whose round overlapped the election must
///   not unseat it).
/// - A follower heard from one when it knows a leader and accepted an
///   append from it within the window.
pub(crate) fn heard_from_leader(
    state: ServerState,
    millis_since_quorum_ack: Option<u64>,
    knows_leader: bool,
    contact_age: Option<Duration>,
    window: Duration,
) -> bool {
    if state == ServerState::Leader {
        return millis_since_quorum_ack.is_none_or(|ms| Duration::from_millis(ms) <= window);
    }
    knows_leader && contact_age.is_some_and(|age| age <= window)
}

/// The votes of a pre-vote round so far, against the membership's voter
/// configs: one, or two during a joint change, where a vote needs a
/// majority of each (as openraft's election does; a tally over the union
/// let voters who could never be elected campaign on: the simulation's
/// seed 2000423). Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tally {
    configs: Vec<BTreeSet<NodeId>>,
    /// Voters (the candidate included) that heard from no live leader.
    granted: BTreeSet<NodeId>,
    /// Voters that heard from one, or did not answer.
    refused: BTreeSet<NodeId>,
}

impl Tally {
    /// A round among `configs`, the candidate `me`'s own grant counted.
    pub(crate) fn new(configs: Vec<BTreeSet<NodeId>>, me: NodeId) -> Self {
        Self {
            configs,
            granted: [me].into(),
            refused: BTreeSet::new(),
        }
    }

    pub(crate) fn grant(&mut self, voter: NodeId) {
        self.granted.insert(voter);
    }

    pub(crate) fn refuse(&mut self, voter: NodeId) {
        self.refused.insert(voter);
    }

    /// `Some(campaign?)` once the round is decided either way.
    pub(crate) fn outcome(&self) -> Option<bool> {
        let quorum = |c: &BTreeSet<NodeId>| c.len() / 2 + 1;
        let count = |c: &BTreeSet<NodeId>, of: &BTreeSet<NodeId>| c.intersection(of).count();
        if self
            .configs
            .iter()
            .all(|c| count(c, &self.granted) >= quorum(c))
        {
            Some(true)
        } else if self
            .configs
            .iter()
            .any(|c| c.len().saturating_sub(count(c, &self.refused)) < quorum(c))
        {
            Some(false)
        } else {
            None
        }
    }
}

/// A random duration in `[min, max]` (the election timeout's spread, so
/// two followers rarely start a round at once).
fn random_between(min: Duration, max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let spread = max.saturating_sub(min).as_millis();
    #[cfg(feature = "sim")]
    if let Some(r) = crate::sim::random() {
        let r = u128::from(r) % spread.saturating_add(1);
        return min + Duration::from_millis(u64::try_from(r).unwrap_or(0));
    }
    // A fresh `RandomState` is seeded anew; the clock adds variety.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let r = u128::from(h.finish()) % spread.saturating_add(1);
    min + Duration::from_millis(u64::try_from(r).unwrap_or(0))
}

/// A granted pre-vote's answer body: the voter's last log entry as
/// `term-node-index`, empty when its log is empty.
pub(crate) fn encode_last(last: Option<LogId>) -> String {
    last.map(|l| format!("{}-{}-{}", l.leader_id.term, l.leader_id.node_id, l.index))
        .unwrap_or_default()
}

/// Whether a 200 whose body is `answer` counts as a grant for a candidate
/// whose last log entry is `mine`: the voter's log (as the body names it)
/// is not ahead of the candidate's. An empty or unreadable body (a build
/// without the check, or an empty log) grants. Pure.
pub(crate) fn grants(answer: &[u8], mine: Option<LogId>) -> bool {
    let theirs = std::str::from_utf8(answer).ok().and_then(|text| {
        let mut parts = text.trim().splitn(3, '-').map(str::parse::<u64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(term)), Some(Ok(node)), Some(Ok(index))) => Some(LogId::new(
                openraft::CommittedLeaderId::new(term, node),
                index,
            )),
            _ => None,
        }
    });
    match theirs {
        Some(theirs) => mine >= Some(theirs),
        None => true,
    }
}

/// What the election driver needs.
pub(crate) struct Driver {
    pub raft: Raft,
    /// This node's log: its last entry against each grant's.
    pub log: Arc<crate::store::LogStore>,
    pub network: Network,
    pub roster: Roster,
    pub identity: Arc<Identity>,
    pub me: NodeId,
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// When this node last accepted an append from a leader.
    pub contact: Arc<Mutex<Option<Instant>>>,
    pub campaigns: Campaigns,
    pub stop: watch::Receiver<bool>,
}

/// Drives this node's elections until `stop` (see the module). Ends when
/// Raft stops.
pub(crate) async fn run(mut d: Driver) {
    let mut metrics = d.raft.metrics();
    let mut since = Instant::now();
    let mut timeout = random_between(d.election_timeout_min, d.election_timeout_max);
    let mut tick = tokio::time::interval(d.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = d.stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let (state, voters, configs, committed) = {
            let m = metrics.borrow_and_update();
            if m.running_state.is_err() {
                return;
            }
            let membership = m.membership_config.membership();
            let voters: Vec<NodeId> = membership.voter_ids().collect();
            let configs = membership.get_joint_config().clone();
            (m.state, voters, configs, m.vote.is_committed())
        };
        let now = Instant::now();
        if let Some(heard) = *lock(&d.contact) {
            since = since.max(heard);
        }
        let may = d.campaigns.may() && !d.identity.rejoining() && voters.contains(&d.me);
        if state == ServerState::Leader || !may {
            since = now;
            continue;
        }
        // openraft's own rule: past the lease of the leader it knew, plus
        // a random timeout; the only voter campaigns at once (once: a
        // campaign under way is left to finish).
        let due = if voters.len() == 1 && state == ServerState::Follower {
            Duration::ZERO
        } else if committed {
            d.election_timeout_max + timeout
        } else {
            timeout
        };
        if now.saturating_duration_since(since) < due {
            continue;
        }
        let campaign = round(&d, &voters, configs).await;
        since = Instant::now();
        timeout = random_between(d.election_timeout_min, d.election_timeout_max);
        if campaign {
            tracing::info!(node_id = d.me, "pre-vote granted by a quorum: campaigning");
            if let Err(e) = d.raft.trigger().elect().await {
                tracing::debug!(error = %e, "campaign not started");
                return;
            }
        }
    }
}

/// One pre-vote round: whether a quorum heard from no live leader. Ends
/// as soon as the outcome is known; a voter that does not answer within
/// `election_timeout_min` counts as a refusal.
async fn round(d: &Driver, voters: &[NodeId], configs: Vec<BTreeSet<NodeId>>) -> bool {
    let mut tally = Tally::new(configs, d.me);
    if let Some(decided) = tally.outcome() {
        return decided;
    }
    let mine = {
        use openraft::storage::RaftLogStorage;
        let mut log = (*d.log).clone();
        match log.get_log_state().await {
            Ok(state) => state.last_log_id,
            // No reading of its own log: no campaign this round.
            Err(_) => return false,
        }
    };
    let mut asks = tokio::task::JoinSet::new();
    for id in voters.iter().copied().filter(|id| *id != d.me) {
        let Some(member) = d.roster.get(id) else {
            tally.refuse(id);
            continue;
        };
        let network = d.network.clone();
        let ttl = d.election_timeout_min;
        asks.spawn(async move {
            let answer = network
                .post_empty_for_body(id, &member.raft_addr, PATH_PREVOTE, ttl)
                .await;
            (id, answer)
        });
    }
    while let Some(joined) = asks.join_next().await {
        match joined {
            Ok((id, Ok((200, body)))) if grants(&body, mine) => tally.grant(id),
            Ok((id, other)) => {
                tracing::debug!(voter = id, answer = ?other.map(|a| a.0), "pre-vote not granted");
                tally.refuse(id);
            }
            // A task that failed: nothing says who; the round then ends
            // undecided if it must (no grant counted).
            Err(_) => {}
        }
        if let Some(decided) = tally.outcome() {
            tracing::debug!(?tally, "pre-vote round decided");
            return decided;
        }
    }
    tally.outcome().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(600);

    #[test]
    fn a_voter_refuses_while_it_hears_from_a_live_leader() {
        use ServerState::{Candidate, Follower, Leader};
        let ms = Duration::from_millis;
        // (state, quorum ack, knows a leader, last append, heard?)
        let cases = [
            (Follower, None, true, Some(ms(100)), true),
            (Follower, None, true, Some(ms(600)), true),
            (Follower, None, true, Some(ms(601)), false),
            (Follower, None, true, None, false),
            // An append long ago from a leader it no longer knows.
            (Follower, None, false, Some(ms(10)), false),
            (Candidate, None, false, Some(ms(10)), false),
            (Leader, Some(50), false, None, true),
            (Leader, Some(700), false, None, false),
            // A leader elected a moment ago, no quorum acknowledged yet
            // (a candidate whose round overlapped the election asks).
            (Leader, None, false, None, true),
        ];
        for (state, ack, knows, age, want) in cases {
            assert_eq!(
                heard_from_leader(state, ack, knows, age, WINDOW),
                want,
                "{state:?} ack {ack:?} knows {knows} age {age:?}"
            );
        }
    }

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_round_needs_a_quorum_of_grants_the_candidates_own_included() {
        // A resumed follower of three: the leader and the other follower
        // both heard from the leader.
        let mut t = Tally::new(vec![set(&[1, 2, 3])], 1);
        assert_eq!(t.outcome(), None);
        t.refuse(2);
        assert_eq!(t.outcome(), None);
        t.refuse(3);
        assert_eq!(t.outcome(), Some(false));
        // The leader died: the other follower grants, the dead leader's
        // answer is not waited for.
        let mut t = Tally::new(vec![set(&[1, 2, 3])], 1);
        t.grant(2);
        assert_eq!(t.outcome(), Some(true));
        // The only voter campaigns at once; two voters need both.
        assert_eq!(Tally::new(vec![set(&[1])], 1).outcome(), Some(true));
        let mut t = Tally::new(vec![set(&[1, 2])], 1);
        assert_eq!(t.outcome(), None);
        t.refuse(2);
        assert_eq!(t.outcome(), Some(false));
        // Five voters: three grants.
        let mut t = Tally::new(vec![set(&[1, 2, 3, 4, 5])], 1);
        t.grant(2);
        t.refuse(3);
        t.refuse(4);
        assert_eq!(t.outcome(), None);
        t.grant(5);
        assert_eq!(t.outcome(), Some(true));
    }

    /// Seed 2000423 of the simulation: during a joint change
    /// `[{1, 2}, {1, 2, 3}]` with node 1 refusing (its log ahead), nodes 2
    /// and 3 made a majority of the union and campaigned in turn, though
    /// no election without node 1 could succeed; their terms outran node
    /// 1's, which could.
    #[test]
    fn a_joint_configuration_needs_a_quorum_of_each_config() {
        let joint = vec![set(&[1, 2]), set(&[1, 2, 3])];
        let mut t = Tally::new(joint.clone(), 2);
        t.grant(3);
        assert_eq!(t.outcome(), None);
        t.refuse(1);
        assert_eq!(t.outcome(), Some(false));
        let mut t = Tally::new(joint, 1);
        t.grant(2);
        assert_eq!(t.outcome(), Some(true));
        // A candidate in the new config only still needs the old one's
        // majority.
        let mut t = Tally::new(vec![set(&[1, 2, 3]), set(&[3, 4, 5])], 4);
        t.grant(5);
        assert_eq!(t.outcome(), None);
        t.grant(1);
        t.grant(2);
        assert_eq!(t.outcome(), Some(true));
    }

    /// Seed 46 of the simulation: voters whose logs were behind granted
    /// each other's rounds and kept raising the term past the up-to-date
    /// voters'; a grant now counts only from a voter whose log is not
    /// ahead of the candidate's.
    #[test]
    fn a_grant_from_a_voter_whose_log_is_ahead_does_not_count() {
        let id = |term, node, index| {
            Some(LogId::new(
                openraft::CommittedLeaderId::new(term, node),
                index,
            ))
        };
        let mine = id(8, 100, 24);
        assert_eq!(encode_last(id(161, 4, 26)), "161-4-26");
        assert!(!grants(b"161-4-26", mine));
        assert!(!grants(b"8-100-25", mine));
        // openraft orders leader ids by term, then node id.
        assert!(!grants(b"8-101-24", mine));
        assert!(grants(b"8-100-24", mine));
        assert!(grants(b"7-200-90", mine));
        // An empty log, a build without the check, a body not understood.
        assert!(grants(b"", mine));
        assert!(grants(b"", None));
        assert!(grants(b"x-1-2", mine));
        assert!(!grants(b"1-1-1", None));
        assert_eq!(encode_last(None), "");
    }

    #[test]
    fn random_timeouts_stay_within_their_bounds() {
        let (min, max) = (Duration::from_millis(300), Duration::from_millis(600));
        for _ in 0..1000 {
            let t = random_between(min, max);
            assert!(min <= t && t <= max, "{t:?}");
        }
        assert_eq!(random_between(max, max), max);
    }
}
