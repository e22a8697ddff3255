//! A listener's settings: its [`Limits`] (connection budget and
//! timeouts) and its [`ListenConfig`].

use std::sync::Arc;
use std::time::Duration;

use crate::budget::Stats;
use crate::tls::ServerTls;

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

/// One listener's settings.
#[derive(Clone, Debug)]
pub struct ListenConfig {
    /// `data`, `admin` or `raft`: in logs and metric labels.
    pub name: &'static str,
    pub tls: Option<Arc<ServerTls>>,
    pub limits: Limits,
    pub stats: Arc<Stats>,
    /// Whether each request carries the [`Peer`](crate::app::Peer) extension (the admin
    /// API's source networks and the Raft port's client certificates
    /// read it). The data plane reads neither, and skips its three
    /// allocations per request.
    pub peer: bool,
}
