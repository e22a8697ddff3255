//! The observer: every 200 ms it asks each node's admin API for its own
//! view (`GET /admin/v1/cluster?scope=local`: term, leader, decision
//! version) and records a [`Tick`]; when a version appears that it has not
//! seen, it reads that node's decision history. At the end it reads every
//! node's full history for the lost-decision check.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use crate::history::{Held, NodeSample, Tick};
use crate::load::signed_ms;

/// A decision as first seen in some node's history.
#[derive(Clone, Debug, Serialize)]
pub struct Seen {
    pub version: u64,
    pub kind: String,
    pub decision: Value,
    pub zones: Vec<String>,
    pub origin: String,
    pub actor: String,
    pub reason: String,
    /// The leader's wall clock when it proposed (ms since the epoch).
    pub at_ms: u64,
    /// The tick at which some node first reported this version.
    pub first_seen_ms: i64,
    pub seen_on: u64,
}

#[derive(Default)]
pub struct State {
    pub ticks: Vec<Tick>,
    pub decisions: BTreeMap<u64, Seen>,
}

/// The admin API client the drill uses (observer, ctl checks, restore).
#[derive(Clone)]
pub struct Admin {
    pub client: reqwest::Client,
    pub token: String,
}

impl Admin {
    pub fn new(token: String) -> Admin {
        Admin {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap_or_default(),
            token,
        }
    }

    pub async fn get(&self, url: &str) -> Option<Value> {
        let resp = self
            .client
            .get(url)
            .bearer_auth(&self.token)
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    pub async fn sample(&self, node: u64, admin: &str) -> NodeSample {
        match self
            .get(&format!("{admin}/admin/v1/cluster?scope=local"))
            .await
        {
            Some(v) => NodeSample {
                node,
                reachable: true,
                term: v["term"].as_u64().unwrap_or(0),
                leader: v["leader"].as_u64(),
                is_leader: v["is_leader"].as_bool().unwrap_or(false),
                version: v["decision_version"].as_u64().unwrap_or(0),
            },
            None => NodeSample::unreachable(node),
        }
    }

    /// A node's decision history, newest first (raw records).
    pub async fn decisions(&self, admin: &str, limit: usize) -> Option<Vec<Value>> {
        let v = self
            .get(&format!("{admin}/admin/v1/decisions?limit={limit}"))
            .await?;
        v["decisions"].as_array().cloned()
    }
}

/// Turns a raw decision record into what the lost-decision check compares.
pub fn held(v: &Value) -> Held {
    Held {
        version: v["version"].as_u64().unwrap_or(0),
        kind: v["kind"].as_str().unwrap_or_default().to_owned(),
        decision: v["decision"].clone(),
    }
}

/// The running observer.
pub struct Observer {
    pub state: Arc<Mutex<State>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Polls `nodes` (id, admin URL) every `every` from now on.
    pub fn start(
        admin: Admin,
        nodes: Vec<(u64, String)>,
        t0: Instant,
        every: Duration,
    ) -> Observer {
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut known_max = 0u64;
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        _ = tick.tick() => {}
                    }
                    let t_ms = signed_ms(Instant::now(), t0);
                    let samples = futures_util::future::join_all(
                        nodes.iter().map(|(id, url)| admin.sample(*id, url)),
                    )
                    .await;
                    // A node ahead of what we know: read its history.
                    let ahead = samples
                        .iter()
                        .filter(|s| s.reachable && s.version > known_max)
                        .max_by_key(|s| s.version)
                        .map(|s| (s.node, s.version));
                    if let Some((node, version)) = ahead {
                        let url = nodes
                            .iter()
                            .find(|(id, _)| *id == node)
                            .map(|(_, u)| u.clone());
                        if let Some(list) = match url {
                            Some(u) => admin.decisions(&u, 100).await,
                            None => None,
                        } {
                            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                            for d in &list {
                                let v = d["version"].as_u64().unwrap_or(0);
                                st.decisions.entry(v).or_insert_with(|| Seen {
                                    version: v,
                                    kind: d["kind"].as_str().unwrap_or_default().to_owned(),
                                    decision: d["decision"].clone(),
                                    zones: d["zones"]
                                        .as_array()
                                        .map(|z| {
                                            z.iter()
                                                .filter_map(|z| z.as_str().map(str::to_owned))
                                                .collect()
                                        })
                                        .unwrap_or_default(),
                                    origin: d["origin"].as_str().unwrap_or("operator").to_owned(),
                                    actor: d["actor"].as_str().unwrap_or_default().to_owned(),
                                    reason: d["reason"].as_str().unwrap_or_default().to_owned(),
                                    at_ms: d["at_ms"].as_u64().unwrap_or(0),
                                    first_seen_ms: t_ms,
                                    seen_on: node,
                                });
                            }
                            known_max = version;
                        }
                    }
                    state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .ticks
                        .push(Tick {
                            t_ms,
                            nodes: samples,
                        });
                }
            })
        };
        Observer { state, stop, task }
    }

    /// The newest tick, if any.
    pub fn last(&self) -> Option<Tick> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ticks
            .last()
            .cloned()
    }

    pub fn decisions(&self) -> BTreeMap<u64, Seen> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decisions
            .clone()
    }

    pub async fn stop(self) -> State {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
