//! Serving one listener: optional TLS, HTTP/1.1 and HTTP/2, a connection
//! budget, a header-read (and TLS handshake) timeout, an idle timeout, a
//! send timeout, and a graceful stop. Every port of a node (data plane,
//! admin, Raft) is served here, each with its own budget, so a flood on
//! one never takes the others' file descriptors.
//!
//! Architecture Invariant: a connection counts against its listener's
//! budget from accept to close; over the budget a new connection is closed
//! at once (never queued), and is counted.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::task::AtomicWaker;
use http::uri::PathAndQuery;
use http::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use crate::h1;
use crate::http1::{Answer, HeadFields, HeadLines};
use crate::slots::Slots;
use crate::spread::{Member, Seat};
use crate::tls::ServerTls;

/// What a listener serves: an axum `Router`, or a service of the same
/// shape (the data plane's front door skips the router for its hot path).
pub trait App:
    Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> App for S where
    S: Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// A listener's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most; more are closed at accept.
    pub max_connections: usize,
    /// From a connection's accept (its TLS handshake included) to its
    /// first complete request head, and from the first byte of each later
    /// head to its end: a connection that never sends a byte is closed
    /// after this, not after the idle timeout.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight and no bytes read for this
    /// long is closed (within a quarter of itself after it: the
    /// watchdog's looks time it).
    pub idle_timeout: Duration,
    /// Reading one request body, start to end (applied by the handlers
    /// that read bodies, see [`Limits::body_read_timeout`]).
    pub body_read_timeout: Duration,
    /// A client that takes nothing for this long has its connection
    /// closed (nginx's `send_timeout`): a write that makes no progress,
    /// or an HTTP/2 stream whose flow-control window stays shut. A client
    /// that stops reading its answer does not hold the connection, its
    /// request and the backend's connection forever. A slow reader that
    /// takes bytes now and then is not cut, nor is a slow answer.
    pub send_timeout: Duration,
    /// Open connections from one source address at most (nginx's
    /// `limit_conn` keyed by address); more are closed at accept. `None`:
    /// no cap (the default: clients behind one NAT or load balancer share
    /// an address).
    pub max_connections_per_ip: Option<usize>,
}

impl Limits {
    /// The defaults for a listener allowed `max_connections`.
    pub fn with_max(max_connections: usize) -> Self {
        Self {
            max_connections,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            max_connections_per_ip: None,
        }
    }
}

/// Counters of one listener (shared by its accept loops on every thread).
#[derive(Debug, Default)]
pub struct Stats {
    pub open: AtomicUsize,
    pub accepted: AtomicU64,
    /// Closed at accept: over the budget.
    pub refused: AtomicU64,
    /// Closed at accept: their source address had
    /// [`Limits::max_connections_per_ip`] open already.
    pub refused_per_ip: AtomicU64,
    /// Open connections per source address, while a cap is set.
    per_ip: PerIp,
    /// Closed for silence with no request in flight.
    pub closed_idle: AtomicU64,
    /// Closed because a request head (or the TLS handshake) was not
    /// complete within the header-read timeout.
    pub closed_header_timeout: AtomicU64,
    /// Closed because the client took nothing within the send timeout (a
    /// write that made no progress, or an HTTP/2 stream whose window it
    /// kept shut): it stopped reading.
    pub closed_send_timeout: AtomicU64,
    /// TLS handshakes that failed (a plain-HTTP client, a bad or missing
    /// client certificate, garbage).
    pub tls_failed: AtomicU64,
    /// HTTP/1 connections the lean server handed to hyper at a request it
    /// does not take (chunked, `Expect`, HTTP/1.0, a malformed head, ...),
    /// and HTTP/2 ones without TLS.
    pub handed_to_hyper: AtomicU64,
}

/// One listener's settings.
#[derive(Clone, Debug)]
pub struct ListenConfig {
    /// `data`, `admin` or `raft`: in logs and metric labels.
    pub name: &'static str,
    pub tls: Option<Arc<ServerTls>>,
    pub limits: Limits,
    pub stats: Arc<Stats>,
    /// Whether each request carries the [`Peer`] extension (the admin
    /// API's source networks and the Raft port's client certificates
    /// read it). The data plane reads neither, and skips its three
    /// allocations per request.
    pub peer: bool,
}

/// A handler of plain POSTs: the requests to its paths that the lean
/// HTTP/1 server takes (HTTP/1.1 with a `Content-Length` body, see `h1`)
/// come to [`Plain::call`] as their path, header fields and body, and its
/// [`Answer`] is written as it is. No `http` request or response is built
/// around them: a handler that reads a few headers and passes the rest on
/// (a proxy) builds and drops no header map, URI or extensions map per
/// request (about 3k instructions and six allocations of a proxied
/// request's ~42k). The same requests over HTTP/2, or over an HTTP/1
/// connection hyper serves, go to the listener's app, which must answer
/// them the same way; plain requests carry no [`Peer`]. A listener serves
/// one with [`serve_plain`].
///
/// Its future is a type of its own, not boxed: it is kept in the
/// connection's task while the request runs (the data plane's is ~3.4 KB,
/// which glibc's thread cache does not hold: an allocation and a free
/// per request, and a copy into the box).
pub trait Plain: Send + Sync + 'static {
    /// The paths (without a query) whose POSTs this handler answers,
    /// parsed once: a request to one without a query is handed over with
    /// it as its target, no parse per request.
    fn paths(&self) -> &[PathAndQuery];
    /// The answer to `req`; dropped unfinished when the client hangs up.
    fn call(&self, req: PlainRequest) -> impl Future<Output = Answer> + Send;
}

/// The [`Plain`] handler of a listener that has none: no paths.
pub struct NoPlain;

impl Plain for NoPlain {
    fn paths(&self) -> &[PathAndQuery] {
        &[]
    }

    /// Never called: a request goes to a handler only by one of its paths.
    fn call(&self, _: PlainRequest) -> impl Future<Output = Answer> + Send {
        std::future::ready(Answer::default())
    }
}

/// What a listener's requests go to: its app, and the plain POSTs its
/// [`Plain`] handler takes.
struct Handlers<A, P> {
    app: A,
    plain: Option<Arc<P>>,
}

impl<A: Clone, P> Clone for Handlers<A, P> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            plain: self.plain.clone(),
        }
    }
}

/// A POST the lean server took for a [`Plain`] handler.
#[derive(Debug)]
pub struct PlainRequest {
    /// Its request target: one of the handler's paths, and the query if it
    /// had one.
    pub target: PathAndQuery,
    /// Its header fields, framing headers included, as the head holds them.
    pub fields: HeadFields,
    pub body: Body,
}

/// Who is at the other end of a request's connection: a request extension
/// every handler can read.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client's certificate chain, when it presented one over TLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// Serves `app` on `listener` until `stop` turns true; then stops
/// accepting, lets each connection finish its in-flight requests (HTTP/1
/// closes after the current response, HTTP/2 sends GOAWAY), and returns
/// once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    app: impl App,
    config: ListenConfig,
    stop: watch::Receiver<bool>,
) {
    serve_plain::<NoPlain>(listener, app, None, config, None, stop).await;
}

/// A connection one thread of a [`Spread`](crate::spread::Spread)
/// accepted and hands to another to serve, with its place in the
/// listener's budget.
#[derive(Debug)]
pub struct Handed {
    stream: std::net::TcpStream,
    addr: SocketAddr,
    open: Open,
}

/// [`serve`], with `plain` answering the plain POSTs to its paths (see
/// [`Plain`]), and, when this is one of several threads serving one
/// address, `member` its place in their
/// [`Spread`](crate::spread::Spread): a connection it accepts while it
/// serves two or more more than the least busy of them is handed there,
/// and it serves the ones handed to it.
pub async fn serve_plain<P: Plain>(
    listener: TcpListener,
    app: impl App,
    plain: Option<Arc<P>>,
    config: ListenConfig,
    mut member: Option<Member<Handed>>,
    mut stop: watch::Receiver<bool>,
) {
    let handlers = Handlers { app, plain };
    let config = Arc::new(config);
    // The stop, fanned out to this listener's connections by a task of its
    // own (so it reaches them even if this loop is dropped first).
    let fan_out = Arc::new(Stop::default());
    {
        let (mut stop, fan_out) = (stop.clone(), Arc::clone(&fan_out));
        tokio::spawn(async move {
            stopped(&mut stop).await;
            fan_out.fire();
        });
    }
    // Each connection task holds a sender; all dropped = all closed.
    let (alive, mut closed) = mpsc::channel::<()>(1);
    let mut last_accept_error: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            // Handed connections first: they were accepted already and
            // count against the budget.
            (h, seat) = handed(&mut member) => {
                match TcpStream::from_std(h.stream) {
                    Ok(stream) => spawn_connection(
                        stream, h.addr, (h.open, Some(seat), alive.clone()),
                        &handlers, &config, &fan_out,
                    ),
                    Err(e) => tracing::debug!(listener = config.name, "handed connection lost: {e}"),
                }
                continue;
            }
            a = listener.accept() => a,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: the connection stays in the backlog;
                // pause instead of spinning, and say so at most once a second.
                if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                    tracing::warn!(listener = config.name, "accept error: {e}");
                    last_accept_error = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let stats = &config.stats;
        if stats.open.fetch_add(1, Ordering::AcqRel) >= config.limits.max_connections {
            stats.open.fetch_sub(1, Ordering::AcqRel);
            stats.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let ip = match config.limits.max_connections_per_ip {
            None => None,
            Some(cap) => match stats.per_ip.enter(addr.ip(), cap) {
                Some(ip) => Some(ip),
                None => {
                    stats.open.fetch_sub(1, Ordering::AcqRel);
                    stats.refused_per_ip.fetch_add(1, Ordering::Relaxed);
                    drop(stream);
                    continue;
                }
            },
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let open = Open(Arc::clone(&config.stats), ip);
        let (stream, open, seat) = match &member {
            None => (stream, open, None),
            Some(m) => match m.keep() {
                Some(seat) => (stream, open, Some(seat)),
                None => match hand(m, stream, addr, open) {
                    None => continue,
                    Some((stream, open, seat)) => (stream, open, Some(seat)),
                },
            },
        };
        spawn_connection(
            stream,
            addr,
            (open, seat, alive.clone()),
            &handlers,
            &config,
            &fan_out,
        );
    }
    // Connections handed here and not yet served close with the inbox.
    drop(member);
    drop(alive);
    let _ = closed.recv().await;
}

/// What a connection's task holds until it ends: its place in the
/// listener's budget and in its thread's count, and the listener's count
/// of live connections.
type Held = (Open, Option<Seat<Handed>>, mpsc::Sender<()>);

fn spawn_connection<A: App, P: Plain>(
    stream: TcpStream,
    addr: SocketAddr,
    held: Held,
    handlers: &Handlers<A, P>,
    config: &Arc<ListenConfig>,
    stop: &Arc<Stop>,
) {
    let (handlers, config, stop) = (handlers.clone(), Arc::clone(config), Arc::clone(stop));
    tokio::spawn(async move {
        connection(stream, addr, handlers, &config, stop).await;
        drop(held);
    });
}

/// Hands `stream` to the least busy thread of `member`'s spread; gives it
/// back (with a seat on this thread) when that thread stopped serving,
/// `None` when the stream could not be moved (it is closed).
fn hand(
    member: &Member<Handed>,
    stream: TcpStream,
    addr: SocketAddr,
    open: Open,
) -> Option<(TcpStream, Open, Seat<Handed>)> {
    let stream = stream.into_std().ok()?;
    match member.hand(Handed { stream, addr, open }) {
        Ok(()) => None,
        Err((h, seat)) => Some((TcpStream::from_std(h.stream).ok()?, h.open, seat)),
    }
}

/// The next connection handed to `member`; pending for ever without one.
async fn handed(member: &mut Option<Member<Handed>>) -> (Handed, Seat<Handed>) {
    match member {
        Some(m) => m.handed().await,
        None => std::future::pending().await,
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A listener's stop as its connections see it. Each connection waits on
/// a waker slot of its own ([`StopWait`]), polled at every wake of the
/// connection without a lock; a watch channel's `changed()` there took a
/// lock shared by every connection at every wake (twice per proxied
/// request, once per streamed event).
#[derive(Debug, Default)]
pub(crate) struct Stop {
    stopped: AtomicBool,
    waiting: Slots<AtomicWaker>,
}

impl Stop {
    fn fire(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.waiting.for_each(AtomicWaker::wake);
    }

    /// Whether the listener is stopping.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn wait(self: &Arc<Self>) -> StopWait {
        StopWait {
            slot: self.waiting.add(AtomicWaker::new()),
            stop: Arc::clone(self),
            registered: None,
        }
    }
}

/// One connection's wait for its listener's stop.
struct StopWait {
    stop: Arc<Stop>,
    slot: Arc<AtomicWaker>,
    /// The waker in `slot`: registering it again at every wake of the
    /// connection took two atomic read-modify-writes each time, and a
    /// connection's task keeps one waker. The slot keeps it until the
    /// stop fires, after which this is ready for good.
    registered: Option<Waker>,
}

impl Future for StopWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.stop.is_stopped() {
            return Poll::Ready(());
        }
        if this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        this.slot.register(cx.waker());
        this.registered = Some(cx.waker().clone());
        // A stop fired before the registration woke no one: look again.
        if this.stop.is_stopped() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The watchdog's timer. Polled at every wake of its connection (inside
/// the connection's select), but handed the task's waker only when it has
/// not got it: tokio's `Sleep` registers the waker at every poll (two
/// atomic read-modify-writes), and a connection's task keeps one waker.
/// Once the timer fired (`is_elapsed`) or was reset, the next poll is the
/// timer's own again.
struct Look {
    sleep: Pin<Box<tokio::time::Sleep>>,
    registered: Option<Waker>,
}

impl Look {
    fn at(deadline: Instant) -> Self {
        Look {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            registered: None,
        }
    }

    fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.registered = None;
    }
}

impl Future for Look {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let holds_waker = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if holds_waker && !this.sleep.is_elapsed() {
            return Poll::Pending;
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.registered = None;
                Poll::Ready(())
            }
            Poll::Pending => {
                if !holds_waker {
                    this.registered = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Decrements the open count (and its source address's, when counted)
/// when a connection ends, however it ends.
#[derive(Debug)]
struct Open(Arc<Stats>, Option<IpAddr>);

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(ip) = self.1 {
            self.0.per_ip.leave(ip);
        }
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Open connections per source address, shared by a listener's accept
/// loops (one per data-plane thread). Taken at accept and close only,
/// never per request; an address leaves the map with its last connection,
/// so it holds at most the listener's budget of entries.
#[derive(Debug, Default)]
struct PerIp(parking_lot::Mutex<std::collections::HashMap<IpAddr, usize>>);

impl PerIp {
    /// Counts a connection from `ip` (an IPv4-mapped IPv6 address as its
    /// IPv4 one) if fewer than `cap` are open; the address it was counted
    /// under, or `None` when refused.
    fn enter(&self, ip: IpAddr, cap: usize) -> Option<IpAddr> {
        let ip = ip.to_canonical();
        let mut open = self.0.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= cap {
            if *n == 0 {
                open.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(ip)
    }

    fn leave(&self, ip: IpAddr) {
        let mut open = self.0.lock();
        if let Some(n) = open.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&ip);
            }
        }
    }
}

async fn connection<A: App, P: Plain>(
    stream: TcpStream,
    addr: SocketAddr,
    handlers: Handlers<A, P>,
    config: &ListenConfig,
    stop: Arc<Stop>,
) {
    let state = Arc::new(ConnState::new());
    match &config.tls {
        None => {
            let peer = config.peer.then_some(Peer { addr, certs: None });
            let io = Watched::new(stream, Arc::clone(&state));
            serve_connection(io, peer, handlers, config, state, stop, false).await;
        }
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
            let handshake =
                tokio::time::timeout(config.limits.header_read_timeout, acceptor.accept(stream))
                    .await;
            let stream = match handshake {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    config.stats.tls_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(listener = config.name, %addr, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    config
                        .stats
                        .closed_header_timeout
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            let certs = stream
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            let peer = config.peer.then_some(Peer { addr, certs });
            let io = Watched::new(stream, Arc::clone(&state));
            serve_connection(io, peer, handlers, config, state, stop, h2).await;
        }
    }
}

async fn serve_connection<I, A: App, P: Plain>(
    io: Watched<I>,
    peer: Option<Peer>,
    Handlers { app, plain }: Handlers<A, P>,
    config: &ListenConfig,
    state: Arc<ConnState>,
    stop: Arc<Stop>,
    h2: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut stopping = false;
    // One stop future and one timer for the connection's life: the selects
    // below are polled at every wake of the connection, so nothing in them
    // is created or registered per request.
    let stopping_signal = stop.wait();
    tokio::pin!(stopping_signal);
    let mut check = Look::at(state.next_check(&config.limits, Instant::now()));
    // HTTP/1 requests are served by the lean server while they are plain;
    // hyper takes the connection at the first that is not (see `h1`).
    let io = if h2 {
        io
    } else {
        let lean = h1::serve(io, peer.as_ref(), &app, plain.as_deref(), &state, &stop);
        tokio::pin!(lean);
        loop {
            tokio::select! {
                // In this order: the connection first, and no random
                // start per wake (a random number each time otherwise).
                biased;
                ended = lean.as_mut() => match ended {
                    h1::Ended::Closed => return,
                    h1::Ended::Handoff(mut io, read) => {
                        config.stats.handed_to_hyper.fetch_add(1, Ordering::Relaxed);
                        io.rewind(read);
                        break io;
                    }
                },
                _ = &mut stopping_signal, if !stopping => {
                    // A request in flight or a head begun is finished (and
                    // answered with `connection: close`); an idle connection
                    // closes now.
                    stopping = true;
                    if state.is_idle() {
                        return;
                    }
                }
                () = &mut check => {
                    if watchdog_closes(&state, config, &mut check) {
                        return;
                    }
                }
            }
        }
    };
    let svc_state = Arc::clone(&state);
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        let guard = InFlight::begin(Arc::clone(&svc_state));
        let app = app.clone();
        let state = Arc::clone(&svc_state);
        async move {
            let mut resp = match host_refusal(&req) {
                Some(refusal) => refusal,
                None if req.version() < http::Version::HTTP_2 => {
                    state.body_unread.store(false, Ordering::Relaxed);
                    let req = req.map(|inner| Body::new(UnreadMark { inner, state }));
                    app.oneshot(req).await?
                }
                None => app.oneshot(req.map(Body::new)).await?,
            };
            // hyper writes the map only.
            if let Some(lines) = resp.extensions_mut().remove::<HeadLines>() {
                lines.fold_into(resp.headers_mut());
            }
            Ok::<_, std::convert::Infallible>(resp.map(|body| {
                Body::new(Tracked {
                    body,
                    handed: guard.0.track_body(),
                    guard,
                })
            }))
        }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            biased; // as the lean server's loop above
            _ = conn.as_mut() => return,
            _ = &mut stopping_signal, if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
            () = &mut check => {
                if watchdog_closes(&state, config, &mut check) {
                    // HTTP/2 gets its GOAWAY; a half-sent head is just dropped.
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await;
                    return;
                }
            }
        }
    }
}

/// A 400 for an HTTP/1 request without exactly the one `Host` RFC 9112
/// §3.2 asks for: none in HTTP/1.1, or more than one in any version.
/// HTTP/1.0 without `Host` is served, as nginx serves it (the version
/// predates the header). HTTP/2 names its authority in `:authority`.
/// The connection closes after it. The lean server hands such requests
/// here (`h1`), so one place answers them.
fn host_refusal<B>(req: &Request<B>) -> Option<Response> {
    let hosts = req.headers().get_all(http::header::HOST).iter().count();
    let refused = match req.version() {
        http::Version::HTTP_11 => hosts != 1,
        http::Version::HTTP_10 | http::Version::HTTP_09 => hosts > 1,
        _ => false,
    };
    if !refused {
        return None;
    }
    let mut resp = Response::new(Body::from(
        "400 Bad Request: an HTTP/1.1 request needs exactly one Host header (RFC 9112 section 3.2)\n",
    ));
    *resp.status_mut() = http::StatusCode::BAD_REQUEST;
    let headers = resp.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Some(resp)
}

/// The watchdog's look: true when the connection must close (counted);
/// else its timer is set for the next look.
fn watchdog_closes(state: &ConnState, config: &ListenConfig, check: &mut Look) -> bool {
    let now = Instant::now();
    let counter = match state.verdict(&config.limits, now) {
        Verdict::Keep => {
            check.reset(state.next_check(&config.limits, now));
            return false;
        }
        Verdict::Idle => &config.stats.closed_idle,
        Verdict::HeaderTimeout => &config.stats.closed_header_timeout,
        Verdict::SendTimeout => &config.stats.closed_send_timeout,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    true
}

/// The watchdog of a busy connection looks at most every this often,
/// however short the header-read timeout (a 10 ms timeout must not mean a
/// wake-up every few milliseconds on every connection).
const MIN_LOOK: Duration = Duration::from_millis(50);

/// A time the watchdog has not read yet: a read that begins a head, and a
/// response's end, mark their time so and its next look stamps it with
/// its own (the request path reads no clock for the watchdog; a look
/// comes within a quarter of the shortest timeout, see `next_check`).
const UNSTAMPED: u64 = u64::MAX;

/// What the watchdog of one connection knows: requests in flight, when
/// bytes last came in, since when a request head is pending, and since
/// when a write has been waiting for the client to read.
pub(crate) struct ConnState {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `epoch` of the last response end or of the read
    /// that began a head while none was in flight ([`UNSTAMPED`] until the
    /// watchdog's next look).
    last_activity_ms: AtomicU64,
    /// Milliseconds since `epoch` (+1) of the first byte read while no
    /// request was in flight ([`UNSTAMPED`] until the watchdog's next
    /// look); 0 when no head is pending. The connection's first head is
    /// pending from accept (1: `epoch` is the accept's time), so a
    /// connection that never sends a byte is closed by the header-read
    /// timeout, not held for the idle one.
    head_since_ms: AtomicU64,
    /// No byte has been read yet: the pending first head is not begun (a
    /// stopping listener closes such a connection at once).
    silent: AtomicBool,
    /// hyper's HTTP/1 path: the last request's body was dropped before its
    /// end (answered unread): the connection's close lingers (`Watched`).
    body_unread: AtomicBool,
    /// Milliseconds since `epoch` (+1) of the first write that found the
    /// socket full, with no write progress since; 0 when writes flow.
    blocked_since_ms: AtomicU64,
    /// One slot per response body on hyper's paths (HTTP/2 streams, and the
    /// HTTP/1 requests hyper serves): since when (milliseconds since
    /// `epoch`, +1) a frame it handed over has waited for hyper to ask for
    /// the next; 0 when none waits. A client that stops reading one HTTP/2
    /// stream stalls it on flow control while the socket stays writable:
    /// only these slots see that.
    handed: crate::slots::Slots<AtomicU64>,
}

enum Verdict {
    Keep,
    Idle,
    HeaderTimeout,
    SendTimeout,
}

impl ConnState {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(1),
            silent: AtomicBool::new(true),
            body_unread: AtomicBool::new(false),
            blocked_since_ms: AtomicU64::new(0),
            handed: crate::slots::Slots::default(),
        }
    }

    fn ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Bytes came in. Only those that begin a head matter (while a request
    /// is in flight, its end is what counts): their time is left for the
    /// watchdog to stamp.
    fn on_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            self.silent.store(false, Ordering::Relaxed);
            self.last_activity_ms.store(UNSTAMPED, Ordering::Relaxed);
            let _ = self.head_since_ms.compare_exchange(
                0,
                UNSTAMPED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// `cell`'s time, stamped `now` if it was [`UNSTAMPED`].
    fn stamped(cell: &AtomicU64, now: u64) -> u64 {
        match cell.compare_exchange(UNSTAMPED, now, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => now,
            Err(v) => v,
        }
    }

    /// The last activity and the pending head (+1, or 0), at `now`: the
    /// look that first sees an unstamped one stamps it.
    fn activity(&self, now: Instant) -> (u64, u64) {
        let ms = self.ms_at(now);
        (
            Self::stamped(&self.last_activity_ms, ms),
            Self::stamped(&self.head_since_ms, ms + 1),
        )
    }

    /// After a write (or flush) to the client: the send timeout runs from
    /// the first one that found the socket full (`Pending`) until one
    /// completes. One load on the hot path while writes flow.
    fn on_write<T>(&self, polled: &Poll<T>) {
        let blocked = self.blocked_since_ms.load(Ordering::Relaxed);
        match polled {
            Poll::Pending if blocked == 0 => {
                self.blocked_since_ms
                    .store(self.ms() + 1, Ordering::Relaxed);
            }
            Poll::Ready(_) if blocked != 0 => {
                self.blocked_since_ms.store(0, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// A new response body's slot (see `handed`).
    fn track_body(&self) -> Arc<AtomicU64> {
        self.handed.add(AtomicU64::new(0))
    }

    /// Since when (+1) the client has taken nothing: the older of a blocked
    /// write and a body frame waiting to be asked for; 0 when neither.
    fn stalled_since_ms(&self) -> u64 {
        let mut handed: Option<u64> = None;
        self.handed.for_each(|s| match s.load(Ordering::Relaxed) {
            0 => {}
            since => handed = Some(handed.map_or(since, |h| h.min(since))),
        });
        let blocked = self.blocked_since_ms.load(Ordering::Relaxed);
        match (handed, blocked) {
            (Some(h), 0) => h,
            (Some(h), b) => h.min(b),
            (None, b) => b,
        }
    }

    /// No request in flight and no head begun.
    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && (self.head_since_ms.load(Ordering::Relaxed) == 0
                || self.silent.load(Ordering::Relaxed))
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// When the watchdog looks next (`now`: its look's time): the earliest
    /// deadline that could fire, and at the latest a quarter of the
    /// shortest of the header-read, send and idle timeouts from now. Requests
    /// and writes do not wake the watchdog (that was two wake-ups and two
    /// timer registrations per request), nor read the clock for it: a head
    /// that begins, a response that ends or a write that blocks while it
    /// sleeps is stamped at its next look, so a connection is closed
    /// between 1 and 1.25 of the timeout after its head began, its write
    /// blocked or (for the idle timeout) its last response ended (plus up
    /// to [`MIN_LOOK`] for a timeout under 200 ms).
    fn next_check(&self, limits: &Limits, now: Instant) -> Instant {
        let quarter = limits
            .header_read_timeout
            .min(limits.send_timeout)
            .min(limits.idle_timeout)
            / 4;
        let look = now + quarter.max(MIN_LOOK);
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return look;
        }
        let (last_activity, head_since) = self.activity(now);
        let idle = self.at(last_activity) + limits.idle_timeout;
        match head_since {
            0 => idle,
            since => idle.min(self.at(since - 1) + limits.header_read_timeout),
        }
        .min(look)
        // A deadline in the past fires at once; the verdict decides.
        .max(now + Duration::from_millis(5))
    }

    fn verdict(&self, limits: &Limits, now: Instant) -> Verdict {
        let stalled = self.stalled_since_ms();
        if stalled != 0 && now >= self.at(stalled - 1) + limits.send_timeout {
            return Verdict::SendTimeout;
        }
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Verdict::Keep;
        }
        let (last_activity, head) = self.activity(now);
        if head != 0 && now >= self.at(head - 1) + limits.header_read_timeout {
            return Verdict::HeaderTimeout;
        }
        if now >= self.at(last_activity) + limits.idle_timeout {
            return Verdict::Idle;
        }
        Verdict::Keep
    }
}

/// A request from its head until its response body is done (or dropped).
/// Hyper's bodies outlive the call that began them and hold the state by
/// `Arc`; the lean server's request ends within its connection's borrow of
/// it (`&ConnState`: no reference count taken per request).
pub(crate) struct InFlight<S: Deref<Target = ConnState> = Arc<ConnState>>(S);

impl<S: Deref<Target = ConnState>> InFlight<S> {
    pub(crate) fn begin(state: S) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state.head_since_ms.store(0, Ordering::Relaxed);
        Self(state)
    }
}

impl<S: Deref<Target = ConnState>> Drop for InFlight<S> {
    fn drop(&mut self) {
        let s = &self.0;
        s.last_activity_ms.store(UNSTAMPED, Ordering::Relaxed);
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body on hyper's paths: holds its request's [`InFlight`]
/// until it ends, and marks in its slot (`ConnState::handed`) since when a
/// frame it gave hyper has waited for hyper to ask for the next. hyper asks
/// once the frame is on its way (HTTP/2: once the client's flow-control
/// window has room), so a slot that stays marked is a client that stopped
/// reading; a body waiting for its backend (`Pending`) is not marked.
struct Tracked {
    body: Body,
    handed: Arc<AtomicU64>,
    guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let since = match &polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => this.guard.0.ms() + 1,
            _ => 0,
        };
        this.handed.store(since, Ordering::Relaxed);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body on hyper's HTTP/1 path: dropped before its end (its
/// answer given without reading it all), it marks its connection so that
/// the close after the answer lingers (`Watched::poll_shutdown`).
struct UnreadMark {
    inner: Incoming,
    state: Arc<ConnState>,
}

impl http_body::Body for UnreadMark {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UnreadMark {
    fn drop(&mut self) {
        use http_body::Body as _;
        if !self.inner.is_end_stream() {
            self.state.body_unread.store(true, Ordering::Relaxed);
        }
    }
}

/// An I/O stream that tells its [`ConnState`] when bytes come in, and
/// when writes block or flow again.
struct Watched<I> {
    inner: I,
    state: Arc<ConnState>,
    /// Bytes already read, to be read again first: what the lean HTTP/1
    /// server read before handing the connection to hyper.
    rewound: Bytes,
    /// A close that lingers (see [`UnreadMark`]): shut for writing, the
    /// rest of the request is read and dropped until this time.
    lingering: Option<Lingering>,
}

struct Lingering {
    until: Pin<Box<tokio::time::Sleep>>,
    read: usize,
}

impl<I> Watched<I> {
    fn new(inner: I, state: Arc<ConnState>) -> Self {
        Self {
            inner,
            state,
            lingering: None,
            rewound: Bytes::new(),
        }
    }

    fn rewind(&mut self, read: Bytes) {
        self.rewound = read;
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.rewound.is_empty() {
            // Counted when they were first read.
            let n = self.rewound.len().min(buf.remaining());
            buf.put_slice(&self.rewound.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.on_read();
        }
        polled
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.state.on_write(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // TLS flushes its buffered records here: a flush that waits is a
        // blocked write too.
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.state.on_write(&polled);
        polled
    }

    /// hyper shuts a connection down after its last answer; when that
    /// answer came before its request's body was read, the close lingers
    /// as the lean server's does (`h1::linger`): the client still sending
    /// its body gets the answer rather than a reset.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.lingering.is_none() {
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if !this.state.body_unread.swap(false, Ordering::Relaxed) {
                return Poll::Ready(Ok(()));
            }
            this.lingering = Some(Lingering {
                until: Box::pin(tokio::time::sleep(h1::LINGER_TIME)),
                read: 0,
            });
        }
        let Some(linger) = this.lingering.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 4096];
        while linger.read < h1::LINGER_BYTES && linger.until.as_mut().poll(cx).is_pending() {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    linger.read += buf.filled().len();
                }
                Poll::Ready(_) => break,
            }
        }
        this.lingering = None;
        Poll::Ready(Ok(()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.state.on_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Raises the soft open-files limit to the hard limit; returns the new
/// soft limit (what the listeners' budgets must stay under).
pub fn raise_fd_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot raise the open-files limit: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

/// Reads a request body whole, at most `limit` bytes within `timeout`. A
/// body that comes in one frame (the usual small request, read with its
/// head) is returned as it is, without a copy; a longer one is gathered
/// into one buffer. A declared length over `limit` is refused unread.
pub async fn read_body(
    mut body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<axum::body::Bytes, BodyError> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    let gather = async {
        let mut first = Bytes::new();
        let mut more: Option<bytes::BytesMut> = None;
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
            // Trailers carry no body bytes.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            len = len.saturating_add(data.len());
            if len > limit {
                return Err(BodyError::TooLarge);
            }
            match &mut more {
                Some(all) => all.extend_from_slice(&data),
                None if first.is_empty() => first = data,
                None => {
                    let mut all = bytes::BytesMut::with_capacity(len);
                    all.extend_from_slice(&first);
                    all.extend_from_slice(&data);
                    more = Some(all);
                }
            }
        }
        Ok(more.map_or(first, bytes::BytesMut::freeze))
    };
    // A body that came with its head is whole at the first poll: it costs
    // no clock read and no timer.
    let mut gather = std::pin::pin!(gather);
    if let Poll::Ready(done) =
        std::future::poll_fn(|cx| Poll::Ready(gather.as_mut().poll(cx))).await
    {
        return done;
    }
    tokio::time::timeout(timeout, gather)
        .await
        .unwrap_or(Err(BodyError::Timeout))
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body was not received in time")]
    Timeout,
    #[error("the request body is larger than this endpoint accepts")]
    TooLarge,
    #[error("reading the request body failed: {0}")]
    Read(String),
}

#[cfg(test)]
pub(crate) mod tests {
    use axum::Router;

    use super::*;

    /// Serves `app` with `limits` on a port of its own: its address, its
    /// counters, and the switch that stops it.
    pub(crate) async fn serve_app(
        app: Router,
        limits: Limits,
    ) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
        serve_app_with(app, limits, true, None, None::<Arc<NoPlain>>).await
    }

    /// [`serve_app`], choosing whether requests carry the [`Peer`], over
    /// TLS or not, and the [`Plain`] handler.
    pub(crate) async fn serve_app_with<P: Plain>(
        app: Router,
        limits: Limits,
        peer: bool,
        tls: Option<Arc<ServerTls>>,
        plain: Option<Arc<P>>,
    ) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stats = Arc::new(Stats::default());
        let config = ListenConfig {
            name: "test",
            tls,
            limits,
            stats: Arc::clone(&stats),
            peer,
        };
        let (stop, rx) = watch::channel(false);
        tokio::spawn(serve_plain(listener, app, plain, config, None, rx));
        (addr, stats, stop)
    }

    /// Serves a one-route app with `limits`.
    async fn server(limits: Limits) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
        serve_app(
            Router::new().route("/", axum::routing::get(|| async { "ok" })),
            limits,
        )
        .await
    }

    /// Reads until the server closes; how long that took.
    async fn closed_after(s: &mut TcpStream) -> Duration {
        use tokio::io::AsyncReadExt;
        let started = Instant::now();
        let mut buf = [0u8; 512];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        started.elapsed()
    }

    #[tokio::test]
    async fn a_stop_wakes_idle_connections_at_once_not_at_the_watchdogs_next_look() {
        use tokio::io::AsyncWriteExt;
        // The watchdog looks every 30 s: only the stop's own wake-up
        // closes these connections within the deadline below.
        let limits = Limits {
            header_read_timeout: Duration::from_secs(120),
            send_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(600),
            ..Limits::with_max(64)
        };
        let (addr, stats, stop) = server(limits).await;
        let mut plain = TcpStream::connect(addr).await.expect("connect");
        // Served once: its task waits for a next head.
        plain
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.accepted.load(Ordering::Relaxed) < 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(true).expect("stop");
        tokio::time::timeout(Duration::from_secs(10), closed_after(&mut plain))
            .await
            .expect("closed by the stop, not by the watchdog 30 s later");
    }

    #[tokio::test]
    async fn a_head_begun_after_an_idle_pause_gets_the_header_timeout_not_the_idle_one() {
        use tokio::io::AsyncWriteExt;
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(20),
            ..Limits::with_max(16)
        };
        let (addr, stats, _stop) = server(limits).await;
        // Silent first, then a head that never ends.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        assert!(closed_after(&mut s).await < Duration::from_secs(10));
        // After a complete request on a keep-alive connection, the next
        // head that never ends is timed out the same way.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 256];
        use tokio::io::AsyncReadExt;
        let n = s.read(&mut buf).await.expect("answer");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        assert!(closed_after(&mut s).await < Duration::from_secs(10));
        assert_eq!(stats.closed_header_timeout.load(Ordering::Relaxed), 2);
        assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_connection_that_never_sends_a_byte_is_closed_by_the_header_read_timeout() {
        // 11,000 silent connections once held a data port's whole budget
        // for the idle timeout each.
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(120),
            ..Limits::with_max(16)
        };
        let (addr, stats, _stop) = server(limits).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let took = tokio::time::timeout(Duration::from_secs(20), closed_after(&mut silent))
            .await
            .expect("closed by the header-read timeout, not the idle one");
        assert!(
            took >= Duration::from_millis(250),
            "not before it: {took:?}"
        );
        assert_eq!(stats.closed_header_timeout.load(Ordering::Relaxed), 1);
        assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_connection_over_its_addresss_cap_is_closed_at_accept() {
        let limits = Limits {
            max_connections_per_ip: Some(2),
            ..Limits::with_max(16)
        };
        let (addr, stats, _stop) = server(limits).await;
        let accepted = |n: u64| {
            let stats = Arc::clone(&stats);
            async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                while stats.accepted.load(Ordering::Relaxed) < n {
                    assert!(Instant::now() < deadline, "never accepted");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        let first = TcpStream::connect(addr).await.expect("connect");
        let _second = TcpStream::connect(addr).await.expect("connect");
        accepted(2).await;
        let mut third = TcpStream::connect(addr).await.expect("connect");
        assert!(closed_after(&mut third).await < Duration::from_secs(10));
        assert_eq!(stats.refused_per_ip.load(Ordering::Relaxed), 1);
        assert_eq!(stats.refused.load(Ordering::Relaxed), 0, "not the budget");
        // A connection that closes gives its place back.
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.open.load(Ordering::Relaxed) > 1 {
            assert!(Instant::now() < deadline, "the closed one still counted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _fourth = TcpStream::connect(addr).await.expect("connect");
        accepted(3).await;
        assert_eq!(stats.refused_per_ip.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_addresss_count_leaves_with_its_last_connection() {
        let per_ip = PerIp::default();
        let v4: IpAddr = "10.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(per_ip.enter(v4, 2), Some(v4));
        assert_eq!(
            per_ip.enter(mapped, 2),
            Some(v4),
            "one address, however written"
        );
        assert_eq!(per_ip.enter(v4, 2), None);
        per_ip.leave(v4);
        per_ip.leave(v4);
        assert!(per_ip.0.lock().is_empty());
        assert_eq!(per_ip.enter(v4, 1), Some(v4));
    }

    /// Every byte the server at `addr` answers `request` with, until it
    /// closes.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
            .await
            .expect("the answer ends")
            .expect("read");
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn an_http11_request_without_exactly_one_host_is_a_400() {
        let (addr, _stats, _stop) = server(Limits::with_max(16)).await;
        let refused: [&[u8]; 4] = [
            b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost: a\r\nHost: b\r\nconnection: close\r\n\r\n",
            // Chunked: hyper's path.
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n0\r\n\r\n",
            b"GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n",
        ];
        for request in refused {
            let answer = exchange(addr, request).await;
            assert!(
                answer.starts_with("HTTP/1.1 400 ") || answer.starts_with("HTTP/1.0 400 "),
                "{:?}: {answer}",
                String::from_utf8_lossy(request)
            );
            assert!(answer.contains("Host"), "says why: {answer}");
        }
        // HTTP/1.0 predates `Host`: served without it, as nginx does.
        let answer = exchange(addr, b"GET / HTTP/1.0\r\n\r\n").await;
        assert!(
            answer.contains(" 200 ") && answer.ends_with("ok"),
            "{answer}"
        );
        let answer = exchange(
            addr,
            b"GET / HTTP/1.1\r\nHOST: a\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    }

    #[tokio::test]
    async fn an_early_answer_reaches_a_client_still_sending_a_large_body() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Answers at once, reading none of the body (a 401 before the
        // upload is read). Closed with the body unread, the socket would
        // reset the client's writes and the answer with them.
        let app = Router::new().route(
            "/",
            axum::routing::post(|| async { (http::StatusCode::UNAUTHORIZED, "no key") }),
        );
        let (addr, stats, _stop) = serve_app(app, Limits::with_max(4)).await;
        // More than loopback's socket buffers hold on both sides together.
        const BODY: usize = 32 * 1024 * 1024;
        const PIECE: usize = 0xfff8;
        // By length, the lean server's; chunked, hyper's.
        let framings = [
            ("content-length: 33554432", false),
            ("transfer-encoding: chunked", true),
        ];
        for (framing, chunked) in framings {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let head = format!("POST / HTTP/1.1\r\nhost: x\r\n{framing}\r\n\r\n");
            s.write_all(head.as_bytes()).await.expect("head");
            let mut piece = Vec::new();
            if chunked {
                piece.extend_from_slice(format!("{PIECE:x}\r\n").as_bytes());
            }
            piece.extend(std::iter::repeat_n(b'x', PIECE));
            if chunked {
                piece.extend_from_slice(b"\r\n");
            }
            let mut sent = 0;
            while sent < BODY {
                let n = PIECE.min(BODY - sent);
                let bytes = if chunked || n == PIECE {
                    &piece[..]
                } else {
                    &piece[..n]
                };
                s.write_all(bytes)
                    .await
                    .unwrap_or_else(|e| panic!("{framing}: reset after {sent} bytes: {e}"));
                sent += n;
            }
            if chunked {
                s.write_all(b"0\r\n\r\n").await.expect("last chunk");
            }
            s.shutdown().await.expect("shutdown");
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
                .await
                .expect("closed")
                .unwrap_or_else(|e| panic!("{framing}: the answer, not a reset: {e}"));
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 401 "), "{framing}: {answer}");
            assert!(answer.contains("no key"), "{framing}: {answer}");
        }
        assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn over_the_budget_a_connection_is_closed_at_once() {
        let (addr, stats, _stop) = server(Limits::with_max(1)).await;
        let _held = TcpStream::connect(addr).await.expect("connect");
        // The first connection is accepted before the second arrives.
        while stats.accepted.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut refused = TcpStream::connect(addr).await.expect("connect");
        assert!(closed_after(&mut refused).await < Duration::from_secs(10));
        assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_long_answer_is_work_not_idleness() {
        // Header and idle timeouts far shorter than the answer takes: a
        // request in flight is never cut by them.
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(200),
            ..Limits::with_max(4)
        };
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                "done"
            }),
        );
        let (addr, stats, _stop) = serve_app(app, limits).await;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        let mut buf = [0u8; 256];
        while !answer.ends_with(b"done") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed mid-answer: {:?}",
                String::from_utf8_lossy(&answer)
            );
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
    }

    /// An app whose `/` answers an endless stream of 64 KiB chunks; `gone`
    /// turns true when the answer is dropped (its connection closed).
    fn endless(gone: &Arc<std::sync::atomic::AtomicBool>) -> Router {
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let gone = Arc::clone(gone);
        Router::new().route(
            "/",
            axum::routing::get(move || {
                let flag = Flag(Arc::clone(&gone));
                async move {
                    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                    let chunks = futures_util::stream::repeat_with(move || {
                        let _held = &flag;
                        Ok::<_, Infallible>(chunk.clone())
                    });
                    Body::from_stream(chunks)
                }
            }),
        )
    }

    /// A server of [`endless`] answers with `send_timeout`: its address,
    /// counters, stop switch, and the flag of the dropped answer.
    async fn endless_server(
        send_timeout: Duration,
    ) -> (
        SocketAddr,
        Arc<Stats>,
        watch::Sender<bool>,
        Arc<std::sync::atomic::AtomicBool>,
    ) {
        let limits = Limits {
            send_timeout,
            ..Limits::with_max(4)
        };
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, stats, stop) = serve_app(endless(&gone), limits).await;
        (addr, stats, stop, gone)
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_closed_after_the_send_timeout() {
        use tokio::io::AsyncWriteExt;
        let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(300)).await;
        // A plain request (the lean server) and an HTTP/1.0 one (hyper's).
        for (n, wire) in [
            &b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..],
            &b"GET / HTTP/1.0\r\nhost: x\r\n\r\n"[..],
        ]
        .into_iter()
        .enumerate()
        {
            gone.store(false, Ordering::SeqCst);
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(wire).await.expect("write");
            // Never read: the server's writes fill the socket and block.
            let deadline = Instant::now() + Duration::from_secs(30);
            while stats.closed_send_timeout.load(Ordering::Relaxed) < n as u64 + 1 {
                assert!(Instant::now() < deadline, "request {n}: not closed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The answer (and with it the request and anything it held
            // upstream) is dropped, not left waiting for a reader.
            while !gone.load(Ordering::SeqCst) {
                assert!(Instant::now() < deadline, "request {n}: answer still held");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(closed_after(&mut s).await < Duration::from_secs(30));
        }
        assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
        assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_reader_that_pauses_shorter_than_the_send_timeout_is_not_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(1_500)).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        // Pauses of 400 ms, each long enough to fill the socket and block
        // the server's writes, with reads at full speed between them.
        let mut buf = vec![0u8; 256 * 1024];
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let mut got = 0;
            while got < 8 << 20 {
                let n = s.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed after a pause shorter than the send timeout");
                got += n;
            }
        }
        assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
        assert!(!gone.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_limit_and_time() {
        let limit = 10;
        let time = Duration::from_secs(30);
        let frames = |parts: &'static [&'static str]| {
            Body::from_stream(futures_util::stream::iter(
                parts
                    .iter()
                    .map(|p| Ok::<_, Infallible>(Bytes::from_static(p.as_bytes()))),
            ))
        };
        // One frame: returned as it came, not copied.
        let one = Bytes::from_static(b"hello");
        let got = read_body(Body::from(one.clone()), limit, time).await;
        assert_eq!(got.expect("read").as_ptr(), one.as_ptr());
        // Several frames (and empty ones): gathered in order.
        let got = read_body(frames(&["", "ab", "", "cd", "e"]), limit, time).await;
        assert_eq!(&got.expect("read")[..], b"abcde");
        // Exactly the limit passes; one byte over fails, declared or not.
        let got = read_body(frames(&["01234", "56789"]), limit, time).await;
        assert_eq!(&got.expect("read")[..], b"0123456789");
        let over = read_body(frames(&["01234", "56789", "x"]), limit, time).await;
        assert!(matches!(over, Err(BodyError::TooLarge)), "{over:?}");
        let declared = read_body(Body::from("0123456789x"), limit, time).await;
        assert!(matches!(declared, Err(BodyError::TooLarge)), "{declared:?}");
        // A body that stops arriving is cut at the timeout.
        let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(1);
        tx.send(Ok(Bytes::from_static(b"ab"))).await.expect("send");
        let stalled = Body::from_stream(tokio_stream_of(rx));
        let got = read_body(stalled, limit, Duration::from_millis(100)).await;
        assert!(matches!(got, Err(BodyError::Timeout)), "{got:?}");
        drop(tx);
    }

    /// A receiver as a stream (no tokio-stream dependency for one test).
    fn tokio_stream_of<T: Send + 'static>(
        rx: mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + 'static {
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
    }

    #[tokio::test]
    async fn an_http2_stream_its_client_stops_reading_is_closed_after_the_send_timeout() {
        let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(300)).await;
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(16 * 1024)
            .handshake::<_, Bytes>(tcp)
            .await
            .expect("h2 handshake");
        let driver = tokio::spawn(conn);
        let request = http::Request::get(format!("http://{addr}/"))
            .body(())
            .expect("request");
        let (answer, _) = client.send_request(request, true).expect("send");
        let answer = answer.await.expect("answer head");
        assert_eq!(answer.status(), 200);
        // The answer's data is never read and its window never released:
        // the stream stalls on flow control, the socket stays writable.
        let _unread = answer.into_body();
        let deadline = Instant::now() + Duration::from_secs(30);
        while stats.closed_send_timeout.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "the stalled stream was not noticed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while !gone.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the answer is still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        driver.abort();
    }

    /// `GET /` on a new connection through each HTTP/1 server: the lean
    /// one's (HTTP/1.1) and hyper's (HTTP/1.0); each whole answer, read to
    /// the close.
    async fn get_by_both_servers(addr: SocketAddr) -> Vec<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut answers = Vec::new();
        for wire in [
            &b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"[..],
            &b"GET / HTTP/1.0\r\nhost: x\r\n\r\n"[..],
        ] {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(wire).await.expect("write");
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.expect("read");
            answers.push(String::from_utf8_lossy(&got).into_owned());
        }
        answers
    }

    #[tokio::test]
    async fn a_slow_generation_read_by_its_client_is_not_a_stalled_client() {
        // Gaps between frames far longer than the send timeout: the body is
        // waiting (its backend), not the client.
        let limits = Limits {
            send_timeout: Duration::from_millis(200),
            ..Limits::with_max(4)
        };
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                let chunks = futures_util::stream::unfold(0, |n| async move {
                    if n == 3 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    Some((Ok::<_, Infallible>(Bytes::from(format!("part{n};"))), n + 1))
                });
                Body::from_stream(chunks)
            }),
        );
        let (addr, stats, _stop) = serve_app(app, limits).await;
        for got in get_by_both_servers(addr).await {
            assert!(got.contains("part0;") && got.contains("part2;"), "{got}");
        }
        // HTTP/2, the client reading (and so releasing its window) as data comes.
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
        let driver = tokio::spawn(conn);
        let request = http::Request::get(format!("http://{addr}/"))
            .body(())
            .expect("request");
        let (answer, _) = client.send_request(request, true).expect("send");
        let mut body = answer.await.expect("answer head").into_body();
        let mut got = Vec::new();
        while let Some(data) = body.data().await {
            let data = data.expect("data");
            let _ = body.flow_control().release_capacity(data.len());
            got.extend_from_slice(&data);
        }
        assert_eq!(got, b"part0;part1;part2;");
        driver.abort();
        assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn requests_carry_their_peer_only_where_the_listener_asks() {
        let app = Router::new().route(
            "/",
            axum::routing::get(|req: Request<Body>| async move {
                req.extensions()
                    .get::<Peer>()
                    .map_or("none".to_owned(), |p| p.addr.ip().to_string())
            }),
        );
        for (wanted, expect) in [(true, "127.0.0.1"), (false, "none")] {
            let (addr, _, _stop) = serve_app_with(
                app.clone(),
                Limits::with_max(4),
                wanted,
                None,
                None::<Arc<NoPlain>>,
            )
            .await;
            for got in get_by_both_servers(addr).await {
                assert!(got.ends_with(expect), "peer wanted: {wanted}: {got}");
            }
        }
    }

    #[tokio::test]
    async fn over_tls_a_client_that_stops_reading_is_closed_after_the_send_timeout() {
        use tokio::io::AsyncWriteExt;
        // A self-signed certificate for localhost, and a client trusting it.
        let dir = tempfile::tempdir().expect("temp dir");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        let files = crate::tls::TlsFiles {
            cert: dir.path().join("c.pem"),
            key: dir.path().join("k.pem"),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert.pem()).expect("write");
        std::fs::write(&files.key, key.serialize_pem()).expect("write");
        let tls = ServerTls::load(files, &[b"http/1.1"]).expect("server TLS");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).expect("root");
        let client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let limits = Limits {
            send_timeout: Duration::from_millis(300),
            ..Limits::with_max(4)
        };
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, stats, _stop) = serve_app_with(
            endless(&gone),
            limits,
            false,
            Some(tls),
            None::<Arc<NoPlain>>,
        )
        .await;
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .expect("handshake");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        // Never read: rustls's buffer, then the socket, fill up.
        let deadline = Instant::now() + Duration::from_secs(30);
        while stats.closed_send_timeout.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "not closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        while !gone.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the answer is still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_on_hyper_is_not_a_stalled_client() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // hyper serves the connection (a chunked request is handed to it);
        // its answer is whole and read, then the client stays silent for
        // longer than the send timeout: that is idleness, not a stall.
        let limits = Limits {
            send_timeout: Duration::from_millis(200),
            ..Limits::with_max(4)
        };
        let (addr, stats, _stop) = server(limits).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 512];
        let mut got = Vec::new();
        while !got.ends_with(b"ok") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
        // Still open: a second request is answered.
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let n = s.read(&mut buf).await.expect("read");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }

    #[test]
    fn a_head_and_an_answers_end_are_timed_from_the_look_that_first_sees_them() {
        let limits = Limits::with_max(10);
        let (h, idle) = (limits.header_read_timeout, limits.idle_timeout);
        let state = Arc::new(ConnState::new());
        let t0 = state.epoch;
        let ms = Duration::from_millis(1);
        // Accepted: its first head is pending from then on, not begun.
        assert!(state.is_idle(), "a stop closes it at once");
        assert!(matches!(state.verdict(&limits, t0 + h - ms), Verdict::Keep));
        assert!(matches!(
            state.verdict(&limits, t0 + h),
            Verdict::HeaderTimeout
        ));
        // Its first request served: idle from the look after its end.
        state.on_read();
        drop(InFlight::begin(Arc::clone(&state)));
        assert!(matches!(state.verdict(&limits, t0), Verdict::Keep));
        assert!(matches!(state.verdict(&limits, t0 + idle), Verdict::Idle));

        // A head begins: no clock read, its time is the next look's.
        state.on_read();
        assert!(!state.is_idle());
        let look = t0 + idle + h;
        assert!(matches!(state.verdict(&limits, look), Verdict::Keep));
        assert_eq!(state.next_check(&limits, look), look + h / 4);
        assert!(matches!(
            state.verdict(&limits, look + h - ms),
            Verdict::Keep
        ));
        assert!(matches!(
            state.verdict(&limits, look + h),
            Verdict::HeaderTimeout
        ));

        // The head completes and its answer ends: idle from the look after.
        drop(InFlight::begin(Arc::clone(&state)));
        assert!(state.is_idle());
        let look = look + h / 4;
        assert!(matches!(state.verdict(&limits, look), Verdict::Keep));
        assert_eq!(state.next_check(&limits, look), look + h / 4);
        assert!(matches!(
            state.verdict(&limits, look + idle - ms),
            Verdict::Keep
        ));
        assert!(matches!(state.verdict(&limits, look + idle), Verdict::Idle));
    }

    #[test]
    fn a_short_idle_timeout_is_stamped_within_a_quarter_of_itself() {
        // Longer header-read and send timeouts than the idle one: the
        // watchdog of a busy connection still looks often enough that an
        // answer's end is stamped within a quarter of the idle timeout.
        let limits = Limits {
            idle_timeout: Duration::from_secs(2),
            ..Limits::with_max(10)
        };
        let state = Arc::new(ConnState::new());
        let busy = InFlight::begin(Arc::clone(&state));
        let look = state.epoch + Duration::from_secs(5);
        let next = state.next_check(&limits, look);
        assert_eq!(next, look + limits.idle_timeout / 4);
        drop(busy);
        assert!(matches!(state.verdict(&limits, next), Verdict::Keep));
        assert!(matches!(
            state.verdict(&limits, next + limits.idle_timeout),
            Verdict::Idle
        ));
    }

    /// Stops the threads of [`spread_threads`] however a test ends.
    struct Stopper(watch::Sender<bool>, Vec<std::thread::JoinHandle<()>>);

    impl Drop for Stopper {
        fn drop(&mut self) {
            let _ = self.0.send(true);
            for t in self.1.drain(..) {
                let _ = t.join();
            }
        }
    }

    /// A thread named `served-by-<i>` with a runtime and a listener of its
    /// own for each member, as the data plane has; `GET /` answers the
    /// serving thread's name. Their ports, counters and stopper.
    fn spread_threads(
        members: Vec<crate::spread::Member<Handed>>,
    ) -> (Vec<SocketAddr>, Arc<Stats>, Stopper) {
        let stats = Arc::new(Stats::default());
        let (stop, stop_rx) = watch::channel(false);
        let mut threads = Vec::new();
        let mut ports = Vec::new();
        for (i, member) in members.into_iter().enumerate() {
            let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            std_listener.set_nonblocking(true).expect("nonblocking");
            ports.push(std_listener.local_addr().expect("addr"));
            let config = ListenConfig {
                name: "test",
                tls: None,
                limits: Limits::with_max(64),
                stats: Arc::clone(&stats),
                peer: false,
            };
            let stop_rx = stop_rx.clone();
            let app = Router::new().route(
                "/",
                axum::routing::get(|| async {
                    std::thread::current().name().unwrap_or("?").to_owned()
                }),
            );
            threads.push(
                std::thread::Builder::new()
                    .name(format!("served-by-{i}"))
                    .spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("runtime");
                        rt.block_on(async move {
                            let listener = TcpListener::from_std(std_listener).expect("listener");
                            serve_plain::<NoPlain>(
                                listener,
                                app,
                                None,
                                config,
                                Some(member),
                                stop_rx,
                            )
                            .await
                        });
                    })
                    .expect("thread"),
            );
        }
        (ports, stats, Stopper(stop, threads))
    }

    /// A keep-alive connection to `addr` that asked `GET /`, and the name
    /// of the thread that answered.
    async fn served_by(addr: SocketAddr) -> (TcpStream, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(b"served-by-0") && !got.ends_with(b"served-by-1") {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        let name = text.rsplit("\r\n").next().unwrap_or_default().to_owned();
        (s, name)
    }

    #[tokio::test]
    async fn connections_the_kernel_sends_to_one_thread_are_served_by_both() {
        // Every connection goes to the first thread's port.
        let (spread, members) = crate::spread::Spread::<Handed>::new(2);
        let (ports, stats, stopper) = spread_threads(members);
        let mut conns = Vec::new();
        let mut by_thread = std::collections::BTreeMap::<String, usize>::new();
        for _ in 0..9 {
            let (s, name) = served_by(ports[0]).await;
            *by_thread.entry(name).or_default() += 1;
            // Kept open: each thread's count is what it carries.
            conns.push(s);
        }
        let (first, second) = (by_thread["served-by-0"], by_thread["served-by-1"]);
        assert_eq!(first + second, 9);
        assert!(first.abs_diff(second) <= 2, "{by_thread:?}");
        assert_eq!(spread.open(), vec![first, second]);
        assert_eq!(spread.handed(), second as u64);
        assert_eq!(stats.open.load(Ordering::Relaxed), 9);
        // Closing them frees both threads' places.
        drop(conns);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while spread.open() != vec![0, 0] && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(spread.open(), vec![0, 0]);
        drop(stopper);
    }

    #[tokio::test]
    async fn a_connection_for_a_thread_that_stopped_is_served_where_it_was_accepted() {
        // The second thread is gone (its inbox with it): the socket taken
        // out of the first thread's runtime for it goes back in there.
        let (spread, mut members) = crate::spread::Spread::<Handed>::new(2);
        drop(members.pop());
        let (ports, stats, stopper) = spread_threads(members);
        let mut conns = Vec::new();
        for _ in 0..4 {
            let (s, name) = served_by(ports[0]).await;
            assert_eq!(name, "served-by-0");
            conns.push(s);
        }
        assert_eq!(spread.open(), vec![4, 0]);
        assert_eq!(spread.handed(), 0);
        assert_eq!(stats.open.load(Ordering::Relaxed), 4);
        drop((conns, stopper));
    }
}
