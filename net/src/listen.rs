//! Serving one listener: optional TLS, HTTP/1.1 and HTTP/2, a connection
//! budget, a header-read (and TLS handshake) timeout, an idle timeout, a
//! send timeout, and a graceful stop. Every port of a node (data plane,
//! admin, Raft) is served here, each with its own budget, so a flood on
//! one never takes the others' file descriptors.
//!
//! This file owns the accept loop ([`serve`], [`serve_plain`]) and the
//! hand-off of connections between a spread's threads; the rest lives
//! beside it: what a listener serves (`app`), its settings (`settings`),
//! its budget and counters (`budget`), its stop (`stop`), one connection
//! (`connection`, the lean HTTP/1 `server` then hyper), the connection's
//! watchdog (`watchdog`, fed by `watched`), and reading a body (`body`).
//! The public names are re-exported here.
//!
//! Architecture Invariant: a connection counts against its listener's
//! budget from accept to close; over the budget a new connection is closed
//! at once (never queued), and is counted.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::app::Handlers;
use crate::budget::Open;
use crate::connection::connection;
use crate::spread::{Member, Seat};
use crate::stop::{stopped, Stop};

pub use crate::app::{App, NoPlain, Peer, Plain, PlainRequest};
pub use crate::body::{read_body, BodyError};
pub use crate::budget::{raise_fd_limit, Stats};
pub use crate::settings::{Limits, ListenConfig};

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

#[cfg(test)]
pub(crate) mod tests;
