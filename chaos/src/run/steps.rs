//! The steps on their clock: idling until a step is due (running timed
//! reverts meanwhile), resolving its node and backends, executing it.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Aborted, MockInfo, Revert, Running, StepError};
use crate::history::{self, Ack};
use crate::local::{LocalCluster, NodeState};
use crate::report::{Event, StepRecord};
use crate::scenario::{fmt_dur, Action, BackendSel, Condition, Direction, NodeSel, PartitionSel};
use crate::spawn;

impl Running<'_, '_> {
    /// Sleeps until `until`, running timed reverts as they fall due;
    /// returns early with the reason when the drill is aborted.
    pub(super) async fn idle_until(&mut self, until: Instant) -> Result<(), Aborted> {
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

    pub(super) async fn run_steps(&mut self) -> Result<(), Aborted> {
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
            let record = |description: String, ok: bool, detail: String| StepRecord {
                index,
                action: step.action.name().into(),
                description,
                planned_at_ms: step.at.map(|a| a.as_millis() as i64),
                started_ms,
                ended_ms,
                ok,
                detail,
            };
            let (ok, detail) = match result {
                Ok(d) => (true, d),
                Err(StepError::Failed(e)) => (false, e),
                Err(StepError::Aborted(a)) => {
                    self.steps
                        .push(record(description, false, "aborted".into()));
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
            self.steps.push(record(description, ok, detail));
        }
        let end = self.t0 + self.d.sc.load.duration;
        self.idle_until(end).await
    }

    pub(super) fn running_ids(&self) -> Vec<u64> {
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

    pub(super) async fn patch(&self, url: &str, body: &Value) -> Result<(), String> {
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

    /// The node `sel` names, else every local node in `state` (what a
    /// `resume` or a `restart` without a node acts on).
    async fn named_or_all(
        &mut self,
        sel: Option<&NodeSel>,
        state: NodeState,
    ) -> Result<Vec<u64>, String> {
        match sel {
            Some(sel) => Ok(vec![self.resolve(sel).await?]),
            None => Ok(self
                .local()?
                .nodes
                .iter()
                .filter(|n| n.state == state)
                .map(|n| n.id)
                .collect()),
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
                let ids = self.named_or_all(node.as_ref(), NodeState::Paused).await?;
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
                let ids = self.named_or_all(node.as_ref(), NodeState::Killed).await?;
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
                let out = spawn::ctl_command(&self.d.exe, &admin, &self.d.admin.token)
                    .arg("--json")
                    .args(args)
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
}
