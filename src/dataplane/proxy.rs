//! The data plane's request path, stage by stage:
//! authenticate → read body → resolve model → plan zones → pick backend →
//! forward (retry on another) → respond with routing headers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use http_body_util::{BodyExt, Limited};
use serde_json::json;
use zonegate_cluster::ZoneId;

use crate::dataplane::affinity::{unix_now_s, PIN_HEADER};
use crate::dataplane::auth;
use crate::dataplane::backend::{now_ms, Backend};
use crate::config::Tenant;
use crate::dataplane::error::ApiError;
use crate::dataplane::forward::{self, AttemptError, ProxyBody, StreamEnd};
use crate::node::gateway::Gateway;
use crate::dataplane::observe::ZoneResult;
use crate::dataplane::request::{classify, RequestClass, RequestMeta};
use crate::dataplane::routing::{plan_zones, ModelRoute, Routes};

/// The data-plane router: OpenAI endpoints, liveness and readiness; any
/// other path is an OpenAI-shaped 404.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handle))
        .route("/v1/completions", post(handle))
        .route("/v1/embeddings", post(handle))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .method_not_allowed_fallback(|m: Method| async move {
            ApiError::MethodNotAllowed(m.to_string())
        })
        .fallback(|uri: Uri| async move { ApiError::UnknownPath(uri.path().to_owned()) })
        .with_state(gw)
}

async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(e) = authenticate(&gw, &headers) {
        return e.into_response();
    }
    let routes = gw.routes.load();
    let data: Vec<_> = routes
        .model_names()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "zonegate"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// Ready when at least one backend can take a request.
async fn readyz(State(gw): State<Arc<Gateway>>) -> Response {
    if gw.is_witness() {
        return witness_error().into_response();
    }
    let now = now_ms();
    if gw.routes.load().backends.iter().any(|b| b.is_usable(now)) {
        "ready\n".into_response()
    } else {
        ApiError::NotReady("no backend is available".into()).into_response()
    }
}

fn authenticate<'a>(gw: &'a Gateway, headers: &HeaderMap) -> Result<&'a Tenant, ApiError> {
    let key = auth::bearer(headers).ok_or(ApiError::MissingKey)?;
    auth::tenant(key, &gw.cfg.tenants).ok_or(ApiError::WrongKey)
}

fn witness_error() -> ApiError {
    ApiError::NotReady("this node is a Raft witness: it votes but serves no traffic".into())
}

async fn handle(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    if gw.is_witness() {
        return witness_error().into_response();
    }
    let started = Instant::now();
    let result = match authenticate(&gw, req.headers()) {
        Ok(tenant) => serve(&gw, tenant, req, started)
            .await
            .map_err(|f| (Some(tenant), f)),
        Err(e) => Err((None, (None, e))),
    };
    match result {
        Ok(resp) => resp,
        Err((tenant, (model, e))) => {
            let tenant = tenant.map_or("-", |t| t.name.as_str());
            gw.metrics
                .requests
                .with_label_values(&[tenant, model.as_deref().unwrap_or("-"), e.code()])
                .inc();
            tracing::info!(
                target: "zonegate::access",
                tenant,
                model = model.as_deref().unwrap_or("-"),
                status = e.status().as_u16(),
                outcome = e.code(),
                ms = started.elapsed().as_millis() as u64,
                "{e}"
            );
            // Errors, too, say which decisions this node routed with.
            let mut resp = e.into_response();
            let version = gw.view.borrow().decision_version.to_string();
            forward::set_header(resp.headers_mut(), "x-zonegate-decision-version", &version);
            resp
        }
    }
}

type Failed = (Option<String>, ApiError);

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::PayloadTooLarge(limit))
        }
        Err(e) => Err(ApiError::BadRequest(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// What one request's attempts have seen so far.
#[derive(Default)]
struct Attempts {
    /// Identities (addresses) of the backends already tried.
    tried: Vec<usize>,
    count: u32,
    failures: Vec<(String, AttemptError)>,
    budget_exhausted: bool,
}

async fn serve(
    gw: &Arc<Gateway>,
    tenant: &Tenant,
    req: Request,
    started: Instant,
) -> Result<Response, Failed> {
    let (parts, body) = req.into_parts();
    let body = read_body(body, gw.cfg.node.max_body_bytes)
        .await
        .map_err(|e| (None, e))?;
    let meta = RequestMeta::parse(&body).map_err(|e| (None, e))?;
    let routes = gw.routes.load();
    let primary = routes.model(&meta.model).ok_or_else(|| {
        (
            Some(meta.model.clone()),
            ApiError::ModelNotFound(meta.model.clone()),
        )
    })?;
    let view = gw.view.borrow().clone();
    let embeddings = parts.uri.path() == "/v1/embeddings";
    let class = classify(&meta, body.len(), embeddings, &gw.cfg.affinity);
    let session =
        session_key(&parts.headers, &meta).map(|s| crate::dataplane::balance::hash_key(s.as_bytes()));
    let pinned = session.and_then(|s| pinned_zone(gw, &parts.headers, s));
    let home = pinned.clone().unwrap_or_else(|| gw.cfg.node.zone.clone());
    let request_id = parts
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:032x}", fastrand::u128(..)));
    gw.budget.lock().record_request(now_ms() / 1000);

    let min_tier = min_tier(&parts.headers, body.len(), &gw.cfg.prompt_tiers)
        .map_err(|e| (Some(meta.model.clone()), e))?;
    let (chain, skipped) = model_chain(gw, &routes, primary, min_tier);
    if chain.is_empty() {
        return Err((
            Some(meta.model.clone()),
            no_capable_model(&meta.model, min_tier, &skipped),
        ));
    }
    let req = RequestFacts {
        tenant,
        session,
        pinned,
        request_id,
        class,
        decision_version: view.decision_version,
    };
    let mut attempts = Attempts::default();
    let mut home_zone = ZoneWatch::default();
    let mut withheld_zones = false;
    let mut rng = fastrand::Rng::new();
    for (model, link) in chain {
        let zones: Vec<ZoneId> = model.pools.iter().map(|p| p.zone.clone()).collect();
        let plan = plan_zones(
            &home,
            &view,
            &zones,
            class,
            gw.cfg.affinity.cross_zone_fallback,
        );
        home_zone.zone.get_or_insert_with(|| plan.effective.clone());
        // A session keeps its backend within its zone by consistent hashing.
        let balance = if session.is_some() && gw.cfg.affinity.zone_pin {
            crate::config::Balance::Ring
        } else {
            model.cfg.balance
        };
        let mut model_attempts = 0;
        // The fallback order is only worked out if the effective zone
        // cannot answer: most requests never need it.
        let fallbacks = std::iter::once_with(|| {
            order_fallbacks(gw, model, &plan.effective, plan.fallbacks.clone())
        });
        let zone_order = std::iter::once(plan.effective.clone()).chain(fallbacks.flatten());
        for (zone_pos, zone) in zone_order.enumerate() {
            let Some(pool) = model.pool(&zone) else {
                continue;
            };
            while model_attempts < gw.cfg.retry.max_attempts {
                let now = now_ms();
                let Some((backend, reason)) =
                    pool.pick(balance, session, now, &attempts.tried, &mut rng)
                else {
                    break;
                };
                if attempts.count > 0 {
                    if !gw.budget.lock().try_retry(now / 1000) {
                        gw.metrics
                            .retry_budget_exhausted
                            .with_label_values(&[&model.cfg.name])
                            .inc();
                        attempts.budget_exhausted = true;
                        home_zone.finish(gw, None);
                        return Err((
                            Some(meta.model.clone()),
                            final_error(&meta.model, &attempts, false),
                        ));
                    }
                    gw.metrics
                        .retries
                        .with_label_values(&[&model.cfg.name])
                        .inc();
                }
                attempts.tried.push(Arc::as_ptr(&backend) as usize);
                attempts.count += 1;
                model_attempts += 1;
                let guards = (backend.start_request(), pool.enter());
                let uri = upstream_uri(&backend, &parts.uri);
                let mut headers = forward::upstream_headers(&parts.headers);
                forward::set_header(&mut headers, "x-request-id", &req.request_id);
                let payload = rewrite_model(&body, &meta.model, &backend, &model.cfg.name);
                let result = forward::attempt(
                    &gw.upstream(),
                    uri,
                    headers,
                    payload,
                    model.cfg.first_byte_timeout,
                )
                .await;
                match result {
                    Ok(committed) => {
                        home_zone.finish(gw, Some(&backend.zone));
                        let how = How {
                            reason,
                            cross_zone: zone_pos > 0,
                            link,
                            attempts: attempts.count,
                        };
                        let ctx = served(gw, &req, model, backend, how, &committed);
                        return Ok(respond(gw, committed, ctx, started, guards));
                    }
                    Err(e) => {
                        note_failure(gw, model, &backend, &e, now);
                        home_zone.saw(&backend.zone, &e);
                        attempts.failures.push((backend.name.clone(), e));
                    }
                }
            }
        }
        withheld_zones |= plan
            .withheld
            .iter()
            .any(|z| model.pool(z).is_some_and(|p| p.has_usable(now_ms())));
    }
    home_zone.finish(gw, None);
    let zone_blocked = withheld_zones && class == RequestClass::Long;
    let e = if !zone_blocked && !skipped.is_empty() {
        // Only models below the required tier could still have answered:
        // say so rather than answer worse than asked.
        no_capable_after(&meta.model, min_tier, &skipped, &attempts)
    } else {
        final_error(&meta.model, &attempts, zone_blocked)
    };
    Err((Some(meta.model.clone()), e))
}

fn no_capable_after(model: &str, min_tier: u32, skipped: &[(&str, u32)], a: &Attempts) -> ApiError {
    let mut e = no_capable_model(model, min_tier, skipped);
    if let (ApiError::NoCapableModel(msg), Some((b, last))) = (&mut e, a.failures.last()) {
        msg.push_str(&format!(
            "; {} capable attempt(s) failed, the last: {b}: {last}",
            a.count
        ));
    }
    e
}

/// What stays the same across one request's attempts.
struct RequestFacts<'a> {
    tenant: &'a Tenant,
    session: Option<u64>,
    pinned: Option<ZoneId>,
    request_id: String,
    class: RequestClass,
    decision_version: u64,
}

/// How the answering backend was reached.
struct How {
    reason: crate::dataplane::routing::PickReason,
    cross_zone: bool,
    link: Link,
    attempts: u32,
}

/// The first byte is in: record the attempt's success, count fallbacks,
/// pin the session, and describe the route for the response headers.
fn served(
    gw: &Gateway,
    req: &RequestFacts<'_>,
    model: &ModelRoute,
    backend: Arc<Backend>,
    how: How,
    committed: &forward::Committed,
) -> Served {
    backend.record_success(committed.first_byte, now_ms());
    let m = &gw.metrics;
    m.first_byte
        .with_label_values(&[&model.cfg.name, &backend.name])
        .observe(committed.first_byte.as_secs_f64());
    m.forward_attempts
        .with_label_values(&[&model.cfg.name, &backend.name, backend.zone.as_str(), "ok"])
        .inc();
    let class = req.class.as_str();
    let mut route = vec![how.reason.as_str().to_owned()];
    if how.cross_zone {
        route.push("fallback:cross-zone".into());
        m.fallbacks.with_label_values(&["cross_zone", class]).inc();
    }
    if how.link != Link::Primary {
        route.push(how.link.as_str().into());
        m.fallbacks
            .with_label_values(&[how.link.metric_kind(), class])
            .inc();
    }
    if how.attempts > 1 {
        route.push(format!("retry:{}", how.attempts - 1));
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

/// How a request's effective zone did, for the zone observations the
/// control plane scores (see `observe`).
#[derive(Default)]
struct ZoneWatch {
    zone: Option<ZoneId>,
    error: bool,
    busy: bool,
}

impl ZoneWatch {
    fn saw(&mut self, zone: &ZoneId, e: &AttemptError) {
        if self.zone.as_ref() != Some(zone) {
            return;
        }
        match e {
            AttemptError::Busy(_) => self.busy = true,
            AttemptError::FirstByteTimeout(_) => {}
            _ => self.error = true,
        }
    }

    /// Records the result once; `served_in` is the zone that answered.
    fn finish(&mut self, gw: &Gateway, served_in: Option<&ZoneId>) {
        let Some(zone) = self.zone.take() else { return };
        let result = if served_in == Some(&zone) {
            ZoneResult::Served
        } else if self.error {
            ZoneResult::Failed
        } else if self.busy {
            // Busy is not broken: a zone that only said 429 is not scored.
            return;
        } else {
            ZoneResult::Unanswered
        };
        gw.zone_stats.record(&zone, result);
    }
}

/// How a model got into a request's chain; becomes part of
/// `x-zonegate-route`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Primary,
    /// From the primary's `fallback` list.
    Fallback,
    /// The global breaker is open and the primary has no healthy backend.
    Floor,
}

impl Link {
    fn as_str(self) -> &'static str {
        match self {
            Link::Primary => "primary",
            Link::Fallback => "fallback-model",
            Link::Floor => "floor-model",
        }
    }

    fn metric_kind(self) -> &'static str {
        match self {
            Link::Primary => "none",
            Link::Fallback => "model",
            Link::Floor => "floor_model",
        }
    }
}

/// Models to try for one request, with how each got there.
type Chain<'a> = Vec<(&'a ModelRoute, Link)>;

/// The header a client names its minimum model tier with.
const MIN_TIER_HEADER: &str = "x-zonegate-min-tier";

/// The tier a request needs: what the client asks for in the header, and
/// at least what its size suggests (`[[prompt_tiers]]`: a long prompt is
/// taken as a complex task that a small model would answer worse).
fn min_tier(headers: &HeaderMap, body_len: usize, by_size: &[(u64, u32)]) -> Result<u32, ApiError> {
    let estimated = by_size
        .iter()
        .filter(|(bytes, _)| body_len as u64 >= *bytes)
        .map(|(_, tier)| *tier)
        .max()
        .unwrap_or(0);
    let Some(v) = headers.get(MIN_TIER_HEADER) else {
        return Ok(estimated);
    };
    let asked: u32 = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::BadRequest(format!("{MIN_TIER_HEADER} must be a non-negative integer"))
        })?;
    Ok(asked.max(estimated))
}

/// The models to try, in order: the primary and its fallbacks, led by the
/// floor model while the global breaker is open and the primary has no
/// healthy backend; each substitute at or above `min_tier`. Also returns the models
/// skipped for their tier, for the error.
fn model_chain<'a>(
    gw: &Gateway,
    routes: &'a Routes,
    primary: &'a ModelRoute,
    min_tier: u32,
) -> (Chain<'a>, Vec<(&'a str, u32)>) {
    let floor = gw
        .cfg
        .health
        .floor_model
        .as_deref()
        .filter(|_| routes.breaker_open() && primary.is_unhealthy())
        .and_then(|f| routes.model(f))
        .map(|m| (m, Link::Floor));
    let listed = std::iter::once((primary, Link::Primary)).chain(
        primary
            .cfg
            .fallback
            .iter()
            .filter_map(|name| routes.model(name))
            .map(|m| (m, Link::Fallback)),
    );
    let mut chain: Vec<(&ModelRoute, Link)> = Vec::new();
    let mut skipped = Vec::new();
    for (m, link) in floor.into_iter().chain(listed) {
        if chain.iter().any(|(c, _)| std::ptr::eq(*c, m)) {
            continue;
        }
        // The model the client named is always tried: the tier only keeps
        // substitutes (fallbacks, the floor model) from answering worse.
        if link != Link::Primary && m.tier() < min_tier {
            skipped.push((m.cfg.name.as_str(), m.tier()));
            continue;
        }
        chain.push((m, link));
    }
    (chain, skipped)
}

fn no_capable_model(model: &str, min_tier: u32, skipped: &[(&str, u32)]) -> ApiError {
    let skipped: Vec<String> = skipped
        .iter()
        .map(|(name, tier)| format!("`{name}` (tier {tier})"))
        .collect();
    ApiError::NoCapableModel(format!(
        "no model at or above tier {min_tier} can serve `{model}` now; skipped as below the \
         required tier: {}",
        skipped.join(", ")
    ))
}

/// A failed attempt: its metric, its log line and its passive signal (a
/// 429 cools the backend down; anything else counts toward ejecting it).
fn note_failure(gw: &Gateway, model: &ModelRoute, backend: &Backend, e: &AttemptError, now: u64) {
    gw.metrics
        .forward_attempts
        .with_label_values(&[
            &model.cfg.name,
            &backend.name,
            backend.zone.as_str(),
            e.outcome(),
        ])
        .inc();
    tracing::debug!(backend = %backend.name, error = %e, "attempt failed");
    match e {
        AttemptError::Busy(wait) => {
            backend.cool_down(now, wait.unwrap_or(gw.cfg.retry.default_cooldown))
        }
        e if e.counts_against_health() => {
            if let Some(change) = backend.record_failure(now, &gw.cfg.health) {
                crate::health::passive_ejection(gw, backend, change, &e.to_string());
            }
        }
        _ => {}
    }
}

/// The error for a request that no backend answered.
fn final_error(model: &str, a: &Attempts, zone_blocked: bool) -> ApiError {
    let tried = a.count;
    if tried == 0 {
        if zone_blocked {
            return ApiError::ZoneUnavailable(format!(
                "no backend for `{model}` is available in this zone, and long requests do not cross zones; \
                 retry later or cap max_tokens to make the request short"
            ));
        }
        return ApiError::NoBackend {
            message: format!("no healthy backend for model `{model}` (0 tried)"),
        };
    }
    let budget = if a.budget_exhausted {
        "; retry budget exhausted"
    } else {
        ""
    };
    let last = a
        .failures
        .last()
        .map(|(b, e)| format!("; last: {b}: {e}"))
        .unwrap_or_default();
    let message = format!("all {tried} tried backend(s) failed for model `{model}`{budget}{last}");
    if a.failures
        .iter()
        .all(|(_, e)| matches!(e, AttemptError::Busy(_)))
    {
        let wait = a
            .failures
            .iter()
            .filter_map(|(_, e)| match e {
                AttemptError::Busy(w) => *w,
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(1));
        return ApiError::AllBusy {
            message,
            retry_after_s: wait.as_secs().max(1),
        };
    }
    if a.failures
        .iter()
        .all(|(_, e)| matches!(e, AttemptError::FirstByteTimeout(_)))
    {
        return ApiError::UpstreamTimeout { message };
    }
    ApiError::UpstreamFailed { message }
}

/// Session key: the `x-session-id` header, else the body's `user`.
fn session_key<'a>(headers: &'a HeaderMap, meta: &'a RequestMeta) -> Option<&'a str> {
    headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .or(meta.user.as_deref().filter(|s| !s.is_empty()))
}

fn upstream_uri(backend: &Backend, client_uri: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(backend.scheme.clone());
    parts.authority = Some(backend.authority.clone());
    parts.path_and_query = client_uri.path_and_query().cloned();
    // Scheme, authority and path each came from a valid URI.
    Uri::from_parts(parts).unwrap_or_else(|_| client_uri.clone())
}

/// The body for this backend: untouched, unless the model it must name
/// differs from the one the client asked for (the backend's own name for
/// it, or a fallback model).
fn rewrite_model(body: &Bytes, requested: &str, backend: &Backend, logical: &str) -> Bytes {
    let target = backend.physical_model(logical).unwrap_or(logical);
    if target == requested {
        return body.clone();
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body) {
        Ok(mut obj) => {
            obj.insert("model".into(), target.into());
            serde_json::to_vec(&obj)
                .map(Bytes::from)
                .unwrap_or_else(|_| body.clone())
        }
        Err(_) => body.clone(),
    }
}

/// The home zone a session is pinned to: from a valid token the client
/// echoed (good on any node), else from this node's pin table. Forged or
/// expired tokens are ignored, never an error.
fn pinned_zone(gw: &Gateway, headers: &HeaderMap, session: u64) -> Option<ZoneId> {
    if !gw.cfg.affinity.zone_pin {
        return None;
    }
    let now = unix_now_s();
    headers
        .get(PIN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| gw.pin_signer.verify(t, session, now))
        .or_else(|| gw.pins.get(session, now))
}

/// Pins (or refreshes) a session to `zone`; returns the token for the client.
fn pin(gw: &Gateway, session: u64, zone: &ZoneId) -> Option<String> {
    let expiry = gw.pins.put(session, zone.clone(), unix_now_s());
    gw.pin_signer.sign(session, zone, expiry)
}

/// Cross-zone fallback targets in preference order: the configured
/// `[zones.<z>] fallback_order` first, then the others by how much of their
/// pool for this model can take traffic now (the healthiest first).
fn order_fallbacks(
    gw: &Gateway,
    model: &crate::dataplane::routing::ModelRoute,
    effective: &ZoneId,
    mut zones: Vec<ZoneId>,
) -> Vec<ZoneId> {
    let preferred = gw.cfg.fallback_order.get(effective);
    let now = now_ms();
    let rank = |z: &ZoneId| {
        let configured = preferred
            .and_then(|p| p.iter().position(|x| x == z))
            .unwrap_or(usize::MAX);
        let usable = model.pool(z).map_or(0.0, |p| p.usable_share(now));
        (configured, std::cmp::Reverse((usable * 1000.0) as u64))
    };
    zones.sort_by_key(|z| rank(z));
    zones
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

fn respond(
    gw: &Arc<Gateway>,
    committed: forward::Committed,
    ctx: Served,
    started: Instant,
    guards: (crate::dataplane::backend::InFlight, crate::dataplane::routing::PoolGuard),
) -> Response {
    let status = committed.status;
    let mut committed = committed;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_tier_takes_the_larger_of_header_and_size_estimate() {
        let by_size = [(1_000, 1), (10_000, 3)];
        let mut h = HeaderMap::new();
        assert_eq!(min_tier(&h, 10, &by_size).unwrap(), 0);
        assert_eq!(min_tier(&h, 1_000, &by_size).unwrap(), 1);
        assert_eq!(min_tier(&h, 50_000, &by_size).unwrap(), 3);
        h.insert(MIN_TIER_HEADER, "2".parse().unwrap());
        assert_eq!(min_tier(&h, 10, &by_size).unwrap(), 2);
        assert_eq!(min_tier(&h, 50_000, &by_size).unwrap(), 3);
        h.insert(MIN_TIER_HEADER, "high".parse().unwrap());
        assert!(matches!(
            min_tier(&h, 10, &by_size),
            Err(ApiError::BadRequest(_))
        ));
    }
}
