//! Keep-alive HTTP/1.1 connections to backends, pooled per data-plane
//! thread.
//!
//! Each data-plane thread runs its own single-threaded runtime, so its
//! pool needs no lock: idle connections are kept per backend address and
//! dialling setting, most recent last, at most [`MAX_IDLE_PER_KEY`] each
//! for [`IDLE_TIMEOUT`] (a task per thread closes older ones every 30 s).
//! Each connection runs as a task of its own (hyper's `http1`
//! connection), which notices a backend's close while idle. A connection
//! goes back to the pool when the response body it carried has been read
//! to its end; one dropped earlier closes with it.
//!
//! This replaces hyper-util's pooled client, which per request took a
//! mutex, hashed its key three times (we hash the address once) and
//! spawned a task that waited for the connection to be ready again. Its
//! one safety net is kept: a request that a reused connection could not
//! send (its task saw the backend close it) is sent once more on a new
//! connection, as no byte of it reached the backend. As with that client,
//! a close that crosses a request already written (the backend's idle
//! timeout expiring just then) fails the attempt as a reset, and the
//! retry loop moves on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use zonegate_net::tls::BackendTls;

use crate::dataplane::forward::{connector, source_chain, Connector};

/// How long an idle connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per backend and dialling setting.
pub const MAX_IDLE_PER_KEY: usize = 256;
/// The largest error answer read in the background to keep its
/// connection ([`UpstreamBody::drain_in_background`]), and for how long.
const MAX_DRAIN: u64 = 16 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Drains running at once, at most (beyond, the connection just closes):
/// a backend that trickles its error answers must not make the gateway
/// hold a connection per failed request.
const MAX_DRAINS: usize = 128;
static DRAINING: AtomicUsize = AtomicUsize::new(0);

/// One running drain, counted in [`DRAINING`] until dropped.
struct Draining;

impl Draining {
    fn begin() -> Option<Self> {
        DRAINING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_DRAINS).then_some(n + 1)
            })
            .ok()
            .map(|_| Self)
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        DRAINING.fetch_sub(1, Ordering::AcqRel);
    }
}
/// How often idle connections past [`IDLE_TIMEOUT`] are closed, traffic
/// or not (those of a backend no longer used would otherwise stay open).
const SWEEP_PERIOD: Duration = Duration::from_secs(30);

/// Where a request goes: which connections can serve it. Borrowed from
/// the backend for each request.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub scheme: &'a Scheme,
    pub authority: &'a Authority,
    pub connect_timeout: Duration,
    pub tls: &'a BackendTls,
}

/// How a [`Target`]'s connections are dialled: connections to one
/// address are shared only by requests that would dial them alike.
#[derive(Clone, Debug, PartialEq)]
struct Setting {
    scheme: Scheme,
    connect_timeout: Duration,
    tls: BackendTls,
}

impl Setting {
    fn of(t: Target<'_>) -> Self {
        Self {
            scheme: t.scheme.clone(),
            connect_timeout: t.connect_timeout,
            tls: t.tls.clone(),
        }
    }

    fn is(&self, t: Target<'_>) -> bool {
        self.scheme == *t.scheme && self.connect_timeout == t.connect_timeout && self.tls == *t.tls
    }
}

/// One HTTP/1.1 connection; its I/O runs in a task of its own.
pub struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    authority: Authority,
    setting: Setting,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

impl Idle {
    fn usable(&self) -> bool {
        self.since.elapsed() < IDLE_TIMEOUT && !self.conn.sender.is_closed()
    }
}

#[derive(Default)]
struct Pool {
    /// One connector per dialling setting: building one loads the
    /// system's CA certificates.
    connectors: Vec<(Duration, BackendTls, Connector)>,
    /// Idle connections by backend address as configured (hashed as one
    /// short string, at any number of backends; `Authority`'s own hash
    /// lowercases byte by byte), then by setting (almost always one),
    /// most recent last.
    idle: HashMap<Box<str>, Vec<(Setting, Vec<Idle>)>>,
    /// The thread's sweeping task is running.
    sweeping: bool,
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
        let settings = self.idle.get_mut(target.authority.as_str())?;
        let (_, list) = settings.iter_mut().find(|(s, _)| s.is(target))?;
        // Most recent first: the least likely to have been closed.
        while let Some(idle) = list.pop() {
            if idle.usable() {
                return Some(idle.conn);
            }
        }
        None
    }

    /// Closes the idle connections past their time or already closed.
    fn sweep(&mut self) {
        self.idle.retain(|_, settings| {
            for (_, list) in settings.iter_mut() {
                list.retain(Idle::usable);
            }
            settings.retain(|(_, list)| !list.is_empty());
            !settings.is_empty()
        });
    }

    fn put(&mut self, conn: Conn) {
        if !self.sweeping {
            self.sweeping = start_sweeping();
        }
        if !self.idle.contains_key(conn.authority.as_str()) {
            self.idle.insert(conn.authority.as_str().into(), Vec::new());
        }
        // Present: inserted just above if it was not.
        let Some(settings) = self.idle.get_mut(conn.authority.as_str()) else {
            return;
        };
        let idle = Idle {
            since: Instant::now(),
            conn,
        };
        match settings.iter_mut().find(|(s, _)| *s == idle.conn.setting) {
            Some((_, list)) if list.len() < MAX_IDLE_PER_KEY => list.push(idle),
            Some(_) => {}
            None => settings.push((idle.conn.setting.clone(), vec![idle])),
        }
    }
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// Starts the task that sweeps the pool of the thread it runs on (a
/// data-plane thread's single-threaded runtime keeps it on the pool's
/// own); `false` outside a runtime.
fn start_sweeping() -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    runtime.spawn(async {
        loop {
            tokio::time::sleep(SWEEP_PERIOD).await;
            if POOL.try_with(|p| p.borrow_mut().sweep()).is_err() {
                return;
            }
        }
    });
    true
}

/// Gives a connection whose response was read whole back to this
/// thread's pool, once it can take the next request. It usually can at
/// once; if its task has not yet caught up, a small task waits for it.
/// A body dropped while its thread or runtime shuts down just closes its
/// connection.
fn release(mut conn: Conn) {
    if conn.sender.is_ready() {
        let _ = POOL.try_with(|p| p.borrow_mut().put(conn));
    } else if !conn.sender.is_closed() {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if conn.sender.ready().await.is_ok() {
                    let _ = POOL.try_with(|p| p.borrow_mut().put(conn));
                }
            });
        }
    }
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made.
    #[error("{0}")]
    Connect(String),
    /// The connection failed before a response head arrived.
    #[error("{0}")]
    Reset(String),
}

/// Sends `req` (origin-form URI, `Host` set) to `target` on an idle
/// connection of this thread, or a new one, and waits for the response
/// head. The body carries the connection back to the pool when read to
/// its end.
pub async fn send(
    target: Target<'_>,
    req: Request<Full<Bytes>>,
) -> Result<Response<UpstreamBody>, SendError> {
    let idle = POOL.with(|p| p.borrow_mut().take(target));
    let (mut conn, req) = match idle {
        Some(mut conn) => match conn.sender.try_send_request(req).await {
            Ok(resp) => return Ok(with_conn(resp, conn)),
            Err(mut e) => match e.take_message() {
                // Not sent: the backend closed the connection while it
                // was idle. A new one may take it.
                Some(req) => (Box::pin(connect(target)).await?, req),
                None => return Err(SendError::Reset(source_chain(e.error()))),
            },
        },
        // Boxed: dialling's future is large and rare; inline, it would be
        // part of (and copied with) every request's future.
        None => (Box::pin(connect(target)).await?, req),
    };
    match conn.sender.send_request(req).await {
        Ok(resp) => Ok(with_conn(resp, conn)),
        Err(e) => Err(SendError::Reset(source_chain(&e))),
    }
}

fn with_conn(resp: Response<Incoming>, conn: Conn) -> Response<UpstreamBody> {
    resp.map(|body| UpstreamBody {
        body,
        conn: Some(conn),
    })
}

/// A new connection to `target`, its task spawned.
async fn connect(target: Target<'_>) -> Result<Conn, SendError> {
    let mut dial = POOL.with(|p| p.borrow_mut().connector(target.connect_timeout, target.tls));
    let uri = Uri::builder()
        .scheme(target.scheme.clone())
        .authority(target.authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| SendError::Connect(format!("bad backend address: {e}")))?;
    let io = dial
        .ready()
        .await
        .map_err(|e| SendError::Connect(source_chain(&*e)))?
        .call(uri)
        .await
        .map_err(|e| SendError::Connect(source_chain(&*e)))?;
    let (sender, connection) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| SendError::Connect(source_chain(&e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("backend connection ended: {e}");
        }
    });
    Ok(Conn {
        sender,
        authority: target.authority.clone(),
        setting: Setting::of(target),
    })
}

/// A backend's response body with the connection it arrives on: read to
/// its end, it gives the connection back to the pool; dropped earlier,
/// the connection closes.
pub struct UpstreamBody {
    body: Incoming,
    conn: Option<Conn>,
}

impl UpstreamBody {
    /// Reads the rest of a small answer nobody needs (a 429 or a 5xx) in a
    /// task of its own, so that its connection goes back to the pool
    /// instead of closing: under a storm of such answers each would
    /// otherwise cost the struggling backend a new connection (and a TLS
    /// handshake). The caller moves on at once. A body of unknown or
    /// larger length, one slower than a second, or one beyond
    /// 128 running drains closes its connection.
    pub fn drain_in_background(self) {
        let small = self
            .body
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_DRAIN);
        if self.body.is_end_stream() || !small {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(draining) = Draining::begin() else {
            return;
        };
        let mut body = self;
        runtime.spawn(async move {
            let _draining = draining;
            let read = async {
                while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, read).await;
        });
    }

    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            release(conn);
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
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.release();
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
        // A plain answer's `Content-Length` reached leaves the connection
        // ready for the next request even if its end was never polled.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A POST of `path` to the plain-HTTP backend at `addr` through this
    /// thread's pool.
    pub(crate) async fn send_to(
        addr: SocketAddr,
        path: &str,
    ) -> Result<Response<UpstreamBody>, SendError> {
        send_with(addr, path, Duration::from_secs(5)).await
    }

    /// As `send_to`, dialling with `connect_timeout`.
    async fn send_with(
        addr: SocketAddr,
        path: &str,
        connect_timeout: Duration,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let authority = Authority::try_from(addr.to_string()).expect("authority");
        let target = Target {
            scheme: &Scheme::HTTP,
            authority: &authority,
            connect_timeout,
            tls: &BackendTls::default(),
        };
        let req = Request::post(path)
            .header(http::header::HOST, addr.to_string())
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        send(target, req).await
    }

    /// A backend that answers every request on a connection with `answer`
    /// (raw bytes) and counts the connections it accepted; after
    /// `per_connection` answers it closes the connection.
    async fn backend(
        answer: &'static [u8],
        per_connection: usize,
    ) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    for _ in 0..per_connection {
                        // Each test request is one small write.
                        if s.read(&mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    async fn read_whole(resp: Response<UpstreamBody>) -> Bytes {
        resp.into_body().collect().await.expect("body").to_bytes()
    }

    #[tokio::test]
    async fn a_connection_whose_answer_was_read_whole_carries_the_next_request() {
        let (addr, accepted) = backend(OK, usize::MAX).await;
        for _ in 0..5 {
            let resp = send_to(addr, "/v1/chat/completions").await.expect("answer");
            assert_eq!(read_whole(resp).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn requests_that_dial_differently_never_share_a_connection() {
        let (addr, accepted) = backend(OK, usize::MAX).await;
        for timeout in [5, 6, 5, 6] {
            let resp = send_with(addr, "/", Duration::from_secs(timeout))
                .await
                .expect("answer");
            assert_eq!(read_whole(resp).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "one per setting");
    }

    #[tokio::test]
    async fn a_small_error_answer_drained_in_the_background_keeps_its_connection() {
        const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\n\r\nbusy!";
        let (addr, accepted) = backend(BUSY, usize::MAX).await;
        let authority = addr.to_string();
        let idle = || {
            POOL.with(|p| {
                p.borrow()
                    .idle
                    .get(authority.as_str())
                    .map_or(0, |s| s.iter().map(|(_, l)| l.len()).sum::<usize>())
            })
        };
        for _ in 0..3 {
            let resp = send_to(addr, "/").await.expect("answer");
            assert_eq!(resp.status(), http::StatusCode::SERVICE_UNAVAILABLE);
            resp.into_body().drain_in_background();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while idle() == 0 {
                assert!(std::time::Instant::now() < deadline, "never pooled");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_content_length_answer_dropped_at_its_end_still_returns_its_connection() {
        // hyper's server stops polling a body once `Content-Length` bytes
        // were written: the end is never polled, only reached.
        let (addr, accepted) = backend(OK, usize::MAX).await;
        for _ in 0..3 {
            let mut body = send_to(addr, "/").await.expect("answer").into_body();
            let frame = body.frame().await.expect("frame").expect("data");
            assert_eq!(frame.into_data().expect("data"), "ok");
            assert!(body.is_end_stream());
            drop(body);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_is_not_reused() {
        // One answer per connection, then the backend closes it.
        let (addr, accepted) = backend(OK, 1).await;
        for i in 1..=4 {
            let resp = send_to(addr, "/").await.expect("answer, not a reset");
            assert_eq!(read_whole(resp).await, "ok");
            assert_eq!(accepted.load(Ordering::SeqCst), i);
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    #[tokio::test]
    async fn an_idle_connection_past_its_time_is_closed_by_the_sweep() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            s.write_all(OK).await.expect("write");
            // The next read ends when the gateway closes the connection.
            while s.read(&mut buf).await.unwrap_or(0) > 0 {}
            let _ = closed_tx.send(());
        });
        let resp = send_to(addr, "/").await.expect("answer");
        assert_eq!(read_whole(resp).await, "ok");
        let authority = addr.to_string();
        POOL.with(|p| {
            let mut pool = p.borrow_mut();
            let settings = pool.idle.get_mut(authority.as_str()).expect("pooled");
            let idle = &mut settings[0].1[0];
            idle.since = Instant::now()
                .checked_sub(IDLE_TIMEOUT + Duration::from_secs(1))
                .expect("an instant in the past");
            pool.sweep();
            assert!(pool.idle.is_empty());
        });
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the backend sees the connection closed")
            .expect("signal");
    }

    #[tokio::test]
    async fn an_answer_dropped_before_its_end_closes_its_connection() {
        const PARTIAL: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n";
        let (addr, accepted) = backend(PARTIAL, usize::MAX).await;
        let mut body = send_to(addr, "/").await.expect("answer").into_body();
        assert!(body.frame().await.is_some());
        drop(body);
        let mut body = send_to(addr, "/").await.expect("answer").into_body();
        assert!(body.frame().await.is_some());
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a half-read connection is never reused"
        );
    }
}
