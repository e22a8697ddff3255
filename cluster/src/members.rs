//! Membership operations (`ctl members add/remove/promote/readdress`): the
//! pure rules that decide whether one change is safe, and the openraft
//! steps that carry it out. The run-time half (probing members, calling
//! `change_membership`) is in `node.rs`.
//!
//! Every change is one joint-consensus change at a time (openraft
//! refuses a second while one is in flight). A change is refused, with a
//! named rule, when it would lose quorum (the voters of the new
//! configuration that answered a probe and are caught up must be a
//! majority of it, as must the current voters, since openraft commits
//! the joint configuration with both), remove the last voter of a zone
//! whose bootstrap list (`[[cluster.members]]`) holds a voter, or reuse a
//! node id (one in the membership, or one known to have held the
//! cluster's state: the identity's "joined" set, which outlives removal).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::{Member, Role};
use crate::view::{NodeId, ZoneId};

/// A learner is caught up enough to be promoted when its matched log
/// index is at most this far behind the leader's last log index.
pub const PROMOTE_MAX_LAG: u64 = 64;

/// One operator's membership change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MemberChange {
    /// Add a new member: always first as a learner; a voter or witness is
    /// then promoted once it has caught up.
    Add { member: Member },
    /// Remove a voter or learner.
    Remove { id: NodeId },
    /// Make a learner a voter (or a witness, if it was added as one).
    Promote { id: NodeId },
    /// Change a member's Raft and admin addresses.
    Readdress {
        id: NodeId,
        raft_addr: String,
        admin_addr: String,
    },
}

impl MemberChange {
    pub fn kind(&self) -> &'static str {
        match self {
            MemberChange::Add { .. } => "add",
            MemberChange::Remove { .. } => "remove",
            MemberChange::Promote { .. } => "promote",
            MemberChange::Readdress { .. } => "readdress",
        }
    }
}

/// The rule that refused a membership change. Names are stable snake_case
/// strings (the admin API's error `code`, what `ctl` prints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberRule {
    /// The id is in the membership, or held the cluster's state before.
    NodeIdReused,
    /// No member has this id.
    UnknownMember,
    /// Promote of a member that already votes.
    AlreadyVoter,
    /// Promote of a learner that has not caught up with the leader.
    LearnerBehind,
    /// The new (or current) voters that answer and are caught up would
    /// not be a majority.
    QuorumLoss,
    /// The zone would keep no voter although its bootstrap list has one.
    ZoneNeedsVoter,
    /// The change would leave no voter at all.
    LastVoter,
    /// Another membership change is still in flight (joint config).
    ChangeInProgress,
    /// An empty zone or address, or a role that cannot be added.
    InvalidMember,
}

impl MemberRule {
    pub fn name(self) -> &'static str {
        match self {
            MemberRule::NodeIdReused => "node_id_reused",
            MemberRule::UnknownMember => "unknown_member",
            MemberRule::AlreadyVoter => "already_voter",
            MemberRule::LearnerBehind => "learner_behind",
            MemberRule::QuorumLoss => "quorum_loss",
            MemberRule::ZoneNeedsVoter => "zone_needs_voter",
            MemberRule::LastVoter => "last_voter",
            MemberRule::ChangeInProgress => "membership_change_in_progress",
            MemberRule::InvalidMember => "invalid_member",
        }
    }
}

impl fmt::Display for MemberRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused membership change: the rule and a sentence for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("refused by rule {rule}: {message}")]
pub struct MemberRefusal {
    pub rule: MemberRule,
    pub message: String,
}

fn refuse<T>(rule: MemberRule, message: impl Into<String>) -> Result<T, MemberRefusal> {
    Err(MemberRefusal {
        rule,
        message: message.into(),
    })
}

/// What the leader knows when it judges a change.
#[derive(Clone, Debug, Default)]
pub struct Situation {
    /// Every node of the applied membership, by id.
    pub nodes: BTreeMap<NodeId, Member>,
    /// The voter ids (voters and witnesses) of the applied membership.
    pub voters: BTreeSet<NodeId>,
    /// Whether the applied membership is a joint one (a change in flight).
    pub joint: bool,
    /// Members that answered a probe just now and are caught up (the
    /// leader itself included).
    pub healthy: BTreeSet<NodeId>,
    /// How far each member's matched index is behind the leader's last
    /// log index (`None`: nothing matched yet).
    pub lag: BTreeMap<NodeId, Option<u64>>,
    /// Ids that held the cluster's state at some time (never reused).
    pub retired: BTreeSet<NodeId>,
    /// Zones whose bootstrap list holds a voting member.
    pub zones_needing_voter: BTreeSet<ZoneId>,
}

/// One openraft membership change, in the order to run them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `add_learner` (non-blocking).
    AddLearner(Member),
    /// Wait until the learner's matched index is within
    /// [`PROMOTE_MAX_LAG`], then `AddVoterIds`.
    Promote(NodeId),
    /// `RemoveVoters` (the node leaves entirely).
    RemoveVoter(NodeId),
    /// `RemoveNodes` for a learner.
    RemoveLearner(NodeId),
    /// `SetNodes`: a new record for an existing member.
    SetNode(Member),
}

fn majority(of: usize) -> usize {
    of / 2 + 1
}

impl Situation {
    fn member(&self, id: NodeId) -> Result<&Member, MemberRefusal> {
        self.nodes.get(&id).map_or_else(
            || refuse(MemberRule::UnknownMember, format!("no member has id {id}")),
            Ok,
        )
    }

    /// Refuse unless the healthy members of `voters` are a majority of it.
    fn keeps_quorum(
        &self,
        voters: &BTreeSet<NodeId>,
        healthy: &BTreeSet<NodeId>,
        what: &str,
    ) -> Result<(), MemberRefusal> {
        if voters.is_empty() {
            return refuse(
                MemberRule::LastVoter,
                format!("{what} would leave no voter"),
            );
        }
        let up = voters.intersection(healthy).count();
        if up < majority(voters.len()) {
            let down: Vec<String> = voters
                .difference(healthy)
                .map(|id| id.to_string())
                .collect();
            return refuse(
                MemberRule::QuorumLoss,
                format!(
                    "{what}: voters {voters:?} would need {} answering, caught-up members but have {up} (down or behind: {})",
                    majority(voters.len()),
                    down.join(", ")
                ),
            );
        }
        Ok(())
    }

    /// Whether `change` is safe now, and the steps that carry it out.
    pub fn check(&self, change: &MemberChange) -> Result<Vec<Step>, MemberRefusal> {
        if self.joint {
            return refuse(
                MemberRule::ChangeInProgress,
                "another membership change is still being committed; retry shortly",
            );
        }
        // Joint consensus needs the current voters' majority too.
        self.keeps_quorum(&self.voters, &self.healthy, "the current voters")?;
        match change {
            MemberChange::Add { member } => {
                if member.zone.as_str().is_empty()
                    || member.raft_addr.is_empty()
                    || member.admin_addr.is_empty()
                {
                    return refuse(
                        MemberRule::InvalidMember,
                        "a new member needs a zone, a raft address and an admin address",
                    );
                }
                if self.nodes.contains_key(&member.id) {
                    return refuse(
                        MemberRule::NodeIdReused,
                        format!("node id {} is already a member", member.id),
                    );
                }
                if self.retired.contains(&member.id) {
                    return refuse(
                        MemberRule::NodeIdReused,
                        format!(
                            "node id {} held this cluster's state before; node ids are never reused: pick a new one",
                            member.id
                        ),
                    );
                }
                let mut steps = vec![Step::AddLearner(member.clone())];
                if member.role.votes() {
                    // The new voter is not caught up yet: the others must
                    // carry the quorum of the larger configuration.
                    let mut next = self.voters.clone();
                    next.insert(member.id);
                    let what = format!("adding voter {}", member.id);
                    self.keeps_quorum(&next, &self.healthy, &what)?;
                    steps.push(Step::Promote(member.id));
                }
                Ok(steps)
            }
            MemberChange::Promote { id } => {
                let member = self.member(*id)?;
                if self.voters.contains(id) {
                    return refuse(
                        MemberRule::AlreadyVoter,
                        format!("member {id} already votes"),
                    );
                }
                let lag = self.lag.get(id).copied().flatten();
                if !self.healthy.contains(id) || lag.is_none_or(|l| l > PROMOTE_MAX_LAG) {
                    return refuse(
                        MemberRule::LearnerBehind,
                        format!(
                            "learner {id} ({}) has not caught up (lag {}); promote it once `ctl members` shows it caught up",
                            member.raft_addr,
                            lag.map_or("unknown".into(), |l| l.to_string())
                        ),
                    );
                }
                let mut next = self.voters.clone();
                next.insert(*id);
                self.keeps_quorum(&next, &self.healthy, &format!("promoting {id}"))?;
                let mut steps = vec![Step::Promote(*id)];
                if member.role == Role::Learner {
                    // Its record says what it is (a rejoin restores it).
                    steps.push(Step::SetNode(Member {
                        role: Role::Voter,
                        ..member.clone()
                    }));
                }
                Ok(steps)
            }
            MemberChange::Remove { id } => {
                let member = self.member(*id)?;
                if !self.voters.contains(id) {
                    return Ok(vec![Step::RemoveLearner(*id)]);
                }
                let mut next = self.voters.clone();
                next.remove(id);
                if next.is_empty() {
                    return refuse(
                        MemberRule::LastVoter,
                        format!("member {id} is the last voter"),
                    );
                }
                let zone_keeps_voter = next
                    .iter()
                    .any(|v| self.nodes.get(v).is_some_and(|m| m.zone == member.zone));
                if !zone_keeps_voter && self.zones_needing_voter.contains(&member.zone) {
                    return refuse(
                        MemberRule::ZoneNeedsVoter,
                        format!(
                            "member {id} is the last voter of zone {}, whose topology requires one; add and promote another voter there first",
                            member.zone
                        ),
                    );
                }
                self.keeps_quorum(&next, &self.healthy, &format!("removing voter {id}"))?;
                Ok(vec![Step::RemoveVoter(*id)])
            }
            MemberChange::Readdress {
                id,
                raft_addr,
                admin_addr,
            } => {
                let member = self.member(*id)?;
                if raft_addr.is_empty() || admin_addr.is_empty() {
                    return refuse(
                        MemberRule::InvalidMember,
                        "re-addressing needs a raft address and an admin address",
                    );
                }
                if self.voters.contains(id) {
                    // Until it answers on its new address, it counts as down.
                    let mut healthy = self.healthy.clone();
                    healthy.remove(id);
                    self.keeps_quorum(
                        &self.voters,
                        &healthy,
                        &format!("re-addressing voter {id}"),
                    )?;
                }
                Ok(vec![Step::SetNode(Member {
                    raft_addr: raft_addr.clone(),
                    admin_addr: admin_addr.clone(),
                    ..member.clone()
                })])
            }
        }
    }
}

/// One member as `ctl members` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: NodeId,
    pub zone: ZoneId,
    /// `voter`, `witness` or `learner`, as the applied membership says.
    pub role: Role,
    pub raft_addr: String,
    pub admin_addr: String,
    pub leader: bool,
    /// Last log index known replicated to it (leader only).
    pub matched_index: Option<u64>,
    /// Entries behind the leader's last log index (leader only).
    pub lag: Option<u64>,
}

/// The role the applied membership gives a member: a voter id is a voter
/// (or a witness, if its record says so); any other node is a learner.
pub fn effective_role(record: &Member, votes: bool) -> Role {
    match (votes, record.role) {
        (true, Role::Witness) => Role::Witness,
        (true, _) => Role::Voter,
        (false, _) => Role::Learner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: NodeId, zone: &str) -> Member {
        Member {
            id,
            zone: ZoneId::new(zone),
            raft_addr: format!("127.0.0.1:{}", 7000 + id),
            admin_addr: format!("127.0.0.1:{}", 8000 + id),
            role: Role::Voter,
        }
    }

    /// Three voters in a, b, c (bootstrap zones), all healthy; 5 is a learner in a.
    fn three() -> Situation {
        let nodes: BTreeMap<_, _> = [m(1, "a"), m(2, "b"), m(3, "c"), m(5, "a")]
            .into_iter()
            .map(|m| (m.id, m))
            .collect();
        Situation {
            voters: [1, 2, 3].into(),
            healthy: [1, 2, 3, 5].into(),
            lag: [(1, Some(0)), (2, Some(0)), (3, Some(0)), (5, Some(3))].into(),
            retired: [1, 2, 3, 5, 9].into(),
            zones_needing_voter: [ZoneId::new("a"), ZoneId::new("b"), ZoneId::new("c")].into(),
            nodes,
            joint: false,
        }
    }

    fn rule(s: &Situation, c: MemberChange) -> Option<MemberRule> {
        s.check(&c).err().map(|r| r.rule)
    }

    #[test]
    fn membership_changes_are_checked_against_their_rules() {
        use MemberChange::*;
        use MemberRule::*;
        let s = three();
        let mut joint = three();
        joint.joint = true;
        let mut two_down = three();
        two_down.healthy = [1, 5].into();
        let mut one_down = three();
        one_down.healthy = [1, 2, 5].into();
        let mut five_behind = three();
        five_behind.lag.insert(5, Some(PROMOTE_MAX_LAG + 1));
        let mut four_voters = three();
        four_voters.voters.insert(5);
        let mut four_two_down = four_voters.clone();
        four_two_down.healthy = [1, 5].into();
        let add = |id, role| Add {
            member: Member { role, ..m(id, "a") },
        };
        let readdress = |id| Readdress {
            id,
            raft_addr: "127.0.0.1:1".into(),
            admin_addr: "127.0.0.1:2".into(),
        };
        let cases: Vec<(&str, &Situation, MemberChange, Option<MemberRule>)> = vec![
            ("add learner", &s, add(4, Role::Learner), None),
            ("add voter", &s, add(4, Role::Voter), None),
            (
                "add existing id",
                &s,
                add(5, Role::Learner),
                Some(NodeIdReused),
            ),
            (
                "add retired id",
                &s,
                add(9, Role::Learner),
                Some(NodeIdReused),
            ),
            (
                "in flight",
                &joint,
                add(4, Role::Learner),
                Some(ChangeInProgress),
            ),
            (
                "quorum gone",
                &two_down,
                add(4, Role::Learner),
                Some(QuorumLoss),
            ),
            (
                "voter with one down",
                &one_down,
                add(4, Role::Voter),
                Some(QuorumLoss),
            ),
            ("promote", &s, Promote { id: 5 }, None),
            (
                "promote behind",
                &five_behind,
                Promote { id: 5 },
                Some(LearnerBehind),
            ),
            ("promote voter", &s, Promote { id: 2 }, Some(AlreadyVoter)),
            (
                "promote unknown",
                &s,
                Promote { id: 7 },
                Some(UnknownMember),
            ),
            ("remove learner", &s, Remove { id: 5 }, None),
            (
                "remove zone's last voter",
                &s,
                Remove { id: 2 },
                Some(ZoneNeedsVoter),
            ),
            (
                "remove one of two in a zone",
                &four_voters,
                Remove { id: 1 },
                None,
            ),
            (
                "remove leaves a down majority",
                &four_two_down,
                Remove { id: 1 },
                Some(QuorumLoss),
            ),
            ("readdress learner", &s, readdress(5), None),
            ("readdress voter", &s, readdress(2), None),
            (
                "readdress voter, one down",
                &one_down,
                readdress(2),
                Some(QuorumLoss),
            ),
        ];
        for (name, s, change, want) in cases {
            assert_eq!(rule(s, change), want, "{name}");
        }
    }

    #[test]
    fn the_last_voter_is_never_removed() {
        let mut s = three();
        s.voters = [1].into();
        s.zones_needing_voter.clear();
        assert_eq!(
            rule(&s, MemberChange::Remove { id: 1 }),
            Some(MemberRule::LastVoter)
        );
    }

    #[test]
    fn a_promoted_learner_is_recorded_as_a_voter() {
        let mut s = three();
        s.nodes.get_mut(&5).unwrap().role = Role::Learner;
        let steps = s.check(&MemberChange::Promote { id: 5 }).unwrap();
        let voter = Member {
            role: Role::Voter,
            ..m(5, "a")
        };
        assert_eq!(steps, vec![Step::Promote(5), Step::SetNode(voter)]);
    }

    #[test]
    fn an_added_voter_is_a_learner_first() {
        let member = Member {
            role: Role::Witness,
            ..m(4, "w")
        };
        let steps = three()
            .check(&MemberChange::Add {
                member: member.clone(),
            })
            .unwrap();
        assert_eq!(steps, vec![Step::AddLearner(member), Step::Promote(4)]);
    }
}
