//! Serving one accepted connection: its TLS handshake, the lean HTTP/1
//! server (`server`) first, then hyper's HTTP/1 and HTTP/2 from the byte
//! the lean server stopped at, under the connection's watchdog and the
//! listener's stop; and the 400 for a request without exactly one `Host`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::app::{App, Handlers, Peer, Plain};
use crate::http1::HeadLines;
use crate::server;
use crate::settings::ListenConfig;
use crate::stop::Stop;
use crate::watchdog::{watchdog_closes, ConnState, InFlight, Look};
use crate::watched::{Tracked, UnreadMark, Watched};

pub(crate) async fn connection<A: App, P: Plain>(
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

pub(crate) async fn serve_connection<I, A: App, P: Plain>(
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
    // hyper takes the connection at the first that is not (see `server`).
    let io = if h2 {
        io
    } else {
        let lean = server::serve(io, peer.as_ref(), &app, plain.as_deref(), &state, &stop);
        tokio::pin!(lean);
        loop {
            tokio::select! {
                // In this order: the connection first, and no random
                // start per wake (a random number each time otherwise).
                biased;
                ended = lean.as_mut() => match ended {
                    server::Ended::Closed => return,
                    server::Ended::Handoff(mut io, read) => {
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
/// here (`server`), so one place answers them.
pub(crate) fn host_refusal<B>(req: &Request<B>) -> Option<Response> {
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
