//! What a listener serves: its app (an axum `Router` or a service of
//! the same shape), the [`Plain`] handler of the POSTs the lean server
//! takes, and the [`Peer`] every request can carry. Both the listener and
//! the lean server (`server`) read these.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::uri::PathAndQuery;
use http::Request;
use rustls::pki_types::CertificateDer;
use tower::Service;

use crate::http1::{Answer, HeadFields};

/// What a listener serves: an axum `Router`, or a service of the same
/// shape (the data plane's front door skips the router for its hot path).
pub trait App:
    Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> App for S where
    S: Service<Request<Body>, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// A handler of plain POSTs: the requests to its paths that the lean
/// HTTP/1 server takes (HTTP/1.1 with a `Content-Length` body, see `server`)
/// come to [`Plain::call`] as their path, header fields and body, and its
/// [`Answer`] is written as it is. No `http` request or response is built
/// around them: a handler that reads a few headers and passes the rest on
/// (a proxy) builds and drops no header map, URI or extensions map per
/// request (about 3k instructions and six allocations of a proxied
/// request's ~42k). The same requests over HTTP/2, or over an HTTP/1
/// connection hyper serves, go to the listener's app, which must answer
/// them the same way; plain requests carry no [`Peer`]. A listener serves
/// one with `listen::serve_plain`.
///
/// Its future is a type of its own, not boxed: it is kept in the
/// connection's task while the request runs (the data plane's is ~3.4 KB,
/// which glibc's thread cache does not hold: an allocation and a free
/// per request, and a copy into the box).
pub trait Plain: Send + Sync + 'static {
    /// The paths (without a query) whose POSTs this handler answers,
    /// parsed once: a request to one without a query is handed over with
    /// it as its target, no parse per request.
    fn paths(&self) -> &[PathAndQuery];
    /// The answer to `req`; dropped unfinished when the client hangs up.
    fn call(&self, req: PlainRequest) -> impl Future<Output = Answer> + Send;
}

/// The [`Plain`] handler of a listener that has none: no paths.
pub struct NoPlain;

impl Plain for NoPlain {
    fn paths(&self) -> &[PathAndQuery] {
        &[]
    }

    /// Never called: a request goes to a handler only by one of its paths.
    fn call(&self, _: PlainRequest) -> impl Future<Output = Answer> + Send {
        std::future::ready(Answer::default())
    }
}

/// What a listener's requests go to: its app, and the plain POSTs its
/// [`Plain`] handler takes.
pub(crate) struct Handlers<A, P> {
    pub(crate) app: A,
    pub(crate) plain: Option<Arc<P>>,
}

impl<A: Clone, P> Clone for Handlers<A, P> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            plain: self.plain.clone(),
        }
    }
}

/// A POST the lean server took for a [`Plain`] handler.
#[derive(Debug)]
pub struct PlainRequest {
    /// Its request target: one of the handler's paths, and the query if it
    /// had one.
    pub target: PathAndQuery,
    /// Its header fields, framing headers included, as the head holds them.
    pub fields: HeadFields,
    pub body: Body,
}

/// Who is at the other end of a request's connection: a request extension
/// every handler can read.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The client's certificate chain, when it presented one over TLS.
    pub certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}
