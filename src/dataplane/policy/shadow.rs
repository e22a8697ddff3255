//! Shadow traffic: a sampled request's copy goes to another model in the
//! background after the client's request was admitted, and the pair is
//! compared (status, time to first byte, output tokens, token-set Jaccard
//! similarity of the texts). The copy never touches the client's answer:
//! it runs in its own task under its own timeout, with no retry, no
//! continuation, no passive health signal, no zone report and no quota
//! unless `count_quota`; at most `max_in_flight` copies per shadow run on
//! a node, beyond that a sample is skipped and counted. Results go to
//! `zonegate_shadow_*` and a bounded ring per shadow (`/admin/v1/shadows`).
//! A copy's answer is priced at its target backend's price and counted
//! apart (`zonegate_shadow_spend_total`, the shadow's spend): never in the
//! tenant's spend, never charged to its budget.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use serde::Serialize;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::rules::bucket;
use crate::config::cost::Price;
use crate::config::policy::Shadow;
use crate::config::Config;
use crate::dataplane::cost::{self, Estimate};
use crate::dataplane::forward::{self, AttemptError, AttemptLimits};
use crate::dataplane::request::ClientHeaders;
use crate::dataplane::spend::Ledger;
use crate::dataplane::sse::Usage;
use crate::dataplane::upstream::Target;
use crate::node::gateway::Gateway;

/// Disagreements kept per shadow.
pub const RING: usize = 50;
/// Samples kept per shadow for the distributions.
const SAMPLES: usize = 1024;
/// A copy's answer is read up to this many bytes for the comparison.
const MAX_BODY: usize = 4 << 20;
/// Below this similarity a pair of 2xx answers counts as a disagreement.
pub const DISAGREE_BELOW: f64 = 0.5;

/// Every shadow's state on this node, by name: it outlives config
/// versions, so a shadow's record survives an unrelated config change.
#[derive(Default)]
pub struct Shadows {
    states: Mutex<HashMap<Arc<str>, Arc<ShadowState>>>,
    /// What the copies cost, by (shadow, target model), by the hour: the
    /// shadow lines of `/admin/v1/spend`, apart from the tenants'.
    pub spend: Ledger,
}

impl Shadows {
    pub fn state(&self, name: &Arc<str>) -> Arc<ShadowState> {
        Arc::clone(self.states.lock().entry(Arc::clone(name)).or_default())
    }

    /// The state of `name`, if it ever sampled a request here.
    pub fn get(&self, name: &str) -> Option<Arc<ShadowState>> {
        self.states.lock().get(name).cloned()
    }
}

/// One shadow's copies in flight and its record.
#[derive(Default)]
pub struct ShadowState {
    in_flight: AtomicU32,
    record: Mutex<Record>,
}

/// Counts, recent samples and the last disagreements of one shadow.
#[derive(Default, Clone, Serialize)]
pub struct Record {
    pub sampled: u64,
    pub sent: u64,
    pub skipped_in_flight: u64,
    pub skipped_quota: u64,
    pub no_backend: u64,
    /// Copies answered 2xx / failed (non-2xx, connect error) / timed out.
    pub ok: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub compared: u64,
    pub agreed: u64,
    pub disagreed: u64,
    /// What the copies' answers cost, in nano-units (at the target
    /// backends' prices).
    pub spend_nanos: u64,
    /// Seconds, shadow minus primary time to first byte, newest last.
    pub latency_delta_s: VecDeque<f64>,
    pub similarity: VecDeque<f64>,
    pub disagreements: VecDeque<Disagreement>,
}

/// One pair that disagreed.
#[derive(Clone, Serialize, Debug)]
pub struct Disagreement {
    pub request_id: String,
    pub at_ms: u64,
    pub primary_status: u16,
    pub shadow_status: u16,
    pub primary_first_byte_ms: Option<u64>,
    pub shadow_first_byte_ms: Option<u64>,
    pub similarity: Option<f64>,
    pub primary_tokens: Option<u64>,
    pub shadow_tokens: Option<u64>,
    pub reason: String,
}

impl ShadowState {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn record(&self) -> Record {
        self.record.lock().clone()
    }

    fn count(&self, f: impl FnOnce(&mut Record)) {
        f(&mut self.record.lock());
    }
}

/// Holds a slot of `max_in_flight` while a copy runs.
struct Slot(Arc<ShadowState>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a copy's answer is priced: at its target backend's price, from
/// its `usage` or else the admission estimate.
struct Bill {
    price: Option<Price>,
    estimate: Estimate,
    to: String,
}

impl Bill {
    /// Counts what the copy cost apart from the client's spend: in
    /// `zonegate_shadow_spend_total{shadow,model,zone}`, the shadow's
    /// record and the shadow ledger. No budget is touched.
    fn charge(
        &self,
        gw: &Gateway,
        name: &Arc<str>,
        zone: &zonegate_cluster::ZoneId,
        state: &ShadowState,
        answer: &Answer,
        c: &Comparison,
    ) {
        let nanos = cost::shadow_cost(
            answer.status,
            c.shadow_usage,
            self.estimate,
            c.shadow_delivered,
            self.price,
        );
        if nanos == 0 {
            return;
        }
        gw.metrics
            .shadow_spend
            .with_label_values(&[&**name, self.to.as_str(), zone.as_str()])
            .inc_by(cost::units(nanos));
        state.count(|r| r.spend_nanos = r.spend_nanos.saturating_add(nanos));
        gw.shadows
            .spend
            .record_apart(name, &self.to, nanos, crate::clock::unix_ms());
    }
}

/// What the primary request did, for the comparison.
pub struct Primary {
    pub status: u16,
    /// From admission to the answer's first byte (or the final error).
    pub first_byte: Duration,
    /// The whole answer, when it came whole with its head (a plain JSON
    /// answer); a stream's text is not kept.
    pub body: Option<Bytes>,
}

/// Copies started for one request; told the primary's outcome once.
#[derive(Default)]
pub struct Pending(SmallVec<[oneshot::Sender<Arc<Primary>>; 1]>);

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn primary(self, p: Primary) {
        let p = Arc::new(p);
        for tx in self.0 {
            let _ = tx.send(Arc::clone(&p));
        }
    }
}

/// The request a copy is made of.
pub struct Ask<'a> {
    pub tenant_index: usize,
    pub tenant: &'a str,
    /// The model the client asked for.
    pub model: &'a str,
    pub user: u64,
    pub path: &'a str,
    pub headers: &'a ClientHeaders,
    pub body: &'a Bytes,
    pub stream: bool,
    pub request_id: &'a [u8],
    /// The tokens admission estimated (a copy without `usage` is priced
    /// from it).
    pub estimate: Estimate,
    /// The request's span, when it is traced: the copy's parent.
    pub trace: Option<&'a crate::telemetry::traces::Span>,
}

/// Starts the copies the shadows of `ask.model` sample; nothing at all when
/// the config has no shadow. Call after admission.
pub fn start(gw: &Arc<Gateway>, cfg: &Arc<Config>, ask: &Ask<'_>) -> Pending {
    let mut pending = Pending::default();
    if cfg.policy.shadows.is_empty() {
        return pending;
    }
    let Some(list) = cfg.policy.shadows_by_model.get(ask.model) else {
        return pending;
    };
    for &i in list {
        let Some(shadow) = cfg.policy.shadows.get(i) else {
            continue;
        };
        if bucket(ask.user, shadow.salt) >= shadow.threshold
            || !super::allows_model(cfg, ask.tenant_index, &shadow.to)
        {
            continue;
        }
        if let Some(rx) = start_one(gw, cfg, shadow, ask) {
            pending.0.push(rx);
        }
    }
    pending
}

fn start_one(
    gw: &Arc<Gateway>,
    cfg: &Arc<Config>,
    shadow: &Shadow,
    ask: &Ask<'_>,
) -> Option<oneshot::Sender<Arc<Primary>>> {
    let state = gw.shadows.state(&shadow.name);
    let outcome = |o: &str| {
        gw.metrics
            .shadow_requests
            .with_label_values(&[&*shadow.name, o])
            .inc()
    };
    state.count(|r| r.sampled += 1);
    if state.in_flight.fetch_add(1, Ordering::Relaxed) >= shadow.max_in_flight {
        state.in_flight.fetch_sub(1, Ordering::Relaxed);
        state.count(|r| r.skipped_in_flight += 1);
        outcome("skipped_in_flight");
        return None;
    }
    let slot = Slot(Arc::clone(&state));
    if shadow.count_quota
        && gw
            .quotas
            .load()
            .count_request(ask.tenant_index, crate::clock::now_ns())
            .is_err()
    {
        state.count(|r| r.skipped_quota += 1);
        outcome("skipped_quota");
        return None;
    }
    let routes = gw.routes.load_full();
    let Some(backend) = pick(cfg, &routes, shadow, ask) else {
        state.count(|r| r.no_backend += 1);
        outcome("no_backend");
        return None;
    };
    let (tx, rx) = oneshot::channel();
    let upstream = backend.physical_model(&shadow.to).unwrap_or(&shadow.to);
    let copy = Copy {
        path: ask.path.to_owned(),
        headers: owned_headers(ask.headers),
        body: rewrite_model(ask.body, upstream),
        upstream: upstream.to_owned(),
        to: shadow.to.clone(),
        stream: ask.stream,
        request_id: String::from_utf8_lossy(ask.request_id).into_owned(),
        timeout: shadow.timeout,
        connect_timeout: routes
            .model(&shadow.to)
            .map_or(Duration::from_secs(2), |m| m.cfg.timeouts.connect),
        span: ask.trace.map(|t| {
            let span = forward::client_span(t, ask.path, &shadow.to, &backend);
            span.set([opentelemetry::KeyValue::new(
                crate::telemetry::traces::keys::SHADOW,
                Arc::clone(&shadow.name),
            )]);
            span
        }),
    };
    state.count(|r| r.sent += 1);
    let gw = Arc::clone(gw);
    let name = Arc::clone(&shadow.name);
    let bill = Bill {
        price: cfg.costs.price(&backend.name, &shadow.to),
        estimate: ask.estimate,
        to: shadow.to.clone(),
    };
    tokio::spawn(async move {
        let result = copy.send(&backend).await;
        drop(slot);
        drop(routes);
        let o = match &result.status {
            Some(s) if (200..300).contains(s) => "ok",
            _ if result.timed_out => "timeout",
            _ => "error",
        };
        if let Some(span) = &copy.span {
            if o != "ok" {
                span.fail(o);
            }
            span.end();
        }
        gw.metrics
            .shadow_requests
            .with_label_values(&[&*name, o])
            .inc();
        // The primary may still be streaming: wait for its first byte.
        let primary = tokio::time::timeout(Duration::from_secs(900), rx)
            .await
            .ok()
            .and_then(Result::ok);
        let c = compare(primary.as_deref(), &result);
        bill.charge(&gw, &name, &backend.zone, &state, &result, &c);
        record(
            &gw,
            &name,
            &state,
            &copy.request_id,
            &result,
            primary.as_deref(),
            c,
        );
    });
    Some(tx)
}

/// A backend of the shadow's target the tenant may use: this node's zone
/// first, then any; never a retry.
fn pick(
    cfg: &Config,
    routes: &crate::dataplane::routing::Routes,
    shadow: &Shadow,
    ask: &Ask<'_>,
) -> Option<Arc<crate::dataplane::backend::Backend>> {
    let model = routes.model(&shadow.to)?;
    let mut excluded = SmallVec::new();
    super::eligible::exclude(cfg, ask.tenant_index, routes, &mut excluded);
    let now = crate::clock::now_ms();
    let mut rng = fastrand::Rng::new();
    let own = model.pool(&cfg.node.zone);
    own.into_iter().chain(model.pools.iter()).find_map(|pool| {
        pool.pick(model.cfg.balance, None, now, &excluded, &mut rng)
            .map(|(i, _)| Arc::clone(&pool.backends[i]))
    })
}

/// The client's headers, owned for the background task.
fn owned_headers(headers: &ClientHeaders) -> ClientHeaders {
    let mut map = HeaderMap::new();
    headers.for_each(|k, v| {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k), HeaderValue::from_bytes(v)) {
            map.append(k, v);
        }
    });
    ClientHeaders::Map(map)
}

/// The body with `model` set to `to` (untouched if it is not a JSON object).
fn rewrite_model(body: &Bytes, to: &str) -> Bytes {
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut obj) => {
            obj.insert("model".into(), to.into());
            serde_json::to_vec(&obj)
                .map(Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

struct Copy {
    path: String,
    headers: ClientHeaders,
    body: Bytes,
    /// The target model's name at the backend, and the shadow's target
    /// (what a provider adapter answers as).
    upstream: String,
    to: String,
    stream: bool,
    request_id: String,
    timeout: Duration,
    connect_timeout: Duration,
    /// The copy's span (a traced request's child).
    span: Option<crate::telemetry::traces::Span>,
}

/// What the copy got.
#[derive(Default)]
pub struct Answer {
    pub status: Option<u16>,
    pub first_byte: Option<Duration>,
    pub body: Option<Bytes>,
    pub timed_out: bool,
}

impl Copy {
    async fn send(&self, backend: &crate::dataplane::backend::Backend) -> Answer {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + self.timeout);
        let limits = AttemptLimits {
            first_byte: self.timeout,
            stream: self.stream,
            deadline,
            detect_context_length: false,
            started,
        };
        let target = Target {
            scheme: &backend.scheme,
            authority: &backend.authority,
            connect_timeout: self.connect_timeout,
            tls: &backend.tls,
        };
        // A provider backend (Azure, Anthropic): its path, key and format.
        let call = match &backend.provider {
            None => None,
            Some(p) => {
                let (body, path) = (self.body.clone(), self.path.as_str());
                match crate::dataplane::provider::prepare(p, path, body, &self.upstream, &self.to) {
                    Ok(call) => Some(call),
                    Err(_) => {
                        return Answer {
                            status: Some(400),
                            ..Answer::default()
                        }
                    }
                }
            }
        };
        let traceparent = self.span.as_ref().map(|s| s.traceparent());
        let attempt = forward::attempt(
            target,
            &self.path,
            &self.headers,
            backend.host_value.as_ref(),
            self.request_id.as_bytes(),
            self.body.clone(),
            limits,
            call.as_ref(),
            traceparent.as_ref().map(|t| &t[..]),
        );
        let committed = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return Answer {
                    status: match &e {
                        AttemptError::Status(s) => Some(s.as_u16()),
                        AttemptError::Busy(_) => Some(429),
                        _ => None,
                    },
                    timed_out: matches!(
                        e,
                        AttemptError::TtftTimeout(_)
                            | AttemptError::GenerationTimeout(_)
                            | AttemptError::Deadline
                    ),
                    ..Answer::default()
                }
            }
            Err(_) => {
                return Answer {
                    timed_out: true,
                    ..Answer::default()
                }
            }
        };
        let mut body = Vec::new();
        if let Some(first) = &committed.first {
            body.extend_from_slice(first);
        }
        let mut timed_out = false;
        if let Some(mut rest) = committed.rest {
            use http_body_util::BodyExt;
            loop {
                match tokio::time::timeout_at(deadline, rest.frame()).await {
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            if body.len() + data.len() > MAX_BODY {
                                break;
                            }
                            body.extend_from_slice(&data);
                        }
                    }
                    Ok(_) => break,
                    Err(_) => {
                        timed_out = true;
                        break;
                    }
                }
            }
        }
        Answer {
            status: Some(committed.status.as_u16()),
            first_byte: Some(committed.first_byte),
            body: Some(body.into()),
            timed_out,
        }
    }
}

/// The comparison of one pair.
#[derive(Debug, PartialEq)]
pub struct Comparison {
    pub status_agrees: bool,
    pub latency_delta_s: Option<f64>,
    pub similarity: Option<f64>,
    pub primary_tokens: Option<u64>,
    pub shadow_tokens: Option<u64>,
    /// The copy's `usage`, and the bytes of its answer's text (what it is
    /// priced by without `usage`).
    pub shadow_usage: Option<Usage>,
    pub shadow_delivered: u64,
}

impl Comparison {
    pub fn disagrees(&self) -> Option<String> {
        if !self.status_agrees {
            return Some("status".into());
        }
        match self.similarity {
            Some(s) if s < DISAGREE_BELOW => Some(format!("similarity {s:.2}")),
            _ => None,
        }
    }
}

/// Pure: the comparison of the primary's outcome with the copy's.
pub fn compare(primary: Option<&Primary>, shadow: &Answer) -> Comparison {
    let ok = |s: u16| (200..300).contains(&s);
    let p_status = primary.map_or(0, |p| p.status);
    let s_status = shadow.status.unwrap_or(0);
    let status_agrees = p_status == s_status || (ok(p_status) && ok(s_status));
    let p_text = primary.and_then(|p| p.body.as_deref()).map(answer_text);
    let s_text = shadow.body.as_deref().map(answer_text);
    let similarity = match (&p_text, &s_text) {
        (Some((a, _)), Some((b, _))) if ok(p_status) && ok(s_status) => Some(jaccard(a, b)),
        _ => None,
    };
    let shadow_usage = s_text.as_ref().and_then(|(_, u)| *u);
    Comparison {
        status_agrees,
        latency_delta_s: match (primary, shadow.first_byte) {
            (Some(p), Some(s)) => Some(s.as_secs_f64() - p.first_byte.as_secs_f64()),
            _ => None,
        },
        similarity,
        primary_tokens: p_text.and_then(|(_, u)| u).map(|u| u.completion_tokens),
        shadow_tokens: shadow_usage.map(|u| u.completion_tokens),
        shadow_usage,
        shadow_delivered: s_text.map_or(0, |(t, _)| t.len() as u64),
    }
}

/// The text of an answer (a JSON completion, or an event stream's deltas)
/// and its `usage` if it reports one (with `completion_tokens`).
pub fn answer_text(body: &[u8]) -> (String, Option<Usage>) {
    fn piece(v: &serde_json::Value, text: &mut String, tokens: &mut Option<Usage>) {
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            *tokens = Some(Usage {
                prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                completion_tokens: n,
            });
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            for s in [&c["message"]["content"], &c["delta"]["content"], &c["text"]] {
                if let Some(s) = s.as_str() {
                    text.push_str(s);
                }
            }
        }
    }
    let (mut text, mut tokens) = (String::new(), None);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        piece(&v, &mut text, &mut tokens);
        return (text, tokens);
    }
    for line in body.split(|b| *b == b'\n') {
        let Some(data) = line.strip_prefix(b"data:") else {
            continue;
        };
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data.trim_ascii()) {
            piece(&v, &mut text, &mut tokens);
        }
    }
    (text, tokens)
}

/// Token-set Jaccard similarity of two texts (lowercased words): 1 for two
/// empty texts.
pub fn jaccard(a: &str, b: &str) -> f64 {
    let words = |s: &str| -> HashSet<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let (a, b) = (words(a), words(b));
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

fn record(
    gw: &Gateway,
    name: &str,
    state: &ShadowState,
    request_id: &str,
    shadow: &Answer,
    primary: Option<&Primary>,
    c: Comparison,
) {
    let m = &gw.metrics;
    if let Some(p) = primary {
        m.shadow_first_byte
            .with_label_values(&[name, "primary"])
            .observe(p.first_byte.as_secs_f64());
    }
    if let Some(s) = shadow.first_byte {
        m.shadow_first_byte
            .with_label_values(&[name, "shadow"])
            .observe(s.as_secs_f64());
    }
    let disagreement = c.disagrees();
    m.shadow_comparisons
        .with_label_values(&[
            name,
            if disagreement.is_some() {
                "disagree"
            } else {
                "agree"
            },
        ])
        .inc();
    let ms = |d: Duration| d.as_millis() as u64;
    state.count(|r| {
        match shadow.status {
            Some(s) if (200..300).contains(&s) => r.ok += 1,
            _ if shadow.timed_out => r.timeouts += 1,
            _ => r.errors += 1,
        }
        r.compared += 1;
        push(&mut r.latency_delta_s, c.latency_delta_s, SAMPLES);
        push(&mut r.similarity, c.similarity, SAMPLES);
        if c.similarity.is_some() {
            let mean = r.similarity.iter().sum::<f64>() / r.similarity.len() as f64;
            m.shadow_similarity.with_label_values(&[name]).set(mean);
        }
        match disagreement {
            None => r.agreed += 1,
            Some(reason) => {
                r.disagreed += 1;
                let d = Disagreement {
                    request_id: request_id.to_owned(),
                    at_ms: crate::clock::unix_ms(),
                    primary_status: primary.map_or(0, |p| p.status),
                    shadow_status: shadow.status.unwrap_or(0),
                    primary_first_byte_ms: primary.map(|p| ms(p.first_byte)),
                    shadow_first_byte_ms: shadow.first_byte.map(ms),
                    similarity: c.similarity,
                    primary_tokens: c.primary_tokens,
                    shadow_tokens: c.shadow_tokens,
                    reason: if shadow.timed_out {
                        format!("{reason} (shadow timed out)")
                    } else {
                        reason
                    },
                };
                push(&mut r.disagreements, Some(d), RING);
            }
        }
    });
}

fn push<T>(q: &mut VecDeque<T>, v: Option<T>, cap: usize) {
    if let Some(v) = v {
        if q.len() >= cap {
            q.pop_front();
        }
        q.push_back(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str, tokens: u64) -> Bytes {
        Bytes::from(
            serde_json::json!({"choices": [{"message": {"content": text}}], "usage": {"completion_tokens": tokens}})
                .to_string(),
        )
    }

    #[test]
    fn jaccard_of_token_sets() {
        assert_eq!(jaccard("the cat sat", "The cat sat!"), 1.0);
        assert_eq!(jaccard("a b", "c d"), 0.0);
        assert!((jaccard("a b c", "b c d") - 0.5).abs() < 1e-9);
        assert_eq!(jaccard("", ""), 1.0);
    }

    #[test]
    fn answer_text_reads_json_and_event_streams() {
        let usage = |p, c| {
            Some(Usage {
                prompt_tokens: p,
                completion_tokens: c,
            })
        };
        assert_eq!(
            answer_text(&body("hi there", 2)),
            ("hi there".into(), usage(0, 2))
        );
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi \"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"there\"}}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        assert_eq!(answer_text(sse), ("hi there".into(), usage(7, 2)));
    }

    #[test]
    fn a_pair_disagrees_on_status_or_low_similarity_only() {
        let primary = |status, text: &str| Primary {
            status,
            first_byte: Duration::from_millis(100),
            body: Some(body(text, 3)),
        };
        let shadow = |status: Option<u16>, text: &str| Answer {
            status,
            first_byte: Some(Duration::from_millis(300)),
            body: Some(body(text, 4)),
            timed_out: false,
        };
        let c = compare(Some(&primary(200, "a b c")), &shadow(Some(200), "a b c"));
        assert_eq!(c.disagrees(), None);
        assert!((c.latency_delta_s.unwrap() - 0.2).abs() < 1e-9);
        assert_eq!((c.primary_tokens, c.shadow_tokens), (Some(3), Some(4)));
        let c = compare(Some(&primary(200, "a b c")), &shadow(Some(500), "x"));
        assert_eq!(c.disagrees().as_deref(), Some("status"));
        assert_eq!(c.similarity, None, "no text comparison against an error");
        let c = compare(
            Some(&primary(200, "a b c d")),
            &shadow(Some(200), "x y z a"),
        );
        assert!(c.disagrees().unwrap().starts_with("similarity"), "{c:?}");
        let c = compare(
            Some(&primary(200, "a")),
            &Answer {
                timed_out: true,
                ..Answer::default()
            },
        );
        assert_eq!(c.disagrees().as_deref(), Some("status"));
    }

    #[test]
    fn the_ring_keeps_the_last_entries_only() {
        let mut q = VecDeque::new();
        for i in 0..(RING + 10) {
            push(&mut q, Some(i), RING);
        }
        assert_eq!(q.len(), RING);
        assert_eq!(q.front(), Some(&10));
    }
}
