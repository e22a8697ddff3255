//! One drill from start to verdict: prepare the target, wait for a leader,
//! record the mocks' faults, start the observer and the load, run the
//! steps on their clock (timed reverts included), restore every fault
//! (also on Ctrl-C and on an alarm), let the cluster settle, read every
//! node's history, judge, write the report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use serde_json::Value;
use tokio::time::Instant;

use crate::checks::{self, Inputs};
use crate::exit;
use crate::history::{self, Ack, Held};
use crate::load::{self, signed_ms, Entry, Load, Plan};
use crate::local::LocalCluster;
use crate::observe::{self, Admin, Observer, Seen};
use crate::report::{self, DecisionTiming, Event, LoadSummary, Report, StepRecord, Verdict};
use crate::scenario::{fmt_dur, Scenario};

/// `zonegate drill` arguments.
#[derive(Clone, Debug)]
pub struct Options {
    pub file: PathBuf,
    /// Where the reports go (default `drill-reports/<scenario name>`).
    pub report_dir: Option<PathBuf>,
    pub dry_run: bool,
    /// `KEY=VALUE` overrides of the scenario (e.g. `load.duration=10s`).
    pub overrides: Vec<String>,
    /// The `zonegate` binary (children are started from it).
    pub exe: PathBuf,
}

/// Runs a drill; returns the exit code (see [`crate::exit`]).
pub async fn run(opts: Options) -> u8 {
    let scenario = match Scenario::load(&opts.file, &opts.overrides) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("zonegate drill: {e}");
            return exit::NOT_RUN;
        }
    };
    let now = jiff::Timestamp::now();
    if let Some(w) = scenario.safety.blocked.iter().find(|w| w.contains(now)) {
        eprintln!(
            "zonegate drill: not running `{}`: now is inside the blocked window `{}`",
            scenario.name, w.text
        );
        return exit::NOT_RUN;
    }
    if opts.dry_run {
        print!("{}", plan(&scenario));
        return exit::PASS;
    }
    let dir = opts
        .report_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("drill-reports").join(&scenario.name));
    println!(
        "zonegate drill: {} ({} target)",
        scenario.name,
        scenario.target.kind()
    );
    let drill = match Drill::prepare(&scenario, &opts.exe).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("zonegate drill: could not run: {e:#}");
            return exit::NOT_RUN;
        }
    };
    drill.run(&dir).await
}

mod plan;
mod prepare;
mod restore;
mod sampling;
mod steps;
mod timing;

pub use plan::plan;
use timing::timing;

#[derive(Clone, Debug)]
struct NodeInfo {
    id: u64,
    zone: String,
    admin: String,
    data: String,
}

#[derive(Clone, Debug)]
struct MockInfo {
    name: String,
    zone: String,
    url: String,
    baseline: Value,
}

/// A prepared target.
struct Drill<'a> {
    sc: &'a Scenario,
    exe: PathBuf,
    local: Option<LocalCluster>,
    nodes: Vec<NodeInfo>,
    mocks: Vec<MockInfo>,
    admin: Admin,
    api_keys: Vec<String>,
    model: String,
}

impl<'a> Drill<'a> {
    async fn run(mut self, dir: &Path) -> u8 {
        let started_unix = unix_ms();
        let ready = self.wait_ready(Duration::from_secs(60)).await;
        let baselines = match ready {
            Ok(()) => self.read_baselines().await,
            Err(e) => Err(e),
        };
        if let Err(e) = baselines {
            eprintln!("zonegate drill: could not run: {e:#}");
            if let Some(l) = self.local.take() {
                l.shutdown().await;
            }
            return exit::NOT_RUN;
        }
        let mut base_version = 0;
        for n in &self.nodes {
            base_version = base_version.max(self.admin.sample(n.id, &n.admin).await.version);
        }
        let sc = self.sc;
        let start = Instant::now();
        let t0 = start + sc.load.warmup;
        let t0_unix = unix_ms() + sc.load.warmup.as_millis() as u64;
        let observer = Observer::start(
            self.admin.clone(),
            self.nodes.iter().map(|n| (n.id, n.admin.clone())).collect(),
            t0,
            Duration::from_millis(200),
        );
        let entries: Vec<Entry> = self
            .nodes
            .iter()
            .filter(|n| sc.load.entry_zones.is_empty() || sc.load.entry_zones.contains(&n.zone))
            .map(|n| Entry {
                node: n.id,
                zone: n.zone.clone(),
                url: n.data.clone(),
                in_rotation: true,
                clients_to: None,
            })
            .collect();
        let load = Load::start(
            Plan {
                rps: sc.load.rps,
                mix: sc.load.mix,
                sessions: sc.load.sessions,
                api_keys: self.api_keys.clone(),
                model: self.model.clone(),
                timeout: sc.load.timeout,
                concurrency: sc.load.concurrency,
                short_max_tokens: sc.load.short_max_tokens,
            },
            entries,
            start,
            t0,
        );
        println!(
            "load: {} req/s, {} warm-up, then {} of steps; Ctrl-C restores every fault and stops",
            sc.load.rps,
            fmt_dur(sc.load.warmup),
            fmt_dur(sc.load.duration)
        );
        let (abort_tx, abort_rx) = tokio::sync::watch::channel(None::<(String, u8)>);
        let signals = tokio::spawn({
            let tx = abort_tx.clone();
            async move {
                wait_for_signal().await;
                let _ = tx.send(Some((
                    "Ctrl-C: stopped by the operator; every fault was restored".into(),
                    exit::NOT_RUN,
                )));
            }
        });
        let mut run = Running {
            d: &mut self,
            load,
            observer,
            t0,
            abort: abort_rx,
            abort_tx,
            pending: Vec::new(),
            events: Vec::new(),
            steps: Vec::new(),
            acks: Vec::new(),
            first_fault_ms: None,
            markers: Vec::new(),
            leader_at_step: None,
            base_version,
        };
        let progress = run.spawn_progress();
        let alarm = run.spawn_alarm();
        let aborted = run.run_steps().await.err();
        progress.abort();
        if let Some(a) = alarm {
            a.abort();
        }
        signals.abort();
        if let Some((why, _)) = &aborted {
            println!("zonegate drill: aborting: {why}");
            run.event("abort", why.clone());
        }
        // Restore first, then stop the load, so no request is judged
        // against a fault that outlived the drill.
        let restore_actions = run.restore_all().await;
        let restored_ms = run.now_ms();
        let outcome = run.load.stop().await;
        let restore = run.verify_restore(restore_actions).await;
        println!(
            "{}",
            if restore.verified {
                "restore: every fault restored and verified".to_owned()
            } else {
                format!("restore: NOT verified: {}", restore.problems.join("; "))
            }
        );
        // Let the cluster settle: converged, or the expectation's budget
        // and some margin have passed.
        let settle =
            sc.expect.converged_within.unwrap_or(Duration::from_secs(5)) + Duration::from_secs(10);
        let ids: Vec<u64> = run.d.nodes.iter().map(|n| n.id).collect();
        let deadline = Instant::now() + settle;
        while Instant::now() < deadline && aborted.is_none() {
            let ticks = run
                .observer
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .ticks
                .clone();
            if history::converged_at(&ticks, restored_ms, &ids).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let Running {
            d,
            observer,
            mut events,
            steps,
            mut acks,
            first_fault_ms,
            markers,
            ..
        } = run;
        let state = observer.stop().await;
        let mut finals: BTreeMap<u64, Vec<Held>> = BTreeMap::new();
        for n in &d.nodes {
            if let Some(list) = d.admin.decisions(&n.admin, 1000).await {
                finals.insert(n.id, list.iter().map(observe::held).collect());
            }
        }
        let decided: Vec<Seen> = state
            .decisions
            .values()
            .filter(|s| s.version > base_version)
            .cloned()
            .collect();
        for s in &decided {
            acks.push(Ack {
                version: s.version,
                kind: s.kind.clone(),
                decision: Some(s.decision.clone()),
                source: format!("node {}'s history", s.seen_on),
            });
            events.push(Event {
                t_ms: s.first_seen_ms,
                kind: "decision".into(),
                text: format!(
                    "v{} {} {} ({}, {}): {}",
                    s.version,
                    s.kind,
                    s.zones.join(", "),
                    s.origin,
                    s.actor,
                    s.reason
                ),
            });
        }
        for (t, leader, term) in history::leader_changes(&state.ticks) {
            events.push(Event {
                t_ms: t,
                kind: "leader".into(),
                text: format!("node {leader} leads (term {term})"),
            });
        }
        let load_end_ms = sc.load.duration.as_millis() as i64;
        let zone_of: BTreeMap<u64, String> =
            d.nodes.iter().map(|n| (n.id, n.zone.clone())).collect();
        let decisions: Vec<DecisionTiming> = decided
            .iter()
            .map(|s| {
                timing(
                    s,
                    &markers,
                    &acks,
                    &state.ticks,
                    &ids,
                    &outcome.samples,
                    &zone_of,
                    t0_unix,
                )
            })
            .collect();
        let checks = checks::evaluate(&Inputs {
            expect: &sc.expect,
            samples: &outcome.samples,
            load_end_ms,
            ticks: &state.ticks,
            decisions: &decided,
            clock_start: first_fault_ms.map(|t| (t, "fault")).or_else(|| {
                markers
                    .iter()
                    .find(|(_, _, is_ctl)| *is_ctl)
                    .map(|(t, _, _)| (*t, "ctl"))
            }),
            restored_ms: Some(restored_ms),
            tenant_quotas: &sc.load.tenant_quotas,
            offered_rpm: sc.load.rps * 60.0 / d.api_keys.len().max(1) as f64,
            acks: &acks,
            finals: &finals,
            nodes: &ids,
            steps: &steps,
        });
        // An aborted drill's expectations are neither met nor missed: the
        // run stopped before it could show either.
        let checks: Vec<_> = match &aborted {
            Some(_) => checks
                .into_iter()
                .map(report::Check::not_evaluated)
                .collect(),
            None => checks,
        };
        let all_pass = checks.iter().all(report::Check::passed);
        let (verdict, code, reason) = match &aborted {
            Some((why, code)) => (Verdict::Aborted, *code, Some(why.clone())),
            None if all_pass => (Verdict::Pass, exit::PASS, None),
            None => (Verdict::Fail, exit::FAIL, None),
        };
        let sent = outcome
            .samples
            .iter()
            .filter(|s| s.t_ms >= 0 && s.t_ms < load_end_ms)
            .count() as u64;
        let mut base_lat: Vec<f32> = outcome
            .samples
            .iter()
            .filter(|s| s.t_ms < 0 && s.ok && s.class == load::Class::Short)
            .map(|s| s.latency_ms)
            .collect();
        let mut notes = vec![
            "Success counts every request the generator sent from t = 0 to the end of the load; nodes the drill killed or paused leave the clients' rotation at once (an ideal client-side balancer), requests already in flight to them count.".to_owned(),
            "Decision times are seen through the admin API, polled every 200 ms per node.".to_owned(),
        ];
        if outcome.not_sent > 0 {
            notes.push(format!(
                "{} requests were due but not sent: {} were in flight (load.concurrency); the generator limited the load.",
                outcome.not_sent, sc.load.concurrency
            ));
        }
        let report = Report {
            scenario: sc.name.clone(),
            file: sc.file.display().to_string(),
            description: sc.description.clone(),
            target: sc.target.kind().to_owned(),
            verdict,
            exit_code: code,
            reason,
            started_unix_ms: started_unix,
            t0_unix_ms: t0_unix,
            wall_ms: unix_ms() - started_unix,
            checks,
            steps,
            events,
            decisions,
            leader_changes: history::leader_changes(&state.ticks),
            load: LoadSummary {
                target_rps: sc.load.rps,
                achieved_rps: sent as f64 / (load_end_ms.max(1) as f64 / 1000.0),
                sent,
                not_sent: outcome.not_sent,
                by_class: report::class_stats(&outcome.samples, 0, load_end_ms),
                baseline_p99_ms: report::quantile(&mut base_lat, 0.99),
            },
            series: report::series(&outcome.samples),
            restore,
            notes,
            acks,
            final_histories: finals,
            ticks: state.ticks,
        };
        if let Some(l) = d.local.take() {
            l.shutdown().await;
        }
        match report.write(dir) {
            Ok(()) => {}
            Err(e) => {
                eprintln!(
                    "zonegate drill: cannot write the report to {}: {e}",
                    dir.display()
                );
            }
        }
        println!();
        println!(
            "{}",
            report
                .markdown()
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("# ")
        );
        for c in &report.checks {
            println!(
                "  {} {}: {} (wanted {})",
                match c.pass {
                    Some(true) => "ok  ",
                    Some(false) => "FAIL",
                    None => "n/a ",
                },
                c.name,
                c.measured,
                c.expected
            );
        }
        for t in &report.decisions {
            println!(
                "  decision v{} {} ({}): from {}: detect {} → commit {} → applied everywhere {} → traffic moved {}",
                t.version,
                t.kind,
                t.origin,
                t.since.as_deref().unwrap_or("–"),
                opt(t.detect_ms),
                opt(t.commit_ms),
                opt(t.apply_ms),
                opt(t.traffic_ms)
            );
        }
        println!("report: {}", dir.join("report.html").display());
        code
    }

    /// Waits until every node answers and all name the same leader.
    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut leaders = BTreeSet::new();
            let mut all = true;
            for n in &self.nodes {
                let s = self.admin.sample(n.id, &n.admin).await;
                all &= s.reachable;
                leaders.insert(s.leader);
            }
            if all && leaders.len() == 1 && leaders.iter().all(Option::is_some) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the cluster did not agree on a leader within {within:?} (leaders seen: {leaders:?}, all answering: {all})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn read_baselines(&mut self) -> anyhow::Result<()> {
        for m in &mut self.mocks {
            m.baseline = self
                .admin
                .get(&format!("{}/mock/faults", m.url))
                .await
                .ok_or_else(|| {
                    anyhow!(
                        "backend {} at {}: GET /mock/faults did not answer",
                        m.name,
                        m.url
                    )
                })?;
        }
        Ok(())
    }
}

fn opt(ms: Option<i64>) -> String {
    ms.map(|v| format!("{:.2}s", v as f64 / 1000.0))
        .unwrap_or_else(|| "–".into())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What a timed revert undoes.
#[derive(Clone, Debug)]
enum Revert {
    Backends(Vec<String>),
    Resume(u64),
    Uncut(Vec<(u64, u64)>),
}

/// A drill in progress.
struct Running<'d, 'a> {
    d: &'d mut Drill<'a>,
    load: Load,
    observer: Observer,
    t0: Instant,
    abort: tokio::sync::watch::Receiver<Option<(String, u8)>>,
    abort_tx: tokio::sync::watch::Sender<Option<(String, u8)>>,
    pending: Vec<(Instant, Revert)>,
    events: Vec<Event>,
    steps: Vec<StepRecord>,
    acks: Vec<Ack>,
    first_fault_ms: Option<i64>,
    /// Fault (false) and ctl (true) step times, for decision timings.
    markers: Vec<(i64, String, bool)>,
    leader_at_step: Option<u64>,
    /// The decision version before the drill began.
    base_version: u64,
}

type Aborted = (String, u8);

impl Running<'_, '_> {
    fn now_ms(&self) -> i64 {
        signed_ms(Instant::now(), self.t0)
    }

    fn event(&mut self, kind: &str, text: String) {
        let t_ms = self.now_ms();
        self.events.push(Event {
            t_ms,
            kind: kind.into(),
            text,
        });
    }

    fn aborted(&self) -> Option<Aborted> {
        self.abort.borrow().clone()
    }
}

enum StepError {
    Failed(String),
    Aborted(Aborted),
}

impl From<String> for StepError {
    fn from(s: String) -> Self {
        StepError::Failed(s)
    }
}
