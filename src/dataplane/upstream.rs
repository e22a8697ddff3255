//! Keep-alive HTTP/1.1 connections to backends, driven inside the request
//! that uses them.
//!
//! hyper's pooled client runs each connection as a task of its own and
//! hands a response over to the request's task one HTTP chunk at a time,
//! one task switch each: per request two tasks, and per streamed event one
//! write to the client (hyper's server flushes whenever the body it
//! relays is pending). Here the connection's future is polled by whoever
//! waits on it (the attempt for the head, the relay through
//! [`UpstreamBody`] for the body), so every event already received is
//! relayed before the client side flushes, and a request is one task.
//!
//! The pool is per data-plane thread (each runs its own single-threaded
//! runtime): idle connections are kept per backend address and setting,
//! at most [`MAX_IDLE_PER_KEY`] each for [`IDLE_TIMEOUT`], and checked
//! before reuse (a connection the backend closed meanwhile is dropped).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use zonegate_net::tls::BackendTls;

use crate::dataplane::forward::{connector, Connector};

/// How long an idle connection is kept (the old pooled client's setting).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per backend.
pub const MAX_IDLE_PER_KEY: usize = 256;
/// Every this many releases, idle connections of every backend are swept
/// (those of a backend no longer used would otherwise linger).
const SWEEP_EVERY: u32 = 1024;

/// Where a request goes: which connections can serve it (same address,
/// same dialling). Borrowed from the backend for each request.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub scheme: &'a Scheme,
    pub authority: &'a Authority,
    pub connect_timeout: Duration,
    pub tls: &'a BackendTls,
}

/// A [`Target`] owned by its connections.
#[derive(Clone, Debug, PartialEq)]
struct Key {
    scheme: Scheme,
    authority: Authority,
    connect_timeout: Duration,
    tls: BackendTls,
}

impl Key {
    fn of(t: Target<'_>) -> Self {
        Self {
            scheme: t.scheme.clone(),
            authority: t.authority.clone(),
            connect_timeout: t.connect_timeout,
            tls: t.tls.clone(),
        }
    }

    fn is(&self, t: Target<'_>) -> bool {
        self.authority == *t.authority
            && self.scheme == *t.scheme
            && self.connect_timeout == t.connect_timeout
            && self.tls == *t.tls
    }
}

type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// One HTTP/1.1 connection: its request sender and its connection future,
/// which must be polled for anything to move.
pub struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: Driver,
    key: Key,
    /// The connection future finished: the connection is closed.
    closed: bool,
}

impl Conn {
    /// Moves the connection along; notes when it ends.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.closed && self.driver.as_mut().poll(cx).is_ready() {
            self.closed = true;
        }
    }

    /// Still open and ready for another request (checked without waiting).
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        self.drive(&mut cx);
        !self.closed && matches!(self.sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }

    /// Sends `req` and waits for the response head, driving the connection.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> hyper::Result<Response<Incoming>> {
        let mut response = std::pin::pin!(self.sender.send_request(req));
        std::future::poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

#[derive(Default)]
struct Pool {
    /// One connector per dialling setting: building one loads the system's
    /// CA certificates.
    connectors: Vec<(Duration, BackendTls, Connector)>,
    idle: Vec<(Key, Vec<Idle>)>,
    releases: u32,
}

impl Pool {
    fn connector(&mut self, connect_timeout: Duration, tls: &BackendTls) -> Connector {
        if let Some((_, _, c)) = self
            .connectors
            .iter()
            .find(|(t, s, _)| *t == connect_timeout && s == tls)
        {
            return c.clone();
        }
        let c = connector(connect_timeout, tls);
        self.connectors
            .push((connect_timeout, tls.clone(), c.clone()));
        c
    }

    fn take(&mut self, target: Target<'_>) -> Option<Conn> {
        let (_, list) = self.idle.iter_mut().find(|(k, _)| k.is(target))?;
        // Most recent first: the least likely to have been closed.
        while let Some(Idle { mut conn, since }) = list.pop() {
            if since.elapsed() < IDLE_TIMEOUT && conn.reusable() {
                return Some(conn);
            }
        }
        None
    }

    fn put(&mut self, mut conn: Conn) {
        self.releases = self.releases.wrapping_add(1);
        if self.releases % SWEEP_EVERY == 0 {
            for (_, list) in &mut self.idle {
                list.retain(|i| i.since.elapsed() < IDLE_TIMEOUT);
            }
            self.idle.retain(|(_, list)| !list.is_empty());
        }
        if !conn.reusable() {
            return;
        }
        let idle = Idle {
            since: Instant::now(),
            conn,
        };
        match self.idle.iter_mut().find(|(k, _)| *k == idle.conn.key) {
            Some((_, list)) => {
                list.retain(|i| i.since.elapsed() < IDLE_TIMEOUT);
                if list.len() < MAX_IDLE_PER_KEY {
                    list.push(idle);
                }
            }
            None => self.idle.push((idle.conn.key.clone(), vec![idle])),
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

/// An idle connection to `target` if one is still open (`true`: reused),
/// else a new one.
pub async fn checkout(target: Target<'_>) -> Result<(Conn, bool), ConnectError> {
    if let Some(conn) = POOL.with(|p| p.borrow_mut().take(target)) {
        return Ok((conn, true));
    }
    connect(target).await.map(|c| (c, false))
}

/// A new connection to `target`.
pub async fn connect(target: Target<'_>) -> Result<Conn, ConnectError> {
    let mut dial = POOL.with(|p| p.borrow_mut().connector(target.connect_timeout, target.tls));
    let uri = Uri::builder()
        .scheme(target.scheme.clone())
        .authority(target.authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| ConnectError(format!("bad backend address: {e}")))?;
    let io = dial
        .ready()
        .await
        .map_err(|e| ConnectError(crate::dataplane::forward::source_chain(&*e)))?
        .call(uri)
        .await
        .map_err(|e| ConnectError(crate::dataplane::forward::source_chain(&*e)))?;
    let (sender, connection) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| ConnectError(crate::dataplane::forward::source_chain(&e)))?;
    Ok(Conn {
        sender,
        driver: Box::pin(connection),
        key: Key::of(target),
        closed: false,
    })
}

/// A backend's response body with the connection it arrives on: polling
/// the body drives the connection, and a body read to its end gives the
/// connection back to this thread's pool (dropped earlier, the connection
/// is closed).
pub struct UpstreamBody {
    body: Incoming,
    conn: Option<Conn>,
}

impl UpstreamBody {
    pub fn new(body: Incoming, conn: Conn) -> Self {
        Self {
            body,
            conn: Some(conn),
        }
    }

    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            POOL.with(|p| p.borrow_mut().put(conn));
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = this.conn.as_mut() {
            conn.drive(cx);
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // A body read whole (a plain answer's `Content-Length` reached,
        // or its end seen) leaves the connection ready for the next
        // request; anything else closes it with the drop.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
