//! The respond stage: the committed attempt becomes the client's response
//! (routing headers, the session pin, the body streamed through), and its
//! end becomes metrics and the access line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;

use super::attempts::Winner;
use super::chain::Link;
use super::{pin, RequestFacts};
use crate::clock::now_ms;
use crate::dataplane::affinity::PIN_HEADER;
use crate::dataplane::backend::Backend;
use crate::dataplane::forward::{self, ProxyBody, StreamEnd};
use crate::dataplane::request::RequestClass;
use crate::node::gateway::Gateway;

/// The first byte is in: record the attempt's success, count fallbacks,
/// pin the session, and describe the route for the response headers.
fn served(gw: &Gateway, req: &RequestFacts<'_>, w: &Winner<'_>) -> Served {
    let (model, backend, committed) = (w.model, Arc::clone(&w.backend), &w.committed);
    backend.record_success(committed.first_byte, now_ms());
    let m = &gw.metrics;
    m.first_byte
        .with_label_values(&[&model.cfg.name, &backend.name])
        .observe(committed.first_byte.as_secs_f64());
    m.forward_attempts
        .with_label_values(&[&model.cfg.name, &backend.name, backend.zone.as_str(), "ok"])
        .inc();
    let class = req.class.as_str();
    let mut route = vec![w.reason.as_str().to_owned()];
    if w.cross_zone {
        route.push("fallback:cross-zone".into());
        m.fallbacks.with_label_values(&["cross_zone", class]).inc();
    }
    if w.link != Link::Primary {
        route.push(w.link.as_str().into());
        m.fallbacks
            .with_label_values(&[w.link.metric_kind(), class])
            .inc();
    }
    if w.attempts > 1 {
        route.push(format!("retry:{}", w.attempts - 1));
    }
    // A session's first answer pins it to the zone that gave it.
    let pin_token = req
        .session
        .filter(|_| gw.cfg.affinity.zone_pin)
        .and_then(|s| pin(gw, s, req.pinned.as_ref().unwrap_or(&backend.zone)));
    Served {
        pin_token,
        tenant: req.tenant.name.clone(),
        model: model.cfg.name.clone(),
        backend,
        route: route.join(", "),
        decision_version: req.decision_version,
        request_id: req.request_id.clone(),
        total_timeout: model.cfg.total_timeout,
        class: req.class,
    }
}

/// Who served a request and how; becomes headers, metrics and the access line.
struct Served {
    pin_token: Option<String>,
    tenant: String,
    model: String,
    backend: Arc<Backend>,
    route: String,
    decision_version: u64,
    request_id: String,
    total_timeout: Duration,
    class: RequestClass,
}

/// The respond stage: the committed response with zonegate's headers, its
/// body streamed through; metrics and the access line when it ends.
pub(super) fn respond(
    gw: &Arc<Gateway>,
    req: &RequestFacts<'_>,
    winner: Winner<'_>,
    started: Instant,
) -> Response {
    let ctx = served(gw, req, &winner);
    let Winner {
        mut committed,
        guards,
        ..
    } = winner;
    let status = committed.status;
    let sse = forward::is_sse(&committed.headers);
    let mut headers = forward::downstream_headers(std::mem::take(&mut committed.headers));
    forward::set_header(&mut headers, "x-zonegate-backend", &ctx.backend.name);
    forward::set_header(&mut headers, "x-zonegate-zone", ctx.backend.zone.as_str());
    forward::set_header(
        &mut headers,
        "x-zonegate-decision-version",
        &ctx.decision_version.to_string(),
    );
    forward::set_header(&mut headers, "x-zonegate-route", &ctx.route);
    forward::set_header(&mut headers, "x-zonegate-model", &ctx.model);
    forward::set_header(&mut headers, "x-request-id", &ctx.request_id);
    if let Some(token) = &ctx.pin_token {
        forward::set_header(&mut headers, PIN_HEADER, token);
    }
    let deadline = tokio::time::Instant::from_std(started + ctx.total_timeout);
    let gw = Arc::clone(gw);
    let outcome_ok = if status.is_success() {
        "ok"
    } else {
        "client_error"
    };
    let body = ProxyBody::new(committed, sse, deadline, move |end| {
        let _guards = guards;
        let outcome = match &end {
            StreamEnd::Complete => outcome_ok,
            StreamEnd::ClientGone => "client_gone",
            StreamEnd::Aborted(reason) => {
                gw.metrics
                    .stream_aborts
                    .with_label_values(&[ctx.model.as_str(), ctx.backend.name.as_str(), reason])
                    .inc();
                if let Some(change) = ctx.backend.record_failure(now_ms(), &gw.cfg.health) {
                    crate::health::passive_ejection(&gw, &ctx.backend, change, reason);
                }
                "stream_aborted"
            }
        };
        gw.metrics
            .requests
            .with_label_values(&[&ctx.tenant, &ctx.model, outcome])
            .inc();
        gw.metrics
            .request_duration
            .with_label_values(&[&ctx.model])
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(
            target: "zonegate::access",
            request_id = %ctx.request_id,
            tenant = %ctx.tenant,
            model = %ctx.model,
            backend = %ctx.backend.name,
            zone = %ctx.backend.zone,
            route = %ctx.route,
            class = ctx.class.as_str(),
            status = status.as_u16(),
            outcome,
            ms = started.elapsed().as_millis() as u64,
            "request"
        );
    });
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}
