//! The drill's history of the control plane, as every node told it: one
//! tick per poll (each node's term, leader and decision version), the
//! decisions each node holds at the end, and the decisions that were
//! acknowledged during the drill. The checks over it are pure functions,
//! tested on crafted histories (as etcd's robustness tests check theirs).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One node's answer to one poll.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSample {
    pub node: u64,
    /// Whether its admin API answered (a killed, paused or slow node does
    /// not; then the other fields are meaningless).
    pub reachable: bool,
    pub term: u64,
    /// The leader this node believes in.
    pub leader: Option<u64>,
    /// Whether this node believes it leads.
    pub is_leader: bool,
    pub version: u64,
}

impl NodeSample {
    pub fn unreachable(node: u64) -> Self {
        NodeSample {
            node,
            reachable: false,
            term: 0,
            leader: None,
            is_leader: false,
            version: 0,
        }
    }
}

/// Every node's answer to one poll; `t_ms` from the drill's t = 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub t_ms: i64,
    pub nodes: Vec<NodeSample>,
}

/// A decision as a node's history holds it (`GET /admin/v1/decisions`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub version: u64,
    pub kind: String,
    /// The decision itself (e.g. `{"failover":{"from":..,"to":..}}`).
    pub decision: serde_json::Value,
}

/// A decision somebody was told is committed: a `ctl` command's answer,
/// or a decision some node reported in its applied history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    pub version: u64,
    pub kind: String,
    /// The decision, when the acknowledgement says it.
    pub decision: Option<serde_json::Value>,
    /// Who acknowledged it (`ctl step 3`, `node 2's history`).
    pub source: String,
}

/// In one term, more than one node believed it led.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TermViolation {
    pub term: u64,
    pub leaders: Vec<u64>,
}

/// For each term, the nodes that said they led in it (a Raft term has at
/// most one leader; a deposed leader in an older term is no violation).
pub fn leaders_by_term(ticks: &[Tick]) -> BTreeMap<u64, BTreeSet<u64>> {
    let mut by_term: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for s in ticks.iter().flat_map(|t| &t.nodes) {
        if s.reachable && s.is_leader {
            by_term.entry(s.term).or_default().insert(s.node);
        }
    }
    by_term
}

/// Terms with more than `max` leaders.
pub fn leader_violations(ticks: &[Tick], max: usize) -> Vec<TermViolation> {
    leaders_by_term(ticks)
        .into_iter()
        .filter(|(_, l)| l.len() > max)
        .map(|(term, l)| TermViolation {
            term,
            leaders: l.into_iter().collect(),
        })
        .collect()
}

/// The most leaders any term had.
pub fn max_leaders_per_term(ticks: &[Tick]) -> usize {
    leaders_by_term(ticks)
        .values()
        .map(BTreeSet::len)
        .max()
        .unwrap_or(0)
}

/// An acknowledged decision a node does not hold as acknowledged.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lost {
    pub version: u64,
    pub kind: String,
    pub node: u64,
    /// `missing`, or `different: <what the node holds>`.
    pub why: String,
    pub source: String,
}

/// Every acknowledged decision must be in every node's final history, as
/// the same decision at the same version. `finals` maps node → its
/// history; a node absent from it (not asked) is not judged.
pub fn lost_decisions(acks: &[Ack], finals: &BTreeMap<u64, Vec<Held>>) -> Vec<Lost> {
    let mut lost = Vec::new();
    for ack in acks {
        for (node, held) in finals {
            let found = held.iter().find(|h| h.version == ack.version);
            let why = match found {
                None => Some("missing".to_owned()),
                Some(h) if h.kind != ack.kind => Some(format!("different: {} instead", h.kind)),
                Some(h) if ack.decision.as_ref().is_some_and(|d| *d != h.decision) => {
                    Some(format!("different: {} instead", h.decision))
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                lost.push(Lost {
                    version: ack.version,
                    kind: ack.kind.clone(),
                    node: *node,
                    why,
                    source: ack.source.clone(),
                });
            }
        }
    }
    lost
}

/// The first tick at or after `from_ms` in which every node of `nodes`
/// answered and all are on the same decision version: `(t_ms, version)`.
pub fn converged_at(ticks: &[Tick], from_ms: i64, nodes: &[u64]) -> Option<(i64, u64)> {
    ticks.iter().filter(|t| t.t_ms >= from_ms).find_map(|t| {
        let mut versions = BTreeSet::new();
        for id in nodes {
            let s = t.nodes.iter().find(|s| s.node == *id && s.reachable)?;
            versions.insert(s.version);
        }
        (versions.len() == 1).then(|| (t.t_ms, versions.into_iter().next().unwrap_or(0)))
    })
}

/// The first tick at or after `from_ms` in which every node of `nodes`
/// that answered is at `version` or later, and at least one answered.
pub fn applied_everywhere(
    ticks: &[Tick],
    version: u64,
    from_ms: i64,
    nodes: &[u64],
) -> Option<i64> {
    ticks
        .iter()
        .filter(|t| t.t_ms >= from_ms)
        .find(|t| {
            nodes.iter().all(|id| {
                t.nodes
                    .iter()
                    .any(|s| s.node == *id && s.reachable && s.version >= version)
            })
        })
        .map(|t| t.t_ms)
}

/// The first tick at which any node reported `version` or later.
pub fn first_seen(ticks: &[Tick], version: u64) -> Option<i64> {
    ticks
        .iter()
        .find(|t| t.nodes.iter().any(|s| s.reachable && s.version >= version))
        .map(|t| t.t_ms)
}

/// The leader of a tick: the node of the highest term that says it
/// leads.
pub fn leader_of(t: &Tick) -> Option<(u64, u64)> {
    t.nodes
        .iter()
        .filter(|s| s.reachable && s.is_leader)
        .max_by_key(|s| s.term)
        .map(|s| (s.node, s.term))
}

/// Each term any reachable node reported, with when and by whom it was
/// first reported: `term → (t_ms, node)`.
pub fn terms_seen(ticks: &[Tick]) -> BTreeMap<u64, (i64, u64)> {
    let mut out: BTreeMap<u64, (i64, u64)> = BTreeMap::new();
    for t in ticks {
        for s in t.nodes.iter().filter(|s| s.reachable) {
            out.entry(s.term).or_insert((t.t_ms, s.node));
        }
    }
    out
}

/// Every change of leader: `(t_ms, new leader, term)`; ticks without a
/// known leader do not end a leadership.
pub fn leader_changes(ticks: &[Tick]) -> Vec<(i64, u64, u64)> {
    let mut out = Vec::new();
    let mut last: Option<(u64, u64)> = None;
    for t in ticks {
        if let Some(l) = leader_of(t) {
            if last != Some(l) {
                out.push((t.t_ms, l.0, l.1));
                last = Some(l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(node: u64, term: u64, leader: u64, version: u64) -> NodeSample {
        NodeSample {
            node,
            reachable: true,
            term,
            leader: Some(leader),
            is_leader: node == leader,
            version,
        }
    }

    fn tick(t_ms: i64, nodes: Vec<NodeSample>) -> Tick {
        Tick { t_ms, nodes }
    }

    #[test]
    fn two_leaders_in_one_term_are_detected() {
        let ticks = vec![
            tick(0, vec![s(1, 3, 1, 0), s(2, 3, 1, 0), s(3, 3, 1, 0)]),
            // Node 3 also claims term 3: a split brain.
            tick(200, vec![s(1, 3, 1, 0), s(2, 3, 1, 0), s(3, 3, 3, 0)]),
        ];
        assert_eq!(max_leaders_per_term(&ticks), 2);
        assert_eq!(
            leader_violations(&ticks, 1),
            vec![TermViolation {
                term: 3,
                leaders: vec![1, 3]
            }]
        );
    }

    #[test]
    fn a_follower_that_campaigned_on_resume_shows_a_second_term() {
        // Node 3 was paused (unreachable), then campaigned: term 10 → 12.
        let mut gone = s(3, 10, 1, 0);
        gone.reachable = false;
        let steady = vec![
            tick(0, vec![s(1, 10, 1, 0), s(2, 10, 1, 0), s(3, 10, 1, 0)]),
            tick(200, vec![s(1, 10, 1, 0), s(2, 10, 1, 0), gone]),
        ];
        assert_eq!(terms_seen(&steady).keys().collect::<Vec<_>>(), vec![&10]);
        let mut unseated = steady.clone();
        unseated.push(tick(
            400,
            vec![s(1, 10, 1, 0), s(2, 12, 2, 0), s(3, 12, 2, 0)],
        ));
        let terms = terms_seen(&unseated);
        assert_eq!(terms.len(), 2);
        assert_eq!(terms[&12], (400, 2));
    }

    #[test]
    fn a_deposed_leader_in_an_older_term_is_no_violation() {
        // Node 1, cut off, still believes it leads term 3 while node 2
        // leads term 4: two leaders at once, one per term.
        let ticks = vec![tick(0, vec![s(1, 3, 1, 0), s(2, 4, 2, 0), s(3, 4, 2, 0)])];
        assert_eq!(max_leaders_per_term(&ticks), 1);
        assert!(leader_violations(&ticks, 1).is_empty());
        assert_eq!(leader_changes(&ticks), vec![(0, 2, 4)]);
    }

    #[test]
    fn unreachable_nodes_claim_nothing() {
        let mut n = NodeSample::unreachable(3);
        n.is_leader = true;
        n.term = 3;
        let ticks = vec![tick(0, vec![s(1, 3, 1, 0), n])];
        assert_eq!(max_leaders_per_term(&ticks), 1);
    }

    fn held(version: u64, kind: &str, decision: serde_json::Value) -> Held {
        Held {
            version,
            kind: kind.into(),
            decision,
        }
    }

    #[test]
    fn a_lost_acknowledged_decision_is_detected() {
        let fo = json!({"failover": {"from": "az-a", "to": "az-b"}});
        let acks = vec![
            Ack {
                version: 1,
                kind: "failover".into(),
                decision: Some(fo.clone()),
                source: "ctl step 2".into(),
            },
            Ack {
                version: 2,
                kind: "freeze".into(),
                decision: None,
                source: "node 1's history".into(),
            },
        ];
        let mut finals = BTreeMap::new();
        finals.insert(
            1,
            vec![
                held(2, "freeze", json!("freeze")),
                held(1, "failover", fo.clone()),
            ],
        );
        // Node 2 lost version 2; node 3 holds another decision at version 1.
        finals.insert(2, vec![held(1, "failover", fo.clone())]);
        finals.insert(
            3,
            vec![
                held(2, "freeze", json!("freeze")),
                held(
                    1,
                    "failover",
                    json!({"failover": {"from": "az-a", "to": "az-c"}}),
                ),
            ],
        );
        let lost = lost_decisions(&acks, &finals);
        assert_eq!(lost.len(), 2, "{lost:?}");
        assert_eq!((lost[0].version, lost[0].node), (1, 3));
        assert!(lost[0].why.starts_with("different"), "{lost:?}");
        assert_eq!(
            (lost[1].version, lost[1].node, lost[1].why.as_str()),
            (2, 2, "missing")
        );
        // Everything everywhere: nothing lost.
        finals.insert(2, finals[&1].clone());
        finals.insert(3, finals[&1].clone());
        assert!(lost_decisions(&acks, &finals).is_empty());
    }

    #[test]
    fn nodes_that_never_converge_are_detected() {
        let ticks: Vec<Tick> = (0..20)
            .map(|i| tick(i * 200, vec![s(1, 2, 1, 3), s(2, 2, 1, 3), s(3, 2, 1, 2)]))
            .collect();
        assert_eq!(converged_at(&ticks, 0, &[1, 2, 3]), None);
        assert_eq!(applied_everywhere(&ticks, 3, 0, &[1, 2, 3]), None);
        // Node 3 catching up at 4.2 s converges the cluster then.
        let mut healed = ticks.clone();
        healed.push(tick(
            4200,
            vec![s(1, 2, 1, 3), s(2, 2, 1, 3), s(3, 2, 1, 3)],
        ));
        assert_eq!(converged_at(&healed, 1000, &[1, 2, 3]), Some((4200, 3)));
        assert_eq!(applied_everywhere(&healed, 3, 0, &[1, 2, 3]), Some(4200));
        assert_eq!(first_seen(&healed, 3), Some(0));
    }

    #[test]
    fn a_silent_node_is_not_converged() {
        let ticks = vec![tick(0, vec![s(1, 2, 1, 3), NodeSample::unreachable(2)])];
        assert_eq!(converged_at(&ticks, 0, &[1, 2]), None);
        assert_eq!(converged_at(&ticks, 0, &[1]), Some((0, 3)));
    }
}
