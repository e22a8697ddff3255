//! The Raft entry payload ([`Command`]) and what applying one yields
//! ([`Outcome`], with a named [`RejectRule`] when a safety rule refuses it).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::view::ZoneId;

/// A change to the replicated decisions. Open for later variants (quota
/// rebalance, automatic failover); each variant has a stable [`kind`] name.
///
/// [`kind`]: Decision::kind
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Move the traffic homed in `from` to `to`.
    Failover { from: ZoneId, to: ZoneId },
    /// Give a failed-over zone its own traffic back.
    Failback { zone: ZoneId },
    /// Stop automatic decisions; operators still decide.
    Freeze,
    /// Allow automatic decisions again.
    Unfreeze,
}

impl Decision {
    /// Stable snake_case name, used in history, metrics labels and the CLI.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Failover { .. } => "failover",
            Decision::Failback { .. } => "failback",
            Decision::Freeze => "freeze",
            Decision::Unfreeze => "unfreeze",
        }
    }

    /// The zones this decision names, in the order it names them.
    pub fn zones(&self) -> Vec<ZoneId> {
        match self {
            Decision::Failover { from, to } => vec![from.clone(), to.clone()],
            Decision::Failback { zone } => vec![zone.clone()],
            Decision::Freeze | Decision::Unfreeze => Vec::new(),
        }
    }
}

/// One Raft log entry's payload. Everything `apply` needs is inside it
/// (including the leader's wall clock), so applying is deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    Decide {
        decision: Decision,
        /// Who asked: a token name, `detector`, a test name.
        actor: String,
        /// Why, in the asker's words.
        reason: String,
        /// Milliseconds since the Unix epoch, stamped by the leader when it
        /// proposed the entry. `apply` never reads a clock.
        at_ms: u64,
        /// Compare-and-set: apply only while the decision version still is
        /// this one.
        if_version: Option<u64>,
        /// What the proposer saw (e.g. zone scores), kept in the history.
        evidence: Option<String>,
    },
}

impl Command {
    /// A decision by `actor` with a reason, no CAS, no evidence; `at_ms` is
    /// stamped by the leader on propose.
    pub fn decide(decision: Decision, actor: impl Into<String>, reason: impl Into<String>) -> Self {
        Command::Decide {
            decision,
            actor: actor.into(),
            reason: reason.into(),
            at_ms: 0,
            if_version: None,
            evidence: None,
        }
    }

    /// The same command with compare-and-set on `version`.
    pub fn if_version(mut self, version: u64) -> Self {
        match &mut self {
            Command::Decide { if_version, .. } => *if_version = Some(version),
        }
        self
    }

    /// The same command carrying `evidence`.
    pub fn with_evidence(mut self, text: impl Into<String>) -> Self {
        match &mut self {
            Command::Decide { evidence, .. } => *evidence = Some(text.into()),
        }
        self
    }

    /// The same command stamped with the leader's clock.
    pub fn stamped(mut self, now_ms: u64) -> Self {
        match &mut self {
            Command::Decide { at_ms, .. } => *at_ms = now_ms,
        }
        self
    }

    /// Stable name of what the command does (the decision's kind).
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Decide { decision, .. } => decision.kind(),
        }
    }
}

/// The safety rule that refused a command. Names are stable snake_case
/// strings: the CLI prints them, scripts and metrics match on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectRule {
    /// `if_version` no longer matches the decision version.
    StaleVersion,
    /// The decision names a zone the cluster does not know.
    UnknownZone,
    /// A failover from a zone to itself.
    SameZone,
    /// The decision would leave no zone serving its own traffic.
    LastServingZone,
    /// The failover target is failed over or draining.
    TargetNotActive,
    /// The zone is already failed over; fail it back first.
    AlreadyFailedOver,
    /// A failback of a zone that is not failed over.
    NotFailedOver,
    /// Freeze while automation is already frozen.
    AlreadyFrozen,
    /// Unfreeze while automation is not frozen.
    NotFrozen,
}

impl RejectRule {
    /// The stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            RejectRule::StaleVersion => "stale_version",
            RejectRule::UnknownZone => "unknown_zone",
            RejectRule::SameZone => "same_zone",
            RejectRule::LastServingZone => "last_serving_zone",
            RejectRule::TargetNotActive => "target_not_active",
            RejectRule::AlreadyFailedOver => "already_failed_over",
            RejectRule::NotFailedOver => "not_failed_over",
            RejectRule::AlreadyFrozen => "already_frozen",
            RejectRule::NotFrozen => "not_frozen",
        }
    }
}

impl fmt::Display for RejectRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A refusal: which rule, and a sentence for the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("refused by rule {rule}: {message}")]
pub struct Rejection {
    pub rule: RejectRule,
    pub message: String,
}

impl Rejection {
    pub(crate) fn new(rule: RejectRule, message: impl Into<String>) -> Self {
        Self {
            rule,
            message: message.into(),
        }
    }
}

/// What applying one command did. Identical on every node, because `apply`
/// is deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The decision took effect as `version`.
    Applied { version: u64 },
    /// A safety rule refused it; nothing changed.
    Rejected { rule: RejectRule, message: String },
}

impl From<Rejection> for Outcome {
    fn from(r: Rejection) -> Self {
        Outcome::Rejected {
            rule: r.rule,
            message: r.message,
        }
    }
}

/// The Raft response type (`C::R`): the outcome of a command entry, `None`
/// for Raft's own blank and membership entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub outcome: Option<Outcome>,
}
