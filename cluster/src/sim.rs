//! Hooks for the deterministic simulation (`cluster/tests/sim.rs`),
//! compiled only with the test-only feature `sim` (the crate's own
//! dev-dependency turns it on for its tests; no release build has it).
//!
//! Inert until [`install`]: the hooks are per thread, and the simulation
//! runs every node on one current-thread runtime on the test's thread, so
//! other tests in the same process (and every production path) see none of
//! it. Installed, they replace exactly four things:
//!
//! - the network: [`Net`] carries each signed RPC (the same headers and
//!   bytes as over HTTP) to the peer's own axum router in-process, with
//!   whatever loss, delay and partition the simulation decides;
//! - the wall clock (`clock::unix_ms` and `unix_ms_on`): the runtime's
//!   paused clock from a fixed epoch, plus a per-node skew and jumps;
//! - the monotonic leader clock: per node incarnation, on the paused clock;
//! - randomness (election timeouts, cluster ids): one seeded generator.
//!
//! Besides, a node's store can be made slow ([`set_disk_delay`]: every
//! flush first waits that long, in simulated time); each command a leader
//! hands to Raft is noted with the true simulated time of its stamp
//! ([`stamps`], for the checker's dwell rule); and, under
//! `sim-bug-ack-before-commit` only, a planted bug the safety checker must
//! catch can be switched on.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use crate::view::NodeId;

/// An RPC's answer in flight.
pub type Answer = Pin<Box<dyn Future<Output = Result<axum::response::Response, String>> + Send>>;

/// The simulated network.
pub trait Net: Send + Sync + 'static {
    /// Node `node`'s Raft RPC router is up (again, after a restart).
    fn serve(&self, node: NodeId, router: axum::Router);
    /// Carry one RPC from `from` to `to` and bring its answer back within
    /// `ttl`; `Err` is an unreachable peer (a cut link, a down node, a
    /// lost message).
    fn exchange(
        &self,
        from: NodeId,
        to: NodeId,
        request: axum::http::Request<axum::body::Body>,
        ttl: Duration,
    ) -> Answer;
}

struct Sim {
    net: std::sync::Arc<dyn Net>,
    origin: tokio::time::Instant,
    epoch_ms: u64,
    /// Wall-clock offset per node (skew), in ms; applies on top of `jump`.
    skew: BTreeMap<NodeId, i64>,
    /// Each node's current incarnation: its boot value and monotonic origin.
    boots: BTreeMap<NodeId, (u64, tokio::time::Instant)>,
    rng: u64,
    bug: bool,
    /// Commands handed to Raft, with the true time of their stamp.
    stamps: Vec<Stamp>,
    /// Per data directory: how long each of its store's flushes waits.
    disk: BTreeMap<PathBuf, Duration>,
    /// By log index, the leader clock of each applied command that
    /// carried one (every node applies the same entry at an index).
    applied: BTreeMap<u64, crate::command::LeaderClock>,
}

/// A command a leader stamped and handed to Raft: what identifies its
/// decision record (actor, reason, the leader's wall-clock stamp) and the
/// true simulated time of the stamp, in ms since [`install`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub actor: String,
    pub reason: String,
    pub at_ms: u64,
    pub true_ms: u64,
}

thread_local! {
    static SIM: RefCell<Option<Rc<RefCell<Sim>>>> = const { RefCell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut Sim) -> T) -> Option<T> {
    let sim = SIM.with(|s| s.borrow().clone())?;
    let mut sim = sim.borrow_mut();
    Some(f(&mut sim))
}

/// Install the simulation on this thread: call inside the current-thread
/// runtime (paused clock) that runs the nodes. `epoch_ms` is the wall
/// clock at the runtime's start.
pub fn install(net: std::sync::Arc<dyn Net>, seed: u64, epoch_ms: u64) {
    let sim = Sim {
        net,
        origin: tokio::time::Instant::now(),
        epoch_ms,
        skew: BTreeMap::new(),
        boots: BTreeMap::new(),
        rng: seed ^ 0x9E37_79B9_7F4A_7C15,
        bug: false,
        stamps: Vec::new(),
        disk: BTreeMap::new(),
        applied: BTreeMap::new(),
    };
    SIM.with(|s| *s.borrow_mut() = Some(Rc::new(RefCell::new(sim))));
}

/// Remove the simulation from this thread.
pub fn uninstall() {
    SIM.with(|s| *s.borrow_mut() = None);
}

/// Set node `node`'s wall clock `offset_ms` away from the true time (a
/// jump when changed during a run).
pub fn set_skew(node: NodeId, offset_ms: i64) {
    with(|s| s.skew.insert(node, offset_ms));
}

/// Node `node` restarts: a new process, so a new boot value and monotonic
/// origin for its leader clock.
pub fn restart(node: NodeId) {
    with(|s| s.boots.remove(&node));
}

/// Switch the planted bug on (only with `sim-bug-ack-before-commit`).
pub fn plant_bug(on: bool) {
    with(|s| s.bug = on);
}

/// Make every flush of the store under data directory `dir` wait
/// `delay` first (a slow disk); `Duration::ZERO` makes it fast again.
pub fn set_disk_delay(dir: &Path, delay: Duration) {
    with(|s| {
        if delay.is_zero() {
            s.disk.remove(dir);
        } else {
            s.disk.insert(dir.to_path_buf(), delay);
        }
    });
}

/// Every command stamped and handed to Raft so far, in order.
pub fn stamps() -> Vec<Stamp> {
    with(|s| s.stamps.clone()).unwrap_or_default()
}

/// Every applied command's leader clock (`node`, `boot`, `mono_ms`), by
/// log index, in log order.
pub fn applied_clocks() -> Vec<(u64, NodeId, u64, u64)> {
    with(|s| {
        s.applied
            .iter()
            .map(|(index, c)| (*index, c.node, c.boot, c.mono_ms))
            .collect()
    })
    .unwrap_or_default()
}

/// Note that the command at log `index` applied (a refused one changes
/// nothing, the dwell clock included).
pub(crate) fn applied(index: u64, cmd: &crate::Command) {
    if let Some(clock) = cmd.fields().clock {
        with(|s| s.applied.insert(index, clock));
    }
}

/// splitmix64: small, seeded, good enough for timeouts and ids.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn net() -> Option<std::sync::Arc<dyn Net>> {
    with(|s| s.net.clone())
}

/// The simulated wall clock of `node` (`None`: the true time, no skew).
pub(crate) fn unix_ms(node: Option<NodeId>) -> Option<u64> {
    with(|s| {
        let elapsed = crate::clock::millis(s.origin.elapsed());
        let now = s.epoch_ms.saturating_add(elapsed);
        let skew = node.and_then(|n| s.skew.get(&n).copied()).unwrap_or(0);
        now.saturating_add_signed(skew)
    })
}

/// `node`'s boot value and milliseconds on its monotonic clock.
pub(crate) fn leader_clock(node: NodeId) -> Option<(u64, u64)> {
    with(|s| {
        if !s.boots.contains_key(&node) {
            let boot = next(&mut s.rng);
            s.boots.insert(node, (boot, tokio::time::Instant::now()));
        }
        let (boot, start) = s.boots[&node];
        (boot, crate::clock::millis(start.elapsed()))
    })
}

/// How long a flush of the store under `dir` waits (a slow disk).
pub(crate) fn disk_delay(dir: &Path) -> Option<Duration> {
    with(|s| s.disk.get(dir).copied()).flatten()
}

/// Note `cmd`, just stamped by its leader, as handed to Raft now.
pub(crate) fn stamped(cmd: &crate::Command) {
    let f = cmd.fields();
    with(|s| {
        let stamp = Stamp {
            actor: f.actor.to_owned(),
            reason: f.reason.to_owned(),
            at_ms: f.at_ms,
            true_ms: crate::clock::millis(s.origin.elapsed()),
        };
        s.stamps.push(stamp);
    });
}

/// The next seeded random number.
pub(crate) fn random() -> Option<u64> {
    with(|s| next(&mut s.rng))
}

/// Whether the planted bug is on.
#[cfg(feature = "sim-bug-ack-before-commit")]
pub(crate) fn bug() -> bool {
    with(|s| s.bug).unwrap_or(false)
}
