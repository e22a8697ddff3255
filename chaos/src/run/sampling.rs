//! What the drill watches while it runs: the progress line, the alarm,
//! the capacity pre-check, the leader and the `wait_for` conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Aborted, Running};
use crate::checks;
use crate::exit;
use crate::history;
use crate::load::{self, signed_ms};
use crate::scenario::{fmt_dur, Action, BackendSel, Condition};

impl Running<'_, '_> {
    /// Prints one line per second: rps, success, version, leader.
    pub(super) fn spawn_progress(&self) -> tokio::task::JoinHandle<()> {
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
    pub(super) fn spawn_alarm(&self) -> Option<tokio::task::JoinHandle<()>> {
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

    /// `safety.capacity_check`: the zones the steps take out of service,
    /// and every zone's capacity units from each node's
    /// `/admin/v1/quotas`, five times 200 ms apart (per zone the most in
    /// flight seen); refuses to go on (exit 2) when they do not fit.
    pub(super) async fn capacity_precheck(&mut self) -> Result<(), Aborted> {
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

    /// The leader a majority of the nodes name (a node cut off from the
    /// group may still name an old one); polls up to `within`.
    pub(super) async fn current_leader(&self, within: Duration) -> Result<u64, String> {
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

    /// Whether `c` holds now; `Some(what)` when it does.
    pub(super) async fn holds(&self, c: &Condition) -> Option<String> {
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
}

fn pct(ok: usize, total: usize) -> String {
    if total == 0 {
        "–".into()
    } else {
        format!("{:.1}%", ok as f64 * 100.0 / total as f64)
    }
}
