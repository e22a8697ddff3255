//! A listener's connection budget and its counters: [`Stats`], the
//! place a connection holds from accept to close ([`Open`]), the per-address
//! cap ([`PerIp`]), and the process's open-files limit the budgets must
//! stay under.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Counters of one listener (shared by its accept loops on every thread).
#[derive(Debug, Default)]
pub struct Stats {
    pub open: AtomicUsize,
    pub accepted: AtomicU64,
    /// Closed at accept: over the budget.
    pub refused: AtomicU64,
    /// Closed at accept: their source address had
    /// `Limits::max_connections_per_ip` open already.
    pub refused_per_ip: AtomicU64,
    /// Open connections per source address, while a cap is set.
    pub(crate) per_ip: PerIp,
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

/// Decrements the open count (and its source address's, when counted)
/// when a connection ends, however it ends.
#[derive(Debug)]
pub(crate) struct Open(pub(crate) Arc<Stats>, pub(crate) Option<IpAddr>);

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
pub(crate) struct PerIp(pub(crate) parking_lot::Mutex<std::collections::HashMap<IpAddr, usize>>);

impl PerIp {
    /// Counts a connection from `ip` (an IPv4-mapped IPv6 address as its
    /// IPv4 one) if fewer than `cap` are open; the address it was counted
    /// under, or `None` when refused.
    pub(crate) fn enter(&self, ip: IpAddr, cap: usize) -> Option<IpAddr> {
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

    pub(crate) fn leave(&self, ip: IpAddr) {
        let mut open = self.0.lock();
        if let Some(n) = open.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&ip);
            }
        }
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
