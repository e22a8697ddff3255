//! The drill's load generator: open loop (requests leave on the clock, not
//! when earlier ones finish, so a stalled cluster cannot slow the load it
//! is judged by), a mix of short, long and streaming chat requests, spread
//! over the entry nodes in rotation (an ideal client-side balancer), with
//! sessions and tenants. Every request becomes one [`Sample`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The shape of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// `max_tokens` ≤ the short limit, not streamed.
    Short,
    /// No `max_tokens`: long by zonegate's rules (never crosses zones).
    Long,
    /// Short and streamed; succeeds only with `[DONE]`.
    Stream,
}

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// When it was sent, ms from the drill's t = 0 (negative in warm-up).
    pub t_ms: i64,
    pub class: Class,
    /// The node it entered (0: none was in rotation).
    pub entry: u64,
    /// Which drill tenant sent it: the index of its API key.
    pub tenant: u32,
    pub ok: bool,
    /// HTTP status; 0 when no answer came (connect error, timeout).
    pub status: u16,
    pub latency_ms: f32,
    /// `x-zonegate-zone` of the answer.
    pub zone: Option<Arc<str>>,
    /// `x-zonegate-decision-version` of the answer.
    pub version: Option<u64>,
}

/// A node clients may send to.
#[derive(Clone, Debug)]
pub struct Entry {
    pub node: u64,
    pub zone: String,
    /// Data-plane base URL.
    pub url: String,
    /// Out of rotation while the drill has it killed or paused (a client's
    /// balancer would notice within its health-check interval; the drill
    /// models an ideal one and says so in the report).
    pub in_rotation: bool,
    /// This node's clients send to that node instead (`move_clients`),
    /// while it is in rotation.
    pub clients_to: Option<u64>,
}

/// What to send.
#[derive(Clone, Debug)]
pub struct Plan {
    pub rps: f64,
    pub mix: crate::scenario::Mix,
    pub sessions: u32,
    pub api_keys: Vec<String>,
    pub model: String,
    pub timeout: Duration,
    pub concurrency: usize,
    pub short_max_tokens: u32,
}

/// A running load generator.
pub struct Load {
    entries: Arc<RwLock<Vec<Entry>>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    not_sent: Arc<AtomicU64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What the generator measured.
pub struct Outcome {
    pub samples: Vec<Sample>,
    /// Requests due that were not sent because `concurrency` were in
    /// flight: the generator, not the cluster, was the limit.
    pub not_sent: u64,
}

fn body(model: &str, class: Class, short_max: u32) -> String {
    let v = match class {
        Class::Short => serde_json::json!({
            "model": model, "max_tokens": short_max,
            "messages": [{"role": "user", "content": "drill: a short question"}],
        }),
        Class::Long => serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "drill: a long question"}],
        }),
        Class::Stream => serde_json::json!({
            "model": model, "max_tokens": short_max, "stream": true,
            "messages": [{"role": "user", "content": "drill: a streamed question"}],
        }),
    };
    v.to_string()
}

impl Load {
    /// Starts sending at `start` (t = 0 is `t0`; warm-up starts before).
    pub fn start(plan: Plan, entries: Vec<Entry>, start: Instant, t0: Instant) -> Load {
        let entries = Arc::new(RwLock::new(entries));
        let samples = Arc::new(Mutex::new(Vec::with_capacity(
            (plan.rps * 120.0).min(2_000_000.0) as usize,
        )));
        let not_sent = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let client = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(plan.concurrency)
            .timeout(plan.timeout)
            .build()
            .unwrap_or_default();
        let task = {
            let (entries, samples, not_sent) = (entries.clone(), samples.clone(), not_sent.clone());
            tokio::spawn(async move {
                let bodies = [Class::Short, Class::Long, Class::Stream]
                    .map(|c| body(&plan.model, c, plan.short_max_tokens));
                let in_flight = Arc::new(AtomicUsize::new(0));
                let mut sent: u64 = 0;
                tokio::time::sleep_until(start).await;
                let mut tick = tokio::time::interval(Duration::from_millis(2));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        _ = tick.tick() => {}
                    }
                    let due = (start.elapsed().as_secs_f64() * plan.rps) as u64;
                    while sent < due {
                        sent += 1;
                        if in_flight.load(Ordering::Relaxed) >= plan.concurrency {
                            not_sent.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let r = fastrand::f64();
                        let class = if r < plan.mix.short {
                            Class::Short
                        } else if r < plan.mix.short + plan.mix.long {
                            Class::Long
                        } else {
                            Class::Stream
                        };
                        let (entry, rotation) = {
                            let all = entries.read().unwrap_or_else(|e| e.into_inner());
                            let live: Vec<&Entry> = all.iter().filter(|e| e.in_rotation).collect();
                            if live.is_empty() {
                                (None, 1)
                            } else {
                                let e = live[(sent as usize) % live.len()];
                                let moved = e
                                    .clients_to
                                    .and_then(|to| live.iter().copied().find(|t| t.node == to));
                                let e = moved.unwrap_or(e);
                                (Some((e.node, e.url.clone())), live.len())
                            }
                        };
                        // The tenant changes once per turn of the rotation, so
                        // every node sees every tenant (with as many nodes as
                        // tenants, `sent % tenants` would pin one to each).
                        let tenant = (sent as usize / rotation) % plan.api_keys.len();
                        let now = Instant::now();
                        let t_ms = signed_ms(now, t0);
                        let Some((node, url)) = entry else {
                            samples
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(Sample {
                                    t_ms,
                                    class,
                                    entry: 0,
                                    tenant: tenant as u32,
                                    ok: false,
                                    status: 0,
                                    latency_ms: 0.0,
                                    zone: None,
                                    version: None,
                                });
                            continue;
                        };
                        let idx = match class {
                            Class::Short => 0,
                            Class::Long => 1,
                            Class::Stream => 2,
                        };
                        let mut req = client
                            .post(format!("{url}/v1/chat/completions"))
                            .bearer_auth(&plan.api_keys[tenant])
                            .header("content-type", "application/json")
                            .body(bodies[idx].clone());
                        if plan.sessions > 0 {
                            req = req.header(
                                "x-session-id",
                                format!("drill-{}", sent % plan.sessions as u64),
                            );
                        }
                        let (samples, in_flight) = (samples.clone(), in_flight.clone());
                        in_flight.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(async move {
                            let sample = send(req, class, node, tenant as u32, t_ms, now).await;
                            in_flight.fetch_sub(1, Ordering::Relaxed);
                            samples
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(sample);
                        });
                    }
                }
                // Let what is in flight finish (bounded by the timeout).
                let deadline = Instant::now() + plan.timeout + Duration::from_secs(1);
                while in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        Load {
            entries,
            samples,
            not_sent,
            stop,
            task: Some(task),
        }
    }

    /// Takes `node` out of rotation or puts it back (with a new URL when
    /// it restarted on another port).
    pub fn set_rotation(&self, node: u64, in_rotation: bool) {
        let mut all = self.entries.write().unwrap_or_else(|e| e.into_inner());
        for e in all.iter_mut().filter(|e| e.node == node) {
            e.in_rotation = in_rotation;
        }
    }

    /// Sends the clients of `from`'s nodes to `to`'s (first) node from now
    /// on, or back to their own when `to == from`. Says what moved.
    pub fn move_clients(&self, from: &str, to: &str) -> Result<String, String> {
        let mut all = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let target = if from == to {
            None
        } else {
            let t = all
                .iter()
                .find(|e| e.zone == to)
                .ok_or_else(|| format!("no node of {to} takes clients (load.entry_zones)"))?;
            Some(t.node)
        };
        let moved: Vec<String> = all
            .iter_mut()
            .filter(|e| e.zone == from)
            .map(|e| {
                e.clients_to = target;
                format!("node {}", e.node)
            })
            .collect();
        if moved.is_empty() {
            return Err(format!(
                "no node of {from} takes clients (load.entry_zones)"
            ));
        }
        Ok(match target {
            Some(t) => format!("the clients of {} now send to node {t}", moved.join(", ")),
            None => format!("the clients of {} send to it again", moved.join(", ")),
        })
    }

    /// A handle on the samples recorded so far.
    pub fn samples(&self) -> Samples {
        Samples(self.samples.clone())
    }
}

/// A shared view of the samples recorded so far.
#[derive(Clone)]
pub struct Samples(Arc<Mutex<Vec<Sample>>>);

impl Samples {
    /// Samples whose request was sent in `[from_ms, to_ms)` so far
    /// (answers still in flight are not counted yet).
    pub fn window(&self, from_ms: i64, to_ms: i64) -> Vec<Sample> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Samples are pushed when answered, roughly in send order; scan
        // the tail only.
        let start = all.len().saturating_sub(200_000);
        all[start..]
            .iter()
            .filter(|s| s.t_ms >= from_ms && s.t_ms < to_ms)
            .cloned()
            .collect()
    }
}

impl Load {
    /// Stops sending, waits for the requests in flight, returns every
    /// sample.
    pub async fn stop(&mut self) -> Outcome {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()));
        Outcome {
            samples,
            not_sent: self.not_sent.load(Ordering::Relaxed),
        }
    }
}

/// `a - b` in ms, negative when `a` is earlier.
pub fn signed_ms(a: Instant, b: Instant) -> i64 {
    if a >= b {
        (a - b).as_millis() as i64
    } else {
        -((b - a).as_millis() as i64)
    }
}

async fn send(
    req: reqwest::RequestBuilder,
    class: Class,
    entry: u64,
    tenant: u32,
    t_ms: i64,
    sent: Instant,
) -> Sample {
    let mut sample = Sample {
        t_ms,
        class,
        entry,
        tenant,
        ok: false,
        status: 0,
        latency_ms: 0.0,
        zone: None,
        version: None,
    };
    if let Ok(resp) = req.send().await {
        sample.status = resp.status().as_u16();
        let h = resp.headers();
        sample.zone = h
            .get("x-zonegate-zone")
            .and_then(|v| v.to_str().ok())
            .map(Arc::from);
        sample.version = h
            .get("x-zonegate-decision-version")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let status_ok = resp.status().is_success();
        match resp.bytes().await {
            Ok(b) => {
                sample.ok = status_ok
                    && match class {
                        // A stream succeeds only when it ends with [DONE]
                        // (an interrupted one ends with an error event).
                        Class::Stream => {
                            let tail = &b[b.len().saturating_sub(64)..];
                            tail.windows(12).any(|w| w == b"data: [DONE]")
                        }
                        _ => true,
                    };
            }
            Err(_) => sample.ok = false,
        }
    }
    sample.latency_ms = sent.elapsed().as_secs_f32() * 1000.0;
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_ms_is_negative_before_t0() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(signed_ms(later, t0), 1500);
        assert_eq!(signed_ms(t0, later), -1500);
    }
}
