//! Wall-clock and duration helpers shared by the run-time modules. Pure
//! cores (`state`, `detect`) never call [`unix_ms`]: they are handed `now`.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::command::LeaderClock;
use crate::view::NodeId;

/// Whole milliseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch: the leader's stamp on a command, the
/// reporters' period ends. A clock before 1970 reads as 0.
pub(crate) fn unix_ms() -> u64 {
    #[cfg(feature = "sim")]
    if let Some(now) = crate::sim::unix_ms(None) {
        return now;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// [`unix_ms`] as node `node` reads it: the same clock (the simulation
/// gives each node its own skew).
pub(crate) fn unix_ms_on(node: NodeId) -> u64 {
    #[cfg(feature = "sim")]
    if let Some(now) = crate::sim::unix_ms(Some(node)) {
        return now;
    }
    let _ = node;
    unix_ms()
}

/// This process's monotonic origin and its boot value, fixed at the first
/// call (after the process started, so a reading never exceeds the time
/// since start).
fn origin() -> &'static (Instant, u64) {
    static ORIGIN: OnceLock<(Instant, u64)> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        // The boot value tells two processes of one node apart: the wall
        // clock's nanoseconds at start, mixed with the process id.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (
            Instant::now(),
            nanos ^ u64::from(std::process::id()).rotate_left(40),
        )
    })
}

/// The leader's [`LeaderClock`] stamp for a command it proposes now: its
/// id, this process's boot value, and milliseconds on the monotonic clock.
pub(crate) fn leader_clock(node: NodeId) -> LeaderClock {
    #[cfg(feature = "sim")]
    if let Some((boot, mono_ms)) = crate::sim::leader_clock(node) {
        return LeaderClock {
            node,
            boot,
            mono_ms,
        };
    }
    let (start, boot) = origin();
    LeaderClock {
        node,
        boot: *boot,
        mono_ms: millis(start.elapsed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_clock_is_monotonic_within_a_process() {
        let a = leader_clock(3);
        let b = leader_clock(3);
        assert!(a.same_clock(&b));
        assert!(b.mono_ms >= a.mono_ms);
        assert!(!a.same_clock(&leader_clock(4)));
    }

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
