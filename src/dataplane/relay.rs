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

use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::dataplane::forward::{BoxError, Committed};
use crate::dataplane::sse::{self, Event, Framer, Resumption, Skim, Splice, Transcript, Usage};

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

/// The body for a committed response.
pub fn body(committed: Committed, opts: RelayOptions, hooks: Box<dyn RelayHooks>) -> Body {
    let remaining = (!opts.sse).then_some(committed.content_length).flatten();
    let relay = Relay {
        first: committed.first,
        rest: committed.rest,
        remaining,
        usage: None,
        delivered: 0,
        framer: opts.sse.then(Framer::default),
        transcript: (opts.sse && opts.continuable).then(Transcript::new),
        splice: None,
        failure: None,
        first_break: None,
        opts,
        continuations: 0,
        hooks,
        ended: false,
        phase: Phase::Streaming,
    };
    let frames = futures_util::stream::unfold(relay, |mut r| async move {
        let item = r.next().await?;
        Some((item, r))
    });
    Body::new(StreamBody::new(frames))
}

enum Phase {
    Streaming,
    /// The error event was handed to hyper; abort after it is flushed.
    Abort(&'static str),
    Done,
}

struct Relay {
    first: Option<Bytes>,
    rest: Option<Incoming>,
    /// Plain bodies: bytes left by `Content-Length`; hyper stops polling
    /// once it wrote them, so the end is reported when they are handed over.
    remaining: Option<u64>,
    /// A plain body's `usage`, read when the body came in one chunk, or
    /// the usage chunk of an event stream without a transcript.
    usage: Option<Usage>,
    /// Body bytes handed to the client so far (the token estimate of an
    /// answer without `usage`).
    delivered: u64,
    framer: Option<Framer>,
    transcript: Option<Transcript>,
    splice: Option<Splice>,
    /// A break found after some events of a chunk were passed on.
    failure: Option<&'static str>,
    /// The first break: what the client is told if nothing could continue
    /// (never a continuation's own refusal).
    first_break: Option<&'static str>,
    opts: RelayOptions,
    continuations: u32,
    hooks: Box<dyn RelayHooks>,
    ended: bool,
    phase: Phase,
}

type Item = Result<Frame<Bytes>, BoxError>;

impl Relay {
    async fn next(&mut self) -> Option<Item> {
        loop {
            match self.phase {
                Phase::Done => return None,
                Phase::Abort(why) => {
                    // hyper flushes what it holds when the body is pending;
                    // without this the error event would die with the
                    // connection.
                    tokio::task::yield_now().await;
                    self.phase = Phase::Done;
                    return Some(Err(why.into()));
                }
                Phase::Streaming => {}
            }
            let step = match self.failure.take() {
                Some(why) => Err(why),
                None => match self.first.take() {
                    Some(first) => Ok(Some(first)),
                    None => self.read().await,
                },
            };
            let out = match step.and_then(|chunk| match chunk {
                Some(data) => self.pass(data),
                None => self.upstream_done().map(|()| Bytes::new()),
            }) {
                Ok(out) => out,
                Err(why) => match self.recover(why).await {
                    Some(seam) => seam,
                    None => return self.fail(why),
                },
            };
            if !out.is_empty() {
                // Plain bodies count in `pass` (their end is reported there).
                if self.framer.is_some() {
                    self.delivered += out.len() as u64;
                }
                return Some(Ok(Frame::data(out)));
            }
            if matches!(self.phase, Phase::Done) {
                return None;
            }
        }
    }

    /// The next chunk of the upstream body; `None` at its end.
    async fn read(&mut self) -> Result<Option<Bytes>, &'static str> {
        let Some(rest) = self.rest.as_mut() else {
            return Ok(None);
        };
        let idle_at = Instant::now() + self.opts.idle;
        let wake = idle_at.min(self.opts.deadline);
        loop {
            match tokio::time::timeout_at(wake, rest.frame()).await {
                Err(_) if wake == self.opts.deadline => return Err("total_timeout"),
                Err(_) => return Err("idle_timeout"),
                Ok(None) => return Ok(None),
                Ok(Some(Err(_))) => return Err("upstream_reset"),
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Ok(Some(data)),
                    // Empty chunks and trailers: keep reading.
                    _ => continue,
                },
            }
        }
    }

    /// What of `data` the client gets now; `Err` when it shows the stream
    /// broke (the events before the break are passed on first).
    fn pass(&mut self, data: Bytes) -> Result<Bytes, &'static str> {
        let Some(framer) = self.framer.as_mut() else {
            self.delivered += data.len() as u64;
            if let Some(left) = self.remaining.as_mut() {
                let whole = *left == data.len() as u64;
                *left = left.saturating_sub(data.len() as u64);
                if *left == 0 {
                    // Usage only from a body that came whole in one chunk
                    // (the usual JSON answer): nothing is copied for it.
                    if whole {
                        self.usage = sse::body_usage(&data);
                    }
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
        let mut passed = 0;
        for event in sse::events(&whole) {
            // The first chunk is parsed for the answer's identity; after
            // it, ordinary text chunks are only skimmed.
            if transcript.id.is_some() {
                match sse::skim(&event) {
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
        Ok(whole.slice(..passed))
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

impl Drop for Relay {
    fn drop(&mut self) {
        self.report(StreamEnd::ClientGone);
    }
}
