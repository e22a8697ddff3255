//! OpenTelemetry traces (`[telemetry]`): one server span per request,
//! children per attempt, continuation and shadow, exported over OTLP/HTTP
//! (protobuf) in batches by one task on the main runtime, never on the
//! request path. Spans wait in a bounded queue; a full queue or a failed
//! export drops them and counts them (`zonegate_trace_spans_dropped_total`):
//! a collector that is down or slow never slows or fails a request.
//!
//! Sampling is parent-based: a client's `traceparent` decides when it has
//! one (sampled: traced whatever the ratio; not sampled: not traced, its
//! header goes to the backend unchanged), else the trace id against
//! `sampling`. Without an endpoint no [`Tracer`] exists: the request path
//! tests one `Option`. With one and `sampling = 0`, a request without a
//! sampled `traceparent` costs one header lookup and builds nothing.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use tokio::sync::mpsc;

use crate::config::TelemetryConfig;

/// W3C Trace Context's headers.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// At most this many spans per export request.
const MAX_BATCH: usize = 512;
/// A batch waits this long for more spans after its first.
const BATCH_WINDOW: Duration = Duration::from_millis(500);
/// One export request, connect to answer, at most.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The attribute keys (OpenTelemetry's GenAI and HTTP semantic
/// conventions, then zonegate's own).
pub mod keys {
    pub const OPERATION: &str = "gen_ai.operation.name";
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const PROVIDER: &str = "gen_ai.provider.name";
    pub const SERVER_ADDRESS: &str = "server.address";
    pub const SERVER_PORT: &str = "server.port";
    pub const STATUS_CODE: &str = "http.response.status_code";
    pub const ERROR_TYPE: &str = "error.type";
    pub const TENANT: &str = "zonegate.tenant";
    pub const ZONE: &str = "zonegate.zone";
    pub const BACKEND: &str = "zonegate.backend";
    pub const ROUTE: &str = "zonegate.route";
    pub const RULE: &str = "zonegate.rule";
    pub const DECISION_VERSION: &str = "zonegate.decision_version";
    pub const CONFIG_VERSION: &str = "zonegate.config_version";
    pub const REQUEST_ID: &str = "zonegate.request_id";
    pub const OUTCOME: &str = "zonegate.outcome";
    pub const SHADOW: &str = "zonegate.shadow";
}

/// A node's tracer: present only with `[telemetry] otlp_endpoint`.
pub struct Tracer {
    tracer: Arc<SdkTracer>,
    /// `[telemetry] sampling`: the share of requests without a client
    /// decision that are traced.
    ratio: f64,
    /// Kept for the tracer's lifetime.
    _provider: SdkTracerProvider,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("ratio", &self.ratio)
            .finish()
    }
}

/// A sampled span that is being recorded. Cloning shares the span.
#[derive(Clone)]
pub struct Span {
    cx: Context,
    tracer: Arc<SdkTracer>,
}

impl Tracer {
    /// The tracer of `cfg` exporting through `client`, its export task
    /// spawned on the current runtime; `None` without an endpoint.
    pub fn start<C>(
        cfg: &TelemetryConfig,
        client: C,
        dropped: IntCounter,
        exported: IntCounter,
    ) -> Result<Option<Self>, String>
    where
        C: opentelemetry_http::HttpClient + 'static,
    {
        use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
        let Some(endpoint) = &cfg.otlp_endpoint else {
            return Ok(None);
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("{endpoint}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(client)
            .build()
            .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
        let resource = Resource::builder().with_service_name("zonegate").build();
        exporter.set_resource(&resource);
        let (tx, rx) = mpsc::channel(cfg.queue_size.max(1));
        tokio::spawn(export(rx, exporter, dropped.clone(), exported));
        Ok(Some(Self::build(
            cfg.sampling,
            Queue { tx, dropped },
            resource,
        )))
    }

    /// A tracer sampling `ratio` of the requests without a client
    /// decision, its finished spans going to `queue`.
    fn build(ratio: f64, queue: Queue, resource: Resource) -> Self {
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(resource)
            .build();
        Tracer {
            tracer: Arc::new(provider.tracer("zonegate")),
            ratio,
            _provider: provider,
        }
    }

    /// The server span of a request named `name`, continuing the client's
    /// trace (`header` looks up a request header); `None` when the request
    /// is not sampled.
    pub fn start_request<'h>(
        &self,
        header: impl Fn(&HeaderName) -> Option<&'h [u8]>,
        name: &'static str,
    ) -> Option<Span> {
        let parent = header(&TRACEPARENT).and_then(parse_traceparent);
        if self.ratio <= 0.0 && !parent.as_ref().is_some_and(|p| p.sampled) {
            return None;
        }
        let parent_cx = match parent {
            None => Context::new(),
            Some(p) => {
                let state = header(&TRACESTATE)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|s| TraceState::from_str(s).ok())
                    .unwrap_or_default();
                let flags = if p.sampled {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::NOT_SAMPLED
                };
                Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(p.trace_id),
                    SpanId::from_bytes(p.span_id),
                    flags,
                    true,
                    state,
                ))
            }
        };
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(&*self.tracer, &parent_cx);
        use opentelemetry::trace::Span as _;
        if !span.span_context().is_sampled() {
            return None;
        }
        Some(Span {
            cx: Context::new().with_span(span),
            tracer: Arc::clone(&self.tracer),
        })
    }
}

impl Span {
    /// A child span (`Client` for a call to a backend, `Internal` for a
    /// step of zonegate's own), started now with `attributes`.
    pub fn child(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&*self.tracer, &self.cx);
        Span {
            cx: Context::new().with_span(span),
            tracer: Arc::clone(&self.tracer),
        }
    }

    /// The trace's id, 32 lower-case hex digits when shown.
    pub fn trace_id(&self) -> TraceId {
        self.cx.span().span_context().trace_id()
    }

    /// This span as a backend's parent: its `traceparent` value
    /// (`00-<trace id>-<span id>-01`).
    pub fn traceparent(&self) -> [u8; 55] {
        let sc = self.cx.span().span_context().clone();
        let mut out = [0u8; 55];
        out[..3].copy_from_slice(b"00-");
        put_hex(&mut out[3..35], &sc.trace_id().to_bytes());
        out[35] = b'-';
        put_hex(&mut out[36..52], &sc.span_id().to_bytes());
        out[52] = b'-';
        put_hex(&mut out[53..55], &[sc.trace_flags().to_u8()]);
        out
    }

    pub fn set(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        self.cx.span().set_attributes(attributes);
    }

    /// Marks the span failed (`why`: an outcome or error code).
    pub fn fail(&self, why: impl Into<Cow<'static, str>>) {
        let why = why.into();
        self.cx
            .span()
            .set_attribute(KeyValue::new(keys::ERROR_TYPE, why.clone()));
        self.cx.span().set_status(Status::error(why));
    }

    /// Ends the span now (a second end is ignored; a span dropped without
    /// one ends when its last clone goes).
    pub fn end(&self) {
        self.cx.span().end();
    }
}

/// GenAI's `gen_ai.operation.name` of an OpenAI inference path.
pub fn operation(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

/// A count or version as an attribute (OTLP's integers are signed).
pub fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Lower-case hex of `bytes` into `out` (twice as long).
fn put_hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// A client's `traceparent`, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

/// Parses a `traceparent` value (W3C Trace Context §3.2): `version-trace
/// id-parent id-flags` in lower-case hex. Anything else is `None` (the
/// header is then ignored, as the standard asks): a wrong length, a bad
/// digit, version `ff`, an all-zero id; a later version's extra fields
/// are allowed after a `-`.
pub fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    let v = value.trim_ascii();
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex::<1>(&v[..2])?[0];
    match version {
        0xff => return None,
        0 if v.len() != 55 => return None,
        _ if v.len() > 55 && v[55] != b'-' => return None,
        _ => {}
    }
    let trace_id = hex::<16>(&v[3..35])?;
    let span_id = hex::<8>(&v[36..52])?;
    let flags = hex::<1>(&v[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// `N` bytes from `2N` lower-case hex digits.
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    fn digit(d: u8) -> Option<u8> {
        match d {
            b'0'..=b'9' => Some(d - b'0'),
            b'a'..=b'f' => Some(d - b'a' + 10),
            _ => None,
        }
    }
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// The span processor: a finished span goes into the bounded queue, or
/// is dropped and counted when it is full. Never blocks.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: IntCounter,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() && self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task: batches of up to [`MAX_BATCH`] spans, each sent once
/// (no retry: a failed batch is dropped and counted, and the next one is
/// tried as usual). Ends when the tracer is gone.
async fn export(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    dropped: IntCounter,
    exported: IntCounter,
) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::with_capacity(MAX_BATCH.min(rx.len() + 1));
        batch.push(first);
        let until = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(batch)).await;
        match sent {
            Ok(Ok(())) => {
                exported.inc_by(n);
                if failing {
                    tracing::info!("trace export to the collector works again");
                    failing = false;
                }
            }
            Ok(Err(e)) => {
                dropped.inc_by(n);
                if !failing {
                    tracing::warn!("trace export failed, spans dropped until it works: {e}");
                    failing = true;
                }
            }
            Err(_) => {
                dropped.inc_by(n);
                if !failing {
                    tracing::warn!("trace export timed out, spans dropped until it works");
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_is_read_and_anything_malformed_is_ignored_without_a_panic() {
        let p = parse_traceparent(GOOD.as_bytes()).expect("valid");
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert!(p.sampled);
        let unsampled = GOOD.replace("-01", "-00");
        assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().sampled);
        // A later version may carry more fields after a dash.
        let later = format!("{}-extra", GOOD.replacen("00-", "01-", 1));
        assert!(parse_traceparent(later.as_bytes()).is_some());
        for bad in [
            "",
            "00",
            &GOOD[..54],
            &format!("{GOOD}0"),
            &format!("{GOOD}-extra"),
            &GOOD.replacen("00-", "ff-", 1),
            &GOOD.replace("4bf9", "4BF9"),
            &GOOD.replace("4bf9", "4bz9"),
            &GOOD.replace("00f0", "+0f0"),
            &GOOD.replace('-', "_"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            &format!("{}x{}", &GOOD[..55], "-"),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
        // Bytes that are not text, of every length around the real one.
        for n in 0..70 {
            let _ = parse_traceparent(&vec![0xe9; n]);
            let _ = parse_traceparent(&vec![b'-'; n]);
        }
        assert!(parse_traceparent(format!(" {GOOD} ").as_bytes()).is_some());
    }

    fn tracer(ratio: f64, queue: usize) -> (Tracer, mpsc::Receiver<SpanData>, IntCounter) {
        let (tx, rx) = mpsc::channel(queue);
        let dropped = IntCounter::new("dropped", "dropped").unwrap();
        let q = Queue {
            tx,
            dropped: dropped.clone(),
        };
        (
            Tracer::build(ratio, q, Resource::builder_empty().build()),
            rx,
            dropped,
        )
    }

    fn headers(tp: &'static str) -> impl Fn(&HeaderName) -> Option<&'static [u8]> {
        move |n: &HeaderName| (*n == TRACEPARENT).then_some(tp.as_bytes())
    }

    #[test]
    fn sampling_is_parent_based_and_a_clients_sampled_trace_is_continued() {
        let (t, mut rx, _) = tracer(0.0, 16);
        assert!(t
            .start_request(|_| None, "POST /v1/chat/completions")
            .is_none());
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(t.start_request(headers(unsampled), "x").is_none());
        let span = t
            .start_request(headers(GOOD), "x")
            .expect("sampled by the client");
        assert_eq!(span.trace_id().to_string(), GOOD[3..35]);
        let attempt = span.child("attempt", SpanKind::Client, vec![]);
        let tp = attempt.traceparent();
        let tp = std::str::from_utf8(&tp).unwrap();
        assert_eq!(
            parse_traceparent(tp.as_bytes()).unwrap().trace_id,
            parse_traceparent(GOOD.as_bytes()).unwrap().trace_id
        );
        assert!(tp.starts_with(&GOOD[..36]) && tp.ends_with("-01"), "{tp}");
        assert_ne!(&tp[36..52], &GOOD[36..52], "the attempt's own span id");
        attempt.end();
        span.end();
        let first = rx.try_recv().expect("the attempt ended first");
        let second = rx.try_recv().expect("then the request");
        assert_eq!(first.parent_span_id, second.span_context.span_id());
        assert_eq!(second.parent_span_id.to_string(), GOOD[36..52]);
        assert!(second.parent_span_is_remote);

        // Ratio 1: every request without a decision; an unsampled client
        // parent is still honoured.
        let (t, _rx, _) = tracer(1.0, 16);
        assert!(t.start_request(|_| None, "x").is_some());
        assert!(t.start_request(headers(unsampled), "x").is_none());
    }

    #[test]
    fn a_full_queue_drops_and_counts_spans_without_blocking() {
        let (t, _rx, dropped) = tracer(1.0, 2);
        for _ in 0..5 {
            t.start_request(|_| None, "x").unwrap().end();
        }
        assert_eq!(dropped.get(), 3);
    }

    #[test]
    fn hex_digits_round_trip() {
        let mut out = [0u8; 4];
        put_hex(&mut out, &[0x0a, 0xf1]);
        assert_eq!(&out, b"0af1");
        assert_eq!(hex::<2>(b"0af1"), Some([0x0a, 0xf1]));
        assert_eq!(hex::<2>(b"0af"), None);
    }
}
