//! What a step does (`Action`) and what it acts on: node, backend and
//! partition selectors, and the conditions `wait_for` waits for.

use std::fmt;
use std::time::Duration;

use super::fmt_dur;

/// Which node a step acts on, resolved when the step runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSel {
    Id(u64),
    /// The node the others name as leader when the step runs.
    Leader,
    /// Any running node that is not the leader.
    Follower,
    /// The (first) node of a zone.
    Zone(String),
}

impl fmt::Display for NodeSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeSel::Id(id) => write!(f, "node {id}"),
            NodeSel::Leader => f.write_str("the leader"),
            NodeSel::Follower => f.write_str("a follower"),
            NodeSel::Zone(z) => write!(f, "the node of {z}"),
        }
    }
}

/// Which mock backends a fault step acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSel {
    Names(Vec<String>),
    Zone(String),
}

impl fmt::Display for BackendSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSel::Names(n) => write!(f, "backends {}", n.join(", ")),
            BackendSel::Zone(z) => write!(f, "every backend of {z}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Both,
    /// Messages from the first group to the second are dropped; the other
    /// way still flows (and so do the answers to it).
    OneWay,
}

/// How a partition names its sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionSel {
    /// Two groups of node ids.
    Groups(Vec<u64>, Vec<u64>),
    /// One node against all others.
    Isolate(NodeSel),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// A committed decision (of `kind`, touching `zone`) newer than the
    /// drill's start.
    Decision {
        kind: Option<String>,
        zone: Option<String>,
    },
    /// A leader other than the one when the step started.
    LeaderChange,
    /// Every running node names the same leader.
    Leader,
    /// Every running node on the same decision version.
    Converged,
    /// Every running node at least at this version.
    Version(u64),
}

#[derive(Clone, Debug)]
pub enum Action {
    BackendFault {
        target: BackendSel,
        faults: serde_json::Map<String, serde_json::Value>,
        /// Restore after this long (else at the end of the drill).
        for_: Option<Duration>,
    },
    /// Puts the named backends' faults back to what they were before the
    /// drill.
    BackendRestore {
        target: BackendSel,
    },
    Kill {
        node: NodeSel,
    },
    Pause {
        node: NodeSel,
        for_: Option<Duration>,
    },
    /// Resumes `node`, or every paused node.
    Resume {
        node: Option<NodeSel>,
    },
    /// Restarts `node` (SIGTERM, wait, start on the same data), or starts
    /// every killed node again.
    Restart {
        node: Option<NodeSel>,
    },
    Partition {
        sides: PartitionSel,
        direction: Direction,
        for_: Option<Duration>,
    },
    Heal,
    /// `zonegate ctl --admin <node> --token <t> --json ARGS`.
    Ctl {
        args: Vec<String>,
        node: Option<NodeSel>,
        expect_exit: Option<i32>,
    },
    WaitFor {
        condition: Condition,
        timeout: Duration,
    },
    /// The clients that send to `from`'s node send to `to`'s node from
    /// now on (as a DNS or load-balancer change after a failover moves
    /// them); `to == from` moves them back.
    MoveClients {
        from: String,
        to: String,
    },
}

impl Action {
    /// The zone this step takes out of service when it names one: a
    /// fault on a zone's backends, `ctl failover --from ZONE`, or a kill
    /// or pause of a zone's node. (Backends named one by one are mapped to
    /// their zones by the run; nodes named by id or role are not counted.)
    pub fn zone_out(&self) -> Option<&str> {
        match self {
            Action::BackendFault {
                target: BackendSel::Zone(z),
                ..
            } => Some(z),
            Action::Kill {
                node: NodeSel::Zone(z),
            }
            | Action::Pause {
                node: NodeSel::Zone(z),
                ..
            } => Some(z),
            Action::Ctl { args, .. } if args.first().is_some_and(|a| a == "failover") => {
                args.iter().enumerate().find_map(|(i, a)| {
                    a.strip_prefix("--from=").or_else(|| {
                        (a == "--from")
                            .then(|| args.get(i + 1).map(String::as_str))
                            .flatten()
                    })
                })
            }
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Action::BackendFault { .. } => "backend_fault",
            Action::BackendRestore { .. } => "backend_restore",
            Action::Kill { .. } => "kill",
            Action::Pause { .. } => "pause",
            Action::Resume { .. } => "resume",
            Action::Restart { .. } => "restart",
            Action::Partition { .. } => "partition",
            Action::Heal => "heal",
            Action::Ctl { .. } => "ctl",
            Action::WaitFor { .. } => "wait_for",
            Action::MoveClients { .. } => "move_clients",
        }
    }

    /// Whether the step injects a fault (the clock of
    /// `failover_committed_within` starts at the first one).
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::BackendFault { .. }
                | Action::Kill { .. }
                | Action::Pause { .. }
                | Action::Partition { .. }
        )
    }

    /// One line for plans and timelines.
    pub fn describe(&self) -> String {
        match self {
            Action::BackendFault {
                target,
                faults,
                for_,
            } => format!(
                "backend_fault {} on {target}{}",
                serde_json::Value::Object(faults.clone()),
                for_.map(|d| format!(" for {}", fmt_dur(d)))
                    .unwrap_or_default()
            ),
            Action::BackendRestore { target } => format!("backend_restore {target}"),
            Action::Kill { node } => format!("kill -9 {node}"),
            Action::Pause { node, for_ } => format!(
                "pause (SIGSTOP) {node}{}",
                for_.map(|d| format!(" for {}", fmt_dur(d)))
                    .unwrap_or_default()
            ),
            Action::Resume { node } => match node {
                Some(n) => format!("resume (SIGCONT) {n}"),
                None => "resume every paused node".into(),
            },
            Action::Restart { node } => match node {
                Some(n) => format!("restart {n}"),
                None => "start every killed node again".into(),
            },
            Action::Partition {
                sides,
                direction,
                for_,
            } => {
                let sides = match sides {
                    PartitionSel::Groups(a, b) => format!("{a:?} | {b:?}"),
                    PartitionSel::Isolate(n) => format!("{n} | the rest"),
                };
                format!(
                    "partition {sides} ({}){}",
                    match direction {
                        Direction::Both => "both ways",
                        Direction::OneWay => "one way",
                    },
                    for_.map(|d| format!(" for {}", fmt_dur(d)))
                        .unwrap_or_default()
                )
            }
            Action::Heal => "heal every partition".into(),
            Action::Ctl { args, node, .. } => format!(
                "ctl {}{}",
                args.join(" "),
                node.as_ref()
                    .map(|n| format!(" (via {n})"))
                    .unwrap_or_default()
            ),
            Action::WaitFor { condition, timeout } => {
                format!("wait_for {condition:?} (up to {})", fmt_dur(*timeout))
            }
            Action::MoveClients { from, to } if from == to => {
                format!("move_clients of {from} back to {from}")
            }
            Action::MoveClients { from, to } => {
                format!("move_clients of {from} to {to}")
            }
        }
    }
}
