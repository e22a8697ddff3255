//! One attempt on one backend over a pooled keep-alive connection
//! (`upstream`).
//!
//! An attempt is "committed" only once the backend's first body byte has
//! arrived: until then any failure can be retried elsewhere. What follows
//! the first byte is the relay's (`relay`).

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::StatusCode;
use http_body::Body as _;
use http_body_util::{BodyExt, Limited};
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use tokio::time::Instant;
use zonegate_net::http1::{list_items, name_is, put_header, HeadLines};

use crate::dataplane::backend::Backend;
use crate::dataplane::connect::source_chain;
use crate::dataplane::provider;
use crate::dataplane::request::ClientHeaders;
use crate::dataplane::upstream::{self, SendError, Target, UpstreamBody};
use crate::telemetry::traces::{self, keys};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an attempt failed before its first byte. The retry loop asks the
/// error, not its message, whether another backend may help.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("connect failed: {0}")]
    Connect(String),
    /// The connect was refused: nothing listens at the address. Unlike a
    /// connect timeout this is certain, so the backend leaves every pick
    /// until a probe or a half-open trial reaches it again.
    #[error("connect refused: {0}")]
    Refused(String),
    #[error("connection failed before the first byte: {0}")]
    Reset(String),
    #[error("backend answered {0}")]
    Status(StatusCode),
    /// A stream's first token did not come in time.
    #[error("no first token within {0:?}")]
    TtftTimeout(Duration),
    /// A non-streaming generation outlasted `generation_timeout`: long
    /// work, not a broken backend.
    #[error("no complete answer within {0:?}")]
    GenerationTimeout(Duration),
    /// The request's overall deadline passed during the attempt.
    #[error("the request's deadline passed")]
    Deadline,
    /// 429: busy, not broken.
    #[error("backend busy (429), retry after {0:?}")]
    Busy(Option<Duration>),
    /// 400 `context_length_exceeded`: the request's fault for this model;
    /// the body is kept for the client in case no larger model can take it.
    #[error("the prompt exceeds the model's context length")]
    ContextLength(Bytes),
    /// A provider refused the backend's credential (401/403): the
    /// backend's configuration fault, ejected at once (`credentials`),
    /// never the zone's health nor worth a retry on it.
    #[error("the provider refused the backend's credential ({0})")]
    Credentials(StatusCode),
    /// A provider's answer that cannot be translated for the client.
    #[error("the provider's answer: {0}")]
    BadAnswer(String),
}

impl AttemptError {
    /// Whether the failure says the backend is unhealthy: connect errors,
    /// resets, 5xx and a stream's time-to-first-token timeout. A 429, a
    /// long generation, the request's own deadline or its context length
    /// say nothing about the backend.
    pub fn counts_against_health(&self) -> bool {
        matches!(
            self,
            AttemptError::Connect(_)
                | AttemptError::Refused(_)
                | AttemptError::Reset(_)
                | AttemptError::Status(_)
                | AttemptError::TtftTimeout(_)
                | AttemptError::BadAnswer(_)
        )
    }

    /// Whether retrying the same backend after a short backoff may help
    /// (never for timeouts: a backend that let the first token's time run
    /// out gets no second wait; the time is better spent on the next
    /// candidate).
    pub fn worth_same_backend_retry(&self) -> bool {
        matches!(
            self,
            AttemptError::Connect(_)
                | AttemptError::Refused(_)
                | AttemptError::Reset(_)
                | AttemptError::Status(_)
        )
    }

    /// Whether the backend's response head arrived: it is reachable,
    /// whatever it answered.
    pub fn backend_answered(&self) -> bool {
        matches!(
            self,
            AttemptError::Status(_)
                | AttemptError::Busy(_)
                | AttemptError::ContextLength(_)
                | AttemptError::Credentials(_)
                | AttemptError::BadAnswer(_)
        )
    }

    /// The `outcome` label of attempt metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            AttemptError::Connect(_) | AttemptError::Refused(_) => "connect_error",
            AttemptError::Reset(_) => "reset",
            AttemptError::Status(_) => "status_5xx",
            AttemptError::TtftTimeout(_) => "ttft_timeout",
            AttemptError::GenerationTimeout(_) => "generation_timeout",
            AttemptError::Deadline => "deadline",
            AttemptError::Busy(_) => "busy",
            AttemptError::ContextLength(_) => "context_length",
            AttemptError::Credentials(_) => "credentials",
            AttemptError::BadAnswer(_) => "bad_answer",
        }
    }
}

/// GenAI's `gen_ai.provider.name` of a backend.
pub fn provider_name(backend: &Backend) -> &'static str {
    match backend.provider.as_ref().map(|p| p.kind) {
        Some(crate::config::Provider::Azure) => "azure.ai.openai",
        Some(crate::config::Provider::Anthropic) => "anthropic",
        // OpenAI's wire format: OpenAI, vLLM, TGI, SGLang…
        Some(crate::config::Provider::Openai) | None => "openai",
    }
}

/// The span of a call to `backend` for `model` (GenAI's client span,
/// `{operation} {model}`), child of `parent`: an attempt's, a shadow copy's.
pub fn client_span(
    parent: &traces::Span,
    path: &str,
    model: &str,
    backend: &Backend,
) -> traces::Span {
    let operation = traces::operation(path);
    let port =
        backend
            .authority
            .port_u16()
            .unwrap_or(if backend.scheme == http::uri::Scheme::HTTPS {
                443
            } else {
                80
            });
    parent.child(
        format!("{operation} {model}"),
        SpanKind::Client,
        vec![
            KeyValue::new(keys::OPERATION, operation),
            KeyValue::new(keys::REQUEST_MODEL, model.to_owned()),
            KeyValue::new(keys::PROVIDER, provider_name(backend)),
            KeyValue::new(keys::SERVER_ADDRESS, backend.authority.host().to_owned()),
            KeyValue::new(keys::SERVER_PORT, i64::from(port)),
            KeyValue::new(keys::BACKEND, backend.name.clone()),
            KeyValue::new(keys::ZONE, backend.zone.as_str().to_owned()),
        ],
    )
}

/// The limits of one attempt.
#[derive(Clone, Copy, Debug)]
pub struct AttemptLimits {
    /// Time to the first body byte: the model's `ttft_timeout` for streams,
    /// its `generation_timeout` otherwise.
    pub first_byte: Duration,
    pub stream: bool,
    /// The request's overall deadline.
    pub deadline: Instant,
    /// Read a 400's body to tell `context_length_exceeded` apart.
    pub detect_context_length: bool,
    /// When the attempt began (its pick's reading of the clock): the
    /// first-byte limit runs from here.
    pub started: std::time::Instant,
}

/// A backend response whose first body chunk has arrived.
pub struct Committed {
    pub status: StatusCode,
    /// The headers passed on to the client, as the backend wrote them
    /// (without hop-by-hop headers, length and date: see `upstream`).
    pub lines: HeadLines,
    pub first: Option<Bytes>,
    /// The rest of the body; `None` when `first` was all of it.
    pub rest: Option<UpstreamBody>,
    /// The upstream `Content-Length`, if any.
    pub content_length: Option<u64>,
    pub first_byte: Duration,
    /// When the first body chunk was in (`first_byte` after the attempt's
    /// start): the respond stage's time, without reading the clock again.
    pub arrived: std::time::Instant,
    /// A provider said its allowance is used up: cool the backend this
    /// long (`provider::exhausted_for`). `None` for a plain backend.
    pub cool_for: Option<Duration>,
    /// The answer's usage when whoever made its body knew it (a
    /// translated provider answer): not read from the body again. `None`:
    /// the body says it, if anything does.
    pub usage: Option<crate::dataplane::sse::Usage>,
}

/// zonegate's own headers, parsed once (a name given as `&str` is parsed
/// and validated at every insert).
pub mod names {
    use http::header::HeaderName;

    pub const BACKEND: HeaderName = HeaderName::from_static("x-zonegate-backend");
    pub const ZONE: HeaderName = HeaderName::from_static("x-zonegate-zone");
    pub const DECISION_VERSION: HeaderName = HeaderName::from_static("x-zonegate-decision-version");
    pub const CONFIG_VERSION: HeaderName = HeaderName::from_static("x-zonegate-config-version");
    pub const ROUTE: HeaderName = HeaderName::from_static("x-zonegate-route");
    pub const MODEL: HeaderName = HeaderName::from_static("x-zonegate-model");
    pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    pub const PIN: HeaderName = HeaderName::from_static(crate::dataplane::affinity::PIN_HEADER);
}

/// Request headers that describe this hop only, carry the client's
/// gateway credentials, or are the gateway's to write (`Host`,
/// `Content-Length`, `X-Request-Id`, `Accept-Encoding`: see
/// `upstream::wire::encode_request`): never passed on to the backend;
/// nor is any `x-zonegate-*`, which are zonegate's (a client's are read
/// here, never a backend's to trust).
const DROP_REQUEST: &[&str] = &[
    "connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "keep-alive",
    "host",
    "authorization",
    "content-length",
    "x-request-id",
    "accept-encoding",
];

/// Whether a client header goes to the backend (see `DROP_REQUEST`).
#[inline]
pub fn forwarded(name: &[u8]) -> bool {
    const OURS: &[u8] = b"x-zonegate-";
    // The lengths first, in place: a name is compared with the few of its
    // length only (a call per dropped name cost ~30 instructions a header).
    !(DROP_REQUEST
        .iter()
        .any(|d| d.len() == name.len() && name_is(name, d.as_bytes()))
        || name.get(..OURS.len()).is_some_and(|p| name_is(p, OURS)))
}

/// Writes the client's headers for the backend, as lines of its request's
/// head: those [`forwarded`], less any its `Connection` header names
/// (hop-by-hop too, RFC 9110 §7.6.1). Names and values are the ones the
/// client sent (httparse or hyper accepted them: no line break inside).
pub fn put_backend_headers(out: &mut Vec<u8>, client: &ClientHeaders) {
    put_backend_headers_where(out, client, |_| true);
}

/// [`put_backend_headers`], less the names `keep` refuses (a provider's
/// own credential headers: `provider::forwarded`).
#[inline]
pub fn put_backend_headers_where(
    out: &mut Vec<u8>,
    client: &ClientHeaders,
    keep: impl Fn(&[u8]) -> bool,
) {
    // The names `Connection` lists, lower case, but its options: `close`
    // is no header's name (RFC 9110 reserves it) and `keep-alive` is
    // dropped anyway, so most clients' lists build no set. A set: linear
    // in the list, however long a hostile client makes it.
    let mut listed: Option<HashSet<Vec<u8>>> = None;
    client.for_each(|name, value| {
        if name_is(name, b"connection") {
            for token in list_items(value) {
                if !(name_is(token, b"keep-alive") || name_is(token, b"close")) {
                    listed
                        .get_or_insert_with(HashSet::new)
                        .insert(token.to_ascii_lowercase());
                }
            }
        }
    });
    client.for_each(|name, value| {
        let named = listed
            .as_ref()
            .is_some_and(|l| l.contains(&name.to_ascii_lowercase()));
        if forwarded(name) && !named && keep(name) {
            put_header(out, name, value);
        }
    });
}

/// The longest a backend's `Retry-After` cools it: a backend asking for
/// more (`1e308`, a day) is taken at a minute's word, and probes and
/// half-open trials judge it after that.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

fn retry_after(lines: &HeadLines) -> Option<Duration> {
    parse_retry_after(lines.get(b"retry-after")?)
}

/// A `Retry-After` in seconds (fractions accepted), at most
/// [`MAX_RETRY_AFTER`]; `None` for anything else (a date, a negative
/// number, NaN, infinity, text), which the caller treats as no hint.
pub fn parse_retry_after(value: &[u8]) -> Option<Duration> {
    let secs = std::str::from_utf8(value)
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()?;
    if !(secs.is_finite() && secs >= 0.0) {
        return None;
    }
    // Capped before the conversion, which panics on values past u64 seconds.
    Some(Duration::from_secs_f64(
        secs.min(MAX_RETRY_AFTER.as_secs_f64()),
    ))
}

/// The largest 400 body read to look for `context_length_exceeded`.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Sends one request to `target` and waits, within its limits, for the
/// response head and its first body chunk. `path` is the request's
/// origin-form target; the client's `headers` go as
/// [`put_backend_headers`] writes them, followed by `host` and
/// `request_id`. A provider backend's request and answer go through its
/// `call` instead (`provider`: path, body, credential, the answer's
/// format and meaning); a plain backend's pass through untouched.
/// `traceparent`: a traced attempt's own, in place of the client's (an
/// untraced one passes the client's on as it came).
#[allow(clippy::too_many_arguments)]
pub async fn attempt(
    target: Target<'_>,
    path: &str,
    headers: &ClientHeaders,
    host: Option<&HeaderValue>,
    request_id: &[u8],
    body: Bytes,
    limits: AttemptLimits,
    call: Option<&provider::Call<'_>>,
    traceparent: Option<&[u8]>,
) -> Result<Committed, AttemptError> {
    let started = limits.started;
    let head = |out: &mut Vec<u8>| {
        let not_traceparent = |name: &[u8]| !name_is(name, b"traceparent");
        match (call, traceparent) {
            (None, None) => put_backend_headers(out, headers),
            (None, Some(_)) => put_backend_headers_where(out, headers, not_traceparent),
            (Some(c), _) => {
                match traceparent {
                    None => provider::put_client_headers(out, headers),
                    Some(_) => put_backend_headers_where(out, headers, |name| {
                        provider::forwarded(name) && not_traceparent(name)
                    }),
                }
                provider::put_credentials(out, c.cfg, crate::clock::now_ms);
            }
        }
        if let Some(tp) = traceparent {
            put_header(out, b"traceparent", tp);
        }
        if let Some(host) = host {
            put_header(out, b"host", host.as_bytes());
        }
        put_header(out, b"x-request-id", request_id);
    };
    let (path, body): (&str, &[u8]) = match call {
        None => (path, &body),
        Some(c) => (c.path.as_ref(), &c.body),
    };
    let exchange = async {
        let resp = upstream::send(target, path, head, body)
            .await
            .map_err(|e| match e {
                SendError::Connect(e) => AttemptError::Connect(e),
                SendError::Refused(e) => AttemptError::Refused(e),
                SendError::Reset(e) => AttemptError::Reset(e),
            })?;
        if let Some(call) = call {
            return Box::pin(provider_answer(call, resp, limits)).await;
        }
        let upstream::BackendResponse {
            status,
            lines,
            body: rest,
        } = resp;
        if status == StatusCode::TOO_MANY_REQUESTS {
            let busy = AttemptError::Busy(retry_after(&lines));
            rest.drain_in_background();
            return Err(busy);
        }
        if status.is_server_error() {
            rest.drain_in_background();
            return Err(AttemptError::Status(status));
        }
        if status == StatusCode::BAD_REQUEST && limits.detect_context_length {
            return Box::pin(whole_error_body(lines, rest, started)).await;
        }
        first_chunk(status, lines, rest, started, None).await
    };
    // From the pick's reading of the clock.
    let timeout_at = (Instant::from_std(started) + limits.first_byte).min(limits.deadline);
    match tokio::time::timeout_at(timeout_at, exchange).await {
        Ok(result) => result,
        Err(_) if timeout_at == limits.deadline => Err(AttemptError::Deadline),
        Err(_) if limits.stream => Err(AttemptError::TtftTimeout(limits.first_byte)),
        Err(_) => Err(AttemptError::GenerationTimeout(limits.first_byte)),
    }
}

/// Waits for the answer's first body chunk: the attempt commits.
async fn first_chunk(
    status: StatusCode,
    lines: HeadLines,
    mut rest: UpstreamBody,
    started: std::time::Instant,
    cool_for: Option<Duration>,
) -> Result<Committed, AttemptError> {
    // Read before the first frame is taken from it.
    let content_length = rest.size_hint().exact();
    let first = loop {
        match rest.frame().await {
            None => break None,
            Some(Err(e)) => return Err(AttemptError::Reset(source_chain(&e))),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => break Some(data),
                // Empty chunks and trailers before any data: keep waiting.
                _ => continue,
            },
        }
    };
    let arrived = std::time::Instant::now();
    Ok(Committed {
        status,
        lines,
        first,
        rest: Some(rest),
        content_length,
        first_byte: arrived.saturating_duration_since(started),
        arrived,
        cool_for,
        usage: None,
    })
}

/// A whole answer made here (a translated one, or the client's 400),
/// committed as if the backend had sent it so.
fn whole(
    status: StatusCode,
    lines: HeadLines,
    body: Bytes,
    started: std::time::Instant,
    cool_for: Option<Duration>,
) -> Committed {
    let arrived = std::time::Instant::now();
    Committed {
        status,
        content_length: Some(body.len() as u64),
        lines,
        first: (!body.is_empty()).then_some(body),
        rest: None,
        first_byte: arrived.saturating_duration_since(started),
        arrived,
        cool_for,
        usage: None,
    }
}

/// The client's 400 for a request a provider cannot take as it is
/// (`provider::Refused`), answered without sending it.
pub fn refused(body: Bytes, started: std::time::Instant) -> Committed {
    whole(StatusCode::BAD_REQUEST, json_lines(), body, started, None)
}

fn json_lines() -> HeadLines {
    HeadLines {
        lines: Bytes::from_static(b"content-type: application/json\r\n"),
        ..HeadLines::default()
    }
}

/// A provider's answer as the provider means it (see `provider`).
async fn provider_answer(
    call: &provider::Call<'_>,
    resp: upstream::BackendResponse,
    limits: AttemptLimits,
) -> Result<Committed, AttemptError> {
    let upstream::BackendResponse {
        status,
        lines,
        body: mut rest,
    } = resp;
    let started = limits.started;
    if provider::is_credentials(status) {
        rest.drain_in_background();
        return Err(AttemptError::Credentials(status));
    }
    if status == StatusCode::TOO_MANY_REQUESTS || provider::is_overloaded(status) {
        let busy = AttemptError::Busy(provider::busy_for(&lines, std::time::SystemTime::now()));
        rest.drain_in_background();
        return Err(busy);
    }
    if status.is_server_error() {
        rest.drain_in_background();
        return Err(AttemptError::Status(status));
    }
    let cool_for = provider::exhausted_for(&lines, std::time::SystemTime::now);
    let provider::Answer::Anthropic {
        client_model,
        stream,
        include_usage,
    } = &call.answer
    else {
        if status == StatusCode::BAD_REQUEST && limits.detect_context_length {
            return Box::pin(whole_error_body(lines, rest, started)).await;
        }
        return first_chunk(status, lines, rest, started, cool_for).await;
    };
    if status.is_success() && *stream && lines.event_stream {
        rest.translate(Box::new(provider::anthropic::Events::new(
            client_model,
            *include_usage,
        )));
        return first_chunk(status, lines, rest, started, cool_for).await;
    }
    let body = read_answer(rest)
        .await
        .map_err(|e| AttemptError::Reset(format!("reading the provider's answer: {e}")))?;
    if status.is_success() {
        let (out, usage) =
            provider::anthropic::answer(&body, client_model).map_err(AttemptError::BadAnswer)?;
        let mut answer = whole(status, json_lines(), out, started, cool_for);
        answer.usage = usage;
        return Ok(answer);
    }
    let (code, out) = provider::anthropic::error(status.as_u16(), &body);
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
    if code == StatusCode::BAD_REQUEST
        && limits.detect_context_length
        && String::from_utf8_lossy(&body).contains("prompt is too long")
    {
        return Err(AttemptError::ContextLength(out));
    }
    Ok(whole(code, json_lines(), out, started, cool_for))
}

/// The largest whole provider answer read for translation.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// A provider's answer read whole, at most [`MAX_ANSWER`] bytes: a body
/// that came in one chunk (the usual small answer) is that chunk, with no
/// buffer list or copy (`Limited` and `Collect` cost ~1.5k instructions
/// on an answer of a few hundred bytes).
async fn read_answer(mut rest: UpstreamBody) -> Result<Bytes, String> {
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    while let Some(frame) = rest.frame().await {
        let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() else {
            continue;
        };
        if first.is_none() && joined.is_empty() {
            first = Some(data);
        } else {
            if let Some(f) = first.take() {
                joined.extend_from_slice(&f);
            }
            joined.extend_from_slice(&data);
        }
        if first.as_ref().map_or(joined.len(), Bytes::len) > MAX_ANSWER {
            return Err(format!("the answer is over {MAX_ANSWER} bytes"));
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

/// A 400 read whole: `context_length_exceeded` (OpenAI's code, or vLLM's
/// "maximum context length" message) becomes an error the retry loop can
/// act on; any other 400 is committed as the backend sent it.
async fn whole_error_body(
    lines: HeadLines,
    rest: UpstreamBody,
    started: std::time::Instant,
) -> Result<Committed, AttemptError> {
    {
        let body = Limited::new(rest, MAX_ERROR_BODY)
            .collect()
            .await
            .map_err(|e| AttemptError::Reset(format!("reading a 400 body: {e}")))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        if text.contains("context_length_exceeded") || text.contains("maximum context length") {
            return Err(AttemptError::ContextLength(body));
        }
        Ok(whole(StatusCode::BAD_REQUEST, lines, body, started, None))
    }
}

/// A header value made once (when routes are built) and cloned per
/// response without an allocation; `None` for text that is not valid in a
/// header (config names are validated, so only in theory).
pub fn shared_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::copy_from_slice(text.as_bytes())).ok()
}

/// The two version headers every answer carries (`set_version`).
#[derive(Clone, Copy)]
pub enum Version {
    Decision,
    Config,
}

/// Sets `x-zonegate-decision-version` or `x-zonegate-config-version` (an
/// error's answer; a proxied answer writes them as lines, in `respond`).
pub fn set_version(headers: &mut HeaderMap, which: Version, version: u64) {
    let name = match which {
        Version::Decision => names::DECISION_VERSION,
        Version::Config => names::CONFIG_VERSION,
    };
    headers.insert(name, HeaderValue::from(version));
}

#[cfg(test)]
mod tests {
    use super::*;
    use zonegate_net::http1::HeadFields;

    /// The head's fields and the same headers as a map (what hyper's paths
    /// hand over) forward the same lines, but for the names' case.
    fn forwarded_both_ways(head: &'static str) -> [String; 2] {
        crate::dataplane::request::headers::tests::both(head).map(|h| {
            let mut out = Vec::new();
            put_backend_headers(&mut out, &h);
            String::from_utf8(out).expect("text")
        })
    }

    #[test]
    fn hop_by_hop_and_credentials_are_not_forwarded() {
        let head = "Authorization: Bearer secret\r\nConnection: keep-alive, x-private\r\n\
                    x-private: 1\r\nKeep-Alive: timeout=5\r\nx-session-id: s1\r\n\
                    Content-Type: application/json\r\nconnection:  , X-Other ,,bad name\r\n\
                    x-other: 2\r\nProxy-Authorization: Basic x\r\nTE: trailers\r\n\
                    Upgrade: h2c\r\nTrailer: x-t\r\n";
        let [lines, map] = forwarded_both_ways(head);
        // `x-other` is named by a second `Connection` line, in another case.
        assert_eq!(
            lines,
            "x-session-id: s1\r\nContent-Type: application/json\r\n"
        );
        assert_eq!(map, lines.replace("Content-Type", "content-type"));
    }

    #[test]
    fn the_gateways_own_and_the_framing_headers_are_not_forwarded() {
        let head = "Host: gateway.example\r\nContent-Length: 12\r\n\
                    Transfer-Encoding: chunked\r\nX-Request-Id: chosen-by-the-client\r\n\
                    Accept-Encoding: gzip, deflate\r\nX-Zonegate-Backend: forged\r\n\
                    x-zonegate-min-tier: 2\r\nx-zonegatex: 1\r\n\
                    x-session-id: s1\r\ncontent-type: application/json\r\n";
        for sent in forwarded_both_ways(head) {
            assert_eq!(
                sent,
                "x-zonegatex: 1\r\nx-session-id: s1\r\ncontent-type: application/json\r\n"
            );
        }
    }

    #[test]
    fn every_name_a_long_connection_header_lists_is_left_out() {
        // A set of the 20,000 names, looked up once per header.
        let listed: Vec<String> = (0..20_000).map(|i| format!("x-h{i}")).collect();
        let head = format!(
            "Connection: {}\r\nx-h7: 1\r\nx-kept: 2\r\n",
            listed.join(",")
        );
        let fields = HeadFields::parse(Bytes::from(head)).expect("a head");
        let mut sent = Vec::new();
        put_backend_headers(&mut sent, &ClientHeaders::Fields(fields));
        assert_eq!(sent, b"x-kept: 2\r\n");
    }

    #[test]
    fn a_version_header_follows_the_version_it_is_given() {
        let mut h = HeaderMap::new();
        for (decision, config) in [(3, 7), (3, 7), (4, 7), (4, 8), (3, 7)] {
            set_version(&mut h, Version::Decision, decision);
            set_version(&mut h, Version::Config, config);
            assert_eq!(h[names::DECISION_VERSION], decision.to_string());
            assert_eq!(h[names::CONFIG_VERSION], config.to_string());
        }
    }

    #[test]
    fn retry_after_parses_seconds() {
        let lines = |text: &'static str| HeadLines {
            lines: Bytes::from_static(text.as_bytes()),
            ..HeadLines::default()
        };
        assert_eq!(retry_after(&lines("x-a: 1\r\n")), None);
        let two = Some(Duration::from_secs(2));
        assert_eq!(retry_after(&lines("Retry-After: 2\r\n")), two);
        assert_eq!(retry_after(&lines("retry-after:  2 \r\n")), two);
        assert_eq!(retry_after(&lines("retry-after: soon\r\n")), None);
        assert_eq!(retry_after(&lines("retry-after: -1\r\n")), None);
    }

    #[test]
    fn retry_after_is_capped_at_a_minute_and_never_panics() {
        let cap = Some(MAX_RETRY_AFTER);
        assert_eq!(MAX_RETRY_AFTER, Duration::from_secs(60));
        for (value, want) in [
            ("1e308", cap),
            ("3600", cap),
            ("60.5", cap),
            ("18446744073709551616", cap),
            ("1e400", None), // infinity
            ("inf", None),
            ("-inf", None),
            ("NaN", None),
            ("-5", None),
            ("-0", Some(Duration::ZERO)),
            ("0.25", Some(Duration::from_millis(250))),
            ("59", Some(Duration::from_secs(59))),
            (" 2 ", Some(Duration::from_secs(2))),
            ("Wed, 21 Oct 2015 07:28:00 GMT", None),
            ("", None),
        ] {
            assert_eq!(parse_retry_after(value.as_bytes()), want, "{value:?}");
        }
        assert_eq!(parse_retry_after(b"\xff\xfe"), None, "not UTF-8");
    }

    #[test]
    fn only_signs_of_a_broken_backend_count_against_its_health() {
        let s = Duration::from_secs(1);
        assert!(!AttemptError::Busy(None).counts_against_health());
        assert!(!AttemptError::GenerationTimeout(s).counts_against_health());
        assert!(!AttemptError::Deadline.counts_against_health());
        assert!(!AttemptError::ContextLength(Bytes::new()).counts_against_health());
        assert!(AttemptError::Status(StatusCode::BAD_GATEWAY).counts_against_health());
        assert!(AttemptError::TtftTimeout(s).counts_against_health());
        assert!(!AttemptError::TtftTimeout(s).worth_same_backend_retry());
        assert!(AttemptError::Reset("x".into()).worth_same_backend_retry());
    }
}
