//! Automatic failover at run time: every node's reporter (observations and
//! tenant demand to the leader each period), the leader's assessment loop
//! (detector → dry run → propose; else, at most every rebalance interval,
//! a quota rebalance when the demand drifted), and the status the binary
//! exports.
//!
//! The deciding happens in [`crate::detect`] (scores) and
//! [`crate::state`] (safety rules); this module only moves observations,
//! keeps counters and proposes. It knows neither the node nor the network:
//! the loops are handed a `Propose` and a `SendReport` at start.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::{leader_clock, unix_ms, unix_ms_on};
use crate::command::{
    AutoLimits, Command, Decision, Origin, RejectRule, Rejection, MAX_EVIDENCE_BYTES,
};
use crate::detect::{
    period_end, Assessment, Detector, FailoverConfig, PeriodObservations, Proposal, Report,
    TenantDemand, ZoneHealth, ZoneObservation,
};
use crate::lock::lock;
use crate::propose::{quorum_lost, Propose, ProposeError};
use crate::quota::{self, RebalancePlan};
use crate::state::ClusterState;
use crate::types::alias::RaftMetrics;
use crate::view::{NodeId, ZoneId};

/// Where a node's per-period observations come from: called once per
/// period, it returns what this node saw of each zone since the last call.
/// It must not block (it runs on the reporter task).
pub type ObservationSource = Arc<dyn Fn() -> Vec<ZoneObservation> + Send + Sync>;

/// Where a node's per-period tenant demand comes from (the data plane's
/// quota stage): called once per period, it returns the requests each
/// tenant offered since the last call. It must not block.
pub type DemandSource = Arc<dyn Fn() -> Vec<TenantDemand> + Send + Sync>;

/// Where the leader hands the spend in each node's report (the data
/// plane's cluster-wide spend view). It must not block.
pub type SpendSink = Arc<dyn Fn(NodeId, &[TenantDemand]) + Send + Sync>;

/// A node's demand is fresh for this many periods after its report's end;
/// older, the node counts as silent (it keeps its weight).
const DEMAND_FRESH_PERIODS: u64 = 3;

/// The answer to a report: the leader's latest assessment, so followers
/// can show zone scores too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportAck {
    /// Whether the receiver leads (and so ingested the report).
    pub leader: bool,
    /// The receiver's latest assessment (empty unless it leads).
    pub zones: Vec<ZoneHealth>,
    pub period_end_ms: Option<u64>,
}

/// The detector's state as the binary exports it (admin API, metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FailoverStatus {
    /// Whether this node assessed `zones` itself (it leads).
    pub assessed_here: bool,
    /// Per-zone health: on the leader its own assessment; on a follower the
    /// leader's, as returned for this node's last report (at most about a
    /// period old); empty before either exists.
    pub zones: Vec<ZoneHealth>,
    /// End of the period `zones` describe.
    pub period_end_ms: Option<u64>,
    /// On the leader: requests sent to each zone in that period, from
    /// every node's report (empty on a follower).
    #[serde(default)]
    pub zone_requests: BTreeMap<ZoneId, u64>,
    /// The latest assessment found every zone below the cutoff.
    pub fail_static: bool,
    /// Periods assessed in fail static on this node (while leading).
    pub fail_static_periods: u64,
    /// Automatic decisions this node proposed / that committed and applied
    /// / that a safety rule refused at apply time.
    pub auto_proposed: u64,
    pub auto_applied: u64,
    pub auto_refused: u64,
    /// From the start of the first bad period to the commit of the last
    /// automatic failover this node proposed.
    pub last_detect_latency: Option<Duration>,
    /// Reports this node sent / that failed / that it received.
    pub reports_sent: u64,
    pub reports_failed: u64,
    pub reports_received: u64,
}

/// Sends this node's report to the leader: what the reporter needs from
/// the network.
pub(crate) trait SendReport: Send + Sync + 'static {
    type Error: std::fmt::Display + Send;

    /// Deliver `report` to node `to` within `ttl`.
    fn send_report(
        &self,
        to: NodeId,
        report: &Report,
        ttl: Duration,
    ) -> impl Future<Output = Result<ReportAck, Self::Error>> + Send;
}

/// What the reporter, the leader loop and the report RPC share.
pub struct Failover {
    me: NodeId,
    config: Mutex<FailoverConfig>,
    source: Mutex<Option<ObservationSource>>,
    /// The detector while this node leads, tagged with the term it leads:
    /// a new term starts a new window (silence heard as a follower is no
    /// evidence).
    detector: Mutex<Option<(u64, Detector)>>,
    status: Mutex<FailoverStatus>,
    demand_source: Mutex<Option<DemandSource>>,
    /// The quota rebalance's inputs, once the node set them.
    plan: Mutex<Option<RebalancePlan>>,
    /// On the leader: each node's latest demand (period end, per tenant).
    demand: Mutex<BTreeMap<NodeId, (u64, Vec<TenantDemand>)>>,
    /// On the leader: when it last proposed a rebalance (ms, wall clock).
    last_rebalance_ms: Mutex<u64>,
    /// The tenants' budgets and the serving nodes, once the node set them.
    budget_plan: Mutex<Option<crate::budget::BudgetPlan>>,
    /// On the leader: where reports' spend goes.
    spend_sink: Mutex<Option<SpendSink>>,
    /// On the leader: when each tenant last had traffic on any node (the
    /// end of the latest period a report showed it asking), for the
    /// config safety rule on tenant keys.
    tenant_seen: Mutex<BTreeMap<String, u64>>,
}

impl Failover {
    pub(crate) fn new(me: NodeId, config: FailoverConfig) -> Self {
        Self {
            me,
            config: Mutex::new(config),
            source: Mutex::new(None),
            detector: Mutex::new(None),
            status: Mutex::new(FailoverStatus::default()),
            demand_source: Mutex::new(None),
            plan: Mutex::new(None),
            demand: Mutex::new(BTreeMap::new()),
            last_rebalance_ms: Mutex::new(0),
            budget_plan: Mutex::new(None),
            spend_sink: Mutex::new(None),
            tenant_seen: Mutex::new(BTreeMap::new()),
        }
    }

    /// Tenants that had traffic on some node at or after `since_ms`, as
    /// this leader heard in reports (a new leader knows only what it heard
    /// since it began leading).
    pub(crate) fn tenants_seen_since(&self, since_ms: u64) -> Vec<String> {
        lock(&self.tenant_seen)
            .iter()
            .filter(|(_, at)| **at >= since_ms)
            .map(|(t, _)| t.clone())
            .collect()
    }

    pub(crate) fn set_demand_source(&self, source: DemandSource) {
        *lock(&self.demand_source) = Some(source);
    }

    pub(crate) fn set_rebalance_plan(&self, plan: RebalancePlan) {
        *lock(&self.plan) = Some(plan);
    }

    pub(crate) fn set_budgets(&self, plan: crate::budget::BudgetPlan, sink: SpendSink) {
        *lock(&self.budget_plan) = Some(plan);
        *lock(&self.spend_sink) = Some(sink);
    }

    /// The spend of the fresh reports per node, tenant and period.
    fn fresh_spend(
        &self,
        now_ms: u64,
        period_ms: u64,
    ) -> BTreeMap<NodeId, BTreeMap<String, crate::budget::PeriodSpend>> {
        let oldest = now_ms.saturating_sub(DEMAND_FRESH_PERIODS * period_ms);
        let demand = lock(&self.demand);
        crate::budget::reported_spend(
            demand
                .iter()
                .filter(|(_, (end, _))| *end >= oldest)
                .map(|(n, (_, d))| (*n, d.as_slice())),
        )
    }

    /// The fresh demand per node and tenant, as the rebalance reads it.
    fn fresh_demand(&self, now_ms: u64, period_ms: u64) -> BTreeMap<NodeId, BTreeMap<String, u64>> {
        let oldest = now_ms.saturating_sub(DEMAND_FRESH_PERIODS * period_ms);
        lock(&self.demand)
            .iter()
            .filter(|(_, (end, _))| *end >= oldest)
            .map(|(n, (_, d))| {
                (
                    *n,
                    d.iter().map(|t| (t.tenant.clone(), t.offered)).collect(),
                )
            })
            .collect()
    }

    pub(crate) fn config(&self) -> FailoverConfig {
        lock(&self.config).clone()
    }

    pub(crate) fn set_config(&self, config: FailoverConfig) {
        *lock(&self.config) = config;
    }

    pub(crate) fn set_source(&self, source: ObservationSource) {
        *lock(&self.source) = Some(source);
    }

    pub(crate) fn status(&self) -> FailoverStatus {
        lock(&self.status).clone()
    }

    /// Run `f` on the detector of `term`, starting a fresh one (listening
    /// from `now_ms`) when this node just began leading.
    fn with_detector<R>(&self, term: u64, now_ms: u64, f: impl FnOnce(&mut Detector) -> R) -> R {
        let mut slot = lock(&self.detector);
        if slot.as_ref().map(|(t, _)| *t) != Some(term) {
            *slot = None;
        }
        let (_, detector) = slot.get_or_insert_with(|| (term, Detector::new(now_ms)));
        f(detector)
    }

    fn stop_leading(&self) {
        if lock(&self.detector).take().is_some() {
            let mut status = lock(&self.status);
            status.assessed_here = false;
            status.zone_requests.clear();
        }
    }

    /// A report from a node in `zone` (over RPC, or this node's own).
    pub(crate) fn receive(
        &self,
        leading_term: Option<u64>,
        zone: &ZoneId,
        report: &Report,
        now_ms: u64,
    ) -> ReportAck {
        let Some(term) = leading_term else {
            return ReportAck {
                leader: false,
                zones: Vec::new(),
                period_end_ms: None,
            };
        };
        let config = self.config();
        self.with_detector(term, now_ms, |d| d.ingest(&config, zone, report, now_ms));
        let mut demand = lock(&self.demand);
        let newer = demand
            .get(&report.node)
            .is_none_or(|(end, _)| *end <= report.period_end_ms);
        if newer {
            demand.insert(report.node, (report.period_end_ms, report.demand.clone()));
        }
        drop(demand);
        if newer {
            let sink = lock(&self.spend_sink).clone();
            if let Some(sink) = sink {
                sink(report.node, &report.demand);
            }
        }
        let mut seen = lock(&self.tenant_seen);
        for t in report.demand.iter().filter(|t| t.offered > 0) {
            let at = seen.entry(t.tenant.clone()).or_default();
            *at = (*at).max(report.period_end_ms);
        }
        drop(seen);
        let mut status = lock(&self.status);
        status.reports_received += 1;
        ReportAck {
            leader: true,
            zones: status.zones.clone(),
            period_end_ms: status.period_end_ms,
        }
    }

    /// Assess the window of `term` against the applied `state` and record
    /// the result in the status. Entering and leaving fail static is one
    /// event each: the warning or info line here, with the counter that
    /// moves every fail-static period.
    fn assess(
        &self,
        term: u64,
        config: &FailoverConfig,
        state: &ClusterState,
        now: u64,
    ) -> Assessment {
        let assessment = self.with_detector(term, now, |d| {
            d.prune(config, now);
            d.assess(config, state.zones(), now)
        });
        let mut status = lock(&self.status);
        status.assessed_here = true;
        status.zones = assessment.zones.clone();
        status.zone_requests = assessment.requests.clone();
        status.period_end_ms = Some(assessment.period_end_ms);
        if assessment.fail_static {
            status.fail_static_periods += 1;
            if !status.fail_static {
                tracing::warn!(
                    period_end_ms = assessment.period_end_ms,
                    cutoff = config.cutoff,
                    "every zone scores below the cutoff: failing static, no automatic decision"
                );
            }
        } else if status.fail_static {
            tracing::info!("a zone scores above the cutoff again: fail static ends");
        }
        status.fail_static = assessment.fail_static;
        assessment
    }

    /// A report was delivered (`Ok`) or not.
    fn note_sent<E: std::fmt::Display>(&self, leader: NodeId, result: Result<ReportAck, E>) {
        let mut status = lock(&self.status);
        match result {
            Ok(ack) => {
                status.reports_sent += 1;
                if ack.leader && !status.assessed_here {
                    status.zones = ack.zones;
                    status.period_end_ms = ack.period_end_ms;
                }
            }
            Err(e) => {
                status.reports_failed += 1;
                tracing::debug!(leader, error = %e, "zone report not delivered");
            }
        }
    }
}

/// The leader's term, when this node leads.
fn leading_term(m: &RaftMetrics) -> Option<u64> {
    (m.state == ServerState::Leader).then_some(m.current_term)
}

/// Sleep until `offset_ms` after the next aligned period boundary; returns
/// that boundary, or `None` when the node stops.
async fn next_tick(
    stop: &mut watch::Receiver<bool>,
    period_ms: u64,
    offset_ms: u64,
) -> Option<u64> {
    let now = unix_ms();
    let boundary = (now / period_ms + 1) * period_ms;
    let wait = Duration::from_millis(boundary + offset_ms - now);
    tokio::select! {
        _ = stop.wait_for(|s| *s) => None,
        _ = tokio::time::sleep(wait) => Some(boundary),
    }
}

/// Every node's reporter: every period, this node's observations with
/// their history go to the leader (or straight into the detector, on the
/// leader).
pub(crate) struct ReportLoop<S> {
    pub failover: Arc<Failover>,
    pub sender: S,
    pub metrics: watch::Receiver<RaftMetrics>,
    /// This node's zone: the zone its reports come from.
    pub zone: ZoneId,
    pub stop: watch::Receiver<bool>,
}

impl<S: SendReport> ReportLoop<S> {
    pub(crate) async fn run(self) {
        let mut history: VecDeque<PeriodObservations> = VecDeque::new();
        let mut stop = self.stop.clone();
        loop {
            let config = self.failover.config();
            let Some(boundary) = next_tick(&mut stop, config.period_ms(), 0).await else {
                return;
            };
            if !config.enabled {
                continue;
            }
            let source = lock(&self.failover.source).clone();
            let zones = source.map(|f| f()).unwrap_or_default();
            let demand_source = lock(&self.failover.demand_source).clone();
            let demand = demand_source.map(|f| f()).unwrap_or_default();
            let end = period_end(boundary, config.period_ms());
            let report = Report {
                node: self.failover.me,
                period_end_ms: end,
                zones: zones.clone(),
                history: history.iter().cloned().collect(),
                demand,
            };
            history.push_back(PeriodObservations {
                period_end_ms: end,
                zones,
            });
            while history.len() > config.history_periods as usize {
                history.pop_front();
            }
            self.send(report, &config).await;
        }
    }

    async fn send(&self, report: Report, config: &FailoverConfig) {
        let (leader, term) = {
            let m = self.metrics.borrow();
            (m.current_leader, leading_term(&m))
        };
        if term.is_some() {
            self.failover
                .receive(term, &self.zone, &report, unix_ms_on(self.failover.me));
            return;
        }
        let Some(leader) = leader else { return };
        // A report later than a period is worthless; the next one carries
        // this one as history.
        let ttl = config.period.min(Duration::from_secs(2));
        let result = self.sender.send_report(leader, &report, ttl).await;
        self.failover.note_sent(leader, result);
    }
}

/// How long a leader goes without a stamp while a dwell runs before it
/// ticks: a period, or a twelfth of the dwell when longer (a change of
/// leader then lengthens a dwell by about that much at most, and a 60 s
/// dwell takes about 12 ticks, not 30).
fn tick_every_ms(period_ms: u64, dwell_ms: u64) -> u64 {
    period_ms.max(dwell_ms / 12)
}

/// The leader loop: every period, a grace after its end, on the leader
/// only: assess, dry-run and propose at most one automatic decision.
pub(crate) struct LeadLoop<P> {
    pub failover: Arc<Failover>,
    pub proposer: P,
    pub metrics: watch::Receiver<RaftMetrics>,
    /// The check-quorum window.
    pub election_timeout_max: Duration,
    pub state_rx: watch::Receiver<Arc<ClusterState>>,
    pub stop: watch::Receiver<bool>,
}

/// What the leader loop already logged, so a condition that lasts many
/// periods is one log line.
#[derive(Default)]
struct Logged {
    refusal: Option<(String, RejectRule)>,
    no_target: Option<ZoneId>,
}

impl Logged {
    fn no_target(&mut self, zone: &Option<ZoneId>) {
        if *zone != self.no_target {
            if let Some(zone) = zone {
                tracing::warn!(%zone, "zone should fail over but no active zone is healthy enough to take it");
            }
            self.no_target = zone.clone();
        }
    }

    fn refusal(&mut self, decision: &Decision, r: &Rejection) {
        let zone = decision
            .zones()
            .first()
            .map(ZoneId::to_string)
            .unwrap_or_default();
        let key = (zone, r.rule);
        if self.refusal.as_ref() != Some(&key) {
            tracing::info!(
                ?decision,
                rule = r.rule.name(),
                message = r.message,
                "automatic decision held back by a safety rule"
            );
            self.refusal = Some(key);
        }
    }
}

impl<P: Propose> LeadLoop<P> {
    pub(crate) async fn run(self) {
        let mut stop = self.stop.clone();
        let mut logged = Logged::default();
        loop {
            let config = self.failover.config();
            let Some(_) = next_tick(&mut stop, config.period_ms(), config.grace_ms()).await else {
                return;
            };
            let (term, no_quorum) = {
                let m = self.metrics.borrow();
                (leading_term(&m), quorum_lost(&m, self.election_timeout_max))
            };
            let Some(term) = term.filter(|_| config.enabled) else {
                self.failover.stop_leading();
                continue;
            };
            let now = unix_ms_on(self.failover.me);
            let state = self.state_rx.borrow().clone();
            let assessment = self.failover.assess(term, &config, &state, now);
            logged.no_target(&assessment.no_target);
            let Some(proposal) = assessment.proposal else {
                logged.refusal = None;
                // No zone decision this period: the dwell clock's tick and
                // the quota rebalance may go.
                if !no_quorum {
                    self.tick(&state, &config).await;
                    self.rebalance(&state, now, config.period_ms()).await;
                }
                continue;
            };
            if no_quorum {
                tracing::info!(
                    decision = ?proposal.decision,
                    "not proposing: no quorum heard within the election timeout"
                );
                continue;
            }
            let cmd = self.command(&proposal, &config, &state);
            // Dry run against the applied state first: a decision the rules
            // refuse (frozen, dwell, limit) would otherwise be committed as
            // a refusal every period.
            let stamped = cmd.clone().clocked(now, leader_clock(self.failover.me));
            if let Err(r) = state.check(&stamped) {
                logged.refusal(&proposal.decision, &r);
                continue;
            }
            logged.refusal = None;
            self.commit(proposal, cmd).await;
        }
    }

    /// The automatic command for `proposal`, checked against `config`'s
    /// limits and compare-and-set on the version it assessed.
    fn command(
        &self,
        proposal: &Proposal,
        config: &FailoverConfig,
        state: &ClusterState,
    ) -> Command {
        let evidence = serde_json::to_string(&proposal.evidence).unwrap_or_default();
        Command::automatic(
            proposal.decision.clone(),
            format!("detector:{}", self.failover.me),
            proposal.reason.clone(),
            config.limits(),
        )
        .if_version(state.decision_version())
        .with_evidence(evidence)
    }

    /// The dwell clock's tick: while some zone's dwell runs, a leader whose
    /// process did not stamp the last command, or stamped it
    /// [`tick_every_ms`] or more ago, proposes a `Tick`, so the time it
    /// measures counts toward the dwell (across a leader change the dwell
    /// clock counts nothing until the new leader's first stamp).
    async fn tick(&self, state: &ClusterState, config: &FailoverConfig) {
        let me = leader_clock(self.failover.me);
        let dwell_ms = config.limits().dwell_ms;
        let every = tick_every_ms(config.period_ms(), dwell_ms);
        let recent = state
            .dwell_clock()
            .last
            .is_some_and(|l| l.same_clock(&me) && me.mono_ms.saturating_sub(l.mono_ms) < every);
        if recent || !state.dwell_running(&me, dwell_ms) {
            return;
        }
        let cmd = Command::tick(format!("detector:{}", self.failover.me));
        if let Err(e) = self.proposer.propose(cmd).await {
            tracing::debug!(error = %e, "dwell clock tick not committed");
        }
    }

    /// The quota rebalance: at most every `interval_ms`, when the demand
    /// drifted past the threshold or the groups changed (a failover or
    /// failback), one `QuotaRebalance` whose evidence carries the overflow
    /// lines in force (the decision history keeps them).
    async fn rebalance(&self, state: &ClusterState, now: u64, period_ms: u64) {
        let Some(plan) = lock(&self.failover.plan).clone() else {
            return;
        };
        {
            let last = *lock(&self.failover.last_rebalance_ms);
            if now.saturating_sub(last) < plan.interval_ms {
                return;
            }
        }
        let demand = self.failover.fresh_demand(now, period_ms);
        let weights = quota::plan_rebalance(&plan, state.zones(), state.quota_weights(), &demand);
        let budgets = lock(&self.failover.budget_plan)
            .clone()
            .filter(|b| !b.tenants.is_empty())
            .map(|b| {
                let spend = self.failover.fresh_spend(now, period_ms);
                crate::budget::plan_budgets(&b, state.budgets(), &spend, now)
            });
        let Some(decision) = crate::budget::rebalance_decision(
            weights,
            budgets,
            (state.quota_weights(), state.budgets()),
        ) else {
            return;
        };
        *lock(&self.failover.last_rebalance_ms) = now;
        let lines = quota::overflow_lines(&plan.tenants, state.zones(), state.decision_version());
        let mut evidence = String::new();
        for l in &lines {
            if evidence.len() + l.len() + 1 > MAX_EVIDENCE_BYTES {
                break;
            }
            evidence.push_str(l);
            evidence.push('\n');
        }
        let reason = if !matches!(decision, Decision::Rebalance { .. })
            && lines.is_empty()
            && !state.quota_weights().is_empty()
        {
            "budget grants and recorded spend".to_owned()
        } else if state.quota_weights().is_empty() {
            "the first quota table".to_owned()
        } else if lines.is_empty() {
            "tenant demand moved past the drift threshold".to_owned()
        } else {
            format!(
                "cross-zone overflow: {} tenant(s) in soft_limit",
                lines.len()
            )
        };
        let mut cmd = Command::automatic(
            decision,
            format!("rebalancer:{}", self.failover.me),
            reason,
            AutoLimits::default(),
        )
        .if_version(state.decision_version());
        if !evidence.is_empty() {
            cmd = cmd.with_evidence(evidence.trim_end().to_owned());
        }
        if let Err(r) = cmd.validate().and_then(|()| {
            state
                .check(&cmd.clone().clocked(now, leader_clock(self.failover.me)))
                .map(drop)
        }) {
            tracing::debug!(
                rule = r.rule.name(),
                message = r.message,
                "quota rebalance held back"
            );
            return;
        }
        match self.proposer.propose(cmd).await {
            Ok(applied) => tracing::info!(version = applied.version, "quota rebalance committed"),
            Err(e) => tracing::info!(error = %e, "quota rebalance not committed"),
        }
    }

    /// Propose `cmd` and count what came of it.
    async fn commit(&self, proposal: Proposal, cmd: Command) {
        lock(&self.failover.status).auto_proposed += 1;
        tracing::info!(decision = ?proposal.decision, reason = proposal.reason, "proposing automatic decision");
        match self.proposer.propose(cmd).await {
            Ok(applied) => {
                let latency =
                    Duration::from_millis(unix_ms().saturating_sub(proposal.first_bad_ms));
                let mut status = lock(&self.failover.status);
                status.auto_applied += 1;
                if matches!(proposal.decision, Decision::Failover { .. }) {
                    status.last_detect_latency = Some(latency);
                }
                tracing::info!(
                    version = applied.version,
                    decision = ?proposal.decision,
                    origin = Origin::Automatic.name(),
                    detect_seconds = latency.as_secs_f64(),
                    "automatic decision committed"
                );
            }
            Err(ProposeError::Rejected { rule, message }) => {
                lock(&self.failover.status).auto_refused += 1;
                tracing::info!(rule = rule.name(), message, "automatic decision refused");
            }
            Err(e) => tracing::warn!(error = %e, "automatic decision not committed"),
        }
    }
}
