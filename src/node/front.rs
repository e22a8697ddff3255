//! The data plane's front door: an inference POST goes straight to the
//! proxy inside the drain's accounting; every other request (models,
//! health, readiness, a wrong method or path) goes through the axum
//! router and its layers.
//!
//! Why: axum's routing, its boxed route services and a `from_fn` layer
//! cost about 14k of the ~107k instructions a proxied request took
//! (callgrind, `benches/callgrind.sh`), for a choice between three paths.
//! The router still answers everything it did; this only skips it for the
//! hot path, with the same drain accounting (`drain::enter`/`finish`). `Front` is
//! served as it is (`zonegate_net::listen::App`), not as a router's
//! fallback, which cost another ~4k.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use futures_util::future::BoxFuture;
use http::Method;
use tower::{Service, ServiceExt};

use crate::dataplane::proxy;
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
        let inference =
            req.method() == Method::POST && proxy::INFERENCE_PATHS.contains(&req.uri().path());
        if inference {
            let gw = Arc::clone(&self.gw);
            // The request's future is large (3.7 KB by `-Zprint-type-sizes`):
            // awaited inline, it is moved once, into this block's box
            // (`drain::tracked` would take it by value: moved again, or
            // boxed twice).
            Box::pin(async move {
                let entered = drain::enter(&gw);
                let resp = proxy::infer(Arc::clone(&gw), req).await;
                Ok(drain::finish(&gw, entered, resp))
            })
        } else {
            let rest = self.rest.clone();
            Box::pin(async move { rest.oneshot(req).await })
        }
    }
}
