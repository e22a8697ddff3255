//! What feeds a connection's watchdog on hyper's paths: the connection's
//! I/O wrapped to mark reads and stalled writes ([`Watched`]), and the
//! request and response bodies that mark a request in flight and a frame
//! waiting for its client ([`Tracked`], [`UnreadMark`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::server;
use crate::watchdog::{ConnState, InFlight};

/// A response body on hyper's paths: holds its request's [`InFlight`]
/// until it ends, and marks in its slot (`ConnState::handed`) since when a
/// frame it gave hyper has waited for hyper to ask for the next. hyper asks
/// once the frame is on its way (HTTP/2: once the client's flow-control
/// window has room), so a slot that stays marked is a client that stopped
/// reading; a body waiting for its backend (`Pending`) is not marked.
pub(crate) struct Tracked {
    pub(crate) body: Body,
    pub(crate) handed: crate::slots::Slot<AtomicU64>,
    pub(crate) guard: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let since = match &polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => this.guard.0.ms() + 1,
            _ => 0,
        };
        this.handed.store(since, Ordering::Relaxed);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request body on hyper's HTTP/1 path: dropped before its end (its
/// answer given without reading it all), it marks its connection so that
/// the close after the answer lingers (`Watched::poll_shutdown`).
pub(crate) struct UnreadMark {
    pub(crate) inner: Incoming,
    pub(crate) state: Arc<ConnState>,
}

impl http_body::Body for UnreadMark {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UnreadMark {
    fn drop(&mut self) {
        use http_body::Body as _;
        if !self.inner.is_end_stream() {
            self.state.body_unread.store(true, Ordering::Relaxed);
        }
    }
}

/// An I/O stream that tells its [`ConnState`] when bytes come in, and
/// when writes block or flow again.
pub(crate) struct Watched<I> {
    pub(crate) inner: I,
    pub(crate) state: Arc<ConnState>,
    /// Bytes already read, to be read again first: what the lean HTTP/1
    /// server read before handing the connection to hyper.
    pub(crate) rewound: Bytes,
    /// A close that lingers (see [`UnreadMark`]): shut for writing, the
    /// rest of the request is read and dropped until this time.
    pub(crate) lingering: Option<Lingering>,
    /// The last write or flush found the socket full (what the watchdog
    /// was last told).
    blocked: bool,
}

pub(crate) struct Lingering {
    pub(crate) until: Pin<Box<tokio::time::Sleep>>,
    pub(crate) read: usize,
}

impl<I> Watched<I> {
    pub(crate) fn new(inner: I, state: Arc<ConnState>) -> Self {
        Self {
            inner,
            state,
            lingering: None,
            rewound: Bytes::new(),
            blocked: false,
        }
    }

    pub(crate) fn rewind(&mut self, read: Bytes) {
        self.rewound = read;
    }

    /// After a write or flush: tells the watchdog when writes start or
    /// stop finding the socket full (see [`ConnState::write_blocked`]).
    fn on_write<T>(&mut self, polled: &Poll<T>) {
        let blocked = polled.is_pending();
        if blocked != self.blocked {
            self.blocked = blocked;
            self.state.write_blocked(blocked);
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.rewound.is_empty() {
            // Counted when they were first read.
            let n = self.rewound.len().min(buf.remaining());
            buf.put_slice(&self.rewound.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.state.on_read();
        }
        polled
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.on_write(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // TLS flushes its buffered records here: a flush that waits is a
        // blocked write too.
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.on_write(&polled);
        polled
    }

    /// hyper shuts a connection down after its last answer; when that
    /// answer came before its request's body was read, the close lingers
    /// as the lean server's does (`server::linger`): the client still sending
    /// its body gets the answer rather than a reset.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.lingering.is_none() {
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if !this.state.body_unread.swap(false, Ordering::Relaxed) {
                return Poll::Ready(Ok(()));
            }
            this.lingering = Some(Lingering {
                until: Box::pin(tokio::time::sleep(server::LINGER_TIME)),
                read: 0,
            });
        }
        let Some(linger) = this.lingering.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let mut scratch = [0u8; 4096];
        while linger.read < server::LINGER_BYTES && linger.until.as_mut().poll(cx).is_pending() {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    linger.read += buf.filled().len();
                }
                Poll::Ready(_) => break,
            }
        }
        this.lingering = None;
        Poll::Ready(Ok(()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.on_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
