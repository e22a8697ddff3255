//! One attempt on one backend over the pooled keep-alive client, and the
//! response body that streams the backend's bytes to the client.
//!
//! An attempt is "committed" only once the backend's first body byte has
//! arrived: until then any failure can be retried elsewhere. After it, a
//! failure ends the stream with an SSE error event (never `[DONE]`) and an
//! aborted connection, so a truncated answer never looks complete.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode, Uri};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Sleep;

use crate::dataplane::error::error_body;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request pool: keep-alive HTTP/1.1 connections to every backend.
pub type Upstream = Client<HttpConnector, Full<Bytes>>;

/// Builds a pooled client. Probes use a separate one (see `health`), so a
/// saturated request pool never delays health checks and vice versa.
pub fn client(connect_timeout: Duration, max_idle_per_host: usize) -> Upstream {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_keepalive(Some(Duration::from_secs(60)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(max_idle_per_host)
        .build(http)
}

/// Why an attempt failed before its first byte. The retry loop asks the
/// error, not its message, whether another backend may help.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("connect failed: {0}")]
    Connect(String),
    #[error("connection failed before the first byte: {0}")]
    Reset(String),
    #[error("backend answered {0}")]
    Status(StatusCode),
    #[error("no first byte within {0:?}")]
    FirstByteTimeout(Duration),
    /// 429: busy, not broken.
    #[error("backend busy (429), retry after {0:?}")]
    Busy(Option<Duration>),
}

impl AttemptError {
    /// Whether the failure says the backend is unhealthy (429 does not).
    pub fn counts_against_health(&self) -> bool {
        !matches!(self, AttemptError::Busy(_))
    }

    /// The `outcome` label of attempt metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            AttemptError::Connect(_) => "connect_error",
            AttemptError::Reset(_) => "reset",
            AttemptError::Status(_) => "status_5xx",
            AttemptError::FirstByteTimeout(_) => "first_byte_timeout",
            AttemptError::Busy(_) => "busy",
        }
    }
}

/// A backend response whose first body chunk has arrived.
pub struct Committed {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub first: Option<Bytes>,
    pub rest: Incoming,
    pub first_byte: Duration,
}

/// Request headers that describe this hop only, or carry the client's
/// gateway credentials, and so never go to the backend.
const DROP_REQUEST: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
    header::AUTHORIZATION,
    header::CONTENT_LENGTH,
];

/// Response headers that describe the backend's hop only.
const DROP_RESPONSE: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap, fixed: &[HeaderName]) {
    // Headers named by `Connection` are hop-by-hop too (RFC 9110 §7.6.1).
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in fixed.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

/// Copies the client's headers for the backend, minus hop-by-hop ones.
pub fn upstream_headers(client_headers: &HeaderMap) -> HeaderMap {
    let mut h = client_headers.clone();
    strip_hop_by_hop(&mut h, DROP_REQUEST);
    h
}

/// The backend's response headers for the client, minus hop-by-hop ones.
pub fn downstream_headers(mut h: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut h, DROP_RESPONSE);
    h
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| Duration::from_secs_f64(s.min(3600.0)))
}

fn classify_client_error(e: hyper_util::client::legacy::Error) -> AttemptError {
    if e.is_connect() {
        AttemptError::Connect(source_chain(&e))
    } else {
        AttemptError::Reset(source_chain(&e))
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

/// Sends one request and waits, within `first_byte_timeout`, for the
/// response head and its first body chunk.
pub async fn attempt(
    client: &Upstream,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    first_byte_timeout: Duration,
) -> Result<Committed, AttemptError> {
    let started = Instant::now();
    let mut req = Request::post(uri)
        .body(Full::new(body))
        .map_err(|e| AttemptError::Connect(format!("bad upstream request: {e}")))?;
    *req.headers_mut() = headers;
    let exchange = async {
        let resp = client.request(req).await.map_err(classify_client_error)?;
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Err(AttemptError::Busy(retry_after(resp.headers())));
        }
        if status.is_server_error() {
            return Err(AttemptError::Status(status));
        }
        let (parts, mut rest) = resp.into_parts();
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
        Ok(Committed {
            status: parts.status,
            headers: parts.headers,
            first,
            rest,
            first_byte: started.elapsed(),
        })
    };
    tokio::time::timeout(first_byte_timeout, exchange)
        .await
        .map_err(|_| AttemptError::FirstByteTimeout(first_byte_timeout))?
}

/// Whether a response is a server-sent event stream.
pub fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// How a streamed response ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    Complete,
    /// The backend failed after the first byte, or the total timeout hit.
    Aborted(&'static str),
    /// The client went away first.
    ClientGone,
}

/// Streams a committed response to the client, frame by frame, never
/// buffering it whole, and reports how it ended exactly once.
pub struct ProxyBody {
    first: Option<Bytes>,
    rest: Incoming,
    deadline: Pin<Box<Sleep>>,
    sse: bool,
    state: BodyState,
    on_end: Option<Box<dyn FnOnce(StreamEnd) + Send + Sync>>,
}

#[derive(PartialEq, Eq)]
enum BodyState {
    Streaming,
    /// The SSE error event was handed to hyper; yield once so it is flushed.
    ErrorSent(&'static str),
    /// Flushed; the next poll aborts the connection.
    ErrorFlushed(&'static str),
    Done,
}

impl ProxyBody {
    /// `sse` says whether the response is an event stream (see [`is_sse`]);
    /// the committed response's headers are the caller's to send.
    pub fn new(
        committed: Committed,
        sse: bool,
        deadline: tokio::time::Instant,
        on_end: impl FnOnce(StreamEnd) + Send + Sync + 'static,
    ) -> Self {
        Self {
            first: committed.first,
            rest: committed.rest,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            sse,
            state: BodyState::Streaming,
            on_end: Some(Box::new(on_end)),
        }
    }

    fn finish(&mut self, end: StreamEnd) {
        if let Some(f) = self.on_end.take() {
            f(end);
        }
    }

    fn abort(&mut self, reason: &'static str) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.finish(StreamEnd::Aborted(reason));
        if self.sse {
            self.state = BodyState::ErrorSent(reason);
            let event = error_body(
                &format!(
                    "the upstream stream was interrupted ({reason}); the response is incomplete"
                ),
                "server_error",
                "stream_interrupted",
            );
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                "data: {event}\n\n"
            ))))))
        } else {
            self.state = BodyState::Done;
            Poll::Ready(Some(Err(reason.into())))
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.state {
            BodyState::Done => return Poll::Ready(None),
            BodyState::ErrorSent(reason) => {
                // hyper flushes its write buffer when the body is pending;
                // without this the event would die with the connection.
                this.state = BodyState::ErrorFlushed(reason);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            BodyState::ErrorFlushed(reason) => {
                this.state = BodyState::Done;
                // Aborting the connection (no terminating chunk) tells HTTP
                // clients too that the body is incomplete.
                return Poll::Ready(Some(Err(reason.into())));
            }
            BodyState::Streaming => {}
        }
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return this.abort("total timeout");
        }
        match Pin::new(&mut this.rest).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(_))) => this.abort("upstream connection failed"),
            Poll::Ready(None) => {
                this.state = BodyState::Done;
                this.finish(StreamEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == BodyState::Done
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        self.finish(StreamEnd::ClientGone);
    }
}

/// Sets a response header from a string, skipping values that are not
/// valid header text (they come from config names, which are validated).
pub fn set_header(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_credentials_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-session-id", "s1".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        let up = upstream_headers(&h);
        assert!(!up.contains_key(header::AUTHORIZATION));
        assert!(!up.contains_key("x-private"));
        assert!(!up.contains_key("keep-alive"));
        assert!(!up.contains_key(header::CONNECTION));
        assert_eq!(up["x-session-id"], "s1");
        assert_eq!(up[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn retry_after_parses_seconds() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn busy_is_not_a_health_failure() {
        assert!(!AttemptError::Busy(None).counts_against_health());
        assert!(AttemptError::Status(StatusCode::BAD_GATEWAY).counts_against_health());
        assert!(AttemptError::FirstByteTimeout(Duration::from_secs(1)).counts_against_health());
    }
}
