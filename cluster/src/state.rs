//! The replicated cluster state and the pure rules that change it.
//!
//! Architecture Invariant: [`ClusterState::apply`] reads no clock and does no
//! I/O. Every node applies the same committed commands in the same order and
//! so reaches the same state, the same versions and the same refusals.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

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
}

/// [`ClusterState`]'s current layout, as derived; see its `Deserialize`.
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
        }
    }
}

impl<'de> Deserialize<'de> for ClusterState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            return ClusterStateV3::deserialize(d).map(Self::from);
        }
        match crate::codec::decoding_version() {
            0 | 1 => ClusterStateV1::deserialize(d).map(Self::from),
            2 => ClusterStateV2::deserialize(d).map(Self::from),
            _ => ClusterStateV3::deserialize(d).map(Self::from),
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
            Decision::QuotaRebalance { .. } | Decision::Rebalance { .. } => {}
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
mod tests {
    use super::*;

    fn z(name: &str) -> ZoneId {
        ZoneId::new(name)
    }

    fn failover(from: &str, to: &str) -> Command {
        Command::decide(
            Decision::Failover {
                from: z(from),
                to: z(to),
            },
            "test",
            "drill",
        )
    }

    fn failback(zone: &str) -> Command {
        Command::decide(Decision::Failback { zone: z(zone) }, "test", "recovered")
    }

    fn freeze() -> Command {
        Command::decide(Decision::Freeze, "test", "maintenance")
    }

    fn unfreeze() -> Command {
        Command::decide(Decision::Unfreeze, "test", "done")
    }

    fn three_zones() -> ClusterState {
        ClusterState::with_zones(["az-a", "az-b", "az-c"])
    }

    /// Apply `setup` (each must be applied), then check that `cmd` yields
    /// `expect`: `Ok(version)` or `Err(rule)`.
    fn check_case(name: &str, setup: &[Command], cmd: Command, expect: Result<u64, RejectRule>) {
        let mut state = three_zones();
        for c in setup {
            assert!(
                matches!(state.apply(c), Outcome::Applied { .. }),
                "{name}: setup command {c:?} was refused"
            );
        }
        let before = state.clone();
        let preview = state.check(&cmd);
        let outcome = state.apply(&cmd);
        match expect {
            Ok(version) => {
                assert_eq!(outcome, Outcome::Applied { version }, "{name}");
                assert_eq!(preview.map(|p| p.version), Ok(version), "{name}");
            }
            Err(rule) => {
                match &outcome {
                    Outcome::Rejected { rule: got, message } => {
                        assert_eq!(*got, rule, "{name}: {message}");
                        assert!(!message.is_empty(), "{name}: empty message");
                    }
                    other => panic!("{name}: expected {rule}, got {other:?}"),
                }
                assert_eq!(preview.map_err(|r| r.rule), Err(rule), "{name}");
                assert_eq!(state, before, "{name}: a refusal must change nothing");
            }
        }
    }

    /// (name, commands applied first, command under test, expected).
    type Case = (&'static str, Vec<Command>, Command, Result<u64, RejectRule>);

    #[test]
    fn safety_rules_table() {
        use RejectRule::*;
        let cases: Vec<Case> = vec![
            (
                "failover to an active zone",
                vec![],
                failover("az-a", "az-b"),
                Ok(1),
            ),
            (
                "failover to itself",
                vec![],
                failover("az-a", "az-a"),
                Err(SameZone),
            ),
            (
                "failover from unknown zone",
                vec![],
                failover("az-x", "az-b"),
                Err(UnknownZone),
            ),
            (
                "failover to unknown zone",
                vec![],
                failover("az-a", "az-x"),
                Err(UnknownZone),
            ),
            (
                "failover twice",
                vec![failover("az-a", "az-b")],
                failover("az-a", "az-c"),
                Err(AlreadyFailedOver),
            ),
            (
                "failover to a failed-over zone",
                vec![failover("az-b", "az-c")],
                failover("az-a", "az-b"),
                Err(TargetNotActive),
            ),
            (
                "failover of the last serving zone",
                vec![failover("az-a", "az-c"), failover("az-b", "az-c")],
                failover("az-c", "az-a"),
                Err(LastServingZone),
            ),
            (
                "failover of a zone others point to",
                vec![failover("az-a", "az-b")],
                failover("az-b", "az-c"),
                Ok(2),
            ),
            (
                "failback of an active zone",
                vec![],
                failback("az-a"),
                Err(NotFailedOver),
            ),
            (
                "failback of an unknown zone",
                vec![],
                failback("az-x"),
                Err(UnknownZone),
            ),
            (
                "failback of a failed-over zone",
                vec![failover("az-a", "az-b")],
                failback("az-a"),
                Ok(2),
            ),
            ("freeze", vec![], freeze(), Ok(1)),
            ("freeze twice", vec![freeze()], freeze(), Err(AlreadyFrozen)),
            ("unfreeze when auto", vec![], unfreeze(), Err(NotFrozen)),
            ("unfreeze when frozen", vec![freeze()], unfreeze(), Ok(2)),
            (
                "operators decide while frozen",
                vec![freeze()],
                failover("az-a", "az-b"),
                Ok(2),
            ),
        ];
        for (name, setup, cmd, expect) in cases {
            check_case(name, &setup, cmd, expect);
        }
    }

    fn auto(decision: Decision, at_ms: u64, limits: AutoLimits) -> Command {
        Command::automatic(decision, "detector:1", "score below cutoff", limits).stamped(at_ms)
    }

    fn fo(from: &str, to: &str) -> Decision {
        Decision::Failover {
            from: z(from),
            to: z(to),
        }
    }

    #[test]
    fn a_quota_rebalance_takes_a_version_and_reaches_the_view() {
        let mut s = ClusterState::with_zones(["az-a", "az-b"]);
        let weights: NodeWeights = [(
            "deptA".to_owned(),
            [(1, 600_000), (2, 400_000)].into_iter().collect(),
        )]
        .into_iter()
        .collect();
        let cmd = auto(
            Decision::QuotaRebalance {
                weights: weights.clone(),
            },
            1_000,
            AutoLimits::default(),
        );
        assert_eq!(s.apply(&cmd), Outcome::Applied { version: 1 });
        let weights = from_node_weights(&weights);
        assert_eq!(s.quota_weights(), &weights);
        assert_eq!(*s.view().quota, weights);
        assert!(
            s.decisions(1).is_empty(),
            "rebalances keep their own history"
        );
        let last = s.all_decisions(1).remove(0);
        assert_eq!(last.kind, "quota_rebalance");
        assert!(last.zones.is_empty());
        // Zones are untouched, and a frozen automation holds the weights.
        assert!(s.zones().values().all(|z| *z == ZoneStatus::Active));
        s.apply(&freeze());
        let r = s.apply(&auto(
            Decision::QuotaRebalance {
                weights: NodeWeights::new(),
            },
            2_000,
            AutoLimits::default(),
        ));
        assert!(
            matches!(
                r,
                Outcome::Rejected {
                    rule: RejectRule::AutomationFrozen,
                    ..
                }
            ),
            "{r:?}"
        );
        assert_eq!(s.quota_weights(), &weights);
        // The state round-trips through the codec with its weights.
        let back: ClusterState = crate::codec::decode(&crate::codec::encode(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn a_rebalance_in_between_does_not_make_a_zone_decision_stale() {
        let mut s = ClusterState::with_zones(["az-a", "az-b"]);
        let rebalance = |at| {
            auto(
                Decision::QuotaRebalance {
                    weights: NodeWeights::new(),
                },
                at,
                AutoLimits::default(),
            )
        };
        assert_eq!(s.apply(&rebalance(1)), Outcome::Applied { version: 1 });
        assert_eq!(s.apply(&rebalance(2)), Outcome::Applied { version: 2 });
        // An operator who looked at version 0 may still fail over.
        assert_eq!(
            s.apply(&failover("az-a", "az-b").if_version(0)),
            Outcome::Applied { version: 3 }
        );
        // A zone decision in between still makes it stale.
        let r = s.apply(&failback("az-a").if_version(2));
        assert!(
            matches!(
                r,
                Outcome::Rejected {
                    rule: RejectRule::StaleVersion,
                    ..
                }
            ),
            "{r:?}"
        );
        // A rebalance planned from an older version is always stale.
        let r = s.apply(&rebalance(3).if_version(2));
        assert!(
            matches!(
                r,
                Outcome::Rejected {
                    rule: RejectRule::StaleVersion,
                    ..
                }
            ),
            "{r:?}"
        );
        assert_eq!(
            s.apply(&failback("az-a").if_version(3)),
            Outcome::Applied { version: 4 }
        );
    }

    #[test]
    fn a_rebalance_over_its_bounds_is_refused_before_proposing() {
        let big: NodeWeights = [(
            "t".repeat(crate::command::MAX_TENANT_BYTES + 1),
            BTreeMap::new(),
        )]
        .into_iter()
        .collect();
        let cmd = auto(
            Decision::QuotaRebalance { weights: big },
            1,
            AutoLimits::default(),
        );
        assert_eq!(cmd.validate().unwrap_err().rule, RejectRule::TooLong);
    }

    fn auto_failover(from: &str, to: &str, at_ms: u64) -> Command {
        auto(fo(from, to), at_ms, AutoLimits::default())
    }

    fn auto_failback(zone: &str, at_ms: u64) -> Command {
        auto(
            Decision::Failback { zone: z(zone) },
            at_ms,
            AutoLimits::default(),
        )
    }

    const MIN: u64 = 60_000;

    #[test]
    fn automatic_decision_rules_table() {
        use RejectRule::*;
        let two_at_a_time = AutoLimits {
            max_auto_failed_over: 2,
            dwell_ms: MIN,
        };
        let cases: Vec<Case> = vec![
            (
                "automatic failover when nothing stands in the way",
                vec![],
                auto_failover("az-a", "az-b", 0),
                Ok(1),
            ),
            // freeze
            (
                "frozen automation blocks automatic failover",
                vec![freeze()],
                auto_failover("az-a", "az-b", 0),
                Err(AutomationFrozen),
            ),
            (
                "frozen automation blocks automatic failback",
                vec![auto_failover("az-a", "az-b", 0), freeze()],
                auto_failback("az-a", 10 * MIN),
                Err(AutomationFrozen),
            ),
            (
                "unfrozen automation decides again",
                vec![freeze(), unfreeze()],
                auto_failover("az-a", "az-b", 0),
                Ok(3),
            ),
            (
                "automation never freezes itself",
                vec![],
                auto(Decision::Freeze, 0, AutoLimits::default()),
                Err(NotAutomatable),
            ),
            (
                "automation never unfreezes itself",
                vec![freeze()],
                auto(Decision::Unfreeze, 0, AutoLimits::default()),
                Err(NotAutomatable),
            ),
            // one at a time
            (
                "a second automatic failover while one is in force",
                vec![auto_failover("az-a", "az-b", 0)],
                auto_failover("az-c", "az-b", 10 * MIN),
                Err(AutoFailoverLimit),
            ),
            (
                "a second automatic failover when the limit is two",
                vec![auto(fo("az-a", "az-b"), 0, two_at_a_time)],
                auto(fo("az-c", "az-b"), 10 * MIN, two_at_a_time),
                Ok(2),
            ),
            (
                "an operator's failover does not count toward the limit",
                vec![failover("az-a", "az-b")],
                auto_failover("az-c", "az-b", 10 * MIN),
                Ok(2),
            ),
            (
                "an automatic failback frees the slot",
                vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
                auto_failover("az-c", "az-b", MIN),
                Ok(3),
            ),
            // dwell
            (
                "automatic failback within the dwell time",
                vec![auto_failover("az-a", "az-b", 0)],
                auto_failback("az-a", MIN - 1),
                Err(DwellTime),
            ),
            (
                "automatic failback exactly at the dwell time",
                vec![auto_failover("az-a", "az-b", 0)],
                auto_failback("az-a", MIN),
                Ok(2),
            ),
            (
                "automatic failover again within the dwell time of its failback",
                vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
                auto_failover("az-a", "az-c", MIN + 1000),
                Err(DwellTime),
            ),
            (
                "a leader clock behind the last decision counts as no time",
                vec![auto_failover("az-a", "az-b", 10 * MIN)],
                auto_failback("az-a", MIN),
                Err(DwellTime),
            ),
            (
                "dwell is per zone: another zone may be decided at once",
                vec![auto_failover("az-a", "az-b", 0), auto_failback("az-a", MIN)],
                auto_failover("az-c", "az-b", MIN + 1),
                Ok(3),
            ),
            // manual beats automatic
            (
                "automation never fails back an operator's failover",
                vec![failover("az-a", "az-b").stamped(0)],
                auto_failback("az-a", 100 * MIN),
                Err(OperatorDecided),
            ),
            (
                "an operator's failback holds the zone for the dwell time",
                vec![
                    auto_failover("az-a", "az-b", 0),
                    failback("az-a").stamped(2 * MIN),
                ],
                auto_failover("az-a", "az-c", 3 * MIN - 1),
                Err(OperatorDecided),
            ),
            (
                "after the hold, automation may fail the zone over again",
                vec![
                    auto_failover("az-a", "az-b", 0),
                    failback("az-a").stamped(2 * MIN),
                ],
                auto_failover("az-a", "az-c", 3 * MIN),
                Ok(3),
            ),
            (
                "operators may always override automation",
                vec![auto_failover("az-a", "az-b", 0)],
                failback("az-a").stamped(1),
                Ok(2),
            ),
            (
                "re-targeting a zone an operator just failed over waits for the hold",
                vec![failover("az-a", "az-b").stamped(0)],
                auto_failover("az-b", "az-c", MIN - 1),
                Err(OperatorDecided),
            ),
            // the generic rules still apply first
            (
                "a stale automatic decision",
                vec![freeze(), unfreeze()],
                auto_failover("az-a", "az-b", 0).if_version(1),
                Err(StaleVersion),
            ),
            (
                "an automatic failover of an already failed-over zone",
                vec![failover("az-a", "az-b").stamped(0)],
                auto_failover("az-a", "az-c", 100 * MIN),
                Err(AlreadyFailedOver),
            ),
        ];
        for (name, setup, cmd, expect) in cases {
            check_case(name, &setup, cmd, expect);
        }
    }

    #[test]
    fn applied_decisions_record_origin_and_who_failed_a_zone_over() {
        let mut state = three_zones();
        state.apply(&failover("az-a", "az-b").stamped(5));
        state.apply(&auto_failover("az-b", "az-c", 10 * MIN));
        // az-a was re-targeted to az-c by the automatic decision but stays
        // an operator's failover.
        assert_eq!(
            state.zone_control(&z("az-a")).failed_over_by,
            Some(Origin::Operator)
        );
        assert_eq!(state.zone_control(&z("az-a")).last_auto_ms, Some(10 * MIN));
        assert_eq!(
            state.zone_control(&z("az-b")).failed_over_by,
            Some(Origin::Automatic)
        );
        assert_eq!(state.auto_failed_over(), vec![z("az-b")]);
        let history = state.decisions(2);
        assert_eq!(history[0].origin, Origin::Automatic);
        assert_eq!(history[1].origin, Origin::Operator);
        state.apply(&failback("az-b").stamped(10 * MIN + 1));
        assert_eq!(state.zone_control(&z("az-b")).failed_over_by, None);
        assert!(state.auto_failed_over().is_empty());
    }

    #[test]
    fn history_json_without_origin_reads_as_operator() {
        let mut state = three_zones();
        state.apply(&freeze());
        let mut json = serde_json::to_value(&state.decisions(1)[0]).unwrap();
        json.as_object_mut().unwrap().remove("origin");
        let back: DecisionRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back.origin, Origin::Operator);
    }

    #[test]
    fn compare_and_set_table() {
        // (name, decisions applied first, if_version, expected)
        let cases: Vec<(&str, usize, u64, Result<u64, RejectRule>)> = vec![
            ("matching version 0", 0, 0, Ok(1)),
            ("matching version 1", 1, 1, Ok(2)),
            ("stale version", 1, 0, Err(RejectRule::StaleVersion)),
            ("future version", 0, 5, Err(RejectRule::StaleVersion)),
        ];
        for (name, applied, version, expect) in cases {
            let setup: Vec<Command> = [freeze(), unfreeze()].into_iter().take(applied).collect();
            let cmd = failover("az-a", "az-b").if_version(version);
            check_case(name, &setup, cmd, expect);
        }
    }

    #[test]
    fn stale_version_is_checked_before_the_other_rules() {
        let mut state = three_zones();
        state.apply(&failover("az-a", "az-b"));
        // Both stale and already failed over: the stale view is the reason.
        let out = state.apply(&failover("az-a", "az-c").if_version(0));
        assert!(matches!(
            out,
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ));
    }

    #[test]
    fn two_operators_racing_on_one_version_get_one_decision() {
        let mut state = three_zones();
        let first = state.apply(&failover("az-a", "az-b").if_version(0));
        let second = state.apply(&failover("az-b", "az-a").if_version(0));
        assert_eq!(first, Outcome::Applied { version: 1 });
        assert!(matches!(
            second,
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ));
    }

    #[test]
    fn failing_over_a_target_retargets_the_zones_pointing_at_it() {
        let mut state = three_zones();
        state.apply(&failover("az-a", "az-b"));
        let preview = state.check(&failover("az-b", "az-c")).unwrap();
        let moved: Vec<&str> = preview.changes.iter().map(|c| c.zone.as_str()).collect();
        assert_eq!(moved, ["az-a", "az-b"]);
        state.apply(&failover("az-b", "az-c"));
        let view = state.view();
        assert_eq!(view.effective_zone(&z("az-a")), &z("az-c"));
        assert_eq!(view.effective_zone(&z("az-b")), &z("az-c"));
        let last = &state.decisions(1)[0];
        assert_eq!(last.zones, vec![z("az-a"), z("az-b")]);
    }

    #[test]
    fn two_zones_cannot_fail_over_at_each_other() {
        let mut state = ClusterState::with_zones(["az-a", "az-b"]);
        assert_eq!(
            state.apply(&failover("az-a", "az-b")),
            Outcome::Applied { version: 1 }
        );
        assert!(matches!(
            state.apply(&failover("az-b", "az-a")),
            Outcome::Rejected {
                rule: RejectRule::LastServingZone,
                ..
            }
        ));
    }

    #[test]
    fn failover_targets_are_always_active_after_any_sequence() {
        // A small exhaustive walk: every sequence of three decisions over
        // three zones keeps the invariants (one zone serving, targets active).
        let zones = ["az-a", "az-b", "az-c"];
        let mut cmds = vec![freeze(), unfreeze()];
        for from in zones {
            cmds.push(failback(from));
            for to in zones {
                cmds.push(failover(from, to));
            }
        }
        for a in &cmds {
            for b in &cmds {
                for c in &cmds {
                    let mut state = three_zones();
                    let mut version = 0;
                    for cmd in [a, b, c] {
                        if let Outcome::Applied { version: v } = state.apply(cmd) {
                            assert_eq!(v, version + 1, "versions are consecutive");
                            version = v;
                        }
                        assert_eq!(state.decision_version(), version);
                        let view = state.view();
                        assert!(zones
                            .iter()
                            .any(|zn| view.zones[&z(zn)] == ZoneStatus::Active));
                        for status in view.zones.values() {
                            if let ZoneStatus::FailedOver { target } = status {
                                assert_eq!(view.zones[target], ZoneStatus::Active);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn history_records_who_why_when_and_is_bounded() {
        let mut state = three_zones();
        let cmd = failover("az-a", "az-b")
            .with_evidence("score 0.21 for 3 periods")
            .stamped(1_700_000_000_000);
        state.apply(&cmd);
        let rec = &state.decisions(10)[0];
        assert_eq!(rec.version, 1);
        assert_eq!(rec.kind, "failover");
        assert_eq!(rec.actor, "test");
        assert_eq!(rec.reason, "drill");
        assert_eq!(rec.at_ms, 1_700_000_000_000);
        assert_eq!(rec.evidence.as_deref(), Some("score 0.21 for 3 periods"));

        for _ in 0..HISTORY_LIMIT {
            state.apply(&freeze());
            state.apply(&unfreeze());
        }
        let all = state.decisions(usize::MAX);
        assert_eq!(all.len(), HISTORY_LIMIT);
        assert_eq!(all[0].version, state.decision_version());
        assert_eq!(
            all[HISTORY_LIMIT - 1].version,
            state.decision_version() - 999
        );
    }

    #[test]
    fn registering_zones_keeps_existing_status() {
        let mut state = ClusterState::with_zones(["az-a", "az-b"]);
        state.apply(&failover("az-a", "az-b"));
        assert!(state.register_zones([z("az-a"), z("az-c")]));
        assert!(!state.register_zones([z("az-a")]));
        assert_eq!(
            state.zones()[&z("az-a")],
            ZoneStatus::FailedOver { target: z("az-b") }
        );
        assert_eq!(state.zones()[&z("az-c")], ZoneStatus::Active);
        assert_eq!(
            state.decision_version(),
            1,
            "learning zones is not a decision"
        );
    }

    #[test]
    fn view_carries_version_zones_and_automation() {
        let mut state = three_zones();
        state.apply(&freeze());
        let view = state.view();
        assert_eq!(view.decision_version, 1);
        assert_eq!(view.automation, Automation::Frozen);
        assert_eq!(view.zones.len(), 3);
    }

    fn rebalance_at(at_ms: u64, rpm_node_1: u32) -> Command {
        let weights: QuotaWeights = [(
            "deptA".to_owned(),
            crate::quota::TenantWeights {
                zones: [
                    (z("az-a"), 500_000),
                    (z("az-b"), 300_000),
                    (z("az-c"), 200_000),
                ]
                .into_iter()
                .collect(),
                nodes: [(1, rpm_node_1), (2, 1_000_000 - rpm_node_1)]
                    .into_iter()
                    .collect(),
            },
        )]
        .into_iter()
        .collect();
        auto(
            Decision::Rebalance { weights },
            at_ms,
            AutoLimits::default(),
        )
    }

    #[test]
    fn an_operators_failover_outlives_500_rebalances() {
        let mut s = three_zones();
        let operator = failover("az-a", "az-b").stamped(1_000);
        assert_eq!(s.apply(&operator), Outcome::Applied { version: 1 });
        for i in 0..500u32 {
            let out = s.apply(&rebalance_at(2_000 + u64::from(i) * 5_000, 400_000 + i));
            assert_eq!(
                out,
                Outcome::Applied {
                    version: 2 + u64::from(i)
                }
            );
        }
        // Zone decisions by default: the failover is still there.
        let shown = s.decisions(10);
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert_eq!(shown[0].kind, "failover");
        assert_eq!(shown[0].version, 1);
        // Everything: the newest rebalances first, bounded; the failover
        // is older than every kept rebalance.
        let all = s.all_decisions(usize::MAX);
        assert_eq!(all.len(), REBALANCE_HISTORY_LIMIT + 1);
        assert_eq!(all[0].version, 501);
        assert_eq!(all[0].kind, "quota_rebalance");
        assert_eq!(all.last().map(|r| r.version), Some(1));
        assert!(all.windows(2).all(|w| w[0].version > w[1].version));
        assert_eq!(s.all_decisions(3).len(), 3);
        // An operator who looked before the rebalances is not stale.
        assert_eq!(
            s.apply(&failback("az-a").if_version(1)),
            Outcome::Applied { version: 502 }
        );
        // And the history survives the codec.
        let back: ClusterState = crate::codec::decode(&crate::codec::encode(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    /// [`ClusterStateV2`]'s layout, to write format-2 bytes.
    #[derive(Serialize)]
    struct StateV2Bytes {
        zones: BTreeMap<ZoneId, ZoneStatus>,
        decision_version: u64,
        automation: Automation,
        history: VecDeque<DecisionRecord>,
        control: BTreeMap<ZoneId, ZoneControlV2Bytes>,
        quota: NodeWeights,
        config: VecDeque<ConfigRecord>,
    }

    /// [`ZoneControlV2`]'s layout: failed over by, last automatic and last
    /// operator stamps.
    type ZoneControlV2Bytes = (Option<Origin>, Option<u64>, Option<u64>);

    fn record(version: u64, decision: Decision) -> DecisionRecord {
        DecisionRecord {
            version,
            kind: decision.kind().to_owned(),
            zones: decision.zones(),
            decision,
            reason: "r".into(),
            actor: "a".into(),
            at_ms: version,
            evidence: None,
            origin: Origin::Operator,
        }
    }

    fn v2_bytes(history: Vec<DecisionRecord>, decision_version: u64) -> Vec<u8> {
        let v2 = StateV2Bytes {
            zones: three_zones().zones,
            decision_version,
            automation: Automation::Auto,
            history: history.into(),
            control: BTreeMap::new(),
            quota: [("deptA".to_owned(), [(1, 1_000_000)].into_iter().collect())]
                .into_iter()
                .collect(),
            config: VecDeque::new(),
        };
        let mut bytes = crate::codec::encode(&v2).unwrap();
        bytes[1] = 2;
        bytes
    }

    #[test]
    fn a_format_2_state_splits_its_history_and_keeps_compare_and_set() {
        let rebalance = || Decision::QuotaRebalance {
            weights: NodeWeights::new(),
        };
        // A failover at 3 among rebalances: it goes to the zone history.
        let mixed: Vec<DecisionRecord> = (1..=5)
            .map(|v| {
                record(
                    v,
                    if v == 3 {
                        fo("az-a", "az-b")
                    } else {
                        rebalance()
                    },
                )
            })
            .collect();
        let s: ClusterState = crate::codec::decode(&v2_bytes(mixed, 5)).unwrap();
        assert_eq!(
            s.decisions(10)
                .iter()
                .map(|r| r.version)
                .collect::<Vec<_>>(),
            [3]
        );
        assert_eq!(s.all_decisions(10).len(), 5);
        assert_eq!(s.quota_weights()["deptA"].nodes[&1], 1_000_000);
        assert!(s.quota_weights()["deptA"].zones.is_empty());
        let mut ok = s.clone();
        assert_eq!(
            ok.apply(&failover("az-c", "az-b").if_version(3)),
            Outcome::Applied { version: 6 }
        );
        let mut stale = s.clone();
        assert!(matches!(
            stale.apply(&failover("az-c", "az-b").if_version(2)),
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ));
        // Rebalances that pushed every zone decision out (oldest kept: 8):
        // one may have been at 7, so 6 is stale and 7 is not.
        let only: Vec<DecisionRecord> = (8..=10).map(|v| record(v, rebalance())).collect();
        let s: ClusterState = crate::codec::decode(&v2_bytes(only, 10)).unwrap();
        assert!(s.decisions(10).is_empty());
        assert!(matches!(
            s.clone().apply(&failover("az-a", "az-b").if_version(6)),
            Outcome::Rejected {
                rule: RejectRule::StaleVersion,
                ..
            }
        ));
        assert_eq!(
            s.clone().apply(&failover("az-a", "az-b").if_version(7)),
            Outcome::Applied { version: 11 }
        );
    }

    fn leader(node: u64, mono_ms: u64) -> LeaderClock {
        LeaderClock {
            node,
            boot: node * 1000,
            mono_ms,
        }
    }

    fn auto_at(decision: Decision, wall_ms: u64, clock: LeaderClock) -> Command {
        Command::automatic(decision, "detector", "score", AutoLimits::default())
            .clocked(wall_ms, clock)
    }

    fn tick_at(wall_ms: u64, clock: LeaderClock) -> Command {
        Command::tick("detector").clocked(wall_ms, clock)
    }

    fn refused_for_dwell(out: &Outcome) -> bool {
        matches!(
            out,
            Outcome::Rejected {
                rule: RejectRule::DwellTime,
                ..
            }
        )
    }

    /// 42.7: leader B's wall clock runs 50 s ahead of leader A's. Compared
    /// wall to wall, B would fail a zone back 15 s after A failed it over;
    /// the dwell clock counts only what each leader measured itself.
    #[test]
    fn a_leader_whose_clock_runs_ahead_cannot_shorten_the_dwell() {
        let skew = 50_000;
        let t0 = 1_700_000_000_000;
        let mut s = three_zones();
        assert_eq!(
            s.apply(&auto_at(fo("az-a", "az-b"), t0, leader(1, 7_000))),
            Outcome::Applied { version: 1 }
        );
        // A leads 10 s more and ticks, then B takes over.
        assert!(matches!(
            s.apply(&tick_at(t0 + 10_000, leader(1, 17_000))),
            Outcome::Applied { .. }
        ));
        // 15 s after the failover, by B's clock 65 s: the wall rule alone
        // would let it pass (the bug).
        let early = auto_at(
            Decision::Failback { zone: z("az-a") },
            t0 + 15_000 + skew,
            leader(2, 500),
        );
        let wall_only = Command::automatic(
            Decision::Failback { zone: z("az-a") },
            "detector",
            "score",
            AutoLimits::default(),
        )
        .stamped(t0 + 15_000 + skew);
        assert!(
            s.check(&wall_only).is_ok(),
            "the wall-clock rule alone is fooled"
        );
        assert!(
            refused_for_dwell(&s.apply(&early)),
            "B's clock ahead must not shorten the dwell"
        );
        // B's first stamp (a tick) counts nothing across the change of
        // leader; from it on B's own monotonic time counts.
        assert!(matches!(
            s.apply(&tick_at(t0 + 16_000 + skew, leader(2, 1_000))),
            Outcome::Applied { .. }
        ));
        assert_eq!(s.dwell_clock().elapsed_ms, 10_000);
        assert!(s.dwell_running(&leader(2, 1_000), 60_000));
        // A measured 10 s; B must measure 50 s more: 49.999 s is early.
        let b = |mono| {
            auto_at(
                Decision::Failback { zone: z("az-a") },
                t0 + 100_000 + skew,
                leader(2, mono),
            )
        };
        assert!(refused_for_dwell(&s.apply(&b(1_000 + 49_999))));
        assert!(!s.dwell_running(&leader(2, 51_000), 60_000));
        assert_eq!(s.apply(&b(1_000 + 50_000)), Outcome::Applied { version: 2 });
    }

    #[test]
    fn a_wall_clock_stepping_forward_on_one_leader_cannot_shorten_the_dwell() {
        let mut s = three_zones();
        s.apply(&auto_at(fo("az-a", "az-b"), 0, leader(1, 0)));
        // The leader's wall clock jumps an hour ahead 10 s later.
        let out = s.apply(&auto_at(
            Decision::Failback { zone: z("az-a") },
            3_600_000,
            leader(1, 10_000),
        ));
        assert!(refused_for_dwell(&out), "{out:?}");
        assert_eq!(
            s.apply(&auto_at(
                Decision::Failback { zone: z("az-a") },
                3_660_000,
                leader(1, 60_000)
            )),
            Outcome::Applied { version: 2 }
        );
    }

    #[test]
    fn a_leader_whose_clock_runs_behind_waits_its_own_dwell_and_a_tick_changes_nothing_else() {
        let mut s = three_zones();
        s.apply(&auto_at(fo("az-a", "az-b"), 100_000, leader(1, 0)));
        let before = s.clone();
        // A tick takes no version and no history record, even frozen.
        s.apply(&freeze());
        let frozen_version = s.decision_version();
        assert!(
            matches!(s.apply(&tick_at(0, leader(1, 5))), Outcome::Applied { version } if version == frozen_version)
        );
        assert_eq!(
            s.all_decisions(10).len(),
            before.all_decisions(10).len() + 1
        );
        s.apply(&unfreeze());
        // B's wall clock is 30 s behind A's: B's own 60 s on the dwell
        // clock are not enough, the wall rule still asks for A's 60 s.
        s.apply(&tick_at(70_000, leader(2, 0)));
        let out = s.apply(&auto_at(
            Decision::Failback { zone: z("az-a") },
            130_000,
            leader(2, 60_000),
        ));
        assert!(
            matches!(
                out,
                Outcome::Rejected {
                    rule: RejectRule::DwellTime,
                    ..
                }
            ),
            "{out:?}"
        );
        assert!(matches!(
            s.apply(&auto_at(
                Decision::Failback { zone: z("az-a") },
                160_000,
                leader(2, 90_000)
            )),
            Outcome::Applied { .. }
        ));
    }
}
