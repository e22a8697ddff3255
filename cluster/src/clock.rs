//! Wall-clock and duration helpers shared by the run-time modules. Pure
//! cores (`state`, `detect`) never call [`now_ms`]: they are handed `now`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Whole milliseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch: the leader's stamp on a command, the
/// reporters' period ends. A clock before 1970 reads as 0.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_saturates() {
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
