//! The replicated cluster state and the pure rules that change it.
//!
//! Architecture Invariant: [`ClusterState::apply`] reads no clock and does no
//! I/O. Every node applies the same committed commands in the same order and
//! so reaches the same state, the same versions and the same refusals.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

use crate::budget::BudgetTable;
use crate::command::{
    AutoLimits, Command, Decision, Fields, LeaderClock, Origin, Outcome, RejectRule, Rejection,
};
use crate::quota::{from_node_weights, NodeWeights, QuotaWeights};
use crate::view::{Automation, ClusterView, ZoneId, ZoneStatus};

/// How many zone decisions (failover, failback, freeze, unfreeze) the
/// history keeps (oldest dropped first). Rebalances have their own.
pub const HISTORY_LIMIT: usize = 1000;
/// How many quota rebalances their history keeps (oldest dropped first):
/// fewer, as each carries a whole weight table.
pub const REBALANCE_HISTORY_LIMIT: usize = 100;
/// How many replicated config versions are kept (oldest dropped first).
pub const CONFIG_HISTORY_LIMIT: usize = 50;

/// One version of the replicated routing config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigRecord {
    pub version: u64,
    /// The cluster-wide TOML sections, as validated on the leader.
    pub toml: Arc<str>,
    pub actor: String,
    pub reason: String,
    pub at_ms: u64,
}

/// One applied decision, as kept in the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// The decision version this decision produced.
    pub version: u64,
    /// The decision's stable kind name (`failover`, `failback`, ...).
    pub kind: String,
    pub decision: Decision,
    /// Every zone whose status changed, in zone order.
    pub zones: Vec<ZoneId>,
    pub reason: String,
    pub actor: String,
    /// The leader's wall clock when it proposed, ms since the Unix epoch.
    pub at_ms: u64,
    pub evidence: Option<String>,
    /// Operator or automatic (JSON written before origins existed reads as
    /// operator).
    #[serde(default)]
    pub origin: Origin,
}

/// Who last touched a zone, as the automatic-decision rules need it.
/// Replicated with the state, so every node checks the same facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneControl {
    /// The dwell clock ([`DwellClock`]) at the last applied automatic
    /// decision that changed this zone; `None` when that decision carried
    /// no leader clock (format 2). Format 3.
    pub last_auto_dwell: Option<u64>,
    /// Likewise for the last operator decision. Format 3.
    pub last_operator_dwell: Option<u64>,
    /// While the zone is failed over: who failed it over. Zones re-targeted
    /// because they pointed at a failed-over zone keep their original
    /// origin (re-targeting is a consequence, not a new decision).
    pub failed_over_by: Option<Origin>,
    /// `at_ms` of the last applied automatic decision that changed this
    /// zone's status.
    pub last_auto_ms: Option<u64>,
    /// `at_ms` of the last applied operator decision that changed this
    /// zone's status.
    pub last_operator_ms: Option<u64>,
}

/// [`ZoneControl`] as format versions 0 to 2 laid it out.
#[derive(Deserialize)]
pub(crate) struct ZoneControlV2 {
    failed_over_by: Option<Origin>,
    last_auto_ms: Option<u64>,
    last_operator_ms: Option<u64>,
}

impl From<ZoneControlV2> for ZoneControl {
    fn from(v: ZoneControlV2) -> Self {
        Self {
            last_auto_dwell: None,
            last_operator_dwell: None,
            failed_over_by: v.failed_over_by,
            last_auto_ms: v.last_auto_ms,
            last_operator_ms: v.last_operator_ms,
        }
    }
}

/// The cluster's dwell clock: milliseconds that some leader measured on its
/// own monotonic clock between two of its own stamps ([`LeaderClock`]),
/// summed over the applied commands. Time between one leader process's
/// last stamp and another's first counts as zero, so a leader change or a
/// clock skew between leaders can only lengthen a dwell, never shorten
/// it. Deterministic: it moves only by the stamps in applied commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DwellClock {
    /// The clock's reading after the last stamped command applied.
    pub elapsed_ms: u64,
    /// The latest stamp of the leader process that stamped last.
    pub last: Option<LeaderClock>,
}

impl DwellClock {
    /// The reading at a command stamped `clock`: the last reading plus the
    /// time since the last stamp when the same process stamped both (a
    /// stamp older than the latest adds nothing), else the last reading.
    pub fn at(&self, clock: &LeaderClock) -> u64 {
        match self.last {
            Some(last) if last.same_clock(clock) => self
                .elapsed_ms
                .saturating_add(clock.mono_ms.saturating_sub(last.mono_ms)),
            _ => self.elapsed_ms,
        }
    }

    /// Move to the reading at `clock` (see [`DwellClock::at`]).
    fn advance(&mut self, clock: &LeaderClock) {
        self.elapsed_ms = self.at(clock);
        self.last = Some(match self.last {
            Some(last) if last.same_clock(clock) && last.mono_ms >= clock.mono_ms => last,
            _ => *clock,
        });
    }
}

/// One zone's status before and after a decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneChange {
    pub zone: ZoneId,
    pub before: ZoneStatus,
    pub after: ZoneStatus,
}

/// What a command would do if applied now: the `--dry-run` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preview {
    /// The decision version it would produce.
    pub version: u64,
    pub kind: String,
    /// Zones that would change status, in zone order. A failover also lists
    /// the zones re-targeted because they pointed at the failed-over zone.
    pub changes: Vec<ZoneChange>,
    /// The automation switch afterwards.
    pub automation: Automation,
}

/// The replicated control-plane state: zone status, decision version,
/// automation switch, bounded decision history.
///
/// Decoding follows the format version of the bytes being decoded
/// (`codec::decoding_version`): the layouts of versions 0–1
/// (`ClusterStateV1`) and 2 (`ClusterStateV2`) convert into this one,
/// also where a state sits inside another stored value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClusterState {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    /// Zone decisions (failover, failback, freeze, unfreeze), oldest
    /// first, at most [`HISTORY_LIMIT`]: rebalances never evict them.
    history: VecDeque<DecisionRecord>,
    /// Per-zone facts for the automatic-decision rules; a zone without an
    /// entry has never been changed by a decision.
    control: BTreeMap<ZoneId, ZoneControl>,
    /// The last quota rebalance's weights (empty before the first): the
    /// data plane splits each tenant's quota over zones and nodes by them.
    /// Format 2 held node weights only (zones then split by share).
    quota: Arc<QuotaWeights>,
    /// The replicated routing config's versions, newest last (at most
    /// [`CONFIG_HISTORY_LIMIT`]); empty before the first. Added in format
    /// version 2.
    config: VecDeque<ConfigRecord>,
    /// Quota rebalances, oldest first, at most
    /// [`REBALANCE_HISTORY_LIMIT`]. Format 3 (before, they shared
    /// `history`).
    rebalances: VecDeque<DecisionRecord>,
    /// The version of the last zone decision (0 before any): a zone
    /// decision's `if_version` still holds at any version from it on,
    /// since only rebalances came after. Format 3.
    zone_version: u64,
    /// The dwell clock. Format 3.
    dwell: DwellClock,
    /// The last rebalance's budget grants (`crate::budget`); empty before
    /// the first. Format 4.
    budgets: Arc<BudgetTable>,
}

/// [`ClusterState`]'s current layout, as derived; see its `Deserialize`.
#[derive(Deserialize)]
struct ClusterStateV4 {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    history: VecDeque<DecisionRecord>,
    control: BTreeMap<ZoneId, ZoneControl>,
    quota: Arc<QuotaWeights>,
    config: VecDeque<ConfigRecord>,
    rebalances: VecDeque<DecisionRecord>,
    zone_version: u64,
    dwell: DwellClock,
    #[serde(default)]
    budgets: Arc<BudgetTable>,
}

impl From<ClusterStateV4> for ClusterState {
    fn from(v: ClusterStateV4) -> Self {
        Self {
            zones: v.zones,
            decision_version: v.decision_version,
            automation: v.automation,
            history: v.history,
            control: v.control,
            quota: v.quota,
            config: v.config,
            rebalances: v.rebalances,
            zone_version: v.zone_version,
            dwell: v.dwell,
            budgets: v.budgets,
        }
    }
}

/// [`ClusterState`] as format version 3 laid it out (before budgets).
#[derive(Deserialize)]
struct ClusterStateV3 {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    history: VecDeque<DecisionRecord>,
    control: BTreeMap<ZoneId, ZoneControl>,
    quota: Arc<QuotaWeights>,
    config: VecDeque<ConfigRecord>,
    rebalances: VecDeque<DecisionRecord>,
    zone_version: u64,
    dwell: DwellClock,
}

impl From<ClusterStateV3> for ClusterState {
    fn from(v: ClusterStateV3) -> Self {
        Self {
            zones: v.zones,
            decision_version: v.decision_version,
            automation: v.automation,
            history: v.history,
            control: v.control,
            quota: v.quota,
            config: v.config,
            rebalances: v.rebalances,
            zone_version: v.zone_version,
            dwell: v.dwell,
            budgets: Arc::default(),
        }
    }
}

impl<'de> Deserialize<'de> for ClusterState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            return ClusterStateV4::deserialize(d).map(Self::from);
        }
        match crate::codec::decoding_version() {
            0 | 1 => ClusterStateV1::deserialize(d).map(Self::from),
            2 => ClusterStateV2::deserialize(d).map(Self::from),
            3 => ClusterStateV3::deserialize(d).map(Self::from),
            _ => ClusterStateV4::deserialize(d).map(Self::from),
        }
    }
}

/// [`ClusterState`] as format versions 0 and 1 laid it out (before quota
/// weights).
#[derive(Deserialize)]
pub(crate) struct ClusterStateV1 {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    history: VecDeque<DecisionRecord>,
    control: BTreeMap<ZoneId, ZoneControlV2>,
}

impl From<ClusterStateV1> for ClusterState {
    fn from(v: ClusterStateV1) -> Self {
        ClusterStateV2 {
            zones: v.zones,
            decision_version: v.decision_version,
            automation: v.automation,
            history: v.history,
            control: v.control,
            quota: NodeWeights::new(),
            config: VecDeque::new(),
        }
        .into()
    }
}

/// [`ClusterState`] as format version 2 laid it out: one history shared by
/// zone decisions and rebalances, node weights only, no dwell clock.
#[derive(Deserialize)]
pub(crate) struct ClusterStateV2 {
    zones: BTreeMap<ZoneId, ZoneStatus>,
    decision_version: u64,
    automation: Automation,
    history: VecDeque<DecisionRecord>,
    control: BTreeMap<ZoneId, ZoneControlV2>,
    quota: NodeWeights,
    config: VecDeque<ConfigRecord>,
}

impl From<ClusterStateV2> for ClusterState {
    /// The shared history splits in two. The last zone decision's version
    /// is the newest zone record's; with none left, 0 when nothing was
    /// ever dropped (the oldest record is version 1), else the version
    /// before the oldest record (rebalances may have pushed a zone
    /// decision out just before it: assume one did).
    fn from(v: ClusterStateV2) -> Self {
        let (rebalances, history): (VecDeque<_>, VecDeque<_>) = v
            .history
            .into_iter()
            .partition(|r| r.decision.is_rebalance());
        let zone_version = match (history.back(), rebalances.front()) {
            (Some(last), _) => last.version,
            (None, Some(oldest)) => oldest.version.saturating_sub(1),
            (None, None) => 0,
        };
        let skip = rebalances.len().saturating_sub(REBALANCE_HISTORY_LIMIT);
        Self {
            zones: v.zones,
            decision_version: v.decision_version,
            automation: v.automation,
            history,
            control: v.control.into_iter().map(|(z, c)| (z, c.into())).collect(),
            quota: Arc::new(from_node_weights(&v.quota)),
            config: v.config,
            rebalances: rebalances.into_iter().skip(skip).collect(),
            zone_version,
            dwell: DwellClock::default(),
            budgets: Arc::default(),
        }
    }
}

impl ClusterState {
    /// A state with the given zones, all active, at version 0.
    pub fn with_zones<I, Z>(zones: I) -> Self
    where
        I: IntoIterator<Item = Z>,
        Z: Into<ZoneId>,
    {
        let mut s = Self::default();
        s.register_zones(zones.into_iter().map(Into::into));
        s
    }

    /// Learn zones (from a replicated membership entry): unknown zones join
    /// as active; known zones keep their status. Returns whether any joined.
    /// Zones are never forgotten here, so history keeps meaning.
    pub fn register_zones(&mut self, zones: impl IntoIterator<Item = ZoneId>) -> bool {
        let mut added = false;
        for z in zones {
            self.zones.entry(z).or_insert_with(|| {
                added = true;
                ZoneStatus::Active
            });
        }
        added
    }

    pub fn decision_version(&self) -> u64 {
        self.decision_version
    }

    pub fn automation(&self) -> Automation {
        self.automation
    }

    pub fn zones(&self) -> &BTreeMap<ZoneId, ZoneStatus> {
        &self.zones
    }

    /// Who last changed `zone` and when (default when never changed).
    pub fn zone_control(&self, zone: &ZoneId) -> ZoneControl {
        self.control.get(zone).cloned().unwrap_or_default()
    }

    /// Zones currently failed over by an automatic decision.
    pub fn auto_failed_over(&self) -> Vec<ZoneId> {
        self.zones
            .iter()
            .filter(|(z, s)| {
                matches!(s, ZoneStatus::FailedOver { .. })
                    && self.zone_control(z).failed_over_by == Some(Origin::Automatic)
            })
            .map(|(z, _)| z.clone())
            .collect()
    }

    /// The most recent `limit` zone decisions (failover, failback, freeze,
    /// unfreeze), newest first: what `ctl decisions` shows by default.
    pub fn decisions(&self, limit: usize) -> Vec<DecisionRecord> {
        self.history.iter().rev().take(limit).cloned().collect()
    }

    /// The most recent `limit` decisions of both histories (zone decisions
    /// and quota rebalances), newest first: `ctl decisions --all`.
    pub fn all_decisions(&self, limit: usize) -> Vec<DecisionRecord> {
        let mut zones = self.history.iter().rev().peekable();
        let mut rebalances = self.rebalances.iter().rev().peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let next = match (zones.peek(), rebalances.peek()) {
                (Some(z), Some(r)) if z.version >= r.version => zones.next(),
                (_, Some(_)) => rebalances.next(),
                (Some(_), None) => zones.next(),
                (None, None) => None,
            };
            match next {
                Some(r) => out.push(r.clone()),
                None => break,
            }
        }
        out
    }

    /// The dwell clock (see [`DwellClock`]).
    pub fn dwell_clock(&self) -> DwellClock {
        self.dwell
    }

    /// Whether some zone's dwell of `dwell_ms` still runs by the dwell
    /// clock at a command stamped `clock`: the leader then ticks, so the
    /// time it measures counts (see [`Decision::Tick`]).
    pub fn dwell_running(&self, clock: &LeaderClock, dwell_ms: u64) -> bool {
        let now = self.dwell.at(clock);
        self.control.values().any(|c| {
            [c.last_auto_dwell, c.last_operator_dwell]
                .into_iter()
                .flatten()
                .any(|at| now.saturating_sub(at) < dwell_ms)
        })
    }

    /// The immutable view the data plane reads.
    pub fn view(&self) -> ClusterView {
        ClusterView {
            decision_version: self.decision_version,
            zones: self.zones.clone(),
            automation: self.automation,
            quota: Arc::clone(&self.quota),
            config: self.config.back().map(|c| (c.version, Arc::clone(&c.toml))),
            budgets: Arc::clone(&self.budgets),
        }
    }

    /// The replicated config's current version (0 before the first).
    pub fn config_version(&self) -> u64 {
        self.config.back().map_or(0, |c| c.version)
    }

    /// The kept config versions, newest first.
    pub fn configs(&self) -> Vec<ConfigRecord> {
        self.config.iter().rev().cloned().collect()
    }

    /// The last quota rebalance's weights (empty before the first).
    pub fn quota_weights(&self) -> &QuotaWeights {
        &self.quota
    }

    /// The last rebalance's budget grants (empty before the first).
    pub fn budgets(&self) -> &BudgetTable {
        &self.budgets
    }

    /// What `cmd` would change, or the rule that refuses it. Pure: the same
    /// checks `apply` runs, without changing anything.
    pub fn check(&self, cmd: &Command) -> Result<Preview, Rejection> {
        let Fields {
            decision,
            if_version,
            at_ms,
            limits,
            clock,
            ..
        } = cmd.fields();
        // A tick changes nothing but the dwell clock: no rule applies.
        if let Decision::Tick = decision {
            return Ok(Preview {
                version: self.decision_version,
                kind: decision.kind().to_string(),
                changes: Vec::new(),
                automation: self.automation,
            });
        }
        let auto = limits.map(|l| (at_ms, clock, l));
        if let Some(expected) = if_version {
            if expected != self.decision_version && !self.only_rebalances_since(expected, decision)
            {
                return Err(Rejection::new(
                    RejectRule::StaleVersion,
                    format!(
                        "decision made against version {expected}, but the cluster is at version {}",
                        self.decision_version
                    ),
                ));
            }
        }
        if auto.is_some() {
            if matches!(decision, Decision::Freeze | Decision::Unfreeze) {
                return Err(Rejection::new(
                    RejectRule::NotAutomatable,
                    format!("only operators {}", decision.kind()),
                ));
            }
            if self.automation == Automation::Frozen {
                return Err(Rejection::new(
                    RejectRule::AutomationFrozen,
                    "automation is frozen: only operators decide",
                ));
            }
        }
        let preview = self.plan(decision)?;
        if let Some((at_ms, clock, limits)) = auto {
            self.check_automatic(decision, &preview, at_ms, clock, limits)?;
        }
        Ok(preview)
    }

    /// Whether a zone decision made against version `expected` still holds:
    /// every decision since was a quota rebalance, which changes no zone
    /// (so an operator's `--if-version` is not made stale by the leader
    /// re-splitting quotas meanwhile). A rebalance itself is always exact:
    /// its weights were planned from the version it names.
    fn only_rebalances_since(&self, expected: u64, decision: &Decision) -> bool {
        !decision.is_rebalance()
            && expected <= self.decision_version
            && expected >= self.zone_version
    }

    /// The generic rules every decision passes, and what it would change.
    fn plan(&self, decision: &Decision) -> Result<Preview, Rejection> {
        let mut preview = Preview {
            version: self.decision_version + 1,
            kind: decision.kind().to_string(),
            changes: Vec::new(),
            automation: self.automation,
        };
        match decision {
            Decision::Failover { from, to } => {
                preview.changes = self.plan_failover(from, to)?;
            }
            Decision::Failback { zone } => {
                let before = self.status(zone)?;
                if !matches!(before, ZoneStatus::FailedOver { .. }) {
                    return Err(Rejection::new(
                        RejectRule::NotFailedOver,
                        format!("zone {zone} is {}, not failed over", before.name()),
                    ));
                }
                preview.changes.push(ZoneChange {
                    zone: zone.clone(),
                    before: before.clone(),
                    after: ZoneStatus::Active,
                });
            }
            Decision::Freeze => {
                if self.automation == Automation::Frozen {
                    return Err(Rejection::new(
                        RejectRule::AlreadyFrozen,
                        "automation is already frozen",
                    ));
                }
                preview.automation = Automation::Frozen;
            }
            Decision::Unfreeze => {
                if self.automation != Automation::Frozen {
                    return Err(Rejection::new(
                        RejectRule::NotFrozen,
                        "automation is not frozen",
                    ));
                }
                preview.automation = Automation::Auto;
            }
            // Weights change no zone; the data plane uses a group's weights
            // only when they cover exactly that group and sum to one.
            Decision::QuotaRebalance { .. }
            | Decision::Rebalance { .. }
            | Decision::RebalanceWithBudgets { .. } => {}
            // Answered before the rules (see `check`).
            Decision::Tick => preview.version = self.decision_version,
            // A config is only ever the next config version: two operators
            // applying against the same version cannot both win.
            Decision::Config { config_version, .. } => {
                // Configs have their own version and stay out of the
                // decision versions (and the decision history).
                preview.version = self.decision_version;
                let next = self.config_version() + 1;
                if *config_version != next {
                    return Err(Rejection::new(
                        RejectRule::StaleVersion,
                        format!(
                            "config version {} was expected next, but the cluster is at config version {}",
                            config_version,
                            next - 1
                        ),
                    ));
                }
            }
        }
        Ok(preview)
    }

    /// The rules only automatic decisions face, after the generic ones
    /// passed. A dwell has passed only when both clocks say so: the
    /// command's leader-stamped `at_ms` against the stamp of the decision
    /// that started it (a wall clock that went backwards counts as no
    /// time elapsed: refuse, never allow early), and, when both carry a
    /// leader clock, the dwell clock ([`DwellClock`]), which a leader
    /// whose wall clock runs ahead of the previous leader's cannot move
    /// on.
    ///
    /// "Manual beats automatic", precisely: an automatic decision is
    /// refused (`operator_decided`) when it would fail back a zone an
    /// operator failed over, or change a zone that an operator's decision
    /// changed less than `dwell_ms` ago (so an operator's failback holds
    /// the zone against automatic failover for the dwell time).
    fn check_automatic(
        &self,
        decision: &Decision,
        preview: &Preview,
        at_ms: u64,
        clock: Option<LeaderClock>,
        limits: &AutoLimits,
    ) -> Result<(), Rejection> {
        let dwell_now = clock.map(|c| self.dwell.at(&c));
        // Time since a decision stamped `wall` (and `dwell`, the dwell
        // clock then): the shorter of the two measures.
        let since = |wall: u64, dwell: Option<u64>| {
            let by_wall = at_ms.saturating_sub(wall);
            match (dwell_now, dwell) {
                (Some(now), Some(then)) => by_wall.min(now.saturating_sub(then)),
                _ => by_wall,
            }
        };
        if let Decision::Failback { zone } = decision {
            if self.zone_control(zone).failed_over_by == Some(Origin::Operator) {
                return Err(Rejection::new(
                    RejectRule::OperatorDecided,
                    format!("zone {zone} was failed over by an operator; only an operator fails it back"),
                ));
            }
        }
        for change in &preview.changes {
            let control = self.zone_control(&change.zone);
            if let Some(t) = control.last_operator_ms {
                let ago = since(t, control.last_operator_dwell);
                if ago < limits.dwell_ms {
                    return Err(Rejection::new(
                        RejectRule::OperatorDecided,
                        format!(
                            "an operator decided on zone {} {} ms ago (dwell {} ms)",
                            change.zone, ago, limits.dwell_ms
                        ),
                    ));
                }
            }
            if let Some(t) = control.last_auto_ms {
                let ago = since(t, control.last_auto_dwell);
                if ago < limits.dwell_ms {
                    return Err(Rejection::new(
                        RejectRule::DwellTime,
                        format!(
                            "the last automatic decision on zone {} was {} ms ago (dwell {} ms)",
                            change.zone, ago, limits.dwell_ms
                        ),
                    ));
                }
            }
        }
        if let Decision::Failover { .. } = decision {
            let already = self.auto_failed_over();
            if already.len() >= limits.max_auto_failed_over as usize {
                return Err(Rejection::new(
                    RejectRule::AutoFailoverLimit,
                    format!(
                        "{} zone(s) already failed over automatically ({}), limit {}",
                        already.len(),
                        already
                            .iter()
                            .map(ZoneId::as_str)
                            .collect::<Vec<_>>()
                            .join(", "),
                        limits.max_auto_failed_over
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Apply one committed command. A refused command changes nothing and
    /// does not consume a version. An applied command with a leader clock
    /// moves the dwell clock; a tick does nothing else.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        let preview = match self.check(cmd) {
            Ok(p) => p,
            Err(r) => return r.into(),
        };
        let origin = cmd.origin();
        let Fields {
            decision,
            actor,
            reason,
            at_ms,
            evidence,
            clock,
            ..
        } = cmd.fields();
        let dwell_at = clock.map(|c| self.dwell.at(&c));
        if let Some(c) = clock {
            self.dwell.advance(&c);
        }
        match decision {
            Decision::Tick => {
                return Outcome::Applied {
                    version: self.decision_version,
                }
            }
            Decision::Config {
                config_version,
                toml,
            } => {
                if self.config.len() >= CONFIG_HISTORY_LIMIT {
                    self.config.pop_front();
                }
                self.config.push_back(ConfigRecord {
                    version: *config_version,
                    toml: Arc::clone(toml),
                    actor: actor.to_owned(),
                    reason: reason.to_owned(),
                    at_ms,
                });
                return Outcome::Applied {
                    version: self.decision_version,
                };
            }
            Decision::QuotaRebalance { weights } => {
                self.quota = Arc::new(from_node_weights(weights));
            }
            Decision::Rebalance { weights } => {
                self.quota = Arc::new(weights.clone());
            }
            Decision::RebalanceWithBudgets { weights, budgets } => {
                self.quota = Arc::new(weights.clone());
                self.budgets = Arc::new(budgets.clone());
            }
            Decision::Failover { .. }
            | Decision::Failback { .. }
            | Decision::Freeze
            | Decision::Unfreeze => {}
        }
        for change in &preview.changes {
            self.zones.insert(change.zone.clone(), change.after.clone());
            let control = self.control.entry(change.zone.clone()).or_default();
            match (&change.after, decision) {
                (ZoneStatus::FailedOver { .. }, Decision::Failover { from, .. })
                    if *from == change.zone =>
                {
                    control.failed_over_by = Some(origin)
                }
                (ZoneStatus::FailedOver { .. }, _) => {}
                (ZoneStatus::Active | ZoneStatus::Draining, _) => control.failed_over_by = None,
            }
            match origin {
                Origin::Operator => {
                    control.last_operator_ms = Some(at_ms);
                    control.last_operator_dwell = dwell_at;
                }
                Origin::Automatic => {
                    control.last_auto_ms = Some(at_ms);
                    control.last_auto_dwell = dwell_at;
                }
            }
        }
        self.automation = preview.automation;
        self.decision_version = preview.version;
        let record = DecisionRecord {
            version: preview.version,
            kind: preview.kind,
            decision: decision.clone(),
            zones: preview.changes.into_iter().map(|c| c.zone).collect(),
            reason: reason.to_owned(),
            actor: actor.to_owned(),
            at_ms,
            evidence: evidence.map(str::to_owned),
            origin,
        };
        let (history, limit) = if decision.is_rebalance() {
            (&mut self.rebalances, REBALANCE_HISTORY_LIMIT)
        } else {
            self.zone_version = preview.version;
            (&mut self.history, HISTORY_LIMIT)
        };
        if history.len() >= limit {
            history.pop_front();
        }
        history.push_back(record);
        Outcome::Applied {
            version: self.decision_version,
        }
    }

    fn status(&self, zone: &ZoneId) -> Result<&ZoneStatus, Rejection> {
        self.zones.get(zone).ok_or_else(|| {
            Rejection::new(
                RejectRule::UnknownZone,
                format!(
                    "unknown zone {zone}; known zones: {}",
                    self.zones
                        .keys()
                        .map(ZoneId::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }

    fn plan_failover(&self, from: &ZoneId, to: &ZoneId) -> Result<Vec<ZoneChange>, Rejection> {
        if from == to {
            return Err(Rejection::new(
                RejectRule::SameZone,
                format!("cannot fail zone {from} over to itself"),
            ));
        }
        let from_status = self.status(from)?;
        let to_status = self.status(to)?;
        if let ZoneStatus::FailedOver { target } = from_status {
            return Err(Rejection::new(
                RejectRule::AlreadyFailedOver,
                format!("zone {from} is already failed over to {target}; fail it back first"),
            ));
        }
        // Checked before the target so that failing over the only serving
        // zone names the real problem rather than the inactive target.
        let others_serving = self
            .zones
            .iter()
            .any(|(z, s)| z != from && *s == ZoneStatus::Active);
        if !others_serving {
            return Err(Rejection::new(
                RejectRule::LastServingZone,
                format!("zone {from} is the last zone serving traffic"),
            ));
        }
        if *to_status != ZoneStatus::Active {
            return Err(Rejection::new(
                RejectRule::TargetNotActive,
                format!("target zone {to} is {}, not active", to_status.name()),
            ));
        }
        let after = ZoneStatus::FailedOver { target: to.clone() };
        // Zones that pointed at `from` follow its traffic to `to` in the
        // same decision, so no zone ever points at a zone that does not
        // serve: failover targets are always active.
        let changes = self
            .zones
            .iter()
            .filter(|(z, s)| {
                *z == from || matches!(s, ZoneStatus::FailedOver { target } if target == from)
            })
            .map(|(z, s)| ZoneChange {
                zone: z.clone(),
                before: s.clone(),
                after: after.clone(),
            })
            .collect();
        Ok(changes)
    }
}

/// How the decision history names a config: `sha256:<hex>` of its text.
pub fn config_digest(toml: &str) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(toml.as_bytes()))
    )
}

#[cfg(test)]
mod tests;
