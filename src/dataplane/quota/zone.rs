//! This node's share of a zone's capacity units: who holds them, by
//! priority, and who waits for them.
//!
//! A request takes its units at once when the shedding rule
//! (`zonegate_cluster::quota::shed`) lets it and nobody of its priority or
//! higher is waiting; otherwise it may wait, up to `[quotas]
//! queue_timeout`, in a queue ordered by priority and then by arrival.
//! Released units go to the queue's head while the rule lets it take them,
//! so a P0 request waits for the next unit anybody returns and a P2 request
//! only for units nobody above it wants. The queue holds at most as many
//! requests as the node has units (and never more than [`MAX_WAITERS`]); a
//! request that finds it full displaces the newest waiter of a lower
//! priority, or is refused at once. Nothing waits without a bound.
//!
//! One lock per zone guards the counts and the queue together, so a unit
//! is never released past a waiter nor taken by two requests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{Gauge, IntCounter};
use tokio::sync::oneshot;
use zonegate_cluster::quota::{self as arith, Held, Shed};
use zonegate_cluster::{Priority, ZoneId};

use crate::telemetry::metrics::Metrics;

/// The most requests that wait for one zone's units on one node.
pub const MAX_WAITERS: u64 = 4096;

/// This node's share of one zone's capacity units.
pub struct ZoneCapacity {
    /// Sum of the zone's backends' `capacity` (0: undeclared, no shedding).
    pub total: u64,
    /// This node's share of `total` (its group shares the zone's units).
    pub share: AtomicU64,
    reserve: f64,
    /// Whether requests may wait for units (`queue_timeout` above zero).
    queued: bool,
    state: Mutex<State>,
    ratio: Gauge,
    granted: IntCounter,
    timed_out: IntCounter,
    displaced: IntCounter,
}

#[derive(Default)]
struct State {
    held: Held,
    /// Waiters by priority (P0 first), each in arrival order.
    queues: [VecDeque<Waiter>; 3],
    next_id: u64,
}

struct Waiter {
    id: u64,
    units: u64,
    /// Told when the units are taken for it; dropped when it is displaced.
    grant: oneshot::Sender<()>,
}

/// Units held by one request, given back when dropped.
pub struct Units {
    zone: Arc<ZoneCapacity>,
    priority: Priority,
    units: u64,
}

impl Drop for Units {
    fn drop(&mut self) {
        self.zone.release(self.priority, self.units);
    }
}

impl State {
    fn waiting(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// Whether a request of `p` must queue behind somebody already waiting.
    fn behind(&self, p: Priority) -> bool {
        self.queues[..=p as usize].iter().any(|q| !q.is_empty())
    }
}

impl ZoneCapacity {
    pub fn new(zone: &ZoneId, total: u64, reserve: f64, queued: bool, metrics: &Metrics) -> Self {
        let waits = |outcome| {
            metrics
                .zone_queued
                .with_label_values(&[zone.as_str(), outcome])
        };
        Self {
            total,
            share: AtomicU64::new(total),
            reserve,
            queued,
            state: Mutex::new(State::default()),
            ratio: metrics
                .zone_capacity_used
                .with_label_values(&[zone.as_str()]),
            granted: waits("granted"),
            timed_out: waits("timeout"),
            displaced: waits("displaced"),
        }
    }

    /// Units in flight from this node, by priority.
    pub fn held(&self) -> Held {
        self.state.lock().held
    }

    /// Requests waiting for units.
    pub fn waiting(&self) -> usize {
        self.state.lock().waiting()
    }

    fn rule(&self, state: &State, p: Priority, units: u64) -> Option<Shed> {
        let share = self.share.load(Ordering::Relaxed);
        // Without the queue a P0 past its reserve could not wait for the
        // next unit, so the reserve stays free whatever P0 holds (P2 stops
        // at 1 − 2 × reserve of the units, P1 at 1 − reserve).
        let held = if self.queued {
            state.held
        } else {
            Held {
                p2: state.held.total(),
                ..Held::default()
            }
        };
        arith::shed(p, held, units, share, self.reserve)
    }

    /// Takes `units` at once, or says why not: the rule's reason, or (when
    /// the rule would let it but somebody of its priority or higher waits)
    /// what the rule says with that waiter's need, which is never less.
    fn try_take(&self, state: &mut State, p: Priority, units: u64) -> Result<(), Shed> {
        let refused = self.rule(state, p, units).or_else(|| {
            state.behind(p).then_some(match p {
                Priority::P0 => Shed::Full,
                p => Shed::Priority(p),
            })
        });
        match refused {
            Some(shed) => Err(shed),
            None => {
                *state.held.of(p) += units;
                Ok(())
            }
        }
    }

    /// Takes `units` for a request of priority `p` at once, or says why not.
    pub fn take(self: &Arc<Self>, p: Priority, units: u64) -> Result<Units, Shed> {
        let mut state = self.state.lock();
        self.try_take(&mut state, p, units)?;
        self.publish(&state);
        Ok(self.units(p, units))
    }

    /// Like [`take`](Self::take), but waits up to `timeout` for the units
    /// when they are short: refused when the queue is full of requests of
    /// its priority or higher, when a higher priority displaces it, or
    /// when the time is up.
    pub async fn take_or_wait(
        self: &Arc<Self>,
        p: Priority,
        units: u64,
        timeout: Duration,
    ) -> Result<Units, Shed> {
        let (id, rx, shed) = {
            let mut state = self.state.lock();
            let shed = match self.try_take(&mut state, p, units) {
                Ok(()) => {
                    self.publish(&state);
                    return Ok(self.units(p, units));
                }
                Err(shed) => shed,
            };
            // No wait, or units the rule would refuse however few were
            // held: refused at once.
            let share = self.share.load(Ordering::Relaxed);
            if timeout.is_zero()
                || arith::shed(p, Held::default(), units, share, self.reserve).is_some()
            {
                return Err(shed);
            }
            let room = share.clamp(1, MAX_WAITERS) as usize;
            if state.waiting() >= room {
                // Full: the newest of the lowest priority below this one
                // gives way, else this one does.
                let Some(lower) = state.queues[p as usize + 1..]
                    .iter_mut()
                    .rev()
                    .find(|q| !q.is_empty())
                else {
                    return Err(shed);
                };
                lower.pop_back();
                self.displaced.inc();
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.queues[p as usize].push_back(Waiter {
                id,
                units,
                grant: tx,
            });
            (id, rx, shed)
        };
        let mut wait = Waiting {
            zone: self,
            priority: p,
            units,
            id,
            rx,
        };
        match tokio::time::timeout(timeout, &mut wait.rx).await {
            Ok(Ok(())) => {
                wait.settled();
                Ok(self.units(p, units))
            }
            // Displaced by a higher priority.
            Ok(Err(_)) => {
                wait.settled();
                Err(shed)
            }
            // The time is up, unless the units were granted in the same
            // instant: then they are its own.
            Err(_) if wait.leave() => Ok(self.units(p, units)),
            Err(_) => {
                self.timed_out.inc();
                Err(shed)
            }
        }
    }

    fn units(self: &Arc<Self>, priority: Priority, units: u64) -> Units {
        Units {
            zone: Arc::clone(self),
            priority,
            units,
        }
    }

    fn release(&self, p: Priority, units: u64) {
        let mut state = self.state.lock();
        let held = state.held.of(p);
        *held = held.saturating_sub(units);
        self.grant(&mut state);
        self.publish(&state);
    }

    /// Gives units to the queue's head while the rule lets it take them. A
    /// head that does not fit stops the queue: a lower priority never takes
    /// what a higher one is waiting for.
    fn grant(&self, state: &mut State) {
        while let Some(r) = state.queues.iter().position(|q| !q.is_empty()) {
            let p = Priority::ALL[r];
            let units = state.queues[r][0].units;
            if self.rule(state, p, units).is_some() {
                return;
            }
            let Some(w) = state.queues[r].pop_front() else {
                return;
            };
            if w.grant.send(()).is_ok() {
                *state.held.of(p) += units;
                self.granted.inc();
            }
        }
    }

    /// Looks at the queue again after this node's share changed.
    pub fn share_changed(&self) {
        let mut state = self.state.lock();
        self.grant(&mut state);
        self.publish(&state);
    }

    fn publish(&self, state: &State) {
        let share = self.share.load(Ordering::Relaxed);
        if share > 0 {
            self.ratio.set(state.held.total() as f64 / share as f64);
        }
    }
}

/// A request in the queue. Dropped before it is settled (the client went
/// away, the time is up): it leaves the queue, and units granted to it in
/// the meantime go back.
struct Waiting<'a> {
    zone: &'a Arc<ZoneCapacity>,
    priority: Priority,
    units: u64,
    id: u64,
    rx: oneshot::Receiver<()>,
}

impl Waiting<'_> {
    /// The grant (or the displacement) was received: nothing to undo.
    fn settled(&mut self) {
        self.rx.close();
        self.id = u64::MAX;
    }

    /// Leaves the queue; true when the units were granted before it could.
    fn leave(&mut self) -> bool {
        let id = std::mem::replace(&mut self.id, u64::MAX);
        if id == u64::MAX {
            return false;
        }
        let mut state = self.zone.state.lock();
        let queue = &mut state.queues[self.priority as usize];
        if let Some(i) = queue.iter().position(|w| w.id == id) {
            queue.remove(i);
            return false;
        }
        drop(state);
        self.rx.try_recv().is_ok()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.leave() {
            self.zone.release(self.priority, self.units);
        }
    }
}

#[cfg(test)]
mod tests;
