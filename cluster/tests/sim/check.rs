//! The safety checker: a pure function from one run's history to the rules
//! it broke. Safety is asserted (every violation fails the seed); liveness
//! (time to converge after the faults heal) is measured and must stay
//! within a generous bound.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub type NodeId = u64;

/// One applied decision as the checker compares it: its version and what
/// identifies it (kind, actor, reason, the leader's stamp), and what the
/// dwell and freeze rules need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub version: u64,
    pub kind: String,
    pub key: String,
    /// Decided by the leader's automation (detector, rebalancer), not an
    /// operator.
    pub auto: bool,
    /// The zones whose status it changed.
    pub zones: Vec<String>,
    /// When its leader stamped it, on the simulation's true clock (ms);
    /// `None` when unknown (no stamp, or two stamps match its record).
    pub stamp_ms: Option<u64>,
}

/// What the client was told: committed and applied as this version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ack {
    /// A zone decision (failover, failback, freeze, unfreeze); `reason`
    /// is unique per operation, `if_version` its compare-and-set guard.
    Decision {
        reason: String,
        version: u64,
        if_version: Option<u64>,
    },
    /// A replicated config, applied as `config_version`.
    Config { config_version: u64, toml: String },
}

/// One node's quota allocation table of one tenant and unit under one
/// applied view: what its nodes' allocations add up to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaSeen {
    pub node: NodeId,
    pub version: u64,
    pub tenant: String,
    pub unit: &'static str,
    pub sum: u64,
    pub global: u64,
}

/// Everything one run recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// `(term, node)`: `node` reported itself leader in `term`, in the
    /// order the nodes reported it.
    pub leaders: Vec<(u64, NodeId)>,
    /// When each `(term, node)` leadership was first reported, in
    /// simulated ms.
    pub leader_ms: BTreeMap<(u64, NodeId), u64>,
    /// `(node, incarnation, decision version)`, in the order the node
    /// applied them.
    pub versions: Vec<(NodeId, u32, u64)>,
    /// `(node, incarnation)`: that incarnation started on a wiped data
    /// directory (rejoining), so its versions start again from 0.
    pub wiped: BTreeSet<(NodeId, u32)>,
    pub acks: Vec<Ack>,
    /// Each node's applied decision log at the end (both histories).
    pub finals: BTreeMap<NodeId, Vec<Entry>>,
    /// Each node's config history at the end: version → TOML.
    pub final_configs: BTreeMap<NodeId, BTreeMap<u64, String>>,
    pub quota: Vec<QuotaSeen>,
    /// Simulated ms from the heal until every node applied the same log
    /// and a client write committed; `None`: not within the bound.
    pub converged_ms: Option<u64>,
    pub convergence_bound_ms: u64,
    /// The automatic decisions' dwell (`[failover] dwell`), ms.
    pub dwell_ms: u64,
    /// `(log index, node, boot, mono ms)`: the leader clock of every
    /// applied command that carried one (decisions, configs, ticks), in
    /// log order.
    pub applied: Vec<(u64, NodeId, u64, u64)>,
}

/// A broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// openraft's leader id is `(term, node id)`, ordered: a later leader
    /// in one term must have the higher node id (see `one_leader_per_vote`).
    LeaderIdWentBack {
        term: u64,
        earlier: NodeId,
        later: NodeId,
    },
    AckLost {
        node: NodeId,
        reason: String,
        version: u64,
        found: Option<String>,
    },
    Diverged {
        version: u64,
        a: NodeId,
        b: NodeId,
    },
    VersionWentBack {
        node: NodeId,
        from: u64,
        to: u64,
    },
    StaleCas {
        reason: String,
        if_version: u64,
        version: u64,
        between: u64,
    },
    ConfigLost {
        node: NodeId,
        config_version: u64,
    },
    QuotaOverGlobal(QuotaSeen),
    /// An automatic decision committed while automation was frozen.
    AutomaticWhileFrozen {
        version: u64,
        kind: String,
        frozen_at: u64,
    },
    /// An automatic decision changed a zone less than the dwell after the
    /// decision that changed it before, by the true clock at the stamps.
    DwellCut {
        zone: String,
        version: u64,
        after: u64,
        gap_ms: u64,
        dwell_ms: u64,
    },
    /// A leader process's commands applied out of the order it stamped
    /// them: the one at log `index` was stamped before the one at
    /// `earlier`, which it follows.
    StampOrder {
        node: NodeId,
        index: u64,
        earlier: u64,
        mono_ms: u64,
        earlier_mono_ms: u64,
    },
    NoConvergence {
        bound_ms: u64,
    },
    /// The run itself panicked (a node could not start or stop).
    Panicked(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LeaderIdWentBack {
                term,
                earlier,
                later,
            } => write!(
                f,
                "node {later} became leader in term {term} after node {earlier} had: a lower leader id won later"
            ),
            Violation::AckLost {
                node,
                reason,
                version,
                found,
            } => write!(
                f,
                "acknowledged decision {reason:?} (version {version}) is not in node {node}'s applied log (found there: {found:?})"
            ),
            Violation::Diverged { version, a, b } => {
                write!(f, "nodes {a} and {b} applied different decisions as version {version}")
            }
            Violation::VersionWentBack { node, from, to } => {
                write!(f, "node {node}'s decision version went back from {from} to {to}")
            }
            Violation::StaleCas {
                reason,
                if_version,
                version,
                between,
            } => write!(
                f,
                "compare-and-set {reason:?} made against version {if_version} succeeded as version {version}, but zone decision {between} came between"
            ),
            Violation::ConfigLost {
                node,
                config_version,
            } => write!(
                f,
                "acknowledged config version {config_version} is not in node {node}'s config history"
            ),
            Violation::QuotaOverGlobal(q) => write!(
                f,
                "node {} at version {}: tenant {}'s {} allocations sum to {} over its global quota {}",
                q.node, q.version, q.tenant, q.unit, q.sum, q.global
            ),
            Violation::AutomaticWhileFrozen {
                version,
                kind,
                frozen_at,
            } => write!(
                f,
                "automatic {kind} committed as version {version} while automation was frozen (since version {frozen_at})"
            ),
            Violation::DwellCut {
                zone,
                version,
                after,
                gap_ms,
                dwell_ms,
            } => write!(
                f,
                "automatic decision {version} changed zone {zone} {gap_ms} ms after decision {after} did (dwell {dwell_ms} ms, true clock at the leaders' stamps)"
            ),
            Violation::StampOrder {
                node,
                index,
                earlier,
                mono_ms,
                earlier_mono_ms,
            } => write!(
                f,
                "node {node}'s command at log index {index} (stamped at {mono_ms} ms on its clock) applied after its command at index {earlier} (stamped later, at {earlier_mono_ms} ms)"
            ),
            Violation::Panicked(what) => write!(f, "the run panicked: {what}"),
            Violation::NoConvergence { bound_ms } => write!(
                f,
                "the nodes did not converge (same applied log, a write committed, no member still rejoining) within {bound_ms} ms of the heal"
            ),
        }
    }
}

/// Every rule `h` breaks, in a stable order.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    one_leader_per_vote(h, &mut out);
    acks_kept(h, &mut out);
    logs_agree(h, &mut out);
    versions_monotonic(h, &mut out);
    cas_never_stale(h, &mut out);
    quota_within_global(h, &mut out);
    freeze_holds(h, &mut out);
    dwell_holds(h, &mut out);
    stamp_order(h, &mut out);
    if h.converged_ms.is_none_or(|ms| ms > h.convergence_bound_ms) {
        out.push(Violation::NoConvergence {
            bound_ms: h.convergence_bound_ms,
        });
    }
    out
}

/// At most one leader per vote. openraft 0.9 built without its
/// `single-term-leader` feature (as here) identifies a leader by
/// `(term, node id)`, compared in that order, and a voter grants only a
/// vote at least as high as the last it granted: two candidates may each
/// win the same term in turn (seed 199 found it), but only in increasing
/// node-id order, and each `(term, node)` leads once. A lower id winning
/// a term after a higher one would mean a quorum granted a lower vote.
/// A node's leadership is reported when its metrics are published, which
/// may wait for a storage write (the new leader's first entry): two
/// leaderships of one term reported within [`REPORT_SLACK_MS`] of each
/// other may have crossed (seed 2005193: node 4 led term 10 before node 5
/// by openraft's own log, but was reported after it).
fn one_leader_per_vote(h: &History, out: &mut Vec<Violation>) {
    let mut highest: BTreeMap<u64, NodeId> = BTreeMap::new();
    let mut seen: BTreeSet<(u64, NodeId)> = BTreeSet::new();
    let crossed = |term: u64, a: NodeId, b: NodeId| match (
        h.leader_ms.get(&(term, a)),
        h.leader_ms.get(&(term, b)),
    ) {
        (Some(x), Some(y)) => y.saturating_sub(*x) < REPORT_SLACK_MS,
        _ => false,
    };
    for (term, node) in &h.leaders {
        if !seen.insert((*term, *node)) {
            continue;
        }
        match highest.get(term) {
            Some(earlier) if earlier > node && !crossed(*term, *earlier, *node) => {
                out.push(Violation::LeaderIdWentBack {
                    term: *term,
                    earlier: *earlier,
                    later: *node,
                })
            }
            _ => {
                highest.insert(*term, *node);
            }
        }
    }
}

/// How far apart (simulated ms) two leaderships' reports may cross.
pub const REPORT_SLACK_MS: u64 = 1_000;

fn at(log: &[Entry], version: u64) -> Option<&Entry> {
    log.iter().find(|e| e.version == version)
}

fn acks_kept(h: &History, out: &mut Vec<Violation>) {
    for ack in &h.acks {
        match ack {
            Ack::Decision {
                reason, version, ..
            } => {
                for (node, log) in &h.finals {
                    let found = at(log, *version);
                    if found.is_none_or(|e| !e.key.contains(&format!("|{reason}|"))) {
                        out.push(Violation::AckLost {
                            node: *node,
                            reason: reason.clone(),
                            version: *version,
                            found: found.map(|e| e.key.clone()),
                        });
                    }
                }
            }
            Ack::Config {
                config_version,
                toml,
            } => {
                for (node, configs) in &h.final_configs {
                    if configs.get(config_version) != Some(toml) {
                        out.push(Violation::ConfigLost {
                            node: *node,
                            config_version: *config_version,
                        });
                    }
                }
            }
        }
    }
}

/// Same version, same decision, on every pair of nodes (each log is a
/// prefix of the longer one where both still hold entries).
fn logs_agree(h: &History, out: &mut Vec<Violation>) {
    let nodes: Vec<(&NodeId, &Vec<Entry>)> = h.finals.iter().collect();
    for (i, (a, la)) in nodes.iter().enumerate() {
        for (b, lb) in nodes.iter().skip(i + 1) {
            for e in la.iter() {
                if let Some(f) = at(lb, e.version) {
                    if f.key != e.key {
                        out.push(Violation::Diverged {
                            version: e.version,
                            a: **a,
                            b: **b,
                        });
                    }
                }
            }
        }
    }
    let mut configs: BTreeMap<u64, (NodeId, &String)> = BTreeMap::new();
    for (node, history) in &h.final_configs {
        for (v, toml) in history {
            match configs.get(v) {
                Some((other, t)) if *t != toml => out.push(Violation::Diverged {
                    version: *v,
                    a: *other,
                    b: *node,
                }),
                Some(_) => {}
                None => {
                    configs.insert(*v, (*node, toml));
                }
            }
        }
    }
}

/// A node never shows a lower decision version than it showed before,
/// across restarts too (the store persists the applied state before it
/// publishes the view), except once its data directory was wiped.
fn versions_monotonic(h: &History, out: &mut Vec<Violation>) {
    let mut last: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut lives: BTreeMap<NodeId, u32> = BTreeMap::new();
    for (node, incarnation, version) in &h.versions {
        // A wiped node starts over (and rejoins through the leader).
        let new_life = lives.insert(*node, *incarnation) != Some(*incarnation);
        if new_life && h.wiped.contains(&(*node, *incarnation)) {
            last.remove(node);
        }
        if let Some(prev) = last.insert(*node, *version) {
            if *version < prev {
                out.push(Violation::VersionWentBack {
                    node: *node,
                    from: prev,
                    to: *version,
                });
            }
        }
    }
}

/// A compare-and-set against version `v` that succeeded as `w`: nothing
/// but quota rebalances came between (the rule `stale_version`).
fn cas_never_stale(h: &History, out: &mut Vec<Violation>) {
    for ack in &h.acks {
        let Ack::Decision {
            reason,
            version,
            if_version: Some(v),
        } = ack
        else {
            continue;
        };
        let between = h
            .finals
            .values()
            .flat_map(|log| log.iter())
            .filter(|e| e.version > *v && e.version < *version)
            .find(|e| e.kind != "quota_rebalance")
            .map(|e| e.version);
        let stale = if *version <= *v { Some(*v) } else { between };
        if let Some(between) = stale {
            out.push(Violation::StaleCas {
                reason: reason.clone(),
                if_version: *v,
                version: *version,
                between,
            });
        }
    }
}

/// The committed decision history: every node's final log merged by
/// version (where they differ, `logs_agree` reports it).
pub fn committed(h: &History) -> BTreeMap<u64, &Entry> {
    let mut all = BTreeMap::new();
    for log in h.finals.values() {
        for e in log {
            all.entry(e.version).or_insert(e);
        }
    }
    all
}

/// Automation frozen means no automatic decision commits: none between a
/// committed freeze and the next unfreeze, and automation never freezes
/// or unfreezes itself.
fn freeze_holds(h: &History, out: &mut Vec<Violation>) {
    let mut frozen_at = None;
    for (version, e) in committed(h) {
        match e.kind.as_str() {
            "freeze" | "unfreeze" if e.auto => out.push(Violation::AutomaticWhileFrozen {
                version,
                kind: e.kind.clone(),
                frozen_at: frozen_at.unwrap_or(version),
            }),
            _ if e.auto => {
                if let Some(frozen_at) = frozen_at {
                    out.push(Violation::AutomaticWhileFrozen {
                        version,
                        kind: e.kind.clone(),
                        frozen_at,
                    });
                }
            }
            _ => {}
        }
        match e.kind.as_str() {
            "freeze" => frozen_at = Some(version),
            "unfreeze" => frozen_at = None,
            _ => {}
        }
    }
}

/// An automatic decision changes a zone only the dwell after the last
/// decision (operator's or automatic) that changed it, measured between
/// the two leaders' stamps on the simulation's true clock: no clock skew
/// or jump of any node, and no leader change, may shorten it. A decision
/// whose stamp is unknown ends the comparison for its zones.
fn dwell_holds(h: &History, out: &mut Vec<Violation>) {
    let mut last: BTreeMap<&str, (u64, Option<u64>)> = BTreeMap::new();
    for (version, e) in committed(h) {
        for zone in &e.zones {
            if let (true, Some((after, Some(then))), Some(now)) =
                (e.auto, last.get(zone.as_str()), e.stamp_ms)
            {
                let gap_ms = now.saturating_sub(*then);
                if gap_ms < h.dwell_ms {
                    out.push(Violation::DwellCut {
                        zone: zone.clone(),
                        version,
                        after: *after,
                        gap_ms,
                        dwell_ms: h.dwell_ms,
                    });
                }
            }
            last.insert(zone, (version, e.stamp_ms));
        }
    }
}

/// A leader process's commands apply in the order it stamped them
/// (decisions, configs and ticks alike). The dwell clock reads each
/// command at the newest stamp of its leader applied so far
/// (`state::DwellClock`): one applied after a later-stamped one of the
/// same leader is measured at that later stamp, and its dwell may pass
/// early. `Proposer::write` stamps under a lock held until Raft has the
/// entry so that this holds.
fn stamp_order(h: &History, out: &mut Vec<Violation>) {
    let mut last: BTreeMap<(NodeId, u64), (u64, u64)> = BTreeMap::new();
    for &(index, node, boot, mono) in &h.applied {
        if let Some(&(earlier, earlier_mono)) = last.get(&(node, boot)) {
            if mono < earlier_mono {
                out.push(Violation::StampOrder {
                    node,
                    index,
                    earlier,
                    mono_ms: mono,
                    earlier_mono_ms: earlier_mono,
                });
                continue;
            }
        }
        last.insert((node, boot), (index, mono));
    }
}

fn quota_within_global(h: &History, out: &mut Vec<Violation>) {
    for q in &h.quota {
        if q.sum > q.global {
            out.push(Violation::QuotaOverGlobal(q.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: u64, kind: &str, reason: &str) -> Entry {
        Entry {
            version,
            kind: kind.into(),
            key: format!("{kind}|sim|{reason}|0"),
            auto: false,
            zones: Vec::new(),
            stamp_ms: Some(version * 1000),
        }
    }

    /// `e` as an automatic decision changing `zones`, stamped at `at` ms.
    fn auto(mut e: Entry, zones: &[&str], at: u64) -> Entry {
        e.auto = true;
        e.zones = zones.iter().map(|z| z.to_string()).collect();
        e.stamp_ms = Some(at);
        e
    }

    fn set_log(h: &mut History, log: Vec<Entry>) {
        for l in h.finals.values_mut() {
            *l = log.clone();
        }
    }

    /// Three nodes that agree, one leader per term, two acknowledged
    /// decisions (one a compare-and-set across a rebalance), a config,
    /// quotas within bounds, converged quickly.
    fn good() -> History {
        let log = vec![
            entry(1, "freeze", "op-1"),
            entry(2, "quota_rebalance", "rebalance"),
            entry(3, "failover", "op-2"),
        ];
        let configs: BTreeMap<u64, String> = [(1, "a".to_string())].into();
        History {
            leaders: vec![(1, 1), (1, 1), (2, 2), (3, 2)],
            leader_ms: BTreeMap::new(),
            versions: vec![(1, 0, 0), (1, 0, 1), (1, 1, 1), (1, 1, 3), (2, 0, 3)],
            acks: vec![
                Ack::Decision {
                    reason: "op-1".into(),
                    version: 1,
                    if_version: None,
                },
                Ack::Decision {
                    reason: "op-2".into(),
                    version: 3,
                    if_version: Some(1),
                },
                Ack::Config {
                    config_version: 1,
                    toml: "a".into(),
                },
            ],
            finals: [(1, log.clone()), (2, log.clone()), (3, log[..2].to_vec())].into(),
            final_configs: [(1, configs.clone()), (2, configs.clone()), (3, configs)].into(),
            quota: vec![QuotaSeen {
                node: 1,
                version: 2,
                tenant: "t".into(),
                unit: "rpm",
                sum: 100,
                global: 100,
            }],
            converged_ms: Some(1500),
            convergence_bound_ms: 30_000,
            // Node 1's stamps in order, then node 2's.
            applied: vec![(2, 1, 5, 100), (3, 1, 5, 150), (4, 2, 6, 20)],
            wiped: BTreeSet::new(),
            dwell_ms: 10_000,
        }
    }

    #[test]
    fn a_good_history_breaks_no_rule() {
        let mut h = good();
        // Node 3 lags by one (a prefix): still fine, except that the
        // acknowledged op-2 must be everywhere at the end.
        h.finals.insert(3, h.finals[&1].clone());
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_lower_leader_id_winning_a_term_after_a_higher_one_is_caught() {
        let mut h = good();
        h.finals.insert(3, h.finals[&1].clone());
        // Node 3 after node 2 in term 2 is a higher vote: allowed.
        h.leaders.push((2, 3));
        assert_eq!(check(&h), vec![]);
        // Reports within the slack may have crossed.
        h.leader_ms.insert((2, 3), 5_000);
        h.leader_ms.insert((2, 1), 5_000 + REPORT_SLACK_MS - 1);
        h.leaders.push((2, 1));
        assert_eq!(check(&h), vec![]);
        // Node 1 after node 3 in term 2, a second later, is not allowed.
        h.leader_ms.insert((2, 1), 5_000 + REPORT_SLACK_MS);
        assert_eq!(
            check(&h),
            vec![Violation::LeaderIdWentBack {
                term: 2,
                earlier: 3,
                later: 1
            }]
        );
    }

    #[test]
    fn an_acknowledged_decision_missing_or_replaced_on_a_node_is_caught() {
        let h = good();
        // Node 3 lacks version 3 at the end.
        assert!(matches!(
            check(&h).as_slice(),
            [Violation::AckLost {
                node: 3,
                version: 3,
                found: None,
                ..
            }]
        ));
        let mut h = good();
        let mut other = h.finals[&1].clone();
        other[2] = entry(3, "failback", "op-9");
        h.finals.insert(3, other);
        let v = check(&h);
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::AckLost { node: 3, .. })),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::Diverged { version: 3, .. })),
            "{v:?}"
        );
    }

    #[test]
    fn diverging_logs_are_caught_even_without_an_ack() {
        let mut h = good();
        h.acks.clear();
        let mut other = h.finals[&1].clone();
        other[0] = entry(1, "unfreeze", "op-7");
        h.finals.insert(2, other);
        assert_eq!(
            check(&h),
            vec![
                Violation::Diverged {
                    version: 1,
                    a: 1,
                    b: 2
                },
                Violation::Diverged {
                    version: 1,
                    a: 2,
                    b: 3
                }
            ]
        );
    }

    #[test]
    fn a_version_going_back_even_across_a_restart_is_caught() {
        let mut h = good();
        h.finals.insert(3, h.finals[&1].clone());
        h.versions.push((1, 2, 2));
        assert_eq!(
            check(&h),
            vec![Violation::VersionWentBack {
                node: 1,
                from: 3,
                to: 2
            }]
        );
    }

    #[test]
    fn a_compare_and_set_across_a_zone_decision_is_caught() {
        let mut h = good();
        h.finals.insert(3, h.finals[&1].clone());
        for log in h.finals.values_mut() {
            log[1] = entry(2, "failback", "op-3");
        }
        assert_eq!(
            check(&h),
            vec![Violation::StaleCas {
                reason: "op-2".into(),
                if_version: 1,
                version: 3,
                between: 2
            }]
        );
    }

    #[test]
    fn a_lost_config_over_quota_and_no_convergence_are_caught() {
        let mut h = good();
        h.finals.insert(3, h.finals[&1].clone());
        h.final_configs.insert(2, BTreeMap::new());
        h.quota[0].sum = 101;
        h.converged_ms = None;
        let v = check(&h);
        assert!(v.contains(&Violation::ConfigLost {
            node: 2,
            config_version: 1
        }));
        assert!(v
            .iter()
            .any(|v| matches!(v, Violation::QuotaOverGlobal(q) if q.sum == 101)));
        assert!(v.contains(&Violation::NoConvergence { bound_ms: 30_000 }));
        assert_eq!(v.len(), 3, "{v:?}");
    }

    #[test]
    fn a_wiped_node_starting_over_from_version_zero_is_no_violation() {
        let mut h = good();
        h.finals.insert(3, h.finals[&1].clone());
        // Node 1 at 3, then its data directory wiped: incarnation 2 starts
        // from 0 and catches up.
        h.versions.extend([(1, 2, 0), (1, 2, 3)]);
        h.wiped.insert((1, 2));
        assert_eq!(check(&h), vec![]);
        // Going back within the wiped incarnation still counts.
        h.versions.push((1, 2, 1));
        assert_eq!(
            check(&h),
            vec![Violation::VersionWentBack {
                node: 1,
                from: 3,
                to: 1
            }]
        );
    }

    #[test]
    fn an_automatic_decision_while_frozen_is_caught() {
        let mut h = good();
        h.acks.clear();
        let good_log = vec![
            entry(1, "freeze", "op-1"),
            entry(2, "unfreeze", "op-2"),
            auto(entry(3, "failover", "zone bad"), &["az-a"], 3_000),
            auto(entry(4, "quota_rebalance", "drift"), &[], 4_000),
        ];
        set_log(&mut h, good_log.clone());
        assert_eq!(check(&h), vec![]);
        // The rebalance committed before the unfreeze.
        let mut bad = good_log.clone();
        bad[1] = auto(entry(2, "quota_rebalance", "drift"), &[], 2_000);
        bad[3] = entry(4, "unfreeze", "op-2");
        set_log(&mut h, bad);
        assert_eq!(
            check(&h),
            vec![
                Violation::AutomaticWhileFrozen {
                    version: 2,
                    kind: "quota_rebalance".into(),
                    frozen_at: 1
                },
                Violation::AutomaticWhileFrozen {
                    version: 3,
                    kind: "failover".into(),
                    frozen_at: 1
                }
            ]
        );
        // Automation never freezes itself.
        let mut bad = good_log;
        bad[0] = auto(entry(1, "freeze", "op-1"), &[], 1_000);
        set_log(&mut h, bad);
        assert_eq!(
            check(&h),
            vec![Violation::AutomaticWhileFrozen {
                version: 1,
                kind: "freeze".into(),
                frozen_at: 1
            }]
        );
    }

    #[test]
    fn an_automatic_decision_within_the_dwell_of_the_last_on_its_zone_is_caught() {
        let mut h = good();
        h.acks.clear();
        let mut op = entry(1, "failover", "op-1");
        op.zones = vec!["az-a".into(), "az-b".into()];
        op.stamp_ms = Some(5_000);
        // An operator failover, then automatic decisions: on another zone
        // at once, on az-a a whole dwell later (a rebalance between
        // changes no zone), then az-b only 9.999 s after the operator.
        let log = vec![
            op,
            auto(entry(2, "failover", "zone bad"), &["az-c"], 5_001),
            auto(entry(3, "quota_rebalance", "drift"), &[], 6_000),
            auto(entry(4, "failback", "zone well"), &["az-a"], 15_000),
            auto(entry(5, "failback", "zone well"), &["az-b"], 14_999),
        ];
        set_log(&mut h, log.clone());
        assert_eq!(
            check(&h),
            vec![Violation::DwellCut {
                zone: "az-b".into(),
                version: 5,
                after: 1,
                gap_ms: 9_999,
                dwell_ms: 10_000
            }]
        );
        // Automatic after automatic on one zone counts too; a stamp
        // earlier than the last one's is a gap of zero, not a wrap.
        let mut log = log[..4].to_vec();
        log.push(auto(entry(5, "failover", "zone bad"), &["az-c"], 4_000));
        set_log(&mut h, log.clone());
        assert_eq!(
            check(&h),
            vec![Violation::DwellCut {
                zone: "az-c".into(),
                version: 5,
                after: 2,
                gap_ms: 0,
                dwell_ms: 10_000
            }]
        );
        // An operator may act within the dwell; an unknown stamp ends the
        // comparison for its zones.
        log[4] = entry(5, "failover", "op-5");
        log[4].zones = vec!["az-c".into()];
        log[4].stamp_ms = None;
        log.push(auto(entry(6, "failback", "zone well"), &["az-c"], 6_000));
        set_log(&mut h, log);
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_leader_s_commands_applied_out_of_stamp_order_are_caught() {
        let mut h = good();
        h.acks.clear();
        // Node 1's process 7 in order (a repeated reading is in order),
        // then node 2 (another clock: its stamps may be anything), then
        // node 1's process 7 again, stamped before its last: caught.
        // Another process of node 1 is another clock.
        h.applied = vec![
            (3, 1, 7, 1_000),
            (4, 1, 7, 1_000),
            (5, 2, 9, 500),
            (6, 1, 7, 999),
            (7, 1, 8, 10),
            (8, 1, 7, 1_001),
        ];
        assert_eq!(
            check(&h),
            vec![Violation::StampOrder {
                node: 1,
                index: 6,
                earlier: 4,
                mono_ms: 999,
                earlier_mono_ms: 1_000
            }]
        );
    }
}
