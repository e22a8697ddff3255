//! `zonegate mock-backend`: an OpenAI-compatible fake inference server for
//! demos, tests and benchmarks. Its latency, errors, queue depth, KV-cache
//! use and hang/reset/stream-cut faults are set at run time through
//! `POST /mock/faults`. Written on bare hyper so it is never the bottleneck
//! of a load benchmark.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{header, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;

mod faults;
mod provider;

pub use faults::{Faults, FaultsPatch};

type MockBody = BoxBody<Bytes, std::io::Error>;

/// Options of one mock backend.
#[derive(Debug, Clone)]
pub struct MockOptions {
    pub listen: SocketAddr,
    pub name: String,
    pub zone: Option<String>,
    /// Models it serves; empty means it answers for any model name.
    pub models: Vec<String>,
    /// The provider whose wire format it speaks (`--provider`).
    pub provider: crate::config::Provider,
    /// The credential it expects in that provider's header
    /// (`--expect-key`); anything else gets the provider's 401.
    pub expect_key: Option<String>,
    /// At most this many inference requests in their generation
    /// (`generation_ms`) at once; the rest wait their turn, first come
    /// first served, as a server's batch does (`--capacity`).
    pub capacity: Option<u32>,
}

struct Mock {
    opts: MockOptions,
    faults: Mutex<Faults>,
    requests: AtomicU64,
    health_checks: AtomicU64,
    in_flight: Arc<AtomicU64>,
    seq: AtomicU64,
    /// Inference requests by the client's `x-tenant` header (passed on by
    /// the gateway as it came), for tests of who reached which backend.
    by_tenant: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Requests refused for their credential.
    auth_failures: AtomicU64,
    /// The headers of the last inference request.
    last_headers: Mutex<serde_json::Map<String, serde_json::Value>>,
    /// `MockOptions::capacity`'s slots.
    generating: Option<tokio::sync::Semaphore>,
}

/// Distinct `x-tenant` values counted; later ones count as `(other)`.
const MAX_TENANT_KEYS: usize = 100;

/// A running mock backend.
pub struct MockHandle {
    pub addr: SocketAddr,
    mock: Arc<Mock>,
    task: tokio::task::JoinHandle<()>,
}

impl MockHandle {
    /// Replaces the faults in force (in-process tests and benches).
    pub fn set_faults(&self, faults: Faults) {
        *self.mock.faults.lock() = faults;
    }

    /// Inference requests received so far.
    pub fn requests(&self) -> u64 {
        self.mock.requests.load(Ordering::Relaxed)
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds and serves in the background. The accept queue holds 1,024
/// connections, as a node's data plane does (a plain bind's is 128 here):
/// a node that opens a few hundred connections at once, as a cold one
/// under a burst of streams does, would otherwise overflow it, and every
/// dropped SYN waits a second for its retransmission.
pub async fn start(opts: MockOptions) -> std::io::Result<MockHandle> {
    let socket = match opts.listen {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(opts.listen)?;
    let listener = socket.listen(1024)?;
    let addr = listener.local_addr()?;
    let generating = opts
        .capacity
        .map(|n| tokio::sync::Semaphore::new(n.max(1) as usize));
    let mock = Arc::new(Mock {
        generating,
        opts,
        faults: Mutex::new(Faults::default()),
        requests: AtomicU64::new(0),
        health_checks: AtomicU64::new(0),
        in_flight: Arc::new(AtomicU64::new(0)),
        seq: AtomicU64::new(0),
        by_tenant: Mutex::new(Default::default()),
        auth_failures: AtomicU64::new(0),
        last_headers: Mutex::default(),
    });
    let task = tokio::spawn(accept_loop(listener, Arc::clone(&mock)));
    Ok(MockHandle { addr, mock, task })
}

/// Runs a mock backend until Ctrl-C or SIGTERM, printing its address.
pub async fn run(opts: MockOptions) -> anyhow::Result<()> {
    let listen = opts.listen;
    let handle = start(opts)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    println!("mock-backend listening on http://{}", handle.addr);
    crate::node::lifecycle::shutdown_signal().await;
    Ok(())
}

async fn accept_loop(listener: TcpListener, mock: Arc<Mock>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("mock accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let mock = Arc::clone(&mock);
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let mock = Arc::clone(&mock);
                async move { mock.handle(req).await }
            });
            // Errors here are the faults we inject (reset, cut) or clients
            // going away; neither is news.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<MockBody> {
    let mut resp = Response::new(
        Full::new(body.into())
            .map_err(|e: Infallible| match e {})
            .boxed(),
    );
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn json_resp(status: StatusCode, v: &serde_json::Value) -> Response<MockBody> {
    full(status, "application/json", v.to_string())
}

fn openai_error(status: StatusCode, message: &str, code: &str) -> Response<MockBody> {
    json_resp(
        status,
        &crate::dataplane::error::error_body(message, "invalid_request_error", code),
    )
}

#[derive(Deserialize)]
struct InferenceHead {
    model: Option<String>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    input: Option<serde_json::Value>,
    messages: Option<Vec<Message>>,
    prompt: Option<serde_json::Value>,
    stream_options: Option<StreamOptions>,
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
}

/// OpenAI's `stream_options`: `include_usage` adds a last chunk with the
/// answer's `usage` (and no choices) before `[DONE]`.
#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Message {
    role: Option<String>,
    content: Option<serde_json::Value>,
}

impl InferenceHead {
    /// Text the client put in the answer's place already: a final
    /// assistant message (chat prefill) or the end of a completion prompt.
    fn prefill(&self) -> Option<&str> {
        if let Some(last) = self.messages.as_ref().and_then(|m| m.last()) {
            return (last.role.as_deref() == Some("assistant"))
                .then(|| last.content.as_ref().and_then(|c| c.as_str()))
                .flatten();
        }
        self.prompt.as_ref().and_then(|p| p.as_str())
    }
}

/// The mock's answer is a fixed word sequence (`{salt}tok0 `, `{salt}tok1 `,
/// …), so a continuation can be checked word for word: with a prefill that
/// ends in its first `k` words, it goes on from word `k`.
fn words_done(prefill: Option<&str>, salt: &str) -> u64 {
    let Some(text) = prefill else { return 0 };
    let mut answer = String::new();
    let mut best = 0;
    for k in 1..=64u64 {
        answer.push_str(&format!("{salt}tok{} ", k - 1));
        if text.ends_with(&answer) {
            best = k;
        }
    }
    best
}

/// Counts a request in flight for `vllm:num_requests_running`, until its
/// response body has been sent.
struct Running(Arc<AtomicU64>);

impl Running {
    fn start(counter: &Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(counter))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Mock {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<MockBody>, std::io::Error> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        match (&method, path.as_str()) {
            (&Method::GET, "/mock/faults") => {
                return Ok(json_resp(StatusCode::OK, &json!(*self.faults.lock())))
            }
            (&Method::POST, "/mock/faults") => return Ok(self.patch_faults(req).await),
            (&Method::GET, "/mock/stats") => return Ok(self.stats()),
            (&Method::GET, "/metrics") => return Ok(self.metrics()),
            _ => {}
        }
        let kind = self.opts.provider;
        if let (Some(expect), true) = (&self.opts.expect_key, provider::guarded(&path)) {
            if let Some(refused) = provider::check_key(kind, expect, req.headers()) {
                self.auth_failures.fetch_add(1, Ordering::Relaxed);
                return Ok(refused);
            }
        }
        let path = match provider::route(kind, &method, &path, req.uri().query()) {
            Ok(provider::Route::Pass) => path,
            Ok(provider::Route::Openai(p)) => p,
            Ok(provider::Route::Models) => return Ok(provider::azure_models(&self.opts.models)),
            Err(resp) => return Ok(*resp),
        };
        let faults = self.faults.lock().clone();
        let inference = method == Method::POST && path.starts_with("/v1/");
        if inference {
            self.requests.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = req.headers().get("x-tenant") {
                let t = String::from_utf8_lossy(t.as_bytes()).into_owned();
                let mut counts = self.by_tenant.lock();
                let key = if counts.len() < MAX_TENANT_KEYS || counts.contains_key(&t) {
                    t
                } else {
                    "(other)".to_owned()
                };
                *counts.entry(key).or_default() += 1;
            }
            *self.last_headers.lock() = provider::seen(req.headers());
        }
        if faults.reset && (inference || path == "/health") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "mock reset fault",
            ));
        }
        if faults.hang && (inference || path == "/health") {
            std::future::pending::<()>().await;
        }
        if faults.latency_ms > 0 && (inference || path == "/health") {
            tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
        }
        match (&method, path.as_str()) {
            (&Method::GET, "/health") => {
                self.health_checks.fetch_add(1, Ordering::Relaxed);
                Ok(if faults.unhealthy {
                    full(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "unhealthy\n")
                } else {
                    full(StatusCode::OK, "text/plain", "ok\n")
                })
            }
            (&Method::GET, "/v1/models") if kind == crate::config::Provider::Anthropic => {
                Ok(json_resp(
                    StatusCode::OK,
                    &crate::tools::mock_anthropic::models(&self.opts.models),
                ))
            }
            (&Method::GET, "/v1/models") => Ok(self.models()),
            (&Method::POST, "/v1/messages") if kind == crate::config::Provider::Anthropic => {
                let running = Running::start(&self.in_flight);
                Ok(self.messages(req, &faults, running).await)
            }
            (&Method::POST, "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings") => {
                let running = Running::start(&self.in_flight);
                let mut resp = self.infer(req, &path, &faults, running).await;
                if kind != crate::config::Provider::Anthropic
                    && (self.opts.expect_key.is_some() || faults.ratelimit_remaining.is_some())
                {
                    provider::put_rate_limits(
                        &mut resp,
                        faults.ratelimit_remaining.unwrap_or(9999),
                    );
                }
                Ok(resp)
            }
            _ => Ok(openai_error(
                StatusCode::NOT_FOUND,
                &format!("unknown path {path}"),
                "unknown_url",
            )),
        }
    }

    async fn patch_faults(&self, req: Request<Incoming>) -> Response<MockBody> {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return openai_error(StatusCode::BAD_REQUEST, &e.to_string(), "invalid_request")
            }
        };
        let patch: FaultsPatch = match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid faults: {e}"),
                    "invalid_request",
                )
            }
        };
        let mut faults = self.faults.lock();
        match faults.apply(patch) {
            Ok(()) => json_resp(StatusCode::OK, &json!(*faults)),
            Err(e) => openai_error(StatusCode::BAD_REQUEST, &e, "invalid_request"),
        }
    }

    fn stats(&self) -> Response<MockBody> {
        json_resp(
            StatusCode::OK,
            &json!({
                "name": self.opts.name,
                "zone": self.opts.zone,
                "requests": self.requests.load(Ordering::Relaxed),
                "requests_by_tenant": *self.by_tenant.lock(),
                "health_checks": self.health_checks.load(Ordering::Relaxed),
                "in_flight": self.in_flight.load(Ordering::Relaxed),
                "provider": self.opts.provider.as_str(),
                "auth_failures": self.auth_failures.load(Ordering::Relaxed),
                "last_headers": *self.last_headers.lock(),
            }),
        )
    }

    fn models(&self) -> Response<MockBody> {
        let data: Vec<_> = self
            .opts
            .models
            .iter()
            .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "mock"}))
            .collect();
        json_resp(StatusCode::OK, &json!({"object": "list", "data": data}))
    }

    fn metrics(&self) -> Response<MockBody> {
        let f = self.faults.lock().clone();
        let running = self.in_flight.load(Ordering::Relaxed);
        let model = self.opts.models.first().map_or("mock", String::as_str);
        let mut text = String::new();
        for (name, value) in [
            ("vllm:num_requests_running", running as f64),
            ("vllm:num_requests_waiting", f.queue_depth as f64),
            ("vllm:gpu_cache_usage_perc", f.kv_cache_usage),
            ("vllm:kv_cache_usage_perc", f.kv_cache_usage),
        ] {
            text.push_str(&format!(
                "# TYPE {name} gauge\n{name}{{model_name=\"{model}\"}} {value}\n"
            ));
        }
        full(StatusCode::OK, "text/plain; version=0.0.4", text)
    }

    async fn infer(
        &self,
        req: Request<Incoming>,
        path: &str,
        faults: &Faults,
        running: Running,
    ) -> Response<MockBody> {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return openai_error(StatusCode::BAD_REQUEST, &e.to_string(), "invalid_request")
            }
        };
        let head: InferenceHead = match serde_json::from_slice(&body) {
            Ok(h) => h,
            Err(e) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid JSON: {e}"),
                    "invalid_request",
                )
            }
        };
        let model = head.model.clone().unwrap_or_default();
        if !self.opts.models.is_empty() && !self.opts.models.contains(&model) {
            return openai_error(
                StatusCode::NOT_FOUND,
                &format!("The model `{model}` does not exist."),
                "model_not_found",
            );
        }
        let applies = faults.only_models.is_empty() || faults.only_models.contains(&model);
        let clean = Faults::default();
        let faults = if applies { faults } else { &clean };
        if let Some(resp) = self.scripted_error(faults, &head) {
            return resp;
        }
        if faults.generation_ms > 0 {
            let _slot = match &self.generating {
                Some(slots) => slots.acquire().await.ok(),
                None => None,
            };
            tokio::time::sleep(Duration::from_millis(faults.generation_ms)).await;
        }
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let created = crate::clock::unix_s();
        if path == "/v1/embeddings" {
            return self.embeddings(&head, &model);
        }
        let chat = path == "/v1/chat/completions";
        let tokens = head
            .max_completion_tokens
            .or(head.max_tokens)
            .unwrap_or(8)
            .clamp(1, 64);
        if head.stream.unwrap_or(false) {
            let from = words_done(head.prefill(), &faults.answer_salt);
            let usage = head
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false);
            return self.stream(
                (chat, usage),
                &model,
                n,
                created,
                from..from + tokens,
                faults,
                running,
            );
        }
        let from = words_done(head.prefill(), &faults.answer_salt);
        let salt = &faults.answer_salt;
        let text: String = (from..from + tokens)
            .map(|i| format!("{salt}tok{i} "))
            .collect();
        let tool_call =
            provider::tool_call(head.tools.as_ref(), head.tool_choice.as_ref(), n, &text);
        let choice = if let (true, Some(call)) = (chat, tool_call) {
            json!({"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [call]}, "finish_reason": "tool_calls"})
        } else if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "stop"})
        };
        let body = json!({
            "id": format!("{}-mock-{n}", if chat { "chatcmpl" } else { "cmpl" }),
            "object": if chat { "chat.completion" } else { "text_completion" },
            "created": created,
            "model": model,
            "system_fingerprint": self.opts.name,
            "choices": [choice],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
        })
        .to_string();
        match faults.stream_cut_after {
            // A body cut half-way: the connection aborts before it is complete.
            Some(_) => {
                let bytes = Bytes::from(body);
                let half = bytes.slice(..bytes.len() / 2);
                let frames = stream::iter(vec![
                    Ok(Frame::data(half)),
                    Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "mock cut",
                    )),
                ]);
                let mut resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static("application/json"),
                );
                resp
            }
            None => full(StatusCode::OK, "application/json", body),
        }
    }

    /// The error faults ask for this request, if any: the next status of
    /// `status_sequence`, context length, a refused prefill, `error_rate`.
    fn scripted_error(&self, faults: &Faults, head: &InferenceHead) -> Option<Response<MockBody>> {
        let scripted = {
            let mut live = self.faults.lock();
            (!live.status_sequence.is_empty() && faults.status_sequence == live.status_sequence)
                .then(|| live.status_sequence.remove(0))
        };
        if faults.context_length_exceeded {
            return Some(openai_error(
                StatusCode::BAD_REQUEST,
                "This model's maximum context length is 4096 tokens. However, you requested more.",
                "context_length_exceeded",
            ));
        }
        let prefilled = head
            .messages
            .as_ref()
            .and_then(|m| m.last())
            .is_some_and(|m| m.role.as_deref() == Some("assistant"));
        if faults.reject_prefill && prefilled {
            return Some(openai_error(
                StatusCode::BAD_REQUEST,
                "the final message must be the user's: assistant prefill is not supported",
                "invalid_request",
            ));
        }
        let status = match scripted {
            Some(200) => return None,
            Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            None if faults.error_rate > 0.0 && fastrand::f64() < faults.error_rate => {
                StatusCode::from_u16(faults.error_status)
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
            None => return None,
        };
        let mut resp = openai_error(status, "mock fault: injected error", "mock_error");
        if let Some(s) = faults.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        Some(resp)
    }

    fn embeddings(&self, head: &InferenceHead, model: &str) -> Response<MockBody> {
        let inputs: Vec<String> = match &head.input {
            Some(serde_json::Value::String(s)) => vec![s.clone()],
            Some(serde_json::Value::Array(a)) => a.iter().map(|v| v.to_string()).collect(),
            _ => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    "`input` must be a string or an array",
                    "invalid_request",
                )
            }
        };
        let data: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let h = crate::dataplane::balance::hash_key(s.as_bytes());
                let v: Vec<f64> = (0..8)
                    .map(|k| ((h >> (k * 8)) & 0xff) as f64 / 255.0)
                    .collect();
                json!({"object": "embedding", "index": i, "embedding": v})
            })
            .collect();
        json_resp(
            StatusCode::OK,
            &json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": 8, "total_tokens": 8}}),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        (chat, usage): (bool, bool),
        model: &str,
        n: u64,
        created: u64,
        words: std::ops::Range<u64>,
        faults: &Faults,
        running: Running,
    ) -> Response<MockBody> {
        let id = format!("{}-mock-{n}", if chat { "chatcmpl" } else { "cmpl" });
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let salt = &faults.answer_salt;
        let last = words.end.saturating_sub(1);
        let count = words.end - words.start;
        let mut events: Vec<String> = words
            .map(|i| {
                let finish = if i == last { json!("stop") } else { json!(null) };
                let word = format!("{salt}tok{i} ");
                let choice = if chat {
                    json!({"index": 0, "delta": {"content": word}, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": word, "finish_reason": finish})
                };
                let chunk = json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]});
                format!("data: {chunk}\n\n")
            })
            .collect();
        if usage {
            let chunk = json!({"id": id, "object": object, "created": created, "model": model, "choices": [],
                "usage": {"prompt_tokens": 8, "completion_tokens": count, "total_tokens": 8 + count}});
            events.push(format!("data: {chunk}\n\n"));
        }
        events.push("data: [DONE]\n\n".to_owned());
        let e = crate::dataplane::error::error_body(
            "mock fault: generation failed",
            "server_error",
            "mock_error",
        );
        paced(events, faults, running, format!("data: {e}\n\n"))
    }
}

/// An event stream of `events`, paced and broken as `faults` say (the
/// `error_event` fault sends `error_event`); it owns `running`, so the
/// request counts until its last chunk.
fn paced(
    events: Vec<String>,
    faults: &Faults,
    running: Running,
    error_event: String,
) -> Response<MockBody> {
    let plan = StreamPlan::from(faults);
    // The stream owns `running`, so the request counts until its last chunk.
    let state = (events.into_iter(), 0u64, running);
    let frames = stream::unfold(state, move |(mut it, sent, running)| {
        let error_event = error_event.clone();
        async move {
            if sent == u64::MAX {
                return None;
            }
            match plan.at(sent) {
                Step::Send => {}
                Step::Stall => std::future::pending::<()>().await,
                Step::Malformed => {
                    let bad =
                        Bytes::from_static(b"data: {\"choices\": [{\"delta\": {\"content\n\n");
                    return Some((Ok(Frame::data(bad)), (it, sent + 1, running)));
                }
                Step::ErrorEvent => {
                    let event = Bytes::from(error_event.clone());
                    return Some((Ok(Frame::data(event)), (it, u64::MAX, running)));
                }
                Step::Cut { inside_event } => {
                    // Let the chunks already sent reach the wire first, as
                    // they would from a backend that crashes mid-generation.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if inside_event {
                        if let Some(next) = it.next() {
                            let next = Bytes::from(next);
                            let half = next.slice(..next.len() / 2);
                            return Some((Ok(Frame::data(half)), (it, u64::MAX - 1, running)));
                        }
                    }
                    let err = std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "mock stream cut",
                    );
                    // One error ends the body; hyper aborts the connection.
                    return Some((Err(err), (it, u64::MAX, running)));
                }
            }
            if sent == u64::MAX - 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let err =
                    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "mock stream cut");
                return Some((Err(err), (it, u64::MAX, running)));
            }
            let event = it.next()?;
            if sent > 0 && !plan.interval.is_zero() {
                tokio::time::sleep(plan.interval).await;
            }
            Some((Ok(Frame::data(Bytes::from(event))), (it, sent + 1, running)))
        }
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    resp
}

/// What a faulty stream does at each chunk.
#[derive(Clone, Copy)]
struct StreamPlan {
    interval: Duration,
    cut: Option<u64>,
    inside_event: bool,
    stall: Option<u64>,
    malformed: Option<u64>,
    error_event: Option<u64>,
}

enum Step {
    Send,
    Stall,
    Malformed,
    ErrorEvent,
    Cut { inside_event: bool },
}

impl From<&Faults> for StreamPlan {
    fn from(f: &Faults) -> Self {
        Self {
            interval: Duration::from_millis(f.stream_interval_ms),
            cut: f.stream_cut_after,
            inside_event: f.cut_inside_event,
            stall: f.stream_stall_after,
            malformed: f.malformed_chunk_after,
            error_event: f.error_event_after,
        }
    }
}

impl StreamPlan {
    /// The step before sending chunk number `sent` (0-based).
    fn at(&self, sent: u64) -> Step {
        if sent >= u64::MAX - 1 {
            return Step::Send;
        }
        let due = |n: Option<u64>| n == Some(sent);
        if due(self.stall) {
            Step::Stall
        } else if due(self.malformed) {
            Step::Malformed
        } else if due(self.error_event) {
            Step::ErrorEvent
        } else if self.cut.is_some_and(|c| sent >= c) {
            Step::Cut {
                inside_event: self.inside_event,
            }
        } else {
            Step::Send
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--capacity 1`: a second request starts its generation only when
    /// the first's has ended, so the later answer comes two whole
    /// generations after both were sent (a lower bound however slow the
    /// machine; without the limit it would be one).
    #[tokio::test]
    async fn a_mock_of_capacity_one_generates_one_request_at_a_time() {
        let mock = start(MockOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
            name: "m".into(),
            zone: None,
            models: Vec::new(),
            provider: Default::default(),
            expect_key: None,
            capacity: Some(1),
        })
        .await
        .unwrap();
        mock.set_faults(Faults {
            generation_ms: 1_500,
            ..Faults::default()
        });
        let url = format!("http://{}/v1/chat/completions", mock.addr);
        let ask = || {
            let (client, url) = (reqwest::Client::new(), url.clone());
            tokio::spawn(async move {
                let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
                let r = client.post(url).body(body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                tokio::time::Instant::now()
            })
        };
        let sent = tokio::time::Instant::now();
        let (a, b) = (ask(), ask());
        let last = a.await.unwrap().max(b.await.unwrap());
        let took = last - sent;
        assert!(
            took >= Duration::from_millis(2_900),
            "the later answer after {took:?}"
        );
    }
}
