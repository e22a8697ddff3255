//! The leader's zone-health detector: per-zone observations reported by
//! every node, their sliding window, zone scores, and the automatic
//! failover / failback it proposes. A pure core: it reads no clock (`now`
//! is passed in), does no I/O and never fails.
//!
//! Time is cut into periods aligned to the Unix epoch (`period_end_ms` is a
//! multiple of the period). Every assessment is recomputed from the window,
//! so a newly elected leader that received the reports' own history decides
//! from that history, not from zero, and a report that arrives late still
//! counts at the next assessment.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::millis;
use crate::command::{AutoLimits, Decision};
use crate::view::{NodeId, ZoneId, ZoneStatus};

/// What one node saw of one zone during one period. Rates are fractions
/// (0–1) of the requests it sent there; `gpu_health` is the health
/// subsystem's view of the zone's backends (1 = all healthy).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneObservation {
    pub zone: ZoneId,
    pub gw_error_rate: f64,
    pub timeout_rate: f64,
    pub gpu_health: f64,
    /// Requests the rates are computed over; 0 means the rates carry no
    /// evidence (the score then rests on `gpu_health` alone).
    pub requests: u64,
}

/// One node's observations of one period.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodObservations {
    /// End of the period, ms since the Unix epoch.
    pub period_end_ms: u64,
    pub zones: Vec<ZoneObservation>,
}

/// What a node sends the leader every period: the period just ended and
/// the ones before it (oldest first), so a new leader has history. Not a
/// Raft entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub node: NodeId,
    pub period_end_ms: u64,
    pub zones: Vec<ZoneObservation>,
    pub history: Vec<PeriodObservations>,
    /// Per tenant: requests that reached this node's quota stage in the
    /// period (offered, admitted or not) and those admitted: the leader's
    /// quota rebalance splits zone allocations by them. Format version 2
    /// (older reports read as no demand).
    #[serde(default)]
    pub demand: Vec<TenantDemand>,
}

/// One tenant's demand on one node in one period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDemand {
    pub tenant: String,
    /// Requests that asked (admitted or refused).
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// What the tenant spent on this node (format 4; older reports read
    /// as none).
    #[serde(default)]
    pub spend: DemandSpend,
}

/// One tenant's spend on one node, as its demand report carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandSpend {
    /// Nano-units spent in the period, per answering model (the leader's
    /// cluster-wide spend view sums them).
    pub models: Vec<(String, u64)>,
    /// Spend so far in each budget period (for the leader's budget split).
    pub periods: crate::budget::PeriodSpend,
}

/// [`TenantDemand`] as format versions 2 and 3 laid it out (before spend).
#[derive(Deserialize)]
pub(crate) struct TenantDemandV3 {
    tenant: String,
    offered: u64,
    admitted: u64,
}

/// [`Report`] as format versions 2 and 3 laid it out (demand without
/// spend).
#[derive(Deserialize)]
pub(crate) struct ReportV3 {
    node: NodeId,
    period_end_ms: u64,
    zones: Vec<ZoneObservation>,
    history: Vec<PeriodObservations>,
    demand: Vec<TenantDemandV3>,
}

impl From<ReportV3> for Report {
    fn from(v: ReportV3) -> Self {
        Self {
            node: v.node,
            period_end_ms: v.period_end_ms,
            zones: v.zones,
            history: v.history,
            demand: v
                .demand
                .into_iter()
                .map(|d| TenantDemand {
                    tenant: d.tenant,
                    offered: d.offered,
                    admitted: d.admitted,
                    spend: DemandSpend::default(),
                })
                .collect(),
        }
    }
}

/// [`Report`] as format versions 0 and 1 laid it out (before demand).
#[derive(Deserialize)]
pub(crate) struct ReportV1 {
    node: NodeId,
    period_end_ms: u64,
    zones: Vec<ZoneObservation>,
    history: Vec<PeriodObservations>,
}

impl From<ReportV1> for Report {
    fn from(v: ReportV1) -> Self {
        Self {
            node: v.node,
            period_end_ms: v.period_end_ms,
            zones: v.zones,
            history: v.history,
            demand: Vec::new(),
        }
    }
}

/// Score weights: `score = (gw_error × (1 − gw_err) + timeout × (1 −
/// timeout) + gpu × gpu_health) / (gw_error + timeout + gpu)`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreWeights {
    pub gw_error: f64,
    pub timeout: f64,
    pub gpu: f64,
}

impl Default for ScoreWeights {
    fn default() -> Self {
        Self {
            gw_error: 0.4,
            timeout: 0.4,
            gpu: 0.2,
        }
    }
}

/// The `[failover]` settings. Detector thresholds are the leader's own;
/// the safety limits (`max_auto_failed_over`, `dwell`) travel inside every
/// automatic command, so `apply` checks the proposer's numbers on every
/// node.
#[derive(Clone, Debug, PartialEq)]
pub struct FailoverConfig {
    /// Run the reporter and the detector at all. With it off, nothing is
    /// reported and nothing is decided automatically.
    pub enabled: bool,
    /// Observation period; reports and assessments run once per period.
    pub period: Duration,
    pub weights: ScoreWeights,
    /// A zone scoring below this for `min_periods` consecutive periods is
    /// failed over.
    pub cutoff: f64,
    pub min_periods: u32,
    /// Fail back automatically (off by default: operators fail back).
    pub auto_failback: bool,
    /// A failed-over zone scoring above this for `failback_periods`
    /// consecutive periods is failed back (when `auto_failback`).
    pub failback_threshold: f64,
    pub failback_periods: u32,
    /// How many past periods each report carries and the leader keeps.
    pub history_periods: u32,
    pub max_auto_failed_over: u32,
    /// Minimum time between automatic decisions on one zone, and how long
    /// an operator's decision on a zone holds it against automation.
    pub dwell: Duration,
    /// Preferred failover targets per zone, tried in order before the
    /// healthiest other zone.
    pub fallback_order: BTreeMap<ZoneId, Vec<ZoneId>>,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            period: Duration::from_secs(2),
            weights: ScoreWeights::default(),
            cutoff: 0.4,
            min_periods: 3,
            auto_failback: false,
            failback_threshold: 0.7,
            failback_periods: 5,
            history_periods: 10,
            max_auto_failed_over: 1,
            dwell: Duration::from_secs(60),
            fallback_order: BTreeMap::new(),
        }
    }
}

/// A `[failover]` setting out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid failover setting `{key}`: {reason}")]
pub struct FailoverConfigError {
    pub key: &'static str,
    pub reason: String,
}

impl FailoverConfig {
    /// Check ranges; the binary calls this when it loads `[failover]`.
    pub fn validate(&self) -> Result<(), FailoverConfigError> {
        let bad = |key, reason: String| Err(FailoverConfigError { key, reason });
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        if self.period < Duration::from_millis(10) {
            return bad("period", format!("{:?} is below 10ms", self.period));
        }
        let w = self.weights;
        if [w.gw_error, w.timeout, w.gpu]
            .iter()
            .any(|x| !x.is_finite() || *x < 0.0)
            || w.gw_error + w.timeout + w.gpu <= 0.0
        {
            return bad(
                "weights",
                format!("{w:?}: weights must be non-negative with a positive sum"),
            );
        }
        if !unit(self.cutoff) {
            return bad("cutoff", format!("{} is not within 0..=1", self.cutoff));
        }
        if !unit(self.failback_threshold) || self.failback_threshold < self.cutoff {
            return bad(
                "failback_threshold",
                format!(
                    "{} must be within 0..=1 and not below the cutoff {}",
                    self.failback_threshold, self.cutoff
                ),
            );
        }
        if self.min_periods == 0 {
            return bad("min_periods", "must be at least 1".into());
        }
        if self.failback_periods == 0 {
            return bad("failback_periods", "must be at least 1".into());
        }
        let needed = self.min_periods.max(self.failback_periods) + 1;
        if self.history_periods < needed {
            return bad(
                "history_periods",
                format!(
                    "{} is too short: at least max(min_periods, failback_periods) + 1 = {needed}",
                    self.history_periods
                ),
            );
        }
        for (zone, order) in &self.fallback_order {
            if order.contains(zone) {
                return bad(
                    "fallback_order",
                    format!("zone {zone} lists itself as a fallback"),
                );
            }
        }
        Ok(())
    }

    /// The safety limits stamped into automatic commands.
    pub fn limits(&self) -> AutoLimits {
        AutoLimits {
            max_auto_failed_over: self.max_auto_failed_over,
            dwell_ms: millis(self.dwell),
        }
    }

    pub(crate) fn period_ms(&self) -> u64 {
        millis(self.period).max(1)
    }

    /// How long after a period ends the leader assesses it: reports need a
    /// moment to arrive, and the detection budget is `min_periods × period
    /// + 1 s`, so a quarter period, at most 250 ms.
    pub(crate) fn grace_ms(&self) -> u64 {
        (self.period_ms() / 4).min(250)
    }
}

/// The end of the aligned period that `ms` falls in (a period ending
/// exactly at `ms` included).
pub fn period_end(ms: u64, period_ms: u64) -> u64 {
    ms.div_ceil(period_ms).saturating_mul(period_ms)
}

/// The most periods an automatic decision's evidence lists (the newest
/// ones), so the command stays within
/// [`crate::command::MAX_EVIDENCE_BYTES`]; the reason still states the whole
/// run's length.
pub const MAX_EVIDENCE_PERIODS: usize = 32;

/// One zone in one period, aggregated over reporters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeriodScore {
    pub period_end_ms: u64,
    /// `None`: no evidence about the zone in this period.
    pub score: Option<f64>,
    /// Request-weighted over reporters; `None` without requests.
    pub gw_error_rate: Option<f64>,
    pub timeout_rate: Option<f64>,
    /// Mean over reporters.
    pub gpu_health: Option<f64>,
    pub requests: u64,
    /// Reporters with an observation of the zone in this period.
    pub reporters: u32,
    /// The zone's own nodes sent nothing and no other node reached it:
    /// the score is 0 by rule.
    pub silent: bool,
}

impl PeriodScore {
    fn unknown(period_end_ms: u64) -> Self {
        Self {
            period_end_ms,
            score: None,
            gw_error_rate: None,
            timeout_rate: None,
            gpu_health: None,
            requests: 0,
            reporters: 0,
            silent: false,
        }
    }
}

/// A zone's health as the leader last assessed it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneHealth {
    pub zone: ZoneId,
    /// The latest assessed period's score; `None` without evidence.
    pub score: Option<f64>,
    pub gw_error_rate: Option<f64>,
    pub timeout_rate: Option<f64>,
    pub gpu_health: Option<f64>,
    /// Consecutive periods below the cutoff, up to the latest.
    pub bad_periods: u32,
    /// Consecutive periods above the failback threshold, up to the latest.
    pub good_periods: u32,
    /// Reporters with an observation of the zone in the latest period.
    pub reporters: u32,
    pub silent: bool,
    /// End of the period these numbers describe.
    pub period_end_ms: Option<u64>,
}

/// What the detector attaches to an automatic decision (as JSON in the
/// command's `evidence`): the periods that triggered it, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub zone: ZoneId,
    /// `below_cutoff` (failover) or `above_failback_threshold` (failback).
    pub trigger: String,
    pub threshold: f64,
    pub periods: Vec<PeriodScore>,
    pub target: Option<ZoneId>,
    pub target_score: Option<f64>,
    /// The leader's assessment time.
    pub assessed_at_ms: u64,
}

/// A decision the detector wants, before the safety rules see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    pub decision: Decision,
    pub reason: String,
    pub evidence: Evidence,
    /// Start of the first period of the triggering run: detection latency
    /// is measured from here to the commit.
    pub first_bad_ms: u64,
}

/// One assessment.
#[derive(Clone, Debug, PartialEq)]
pub struct Assessment {
    /// End of the newest period assessed.
    pub period_end_ms: u64,
    pub zones: Vec<ZoneHealth>,
    /// Every zone scored below the cutoff at once: the detector is more
    /// likely wrong than every zone, so it decides nothing.
    pub fail_static: bool,
    /// A zone that should fail over but has no healthy active target.
    pub no_target: Option<ZoneId>,
    pub proposal: Option<Proposal>,
    /// Requests the reporters sent to each zone in the period its health
    /// describes: where traffic goes (operators ask "did it move?").
    pub requests: BTreeMap<ZoneId, u64>,
}

/// One reporter's window: its zone and observations by period end.
#[derive(Clone, Debug, Default)]
struct Reporter {
    zone: Option<ZoneId>,
    periods: BTreeMap<u64, Vec<ZoneObservation>>,
}

/// The leader's sliding window of reports and the scoring over it.
#[derive(Clone, Debug)]
pub struct Detector {
    reporters: BTreeMap<NodeId, Reporter>,
    /// From when this detector has been receiving reports: silence before
    /// that is no evidence (a new leader has not been listening).
    listening_since_ms: u64,
}

/// How a zone fared in one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Unknown,
    Bad,
    /// At or above the cutoff, not above the failback threshold.
    Fair,
    Healthy,
}

impl Detector {
    /// An empty window; silence counts only for periods that start at or
    /// after `listening_since_ms`.
    pub fn new(listening_since_ms: u64) -> Self {
        Self {
            reporters: BTreeMap::new(),
            listening_since_ms,
        }
    }

    /// Add a report from a node in `reporter_zone`. Periods are snapped to
    /// the aligned period they end in; a later report for the same period
    /// replaces the earlier one; periods outside the window (older than
    /// `history_periods`, or more than one period in the future) are
    /// dropped, and so is everything that fell out of the window.
    pub fn ingest(
        &mut self,
        cfg: &FailoverConfig,
        reporter_zone: &ZoneId,
        report: &Report,
        now_ms: u64,
    ) {
        let p = cfg.period_ms();
        let oldest = self.oldest_kept(cfg, now_ms);
        let newest = now_ms.saturating_add(p);
        let entry = self.reporters.entry(report.node).or_default();
        entry.zone = Some(reporter_zone.clone());
        let periods = report
            .history
            .iter()
            .map(|h| (h.period_end_ms, &h.zones))
            .chain([(report.period_end_ms, &report.zones)]);
        for (end, zones) in periods {
            let end = period_end(end, p);
            if end > oldest && end <= newest {
                let clean = zones.iter().filter(|o| o.is_finite()).cloned().collect();
                entry.periods.insert(end, clean);
            }
        }
        self.prune(cfg, now_ms);
    }

    fn oldest_kept(&self, cfg: &FailoverConfig, now_ms: u64) -> u64 {
        let span = cfg
            .period_ms()
            .saturating_mul(u64::from(cfg.history_periods) + 1);
        now_ms.saturating_sub(span)
    }

    /// Forget periods that fell out of the window, and silent reporters.
    pub fn prune(&mut self, cfg: &FailoverConfig, now_ms: u64) {
        let oldest = self.oldest_kept(cfg, now_ms);
        for r in self.reporters.values_mut() {
            r.periods.retain(|end, _| *end > oldest);
        }
        self.reporters.retain(|_, r| !r.periods.is_empty());
    }

    /// Score one zone in one period.
    fn score(
        &self,
        cfg: &FailoverConfig,
        zone: &ZoneId,
        end: u64,
        newest: u64,
        now_ms: u64,
    ) -> PeriodScore {
        let mut out = PeriodScore::unknown(end);
        let present: Vec<(&Reporter, &Vec<ZoneObservation>)> = self
            .reporters
            .values()
            .filter_map(|r| r.periods.get(&end).map(|obs| (r, obs)))
            .collect();
        if present.is_empty() {
            return out;
        }
        let inside = present.iter().any(|(r, _)| r.zone.as_ref() == Some(zone));
        let about: Vec<(bool, &ZoneObservation)> = present
            .iter()
            .flat_map(|(r, obs)| {
                let own = r.zone.as_ref() == Some(zone);
                obs.iter()
                    .filter(|o| &o.zone == zone)
                    .map(move |o| (own, o))
            })
            .collect();
        // Reach: with the zone's own nodes silent, another zone's node saw
        // a healthy backend there or got answers from it.
        let reached = about
            .iter()
            .any(|(_, o)| o.gpu_health > 0.0 || (o.requests > 0 && o.gw_error_rate < 1.0));
        if inside || (!about.is_empty() && reached) {
            if about.is_empty() {
                return out;
            }
            return aggregate(cfg, end, about.iter().map(|(_, o)| *o));
        }
        // The zone's nodes are silent and nobody reached it. That counts
        // only when it is evidence: some node reports observations at all
        // (sources are wired), this detector listened for the whole period,
        // and the period is not the newest (whose reports may be in flight).
        let evidence = present.iter().any(|(_, obs)| !obs.is_empty());
        let listened = end.saturating_sub(cfg.period_ms()) >= self.listening_since_ms;
        let settled = end < newest && end.saturating_add(cfg.period_ms()) <= now_ms;
        if evidence && listened && settled {
            out.score = Some(0.0);
            out.silent = true;
            out.reporters = about.len() as u32;
        }
        out
    }

    /// Assess every zone of `zones` (the applied zone status) at `now_ms`
    /// and pick at most one decision: the worst zone's failover if any
    /// zone's bad run reached `min_periods`, else (with `auto_failback`) a
    /// failback. The safety rules in `apply` have the last word.
    pub fn assess(
        &self,
        cfg: &FailoverConfig,
        zones: &BTreeMap<ZoneId, ZoneStatus>,
        now_ms: u64,
    ) -> Assessment {
        let p = cfg.period_ms();
        // The newest period that ended at least `grace` ago.
        let newest = (now_ms.saturating_sub(cfg.grace_ms()) / p) * p;
        let ends: Vec<u64> = (0..u64::from(cfg.history_periods))
            .map_while(|i| newest.checked_sub(i * p))
            .filter(|e| *e > 0)
            .collect();
        let mut runs = BTreeMap::new();
        let mut requests = BTreeMap::new();
        let health: Vec<ZoneHealth> = zones
            .keys()
            .map(|zone| {
                let scores: Vec<PeriodScore> = ends
                    .iter()
                    .map(|e| self.score(cfg, zone, *e, newest, now_ms))
                    .collect();
                let (health, run, sent) = zone_runs(cfg, zone, &scores, newest);
                runs.insert(zone.clone(), run);
                requests.insert(zone.clone(), sent);
                health
            })
            .collect();
        let mut out = Assessment {
            period_end_ms: newest,
            fail_static: !health.is_empty()
                && health
                    .iter()
                    .all(|h| h.score.is_some_and(|s| s < cfg.cutoff)),
            zones: health,
            no_target: None,
            proposal: None,
            requests,
        };
        if out.fail_static {
            return out;
        }
        let judge = Judge {
            cfg,
            zones,
            health: &out.zones,
            newest,
            now_ms,
        };
        match judge.failover(&mut runs) {
            Some(Ok(proposal)) => out.proposal = Some(proposal),
            Some(Err(no_target)) => out.no_target = Some(no_target),
            None if cfg.auto_failback => out.proposal = judge.failback(&mut runs),
            None => {}
        }
        out
    }

    /// Reporters currently in the window.
    pub fn reporters(&self) -> usize {
        self.reporters.len()
    }
}

impl ZoneObservation {
    /// NaN or infinite numbers make an observation worthless, not alarming:
    /// it is dropped rather than read as an outage.
    fn is_finite(&self) -> bool {
        self.gw_error_rate.is_finite()
            && self.timeout_rate.is_finite()
            && self.gpu_health.is_finite()
    }
}

/// Aggregate observations of one zone in one period: error and timeout
/// rates weighted by requests, GPU health averaged over reporters. Without
/// any requests the rates carry no evidence and the score is the GPU
/// health alone (an idle zone is judged by its backends, not scored as
/// perfect).
fn aggregate<'a>(
    cfg: &FailoverConfig,
    end: u64,
    obs: impl Iterator<Item = &'a ZoneObservation>,
) -> PeriodScore {
    let clamp = |x: f64| x.clamp(0.0, 1.0);
    let (mut n, mut req, mut err, mut tmo, mut gpu) = (0u32, 0u64, 0.0, 0.0, 0.0);
    for o in obs {
        n += 1;
        req += o.requests;
        let w = o.requests as f64;
        err += w * clamp(o.gw_error_rate);
        tmo += w * clamp(o.timeout_rate);
        gpu += clamp(o.gpu_health);
    }
    let mut out = PeriodScore::unknown(end);
    if n == 0 {
        return out;
    }
    let gpu = gpu / f64::from(n);
    let w = cfg.weights;
    let score = if req > 0 {
        let (err, tmo) = (err / req as f64, tmo / req as f64);
        out.gw_error_rate = Some(err);
        out.timeout_rate = Some(tmo);
        (w.gw_error * (1.0 - err) + w.timeout * (1.0 - tmo) + w.gpu * gpu)
            / (w.gw_error + w.timeout + w.gpu)
    } else {
        gpu
    };
    out.score = Some(score);
    out.gpu_health = Some(gpu);
    out.requests = req;
    out.reporters = n;
    out
}

/// A zone's consecutive bad and healthy periods up to the latest one,
/// newest first.
#[derive(Default)]
struct Runs {
    bad: Vec<PeriodScore>,
    good: Vec<PeriodScore>,
}

/// One zone's health and runs from its period `scores` (newest first).
fn zone_runs(
    cfg: &FailoverConfig,
    zone: &ZoneId,
    scores: &[PeriodScore],
    newest: u64,
) -> (ZoneHealth, Runs, u64) {
    // The newest period may lack reports still in flight: when it says
    // nothing, the one before speaks for now.
    let skip = usize::from(scores.first().is_some_and(|s| s.score.is_none()));
    let verdict = |s: &PeriodScore| match s.score {
        None => Verdict::Unknown,
        Some(x) if x < cfg.cutoff => Verdict::Bad,
        Some(x) if x > cfg.failback_threshold => Verdict::Healthy,
        Some(_) => Verdict::Fair,
    };
    let run = |want: Verdict| -> Vec<PeriodScore> {
        scores
            .iter()
            .skip(skip)
            .take_while(|s| verdict(s) == want)
            .cloned()
            .collect()
    };
    let runs = Runs {
        bad: run(Verdict::Bad),
        good: run(Verdict::Healthy),
    };
    let c = scores
        .get(skip)
        .cloned()
        .unwrap_or_else(|| PeriodScore::unknown(newest));
    let health = ZoneHealth {
        zone: zone.clone(),
        score: c.score,
        gw_error_rate: c.gw_error_rate,
        timeout_rate: c.timeout_rate,
        gpu_health: c.gpu_health,
        bad_periods: runs.bad.len() as u32,
        good_periods: runs.good.len() as u32,
        reporters: c.reporters,
        silent: c.silent,
        period_end_ms: c.score.map(|_| c.period_end_ms),
    };
    (health, runs, c.requests)
}

/// The failover target for `from`: the first eligible zone of its
/// fallback order, else the healthiest eligible zone (ties to the first by
/// name). Eligible: another zone, active in `zones` (a zone missing there
/// never is), scoring at or above the cutoff. The detector's choice, and
/// the one `/admin/v1/outlook` (and `ctl failover` without `--to`) shows.
pub fn failover_target(
    cfg: &FailoverConfig,
    zones: &BTreeMap<ZoneId, ZoneStatus>,
    health: &[ZoneHealth],
    from: &ZoneId,
) -> Option<ZoneId> {
    let score = |z: &ZoneId| health.iter().find(|h| &h.zone == z).and_then(|h| h.score);
    let eligible = |z: &ZoneId| {
        z != from
            && zones.get(z) == Some(&ZoneStatus::Active)
            && score(z).is_some_and(|s| s >= cfg.cutoff)
    };
    let preferred = cfg
        .fallback_order
        .get(from)
        .and_then(|order| order.iter().find(|z| eligible(z)).cloned());
    preferred.or_else(|| {
        zones
            .keys()
            .filter(|z| eligible(z))
            .max_by(|a, b| {
                let s = |z| score(z).unwrap_or(0.0);
                s(a).total_cmp(&s(b)).then_with(|| b.cmp(a))
            })
            .cloned()
    })
}

/// Picks the decision of one assessment from its zones' health.
struct Judge<'a> {
    cfg: &'a FailoverConfig,
    zones: &'a BTreeMap<ZoneId, ZoneStatus>,
    health: &'a [ZoneHealth],
    newest: u64,
    now_ms: u64,
}

impl Judge<'_> {
    fn score_of(&self, z: &ZoneId) -> Option<f64> {
        self.health
            .iter()
            .find(|h| &h.zone == z)
            .and_then(|h| h.score)
    }

    fn status(&self, z: &ZoneId) -> ZoneStatus {
        // A zone missing from the applied state is never a candidate.
        self.zones.get(z).cloned().unwrap_or(ZoneStatus::Draining)
    }

    /// Start of the first period of a run (newest first): detection latency
    /// is measured from here.
    fn run_start(&self, periods: &[PeriodScore]) -> u64 {
        periods
            .last()
            .map(|s| s.period_end_ms.saturating_sub(self.cfg.period_ms()))
            .unwrap_or(self.newest)
    }

    fn target(&self, from: &ZoneId) -> Option<ZoneId> {
        failover_target(self.cfg, self.zones, self.health, from)
    }

    /// The worst active zone with a long enough bad run, failed over to
    /// its target; `Err(zone)` when it has none; `None` when no zone is bad
    /// for long enough.
    fn failover(&self, runs: &mut BTreeMap<ZoneId, Runs>) -> Option<Result<Proposal, ZoneId>> {
        let cfg = self.cfg;
        let from = self
            .health
            .iter()
            .filter(|h| self.status(&h.zone) == ZoneStatus::Active)
            .filter(|h| h.bad_periods >= cfg.min_periods)
            .min_by(|a, b| {
                let (x, y) = (a.score.unwrap_or(0.0), b.score.unwrap_or(0.0));
                x.total_cmp(&y).then_with(|| a.zone.cmp(&b.zone))
            })?
            .zone
            .clone();
        let Some(to) = self.target(&from) else {
            return Some(Err(from));
        };
        let mut periods = runs.remove(&from).unwrap_or_default().bad;
        let (from_score, to_score) = (self.score_of(&from), self.score_of(&to));
        let (run, first_bad_ms) = (periods.len(), self.run_start(&periods));
        periods.truncate(MAX_EVIDENCE_PERIODS);
        Some(Ok(Proposal {
            reason: format!(
                "zone {from} scored below {} for {run} consecutive periods (latest {:.2}); {to} scores {:.2}",
                cfg.cutoff,
                from_score.unwrap_or(0.0),
                to_score.unwrap_or(0.0),
            ),
            first_bad_ms,
            evidence: Evidence {
                zone: from.clone(),
                trigger: "below_cutoff".into(),
                threshold: cfg.cutoff,
                periods,
                target_score: to_score,
                target: Some(to.clone()),
                assessed_at_ms: self.now_ms,
            },
            decision: Decision::Failover { from, to },
        }))
    }

    /// The first failed-over zone that stayed healthy long enough.
    fn failback(&self, runs: &mut BTreeMap<ZoneId, Runs>) -> Option<Proposal> {
        let cfg = self.cfg;
        let zone = self
            .health
            .iter()
            .filter(|h| matches!(self.status(&h.zone), ZoneStatus::FailedOver { .. }))
            .find(|h| h.good_periods >= cfg.failback_periods)?
            .zone
            .clone();
        let mut periods = runs.remove(&zone).unwrap_or_default().good;
        let (run, first_bad_ms) = (periods.len(), self.run_start(&periods));
        periods.truncate(MAX_EVIDENCE_PERIODS);
        Some(Proposal {
            reason: format!(
                "zone {zone} scored above {} for {run} consecutive periods (latest {:.2})",
                cfg.failback_threshold,
                self.score_of(&zone).unwrap_or(0.0),
            ),
            first_bad_ms,
            evidence: Evidence {
                zone: zone.clone(),
                trigger: "above_failback_threshold".into(),
                threshold: cfg.failback_threshold,
                periods,
                target: None,
                target_score: None,
                assessed_at_ms: self.now_ms,
            },
            decision: Decision::Failback { zone },
        })
    }
}

#[cfg(test)]
mod tests;
