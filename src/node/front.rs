//! The data plane's front door: an inference POST goes straight to the
//! proxy inside the drain's accounting; every other request (models,
//! health, readiness, a wrong method or path) goes through the axum
//! router and its layers.
//!
//! Two doors lead to the proxy. A plain HTTP/1.1 POST (most of them) comes
//! from the lean server to [`Inference`], a `zonegate_net::listen::Plain`
//! handler: its path, header fields and body, no `http` request, and its
//! answer goes back without an `http` response (no URI parse, header map
//! or extensions map per request). Every other inference POST (HTTP/2, or
//! HTTP/1 that hyper serves) comes to [`Front`] as a request.
//!
//! Why: axum's routing, its boxed route services and a `from_fn` layer
//! cost about 14k of the ~107k instructions a proxied request took
//! (callgrind, `benches/callgrind.sh`), for a choice between three paths;
//! the request and response types around a plain POST another ~3k of 42k.
//! The router still answers everything it did; this only skips it for the
//! hot path, with the same drain accounting (`drain::enter`/`finish`).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use futures_util::future::BoxFuture;
use http::uri::PathAndQuery;
use http::Method;
use tower::{Service, ServiceExt};
use zonegate_net::http1::Answer;
use zonegate_net::listen::{Plain, PlainRequest};

use crate::dataplane::proxy;
use crate::dataplane::request::ClientHeaders;
use crate::node::drain;
use crate::node::gateway::Gateway;

/// The data plane's service (see the module).
#[derive(Clone)]
pub struct Front {
    gw: Arc<Gateway>,
    /// Everything but inference: the data plane's router with the drain
    /// and readiness layers.
    rest: Router,
}

impl Front {
    /// `rest` answers what is not an inference POST.
    pub fn new(gw: Arc<Gateway>, rest: Router) -> Self {
        Self { gw, rest }
    }
}

impl Service<Request> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let to_proxy =
            req.method() == Method::POST && proxy::INFERENCE_PATHS.contains(&req.uri().path());
        if to_proxy {
            let (parts, body) = req.into_parts();
            let target = proxy::target_of(&parts.uri);
            let headers = ClientHeaders::Map(parts.headers);
            let gw = Arc::clone(&self.gw);
            Box::pin(async move {
                let answer = inference(&gw, target, headers, body).await;
                Ok(answer.into_response())
            })
        } else {
            let rest = self.rest.clone();
            Box::pin(async move { rest.oneshot(req).await })
        }
    }
}

/// The inference endpoints' plain POSTs, from the lean HTTP/1 server (see
/// the module).
pub struct Inference {
    gw: Arc<Gateway>,
    /// `proxy::INFERENCE_PATHS`, parsed.
    paths: Vec<PathAndQuery>,
}

impl Inference {
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self {
            gw,
            paths: inference_paths(),
        }
    }
}

fn inference_paths() -> Vec<PathAndQuery> {
    proxy::INFERENCE_PATHS
        .iter()
        .filter_map(|p| PathAndQuery::try_from(*p).ok())
        .collect()
}

impl Plain for Inference {
    fn paths(&self) -> &[PathAndQuery] {
        &self.paths
    }

    /// Not boxed: the lean server keeps it in the connection's task. It
    /// borrows the gateway from the handler, which outlives the connection:
    /// no reference count is taken per request.
    fn call(&self, req: PlainRequest) -> impl Future<Output = Answer> + Send {
        let headers = ClientHeaders::Fields(req.fields);
        inference(&self.gw, req.target, headers, req.body)
    }
}

/// One inference request through either door, counted in flight by the
/// drain from its first poll until its answer's body ends. The request's
/// future (~3.4 KB by `-Zprint-type-sizes`) is awaited inline, so it is
/// moved once, into whatever holds this one (`drain::tracked` would take
/// it by value: moved again). An async block, not an `async fn`, which
/// kept its arguments apart from the block's state: ~250 instructions of
/// copying more per request (`benches/callgrind.sh`).
#[allow(clippy::manual_async_fn)] // measured: see above
fn inference(
    gw: &Arc<Gateway>,
    target: PathAndQuery,
    headers: ClientHeaders,
    body: axum::body::Body,
) -> impl Future<Output = Answer> + Send + '_ {
    async move {
        let entered = drain::enter(gw);
        let answer = proxy::infer(gw, target, headers, body).await;
        drain::finish(gw, entered, answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_inference_path_is_a_plain_one() {
        let parsed = inference_paths();
        let paths: Vec<&str> = parsed.iter().map(PathAndQuery::as_str).collect();
        assert_eq!(paths, proxy::INFERENCE_PATHS);
    }
}
