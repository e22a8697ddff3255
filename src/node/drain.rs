//! Graceful drain: the node's side of a rolling restart. On SIGTERM it
//! fails `/readyz` at once, keeps serving for `[node] drain_grace` so load
//! balancers notice, stops accepting, waits for in-flight requests up to
//! `[node] drain_timeout`, then ends the streams still open with the SSE
//! error event (never `[DONE]`), and exits 0.
//!
//! This module owns the state the data-plane listeners share for that
//! ([`Drain`]) and the layer that counts requests and can cut streams
//! ([`track`]); `start::RunningNode::drain` runs the sequence. The layer
//! wraps the data plane's router from the outside, so the request path
//! itself knows nothing about draining.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::{header, HeaderValue};
use http_body::{Body as HttpBody, Frame};
use prometheus::IntCounter;
use tokio::sync::Notify;
use zonegate_net::http1::Answer;
use zonegate_net::slots::Slots;

use crate::dataplane::error::{error_body, ApiError};
use crate::node::gateway::Gateway;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Drain state shared by every data-plane thread. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Drain(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    draining: AtomicBool,
    /// Why readiness fails, when not for a plain shutdown (the control
    /// plane stopped for good).
    why: std::sync::OnceLock<String>,
    raft_stopped: AtomicBool,
    in_flight: AtomicU64,
    /// Set by the first [`Drain::wait_idle`]: only then does the last
    /// request to end notify `idle` (a lock taken and released otherwise
    /// whenever a lightly loaded node goes idle).
    watched: AtomicBool,
    idle: Notify,
    /// Turns true at `drain_timeout`: open streams end with the error event.
    /// A stream with data ready reads it; one waiting for data is woken
    /// through its slot in `streams`.
    cut_now: AtomicBool,
    /// The event streams' wakers. A stream registers its slot once; each
    /// wait then updates its own slot without a lock (a watch channel's
    /// `changed()` took a lock shared by every stream at every wait).
    streams: Slots<AtomicWaker>,
}

impl Drain {
    /// From now on `/readyz` fails and responses ask clients to reconnect
    /// elsewhere (`connection: close`).
    pub fn begin(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }

    /// [`Drain::begin`], saying why on `/readyz` (the first reason given
    /// stays).
    pub fn begin_because(&self, why: String) {
        let _ = self.0.why.set(why);
        self.begin();
    }

    pub fn is_draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
    }

    /// This node stopped its Raft member early to hand over leadership.
    pub fn mark_raft_stopped(&self) {
        self.0.raft_stopped.store(true, Ordering::SeqCst);
    }

    pub fn raft_stopped(&self) -> bool {
        self.0.raft_stopped.load(Ordering::SeqCst)
    }

    /// Data-plane requests in flight (a stream until its last byte).
    pub fn in_flight(&self) -> u64 {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves when no request is in flight, or after `limit`; says which.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        // SeqCst with the decrement's: either the last request to end sees
        // `watched` and notifies, or this sees its decrement.
        self.0.watched.store(true, Ordering::SeqCst);
        let wait = async {
            loop {
                let notified = self.0.idle.notified();
                if self.in_flight() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Ends every open event stream with the SSE error event.
    pub fn cut_streams(&self) {
        self.0.cut_now.store(true, Ordering::SeqCst);
        self.0.streams.for_each(AtomicWaker::wake);
    }

    fn enter(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight {
            drain: self.clone(),
        }
    }
}

/// One request in flight; dropped when its response body is done. The
/// in-flight gauge is set from the count at scrape time (`admin`): a gauge
/// of its own moved with every request took four more atomic
/// read-modify-writes on lines every data-plane thread writes.
struct InFlight {
    drain: Drain,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let inner = &self.drain.0;
        if inner.in_flight.fetch_sub(1, Ordering::SeqCst) == 1
            && inner.watched.load(Ordering::SeqCst)
        {
            inner.idle.notify_waiters();
        }
    }
}

/// The data-plane layer: readiness fails while draining; every `/v1/*`
/// request is counted until its body ends; event streams can be cut.
pub async fn track(State(gw): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/readyz" && gw.drain.is_draining() {
        let why = gw
            .drain
            .0
            .why
            .get()
            .map_or("this node is draining: it is shutting down", String::as_str);
        return ApiError::NotReady(why.into()).into_response();
    }
    if !path.starts_with("/v1/") {
        return next.run(req).await;
    }
    tracked(&gw, next.run(req)).await
}

/// A `/v1/*` request: counted until its body ends, its connection closed
/// after it while draining, its event stream cut at the drain timeout.
pub async fn tracked(gw: &Gateway, respond: impl Future<Output = Response>) -> Response {
    let entered = enter(gw);
    let resp = respond.await;
    finish(gw, entered, Answer::from(resp)).into_response()
}

/// A `/v1/*` request counted in flight from here (see [`tracked`]): the
/// two halves of it for a caller that awaits its response inline, so that
/// a large request future is not moved into another.
pub fn enter(gw: &Gateway) -> Entered {
    Entered(gw.drain.enter())
}

/// A request [`enter`]ed, until its response is handed to [`finish`].
pub struct Entered(InFlight);

/// The response of a request [`enter`]ed: counted until its body ends,
/// its connection closed after it while draining, its event stream cut at
/// the drain timeout.
pub fn finish(gw: &Gateway, Entered(guard): Entered, mut answer: Answer) -> Answer {
    let drain = &gw.drain;
    if drain.is_draining() {
        // The server closes the connection after this response, so a client's
        // next request opens a connection the load balancer sends elsewhere.
        answer
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let cut = answer.is_event_stream().then(|| {
        (
            drain.0.streams.add(AtomicWaker::new()),
            gw.metrics.drain_cut_streams.clone(),
        )
    });
    answer.body = Body::new(DrainBody {
        inner: std::mem::take(&mut answer.body),
        cut,
        state: CutState::Streaming,
        guard,
        registered: None,
    });
    answer
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CutState {
    Streaming,
    /// The error event was handed to hyper; yield once so it is flushed.
    EventSent,
    /// Flushed; the next poll aborts the connection.
    Flushed,
    Done,
}

/// A response body that counts as in flight until it ends and, for event
/// streams, ends with the SSE error event when the drain times out. The
/// event has the shape and the flush-then-abort ending of the data plane's
/// own interrupted streams (`dataplane::forward::ProxyBody`).
struct DrainBody {
    inner: Body,
    /// An event stream's waker slot (see `Inner::streams`) and the cut
    /// streams' counter.
    cut: Option<(zonegate_net::slots::Slot<AtomicWaker>, IntCounter)>,
    state: CutState,
    guard: InFlight,
    /// The waker last registered in the stream's slot.
    registered: Option<Waker>,
}

impl DrainBody {
    /// Ends the stream with the error event (then flush, then abort).
    fn cut_now(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some((_, counter)) = self.cut.take() {
            counter.inc();
        }
        self.state = CutState::EventSent;
        let event = error_body(
            "the gateway node is shutting down (drain timeout); the response is incomplete",
            "server_error",
            "node_draining",
        );
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
            "data: {event}\n\n"
        ))))))
    }
}

impl HttpBody for DrainBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.state {
            CutState::Done => return Poll::Ready(None),
            CutState::EventSent => {
                this.state = CutState::Flushed;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            CutState::Flushed => {
                this.state = CutState::Done;
                return Poll::Ready(Some(Err("drain timeout".into())));
            }
            CutState::Streaming => {}
        }
        // The flag costs a load per frame; the stream's waker is
        // registered only when it waits for data.
        if this.cut.is_some() && this.guard.drain.0.cut_now.load(Ordering::Relaxed) {
            return this.cut_now();
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.state = CutState::Done;
                Poll::Ready(None)
            }
            Poll::Ready(Some(r)) => Poll::Ready(Some(r.map_err(Into::into))),
            Poll::Pending => {
                let Some((slot, _)) = &this.cut else {
                    return Poll::Pending;
                };
                // Registered once per task: only a cut takes the waker out
                // of the slot, and after a cut the flag above ends the
                // stream before it waits again.
                if this
                    .registered
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
                {
                    return Poll::Pending;
                }
                slot.register(cx.waker());
                this.registered = Some(cx.waker().clone());
                // A cut between the check above and the registration woke
                // no one: look again now that a cut would wake this stream.
                if this.guard.drain.0.cut_now.load(Ordering::SeqCst) {
                    this.cut_now()
                } else {
                    Poll::Pending
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state == CutState::Done || (self.cut.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.cut.is_some() {
            // A cut stream may grow by the error event.
            http_body::SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_idle_returns_when_the_last_request_ends() {
        let drain = Drain::default();
        let a = drain.enter();
        let b = drain.enter();
        assert_eq!(drain.in_flight(), 2);
        assert!(!drain.wait_idle(Duration::from_millis(20)).await);
        let waiter = {
            let drain = drain.clone();
            tokio::spawn(async move { drain.wait_idle(Duration::from_secs(30)).await })
        };
        drop(a);
        tokio::task::yield_now().await;
        drop(b);
        assert!(waiter.await.unwrap());
        assert_eq!(drain.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_cut_wakes_an_event_stream_waiting_for_data_and_ends_it_in_the_error_event() {
        use http_body_util::BodyExt;
        let drain = Drain::default();
        let silent = futures_util::stream::pending::<Result<Frame<Bytes>, BoxError>>();
        let mut body = DrainBody {
            inner: Body::new(http_body_util::StreamBody::new(silent)),
            cut: Some((
                drain.0.streams.add(AtomicWaker::new()),
                IntCounter::new("c", "c").unwrap(),
            )),
            state: CutState::Streaming,
            guard: drain.enter(),
            registered: None,
        };
        let reader = tokio::spawn(async move {
            let event = body.frame().await;
            let end = body.frame().await;
            (event, end)
        });
        // The reader is waiting for data when the cut comes: only its
        // registered waker can end the wait.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drain.cut_streams();
        let (event, end) = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .expect("the cut woke the waiting stream")
            .unwrap();
        let event = event.unwrap().unwrap().into_data().unwrap();
        assert!(
            String::from_utf8_lossy(&event).contains("node_draining"),
            "{event:?}"
        );
        assert!(end.unwrap().is_err(), "then the stream aborts");
        assert_eq!(drain.in_flight(), 0, "and counts no longer");
    }
}
