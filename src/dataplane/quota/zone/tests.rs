//! The zone's units: priority order, bounded waits, displacement, and no
//! unit lost or doubled by a waiter that goes away.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use zonegate_cluster::quota::Shed;
use zonegate_cluster::{Priority, ZoneId};

use super::ZoneCapacity;
use crate::telemetry::metrics::Metrics;

const LONG: Duration = Duration::from_secs(30);

fn zone(total: u64, reserve: f64) -> Arc<ZoneCapacity> {
    Arc::new(ZoneCapacity::new(
        &ZoneId::new("az-a"),
        total,
        reserve,
        true,
        &Metrics::new(),
    ))
}

/// A request of `p` waiting (up to 30 s) for `units` in a task of its own;
/// its units are given back at once.
fn waiter(
    z: &Arc<ZoneCapacity>,
    p: Priority,
    units: u64,
) -> tokio::task::JoinHandle<Result<(), Shed>> {
    let z = Arc::clone(z);
    tokio::spawn(async move { z.take_or_wait(p, units, LONG).await.map(drop) })
}

/// Polls until `n` requests wait (generous: a busy machine).
async fn until_waiting(z: &ZoneCapacity, n: usize) {
    for _ in 0..3000 {
        if z.waiting() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} waiting, wanted {n}", z.waiting());
}

#[tokio::test]
async fn a_released_unit_goes_to_the_highest_priority_waiter_first() {
    // Three units (so three may wait), all held by P2.
    let z = zone(3, 0.0);
    let held: Vec<_> = (0..3).map(|_| z.take(Priority::P2, 1).unwrap()).collect();
    let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    // Arriving P2, P1, P0: served P0, P1, P2.
    let mut tasks = Vec::new();
    for (i, p) in [Priority::P2, Priority::P1, Priority::P0]
        .into_iter()
        .enumerate()
    {
        let (zone, tx) = (Arc::clone(&z), tx.clone());
        tasks.push(tokio::spawn(async move {
            let units = zone.take_or_wait(p, 1, LONG).await.unwrap();
            tx.send(p).unwrap();
            // Held to the end of the test.
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(units);
        }));
        until_waiting(&z, i + 1).await;
    }
    // A P1 arriving now queues behind the P1 already waiting.
    assert_eq!(z.take(Priority::P1, 1).err(), Some(Shed::Full));
    let mut got = Vec::new();
    for unit in held {
        drop(unit);
        got.push(order.recv().await.unwrap());
    }
    assert_eq!(got, [Priority::P0, Priority::P1, Priority::P2]);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!((z.held().total(), z.waiting()), (0, 0));
}

#[tokio::test]
async fn a_lower_priority_never_takes_units_a_higher_one_waits_for() {
    let z = zone(4, 0.0);
    let first = z.take(Priority::P2, 2).unwrap();
    let _second = z.take(Priority::P2, 2).unwrap();
    // A P0 request of 4 units waits for the whole zone.
    let big = waiter(&z, Priority::P0, 4);
    until_waiting(&z, 1).await;
    drop(first);
    // Two units free, but the P0 at the head needs four: a P2 of one
    // neither takes them at once nor from the queue.
    assert!(z.take(Priority::P2, 1).is_err());
    let small = z
        .take_or_wait(Priority::P2, 1, Duration::from_millis(50))
        .await;
    assert_eq!(small.err(), Some(Shed::Priority(Priority::P2)));
    assert_eq!(z.held().total(), 2);
    drop(_second);
    big.await.unwrap().unwrap();
    assert_eq!((z.held().total(), z.waiting()), (0, 0));
}

#[tokio::test]
async fn a_wait_ends_with_its_timeout_and_leaves_the_queue() {
    let z = zone(1, 0.2);
    let held = z.take(Priority::P0, 1).unwrap();
    let refused = z
        .take_or_wait(Priority::P0, 1, Duration::from_millis(30))
        .await;
    assert_eq!(refused.err(), Some(Shed::Full));
    assert_eq!(z.waiting(), 0);
    drop(held);
    assert_eq!(z.held().total(), 0);
    // No wait at all, or a request no share could ever hold: refused at once.
    let held = z.take(Priority::P0, 1).unwrap();
    assert!(z
        .take_or_wait(Priority::P0, 1, Duration::ZERO)
        .now_or_never()
        .unwrap()
        .is_err());
    assert!(z
        .take_or_wait(Priority::P0, 2, LONG)
        .now_or_never()
        .unwrap()
        .is_err());
    assert_eq!(z.waiting(), 0);
    drop(held);
}

#[tokio::test]
async fn a_full_queue_displaces_its_newest_lower_priority_waiter() {
    // One unit: one waiter at most.
    let z = zone(1, 0.0);
    let held = z.take(Priority::P2, 1).unwrap();
    let low = waiter(&z, Priority::P2, 1);
    until_waiting(&z, 1).await;
    let high = waiter(&z, Priority::P0, 1);
    // The P2 waiter gives way (refused long before its 30 s).
    assert_eq!(low.await.unwrap().err(), Some(Shed::Full));
    until_waiting(&z, 1).await;
    // A P2 finding the queue full of higher priorities is refused at once.
    let late = z
        .take_or_wait(Priority::P2, 1, LONG)
        .now_or_never()
        .unwrap();
    assert_eq!(late.err(), Some(Shed::Full));
    drop(held);
    high.await.unwrap().unwrap();
    assert_eq!((z.held().total(), z.waiting()), (0, 0));
}

#[tokio::test]
async fn a_waiter_that_goes_away_leaves_no_units_behind() {
    let z = zone(1, 0.0);
    let held = z.take(Priority::P1, 1).unwrap();
    // Gone while waiting: it leaves the queue.
    let mut gone = Box::pin(z.take_or_wait(Priority::P1, 1, LONG));
    assert!((&mut gone).now_or_never().is_none());
    assert_eq!(z.waiting(), 1);
    drop(gone);
    assert_eq!(z.waiting(), 0);
    // Gone after the units were granted to it but before it saw them:
    // they go back.
    let mut gone = Box::pin(z.take_or_wait(Priority::P1, 1, LONG));
    assert!((&mut gone).now_or_never().is_none());
    drop(held);
    assert_eq!((z.held().p1, z.waiting()), (1, 0), "granted to the waiter");
    drop(gone);
    assert_eq!(z.held().total(), 0);
}

/// Many requests taking, waiting and giving back at once on two threads:
/// the zone never holds more than its share, and nothing is left held or
/// waiting at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waiters_never_overfill_the_zone_or_lose_a_unit() {
    let z = zone(8, 0.2);
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let (z, peak) = (Arc::clone(&z), Arc::clone(&peak));
            tokio::spawn(async move {
                let p = [Priority::P0, Priority::P1, Priority::P2][(i % 3) as usize];
                let units = 1 + i % 4 / 3 * 3; // ones and fours
                for _ in 0..200 {
                    let wait = Duration::from_micros(200 * (i % 5));
                    if let Ok(u) = z.take_or_wait(p, units, wait).await {
                        peak.fetch_max(z.held().total(), std::sync::atomic::Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        drop(u);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    assert!((1..=8).contains(&peak), "peak {peak} of 8");
    assert_eq!((z.held().total(), z.waiting()), (0, 0));
}

#[test]
fn without_the_queue_the_reserve_stays_free_whatever_p0_holds() {
    for (queued, p2_may_take) in [(true, 6), (false, 2)] {
        let z = ZoneCapacity::new(&ZoneId::new("az-a"), 10, 0.2, queued, &Metrics::new());
        let z = Arc::new(z);
        // P0 holds its 40 %: with the queue the rest is anybody's; without
        // it P2 still stops at 60 % of the units.
        let _p0: Vec<_> = (0..4).map(|_| z.take(Priority::P0, 1).unwrap()).collect();
        let p2: Vec<_> = (0..10)
            .map_while(|_| z.take(Priority::P2, 1).ok())
            .collect();
        assert_eq!(p2.len(), p2_may_take, "queued {queued}");
    }
}
