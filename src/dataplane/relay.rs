//! The response body the client reads: a committed attempt's bytes,
//! streamed through frame by frame and never buffered whole, under an idle
//! timeout between chunks and the request's overall deadline.
//!
//! Event streams are relayed in whole events, so a cut never leaves half an
//! event at the client. When a plain-text answer breaks after bytes reached
//! the client, the relay asks its hooks for a continuation and splices it
//! in (see `sse::Splice`), so the client gets the answer exactly once; when
//! none can be had, the stream ends with an SSE error event and an aborted
//! connection, never `[DONE]`: a truncated answer never looks complete.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http_body::{Body as _, Frame};
use tokio::time::Instant;

use crate::dataplane::forward::{BoxError, Committed};
use crate::dataplane::sse::{
    self, Event, Framer, Resumption, Skim, Skimmer, Splice, Transcript, Usage,
};
use crate::dataplane::upstream::UpstreamBody;

/// How a response ended, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    Complete,
    /// It broke after the first byte and could not be continued.
    Aborted(&'static str),
    /// The client went away first.
    ClientGone,
}

/// A continuation found after a break.
pub struct Resumed {
    pub committed: Committed,
    pub how: Resumption,
    /// Who continues, for the SSE comment that marks the seam.
    pub backend: String,
    pub model: String,
}

/// What the relay asks of the request that owns it.
pub trait RelayHooks: Send + 'static {
    /// The current upstream failed after its first byte (`why` is a
    /// metric label): its passive health signal.
    fn failed(&mut self, why: &'static str);

    /// A continuation of the answer delivered so far, or `None`.
    fn resume<'a>(
        &'a mut self,
        _delivered: &'a Transcript,
        _why: &'static str,
    ) -> BoxFuture<'a, Option<Resumed>> {
        Box::pin(async { None })
    }

    /// How the response ended, how many continuations it took, the
    /// answer's `usage` when the relay saw it, and the body bytes handed to
    /// the client; called exactly once.
    fn end(&mut self, end: StreamEnd, continuations: u32, usage: Option<Usage>, delivered: u64);
}

/// How to relay one response.
pub struct RelayOptions {
    pub sse: bool,
    /// A plain-text answer whose break may be continued (SSE only).
    pub continuable: bool,
    pub idle: Duration,
    pub deadline: Instant,
    pub max_continuations: u32,
}

/// The most an event stream's burst is gathered into before it is
/// handed to the client (see `Relay::gather`).
const GATHER_MAX: usize = 16 * 1024;

/// The body of a plain (not event-stream) answer that came whole with
/// its head, the usual JSON answer: nothing is left to relay or to time,
/// so the caller ends the response at once, as the relay would when it
/// handed the bytes over. Its connection goes back to the pool now.
/// `None` (and `committed` untouched) for any other answer.
pub fn whole(committed: &mut Committed, sse: bool) -> Option<Bytes> {
    if sse || !committed.rest.as_ref().is_none_or(|r| r.is_end_stream()) {
        return None;
    }
    committed.rest = None;
    Some(committed.first.take().unwrap_or_default())
}

/// The body for a committed response.
pub fn body<H: RelayHooks + Unpin>(mut committed: Committed, opts: RelayOptions, hooks: H) -> Body {
    let remaining = (!opts.sse).then_some(committed.content_length).flatten();
    let transcript = (opts.sse && opts.continuable).then(Transcript::new);
    if transcript.is_none() {
        // A translation's notes serve the transcript only.
        if let Some(rest) = committed.rest.as_mut() {
            rest.stop_notes();
        }
    }
    let relay = Relay {
        first: committed.first,
        rest: committed.rest,
        remaining,
        usage: None,
        delivered: 0,
        framer: opts.sse.then(Framer::default),
        transcript,
        skimmer: Skimmer::default(),
        splice: None,
        failure: None,
        held: None,
        first_break: None,
        opts,
        continuations: 0,
        hooks,
        due: None,
        idle_timer: None,
        timer_armed: None,
        yielding: None,
        ended: false,
        phase: Phase::Streaming,
    };
    // The relay is the body itself, held in the one allocation `Body`
    // makes: an event touches it and nothing between it and the server.
    Body::new(RelayBody {
        relay: Some(relay),
        recovering: None,
    })
}

/// The relay as a response body. Every step of it is polled in place but
/// one: looking for a continuation after a break awaits the request's
/// hooks, and for that (rare) while the relay moves into a future that
/// gives it back with the frame it made.
struct RelayBody<H: RelayHooks> {
    /// `None` only while `recovering` holds it.
    relay: Option<Relay<H>>,
    /// The relay looking for a continuation, and what it hands over then
    /// (`None`: nothing, it goes on).
    recovering: Option<BoxFuture<'static, (Relay<H>, Option<Item>)>>,
}

impl<H: RelayHooks + Unpin> http_body::Body for RelayBody<H> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(recovering) = this.recovering.as_mut() {
                let (relay, item) = std::task::ready!(recovering.as_mut().poll(cx));
                this.recovering = None;
                this.relay = Some(relay);
                match item {
                    Some(item) => return Poll::Ready(Some(item)),
                    // Nothing to hand over: the relay goes on.
                    None => continue,
                }
            }
            // Never empty here (only `recovering` takes it, and gives it
            // back); were it, an error, never an end that looks complete.
            let Some(relay) = this.relay.as_mut() else {
                return Poll::Ready(Some(Err("the relay was lost".into())));
            };
            match std::task::ready!(relay.poll_next(cx)) {
                Polled::Item(item) => return Poll::Ready(item),
                Polled::Broke(why) => {
                    let Some(mut relay) = this.relay.take() else {
                        return Poll::Ready(Some(Err(why.into())));
                    };
                    this.recovering = Some(Box::pin(async move {
                        let item = match relay.recover(why).await {
                            Some(seam) => relay.emit(seam).map(Ok),
                            None => relay.fail(why),
                        };
                        (relay, item)
                    }));
                }
            }
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // A plain answer tells its length (the backend's `Content-Length`;
        // the head's own header is not passed on), so the client's server
        // frames it by length as the backend did, not chunked; one that
        // ends short or long of it breaks the connection there, as any
        // server does with a declared length.
        match self.relay.as_ref().and_then(|r| r.remaining) {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }
}

enum Phase {
    Streaming,
    /// The error event was handed over; the server is let flush it (a
    /// yield), then the stream aborts.
    Abort(&'static str),
    Done,
}

/// What one poll of the relay came to.
enum Polled {
    Item(Option<Item>),
    /// The stream broke (`why`): look for a continuation (`Relay::recover`).
    Broke(&'static str),
}

struct Relay<H: RelayHooks> {
    first: Option<Bytes>,
    rest: Option<UpstreamBody>,
    /// Plain bodies: bytes left by `Content-Length`; hyper stops polling
    /// once it wrote them, so the end is reported when they are handed over.
    remaining: Option<u64>,
    /// The usage chunk of an event stream without a transcript.
    usage: Option<Usage>,
    /// Body bytes handed to the client so far (the token estimate of an
    /// answer without `usage`).
    delivered: u64,
    framer: Option<Framer>,
    transcript: Option<Transcript>,
    /// Reads the transcript's ordinary text chunks.
    skimmer: Skimmer,
    splice: Option<Splice>,
    /// A break found after some events of a chunk were passed on.
    failure: Option<&'static str>,
    /// The upstream's end or break, seen while gathering a burst; the
    /// next read returns it.
    held: Option<Result<Option<Bytes>, &'static str>>,
    /// The first break: what the client is told if nothing could continue
    /// (never a continuation's own refusal).
    first_break: Option<&'static str>,
    opts: RelayOptions,
    continuations: u32,
    hooks: H,
    /// When the read in progress times out (idle, or the overall
    /// deadline): set at its first poll, cleared when it returns.
    due: Option<Instant>,
    /// The idle (and overall) timer, armed at the first wait (see
    /// `poll_read`).
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The waker the idle timer was last polled with, and its deadline.
    timer_armed: Option<(Waker, Instant)>,
    /// The yield of `Phase::Abort`.
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    ended: bool,
    phase: Phase,
}

type Item = Result<Frame<Bytes>, BoxError>;

impl<H: RelayHooks> Relay<H> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Polled> {
        loop {
            match self.phase {
                Phase::Done => return Poll::Ready(Polled::Item(None)),
                Phase::Abort(why) => {
                    // hyper and the lean server flush what they hold when
                    // the body is pending; without this the error event
                    // would die with the connection. A yield to the
                    // runtime, as tokio's (the wake-up deferred until the
                    // other tasks, an HTTP/2 connection's writer among
                    // them, had their turn).
                    let yielding = self
                        .yielding
                        .get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
                    std::task::ready!(yielding.as_mut().poll(cx));
                    self.yielding = None;
                    self.phase = Phase::Done;
                    return Poll::Ready(Polled::Item(Some(Err(why.into()))));
                }
                Phase::Streaming => {}
            }
            let step = match self.failure.take() {
                Some(why) => Err(why),
                None => match self.first.take() {
                    Some(first) => Ok(Some(first)),
                    None => std::task::ready!(self.poll_read(cx)),
                },
            };
            let step = match step {
                Ok(Some(data)) if self.framer.is_some() => Ok(Some(self.gather(data, cx))),
                other => other,
            };
            let out = match step.and_then(|chunk| match chunk {
                Some(data) => self.pass(data),
                None => self.upstream_done().map(|()| Bytes::new()),
            }) {
                Ok(out) => out,
                Err(why) => return Poll::Ready(Polled::Broke(why)),
            };
            if let Some(item) = self.emit(out) {
                return Poll::Ready(Polled::Item(Some(Ok(item))));
            }
            if matches!(self.phase, Phase::Done) {
                return Poll::Ready(Polled::Item(None));
            }
        }
    }

    /// `out` as the next frame, counted; `None` when it is empty.
    fn emit(&mut self, out: Bytes) -> Option<Frame<Bytes>> {
        if out.is_empty() {
            return None;
        }
        // Plain bodies count in `pass` (their end is reported there).
        if self.framer.is_some() {
            self.delivered += out.len() as u64;
        }
        Some(Frame::data(out))
    }

    /// The next chunk of the upstream body; `None` at its end. The idle
    /// timer is armed once per stream and moved only when it fires before
    /// the current chunk's time is up (lazily, as nginx's timers are): a
    /// chunk costs a clock read, not a timer registration and removal, nor
    /// a look at the timer.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, &'static str>> {
        if let Some(held) = self.held.take() {
            return Poll::Ready(held);
        }
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        loop {
            // Set at a read's first poll: non-decreasing from read to
            // read, so the timer is never later. That poll's clock read
            // serves its look at the timer; a later poll (after a wake-up
            // that brought no data) reads the clock again.
            let (due, mut fresh) = match self.due {
                Some(due) => (due, None),
                None => {
                    let now = Instant::now();
                    let due = (now + self.opts.idle).min(self.opts.deadline);
                    self.due = Some(due);
                    (due, Some(now))
                }
            };
            let frame = match Pin::new(&mut *rest).poll_frame(cx) {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    // A timer polled with this task's waker keeps it until
                    // it fires, and it never fires before its deadline:
                    // until then it is not asked again (nor its memory
                    // touched).
                    if let Some((waker, until)) = self.timer_armed.as_ref() {
                        if waker.will_wake(cx.waker())
                            && fresh.take().unwrap_or_else(Instant::now) < *until
                        {
                            return Poll::Pending;
                        }
                    }
                    let t = self
                        .idle_timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                    while t.as_mut().poll(cx).is_ready() {
                        if t.deadline() >= due {
                            self.due = None;
                            return Poll::Ready(Err(if due == self.opts.deadline {
                                "total_timeout"
                            } else {
                                "idle_timeout"
                            }));
                        }
                        t.as_mut().reset(due);
                    }
                    self.timer_armed = Some((cx.waker().clone(), t.deadline()));
                    return Poll::Pending;
                }
            };
            self.due = None;
            match frame {
                None => return Poll::Ready(Ok(None)),
                Some(Err(_)) => return Poll::Ready(Err("upstream_reset")),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Poll::Ready(Ok(Some(data))),
                    // Empty chunks and trailers: keep reading.
                    _ => continue,
                },
            }
        }
    }

    /// `data` joined with the event-stream chunks already read from the
    /// backend, so that a burst of events (a backend that got ahead of the
    /// relay) goes out in one write instead of one each. The upstream body
    /// is read inline by this task: gathering takes what the last read
    /// brought (the socket's whole backlog, up to the buffer) and stops
    /// when that is used up (or at `GATHER_MAX` bytes), never reading the
    /// socket again: a paced stream's chunk is one read, and asking the
    /// socket once more would only find it empty (a registration per
    /// chunk, for nothing), and it never waits for the network.
    fn gather(&mut self, data: Bytes, cx: &mut Context<'_>) -> Bytes {
        let Some(rest) = self.rest.as_mut() else {
            return data;
        };
        let mut joined: Option<BytesMut> = None;
        while joined.as_ref().map_or(data.len(), BytesMut::len) < GATHER_MAX && rest.buffered() {
            let more = match Pin::new(&mut *rest).poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(more) => more,
                    Err(_) => continue,
                },
                Poll::Ready(None) => {
                    self.held = Some(Ok(None));
                    break;
                }
                Poll::Ready(Some(Err(_))) => {
                    self.held = Some(Err("upstream_reset"));
                    break;
                }
            };
            joined
                .get_or_insert_with(|| BytesMut::from(&data[..]))
                .extend_from_slice(&more);
        }
        joined.map_or(data, BytesMut::freeze)
    }

    /// What of `data` the client gets now; `Err` when it shows the stream
    /// broke (the events before the break are passed on first).
    fn pass(&mut self, data: Bytes) -> Result<Bytes, &'static str> {
        let Some(framer) = self.framer.as_mut() else {
            self.delivered += data.len() as u64;
            if let Some(left) = self.remaining.as_mut() {
                *left = left.saturating_sub(data.len() as u64);
                if *left == 0 {
                    // No usage: it is read only from a body that came whole
                    // with its head (see `whole`), and nothing is copied
                    // for it.
                    self.phase = Phase::Done;
                    self.report(StreamEnd::Complete);
                }
            }
            return Ok(data);
        };
        let whole = framer.push(data).map_err(|_| "oversized_event")?;
        let Some(transcript) = self.transcript.as_mut() else {
            // Not continuable: passed on unread, but a final usage chunk
            // still settles the tenant's token charge.
            if let Some(u) = sse::events_usage(&whole) {
                self.usage = Some(u);
            }
            return Ok(whole);
        };
        if let Some(splice) = self.splice.as_mut() {
            let mut out = BytesMut::new();
            for event in sse::events(&whole) {
                let verdict = match sse::parse(&event) {
                    Event::Error => Err("upstream_error_event"),
                    Event::Malformed => Err("malformed_chunk"),
                    _ => splice
                        .rewrite(&event, transcript)
                        .map_err(|_| "continuation_mismatch"),
                };
                match verdict {
                    Ok(Some(b)) => out.extend_from_slice(&b),
                    Ok(None) => {}
                    Err(why) => {
                        self.failure = Some(why);
                        break;
                    }
                }
            }
            return Ok(out.freeze());
        }
        // A translation's own chunks, whole events it wrote: what they
        // say is taken from it rather than read back (a backend's own
        // stream has no notes, and nothing more is looked at).
        if let Some(rest) = self.rest.as_mut() {
            // A translation writes whole events only; were one ever cut, the
            // notes would not match what is passed on: every chunk is read
            // from then on.
            let noted = rest.notes().map(|notes| {
                let cut = framer.has_partial();
                let taken = notes.whole && !cut;
                if taken {
                    transcript.note(notes);
                }
                notes.clear();
                (taken, cut)
            });
            match noted {
                Some((true, _)) => return Ok(whole),
                Some((false, true)) => rest.stop_notes(),
                _ => {}
            }
        }
        let mut passed = 0;
        for event in sse::events(&whole) {
            // The first chunk is parsed for the answer's identity; after
            // it, ordinary text chunks are only skimmed.
            if transcript.id.is_some() {
                match self.skimmer.skim(&event) {
                    Skim::Done => {
                        transcript.finished = true;
                        passed += event.len();
                        continue;
                    }
                    Skim::Text { text, finish } => {
                        transcript.push(&text, finish);
                        passed += event.len();
                        continue;
                    }
                    Skim::Unsure => {}
                }
            }
            let parsed = sse::parse(&event);
            let why = match parsed {
                Event::Error => "upstream_error_event",
                Event::Malformed => "malformed_chunk",
                e => {
                    transcript.observe(&e);
                    passed += event.len();
                    continue;
                }
            };
            self.failure = Some(why);
            break;
        }
        // Cut in place: a slice would take a reference on the read buffer
        // (an atomic on its shared header) for the one dropped with `whole`.
        let mut whole = whole;
        whole.truncate(passed);
        Ok(whole)
    }

    /// The upstream body ended: complete, unless it ended inside an event
    /// or (for a continuable answer) before the answer said it finished.
    fn upstream_done(&mut self) -> Result<(), &'static str> {
        if self.framer.as_ref().is_some_and(Framer::has_partial) {
            return Err("cut_inside_event");
        }
        if self.splice.as_ref().is_some_and(Splice::catching_up) {
            return Err("continuation_mismatch");
        }
        if self.transcript.as_ref().is_some_and(|t| !t.finished) {
            return Err("ended_early");
        }
        self.phase = Phase::Done;
        self.report(StreamEnd::Complete);
        Ok(())
    }

    /// Tries to continue the answer; returns the seam's SSE comment.
    async fn recover(&mut self, why: &'static str) -> Option<Bytes> {
        self.hooks.failed(why);
        self.first_break.get_or_insert(why);
        let t = self.transcript.as_ref()?;
        if !t.plain || t.finished || self.continuations >= self.opts.max_continuations {
            return None;
        }
        let resumed = tokio::time::timeout_at(self.opts.deadline, self.hooks.resume(t, why))
            .await
            .ok()??;
        let seam = format!(
            ": zonegate continued on {}/{} after {} chars\n\n",
            resumed.backend,
            resumed.model,
            t.text.chars().count()
        );
        self.splice = Some(Splice::new(resumed.how, t));
        self.continuations += 1;
        self.first = resumed.committed.first;
        self.rest = resumed.committed.rest;
        if let Some(rest) = self.rest.as_mut() {
            // The splice reads every chunk of the continuation.
            rest.stop_notes();
        }
        self.held = None;
        if let Some(f) = self.framer.as_mut() {
            f.reset();
        }
        Some(Bytes::from(seam))
    }

    /// Ends a broken response: an SSE error event then an abort, or (plain
    /// bodies) an abort at once.
    fn fail(&mut self, why: &'static str) -> Option<Item> {
        let why = self.first_break.unwrap_or(why);
        self.report(StreamEnd::Aborted(why));
        if self.framer.is_none() {
            self.phase = Phase::Done;
            return Some(Err(why.into()));
        }
        self.phase = Phase::Abort(why);
        let message = format!(
            "the upstream stream was interrupted ({}); the response is incomplete",
            why.replace('_', " ")
        );
        Some(Ok(Frame::data(sse::error_event(&message))))
    }

    fn report(&mut self, end: StreamEnd) {
        if !self.ended {
            self.ended = true;
            let usage = self
                .transcript
                .as_ref()
                .and_then(|t| t.usage)
                .or(self.usage);
            self.hooks
                .end(end, self.continuations, usage, self.delivered);
        }
    }
}

impl<H: RelayHooks> Drop for Relay<H> {
    fn drop(&mut self) {
        self.report(StreamEnd::ClientGone);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const EVENTS: usize = 16;

    /// A backend that answers any request with `raw` in one write, then
    /// closes; and the committed response hyper's client makes of it (its
    /// first body chunk read, as the attempt reads it).
    async fn committed(raw: Vec<u8>) -> Committed {
        committed_in_two(raw, None).await
    }

    /// As `committed`, with a second write once `later`'s signal comes.
    async fn committed_in_two(
        raw: Vec<u8>,
        later: Option<(tokio::sync::oneshot::Receiver<()>, Vec<u8>)>,
    ) -> Committed {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            s.write_all(&raw).await.expect("write");
            if let Some((signal, rest)) = later {
                if signal.await.is_ok() {
                    s.write_all(&rest).await.expect("write");
                }
            }
        });
        committed_from(addr).await
    }

    /// The committed response of the backend at `addr`: its first body
    /// chunk read, as the attempt reads it.
    async fn committed_from(addr: std::net::SocketAddr) -> Committed {
        let resp = crate::dataplane::upstream::tests::send_to(addr, "/")
            .await
            .expect("response");
        let mut rest = resp.body;
        let first = rest.frame().await.and_then(|f| f.ok()?.into_data().ok());
        Committed {
            status: resp.status,
            lines: resp.lines,
            first,
            rest: Some(rest),
            content_length: None,
            first_byte: Duration::ZERO,
            arrived: std::time::Instant::now(),
            cool_for: None,
            usage: None,
        }
    }

    /// `EVENTS` SSE events as HTTP chunks, one chunk each.
    fn chunked_events() -> Vec<u8> {
        let mut raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for i in 0..EVENTS {
            let event =
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n");
            raw.extend(format!("{:x}\r\n{event}\r\n", event.len()).bytes());
        }
        raw
    }

    #[derive(Clone, Default)]
    struct Ends(Arc<Mutex<Vec<StreamEnd>>>);

    impl RelayHooks for Ends {
        fn failed(&mut self, _why: &'static str) {}
        fn end(&mut self, end: StreamEnd, _: u32, _: Option<Usage>, _: u64) {
            self.0.lock().expect("ends").push(end);
        }
    }

    /// The relayed body's frames, and its error if it ended in one. Read
    /// in a task of its own, as hyper's server does: the test's own future
    /// is polled only between the runtime's passes.
    async fn relay(committed: Committed, ends: &Ends) -> (Vec<Bytes>, Option<String>) {
        let ends = ends.clone();
        tokio::spawn(async move { read_relayed(committed, ends).await })
            .await
            .expect("relay task")
    }

    /// How the tests relay: not continued, 30 s idle, a minute in all.
    fn options(sse: bool) -> RelayOptions {
        RelayOptions {
            sse,
            continuable: false,
            idle: Duration::from_secs(30),
            deadline: Instant::now() + Duration::from_secs(60),
            max_continuations: 0,
        }
    }

    /// The relayed body of an event stream that is not continued.
    fn sse_body(committed: Committed, ends: Ends) -> Body {
        super::body(committed, options(true), ends)
    }

    async fn read_relayed(committed: Committed, ends: Ends) -> (Vec<Bytes>, Option<String>) {
        let mut body = sse_body(committed, ends);
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => frames.extend(f.into_data().ok()),
                Err(e) => return (frames, Some(e.to_string())),
            }
        }
        (frames, None)
    }

    fn count_events(frames: &[Bytes]) -> usize {
        frames
            .iter()
            .map(|f| String::from_utf8_lossy(f).matches("\"content\"").count())
            .sum()
    }

    /// An end a relay reported: how, the usage it read, bytes delivered.
    type End = (StreamEnd, Option<Usage>, u64);

    #[derive(Clone, Default)]
    struct Reported(Arc<Mutex<Vec<End>>>);

    impl RelayHooks for Reported {
        fn failed(&mut self, _why: &'static str) {}
        fn end(&mut self, end: StreamEnd, _: u32, usage: Option<Usage>, delivered: u64) {
            self.0.lock().expect("ends").push((end, usage, delivered));
        }
    }

    #[tokio::test]
    async fn a_plain_answer_that_came_whole_is_taken_whole_and_one_in_parts_is_relayed() {
        let json = r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", json.len());

        // Whole with its head: taken as it is, unless it is an event stream.
        let mut c = committed(format!("{head}{json}").into_bytes()).await;
        assert_eq!(whole(&mut c, true), None, "an event stream is relayed");
        assert_eq!(whole(&mut c, false).as_deref(), Some(json.as_bytes()));
        assert!(c.first.is_none() && c.rest.is_none());

        // In two parts: not whole; relayed, and ended when its last byte
        // is handed over.
        let ends = Reported::default();
        let (go, signal) = tokio::sync::oneshot::channel();
        let (a, b) = json.split_at(20);
        let mut parts =
            committed_in_two(format!("{head}{a}").into_bytes(), Some((signal, b.into()))).await;
        assert_eq!(whole(&mut parts, false), None);
        let mut body = super::body(parts, options(false), ends.clone());
        let first = body.frame().await.expect("frame").expect("data");
        assert_eq!(first.into_data().expect("data"), a.as_bytes());
        assert!(ends.0.lock().expect("ends").is_empty(), "not ended yet");
        go.send(()).expect("backend waits");
        let rest = body.collect().await.expect("body").to_bytes();
        assert_eq!(rest, b.as_bytes());
        // Usage is read only from a body that came in one piece.
        assert_eq!(
            *ends.0.lock().expect("ends"),
            vec![(StreamEnd::Complete, None, json.len() as u64)]
        );
    }

    #[tokio::test]
    async fn a_burst_of_events_is_relayed_in_a_few_writes_not_one_per_event() {
        let mut raw = chunked_events();
        raw.extend_from_slice(b"0\r\n\r\n");
        let ends = Ends::default();
        let (frames, error) = relay(committed(raw).await, &ends).await;
        assert_eq!(error, None);
        assert_eq!(count_events(&frames), EVENTS, "every event, once");
        // The first chunk is read when the attempt commits; the rest of the
        // burst, already on its way, is gathered.
        assert!(
            frames.len() <= 3,
            "{EVENTS} events that arrived together went out in {} frames",
            frames.len()
        );
        assert_eq!(*ends.0.lock().expect("ends"), [StreamEnd::Complete]);
    }

    #[tokio::test]
    async fn the_gather_never_waits_for_the_network() {
        // Events 0..EVENTS/2 now; the rest only after the client has seen
        // the first ones. A relay that waited for more would never hand
        // them on, and the backend would never send the rest.
        let raw = chunked_events();
        let half = raw
            .windows(4)
            .enumerate()
            .filter(|(_, w)| w == b"\n\n\r\n")
            .map(|(i, _)| i + 4)
            .nth(EVENTS / 2)
            .expect("the middle event's end");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut rest = raw[half..].to_vec();
        rest.extend_from_slice(b"0\r\n\r\n");
        let committed = committed_in_two(raw[..half].to_vec(), Some((rx, rest))).await;
        let ends = Ends::default();
        let mut body = sse_body(committed, ends.clone());
        let reader = tokio::spawn(async move {
            let first = body.frame().await;
            (first, body)
        });
        let (first, mut body) = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .expect("the events already there were handed on without waiting for more")
            .expect("reader");
        let first = first
            .expect("a frame")
            .expect("data")
            .into_data()
            .expect("data");
        let mut seen = count_events(std::slice::from_ref(&first));
        assert!(seen >= 1, "{first:?}");
        tx.send(()).expect("backend waiting");
        while let Some(frame) = body.frame().await {
            seen += count_events(&[frame.expect("data").into_data().expect("data")]);
        }
        assert_eq!(seen, EVENTS, "every event, once");
        assert_eq!(*ends.0.lock().expect("ends"), [StreamEnd::Complete]);
    }

    /// A backend that answers with the head and `events` chunks, one every
    /// `gap`, then holds the connection open without a word.
    async fn committed_paced(events: usize, gap: Duration) -> Committed {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let raw = chunked_events();
        let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let mut chunks = raw[head_end..].split_inclusive(|b| *b == b'\n');
            // Each chunk is four lines: its size, the event's data line and
            // blank line, the chunk's CRLF.
            let mut out = raw[..head_end].to_vec();
            for _ in 0..events {
                for _ in 0..4 {
                    out.extend_from_slice(chunks.next().expect("chunk line"));
                }
                s.write_all(&out).await.expect("write");
                out.clear();
                tokio::time::sleep(gap).await;
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(s);
        });
        committed_from(addr).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_whose_chunks_keep_coming_is_never_idle_and_a_silent_one_is() {
        // Chunks every 10 s for 80 s under a 30 s idle timeout: the timer,
        // armed once, fires early twice and is moved, never cutting the
        // stream; then 30 s of silence end it as idle.
        let idle = Duration::from_secs(30);
        let committed = committed_paced(8, Duration::from_secs(10)).await;
        let ends = Ends::default();
        let opts = RelayOptions {
            sse: true,
            continuable: false,
            idle,
            deadline: Instant::now() + Duration::from_secs(3600),
            max_continuations: 0,
        };
        let started = Instant::now();
        let mut body = super::body(committed, opts, ends.clone());
        let mut frames = Vec::new();
        let mut error = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => frames.extend(f.into_data().ok()),
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        assert_eq!(count_events(&frames), 8, "every event before the silence");
        assert_eq!(error.as_deref(), Some("idle_timeout"));
        assert_eq!(
            *ends.0.lock().expect("ends"),
            [StreamEnd::Aborted("idle_timeout")]
        );
        // The last chunk came at 70 s: cut 30 s after it, not earlier.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(100) && took < Duration::from_secs(101),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn a_break_behind_a_burst_still_ends_in_an_error_after_every_event() {
        // No terminating chunk: the connection closes inside the body.
        let ends = Ends::default();
        let (frames, error) = relay(committed(chunked_events()).await, &ends).await;
        assert_eq!(count_events(&frames), EVENTS, "the events before the break");
        let last = frames.last().expect("frames");
        assert!(
            String::from_utf8_lossy(last).contains("stream_interrupted"),
            "the last frame is the error event: {last:?}"
        );
        assert!(
            error.is_some(),
            "the body ends in an error, never a clean end"
        );
        assert_eq!(
            *ends.0.lock().expect("ends"),
            [StreamEnd::Aborted("upstream_reset")]
        );
    }
}
