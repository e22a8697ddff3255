//! A lean HTTP/1.1 server for the plain case, ahead of hyper's.
//!
//! Why: hyper's server (its dispatcher, buffers, body channel and the
//! boxed layers around them) cost about a quarter of the instructions of a
//! proxied request (`benches/callgrind.sh`). Most requests a gateway sees
//! are plain: HTTP/1.1 with a `Content-Length` body. This module serves
//! those itself and hands everything else to hyper.
//!
//! Architecture Invariant: this server answers only requests whose framing
//! is unambiguous: HTTP/1.1, no `Transfer-Encoding`, at most one valid
//! `Content-Length`, no `Expect` or `Upgrade`, a method other than `HEAD`
//! or `CONNECT`, and a head httparse accepts. At the first request that is
//! not, it stops and returns the connection with every byte it read
//! ([`Ended::Handoff`]); hyper serves it from there, byte for byte what it
//! would have seen. So request smuggling, chunked bodies, `100-continue`,
//! HTTP/1.0, HTTP/2's preface and every error answer for a malformed head
//! stay hyper's.
//!
//! A POST to a path of the listener's [`Plain`] handler goes to it as its
//! target, header fields and body, and its [`Answer`] is written as it is;
//! every other request goes to the app as an `http` request, and its
//! response is written the same way (its [`HeadLines`] extension after
//! its map).
//!
//! A body that came with its head is handed over whole; the rest of one
//! that did not is read while the handler runs and handed over in chunks
//! (at most 4 waiting: a handler that does not read holds the client
//! back), so the handler's own size limit and body-read timeout apply. An
//! answer given before the body was read to its end closes the connection
//! after it.
//!
//! What it does the way hyper does: a client that hangs up while its
//! request is in flight cancels it (the service's future is dropped); the
//! response is framed by its `Content-Length`, else by the body's exact
//! size, else chunked; `date` is added; `Connection: close` from the
//! request or the response closes the connection after the response; a
//! body that fails mid-way closes the connection without the final chunk,
//! so a cut answer never looks complete. The listener's watchdog (header,
//! idle timeouts) and its graceful stop apply as to hyper's connections.

use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{header, HeaderMap, Method, Request, StatusCode, Uri};
use http_body::Body as _;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tower::ServiceExt;

use crate::app::{App, Peer, Plain, PlainRequest};
use crate::http1::{
    content_length, header_map, list_items, name_is, poll_read, put_header, put_number, span,
    Answer, HeadFields, HeadLines, Span, READ_SPACE,
};
use crate::stop::Stop;
use crate::watchdog::{ConnState, InFlight};

/// Headers in one request at most; more go to hyper (whose limit is 100).
const MAX_HEADERS: usize = 64;
/// A head still incomplete at this size goes to hyper (which answers 431
/// past its own limit).
const MAX_HEAD: usize = 64 * 1024;
/// Response bytes gathered before a write, even if more are ready.
const FLUSH_AT: usize = 16 * 1024;

/// How a connection left this server.
pub(crate) enum Ended<I> {
    /// Closed: the client left, a write failed, or `Connection: close`.
    Closed,
    /// A request this server does not take: hyper serves the connection
    /// from here, starting with these bytes, read and not answered.
    Handoff(I, Bytes),
}

/// Serves requests on `io` until the connection closes or a request is
/// not one this server takes (see the module).
pub(crate) async fn serve<I, A, P>(
    mut io: I,
    peer: Option<&Peer>,
    app: &A,
    plain: Option<&P>,
    state: &Arc<ConnState>,
    stop: &Stop,
) -> Ended<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
    A: App,
    P: Plain,
{
    let mut buf = BytesMut::with_capacity(READ_SPACE);
    let mut out = Vec::with_capacity(READ_SPACE);
    let mut spans = Vec::with_capacity(16);
    loop {
        // A whole request: its head, then its body if it came with it.
        // `checked`: bytes of an incomplete head already parsed once; the
        // head is parsed again only once the bytes after them may end it,
        // so a head sent a byte at a time costs linear work, not quadratic.
        let mut checked = 0;
        let parsed = loop {
            let found = if buf.is_empty() || (checked > 0 && !may_end_head(&buf, checked)) {
                Parse::Partial
            } else {
                parse(&buf, &mut spans)
            };
            match found {
                Parse::Complete(p) => break p,
                Parse::NotOurs => return Ended::Handoff(io, buf.freeze()),
                Parse::Partial => {
                    checked = buf.len();
                    match read(&mut io, &mut buf).await {
                        Ok(0) | Err(_) => return Ended::Closed,
                        Ok(_) => {}
                    }
                }
            }
        };
        let head = buf.split_to(parsed.head_len).freeze();
        let first = buf.split_to(buf.len().min(parsed.body_len)).freeze();
        let (mut feed, body) = match Feed::new(parsed.body_len, &first) {
            Some((feed, rest)) => (Some(feed), Body::new(rest)),
            None => (None, Body::from(first.clone())),
        };
        let Some(call) = call(&parsed, &head, &spans, plain, body) else {
            // A value or target httparse let through and `http` does not.
            let mut back = BytesMut::with_capacity(head.len() + first.len() + buf.len());
            back.extend_from_slice(&head);
            back.extend_from_slice(&first);
            back.extend_from_slice(&buf);
            return Ended::Handoff(io, back.freeze());
        };
        drop((head, first));
        let guard = InFlight::begin(&**state);
        // The handler's future is pinned here, in this function's state,
        // and lent to `respond`: passed by value, it was stored twice in
        // `respond`'s (as its argument and pinned in a local: 6.9 KB for
        // the data plane's 3.4 KB future) and copied at its first poll.
        let answer = match call {
            Call::Plain(plain, req) => {
                let fut = std::pin::pin!(plain.call(req));
                respond(&mut io, &mut buf, &mut feed, fut).await
            }
            Call::App(mut req) => {
                if let Some(peer) = peer {
                    req.extensions_mut().insert(peer.clone());
                }
                let fut = std::pin::pin!(app.clone().oneshot(req));
                respond(&mut io, &mut buf, &mut feed, fut)
                    .await
                    .map(|r| match r {
                        Ok(resp) => Answer::from(resp),
                        Err(never) => match never {},
                    })
            }
        };
        let Some(Answer {
            status,
            headers,
            lines,
            mut body,
        }) = answer
        else {
            return Ended::Closed;
        };
        // A body the handler did not read to its end is still on its way:
        // the connection cannot carry another request.
        let unread = feed.is_some_and(|f| f.left > 0);
        let close = parsed.close || unread || stop.is_stopped() || asks_close(&headers);
        let framing = framing(status, &headers, &body);
        out.clear();
        write_head(&mut out, status, &headers, &lines, framing, close);
        let complete = write_body(&mut io, &mut out, &mut body, framing, &mut buf).await;
        drop(guard);
        if !complete {
            return Ended::Closed;
        }
        if close {
            let _ = io.shutdown().await;
            if unread {
                linger(&mut io).await;
            }
            return Ended::Closed;
        }
    }
}

/// After an answer given before its request's body was read (a 401 or a
/// 413 to a large upload), the rest of the body is read and dropped for a
/// while before the connection closes, as nginx's `lingering_close` does:
/// closed with unread bytes, the socket would send a reset, and a client
/// still writing its body would get the reset instead of the answer.
/// Bounded by bytes and time, so a client cannot keep the connection
/// through it.
pub(crate) const LINGER_BYTES: usize = 64 * 1024 * 1024;
/// See [`LINGER_BYTES`]: at most this long (nginx's `lingering_timeout`).
pub(crate) const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads and drops what the client still sends (its write side closed
/// already: it has the answer and the end), until it closes its own side
/// or a bound of [`LINGER_BYTES`], [`LINGER_TIME`] is reached.
async fn linger<I: AsyncRead + Unpin>(io: &mut I) {
    use tokio::io::AsyncReadExt;
    let drain = async {
        let mut scratch = vec![0u8; READ_SPACE];
        let mut read = 0;
        while read < LINGER_BYTES {
            match io.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// What [`parse`] found at the front of the buffer.
enum Parse {
    Complete(Parsed),
    Partial,
    NotOurs,
}

/// A request head this server takes; header spans are in `spans`.
struct Parsed {
    method: Method,
    path: Range<usize>,
    head_len: usize,
    body_len: usize,
    /// The client asked to close after the response.
    close: bool,
}

fn parse(buf: &[u8], spans: &mut Vec<Span>) -> Parse {
    // Left uninitialised: httparse writes each header it finds.
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parse::Partial,
        _ => return Parse::NotOurs,
    };
    if req.version != Some(1) {
        return Parse::NotOurs;
    }
    let method = match req.method {
        Some("GET") => Method::GET,
        Some("POST") => Method::POST,
        Some("PUT") => Method::PUT,
        Some("DELETE") => Method::DELETE,
        Some("PATCH") => Method::PATCH,
        Some("OPTIONS") => Method::OPTIONS,
        _ => return Parse::NotOurs,
    };
    let Some(path) = req.path.map(|p| span(buf, p.as_bytes())) else {
        return Parse::NotOurs;
    };
    spans.clear();
    let mut body_len = None;
    let mut close = false;
    let mut hosts = 0;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name_is(name, b"host") {
            hosts += 1;
        } else if name_is(name, b"content-length") {
            match (body_len, content_length(h.value).map(usize::try_from)) {
                (None, Some(Ok(n))) => body_len = Some(n),
                _ => return Parse::NotOurs,
            }
        } else if name_is(name, b"transfer-encoding")
            || name_is(name, b"expect")
            || name_is(name, b"upgrade")
        {
            return Parse::NotOurs;
        } else if name_is(name, b"connection") {
            for token in list_items(h.value) {
                if name_is(token, b"close") {
                    close = true;
                } else if name_is(token, b"upgrade") {
                    return Parse::NotOurs;
                }
            }
        }
        spans.push((span(buf, name), span(buf, h.value)));
    }
    if hosts != 1 {
        // Refused with a 400 on hyper's path (`listen::host_refusal`).
        return Parse::NotOurs;
    }
    Parse::Complete(Parsed {
        method,
        path,
        head_len,
        body_len: body_len.unwrap_or(0),
        close,
    })
}

/// Whether the bytes from `from` on (with the three before, where an end
/// may begin) hold an empty line, the end of a head; or the buffer is at
/// the size past which the head is hyper's.
fn may_end_head(buf: &[u8], from: usize) -> bool {
    buf.len() >= MAX_HEAD || crate::http1::may_end_head(buf, from)
}

/// Who answers a request, and what they are handed.
enum Call<'a, P> {
    /// A POST to a path of the listener's [`Plain`] handler.
    Plain(&'a P, PlainRequest),
    /// Anything else: the app's, as an `http` request.
    App(Request<Body>),
}

/// The call for a parsed request; `None` when `http` refuses a part.
fn call<'a, P: Plain>(
    parsed: &Parsed,
    head: &Bytes,
    spans: &[Span],
    plain: Option<&'a P>,
    body: Body,
) -> Option<Call<'a, P>> {
    let target = &head[parsed.path.clone()];
    let path_len = memchr::memchr(b'?', target).unwrap_or(target.len());
    let to_plain = plain
        .filter(|_| parsed.method == Method::POST)
        .and_then(|p| {
            let path = &target[..path_len];
            Some((p, p.paths().iter().find(|x| x.as_str().as_bytes() == path)?))
        });
    if let Some((plain, path)) = to_plain {
        let target = if path_len == target.len() {
            path.clone()
        } else {
            PathAndQuery::from_maybe_shared(head.slice(parsed.path.clone())).ok()?
        };
        let fields = HeadFields::new(head.clone(), spans)?;
        let req = PlainRequest {
            target,
            fields,
            body,
        };
        return Some(Call::Plain(plain, req));
    }
    let uri = Uri::from_maybe_shared(head.slice(parsed.path.clone())).ok()?;
    let mut req = Request::new(body);
    *req.headers_mut() = header_map(head, spans, 0)?;
    *req.method_mut() = parsed.method.clone();
    *req.uri_mut() = uri;
    Some(Call::App(req))
}

async fn read<I: AsyncRead + Unpin>(io: &mut I, buf: &mut BytesMut) -> io::Result<usize> {
    poll_fn(|cx| poll_read(io, buf, cx)).await
}

/// Runs the service's future to its response. Meanwhile the connection
/// is read: the rest of the request's body into `feed`; then as hyper
/// reads it: bytes of a next request are kept (and reading stops), and the
/// end of the stream means the client left: the request is cancelled
/// (`None`), as it is when the body breaks off.
async fn respond<I, F, R>(
    io: &mut I,
    buf: &mut BytesMut,
    feed: &mut Option<Feed>,
    mut fut: Pin<&mut F>,
) -> Option<R>
where
    I: AsyncRead + Unpin,
    F: Future<Output = R>,
{
    let mut watching = buf.is_empty();
    poll_fn(|cx| loop {
        if let Poll::Ready(r) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if let Some(f) = feed.as_mut().filter(|f| f.left > 0 && !f.dropped) {
            if buf.is_empty() {
                match poll_read(io, buf, cx) {
                    Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Pending => return Poll::Pending,
                }
            }
            match f.tx.poll_reserve(cx) {
                Poll::Ready(Ok(())) => {
                    let chunk = buf.split_to(buf.len().min(f.left)).freeze();
                    f.left -= chunk.len();
                    f.dropped = f.tx.send_item(chunk).is_err();
                }
                // The handler let go of the body: the rest is not read.
                Poll::Ready(Err(_)) => f.dropped = true,
                Poll::Pending => return Poll::Pending,
            }
            watching = buf.is_empty();
            continue;
        }
        if hung_up(io, buf, &mut watching, cx) {
            return Poll::Ready(None);
        }
        return Poll::Pending;
    })
    .await
}

/// Reads the connection while a request is in flight, as hyper does:
/// only while nothing of a next request is buffered (`watching`); bytes
/// that come are kept and end the watch. True when the client hung up.
fn hung_up<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    watching: &mut bool,
    cx: &mut Context<'_>,
) -> bool {
    if !*watching {
        return false;
    }
    match poll_read(io, buf, cx) {
        Poll::Ready(Ok(0) | Err(_)) => true,
        Poll::Ready(Ok(_)) => {
            *watching = false;
            false
        }
        Poll::Pending => false,
    }
}

/// The part of a request body that was not read with its head: read by
/// the connection while the handler runs, handed over in chunks.
struct Feed {
    tx: tokio_util::sync::PollSender<Bytes>,
    /// Bytes still to read from the connection.
    left: usize,
    /// The handler dropped the body.
    dropped: bool,
}

impl Feed {
    /// The feed and the body it fills, `first` already in it; `None`
    /// when `first` is the whole body.
    fn new(len: usize, first: &Bytes) -> Option<(Self, Streamed)> {
        if first.len() == len {
            return None;
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let sent = first.is_empty() || tx.try_send(first.clone()).is_ok();
        debug_assert!(sent, "a new channel has room");
        let feed = Self {
            tx: tokio_util::sync::PollSender::new(tx),
            left: len - first.len(),
            dropped: false,
        };
        let body = Streamed {
            rx,
            left: len as u64,
        };
        Some((feed, body))
    }
}

/// A request body arriving while its handler runs.
struct Streamed {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    left: u64,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                self.left = self.left.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
            Poll::Ready(None) => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed before the request body ended",
            )))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// How the response's body is delimited on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// No body may follow (1xx, 204, 304).
    Bodiless,
    Length(u64),
    Chunked,
}

fn framing(status: StatusCode, headers: &HeaderMap, body: &Body) -> Framing {
    if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Framing::Bodiless;
    }
    let mut declared = headers.get_all(header::CONTENT_LENGTH).iter();
    if let (Some(v), None) = (declared.next(), declared.next()) {
        if let Some(n) = content_length(v.as_bytes()) {
            return Framing::Length(n);
        }
    }
    match body.size_hint().exact() {
        Some(n) => Framing::Length(n),
        None => Framing::Chunked,
    }
}

fn asks_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| list_items(v.as_bytes()).any(|t| name_is(t, b"close")))
}

/// The status line and headers: the map's, then the response's
/// [`HeadLines`] as they are. The framing headers and `connection` are
/// this server's to write; `date` is added when neither has one.
fn write_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    lines: &HeadLines,
    framing: Framing,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        let ours = name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::CONNECTION;
        if ours && !(framing == Framing::Bodiless && name == header::CONTENT_LENGTH) {
            continue;
        }
        put_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(&lines.lines);
    if !(headers.contains_key(header::DATE) || lines.dated) {
        DATE.with(|d| put_header(out, b"date", &d.now()));
    }
    match framing {
        Framing::Bodiless => {}
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            put_number(out, n, 10);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => put_header(out, b"transfer-encoding", b"chunked"),
    }
    if close {
        put_header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes `out` (the head) and the body. Frames that are ready together
/// go out in one write; the connection is read meanwhile as in
/// [`respond`] (a client gone ends the body at once). False when the
/// connection cannot carry another request: a failed write, a client
/// gone, a body that failed, or one shorter or longer than declared.
async fn write_body<I: AsyncRead + AsyncWrite + Unpin>(
    io: &mut I,
    out: &mut Vec<u8>,
    body: &mut Body,
    framing: Framing,
    buf: &mut BytesMut,
) -> bool {
    let mut left = match framing {
        Framing::Bodiless => return io.write_all(out).await.is_ok(),
        Framing::Length(n) => n,
        Framing::Chunked => u64::MAX,
    };
    let mut watching = buf.is_empty();
    loop {
        // Asked with the task's waker: a body that yields to let the
        // runtime pass (the relay's gather) is woken as it expects.
        let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if !out.is_empty() {
                    if io.write_all(out).await.is_err() {
                        return false;
                    }
                    out.clear();
                }
                match next_frame(io, buf, body, &mut watching).await {
                    Some(frame) => frame,
                    None => return false,
                }
            }
        };
        let data = match frame {
            None => break,
            Some(Err(_)) => {
                // What came before the failure goes out; the final chunk
                // does not.
                let _ = io.write_all(out).await;
                return false;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                // Trailers are not sent over HTTP/1 (hyper does the same
                // unless the client asked with `TE: trailers`).
                _ => continue,
            },
        };
        let chunked = framing == Framing::Chunked;
        let take = if chunked {
            data.len()
        } else {
            data.len().min(usize::try_from(left).unwrap_or(usize::MAX))
        };
        if chunked {
            put_number(out, data.len() as u64, 16);
            out.extend_from_slice(b"\r\n");
        } else {
            left -= take as u64;
        }
        if take >= FLUSH_AT {
            // Large: written as it is, not copied.
            if io.write_all(out).await.is_err() || io.write_all(&data[..take]).await.is_err() {
                return false;
            }
            out.clear();
        } else {
            out.extend_from_slice(&data[..take]);
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
        if take < data.len() {
            // Longer than declared: what was declared, then close.
            let _ = io.write_all(out).await;
            return false;
        }
        if out.len() >= FLUSH_AT {
            if io.write_all(out).await.is_err() {
                return false;
            }
            out.clear();
        }
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    let written = io.write_all(out).await.is_ok();
    out.clear();
    written && (framing == Framing::Chunked || left == 0)
}

type Frame = Option<Result<http_body::Frame<Bytes>, axum::Error>>;

/// The body's next frame, or `None` when the client hung up first.
async fn next_frame<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    body: &mut Body,
    watching: &mut bool,
) -> Option<Frame> {
    poll_fn(|cx| {
        if let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(cx) {
            return Poll::Ready(Some(frame));
        }
        if hung_up(io, buf, watching, cx) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// The `date` header's value, made once a second per thread.
struct Date {
    second: std::cell::Cell<u64>,
    value: std::cell::RefCell<[u8; 29]>,
}

impl Date {
    fn now(&self) -> [u8; 29] {
        let now = std::time::SystemTime::now();
        let second = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second.get() {
            let text = httpdate::fmt_http_date(now);
            if let Ok(bytes) = <[u8; 29]>::try_from(text.as_bytes()) {
                *self.value.borrow_mut() = bytes;
                self.second.set(second);
            }
        }
        *self.value.borrow()
    }
}

thread_local! {
    static DATE: Date = const {
        Date {
            second: std::cell::Cell::new(u64::MAX),
            value: std::cell::RefCell::new(*b"Thu, 01 Jan 1970 00:00:00 GMT"),
        }
    };
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use axum::routing::{get, post};
    use axum::Router;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::listen::tests::{serve_app, serve_app_with};
    use crate::listen::{Limits, Stats};

    struct Server {
        addr: SocketAddr,
        stats: Arc<Stats>,
        stop: tokio::sync::watch::Sender<bool>,
    }

    async fn server(app: Router) -> Server {
        let (addr, stats, stop) = serve_app(app, Limits::with_max(64)).await;
        Server { addr, stats, stop }
    }

    fn echo() -> Router {
        Router::new()
            .route("/echo", post(|body: Bytes| async move { body }))
            .route("/", get(|| async { "ok" }))
    }

    /// Sends `wire` on a new connection and reads until the server closes.
    async fn exchange(addr: SocketAddr, wire: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(wire).await.expect("write");
        read_to_close(&mut s).await
    }

    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got));
        let _ = read.await.expect("the server closes the connection");
        String::from_utf8_lossy(&got).into_owned()
    }

    fn handed(s: &Server) -> u64 {
        s.stats.handed_to_hyper.load(Ordering::Relaxed)
    }

    #[test]
    fn head_lines_follow_the_map_and_a_date_is_added_only_when_neither_has_one() {
        let head = |lines: &HeadLines| {
            let mut map = HeaderMap::new();
            map.insert("x-map", http::HeaderValue::from_static("1"));
            let mut out = Vec::new();
            write_head(
                &mut out,
                StatusCode::OK,
                &map,
                lines,
                Framing::Length(2),
                false,
            );
            String::from_utf8(out).unwrap()
        };
        let dated = HeadLines {
            lines: Bytes::from_static(b"Server: b\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n"),
            dated: true,
            event_stream: false,
        };
        assert_eq!(
            head(&dated),
            "HTTP/1.1 200 OK\r\nx-map: 1\r\nServer: b\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\
             content-length: 2\r\n\r\n"
        );
        let undated = HeadLines {
            lines: Bytes::from_static(b"Server: b\r\n"),
            ..HeadLines::default()
        };
        for text in [head(&undated), head(&HeadLines::default())] {
            assert_eq!(text.matches("date: ").count(), 1, "{text}");
            assert!(text.ends_with("content-length: 2\r\n\r\n"), "{text}");
        }
    }

    /// A [`Plain`] handler of `/v1/x` that answers with what it was
    /// handed: the target and header fields in the body, a map header and
    /// a line.
    struct Fields(Vec<PathAndQuery>);

    fn fields() -> Fields {
        Fields(vec![PathAndQuery::from_static("/v1/x")])
    }

    impl Plain for Fields {
        fn paths(&self) -> &[PathAndQuery] {
            &self.0
        }

        fn call(&self, req: PlainRequest) -> impl Future<Output = Answer> + Send {
            let mut text = format!("{} {}", req.target.path(), req.target);
            for (n, v) in req.fields.iter() {
                text += &format!(
                    " {}={}",
                    String::from_utf8_lossy(n),
                    String::from_utf8_lossy(v)
                );
            }
            let mut headers = HeaderMap::new();
            headers.insert("x-map", http::HeaderValue::from_static("1"));
            async move {
                Answer {
                    status: StatusCode::ACCEPTED,
                    headers,
                    lines: HeadLines {
                        lines: Bytes::from_static(b"x-line: 2\r\n"),
                        ..HeadLines::default()
                    },
                    body: Body::from(text),
                }
            }
        }
    }

    #[test]
    fn a_post_to_a_plain_path_carries_its_header_fields_and_target_and_no_map() {
        let plain_handler = fields();
        let read = |wire: &'static [u8]| {
            let mut spans = Vec::new();
            let Parse::Complete(parsed) = parse(wire, &mut spans) else {
                panic!("a complete head: {}", String::from_utf8_lossy(wire));
            };
            let head = Bytes::from_static(wire).slice(..parsed.head_len);
            call(&parsed, &head, &spans, Some(&plain_handler), Body::empty()).expect("a call")
        };
        let plain = |call: Call<'_, Fields>| match call {
            Call::Plain(_, req) => {
                let fields: Vec<String> = req
                    .fields
                    .iter()
                    .map(|(n, v)| {
                        format!(
                            "{}={}",
                            String::from_utf8_lossy(n),
                            String::from_utf8_lossy(v)
                        )
                    })
                    .collect();
                (req.target.path().to_owned(), req.target.to_string(), fields)
            }
            Call::App(req) => panic!("the app's: {req:?}"),
        };
        let (path, target, fields) = plain(read(
            b"POST /v1/x?y=1 HTTP/1.1\r\nHost: a\r\nX-Two:  b \r\ncontent-length: 2\r\n\r\n{}",
        ));
        assert_eq!((&*path, &*target), ("/v1/x", "/v1/x?y=1"));
        assert_eq!(fields, ["Host=a", "X-Two=b", "content-length=2"]);
        let (_, target, fields) = plain(read(b"POST /v1/x HTTP/1.1\nHost: a\nX: 1\n\n"));
        assert_eq!(target, "/v1/x");
        assert_eq!(fields, ["Host=a", "X=1"], "bare line feeds");
        assert_eq!(
            plain(read(b"POST /v1/x HTTP/1.1\r\nhost: x\r\n\r\n")).2,
            ["host=x"]
        );
        // Without exactly one `Host`: hyper's, which refuses it.
        for wire in [
            &b"POST /v1/x HTTP/1.1\r\n\r\n"[..],
            b"POST /v1/x HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n",
        ] {
            assert!(matches!(parse(wire, &mut Vec::new()), Parse::NotOurs));
        }

        // Another path (a prefix, a longer one), or another method: the
        // app's, with the map.
        for wire in [
            &b"POST /v1/other HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"POST /v1/xy HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST /v1 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /v1/x HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            match read(wire) {
                Call::App(req) => assert_eq!(req.headers()[header::HOST], "a"),
                Call::Plain(..) => panic!("not plain: {}", String::from_utf8_lossy(wire)),
            }
        }
    }

    #[test]
    fn any_target_goes_to_the_plain_handler_only_by_its_path_and_whole() {
        let plain_handler = fields();
        const PIECES: [&str; 14] = [
            "/v1/x", "/v1", "/x", "?", "?q=1", "&", "%2F", "#", "\"", "{}", "\u{e9}", "/", "x",
            "..",
        ];
        let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
        let mut next = |below: usize| rng.usize(..below);
        let (mut plain, mut app, mut handed) = (0, 0, 0);
        for _ in 0..20_000 {
            let target: String = (0..1 + next(4))
                .map(|_| PIECES[next(PIECES.len())])
                .collect();
            // Origin-form only (an absolute or authority form is another
            // matter, hyper's or the app's).
            if !target.starts_with('/') {
                continue;
            }
            let method = ["POST", "GET"][next(2)];
            let wire = format!("{method} {target} HTTP/1.1\r\nHost: a\r\n\r\n");
            let mut spans = Vec::new();
            let Parse::Complete(parsed) = parse(wire.as_bytes(), &mut spans) else {
                continue;
            };
            let head = Bytes::from(wire.clone()).slice(..parsed.head_len);
            let ours = method == "POST" && target.split('?').next() == Some("/v1/x");
            // Both keep what precedes a fragment (a fragment has no place
            // in a request target; `http` drops it).
            let kept = target.split('#').next().unwrap_or_default();
            match call(&parsed, &head, &spans, Some(&plain_handler), Body::empty()) {
                Some(Call::Plain(_, req)) => {
                    assert!(ours, "{wire:?}");
                    assert_eq!(
                        req.target.as_str(),
                        kept,
                        "the whole target, query included"
                    );
                    plain += 1;
                }
                Some(Call::App(req)) => {
                    assert!(!ours, "{wire:?}");
                    let got = req.uri().path_and_query().map(|p| p.as_str());
                    assert_eq!(got, Some(kept), "{wire:?}");
                    app += 1;
                }
                // A target `http` refuses: hyper's, whoever would take it.
                None => handed += 1,
            }
        }
        assert!(
            plain > 100 && app > 100 && handed > 0,
            "{plain} {app} {handed}"
        );
    }

    #[tokio::test]
    async fn a_plain_handler_answers_its_posts_and_the_app_the_rest() {
        let plain = Arc::new(fields());
        let app = echo().route("/v1/x", post(|| async { "the app" }));
        let (addr, stats, _stop) =
            serve_app_with(app, Limits::with_max(8), false, None, Some(plain)).await;
        let got = exchange(
            addr,
            b"POST /v1/x?q=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\n\r\n{}\
              POST /echo HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
        )
        .await;
        let (first, second) = got.split_once("HTTP/1.1 200").expect("two answers");
        assert!(
            first.starts_with("HTTP/1.1 202 Accepted\r\nx-map: 1\r\nx-line: 2\r\n"),
            "{first}"
        );
        assert!(first.contains("content-length: 39\r\n"), "{first}");
        assert!(
            first.ends_with("\r\n\r\n/v1/x /v1/x?q=1 Host=a content-length=2"),
            "{first}"
        );
        assert!(second.ends_with("\r\n\r\nhi"), "{second}");
        // A chunked POST to the same path is hyper's, and so the app's.
        let got = exchange(
            addr,
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n0\r\n\r\n",
        )
        .await;
        assert!(got.ends_with("the app"), "{got}");
        assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn plain_requests_are_answered_in_order_on_one_connection_without_hyper() {
        let s = server(echo()).await;
        // Pipelined: both in one write, the second asks to close.
        let got = exchange(
            s.addr,
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nfirst\
              POST /echo HTTP/1.1\r\nhost: x\r\nContent-Length: 6\r\nconnection: close\r\n\r\nsecond",
        )
        .await;
        let answers: Vec<&str> = got.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
        assert_eq!(answers.len(), 2, "{got}");
        assert!(answers[0].contains("content-length: 5\r\n"), "{got}");
        assert!(answers[0].ends_with("\r\n\r\nfirst"), "{got}");
        assert!(answers[0].contains("date: "), "{got}");
        assert!(!answers[0].contains("connection: close"), "{got}");
        assert!(answers[1].contains("connection: close\r\n"), "{got}");
        assert!(answers[1].ends_with("\r\n\r\nsecond"), "{got}");
        assert_eq!(handed(&s), 0);
    }

    #[tokio::test]
    async fn a_head_sent_a_byte_at_a_time_is_answered_by_the_lean_server() {
        let s = server(echo()).await;
        let mut c = TcpStream::connect(s.addr).await.expect("connect");
        c.set_nodelay(true).expect("nodelay");
        let wire =
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
        for byte in wire {
            c.write_all(&[*byte]).await.expect("write");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let got = read_to_close(&mut c).await;
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
        assert!(got.ends_with("\r\n\r\nok"), "{got:?}");
        assert_eq!(handed(&s), 0);
    }

    #[test]
    fn only_an_empty_line_after_the_checked_bytes_may_end_a_head() {
        let head = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        for split in 1..head.len() {
            // Bytes up to `split` were parsed; the rest came in one read.
            assert!(may_end_head(head, split), "an end after {split}");
        }
        assert!(!may_end_head(b"GET / HTTP/1.1\r\nhost: x\r\n", 5));
        assert!(may_end_head(b"GET / HTTP/1.1\nhost: x\n\n", 20), "bare LF");
        assert!(
            may_end_head(&vec![b'a'; MAX_HEAD], MAX_HEAD - 1),
            "at the limit"
        );
    }

    #[tokio::test]
    async fn a_streamed_answer_is_chunked_and_ends_with_the_last_chunk() {
        let app = Router::new().route(
            "/",
            get(|| async {
                let parts = ["data: a\n\n", "data: bb\n\n", ""].map(Ok::<_, io::Error>);
                Body::from_stream(futures_util::stream::iter(parts))
            }),
        );
        let s = server(app).await;
        let got = exchange(
            s.addr,
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(got.contains("transfer-encoding: chunked\r\n"), "{got}");
        assert!(
            got.ends_with("\r\n\r\n9\r\ndata: a\n\n\r\na\r\ndata: bb\n\n\r\n0\r\n\r\n"),
            "{got:?}"
        );
        assert_eq!(handed(&s), 0);
    }

    #[tokio::test]
    async fn large_frames_are_framed_like_small_ones() {
        let big = "y".repeat(100_000);
        let sent = big.clone();
        let app = Router::new()
            .route(
                "/stream",
                get(move || {
                    let parts = [Ok::<_, io::Error>(sent.clone()), Ok("end".to_owned())];
                    async move { Body::from_stream(futures_util::stream::iter(parts)) }
                }),
            )
            .route("/whole", get(|| async { "z".repeat(100_000) }));
        let s = server(app).await;
        let got = exchange(
            s.addr,
            b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nGET /whole HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        let (first, second) = got
            .split_once("HTTP/1.1 200 OK\r\n")
            .map_or(("", ""), |(_, rest)| {
                rest.split_once("HTTP/1.1 200 OK\r\n").unwrap_or((rest, ""))
            });
        let chunked = format!("\r\n\r\n186a0\r\n{big}\r\n3\r\nend\r\n0\r\n\r\n");
        assert!(
            first.ends_with(&chunked),
            "{}",
            &first[..200.min(first.len())]
        );
        assert!(second.contains("content-length: 100000\r\n"));
        assert!(second.ends_with(&format!("\r\n\r\n{}", "z".repeat(100_000))));
    }

    #[tokio::test]
    async fn a_body_that_fails_midway_closes_without_the_last_chunk() {
        let app = Router::new()
            .route(
                "/",
                get(|| async {
                    let parts = [Ok("data: a\n\n"), Err(io::Error::other("backend gone"))];
                    Body::from_stream(futures_util::stream::iter(parts))
                }),
            )
            .route(
                "/short",
                get(|| async { ([(header::CONTENT_LENGTH, "10")], "abc") }),
            );
        let s = server(app).await;
        // Keep-alive asked for: the close is the failure's.
        let got = exchange(s.addr, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(got.ends_with("\r\n\r\n9\r\ndata: a\n\n\r\n"), "{got:?}");
        let got = exchange(s.addr, b"GET /short HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(got.contains("content-length: 10\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\nabc"), "{got:?}");
    }

    #[tokio::test]
    async fn requests_it_does_not_take_are_answered_by_hyper_from_their_first_byte() {
        let s = server(echo()).await;
        let cases: [(&[u8], &str); 7] = [
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                "abc",
            ),
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
                "hi",
            ),
            (b"POST /echo HTTP/1.0\r\ncontent-length: 3\r\n\r\nold", "old"),
            (b"HEAD / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", "HTTP/1.1 200 OK"),
            // Smuggling shapes: hyper refuses two lengths, and reads a
            // chunked body that also has a length as chunked, then closes.
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
                "HTTP/1.1 400",
            ),
            (
                b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
                "connection: close",
            ),
            (b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n", "HTTP/1.1 400"),
        ];
        for (i, (wire, expect)) in cases.iter().enumerate() {
            let got = exchange(s.addr, wire).await;
            assert!(got.contains(expect), "case {i}: {got:?}");
            assert_eq!(handed(&s), i as u64 + 1, "case {i}");
        }
    }

    #[tokio::test]
    async fn a_body_behind_its_head_is_streamed_to_the_handler() {
        let s = server(echo()).await;
        // A little, a pause, the rest; and a large one in many reads.
        let mut c = TcpStream::connect(s.addr).await.expect("connect");
        c.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nha")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.write_all(b"lf").await.expect("write");
        let large = "x".repeat(300_000);
        let head = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            large.len()
        );
        let (mut rd, mut wr) = c.into_split();
        let writer = tokio::spawn(async move {
            wr.write_all(head.as_bytes()).await.expect("write");
            wr.write_all(large.as_bytes()).await.expect("write");
            wr
        });
        let mut got = Vec::new();
        rd.read_to_end(&mut got).await.expect("read");
        drop(writer.await);
        let got = String::from_utf8_lossy(&got);
        let answers: Vec<&str> = got.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
        assert_eq!(answers.len(), 2, "{got}");
        assert!(answers[0].ends_with("\r\n\r\nhalf"), "{}", answers[0]);
        assert!(answers[1].contains("content-length: 300000\r\n"));
        assert!(answers[1].ends_with(&"x".repeat(1000)));
        assert_eq!(handed(&s), 0);
    }

    #[tokio::test]
    async fn an_answer_before_the_body_was_read_closes_the_connection() {
        let app = Router::new().route("/", post(|| async { (StatusCode::UNAUTHORIZED, "no key") }));
        let s = server(app).await;
        let mut c = TcpStream::connect(s.addr).await.expect("connect");
        c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nsome")
            .await
            .expect("write");
        let got = read_to_close(&mut c).await;
        assert!(got.starts_with("HTTP/1.1 401"), "{got}");
        assert!(got.contains("connection: close\r\n"), "{got}");
        assert!(got.ends_with("no key"), "{got:?}");
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_cancels_its_request() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&dropped);
        let app = Router::new().route(
            "/",
            get(move || {
                let flag = Flag(Arc::clone(&seen));
                async move {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    drop(flag);
                    "late"
                }
            }),
        );
        let s = server(app).await;
        let mut c = TcpStream::connect(s.addr).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(c);
        wait_for(&dropped).await;
        // And one that hangs up before its body ended.
        dropped.store(false, Ordering::SeqCst);
        let mut c = TcpStream::connect(s.addr).await.expect("connect");
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(c);
        wait_for(&dropped).await;
        assert_eq!(handed(&s), 0);
    }

    async fn wait_for(flag: &AtomicBool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !flag.load(Ordering::SeqCst) {
            assert!(tokio::time::Instant::now() < deadline, "still running");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_stop_closes_idle_connections_and_finishes_the_request_in_flight() {
        let app = Router::new().route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "done"
            }),
        );
        let s = server(app).await;
        let mut idle = TcpStream::connect(s.addr).await.expect("connect");
        let mut busy = TcpStream::connect(s.addr).await.expect("connect");
        busy.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.stop.send(true).expect("stop");
        assert_eq!(read_to_close(&mut idle).await, "");
        let got = read_to_close(&mut busy).await;
        assert!(got.contains("connection: close\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\ndone"), "{got:?}");
    }
}
