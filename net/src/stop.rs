//! A listener's graceful stop as its accept loops and connections see
//! it: a lock-free waker slot per connection ([`StopWait`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_util::task::AtomicWaker;
use tokio::sync::watch;

use crate::slots::{Slot, Slots};

/// Resolves once `stop` is true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A listener's stop as its connections see it. Each connection waits on
/// a waker slot of its own ([`StopWait`]), polled at every wake of the
/// connection without a lock; a watch channel's `changed()` there took a
/// lock shared by every connection at every wake (twice per proxied
/// request, once per streamed event).
#[derive(Debug, Default)]
pub(crate) struct Stop {
    pub(crate) stopped: AtomicBool,
    pub(crate) waiting: Slots<AtomicWaker>,
}

impl Stop {
    pub(crate) fn fire(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.waiting.for_each(AtomicWaker::wake);
    }

    /// Whether the listener is stopping.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    pub(crate) fn wait(self: &Arc<Self>) -> StopWait {
        StopWait {
            slot: self.waiting.add(AtomicWaker::new()),
            stop: Arc::clone(self),
            registered: None,
        }
    }
}

/// One connection's wait for its listener's stop.
pub(crate) struct StopWait {
    pub(crate) stop: Arc<Stop>,
    pub(crate) slot: Slot<AtomicWaker>,
    /// The waker in `slot`: registering it again at every wake of the
    /// connection took two atomic read-modify-writes each time, and a
    /// connection's task keeps one waker. The slot keeps it until the
    /// stop fires, after which this is ready for good.
    pub(crate) registered: Option<Waker>,
}

impl Future for StopWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.stop.is_stopped() {
            return Poll::Ready(());
        }
        if this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        this.slot.register(cx.waker());
        this.registered = Some(cx.waker().clone());
        // A stop fired before the registration woke no one: look again.
        if this.stop.is_stopped() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
