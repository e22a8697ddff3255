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
use crate::local::{LocalCluster, NodeState, Topology, DRILL_ADMIN_TOKEN};
use crate::observe::{self, Admin, Observer, Seen};
use crate::report::{
    self, DecisionTiming, Event, LoadSummary, Report, Restore, StepRecord, Verdict,
};
use crate::scenario::{
    fmt_dur, Action, BackendSel, Condition, Direction, NodeSel, PartitionSel, Scenario, Target,
};

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

/// The plan `--dry-run` prints.
pub fn plan(s: &Scenario) -> String {
    let mut out = format!("drill `{}`", s.name);
    if !s.description.is_empty() {
        out.push_str(&format!(": {}", s.description));
    }
    out.push('\n');
    match &s.target {
        Target::Local {
            topology,
            node_config,
        } => {
            out.push_str(&format!(
                "target: local cluster from {} (started by the drill, Raft through relays)\n",
                topology.display()
            ));
            if !node_config.is_empty() {
                out.push_str(&format!(
                    "  merged into every node's config: {}\n",
                    toml::to_string(node_config)
                        .unwrap_or_default()
                        .replace('\n', " ")
                ));
            }
        }
        Target::Cluster {
            admin,
            data,
            backends,
            ..
        } => {
            out.push_str(&format!(
                "target: existing cluster, admin {}, data plane {}, {} mock backends\n",
                admin.join(", "),
                data.join(", "),
                backends.len()
            ));
        }
    }
    let l = &s.load;
    out.push_str(&format!(
        "load: {} req/s for {} after a {} warm-up (short {:.0}%, long {:.0}%, stream {:.0}%), {} sessions, {} tenants, at most {} in flight\n",
        l.rps,
        fmt_dur(l.duration),
        fmt_dur(l.warmup),
        l.mix.short * 100.0,
        l.mix.long * 100.0,
        l.mix.stream * 100.0,
        l.sessions,
        l.tenants,
        l.concurrency
    ));
    for (i, q) in l.tenant_quotas.iter().enumerate() {
        out.push_str(&format!(
            "  tenant drill-{}: quota {}\n",
            i + 1,
            toml::to_string(&q.to_table())
                .unwrap_or_default()
                .trim_end()
                .replace('\n', ", ")
        ));
    }
    out.push_str("steps:\n");
    for (i, st) in s.steps.iter().enumerate() {
        out.push_str(&format!(
            "  {i}. {} {}\n",
            st.at
                .map(|a| format!("at {}:", fmt_dur(a)))
                .unwrap_or_else(|| "then:".into()),
            st.action.describe()
        ));
    }
    out.push_str("expect:\n");
    let e = &s.expect;
    let mut any = false;
    let mut line = |t: String| {
        any = true;
        out.push_str(&format!("  {t}\n"));
    };
    if let Some(v) = e.short_success {
        line(format!("short_success >= {v}"));
    }
    if let Some(v) = e.long_success {
        line(format!("long_success >= {v}"));
    }
    if let Some(v) = e.stream_success {
        line(format!("stream_success >= {v}"));
    }
    if let Some(v) = e.failover_committed_within {
        line(format!("failover_committed_within {}", fmt_dur(v)));
    }
    if let Some(v) = e.no_failover {
        line(format!("no_failover = {v}"));
    }
    if let Some(v) = e.max_leaders_per_term {
        line(format!("max_leaders_per_term = {v}"));
    }
    if let Some(v) = e.term_unchanged {
        line(format!("term_unchanged = {v}"));
    }
    if let Some(v) = e.no_lost_decisions {
        line(format!("no_lost_decisions = {v}"));
    }
    if let Some(v) = e.converged_within {
        line(format!("converged_within {}", fmt_dur(v)));
    }
    if let Some(v) = e.p99_added_ms {
        line(format!("p99_added_ms <= {v}"));
    }
    if let Some(v) = e.quota_cap_held {
        line(format!("quota_cap_held = {v}"));
    }
    if let Some(v) = e.quota_stretched_within {
        line(format!("quota_stretched_within {}", fmt_dur(v)));
    }
    if !any {
        out.push_str("  (none; only that every step runs)\n");
    }
    out.push_str("restore: every mock backend's faults back to their values at the start, partitions healed, paused nodes resumed, killed nodes started; also on Ctrl-C and on abort\n");
    let sf = &s.safety;
    if !sf.blocked.is_empty() {
        let w: Vec<&str> = sf.blocked.iter().map(|w| w.text.as_str()).collect();
        out.push_str(&format!("blocked windows: {}\n", w.join("; ")));
    }
    if let Some(b) = sf.abort_below {
        out.push_str(&format!(
            "abort when short-request success < {b} for {}\n",
            fmt_dur(sf.abort_after)
        ));
    }
    if let Some((u, q)) = &sf.alert {
        out.push_str(&format!(
            "abort when the alert query `{q}` at {u} returns a series\n"
        ));
    }
    if sf.capacity_check {
        out.push_str("capacity pre-check: in the warm-up's last second, everything in flight must fit in the capacity units of the zones the steps leave serving, else stop (exit 2)\n");
    }
    out
}

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
    async fn prepare(sc: &'a Scenario, exe: &Path) -> anyhow::Result<Drill<'a>> {
        match &sc.target {
            Target::Local {
                topology,
                node_config,
            } => {
                let topo = Topology::read(topology)?;
                let model = match &sc.load.model {
                    Some(m) => m.clone(),
                    None => topo
                        .models
                        .first()
                        .cloned()
                        .ok_or_else(|| anyhow!("the topology's backends serve no model"))?,
                };
                println!(
                    "starting a local cluster: {} nodes, {} mock backends",
                    topo.members.len(),
                    topo.backends.len()
                );
                let local = LocalCluster::start(
                    exe,
                    &topo,
                    node_config,
                    sc.load.tenants,
                    &sc.load.tenant_quotas,
                )
                .await?;
                let nodes = local
                    .nodes
                    .iter()
                    .map(|n| NodeInfo {
                        id: n.id,
                        zone: n.zone.clone(),
                        admin: n.admin_url.clone(),
                        data: n.data_url.clone(),
                    })
                    .collect();
                let mocks = local
                    .mocks
                    .iter()
                    .map(|m| MockInfo {
                        name: m.name.clone(),
                        zone: m.zone.clone(),
                        url: m.url.clone(),
                        baseline: Value::Null,
                    })
                    .collect();
                for n in &local.nodes {
                    println!(
                        "  node {} ({}): data {} admin {}",
                        n.id, n.zone, n.data_url, n.admin_url
                    );
                }
                for m in &local.mocks {
                    println!("  backend {} ({}): {}", m.name, m.zone, m.url);
                }
                Ok(Drill {
                    sc,
                    exe: exe.to_owned(),
                    api_keys: local.api_keys.clone(),
                    local: Some(local),
                    nodes,
                    mocks,
                    admin: Admin::new(DRILL_ADMIN_TOKEN.to_owned()),
                    model,
                })
            }
            Target::Cluster {
                admin,
                data,
                token_env,
                api_key_env,
                backends,
            } => {
                let token = std::env::var(token_env).map_err(|_| {
                    anyhow!("the admin token is read from ${token_env}, which is not set")
                })?;
                let key = std::env::var(api_key_env).map_err(|_| {
                    anyhow!("the API key is read from ${api_key_env}, which is not set")
                })?;
                let model = sc
                    .load
                    .model
                    .clone()
                    .ok_or_else(|| anyhow!("load.model: required for a cluster target"))?;
                let api = Admin::new(token);
                let mut nodes = Vec::new();
                for (i, url) in admin.iter().enumerate() {
                    let url = url.trim_end_matches('/').to_owned();
                    let v = api
                        .get(&format!("{url}/admin/v1/cluster?scope=local"))
                        .await
                        .ok_or_else(|| {
                            anyhow!("{url}: the admin API did not answer (URL, token?)")
                        })?;
                    nodes.push(NodeInfo {
                        id: v["node_id"].as_u64().unwrap_or(i as u64 + 1),
                        zone: v["zone"].as_str().unwrap_or_default().to_owned(),
                        admin: url,
                        data: data
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| data[i % data.len()].clone())
                            .trim_end_matches('/')
                            .to_owned(),
                    });
                }
                let mut mocks = Vec::new();
                for (name, url) in backends {
                    let url = url.trim_end_matches('/').to_owned();
                    let stats = api.get(&format!("{url}/mock/stats")).await.ok_or_else(|| {
                        anyhow!("backend {name} at {url}: /mock/stats did not answer")
                    })?;
                    mocks.push(MockInfo {
                        name: name.clone(),
                        zone: stats["zone"].as_str().unwrap_or_default().to_owned(),
                        url,
                        baseline: Value::Null,
                    });
                }
                Ok(Drill {
                    sc,
                    exe: exe.to_owned(),
                    local: None,
                    nodes,
                    mocks,
                    admin: api,
                    api_keys: vec![key],
                    model,
                })
            }
        }
    }

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

/// Detect → commit → applied everywhere → traffic moved for one decision,
/// measured from the fault (automatic decisions) or the `ctl` command
/// (operators') that came last before it.
#[allow(clippy::too_many_arguments)]
fn timing(
    s: &Seen,
    markers: &[(i64, String, bool)],
    acks: &[Ack],
    ticks: &[history::Tick],
    nodes: &[u64],
    samples: &[load::Sample],
    zone_of: &BTreeMap<u64, String>,
    t0_unix: u64,
) -> DecisionTiming {
    let proposed_ms = s.at_ms as i64 - t0_unix as i64;
    let want_ctl = s.origin != "automatic";
    // An operator's decision is timed from the ctl step whose answer
    // named its version; failing that, from the last step of its kind.
    let acked = acks
        .iter()
        .find(|a| a.version == s.version && a.source.starts_with("ctl step "))
        .map(|a| format!("{} (ctl)", a.source.trim_start_matches("ctl ")));
    let since = acked
        .and_then(|label| markers.iter().find(|(_, l, _)| *l == label).cloned())
        .or_else(|| {
            markers
                .iter()
                .rev()
                .find(|(t, _, is_ctl)| *t <= s.first_seen_ms && *is_ctl == want_ctl)
                .cloned()
        });
    let applied = history::applied_everywhere(ticks, s.version, s.first_seen_ms, nodes);
    // Traffic moved: the first answer routed with this version that
    // entered the zone the decision moved and went where it says.
    let moved = match (&s.kind[..], &s.decision) {
        ("failover", d) => {
            let from = d["failover"]["from"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            samples
                .iter()
                .filter(|x| {
                    x.ok && x.version.is_some_and(|v| v >= s.version)
                        && zone_of.get(&x.entry) == Some(&from)
                        && x.zone.as_deref().is_some_and(|z| z != from)
                })
                .map(|x| x.t_ms + x.latency_ms as i64)
                .min()
        }
        ("failback", d) => {
            let zone = d["failback"]["zone"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            samples
                .iter()
                .filter(|x| {
                    x.ok && x.version.is_some_and(|v| v >= s.version)
                        && zone_of.get(&x.entry) == Some(&zone)
                        && x.zone.as_deref() == Some(zone.as_str())
                })
                .map(|x| x.t_ms + x.latency_ms as i64)
                .min()
        }
        _ => None,
    };
    let rel = |t: Option<i64>| match (&since, t) {
        (Some((m, _, _)), Some(t)) => Some(t - m),
        _ => None,
    };
    DecisionTiming {
        version: s.version,
        kind: s.kind.clone(),
        origin: s.origin.clone(),
        zones: s.zones.clone(),
        actor: s.actor.clone(),
        reason: s.reason.clone(),
        proposed_ms,
        first_seen_ms: s.first_seen_ms,
        applied_everywhere_ms: applied,
        traffic_moved_ms: moved,
        since: since
            .as_ref()
            .map(|(t, what, _)| format!("{what} at {:.1}s", *t as f64 / 1000.0)),
        detect_ms: if want_ctl {
            None
        } else {
            rel(Some(proposed_ms))
        },
        commit_ms: rel(Some(s.first_seen_ms)),
        apply_ms: rel(applied),
        traffic_ms: rel(moved),
    }
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

    /// Prints one line per second: rps, success, version, leader.
    fn spawn_progress(&self) -> tokio::task::JoinHandle<()> {
        let t0 = self.t0;
        let samples = self.load_window_fn();
        let state = self.observer.state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let now = signed_ms(Instant::now(), t0);
                // The second before last: its answers are mostly in.
                let w = samples(now - 2000, now - 1000);
                let ok = w.iter().filter(|s| s.ok).count();
                let short: Vec<_> = w.iter().filter(|s| s.class == load::Class::Short).collect();
                let short_ok = short.iter().filter(|s| s.ok).count();
                let last = state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .ticks
                    .last()
                    .cloned();
                let (version, leader) = match &last {
                    Some(t) => (
                        t.nodes
                            .iter()
                            .filter(|s| s.reachable)
                            .map(|s| s.version)
                            .max()
                            .unwrap_or(0),
                        history::leader_of(t)
                            .map(|l| l.0.to_string())
                            .unwrap_or_else(|| "none".into()),
                    ),
                    None => (0, "?".into()),
                };
                println!(
                    "t={:>5.1}s  rps {:>5}  ok {:>7}  short {:>7}  version {version}  leader {leader}",
                    now as f64 / 1000.0,
                    w.len(),
                    pct(ok, w.len()),
                    pct(short_ok, short.len()),
                );
            }
        })
    }

    fn load_window_fn(&self) -> impl Fn(i64, i64) -> Vec<load::Sample> + Send + 'static {
        let samples = self.load.samples();
        move |a, b| samples.window(a, b)
    }

    /// Aborts when short-request success stays under the floor, or the
    /// alert query returns a series.
    fn spawn_alarm(&self) -> Option<tokio::task::JoinHandle<()>> {
        let safety = self.d.sc.safety.clone();
        if safety.abort_below.is_none() && safety.alert.is_none() {
            return None;
        }
        let samples = self.load_window_fn();
        let tx = self.abort_tx.clone();
        let t0 = self.t0;
        Some(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default();
            let mut below_since: Option<Instant> = None;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = signed_ms(Instant::now(), t0);
                if let Some(floor) = safety.abort_below {
                    let w = samples(now - 2000, now - 1000);
                    let short: Vec<_> =
                        w.iter().filter(|s| s.class == load::Class::Short).collect();
                    let rate = if short.is_empty() {
                        1.0
                    } else {
                        short.iter().filter(|s| s.ok).count() as f64 / short.len() as f64
                    };
                    if rate < floor {
                        let since = *below_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= safety.abort_after {
                            let _ = tx.send(Some((
                                format!(
                                    "alarm: short-request success {:.1}% stayed below {:.1}% for {}",
                                    rate * 100.0,
                                    floor * 100.0,
                                    fmt_dur(safety.abort_after)
                                ),
                                exit::FAIL,
                            )));
                            return;
                        }
                    } else {
                        below_since = None;
                    }
                }
                if let Some((url, query)) = &safety.alert {
                    let resp = client
                        .get(format!("{}/api/v1/query", url.trim_end_matches('/')))
                        .query(&[("query", query)])
                        .send()
                        .await;
                    if let Ok(r) = resp {
                        if let Ok(v) = r.json::<Value>().await {
                            if v["data"]["result"]
                                .as_array()
                                .is_some_and(|a| !a.is_empty())
                            {
                                let _ = tx.send(Some((
                                    format!("alarm: the alert query `{query}` fired"),
                                    exit::FAIL,
                                )));
                                return;
                            }
                        }
                    }
                }
            }
        }))
    }

    /// Sleeps until `until`, running timed reverts as they fall due;
    /// returns early with the reason when the drill is aborted.
    async fn idle_until(&mut self, until: Instant) -> Result<(), Aborted> {
        loop {
            if let Some(a) = self.aborted() {
                return Err(a);
            }
            let now = Instant::now();
            let due: Vec<Revert> = {
                let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
                    .into_iter()
                    .partition(|(t, _)| *t <= now);
                self.pending = keep;
                due.into_iter().map(|(_, r)| r).collect()
            };
            for r in due {
                let text = self.revert(r).await;
                self.event("restore", text);
            }
            if now >= until {
                return Ok(());
            }
            let next = self
                .pending
                .iter()
                .map(|(t, _)| *t)
                .min()
                .unwrap_or(until)
                .min(until)
                .min(now + Duration::from_millis(100));
            let mut abort = self.abort.clone();
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                _ = abort.changed() => {}
            }
        }
    }

    async fn run_steps(&mut self) -> Result<(), Aborted> {
        // Warm-up: the load runs, nothing is broken yet. The capacity
        // pre-check samples its last second.
        if self.d.sc.safety.capacity_check {
            let from = self
                .t0
                .checked_sub(Duration::from_secs(1))
                .unwrap_or(self.t0);
            self.idle_until(from).await?;
            self.capacity_precheck().await?;
        }
        self.idle_until(self.t0).await?;
        let steps = self.d.sc.steps.clone();
        for (index, step) in steps.iter().enumerate() {
            if let Some(at) = step.at {
                self.idle_until(self.t0 + at).await?;
            }
            let started_ms = self.now_ms();
            let description = step.action.describe();
            println!(
                "t={:>5.1}s  step {index}: {description}",
                started_ms as f64 / 1000.0
            );
            if step.action.is_fault() {
                self.first_fault_ms.get_or_insert(started_ms);
                self.markers.push((
                    started_ms,
                    format!("step {index} ({})", step.action.name()),
                    false,
                ));
            }
            if matches!(step.action, Action::Ctl { .. }) {
                self.markers
                    .push((started_ms, format!("step {index} (ctl)"), true));
            }
            let result = self.execute(index, &step.action).await;
            let ended_ms = self.now_ms();
            let (ok, detail) = match result {
                Ok(d) => (true, d),
                Err(StepError::Failed(e)) => (false, e),
                Err(StepError::Aborted(a)) => {
                    self.steps.push(StepRecord {
                        index,
                        action: step.action.name().into(),
                        description,
                        planned_at_ms: step.at.map(|a| a.as_millis() as i64),
                        started_ms,
                        ended_ms,
                        ok: false,
                        detail: "aborted".into(),
                    });
                    return Err(a);
                }
            };
            if !ok {
                println!(
                    "t={:>5.1}s  step {index} FAILED: {detail}",
                    ended_ms as f64 / 1000.0
                );
            }
            let kind = match &step.action {
                a if a.is_fault() => "fault",
                Action::BackendRestore { .. }
                | Action::Resume { .. }
                | Action::Restart { .. }
                | Action::Heal => "restore",
                _ => "step",
            };
            let text = match &step.note {
                Some(n) => format!("{description}: {detail} ({n})"),
                None => format!("{description}: {detail}"),
            };
            self.events.push(Event {
                t_ms: started_ms,
                kind: kind.into(),
                text: if ok { text } else { format!("FAILED {text}") },
            });
            self.steps.push(StepRecord {
                index,
                action: step.action.name().into(),
                description,
                planned_at_ms: step.at.map(|a| a.as_millis() as i64),
                started_ms,
                ended_ms,
                ok,
                detail,
            });
        }
        let end = self.t0 + self.d.sc.load.duration;
        self.idle_until(end).await
    }

    /// `safety.capacity_check`: the zones the steps take out of service,
    /// and every zone's capacity units from each node's
    /// `/admin/v1/quotas`, five times 200 ms apart (per zone the most in
    /// flight seen); refuses to go on (exit 2) when they do not fit.
    async fn capacity_precheck(&mut self) -> Result<(), Aborted> {
        let mut out = BTreeSet::new();
        for step in &self.d.sc.steps {
            if let Some(z) = step.action.zone_out() {
                out.insert(z.to_owned());
            }
            if let Action::BackendFault {
                target: BackendSel::Names(names),
                ..
            } = &step.action
            {
                out.extend(
                    self.d
                        .mocks
                        .iter()
                        .filter(|m| names.contains(&m.name))
                        .map(|m| m.zone.clone()),
                );
            }
        }
        let mut zones: BTreeMap<String, checks::ZoneUnits> = BTreeMap::new();
        for k in 0..5 {
            if k > 0 {
                self.idle_until(Instant::now() + Duration::from_millis(200))
                    .await?;
            }
            let mut now: BTreeMap<String, checks::ZoneUnits> = BTreeMap::new();
            for n in &self.d.nodes {
                let Some(q) = self
                    .d
                    .admin
                    .get(&format!("{}/admin/v1/quotas", n.admin))
                    .await
                else {
                    return Err((
                        format!(
                            "capacity pre-check: node {}'s /admin/v1/quotas did not answer",
                            n.id
                        ),
                        exit::NOT_RUN,
                    ));
                };
                for c in q["capacity"].as_array().into_iter().flatten() {
                    let zone = c["zone"].as_str().unwrap_or_default().to_owned();
                    let u = now.entry(zone).or_default();
                    u.total = u.total.max(c["total_units"].as_u64().unwrap_or(0));
                    u.used += c["used_units"].as_u64().unwrap_or(0);
                }
            }
            for (zone, u) in now {
                let seen = zones.entry(zone).or_default();
                seen.total = seen.total.max(u.total);
                seen.used = seen.used.max(u.used);
            }
        }
        match checks::capacity_precheck(&zones, &out) {
            Ok(text) => {
                println!("capacity pre-check: {text}");
                self.event("safety", format!("capacity pre-check: {text}"));
                Ok(())
            }
            Err(why) => Err((format!("capacity pre-check: {why}"), exit::NOT_RUN)),
        }
    }

    fn running_ids(&self) -> Vec<u64> {
        match &self.d.local {
            Some(l) => l
                .nodes
                .iter()
                .filter(|n| n.state == NodeState::Running)
                .map(|n| n.id)
                .collect(),
            None => self.d.nodes.iter().map(|n| n.id).collect(),
        }
    }

    async fn resolve(&mut self, sel: &NodeSel) -> Result<u64, String> {
        match sel {
            NodeSel::Id(id) => {
                if self.d.nodes.iter().any(|n| n.id == *id) {
                    Ok(*id)
                } else {
                    Err(format!("no node {id}"))
                }
            }
            NodeSel::Zone(z) => self
                .d
                .nodes
                .iter()
                .find(|n| &n.zone == z)
                .map(|n| n.id)
                .ok_or_else(|| format!("no node in zone {z}")),
            NodeSel::Leader | NodeSel::Follower => {
                let leader = self.current_leader(Duration::from_secs(15)).await?;
                self.leader_at_step = Some(leader);
                if *sel == NodeSel::Leader {
                    return Ok(leader);
                }
                self.running_ids()
                    .into_iter()
                    .find(|id| *id != leader)
                    .ok_or_else(|| "no running follower".to_owned())
            }
        }
    }

    /// The leader a majority of the nodes name (a node cut off from the
    /// group may still name an old one); polls up to `within`.
    async fn current_leader(&self, within: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + within;
        let majority = self.d.nodes.len() / 2 + 1;
        loop {
            let running = self.running_ids();
            let mut named: BTreeMap<u64, usize> = BTreeMap::new();
            for n in self.d.nodes.iter().filter(|n| running.contains(&n.id)) {
                let s = self.d.admin.sample(n.id, &n.admin).await;
                if let (true, Some(l)) = (s.reachable, s.leader) {
                    *named.entry(l).or_default() += 1;
                }
            }
            if let Some((l, _)) = named
                .iter()
                .find(|(l, c)| **c >= majority && running.contains(l))
            {
                return Ok(*l);
            }
            if Instant::now() > deadline {
                return Err(format!("no leader named by a majority within {within:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn mocks_of(&self, sel: &BackendSel) -> Result<Vec<MockInfo>, String> {
        let found: Vec<MockInfo> = match sel {
            BackendSel::Names(names) => {
                let mut out = Vec::new();
                for n in names {
                    out.push(
                        self.d
                            .mocks
                            .iter()
                            .find(|m| &m.name == n)
                            .cloned()
                            .ok_or_else(|| format!("no backend named {n}"))?,
                    );
                }
                out
            }
            BackendSel::Zone(z) => self
                .d
                .mocks
                .iter()
                .filter(|m| &m.zone == z)
                .cloned()
                .collect(),
        };
        if found.is_empty() {
            return Err(format!("{sel} matches no backend"));
        }
        Ok(found)
    }

    async fn patch(&self, url: &str, body: &Value) -> Result<(), String> {
        let resp = self
            .d
            .admin
            .client
            .post(format!("{url}/mock/faults"))
            .json(body)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "{url}: {} {}",
                resp.status(),
                resp.text().await.unwrap_or_default()
            ))
        }
    }

    fn local(&mut self) -> Result<&mut LocalCluster, String> {
        self.d
            .local
            .as_mut()
            .ok_or_else(|| "needs a local target".to_owned())
    }

    async fn execute(&mut self, index: usize, action: &Action) -> Result<String, StepError> {
        let now = Instant::now();
        match action {
            Action::BackendFault {
                target,
                faults,
                for_,
            } => {
                let mocks = self.mocks_of(target)?;
                let body = Value::Object(faults.clone());
                for m in &mocks {
                    self.patch(&m.url, &body).await?;
                }
                let names: Vec<String> = mocks.iter().map(|m| m.name.clone()).collect();
                if let Some(d) = for_ {
                    self.pending
                        .push((now + *d, Revert::Backends(names.clone())));
                }
                Ok(format!("set on {}", names.join(", ")))
            }
            Action::BackendRestore { target } => {
                let mocks = self.mocks_of(target)?;
                Ok(self
                    .revert(Revert::Backends(
                        mocks.into_iter().map(|m| m.name).collect(),
                    ))
                    .await)
            }
            Action::Kill { node } => {
                let id = self.resolve(node).await?;
                self.load.set_rotation(id, false);
                self.local()?.kill(id).await.map_err(|e| format!("{e:#}"))?;
                Ok(format!("node {id} killed (SIGKILL)"))
            }
            Action::Pause { node, for_ } => {
                let id = self.resolve(node).await?;
                self.load.set_rotation(id, false);
                self.local()?
                    .pause(id)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                if let Some(d) = for_ {
                    self.pending.push((now + *d, Revert::Resume(id)));
                }
                Ok(format!("node {id} stopped (SIGSTOP)"))
            }
            Action::Resume { node } => {
                let ids: Vec<u64> = match node {
                    Some(sel) => vec![self.resolve(sel).await?],
                    None => self
                        .local()?
                        .nodes
                        .iter()
                        .filter(|n| n.state == NodeState::Paused)
                        .map(|n| n.id)
                        .collect(),
                };
                let mut done = Vec::new();
                for id in ids {
                    done.push(self.revert(Revert::Resume(id)).await);
                }
                Ok(if done.is_empty() {
                    "nothing paused".into()
                } else {
                    done.join("; ")
                })
            }
            Action::Restart { node } => {
                let ids: Vec<u64> = match node {
                    Some(sel) => vec![self.resolve(sel).await?],
                    None => self
                        .local()?
                        .nodes
                        .iter()
                        .filter(|n| n.state == NodeState::Killed)
                        .map(|n| n.id)
                        .collect(),
                };
                let mut done = Vec::new();
                for id in ids {
                    self.load.set_rotation(id, false);
                    self.local()?
                        .restart(id)
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    self.load.set_rotation(id, true);
                    done.push(format!("node {id} restarted"));
                }
                Ok(if done.is_empty() {
                    "nothing to restart".into()
                } else {
                    done.join("; ")
                })
            }
            Action::Partition {
                sides,
                direction,
                for_,
            } => {
                let (a, b) = match sides {
                    PartitionSel::Groups(a, b) => (a.clone(), b.clone()),
                    PartitionSel::Isolate(sel) => {
                        let id = self.resolve(sel).await?;
                        let rest = self
                            .d
                            .nodes
                            .iter()
                            .map(|n| n.id)
                            .filter(|n| *n != id)
                            .collect();
                        (vec![id], rest)
                    }
                };
                let mut links = Vec::new();
                for x in &a {
                    for y in &b {
                        links.push((*x, *y));
                        if *direction == Direction::Both {
                            links.push((*y, *x));
                        }
                    }
                }
                self.local()?.relays.cut(links.clone());
                if let Some(d) = for_ {
                    self.pending.push((now + *d, Revert::Uncut(links.clone())));
                }
                Ok(format!(
                    "cut {a:?} {} {b:?}",
                    if *direction == Direction::Both {
                        "<->"
                    } else {
                        "->"
                    }
                ))
            }
            Action::Heal => {
                let l = self.local()?;
                let n = l.relays.cuts().len();
                l.relays.heal();
                self.pending.retain(|(_, r)| !matches!(r, Revert::Uncut(_)));
                Ok(format!("healed {n} cut links"))
            }
            Action::Ctl {
                args,
                node,
                expect_exit,
            } => {
                let admin = match node {
                    Some(sel) => {
                        let id = self.resolve(sel).await?;
                        self.d
                            .nodes
                            .iter()
                            .find(|n| n.id == id)
                            .map(|n| n.admin.clone())
                    }
                    None => {
                        let running = self.running_ids();
                        self.d
                            .nodes
                            .iter()
                            .find(|n| running.contains(&n.id))
                            .map(|n| n.admin.clone())
                    }
                }
                .ok_or_else(|| "no node to send the command to".to_owned())?;
                let out = tokio::process::Command::new(&self.d.exe)
                    .args([
                        "ctl",
                        "--admin",
                        &admin,
                        "--token",
                        &self.d.admin.token,
                        "--json",
                    ])
                    .args(args)
                    .env_remove("ZONEGATE_ADMIN")
                    .env_remove("ZONEGATE_ADMIN_TOKEN")
                    .output()
                    .await
                    .map_err(|e| format!("cannot run zonegate ctl: {e}"))?;
                let code = out.status.code().unwrap_or(-1);
                let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                if code == 0 {
                    if let Ok(v) = serde_json::from_str::<Value>(&stdout) {
                        if v["committed"] == true {
                            if let Some(version) = v["version"].as_u64() {
                                self.acks.push(Ack {
                                    version,
                                    kind: v["kind"].as_str().unwrap_or_default().to_owned(),
                                    decision: None,
                                    source: format!("ctl step {index}"),
                                });
                            }
                        }
                    }
                }
                let summary = format!(
                    "exit {code}: {}",
                    if stdout.is_empty() { &stderr } else { &stdout }
                        .chars()
                        .take(300)
                        .collect::<String>()
                );
                let want = expect_exit.unwrap_or(0);
                if code == want {
                    Ok(summary)
                } else {
                    Err(StepError::Failed(format!("wanted exit {want}; {summary}")))
                }
            }
            Action::WaitFor { condition, timeout } => {
                // The leader to change from: the one a step resolved last
                // (e.g. the paused leader), else the one seen last.
                if *condition == Condition::LeaderChange && self.leader_at_step.is_none() {
                    self.leader_at_step = self
                        .observer
                        .last()
                        .and_then(|t| history::leader_of(&t))
                        .map(|l| l.0);
                }
                let deadline = now + *timeout;
                loop {
                    if let Some(detail) = self.holds(condition).await {
                        return Ok(format!(
                            "{detail} after {:.1}s",
                            now.elapsed().as_secs_f64()
                        ));
                    }
                    if Instant::now() >= deadline {
                        return Err(StepError::Failed(format!(
                            "{condition:?} did not hold within {}",
                            fmt_dur(*timeout)
                        )));
                    }
                    self.idle_until(Instant::now() + Duration::from_millis(200))
                        .await
                        .map_err(StepError::Aborted)?;
                }
            }
            Action::MoveClients { from, to } => Ok(self.load.move_clients(from, to)?),
        }
    }

    /// Whether `c` holds now; `Some(what)` when it does.
    async fn holds(&self, c: &Condition) -> Option<String> {
        let running = self.running_ids();
        let mut samples = Vec::new();
        for n in self.d.nodes.iter().filter(|n| running.contains(&n.id)) {
            samples.push(self.d.admin.sample(n.id, &n.admin).await);
        }
        let reachable: Vec<_> = samples.iter().filter(|s| s.reachable).collect();
        match c {
            Condition::Decision { kind, zone } => {
                let seen = self.observer.decisions();
                seen.values()
                    .rev()
                    .find(|d| {
                        kind.as_ref().is_none_or(|k| &d.kind == k)
                            && zone.as_ref().is_none_or(|z| {
                                d.zones.contains(z)
                                    || d.decision.to_string().contains(&format!("\"{z}\""))
                            })
                            && d.version > self.base_version
                    })
                    .map(|d| format!("v{} {} committed", d.version, d.kind))
            }
            Condition::LeaderChange => {
                let leaders: BTreeSet<Option<u64>> = reachable.iter().map(|s| s.leader).collect();
                match (leaders.len(), leaders.iter().next()) {
                    (1, Some(Some(l))) if Some(*l) != self.leader_at_step => {
                        Some(format!("node {l} leads"))
                    }
                    _ => None,
                }
            }
            Condition::Leader => {
                let leaders: BTreeSet<Option<u64>> = reachable.iter().map(|s| s.leader).collect();
                // A leader the drill killed or paused is named for a
                // while after; it does not count.
                match (
                    leaders.len(),
                    leaders.iter().next(),
                    reachable.len() == samples.len(),
                ) {
                    (1, Some(Some(l)), true) if running.contains(l) => {
                        Some(format!("node {l} leads"))
                    }
                    _ => None,
                }
            }
            Condition::Converged => {
                let versions: BTreeSet<u64> = reachable.iter().map(|s| s.version).collect();
                (versions.len() == 1 && reachable.len() == samples.len())
                    .then(|| format!("all at version {}", versions.iter().next().unwrap_or(&0)))
            }
            Condition::Version(v) => (reachable.len() == samples.len()
                && reachable.iter().all(|s| s.version >= *v))
            .then(|| format!("all at version {v} or later")),
        }
    }

    /// Undoes one fault; returns what it did.
    async fn revert(&mut self, r: Revert) -> String {
        match r {
            Revert::Backends(names) => {
                let mut problems = Vec::new();
                for name in &names {
                    let Some(m) = self.d.mocks.iter().find(|m| &m.name == name).cloned() else {
                        continue;
                    };
                    if let Err(e) = self.patch(&m.url, &m.baseline).await {
                        problems.push(e);
                    }
                }
                if problems.is_empty() {
                    format!("faults restored on {}", names.join(", "))
                } else {
                    format!("could not restore: {}", problems.join("; "))
                }
            }
            Revert::Resume(id) => {
                let result = match self.d.local.as_mut() {
                    Some(l) => l.resume(id).await.map_err(|e| format!("{e:#}")),
                    None => Err("needs a local target".into()),
                };
                self.load.set_rotation(id, true);
                match result {
                    Ok(()) => format!("node {id} resumed (SIGCONT)"),
                    Err(e) => format!("could not resume node {id}: {e}"),
                }
            }
            Revert::Uncut(links) => {
                if let Some(l) = &self.d.local {
                    let mut cuts = l.relays.cuts();
                    for link in &links {
                        cuts.remove(link);
                    }
                    l.relays.set(cuts);
                }
                format!("healed {} links", links.len())
            }
        }
    }

    /// Restores every fault the drill may have left: every mock's faults
    /// to their start values, partitions healed, paused nodes resumed,
    /// killed nodes started.
    async fn restore_all(&mut self) -> Vec<String> {
        let mut actions = Vec::new();
        self.pending.clear();
        let names: Vec<String> = self.d.mocks.iter().map(|m| m.name.clone()).collect();
        if !names.is_empty() {
            actions.push(self.revert(Revert::Backends(names)).await);
        }
        if let Some(l) = self.d.local.as_mut() {
            let cut = l.relays.cuts().len();
            l.relays.heal();
            if cut > 0 {
                actions.push(format!("healed {cut} cut links"));
            }
            actions.extend(l.restore_nodes().await);
        }
        for n in self.d.nodes.clone() {
            self.load.set_rotation(n.id, true);
        }
        for a in &actions {
            self.event("restore", a.clone());
        }
        actions
    }

    /// Reads everything back: each mock's faults equal to the start, each
    /// node running and answering.
    async fn verify_restore(&mut self, actions: Vec<String>) -> Restore {
        let mut problems = Vec::new();
        for m in &self.d.mocks {
            match self.d.admin.get(&format!("{}/mock/faults", m.url)).await {
                Some(v) if v == m.baseline => {}
                Some(v) => problems.push(format!(
                    "backend {}: faults are {v}, not the start's",
                    m.name
                )),
                None => problems.push(format!("backend {}: /mock/faults did not answer", m.name)),
            }
        }
        if let Some(l) = self.d.local.as_mut() {
            for (id, alive) in l.alive() {
                if !alive {
                    problems.push(format!("node {id}: process is not running"));
                }
            }
        }
        for n in &self.d.nodes {
            let mut answered = false;
            for _ in 0..50 {
                if self.d.admin.sample(n.id, &n.admin).await.reachable {
                    answered = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if !answered {
                problems.push(format!("node {}: admin API does not answer", n.id));
            }
        }
        Restore {
            actions,
            verified: problems.is_empty(),
            problems,
        }
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

fn pct(ok: usize, total: usize) -> String {
    if total == 0 {
        "–".into()
    } else {
        format!("{:.1}%", ok as f64 * 100.0 / total as f64)
    }
}
