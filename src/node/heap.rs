//! Gives the allocator's free memory back to the system once a flood of
//! connections or streams is over (Envoy's `shrink_heap` overload action,
//! driven by the load falling rather than by a memory threshold).
//!
//! glibc's allocator returns freed memory only from the top of a heap:
//! after 11,000 idle connections closed, the node kept every one of their
//! pages (289 MiB against 19 MiB idle, flat for minutes; docs/src/performance.md,
//! "Memory after floods"). `malloc_trim(0)` hands back every free page of
//! every arena. It walks and locks each arena in turn, so it runs only
//! when the load has fallen to half of its peak (and by at least
//! [`FLOOD`]), and once more when the backend connections the flood left
//! in the pool have aged out ([`POOL_AGED`]); at most once per
//! [`MIN_GAP`], on a blocking thread.

use crate::node::gateway::Gateway;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// A drop in load smaller than this (connections plus requests in
/// flight) is ordinary traffic, not the end of a flood.
pub const FLOOD: u64 = 512;

/// How often the load is looked at.
const TICK: Duration = Duration::from_secs(1);

/// The least time between two trims: a client that opens and closes a
/// flood's worth of connections over and over costs a trim (a walk of
/// every arena, under each arena's lock in turn) once per this, not once
/// per swing.
pub const MIN_GAP: Duration = Duration::from_secs(10);

/// After a flood's trim, the connections it opened to backends still
/// idle in the pool (`dataplane::upstream`, closed after 60 to 90 s
/// unused): their memory goes back with one more trim once they are gone.
pub const POOL_AGED: Duration = Duration::from_secs(95);

/// Why the heap is trimmed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// The load fell to half its peak: the flood is over.
    FloodOver,
    /// [`POOL_AGED`] after the last flood: its backend connections closed.
    PoolAged,
}

/// The load's highest point since the last trim, and the rule for when
/// to trim. Pure: the caller reads the load and the clock.
#[derive(Debug, Default)]
pub struct Watch {
    peak: u64,
    /// When the late trim is due, after a flood's.
    late: Option<Duration>,
    /// When the last trim was.
    last: Option<Duration>,
}

impl Watch {
    /// Takes one reading of the load at `now` (time since any fixed
    /// start); `Some` when the memory the flood used should be given back
    /// now (the peak then starts again here).
    pub fn trim_now(&mut self, load: u64, now: Duration) -> Option<Trim> {
        self.peak = self.peak.max(load);
        // Within the gap the peak is kept: a flood that ended is trimmed
        // once the gap has passed.
        if self.last.is_some_and(|last| now < last + MIN_GAP) {
            return None;
        }
        let fell = self.peak - load;
        let why = if fell >= FLOOD && load <= self.peak / 2 {
            self.peak = load;
            self.late = Some(now + POOL_AGED);
            Trim::FloodOver
        } else if self.late.is_some_and(|due| now >= due) {
            self.late = None;
            Trim::PoolAged
        } else {
            return None;
        };
        self.last = Some(now);
        Some(why)
    }
}

/// Watches the data plane's load once a second until `stop`, trimming
/// the heap after each flood; logs and counts what came back.
pub async fn watch_floods(gw: Weak<Gateway>, mut stop: watch::Receiver<bool>) {
    let mut floods = Watch::default();
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(gw) = gw.upgrade() else { return };
        let peak = floods.peak;
        let load = load_of(&gw);
        let Some(why) = floods.trim_now(load, start.elapsed()) else {
            continue;
        };
        let before = resident_bytes();
        let started = std::time::Instant::now();
        let Ok(trimmed) = tokio::task::spawn_blocking(trim).await else {
            continue;
        };
        let took_ms = started.elapsed().as_millis();
        let released = before.saturating_sub(resident_bytes());
        gw.metrics.heap_trims.inc();
        gw.metrics.heap_released.inc_by(released);
        tracing::info!(
            ?why,
            peak,
            load,
            trimmed,
            released_mib = released >> 20,
            took_ms,
            "gave the allocator's free memory back to the system"
        );
    }
}

/// Open data-plane connections plus requests in flight.
fn load_of(gw: &Arc<Gateway>) -> u64 {
    let open: usize = gw
        .listeners
        .lock()
        .iter()
        .filter(|(name, _, _)| *name == "data")
        .map(|(_, stats, _)| stats.open.load(Relaxed))
        .sum();
    u64::try_from(open).unwrap_or(u64::MAX) + gw.drain.in_flight()
}

/// The process's resident memory in bytes (0 when `/proc` cannot say).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

/// Asks glibc to return every free page of every arena; whether it
/// returned any. The only `unsafe` in the workspace (a test counts it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and touches only glibc's own
    // free lists, under each arena's lock; any thread may call it at any
    // time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators (musl's, the BSDs') have no such call.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_when_a_flood_falls_to_half_and_not_on_ordinary_swings() {
        // (load, trim?) in order, MIN_GAP apart: one watch across the table.
        let readings = [
            (10, None),
            (400, None),
            (100, None), // fell 300 < FLOOD: ordinary traffic
            (11_000, None),
            (9_000, None),                  // fell 2,000 but still above half
            (5_500, Some(Trim::FloodOver)), // half of the peak: the flood is over
            (5_400, None),                  // the peak is 5,500 now
            (2_000, Some(Trim::FloodOver)), // fell 3,500 more, below half again
            (1_800, None),
            (0, Some(Trim::FloodOver)), // fell 2,000 to nothing
            (0, None),
            (300, None),
            (0, None), // 300 is no flood
        ];
        let mut w = Watch::default();
        for (i, (load, want)) in readings.into_iter().enumerate() {
            let now = MIN_GAP * u32::try_from(i).unwrap();
            assert_eq!(w.trim_now(load, now), want, "reading {i}: load {load}");
        }
    }

    #[test]
    fn a_client_swinging_floods_gets_one_trim_per_gap() {
        let mut w = Watch::default();
        let mut trims = 0;
        // 600 connections opened and closed every other second for a minute.
        for s in 0..60u64 {
            let load = if s % 2 == 0 { 600 } else { 0 };
            if w.trim_now(load, Duration::from_secs(s)).is_some() {
                trims += 1;
            }
        }
        let most = 60 / MIN_GAP.as_secs() + 1;
        assert!((1..=most).contains(&trims), "{trims} trims in 60 s");
    }

    #[test]
    fn the_pool_is_trimmed_once_more_after_the_last_flood() {
        let mut w = Watch::default();
        let at = Duration::from_secs;
        assert_eq!(w.trim_now(2_000, at(0)), None);
        assert_eq!(w.trim_now(0, at(1)), Some(Trim::FloodOver));
        // A second flood restarts the wait for its pool; within the gap
        // its end waits for the gap.
        assert_eq!(w.trim_now(2_000, at(5)), None);
        assert_eq!(
            w.trim_now(0, at(6)),
            None,
            "within MIN_GAP of the last trim"
        );
        assert_eq!(w.trim_now(0, at(11)), Some(Trim::FloodOver));
        let due = at(11) + POOL_AGED;
        assert_eq!(w.trim_now(0, due - at(1)), None);
        assert_eq!(w.trim_now(0, due), Some(Trim::PoolAged));
        assert_eq!(w.trim_now(0, due + at(600)), None, "once, not every tick");
    }

    #[test]
    fn resident_memory_is_read_and_trimming_never_fails() {
        assert!(resident_bytes() > 0);
        let _ = trim();
    }
}
