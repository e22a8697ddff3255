//! The Raft entry payload ([`Command`]) and what applying one yields
//! ([`Outcome`], with a named [`RejectRule`] when a safety rule refuses it).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::budget::BudgetTable;
use crate::quota::{NodeWeights, QuotaWeights};
use crate::view::{NodeId, ZoneId};

/// A change to the replicated decisions. Open for later variants (quota
/// rebalance); each variant has a stable [`kind`] name. Who decided
/// (operator or detector) is the [`Command`]'s business, not the decision's.
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
    /// Format 2's quota rebalance: node weights only (tenant → node →
    /// parts per million of its group), zones split by share. Still
    /// applied from old logs; leaders now write [`Decision::Rebalance`].
    /// Appended last, so the bincode indices of the variants above stay
    /// as they were.
    QuotaRebalance { weights: NodeWeights },
    /// The replicated routing config (the cluster-wide TOML sections) as
    /// its version `config_version`: applied only as the next config
    /// version (compare-and-set by construction). Configs have their own
    /// versions and history: they take no decision version and no entry
    /// in the decision history. Appended last, like `QuotaRebalance`.
    Config {
        config_version: u64,
        toml: std::sync::Arc<str>,
    },
    /// The leader's quota rebalance (format 3): per tenant, zone weights
    /// (parts per million of the global quota, by demand with a floor per
    /// zone) and node weights (parts per million of their group). Kind
    /// `quota_rebalance`, like the format-2 form. Takes a decision version
    /// (the data plane recomputes allocations per version) but is kept in
    /// its own history, so rebalances never evict zone decisions.
    Rebalance { weights: QuotaWeights },
    /// The leader's clock tick (format 3): changes nothing but the dwell
    /// clock (see `state::DwellClock`); takes no decision version and no
    /// history record. A new leader ticks while a dwell runs so the time
    /// it measures counts from its first stamp.
    Tick,
    /// The leader's rebalance with budgets (format 4): the quota weights
    /// as [`Decision::Rebalance`] carries them, and every budgeted
    /// tenant's grants per period and node with the spend recorded
    /// (`crate::budget`). Kind `quota_rebalance`; written instead of
    /// `Rebalance` while some tenant has a budget. Appended last.
    RebalanceWithBudgets {
        weights: QuotaWeights,
        budgets: BudgetTable,
    },
}

impl Decision {
    /// Stable snake_case name, used in history, metrics labels and the CLI.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Failover { .. } => "failover",
            Decision::Failback { .. } => "failback",
            Decision::Freeze => "freeze",
            Decision::Unfreeze => "unfreeze",
            Decision::QuotaRebalance { .. }
            | Decision::Rebalance { .. }
            | Decision::RebalanceWithBudgets { .. } => "quota_rebalance",
            Decision::Config { .. } => "config",
            Decision::Tick => "tick",
        }
    }

    /// The zones this decision names, in the order it names them.
    pub fn zones(&self) -> Vec<ZoneId> {
        match self {
            Decision::Failover { from, to } => vec![from.clone(), to.clone()],
            Decision::Failback { zone } => vec![zone.clone()],
            Decision::Freeze
            | Decision::Unfreeze
            | Decision::QuotaRebalance { .. }
            | Decision::Rebalance { .. }
            | Decision::RebalanceWithBudgets { .. }
            | Decision::Config { .. }
            | Decision::Tick => Vec::new(),
        }
    }

    /// Whether this is a quota rebalance (either form): no zone changes,
    /// and its own history.
    pub fn is_rebalance(&self) -> bool {
        matches!(
            self,
            Decision::QuotaRebalance { .. }
                | Decision::Rebalance { .. }
                | Decision::RebalanceWithBudgets { .. }
        )
    }
}

/// Which leader's clock stamped a command, and its monotonic reading: the
/// dwell clock adds the time between two stamps of one leader process
/// (`node`, `boot`), and nothing across a change of leader or process, so
/// no skew between two leaders' clocks can shorten a dwell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderClock {
    /// The stamping leader.
    pub node: NodeId,
    /// Its process: a value drawn once per process start.
    pub boot: u64,
    /// Milliseconds on that process's monotonic clock (never steps with
    /// the wall clock).
    pub mono_ms: u64,
}

impl LeaderClock {
    /// Whether `other` was read on the same process's clock.
    pub fn same_clock(&self, other: &LeaderClock) -> bool {
        self.node == other.node && self.boot == other.boot
    }
}

/// Who made a decision. Automatic decisions face extra safety rules
/// (`automation_frozen`, `dwell_time`, `auto_failover_limit`,
/// `operator_decided`, `not_automatable`); operators' decisions do not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A person or script through the admin API (the default, so history
    /// JSON written before origins existed reads as operator decisions).
    #[default]
    Operator,
    /// The leader's detector.
    Automatic,
}

impl Origin {
    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Operator => "operator",
            Origin::Automatic => "automatic",
        }
    }
}

/// The limits an automatic decision is checked against. The proposer stamps
/// them into the command so that `apply` never reads local config: every
/// node checks the same numbers even if their config files differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoLimits {
    /// At most this many zones failed over automatically at one time.
    pub max_auto_failed_over: u32,
    /// Minimum time between an automatic decision on a zone and the
    /// previous decision (automatic or operator) on that zone, in ms.
    pub dwell_ms: u64,
}

impl Default for AutoLimits {
    fn default() -> Self {
        Self {
            max_auto_failed_over: 1,
            dwell_ms: 60_000,
        }
    }
}

/// One Raft log entry's payload. Everything `apply` needs is inside it
/// (including the leader's wall clock), so applying is deterministic.
///
/// Wire note: [`Command::Auto`] is a variant appended after
/// [`Command::Decide`], so operator entries keep their bincode bytes and
/// their JSON shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// An operator's decision.
    Decide {
        decision: Decision,
        /// Who asked: a token name, a test name.
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
    /// An automatic decision by the leader's detector: the same fields, plus
    /// the limits it is checked against.
    Auto {
        decision: Decision,
        /// `detector:<node id>`.
        actor: String,
        reason: String,
        at_ms: u64,
        /// The decision version the detector assessed; an operator decision
        /// in between makes the automatic one stale.
        if_version: Option<u64>,
        /// The per-period evidence (JSON of [`crate::detect::Evidence`]).
        evidence: Option<String>,
        limits: AutoLimits,
    },
    /// Either of the above as the leader proposes it since format 3: the
    /// same fields, `limits` set for an automatic decision, plus the
    /// leader's [`LeaderClock`] for the dwell rules. Appended last, so
    /// entries of the variants above keep their bytes.
    Stamped(Box<Stamped>),
}

/// The fields of [`Command::Stamped`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamped {
    pub decision: Decision,
    pub actor: String,
    pub reason: String,
    /// The leader's wall clock (ms since the Unix epoch).
    pub at_ms: u64,
    pub if_version: Option<u64>,
    pub evidence: Option<String>,
    /// `Some` for an automatic decision (see [`Command::Auto`]).
    pub limits: Option<AutoLimits>,
    pub clock: LeaderClock,
}

/// A command's fields, borrowed, whatever its variant.
pub struct Fields<'a> {
    pub decision: &'a Decision,
    pub actor: &'a str,
    pub reason: &'a str,
    pub at_ms: u64,
    pub if_version: Option<u64>,
    pub evidence: Option<&'a str>,
    /// `Some` for an automatic decision.
    pub limits: Option<&'a AutoLimits>,
    /// `Some` when the leader stamped its clock (format 3).
    pub clock: Option<LeaderClock>,
}

/// The most bytes a command's `reason` may hold.
pub const MAX_REASON_BYTES: usize = 1024;
/// The most bytes a command's `actor` may hold.
pub const MAX_ACTOR_BYTES: usize = 128;
/// The most bytes a command's `evidence` may hold (the detector's JSON of
/// at most [`crate::detect::MAX_EVIDENCE_PERIODS`] periods fits).
pub const MAX_EVIDENCE_BYTES: usize = 16 * 1024;
/// The most bytes a zone name in a decision may hold.
pub const MAX_ZONE_BYTES: usize = 64;
/// The most (tenant, node) weights a quota rebalance may carry, and the
/// most bytes of a tenant name in it: with the other bounds an entry stays
/// far below its decode limit.
pub const MAX_QUOTA_WEIGHTS: usize = 16 * 1024;
pub const MAX_TENANT_BYTES: usize = 128;
/// The most bytes a replicated config may hold.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

impl Command {
    /// Check the bounds that keep every entry small, so a log entry and an
    /// append batch always fit their decode limits and a lagging follower
    /// can always catch up. Pure; checked on the leader before a command
    /// is proposed (and by dry runs), never in `apply`, so entries written
    /// before these bounds still apply the same everywhere.
    pub fn validate(&self) -> Result<(), Rejection> {
        let Fields {
            decision,
            actor,
            reason,
            evidence,
            ..
        } = self.fields();
        let zones = decision.zones();
        let fields = [
            ("reason", reason.len(), MAX_REASON_BYTES),
            ("actor", actor.len(), MAX_ACTOR_BYTES),
        ]
        .into_iter()
        .chain(
            evidence
                .as_ref()
                .map(|e| ("evidence", e.len(), MAX_EVIDENCE_BYTES)),
        )
        .chain(
            zones
                .iter()
                .map(|z| ("zone name", z.as_str().len(), MAX_ZONE_BYTES)),
        );
        for (field, len, max) in fields {
            if len > max {
                return Err(Rejection::new(
                    RejectRule::TooLong,
                    format!("{field} is {len} bytes; at most {max} are allowed"),
                ));
            }
        }
        if let Decision::Config { toml, .. } = decision {
            if toml.len() > MAX_CONFIG_BYTES {
                return Err(Rejection::new(
                    RejectRule::TooLong,
                    format!(
                        "the config is {} bytes; at most {MAX_CONFIG_BYTES} are allowed",
                        toml.len()
                    ),
                ));
            }
        }
        let tenants: Vec<(&String, usize)> =
            match decision {
                Decision::QuotaRebalance { weights } => {
                    weights.iter().map(|(t, w)| (t, w.len())).collect()
                }
                Decision::Rebalance { weights } => weights
                    .iter()
                    .map(|(t, w)| (t, w.zones.len() + w.nodes.len()))
                    .collect(),
                Decision::RebalanceWithBudgets { weights, budgets } => weights
                    .iter()
                    .map(|(t, w)| (t, w.zones.len() + w.nodes.len()))
                    .chain(budgets.iter().map(|(t, lines)| {
                        (t, lines.values().map(|l| l.nodes.len()).sum::<usize>())
                    }))
                    .collect(),
                _ => Vec::new(),
            };
        if !tenants.is_empty() {
            let n: usize = tenants.iter().map(|(_, n)| n).sum();
            if n > MAX_QUOTA_WEIGHTS {
                return Err(Rejection::new(
                    RejectRule::TooLong,
                    format!("{n} quota weights; at most {MAX_QUOTA_WEIGHTS} are allowed"),
                ));
            }
            if let Some((t, _)) = tenants.iter().find(|(t, _)| t.len() > MAX_TENANT_BYTES) {
                return Err(Rejection::new(
                    RejectRule::TooLong,
                    format!(
                        "tenant name is {} bytes; at most {MAX_TENANT_BYTES} are allowed",
                        t.len()
                    ),
                ));
            }
        }
        Ok(())
    }

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

    /// An automatic decision checked against `limits`; `at_ms` is stamped by
    /// the leader on propose.
    pub fn automatic(
        decision: Decision,
        actor: impl Into<String>,
        reason: impl Into<String>,
        limits: AutoLimits,
    ) -> Self {
        Command::Auto {
            decision,
            actor: actor.into(),
            reason: reason.into(),
            at_ms: 0,
            if_version: None,
            evidence: None,
            limits,
        }
    }

    /// The same command with compare-and-set on `version`.
    pub fn if_version(mut self, version: u64) -> Self {
        match &mut self {
            Command::Decide { if_version, .. } | Command::Auto { if_version, .. } => {
                *if_version = Some(version)
            }
            Command::Stamped(s) => s.if_version = Some(version),
        }
        self
    }

    /// The same command carrying `evidence`.
    pub fn with_evidence(mut self, text: impl Into<String>) -> Self {
        match &mut self {
            Command::Decide { evidence, .. } | Command::Auto { evidence, .. } => {
                *evidence = Some(text.into())
            }
            Command::Stamped(s) => s.evidence = Some(text.into()),
        }
        self
    }

    /// The same command stamped with the leader's wall clock only (the
    /// format-2 shape: the dwell rules then compare wall clocks alone).
    pub fn stamped(mut self, now_ms: u64) -> Self {
        match &mut self {
            Command::Decide { at_ms, .. } | Command::Auto { at_ms, .. } => *at_ms = now_ms,
            Command::Stamped(s) => s.at_ms = now_ms,
        }
        self
    }

    /// The same command as the leader proposes it: stamped with its wall
    /// clock `now_ms` and its [`LeaderClock`].
    pub fn clocked(self, now_ms: u64, clock: LeaderClock) -> Self {
        let f = self.fields();
        Command::Stamped(Box::new(Stamped {
            decision: f.decision.clone(),
            actor: f.actor.to_owned(),
            reason: f.reason.to_owned(),
            at_ms: now_ms,
            if_version: f.if_version,
            evidence: f.evidence.map(str::to_owned),
            limits: f.limits.copied(),
            clock,
        }))
    }

    /// The leader's clock tick (see [`Decision::Tick`]); stamped on
    /// propose like any command.
    pub fn tick(actor: impl Into<String>) -> Self {
        Command::automatic(Decision::Tick, actor, "dwell clock", AutoLimits::default())
    }

    /// Every field, borrowed.
    pub fn fields(&self) -> Fields<'_> {
        match self {
            Command::Decide {
                decision,
                actor,
                reason,
                at_ms,
                if_version,
                evidence,
            } => Fields {
                decision,
                actor,
                reason,
                at_ms: *at_ms,
                if_version: *if_version,
                evidence: evidence.as_deref(),
                limits: None,
                clock: None,
            },
            Command::Auto {
                decision,
                actor,
                reason,
                at_ms,
                if_version,
                evidence,
                limits,
            } => Fields {
                decision,
                actor,
                reason,
                at_ms: *at_ms,
                if_version: *if_version,
                evidence: evidence.as_deref(),
                limits: Some(limits),
                clock: None,
            },
            Command::Stamped(s) => Fields {
                decision: &s.decision,
                actor: &s.actor,
                reason: &s.reason,
                at_ms: s.at_ms,
                if_version: s.if_version,
                evidence: s.evidence.as_deref(),
                limits: s.limits.as_ref(),
                clock: Some(s.clock),
            },
        }
    }

    /// Stable name of what the command does (the decision's kind).
    pub fn kind(&self) -> &'static str {
        self.decision().kind()
    }

    /// The decision the command carries.
    pub fn decision(&self) -> &Decision {
        self.fields().decision
    }

    /// Who asked, why, and when (the leader's clock).
    pub fn provenance(&self) -> (&str, &str, u64) {
        let f = self.fields();
        (f.actor, f.reason, f.at_ms)
    }

    /// Operator or automatic.
    pub fn origin(&self) -> Origin {
        match self.fields().limits {
            None => Origin::Operator,
            Some(_) => Origin::Automatic,
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
    // Rules for automatic decisions only. Appended so the bincode indices
    // of the rules above stay as they were.
    /// Automation is frozen: only operators decide.
    AutomationFrozen,
    /// An automatic decision within the dwell time of the previous
    /// automatic decision on the same zone.
    DwellTime,
    /// An automatic failover while the configured number of zones is
    /// already failed over automatically.
    AutoFailoverLimit,
    /// An automatic decision that would override an operator's decision on
    /// the same zone.
    OperatorDecided,
    /// A decision kind that only operators make (freeze, unfreeze).
    NotAutomatable,
    /// A field is longer than its bound (see [`Command::validate`]).
    /// Checked before proposing, never in `apply`.
    TooLong,
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
            RejectRule::AutomationFrozen => "automation_frozen",
            RejectRule::DwellTime => "dwell_time",
            RejectRule::AutoFailoverLimit => "auto_failover_limit",
            RejectRule::OperatorDecided => "operator_decided",
            RejectRule::NotAutomatable => "not_automatable",
            RejectRule::TooLong => "too_long",
        }
    }
}

impl RejectRule {
    /// Every rule, in declaration order (for tables, docs and metrics).
    pub const ALL: [RejectRule; 15] = [
        RejectRule::StaleVersion,
        RejectRule::UnknownZone,
        RejectRule::SameZone,
        RejectRule::LastServingZone,
        RejectRule::TargetNotActive,
        RejectRule::AlreadyFailedOver,
        RejectRule::NotFailedOver,
        RejectRule::AlreadyFrozen,
        RejectRule::NotFrozen,
        RejectRule::AutomationFrozen,
        RejectRule::DwellTime,
        RejectRule::AutoFailoverLimit,
        RejectRule::OperatorDecided,
        RejectRule::NotAutomatable,
        RejectRule::TooLong,
    ];
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

#[cfg(test)]
mod tests {
    use super::*;

    fn with(reason: usize, actor: usize, evidence: Option<usize>, zone: usize) -> Command {
        let cmd = Command::decide(
            Decision::Failback {
                zone: ZoneId::new(&"z".repeat(zone)),
            },
            "a".repeat(actor),
            "r".repeat(reason),
        );
        match evidence {
            Some(n) => cmd.with_evidence("e".repeat(n)),
            None => cmd,
        }
    }

    #[test]
    fn commands_are_bounded_field_by_field() {
        // (reason, actor, evidence, zone name) lengths, and the field refused.
        let cases = [
            (1024, 128, Some(16 * 1024), 64, None),
            (0, 0, None, 1, None),
            (1025, 1, None, 4, Some("reason is 1025 bytes")),
            (1, 129, None, 4, Some("actor is 129 bytes")),
            (
                1,
                1,
                Some(16 * 1024 + 1),
                4,
                Some("evidence is 16385 bytes"),
            ),
            (1, 1, None, 65, Some("zone name is 65 bytes")),
            (2 * 1024 * 1024, 1, None, 4, Some("reason is 2097152 bytes")),
        ];
        for (reason, actor, evidence, zone, refused) in cases {
            let got = with(reason, actor, evidence, zone).validate();
            match refused {
                None => assert_eq!(got, Ok(()), "{reason} {actor} {evidence:?} {zone}"),
                Some(text) => {
                    let r = got.expect_err(text);
                    assert_eq!(r.rule, RejectRule::TooLong);
                    assert!(r.message.starts_with(text), "{}", r.message);
                }
            }
        }
    }

    #[test]
    fn rule_names_are_unique_and_stable() {
        let names: std::collections::BTreeSet<_> =
            RejectRule::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), RejectRule::ALL.len());
        assert_eq!(RejectRule::TooLong.name(), "too_long");
    }
}
