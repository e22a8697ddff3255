//! Connections spread evenly over the threads that serve one address
//! (Envoy's exact connection balance). Each data-plane thread accepts on a
//! `SO_REUSEPORT` socket of its own, and the kernel picks the socket by a
//! hash of the connection's addresses: 32 connections land 22 and 10 as
//! often as 16 and 16, 256 land 136 and 120. With 22 and 10 the lighter
//! thread runs out of work while the busier one's requests queue
//! (measured in docs/src/performance.md, "Where the time goes"; at 256 the split
//! changed nothing measurable). A thread that accepts a connection while
//! it serves two or more more than the least busy thread hands it over
//! (before any byte is read: the TLS handshake is that thread's work too).
//!
//! Architecture Invariant: a member's count covers every connection it
//! serves, from the accept (or handover) to the close, so the counts are
//! what the threads carry, not what the kernel sent them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// A connection handed to a thread, with its place in that thread's count.
type Inbox<T> = mpsc::UnboundedSender<(T, Seat<T>)>;

/// The threads serving one address, their open connections, and a way to
/// hand one a connection another accepted (`T`).
#[derive(Debug)]
pub struct Spread<T> {
    open: Box<[AtomicUsize]>,
    inboxes: Box<[Inbox<T>]>,
    /// Connections handed from the thread that accepted them to another.
    handed: AtomicU64,
}

impl<T> Spread<T> {
    /// A spread over `n` threads, and each one's member (its inbox of
    /// handed connections), in order.
    pub fn new(n: usize) -> (Arc<Self>, Vec<Member<T>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..n.max(1)).map(|_| mpsc::unbounded_channel()).unzip();
        let spread = Arc::new(Spread {
            open: senders.iter().map(|_| AtomicUsize::new(0)).collect(),
            inboxes: senders.into_boxed_slice(),
            handed: AtomicU64::new(0),
        });
        let members = receivers
            .into_iter()
            .enumerate()
            .map(|(index, inbox)| Member {
                spread: Arc::clone(&spread),
                index,
                inbox,
            })
            .collect();
        (spread, members)
    }

    /// Connections handed over so far.
    pub fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// Open connections per thread, in member order.
    pub fn open(&self) -> Vec<usize> {
        self.open
            .iter()
            .map(|o| o.load(Ordering::Relaxed))
            .collect()
    }

    fn seat(self: &Arc<Self>, index: usize) -> Seat<T> {
        self.open[index].fetch_add(1, Ordering::Relaxed);
        Seat {
            spread: Arc::clone(self),
            index,
        }
    }
}

/// The thread a connection accepted by `own` should be served by, given
/// every thread's open connections in order: the least busy one when
/// `own` serves two or more more (one more is as even as an odd count
/// gets), else `own` (no handover, no wake-up of another thread).
pub fn place(own: usize, open: impl IntoIterator<Item = usize>) -> usize {
    let mut mine = None;
    let mut least: Option<(usize, usize)> = None;
    for (i, n) in open.into_iter().enumerate() {
        if i == own {
            mine = Some(n);
        }
        if least.is_none_or(|(_, fewest)| n < fewest) {
            least = Some((i, n));
        }
    }
    match (mine, least) {
        (Some(mine), Some((i, fewest))) if mine > fewest + 1 => i,
        _ => own,
    }
}

/// One thread's place in a [`Spread`]: its index and its inbox.
#[derive(Debug)]
pub struct Member<T> {
    spread: Arc<Spread<T>>,
    index: usize,
    inbox: mpsc::UnboundedReceiver<(T, Seat<T>)>,
}

impl<T> Member<T> {
    /// This thread's seat for a connection it accepted, or `None` when
    /// another thread serves two or more fewer: hand it there ([`Member::hand`]).
    pub fn keep(&self) -> Option<Seat<T>> {
        (self.target() == self.index).then(|| self.spread.seat(self.index))
    }

    /// Hands `conn` to the least busy thread; gives it back with a seat
    /// here when that is this thread after all, or its thread stopped
    /// serving (its inbox is gone).
    pub fn hand(&self, conn: T) -> Result<(), (T, Seat<T>)> {
        let spread = &self.spread;
        let to = self.target();
        if to == self.index {
            return Err((conn, spread.seat(self.index)));
        }
        // Counted before the send: once sent, the other thread may serve
        // the connection (and its client read the answer) before this one
        // runs again, and the count must not lag what was served.
        spread.handed.fetch_add(1, Ordering::Relaxed);
        match spread.inboxes[to].send((conn, spread.seat(to))) {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError((conn, _))) => {
                spread.handed.fetch_sub(1, Ordering::Relaxed);
                Err((conn, spread.seat(self.index)))
            }
        }
    }

    /// The next connection another thread handed to this one (pending
    /// for ever when none comes).
    pub async fn handed(&mut self) -> (T, Seat<T>) {
        match self.inbox.recv().await {
            Some(h) => h,
            // Every sender is in the spread this member holds: unreachable,
            // but a closed inbox is simply one that never delivers.
            None => std::future::pending().await,
        }
    }

    fn target(&self) -> usize {
        place(
            self.index,
            self.spread.open.iter().map(|o| o.load(Ordering::Relaxed)),
        )
    }
}

/// A connection's place in its thread's count; dropping it (when the
/// connection closes) frees the place.
#[derive(Debug)]
pub struct Seat<T> {
    spread: Arc<Spread<T>>,
    index: usize,
}

impl<T> Drop for Seat<T> {
    fn drop(&mut self) {
        self.spread.open[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_moves_only_when_its_thread_serves_two_more_than_the_least_busy() {
        // (own, open per thread, expected thread)
        let cases: &[(usize, &[usize], usize)] = &[
            (0, &[0, 0], 0),
            (0, &[1, 0], 0),
            (0, &[2, 0], 1),
            (1, &[2, 0], 1),
            (0, &[22, 10], 1),
            (1, &[136, 120], 1),
            (0, &[136, 120], 1),
            (2, &[5, 3, 7, 3], 1),
            (0, &[4], 0),
            // An index out of range keeps its connection.
            (5, &[3, 0], 5),
            (0, &[], 0),
        ];
        for &(own, open, want) in cases {
            assert_eq!(
                place(own, open.iter().copied()),
                want,
                "own {own}, open {open:?}"
            );
        }
    }

    #[test]
    fn connections_accepted_by_one_thread_end_up_even_and_seats_free_their_place() {
        let (spread, mut members) = Spread::<u32>::new(2);
        let mut kept = Vec::new();
        for conn in 0..32 {
            match members[0].keep() {
                Some(seat) => kept.push((conn, seat)),
                None => members[0].hand(conn).unwrap(),
            }
        }
        // Within two of each other: the last one stayed (17 > 15 + 1 is false).
        assert_eq!(spread.open(), vec![17, 15]);
        assert_eq!(spread.handed(), 15);
        let mut handed = Vec::new();
        while let Ok((conn, seat)) = members[1].inbox.try_recv() {
            handed.push((conn, seat));
        }
        assert_eq!(handed.len(), 15);
        assert!(handed.iter().all(|(_, seat)| seat.index == 1));
        drop(kept);
        assert_eq!(spread.open(), vec![0, 15]);
        drop(handed);
        assert_eq!(spread.open(), vec![0, 0]);
    }

    #[test]
    fn a_thread_that_stopped_serving_is_handed_nothing() {
        let (spread, mut members) = Spread::<u32>::new(2);
        drop(members.pop());
        let seats: Vec<_> = (0..2).map(|_| members[0].keep().unwrap()).collect();
        assert!(members[0].keep().is_none(), "the other thread serves none");
        let (conn, seat) = members[0].hand(9).unwrap_err();
        assert_eq!((conn, seat.index), (9, 0));
        assert_eq!(spread.open(), vec![3, 0]);
        assert_eq!(spread.handed(), 0);
        drop((seats, seat));
        assert_eq!(spread.open(), vec![0, 0]);
    }
}
