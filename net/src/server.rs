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
pub(crate) enum Parse {
    Complete(Parsed),
    Partial,
    NotOurs,
}

/// A request head this server takes; header spans are in `spans`.
pub(crate) struct Parsed {
    pub(crate) method: Method,
    pub(crate) path: Range<usize>,
    pub(crate) head_len: usize,
    pub(crate) body_len: usize,
    /// The client asked to close after the response.
    pub(crate) close: bool,
}

pub(crate) fn parse(buf: &[u8], spans: &mut Vec<Span>) -> Parse {
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
pub(crate) fn may_end_head(buf: &[u8], from: usize) -> bool {
    buf.len() >= MAX_HEAD || crate::http1::may_end_head(buf, from)
}

/// Who answers a request, and what they are handed.
pub(crate) enum Call<'a, P> {
    /// A POST to a path of the listener's [`Plain`] handler.
    Plain(&'a P, PlainRequest),
    /// Anything else: the app's, as an `http` request.
    App(Request<Body>),
}

/// The call for a parsed request; `None` when `http` refuses a part.
pub(crate) fn call<'a, P: Plain>(
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
                // The poll that said "pending" registered this task with
                // everything the body waits on; a write that goes out
                // without waiting leaves those registrations standing, so
                // the body is not asked again until the task is woken.
                let mut registered = true;
                if !out.is_empty() {
                    match write_out(io, out).await {
                        Ok(waited) => registered = !waited,
                        Err(_) => return false,
                    }
                    out.clear();
                }
                match next_frame(io, buf, body, &mut watching, registered).await {
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

/// Writes all of `out`, as `write_all` does; `Ok(true)` when the socket
/// was full at some point and the task waited for it (a wake-up meant for
/// something else may have been taken meanwhile).
async fn write_out<I: AsyncWrite + Unpin>(io: &mut I, out: &[u8]) -> io::Result<bool> {
    let mut written = 0;
    let mut waited = false;
    poll_fn(|cx| {
        while written < out.len() {
            match Pin::new(&mut *io).poll_write(cx, &out[written..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    waited = true;
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(waited))
    })
    .await
}

/// The body's next frame, or `None` when the client hung up first.
/// `registered`: the body said "pending" to this task since it last woke,
/// so its first poll here is skipped (it would only register again).
async fn next_frame<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    body: &mut Body,
    watching: &mut bool,
    mut registered: bool,
) -> Option<Frame> {
    poll_fn(|cx| {
        if !std::mem::take(&mut registered) {
            if let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(cx) {
                return Poll::Ready(Some(frame));
            }
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
mod tests;
