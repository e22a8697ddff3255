//! The watchdog of one connection: what it knows ([`ConnState`]: requests
//! in flight, reads, pending heads, stalled writes), its timer ([`Look`]),
//! and the verdict it reaches at each look (header-read, idle and send
//! timeouts).

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::settings::{Limits, ListenConfig};

/// The watchdog's timer. Polled at every wake of its connection (inside
/// the connection's select), but handed the task's waker only when it has
/// not got it: tokio's `Sleep` registers the waker at every poll (two
/// atomic read-modify-writes), and a connection's task keeps one waker.
/// Once the timer fired (`is_elapsed`) or was reset, the next poll is the
/// timer's own again.
pub(crate) struct Look {
    pub(crate) sleep: Pin<Box<tokio::time::Sleep>>,
    pub(crate) registered: Option<Waker>,
}

impl Look {
    pub(crate) fn at(deadline: Instant) -> Self {
        Look {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            registered: None,
        }
    }

    pub(crate) fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.registered = None;
    }
}

impl Future for Look {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let holds_waker = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if holds_waker && !this.sleep.is_elapsed() {
            return Poll::Pending;
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.registered = None;
                Poll::Ready(())
            }
            Poll::Pending => {
                if !holds_waker {
                    this.registered = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// The watchdog's look: true when the connection must close (counted);
/// else its timer is set for the next look.
pub(crate) fn watchdog_closes(state: &ConnState, config: &ListenConfig, check: &mut Look) -> bool {
    let now = Instant::now();
    let counter = match state.verdict(&config.limits, now) {
        Verdict::Keep => {
            check.reset(state.next_check(&config.limits, now));
            return false;
        }
        Verdict::Idle => &config.stats.closed_idle,
        Verdict::HeaderTimeout => &config.stats.closed_header_timeout,
        Verdict::SendTimeout => &config.stats.closed_send_timeout,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    true
}

/// The watchdog of a busy connection looks at most every this often,
/// however short the header-read timeout (a 10 ms timeout must not mean a
/// wake-up every few milliseconds on every connection).
pub(crate) const MIN_LOOK: Duration = Duration::from_millis(50);

/// A time the watchdog has not read yet: a read that begins a head, and a
/// response's end, mark their time so and its next look stamps it with
/// its own (the request path reads no clock for the watchdog; a look
/// comes within a quarter of the shortest timeout, see `next_check`).
pub(crate) const UNSTAMPED: u64 = u64::MAX;

/// What the watchdog of one connection knows: requests in flight, when
/// bytes last came in, since when a request head is pending, and since
/// when a write has been waiting for the client to read.
pub(crate) struct ConnState {
    pub(crate) epoch: Instant,
    pub(crate) in_flight: AtomicUsize,
    /// Milliseconds since `epoch` of the last response end or of the read
    /// that began a head while none was in flight ([`UNSTAMPED`] until the
    /// watchdog's next look).
    pub(crate) last_activity_ms: AtomicU64,
    /// Milliseconds since `epoch` (+1) of the first byte read while no
    /// request was in flight ([`UNSTAMPED`] until the watchdog's next
    /// look); 0 when no head is pending. The connection's first head is
    /// pending from accept (1: `epoch` is the accept's time), so a
    /// connection that never sends a byte is closed by the header-read
    /// timeout, not held for the idle one.
    pub(crate) head_since_ms: AtomicU64,
    /// No byte has been read yet: the pending first head is not begun (a
    /// stopping listener closes such a connection at once).
    pub(crate) silent: AtomicBool,
    /// hyper's HTTP/1 path: the last request's body was dropped before its
    /// end (answered unread): the connection's close lingers (`Watched`).
    pub(crate) body_unread: AtomicBool,
    /// Milliseconds since `epoch` (+1) of the first write that found the
    /// socket full, with no write progress since; 0 when writes flow.
    pub(crate) blocked_since_ms: AtomicU64,
    /// One slot per response body on hyper's paths (HTTP/2 streams, and the
    /// HTTP/1 requests hyper serves): since when (milliseconds since
    /// `epoch`, +1) a frame it handed over has waited for hyper to ask for
    /// the next; 0 when none waits. A client that stops reading one HTTP/2
    /// stream stalls it on flow control while the socket stays writable:
    /// only these slots see that.
    pub(crate) handed: crate::slots::Slots<AtomicU64>,
}

pub(crate) enum Verdict {
    Keep,
    Idle,
    HeaderTimeout,
    SendTimeout,
}

impl ConnState {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(1),
            silent: AtomicBool::new(true),
            body_unread: AtomicBool::new(false),
            blocked_since_ms: AtomicU64::new(0),
            handed: crate::slots::Slots::default(),
        }
    }

    pub(crate) fn ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    pub(crate) fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Bytes came in. Only those that begin a head matter (while a request
    /// is in flight, its end is what counts): their time is left for the
    /// watchdog to stamp.
    pub(crate) fn on_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            self.silent.store(false, Ordering::Relaxed);
            self.last_activity_ms.store(UNSTAMPED, Ordering::Relaxed);
            let _ = self.head_since_ms.compare_exchange(
                0,
                UNSTAMPED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// `cell`'s time, stamped `now` if it was [`UNSTAMPED`].
    pub(crate) fn stamped(cell: &AtomicU64, now: u64) -> u64 {
        match cell.compare_exchange(UNSTAMPED, now, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => now,
            Err(v) => v,
        }
    }

    /// The last activity and the pending head (+1, or 0), at `now`: the
    /// look that first sees an unstamped one stamps it.
    pub(crate) fn activity(&self, now: Instant) -> (u64, u64) {
        let ms = self.ms_at(now);
        (
            Self::stamped(&self.last_activity_ms, ms),
            Self::stamped(&self.head_since_ms, ms + 1),
        )
    }

    /// A write (or flush) to the client found the socket full (`true`),
    /// or one completed after that (`false`): the send timeout runs from
    /// the first one that found it full until one completes. Called by
    /// the connection's I/O ([`crate::watched::Watched`], its only writer)
    /// at those changes only, so a write that flows touches nothing here.
    pub(crate) fn write_blocked(&self, blocked: bool) {
        let since = if blocked { self.ms() + 1 } else { 0 };
        self.blocked_since_ms.store(since, Ordering::Relaxed);
    }

    /// A new response body's slot (see `handed`).
    pub(crate) fn track_body(&self) -> crate::slots::Slot<AtomicU64> {
        self.handed.add(AtomicU64::new(0))
    }

    /// Since when (+1) the client has taken nothing: the older of a blocked
    /// write and a body frame waiting to be asked for; 0 when neither.
    pub(crate) fn stalled_since_ms(&self) -> u64 {
        let mut handed: Option<u64> = None;
        self.handed.for_each(|s| match s.load(Ordering::Relaxed) {
            0 => {}
            since => handed = Some(handed.map_or(since, |h| h.min(since))),
        });
        let blocked = self.blocked_since_ms.load(Ordering::Relaxed);
        match (handed, blocked) {
            (Some(h), 0) => h,
            (Some(h), b) => h.min(b),
            (None, b) => b,
        }
    }

    /// No request in flight and no head begun.
    pub(crate) fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && (self.head_since_ms.load(Ordering::Relaxed) == 0
                || self.silent.load(Ordering::Relaxed))
    }

    pub(crate) fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// When the watchdog looks next (`now`: its look's time): the earliest
    /// deadline that could fire, and at the latest a quarter of the
    /// shortest of the header-read, send and idle timeouts from now. Requests
    /// and writes do not wake the watchdog (that was two wake-ups and two
    /// timer registrations per request), nor read the clock for it: a head
    /// that begins, a response that ends or a write that blocks while it
    /// sleeps is stamped at its next look, so a connection is closed
    /// between 1 and 1.25 of the timeout after its head began, its write
    /// blocked or (for the idle timeout) its last response ended (plus up
    /// to [`MIN_LOOK`] for a timeout under 200 ms).
    pub(crate) fn next_check(&self, limits: &Limits, now: Instant) -> Instant {
        let quarter = limits
            .header_read_timeout
            .min(limits.send_timeout)
            .min(limits.idle_timeout)
            / 4;
        let look = now + quarter.max(MIN_LOOK);
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return look;
        }
        let (last_activity, head_since) = self.activity(now);
        let idle = self.at(last_activity) + limits.idle_timeout;
        match head_since {
            0 => idle,
            since => idle.min(self.at(since - 1) + limits.header_read_timeout),
        }
        .min(look)
        // A deadline in the past fires at once; the verdict decides.
        .max(now + Duration::from_millis(5))
    }

    pub(crate) fn verdict(&self, limits: &Limits, now: Instant) -> Verdict {
        let stalled = self.stalled_since_ms();
        if stalled != 0 && now >= self.at(stalled - 1) + limits.send_timeout {
            return Verdict::SendTimeout;
        }
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Verdict::Keep;
        }
        let (last_activity, head) = self.activity(now);
        if head != 0 && now >= self.at(head - 1) + limits.header_read_timeout {
            return Verdict::HeaderTimeout;
        }
        if now >= self.at(last_activity) + limits.idle_timeout {
            return Verdict::Idle;
        }
        Verdict::Keep
    }
}

/// A request from its head until its response body is done (or dropped).
/// Hyper's bodies outlive the call that began them and hold the state by
/// `Arc`; the lean server's request ends within its connection's borrow of
/// it (`&ConnState`: no reference count taken per request).
pub(crate) struct InFlight<S: Deref<Target = ConnState> = Arc<ConnState>>(pub(crate) S);

impl<S: Deref<Target = ConnState>> InFlight<S> {
    pub(crate) fn begin(state: S) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state.head_since_ms.store(0, Ordering::Relaxed);
        Self(state)
    }
}

impl<S: Deref<Target = ConnState>> Drop for InFlight<S> {
    fn drop(&mut self) {
        let s = &self.0;
        s.last_activity_ms.store(UNSTAMPED, Ordering::Relaxed);
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
