//! Black-box tests of OpenTelemetry traces (`[telemetry]`): a small OTLP/HTTP
//! collector in the test decodes what a node exports; one trace per
//! request with GenAI attributes and a span per attempt, a client's
//! `traceparent` continued to the backend, a collector that is down costs
//! no request (its drops are counted), and sampling 0 exports nothing of
//! its own accord.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span};
use prost::Message;
use serde_json::json;
use support::*;

/// An OTLP/HTTP collector on 127.0.0.1:0: every span it was sent.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let seen = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let seen = Arc::clone(&seen);
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP export");
                    let mut seen = seen.lock().unwrap();
                    for rs in req.resource_spans {
                        for ss in rs.scope_spans {
                            seen.extend(ss.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Collector { addr, spans, task }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of the trace `trace_id` (hex).
    fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.spans()
            .into_iter()
            .filter(|s| hex(&s.trace_id) == trace_id)
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attribute's value as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    let v = span.attributes.iter().find(|kv| kv.key == key)?;
    match v.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        Any::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn is_error(span: &Span) -> bool {
    span.status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32)
}

fn telemetry(endpoint: &str, sampling: f64) -> String {
    format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\nsampling = {sampling}\n\n")
}

/// A collector, a mock backend of `MODEL` and a node that traces to the
/// collector at `sampling`.
async fn traced(sampling: f64) -> (Collector, Mock, NodeProcess) {
    let collector = Collector::start().await;
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        mock.backend_toml(&[MODEL]),
        telemetry(&format!("http://{}", collector.addr), sampling)
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    (collector, mock, gw)
}

/// The server spans seen so far.
fn servers(spans: &[Span]) -> Vec<Span> {
    spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .cloned()
        .collect()
}

async fn chat_ok(gw: &NodeProcess, traceparent: Option<&str>) -> reqwest::Response {
    let mut req = gw.chat().json(&chat_body(8, false));
    if let Some(tp) = traceparent {
        req = req
            .header("traceparent", tp)
            .header("tracestate", "vendor=abc");
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_per_request_with_genai_attributes_and_a_span_per_attempt() {
    let collector = Collector::start().await;
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        mock.backend_toml(&[MODEL]),
        telemetry(&format!("http://{}", collector.addr), 1.0)
    );
    let gw = NodeProcess::start_env_logging("az-a", &rest, &[("RUST_LOG", "info")]).await;

    chat_ok(&gw, None).await;
    // The only backend answers 503 once: retried on it after a backoff,
    // two attempts in one trace.
    mock.faults(json!({"status_sequence": [503]})).await;
    chat_ok(&gw, None).await;

    eventually(
        Duration::from_secs(30),
        "two traces, three attempts",
        || {
            let spans = collector.spans();
            async move { servers(&spans).len() == 2 && spans.len() == 5 }
        },
    )
    .await;
    let spans = collector.spans();
    let mut requests = servers(&spans);
    requests.sort_by_key(|s| s.start_time_unix_nano);
    assert_ne!(requests[0].trace_id, requests[1].trace_id, "a trace each");
    let port = mock.url.rsplit(':').next().unwrap().to_owned();
    for (request, attempts) in requests.iter().zip([1, 2]) {
        assert_eq!(request.name, "POST /v1/chat/completions");
        assert!(
            request.parent_span_id.is_empty(),
            "a root: no client parent"
        );
        assert!(!is_error(request), "{request:?}");
        for (key, want) in [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", MODEL),
            ("gen_ai.response.model", MODEL),
            ("gen_ai.provider.name", "openai"),
            ("zonegate.tenant", "deptA"),
            ("zonegate.zone", "az-a"),
            ("zonegate.backend", "m1"),
            ("zonegate.decision_version", "0"),
            ("zonegate.config_version", "0"),
            ("http.response.status_code", "200"),
        ] {
            assert_eq!(attr(request, key).as_deref(), Some(want), "{key}");
        }
        for key in [
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "zonegate.route",
        ] {
            assert!(attr(request, key).is_some(), "{key}: {request:?}");
        }
        let children: Vec<&Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == request.span_id)
            .collect();
        assert_eq!(children.len(), attempts, "{children:?}");
        for attempt in &children {
            assert_eq!(attempt.trace_id, request.trace_id);
            assert_eq!(attempt.kind, SpanKind::Client as i32);
            assert_eq!(attempt.name, format!("chat {MODEL}"));
            assert_eq!(
                attr(attempt, "server.address").as_deref(),
                Some("127.0.0.1")
            );
            assert_eq!(attr(attempt, "server.port"), Some(port.clone()));
            assert_eq!(attr(attempt, "zonegate.backend").as_deref(), Some("m1"));
        }
        if attempts == 2 {
            let failed: Vec<_> = children.iter().filter(|s| is_error(s)).collect();
            assert_eq!(failed.len(), 1, "the 503 attempt failed: {children:?}");
            assert_eq!(
                attr(failed[0], "http.response.status_code").as_deref(),
                Some("503")
            );
        }
    }
    // The access lines carry the trace ids.
    let log = std::fs::read_to_string(gw.dir.path().join("stderr.log")).unwrap();
    for request in &requests {
        let id = format!("trace_id={}", hex(&request.trace_id));
        assert!(
            log.lines()
                .any(|l| l.contains("zonegate::access") && l.contains(&id)),
            "no access line with {id}:\n{log}"
        );
    }
    gw.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_traceparent_is_continued_and_reaches_the_backend() {
    // Sampling 0: only the client's decision traces.
    let (collector, mock, gw) = traced(0.0).await;

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    chat_ok(&gw, Some(&format!("00-{trace}-{client_span}-01"))).await;
    let seen = mock.stats().await["last_headers"].clone();
    let sent = seen["traceparent"].as_str().unwrap().to_owned();
    assert_eq!(seen["tracestate"], "vendor=abc", "passed on as it came");
    eventually(
        Duration::from_secs(30),
        "the client's trace exported",
        || {
            let n = collector.trace(trace).len();
            async move { n == 2 }
        },
    )
    .await;
    let spans = collector.trace(trace);
    let request = &servers(&spans)[0];
    assert_eq!(
        hex(&request.parent_span_id),
        client_span,
        "continues the client's span"
    );
    let attempt = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    assert_eq!(attempt.parent_span_id, request.span_id);
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", hex(&attempt.span_id)),
        "the backend's parent is the attempt"
    );

    // Not sampled by the client: not traced, its header goes on unchanged.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let unsampled = format!("00-{other}-b7ad6b7169203331-00");
    chat_ok(&gw, Some(&unsampled)).await;
    let seen = mock.stats().await["last_headers"].clone();
    assert_eq!(seen["traceparent"], unsampled.as_str());
    // A malformed one is ignored, and passed on as it came.
    chat_ok(&gw, Some("00-zz-nonsense-01")).await;
    let seen = mock.stats().await["last_headers"].clone();
    assert_eq!(seen["traceparent"], "00-zz-nonsense-01");
    // A sampled request after them is exported; they never were.
    let last = "11111111111111111111111111111111";
    chat_ok(&gw, Some(&format!("00-{last}-2222222222222222-01"))).await;
    eventually(Duration::from_secs(30), "the last trace exported", || {
        let n = collector.trace(last).len();
        async move { n == 2 }
    })
    .await;
    assert!(collector.trace(other).is_empty());
    assert_eq!(collector.spans().len(), 4, "{:?}", collector.spans());
    gw.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_fails_no_request_and_its_drops_are_counted() {
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}queue_size = 4\n",
        mock.backend_toml(&[MODEL]),
        telemetry(&format!("http://{addr}"), 1.0)
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let started = std::time::Instant::now();
    for _ in 0..20 {
        chat_ok(&gw, None).await;
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "20 requests took {took:?}");
    eventually(
        Duration::from_secs(30),
        "spans counted as dropped",
        || async {
            let m = gw.metrics().await;
            // Two spans per request (the request's and its attempt's), each
            // dropped at the full queue or with its failed export.
            metric_sum(&m, "zonegate_trace_spans_dropped_total", &[]) >= 40.0
        },
    )
    .await;
    let m = gw.metrics().await;
    assert_eq!(
        metric_sum(&m, "zonegate_trace_spans_exported_total", &[]),
        0.0
    );
    gw.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_zero_exports_nothing_but_a_clients_sampled_trace() {
    let (collector, mock, gw) = traced(0.0).await;
    for _ in 0..10 {
        let resp = chat_ok(&gw, None).await;
        assert!(resp.headers().get("traceparent").is_none());
    }
    assert!(
        mock.stats().await["last_headers"]
            .get("traceparent")
            .is_none(),
        "no trace is made up for the backend"
    );
    // The pipeline works: a client's sampled trace arrives, alone.
    let trace = "22222222222222222222222222222222";
    chat_ok(&gw, Some(&format!("00-{trace}-3333333333333333-01"))).await;
    eventually(
        Duration::from_secs(30),
        "the client's trace exported",
        || {
            let n = collector.trace(trace).len();
            async move { n == 2 }
        },
    )
    .await;
    // Another batch window for anything else to arrive.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(collector.spans().len(), 2, "{:?}", collector.spans());
    let m = gw.metrics().await;
    assert_eq!(
        metric_sum(&m, "zonegate_trace_spans_exported_total", &[]),
        2.0
    );
    assert_eq!(
        metric_sum(&m, "zonegate_trace_spans_dropped_total", &[]),
        0.0
    );
    gw.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_and_a_shadow_copy_are_spans_of_the_request() {
    const NEW: &str = "qwen3-8b";
    let collector = Collector::start().await;
    let b1 = Mock::start("b1", "az-a", &[MODEL]).await;
    let b2 = Mock::start("b2", "az-a", &[MODEL]).await;
    let s1 = Mock::start("s1", "az-a", &[NEW]).await;
    // Both break after 40 chunks: the stream is continued on the other,
    // which has only the rest (20 tokens) to send.
    for m in [&b1, &b2] {
        m.faults(json!({"stream_cut_after": 40})).await;
    }
    let rest = format!(
        "{}{}{}[[shadows]]\nname = \"sh\"\nmodel = \"{MODEL}\"\nto = \"{NEW}\"\npercent = 100.0\n\n{}",
        b1.backend_toml(&[MODEL]),
        b2.backend_toml(&[MODEL]),
        s1.backend_toml(&[NEW]),
        telemetry(&format!("http://{}", collector.addr), 1.0)
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let resp = gw.chat().json(&chat_body(60, true)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("zonegate continued on"), "{text}");
    eventually(Duration::from_secs(30), "five spans", || {
        let n = collector.spans().len();
        async move { n >= 5 }
    })
    .await;
    let spans = collector.spans();
    let request = &servers(&spans)[0];
    let child_of = |parent: &Span| -> Vec<Span> {
        spans
            .iter()
            .filter(|s| s.parent_span_id == parent.span_id)
            .cloned()
            .collect()
    };
    let below = child_of(request);
    let continuation = below
        .iter()
        .find(|s| s.name == "continuation")
        .unwrap_or_else(|| panic!("no continuation span: {below:?}"));
    assert!(!is_error(continuation), "{continuation:?}");
    let resumed = child_of(continuation);
    assert_eq!(resumed.len(), 1, "its attempt: {resumed:?}");
    assert_eq!(resumed[0].kind, SpanKind::Client as i32);
    let shadow = below
        .iter()
        .find(|s| attr(s, "zonegate.shadow").as_deref() == Some("sh"))
        .unwrap_or_else(|| panic!("no shadow span: {below:?}"));
    assert_eq!(shadow.name, format!("chat {NEW}"));
    assert_eq!(attr(shadow, "zonegate.backend").as_deref(), Some("s1"));
    let attempts = below
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32 && attr(s, "zonegate.shadow").is_none())
        .count();
    assert_eq!(attempts, 1, "the first attempt: {below:?}");
    assert_eq!(spans.len(), 5, "{spans:?}");
    gw.kill().await;
}
