//! Keep-alive HTTP/1.1 connections to backends, pooled per data-plane
//! thread.
//!
//! Each data-plane thread runs its own single-threaded runtime, so its
//! pool needs no lock: idle connections are kept per backend address and
//! dialling setting, most recent last, at most [`MAX_IDLE_PER_KEY`] each
//! for 60 to 90 s ([`IDLE_SWEEPS`] of the task that sweeps each thread's
//! pool every 30 s: an idle connection's age is counted in sweeps, so
//! neither pooling nor taking one reads the clock).
//! A connection has no task of its own: the request's task writes the
//! request and reads the answer (`wire` parses it), and the response body
//! reads its bytes from the socket as it is polled (nginx's way; hyper's
//! connection task cost a task switch each way and ~15k instructions per
//! request). A connection goes back to the pool when the body it carried
//! has been read to its end; one dropped earlier closes with it. An idle
//! connection is looked at (one read that must find nothing) when it is
//! taken and at each sweep: one the backend closed meanwhile, or that
//! carries bytes nobody asked for, is closed, and the request goes on a
//! new connection, as no byte of it was sent.
//!
//! This replaces hyper-util's pooled client, which per request took a
//! mutex, hashed its key three times (we hash the address once) and
//! spawned a task that waited for the connection to be ready again. As
//! with that client, a close that crosses a request already written (the
//! backend's idle timeout expiring just then) fails the attempt as a
//! reset, and the retry loop moves on. The request is written whole before
//! the answer is read: a backend that answers early and stops reading a
//! body larger than the socket's buffers fails the write (a reset) rather
//! than being answered.

#[doc(hidden)]
pub mod fuzzing;
mod wire;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::uri::{Authority, Scheme};
use http::{StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncWriteExt;
use tower::{Service, ServiceExt};
use zonegate_net::http1::HeadLines;
use zonegate_net::tls::BackendTls;

use crate::dataplane::connect::{connector, is_refused, source_chain, Connector, Dialled};
use crate::provider::Notes;

/// An idle connection is closed by the sweep that makes it this many
/// sweeps old, and not taken once it is: after 60 to 90 s of idleness.
pub const IDLE_SWEEPS: u64 = 3;
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
/// How often idle connections past [`IDLE_SWEEPS`] are closed, traffic
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

/// A dialled stream: TCP, or TLS over TCP for `https://` backends.
type Stream = Dialled;

/// One HTTP/1.1 connection.
pub struct Conn {
    io: Stream,
    /// Bytes read and not yet taken by the answer they belong to (none
    /// between answers).
    buf: BytesMut,
    /// Scratch space for the header spans of each answer's head.
    spans: Vec<zonegate_net::http1::Span>,
    authority: Authority,
    setting: Setting,
}

impl Conn {
    /// Reads into `buf`'s free space; 0 is the end of the stream.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        zonegate_net::http1::poll_read(&mut self.io, &mut self.buf, cx)
    }

    /// An idle connection can take a request: reading it finds nothing
    /// (not the backend's close, not bytes nobody asked for).
    fn is_quiet(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.buf.is_empty() && self.poll_read(&mut cx).is_pending()
    }
}

struct Idle {
    conn: Box<Conn>,
    /// The pool's sweeps when it went idle.
    since: u64,
}

impl Idle {
    /// Young enough (`sweeps`: the pool's now) and quiet.
    fn usable(&mut self, sweeps: u64) -> bool {
        sweeps - self.since < IDLE_SWEEPS && self.conn.is_quiet()
    }
}

type FastHash = foldhash::fast::RandomState;
/// One address's idle connections, by dialling setting.
type BySetting = Vec<(Setting, Vec<Idle>)>;

#[derive(Default)]
struct Pool {
    /// One connector per dialling setting: building one loads the
    /// system's CA certificates.
    connectors: Vec<(Duration, BackendTls, Connector)>,
    /// Idle connections by backend address as configured (hashed as one
    /// short string, at any number of backends; `Authority`'s own hash
    /// lowercases byte by byte), then by setting (almost always one),
    /// most recent last. Keys come from the config, never from clients,
    /// so the fast hash needs no flood resistance (SipHash cost more than
    /// the lookup it served, twice per request).
    idle: HashMap<Box<str>, BySetting, FastHash>,
    /// The thread's sweeping task is running.
    sweeping: bool,
    /// Sweeps so far: the pool's clock.
    sweeps: u64,
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

    fn take(&mut self, target: Target<'_>) -> Option<Box<Conn>> {
        let settings = self.idle.get_mut(target.authority.as_str())?;
        let (_, list) = settings.iter_mut().find(|(s, _)| s.is(target))?;
        // Most recent first: the least likely to have been closed.
        while let Some(mut idle) = list.pop() {
            if idle.usable(self.sweeps) {
                return Some(idle.conn);
            }
        }
        None
    }

    /// Closes the idle connections past their time or already closed.
    fn sweep(&mut self) {
        self.sweeps += 1;
        let sweeps = self.sweeps;
        self.idle.retain(|_, settings| {
            for (_, list) in settings.iter_mut() {
                list.retain_mut(|idle| idle.usable(sweeps));
            }
            settings.retain(|(_, list)| !list.is_empty());
            !settings.is_empty()
        });
    }

    fn put(&mut self, conn: Box<Conn>) {
        if !self.sweeping {
            self.sweeping = start_sweeping();
        }
        let key = conn.authority.as_str();
        let settings = match self.idle.get_mut(key) {
            Some(settings) => settings,
            None => self.idle.entry(key.into()).or_default(),
        };
        let idle = Idle {
            since: self.sweeps,
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
/// thread's pool (not when the thread is shutting down).
fn release(conn: Box<Conn>) {
    let _ = POOL.try_with(|p| p.borrow_mut().put(conn));
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made.
    #[error("{0}")]
    Connect(String),
    /// The connect was refused: nothing listens at the address.
    #[error("{0}")]
    Refused(String),
    /// The connection failed before a response head arrived.
    #[error("{0}")]
    Reset(String),
}

/// Bodies up to this size go out in one write with their head.
const COPY_BODY: usize = 16 * 1024;

thread_local! {
    /// The buffer requests are written from, reused by this thread's
    /// requests: taken while one request is written, then given back (a
    /// request written meanwhile, or dropped mid-write, uses its own).
    static OUT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// POSTs `body` to `path` (origin-form) at `target` with the header lines
/// `headers` writes (`Host` among them, hop-by-hop ones left out) on an
/// idle connection of this thread, or a new one, and waits for the
/// response head. The body carries the
/// connection back to the pool when read to its end.
pub async fn send(
    target: Target<'_>,
    path: &str,
    headers: impl FnOnce(&mut Vec<u8>),
    body: &[u8],
) -> Result<BackendResponse, SendError> {
    let mut out = OUT.take();
    out.clear();
    out.reserve(512 + body.len().min(COPY_BODY));
    wire::encode_request(&mut out, path, headers, body.len());
    let copied = body.len() <= COPY_BODY;
    if copied {
        out.extend_from_slice(body);
    }
    let idle = POOL.with(|p| p.borrow_mut().take(target));
    let mut conn = match idle {
        Some(conn) => conn,
        // Boxed: dialling's future is large and rare; inline, it would be
        // part of (and copied with) every request's future.
        None => Box::pin(connect(target)).await?,
    };
    let written = async {
        conn.io.write_all(&out).await?;
        if !copied {
            conn.io.write_all(body).await?;
        }
        conn.io.flush().await
    };
    let written = written.await;
    OUT.set(out);
    if let Err(e) = written {
        return Err(SendError::Reset(format!("writing the request: {e}")));
    }
    let mut scan = wire::HeadScan::default();
    let head = loop {
        match wire::parse_head(&mut conn.buf, &mut conn.spans, &mut scan) {
            Ok(Some(head)) => break head,
            Ok(None) => {}
            Err(e) => return Err(SendError::Reset(format!("the backend's answer: {e}"))),
        }
        match poll_fn(|cx| conn.poll_read(cx)).await {
            Ok(0) => {
                return Err(SendError::Reset(
                    "the backend closed the connection before answering".into(),
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(SendError::Reset(format!("reading the answer: {e}"))),
        }
    };
    Ok(BackendResponse {
        status: head.status,
        lines: head.lines,
        body: UpstreamBody {
            conn: Some(conn),
            decoder: head.decoder,
            keep_alive: head.keep_alive,
            translate: None,
            translated_all: None,
        },
    })
}

/// A backend's answer, its head read: the headers to pass on as their
/// lines (see `wire`), and the body still on the connection.
pub struct BackendResponse {
    pub status: StatusCode,
    pub lines: HeadLines,
    pub body: UpstreamBody,
}

/// A new connection to `target`.
async fn connect(target: Target<'_>) -> Result<Box<Conn>, SendError> {
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
        .map_err(|e| connect_error(&*e))?
        .call(uri)
        .await
        .map_err(|e| connect_error(&*e))?;
    Ok(Box::new(Conn {
        io: Dialled::from(io),
        buf: BytesMut::new(),
        spans: Vec::new(),
        authority: target.authority.clone(),
        setting: Setting::of(target),
    }))
}

fn connect_error(e: &(dyn std::error::Error + Send + Sync + 'static)) -> SendError {
    if is_refused(e) {
        SendError::Refused(source_chain(e))
    } else {
        SendError::Connect(source_chain(e))
    }
}

/// A backend's response body with the connection it arrives on: read to
/// its end, it gives the connection back to the pool; dropped earlier,
/// the connection closes.
pub struct UpstreamBody {
    /// `None` once the body ended or failed. Boxed: the stream (with its
    /// TLS state) is over a kilobyte, and the body moves with the answer
    /// through several layers.
    conn: Option<Box<Conn>>,
    decoder: wire::Decoder,
    /// The answer lets its connection carry another request.
    keep_alive: bool,
    /// A provider's stream in another format, translated chunk by chunk
    /// (`dataplane::provider`); `None` for an OpenAI-format answer.
    translate: Option<Box<dyn Translate>>,
    /// The translation once the body ended: kept for the notes of its
    /// last chunks, which the relay may take after the end was read.
    translated_all: Option<Box<dyn Translate>>,
}

/// Turns a provider's body, chunk by chunk, into the one the client gets.
pub trait Translate: Send {
    /// The client's bytes for the next chunk (empty while an event is
    /// incomplete); `Err` fails the body as a broken answer would.
    fn data(&mut self, data: &[u8]) -> Result<Bytes, String>;
    /// The client's bytes at the body's end.
    fn end(&mut self) -> Result<Bytes, String>;
    /// What the client's bytes given since the notes were last cleared
    /// say, when this translation notes it (see [`Notes`]); the reader
    /// clears them.
    fn notes(&mut self) -> Option<&mut Notes> {
        None
    }
    /// Nobody will take the notes: stop making them.
    fn stop_notes(&mut self) {}
}

impl UpstreamBody {
    /// The body's chunks go through `t` on their way out.
    pub fn translate(&mut self, t: Box<dyn Translate>) {
        self.translate = Some(t);
    }

    /// What the translated bytes given since the notes were last cleared
    /// say (`None`: not translated, or not noted).
    pub fn notes(&mut self) -> Option<&mut Notes> {
        self.translate
            .as_mut()
            .or(self.translated_all.as_mut())?
            .notes()
    }

    /// Whether a poll may give something without reading the socket: bytes
    /// read and not yet decoded, or a translation (which may hold output).
    pub fn buffered(&self) -> bool {
        self.translate.is_some() || self.conn.as_ref().is_some_and(|c| !c.buf.is_empty())
    }

    /// The notes are not wanted (see [`Translate::stop_notes`]).
    pub fn stop_notes(&mut self) {
        if let Some(t) = self.translate.as_mut() {
            t.stop_notes();
        }
        self.translated_all = None;
    }

    /// A translated chunk, or the end's bytes; `None` when there is
    /// nothing to give yet.
    fn translated(
        &mut self,
        data: Option<Bytes>,
    ) -> Option<Poll<Option<io::Result<Frame<Bytes>>>>> {
        let t = self.translate.as_mut()?;
        let out = match data {
            Some(d) => t.data(&d),
            None => {
                let out = t.end();
                self.translated_all = self.translate.take();
                out
            }
        };
        Some(match out {
            Ok(b) if b.is_empty() => return None,
            Ok(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Err(e) => {
                self.translate = None;
                self.fail(io::ErrorKind::InvalidData, e)
            }
        })
    }

    /// Reads the rest of a small answer nobody needs (a 429 or a 5xx) in a
    /// task of its own, so that its connection goes back to the pool
    /// instead of closing: under a storm of such answers each would
    /// otherwise cost the struggling backend a new connection (and a TLS
    /// handshake). The caller moves on at once. A body of unknown or
    /// larger length, one slower than a second, or one beyond
    /// 128 running drains closes its connection.
    pub fn drain_in_background(self) {
        let small = self.size_hint().exact().is_some_and(|n| n <= MAX_DRAIN);
        if self.is_end_stream() || !small {
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

    /// The body was read to its end: its connection goes back to the pool
    /// if nothing says it cannot carry another request.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && self.decoder.is_done() && conn.buf.is_empty() {
                release(conn);
            }
        }
    }

    /// Fails the body: its connection closes.
    fn fail(
        &mut self,
        kind: io::ErrorKind,
        e: impl ToString,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.conn = None;
        Poll::Ready(Some(Err(io::Error::new(kind, e.to_string()))))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                // Ended, or failed: a failed answer never reads as ended.
                return Poll::Ready(if this.decoder.is_done() {
                    None
                } else {
                    Some(Err(io::Error::other("the backend's answer already failed")))
                });
            };
            match this.decoder.step(&mut conn.buf) {
                Ok(wire::Step::Data(data)) if this.translate.is_none() => {
                    return Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Ok(wire::Step::Data(data)) => match this.translated(Some(data)) {
                    Some(ready) => return ready,
                    None => continue,
                },
                Ok(wire::Step::Done) => {
                    this.release();
                    if let Some(ready) = this.translated(None) {
                        return ready;
                    }
                    return Poll::Ready(None);
                }
                Ok(wire::Step::NeedMore) => {}
                Err(e) => return this.fail(io::ErrorKind::InvalidData, e),
            }
            match conn.poll_read(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => match this.decoder.eof() {
                    // Read to the close: the connection ends with it.
                    Ok(()) => {
                        this.conn = None;
                        if let Some(ready) = this.translated(None) {
                            return ready;
                        }
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(io::ErrorKind::UnexpectedEof, e),
                },
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e.kind(), e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done() && self.translate.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.translate.is_some() {
            // A translated body's length is not the provider's.
            return SizeHint::default();
        }
        match self.decoder {
            wire::Decoder::Length(n) => SizeHint::with_exact(n),
            wire::Decoder::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // A plain answer's `Content-Length` reached leaves the connection
        // ready for the next request even if its end was never polled.
        if self.decoder.is_done() {
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
    ) -> Result<BackendResponse, SendError> {
        send_with(addr, path, Duration::from_secs(5)).await
    }

    /// As `send_to`, dialling with `connect_timeout`.
    async fn send_with(
        addr: SocketAddr,
        path: &str,
        connect_timeout: Duration,
    ) -> Result<BackendResponse, SendError> {
        send_over(
            &Scheme::HTTP,
            &BackendTls::default(),
            addr,
            path,
            connect_timeout,
        )
        .await
    }

    /// As `send_to`, with `scheme` and `tls`.
    async fn send_over(
        scheme: &Scheme,
        tls: &BackendTls,
        addr: SocketAddr,
        path: &str,
        connect_timeout: Duration,
    ) -> Result<BackendResponse, SendError> {
        let authority = Authority::try_from(addr.to_string()).expect("authority");
        let target = Target {
            scheme,
            authority: &authority,
            connect_timeout,
            tls,
        };
        let host = addr.to_string();
        let headers =
            |out: &mut Vec<u8>| zonegate_net::http1::put_header(out, b"host", host.as_bytes());
        send(target, path, headers, &Bytes::from_static(b"{}")).await
    }

    /// A backend that answers every request on a connection with `answer`
    /// (raw bytes) and counts the connections it accepted; after
    /// `per_connection` answers it closes the connection.
    async fn backend(
        answer: &'static [u8],
        per_connection: usize,
    ) -> (SocketAddr, Arc<AtomicUsize>) {
        backend_over(None, answer, per_connection).await
    }

    /// As `backend`, over TLS when `tls` is given.
    async fn backend_over(
        tls: Option<tokio_rustls::TlsAcceptor>,
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
            while let Ok((s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => answer_on(s, answer, per_connection).await,
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(s).await {
                                answer_on(s, answer, per_connection).await;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn answer_on<S>(mut s: S, answer: &[u8], per_connection: usize)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
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
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    async fn read_whole(resp: BackendResponse) -> Bytes {
        resp.body.collect().await.expect("body").to_bytes()
    }

    #[tokio::test]
    async fn a_backend_that_sends_its_head_a_byte_at_a_time_costs_linear_work() {
        // A head of ~8 KiB, one byte per write, the backend yielding after
        // each so that the reader mostly finds one byte per read.
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..90 {
            head.extend_from_slice(format!("x-filler-{i}: {}\r\n", "v".repeat(80)).as_bytes());
        }
        head.extend_from_slice(b"content-length: 2\r\n\r\nok");
        let len = head.len();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let _ = s.set_nodelay(true);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            for b in head {
                if s.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        wire::EXAMINED.with(|e| e.set(0));
        let resp = send_to(addr, "/").await.expect("answer");
        let looked = wire::EXAMINED.with(std::cell::Cell::get);
        assert_eq!(resp.lines.iter().count(), 90);
        assert_eq!(read_whole(resp).await, "ok");
        assert!(
            looked <= 8 * len,
            "{looked} bytes looked at for a head of {len}"
        );
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
    async fn a_tls_connection_is_reused_after_its_session_tickets_arrive() {
        // TLS 1.3 servers send session tickets after the handshake: the
        // idle probe reads them and must still find the connection quiet.
        let issued =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(issued.key_pair.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(zonegate_net::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![issued.cert.der().clone()], key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (addr, accepted) = backend_over(Some(acceptor), OK, usize::MAX).await;
        let tls = BackendTls {
            insecure_skip_verify: true,
            ..BackendTls::default()
        };
        for _ in 0..3 {
            let resp = send_over(&Scheme::HTTPS, &tls, addr, "/", Duration::from_secs(5))
                .await
                .expect("answer");
            assert_eq!(read_whole(resp).await, "ok");
            // Idle long enough for anything the server sends unasked.
            tokio::time::sleep(Duration::from_millis(50)).await;
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
            assert_eq!(resp.status, http::StatusCode::SERVICE_UNAVAILABLE);
            resp.body.drain_in_background();
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
            let mut body = send_to(addr, "/").await.expect("answer").body;
            let frame = body.frame().await.expect("frame").expect("data");
            assert_eq!(frame.into_data().expect("data"), "ok");
            assert!(body.is_end_stream());
            drop(body);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn bytes_after_an_answers_end_keep_its_connection_out_of_the_pool() {
        // A backend that sends an answer nobody asked for behind the one
        // requested: taken whole and dropped at its end (as the respond
        // stage takes a whole JSON answer), its connection is not reused,
        // and no request ever reads the unasked answer.
        const SMUGGLED: &[u8] =
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nbad";
        let (addr, accepted) = backend(SMUGGLED, usize::MAX).await;
        for i in 1..=3 {
            let mut body = send_to(addr, "/").await.expect("answer").body;
            let frame = body.frame().await.expect("frame").expect("data");
            assert_eq!(frame.into_data().expect("data"), "ok");
            assert!(body.is_end_stream());
            drop(body);
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                i,
                "a new connection each time"
            );
        }
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
            let settings = pool.idle.get(authority.as_str()).expect("pooled");
            assert_eq!(settings[0].1[0].since, pool.sweeps, "idle from now");
            for _ in 1..IDLE_SWEEPS {
                pool.sweep();
                assert!(!pool.idle.is_empty(), "closed before its time");
            }
            pool.sweep();
            assert!(pool.idle.is_empty());
        });
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the backend sees the connection closed")
            .expect("signal");
    }

    #[tokio::test]
    async fn an_answer_cut_by_the_backend_keeps_failing_and_never_reads_as_ended() {
        const CUT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf";
        // One answer, then the backend closes: the body is 6 bytes short.
        let (addr, _) = backend(CUT, 1).await;
        let mut body = send_to(addr, "/").await.expect("answer").body;
        let first = body.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "half");
        assert!(matches!(body.frame().await, Some(Err(_))), "the cut");
        assert!(matches!(body.frame().await, Some(Err(_))), "still failed");
        assert!(!body.is_end_stream());
    }

    #[tokio::test]
    async fn an_answer_dropped_before_its_end_closes_its_connection() {
        const PARTIAL: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n";
        let (addr, accepted) = backend(PARTIAL, usize::MAX).await;
        let mut body = send_to(addr, "/").await.expect("answer").body;
        assert!(body.frame().await.is_some());
        drop(body);
        let mut body = send_to(addr, "/").await.expect("answer").body;
        assert!(body.frame().await.is_some());
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a half-read connection is never reused"
        );
    }
}
