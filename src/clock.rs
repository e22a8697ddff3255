//! The node's clocks, one helper each: a monotonic millisecond clock for
//! everything measured on this node (the request path, health timers), the
//! same clock through tokio's time source for paused-clock tests, and the
//! wall clock for what travels between nodes or to people (pin expiries,
//! event times).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds on a process-wide monotonic clock (never goes backwards,
/// unaffected by wall-clock jumps).
pub fn now_ms() -> u64 {
    ms_at(Instant::now())
}

/// [`now_ms`] at `at`, an instant already read: the request path reads
/// the clock once where one reading serves (a read is ~20 ns, and was the
/// largest single item of a proxied request's user time).
pub fn ms_at(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(origin()).as_millis()).unwrap_or(u64::MAX)
}

/// Nanoseconds on the same monotonic clock as [`now_ms`], for the quota
/// buckets (a bucket of 10,000 tokens per second needs finer than ms).
pub fn now_ns() -> u64 {
    ns_at(Instant::now())
}

/// [`now_ns`] at `at`, an instant already read.
pub fn ns_at(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(origin()).as_nanos()).unwrap_or(u64::MAX)
}

fn origin() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// The same clock as [`now_ms`], read through tokio's time source: equal to
/// it in production, and moved by a paused test clock (`tokio::time::
/// advance`), so the health task's timers and ramps can be tested without
/// waiting. The request path keeps [`now_ms`], the cheaper read.
pub fn tokio_now_ms() -> u64 {
    let now = tokio::time::Instant::now().into_std();
    u64::try_from(now.saturating_duration_since(origin()).as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, by the wall clock (0 before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Seconds since the Unix epoch, by the wall clock.
pub fn unix_s() -> u64 {
    unix_ms() / 1000
}
