//! The data plane's request path, stage by stage (`serve` is one line per
//! stage): authenticate → count (the tenant's rpm) → read → resolve → pin
//! → admit (quota) → plan → pick and forward
//! (retry on another; `attempts`) → respond (`respond`). `chain` plans the
//! models a request may be answered by; `continuation` resumes a stream
//! that broke after bytes reached the client.

mod attempts;
mod budget;
mod chain;
mod continuation;
mod respond;
mod unknown;

pub(crate) use unknown::unknown_model;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Uri};
use opentelemetry::KeyValue;
use serde_json::json;
use zonegate_cluster::{ClusterView, ZoneId};
use zonegate_net::http1::Answer;

use self::attempts::{Attempts, Outgoing};
use self::continuation::Continuer;
use crate::clock::{now_ms, unix_s};
use crate::config::Config;
use crate::dataplane::auth;
use crate::dataplane::balance::hash_key;
use crate::dataplane::error::ApiError;
use crate::dataplane::forward;
use crate::dataplane::policy;
use crate::dataplane::quota::{self, Admission, Ask};
use crate::dataplane::request::{classify, ClientHeaders, RequestClass, RequestMeta};
use crate::node::gateway::Gateway;
use crate::telemetry::metrics::{bounded_label, UNKNOWN_MODEL};
use crate::telemetry::traces::{self, keys};

/// The data-plane router: OpenAI endpoints, liveness and readiness; any
/// other path is an OpenAI-shaped 404.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route(INFERENCE_PATHS[0], post(handle))
        .route(INFERENCE_PATHS[1], post(handle))
        .route(INFERENCE_PATHS[2], post(handle))
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
    let cfg = gw.cfg_arc();
    let caller = match authenticate(&cfg, auth::authorization(&headers)) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    // Every response of a limited tenant carries its rate limits.
    let limits = gw
        .quotas
        .load()
        .headers(caller.index, crate::clock::now_ns());
    let routes = gw.routes.load();
    let data: Vec<_> = routes
        .model_names()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "zonegate"}))
        .collect();
    let mut resp = Json(json!({"object": "list", "data": data})).into_response();
    quota::set_headers(resp.headers_mut(), &limits);
    resp
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

fn authenticate<'a>(
    cfg: &'a Config,
    authorization: Option<&str>,
) -> Result<auth::Caller<'a>, ApiError> {
    let key = auth::bearer(authorization).ok_or(ApiError::MissingKey)?;
    auth::tenant(key, &cfg.tenants, &cfg.tenant_keys).ok_or(ApiError::WrongKey)
}

fn witness_error() -> ApiError {
    ApiError::NotReady("this node is a Raft witness: it votes but serves no traffic".into())
}

/// The inference endpoints: POST only, each served by [`infer`].
pub const INFERENCE_PATHS: [&str; 3] =
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

async fn handle(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let target = target_of(&parts.uri);
    infer(&gw, target, ClientHeaders::Map(parts.headers), body)
        .await
        .into_response()
}

/// A request's origin-form target, as its backend gets it.
pub fn target_of(uri: &Uri) -> PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// One inference request, whole: authentication, the request path, the
/// error answer and its access line. `target`: the request's path and
/// query (one of [`INFERENCE_PATHS`]).
pub async fn infer(
    gw: &Arc<Gateway>,
    target: PathAndQuery,
    headers: ClientHeaders,
    body: Body,
) -> Answer {
    if gw.is_witness() {
        return Answer::from(witness_error().into_response());
    }
    let started = Instant::now();
    // One config version for the whole request, whatever is applied
    // meanwhile.
    let cfg = gw.cfg_arc();
    // The request's span: only with an endpoint and when sampled.
    let trace = match gw.tracer.get() {
        None => None,
        Some(t) => t.start_request(|n| headers.get(n), span_name(target.path())),
    };
    let result = match authenticate(&cfg, headers.text(&http::header::AUTHORIZATION)) {
        Ok(caller) => {
            if let Some(span) = &trace {
                span.set([KeyValue::new(keys::TENANT, Arc::clone(&caller.tenant.name))]);
            }
            serve(gw, &cfg, caller, &target, &headers, body, started, &trace)
                .await
                .map_err(|f| (Some(caller), f))
        }
        Err(e) => Err((None, (None, e))),
    };
    match result {
        Ok(resp) => resp,
        Err((tenant, (model, e))) => {
            // Every response of a limited tenant carries its rate limits.
            let limits = match (&e, tenant) {
                (ApiError::RateLimited { .. } | ApiError::CapacityExceeded { .. }, _)
                | (_, None) => http::HeaderMap::new(),
                (_, Some(t)) => gw.quotas.load().headers(t.index, crate::clock::now_ns()),
            };
            let tenant = tenant.map_or("-", |c| &*c.tenant.name);
            // A resolved model's name (or the fixed one of an unknown
            // model): bounded by config, and capped all the same.
            let model = bounded_label(model.as_deref().unwrap_or("-"));
            gw.metrics
                .requests
                .with_label_values(&[tenant, model, e.code()])
                .inc();
            tracing::info!(
                target: "zonegate::access",
                tenant,
                model,
                status = e.status().as_u16(),
                outcome = e.code(),
                ms = started.elapsed().as_millis() as u64,
                trace_id = trace.as_ref().map(|t| tracing::field::display(t.trace_id())),
                "{e}"
            );
            let decision = gw.view.borrow().decision_version;
            if let Some(span) = &trace {
                // Tenant and model are on it as soon as they were known.
                span.set([
                    KeyValue::new(keys::STATUS_CODE, i64::from(e.status().as_u16())),
                    KeyValue::new(keys::OUTCOME, e.code()),
                    KeyValue::new(keys::DECISION_VERSION, traces::int(decision)),
                    KeyValue::new(keys::CONFIG_VERSION, traces::int(cfg.config_version)),
                ]);
                span.fail(e.code());
                span.end();
            }
            // Errors, too, say which decisions this node routed with.
            let mut answer = Answer::from(e.into_response());
            let headers = &mut answer.headers;
            forward::set_version(headers, forward::Version::Decision, decision);
            forward::set_version(headers, forward::Version::Config, cfg.config_version);
            quota::set_headers(headers, &limits);
            answer
        }
    }
}

/// A request that failed: the `model` label it is counted under (`None`
/// before the body named a model) and why.
type Failed = (Option<String>, ApiError);

/// A request's server span's name: the method and the route.
fn span_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "POST /v1/chat/completions",
        "/v1/completions" => "POST /v1/completions",
        "/v1/embeddings" => "POST /v1/embeddings",
        _ => "POST",
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    gw: &Arc<Gateway>,
    cfg: &Arc<Config>,
    caller: auth::Caller<'_>,
    target: &PathAndQuery,
    headers: &ClientHeaders,
    body: Body,
    started: Instant,
    trace: &Option<traces::Span>,
) -> Result<Answer, Failed> {
    // Every request counts against the tenant's rpm before anything is
    // done for it: an unknown model or a bad body costs a request too.
    let view = gw.view.borrow().clone();
    let quotas = gw.quotas.load();
    quotas.refresh(&view);
    quotas
        .count_request(caller.index, crate::clock::now_ns())
        .map_err(|e| (None, e))?;
    let body = read_body(
        body,
        cfg.node.max_body_bytes,
        cfg.node.limits.body_read_timeout,
    )
    .await
    .map_err(|e| (None, e))?;
    let mut meta = RequestMeta::parse(&body).map_err(|e| (None, e))?;
    let routes = gw.routes.load();
    // An alias (`[[models]] aliases`) stands for its model; the client's
    // own name is kept (the body carries it, the backend's copy is
    // rewritten from it) only when one replaced it.
    let mut aliased = None;
    let as_named = routes.model(&meta.model);
    if as_named.is_none() {
        if let Some(m) = cfg.model_of_alias(&meta.model) {
            aliased = Some(std::mem::replace(&mut meta.model, m.to_owned()));
        }
    }
    // Traffic policy: a model the tenant may not use does not exist for
    // it; a rule may answer the request with another model.
    let allowed = policy::allows_model(cfg, caller.index, &meta.model);
    let user = || policy_user(&caller.tenant.name, headers, &meta);
    let rule = allowed
        .then(|| {
            let header = |n: &http::HeaderName| headers.get(n);
            let who = (&*caller.tenant.name, caller.index);
            policy::rules::select(cfg, &gw.metrics, who, &meta.model, header, user)
        })
        .flatten();
    let before_rule = rule.map(|r| std::mem::replace(&mut meta.model, r.route_to.clone()));
    let meta = meta;
    // The model the client meant (its alias resolved, before any rule:
    // what shadows match on), and the name its body carries.
    let meant: &str = before_rule.as_deref().unwrap_or(&meta.model);
    let requested: &str = aliased.as_deref().unwrap_or(meant);
    // One lookup of the model's name when neither an alias nor a rule
    // replaced it.
    let primary = match (&aliased, &before_rule) {
        (None, None) => as_named,
        _ => routes.model(&meta.model),
    };
    let Some(primary) = primary.filter(|_| allowed) else {
        let may_use = |m: &str| policy::allows_model(cfg, caller.index, m);
        let e = unknown::unknown_model(cfg, &routes, requested, &may_use);
        return Err((Some(UNKNOWN_MODEL.to_owned()), e));
    };
    // From here on the model is one the routes know.
    let failed = |e| (Some(meta.model.clone()), e);
    let deadline = tokio::time::Instant::from_std(started + primary.cfg.timeouts.total);
    let client = (target.path(), headers);
    let mut facts = RequestFacts::new(gw, cfg, (caller, view), client, &meta, body.len(), deadline);
    facts.rule = rule.map(|r| Arc::clone(&r.name));
    facts.requested = Some(Arc::clone(&primary.name));
    if let Some(span) = trace {
        span.set([
            KeyValue::new(keys::OPERATION, traces::operation(target.path())),
            KeyValue::new(keys::REQUEST_MODEL, requested.to_owned()),
            KeyValue::new(keys::REQUEST_ID, facts.request_id.to_string()),
        ]);
        facts.trace = Some(span.clone());
    }
    // One reading for the quota stage and the first pick.
    let admitted_at = Instant::now();
    let now_ns = crate::clock::ns_at(admitted_at);
    let mut admission = admit(gw, &facts, &meta, body.len(), now_ns)
        .await
        .map_err(failed)?;
    let min_tier = chain::min_tier(headers, body.len(), &cfg.prompt_tiers).map_err(failed)?;
    let (mut models, skipped) = chain::model_chain(cfg, &routes, primary, min_tier);
    // A fallback the tenant may not use is skipped.
    models.retain(|(m, _)| policy::allows_model(cfg, caller.index, &m.cfg.name));
    budget::admit(
        gw,
        &facts,
        &mut models,
        &mut admission,
        crate::clock::unix_ms(),
    )
    .map_err(failed)?;
    if models.is_empty() {
        return Err(failed(chain::no_capable_model(
            &meta.model,
            min_tier,
            &skipped,
        )));
    }
    // Shadows copy only a request admitted by every stage (quota, tier,
    // budget): a refused one costs its copy nothing.
    let shadows = start_shadows(gw, cfg, &facts, meant, target, headers, &body, &meta);
    let out = Outgoing {
        target,
        headers,
        body: &body,
        model: requested,
    };
    let mut attempts = Attempts::default();
    // The backends the tenant's tags rule out count as tried from the start.
    let excluded = policy::eligible::exclude(cfg, caller.index, &routes, &mut attempts.tried);
    let chain = models.clone();
    let first = Some(admitted_at);
    let result =
        attempts::forward_chain(gw, &routes, &facts, chain, &out, &mut attempts, first).await;
    if !shadows.is_empty() {
        shadows.primary(policy::shadow::Primary {
            status: result.as_ref().map_or(0, |w| w.committed.status.as_u16()),
            first_byte: admitted_at.elapsed(),
            body: result
                .as_ref()
                .ok()
                .filter(|w| w.committed.rest.is_none())
                .and_then(|w| w.committed.first.clone()),
        });
    }
    match result {
        Ok(winner) => {
            let count = attempts.count;
            let continuer = Continuer::for_stream(gw, &out, &meta, &models, &facts, attempts);
            Ok(respond::respond(
                gw, facts, winner, started, count, continuer, admission,
            ))
        }
        Err(gave_up) => {
            let blocked = gave_up.withheld_zones && facts.class == RequestClass::Long;
            let a = &attempts;
            let e = if !a.budget_exhausted && !blocked && !skipped.is_empty() {
                // Only models below the required tier could still have
                // answered: say so rather than answer worse than asked.
                chain::no_capable_after(&meta.model, min_tier, &skipped, a)
            } else {
                attempts::final_error(&meta.model, a, blocked)
            };
            Err(failed(policy::eligible::explain(
                cfg,
                caller.index,
                excluded,
                e,
            )))
        }
    }
}

/// The hash a rule's or shadow's share is decided by: tenant and user
/// (the session, else the body's `user`, else the client's request id,
/// else a fresh random draw).
fn policy_user(tenant: &str, headers: &ClientHeaders, meta: &RequestMeta) -> u64 {
    match session_key(headers, meta) {
        Some(key) => policy::rules::user_hash(tenant, key.as_bytes()),
        None => match headers.get(&forward::names::REQUEST_ID) {
            Some(id) => policy::rules::user_hash(tenant, id),
            None => fastrand::u64(..),
        },
    }
}

/// The shadow stage, once the quota, tier and budget stages admitted the
/// request: copies of a sampled request start in the background (nothing
/// when no shadow names the model).
#[allow(clippy::too_many_arguments)]
fn start_shadows(
    gw: &Arc<Gateway>,
    cfg: &Arc<Config>,
    facts: &RequestFacts,
    body_model: &str,
    target: &PathAndQuery,
    headers: &ClientHeaders,
    body: &Bytes,
    meta: &RequestMeta,
) -> policy::shadow::Pending {
    // The user's hash only for a model some shadow samples.
    if cfg.policy.shadows.is_empty() || !cfg.policy.shadows_by_model.contains_key(body_model) {
        return policy::shadow::Pending::default();
    }
    let ask = policy::shadow::Ask {
        tenant_index: facts.tenant_index,
        tenant: &facts.tenant,
        model: body_model,
        user: policy_user(&facts.tenant, headers, meta),
        path: target.as_str(),
        headers,
        body,
        stream: meta.stream,
        request_id: facts.request_id.as_bytes(),
        estimate: crate::dataplane::cost::Estimate {
            prompt: body.len() as u64 / crate::dataplane::quota::BYTES_PER_TOKEN,
            max_output: meta
                .max_tokens
                .unwrap_or(crate::dataplane::quota::DEFAULT_OUTPUT_TOKENS),
        },
        trace: facts.trace.as_ref(),
    };
    policy::shadow::start(gw, cfg, &ask)
}

/// The quota stage: the tenant's allocation on this node, the model's
/// limits and the zone's capacity, from local memory (the allocations
/// follow the view the request holds), at `now_ns` ([`crate::clock::now_ns`]).
/// A request short of the zone's units may wait for them (`[quotas]
/// queue_timeout`).
async fn admit(
    gw: &Gateway,
    facts: &RequestFacts,
    meta: &RequestMeta,
    body_len: usize,
    now_ns: u64,
) -> Result<Admission, ApiError> {
    // One atomic load when the count stage already refreshed it (a config
    // applied in between swaps in quota state that has not been).
    let quotas = gw.quotas.load();
    quotas.refresh(&facts.view);
    let ask = Ask {
        tenant_index: facts.tenant_index,
        model: &meta.model,
        class: facts.class,
        body_len,
        max_tokens: meta.max_tokens,
        zone: facts.view.effective_zone(&facts.home),
    };
    quotas.admit_or_wait(&ask, now_ns, facts.deadline).await
}

/// The whole body, at most `limit` bytes, within `[node.limits]
/// body_read_timeout` (a client trickling its body holds no slot for long).
async fn read_body(
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    use zonegate_net::listen::BodyError;
    match zonegate_net::listen::read_body(body, limit, timeout).await {
        Ok(b) => Ok(b),
        Err(BodyError::TooLarge) => Err(ApiError::PayloadTooLarge(limit)),
        Err(BodyError::Timeout) => Err(ApiError::BodyTimeout(timeout)),
        Err(e) => Err(ApiError::BadRequest(e.to_string())),
    }
}

/// What stays the same across one request's attempts (and its
/// continuations, which hold a copy).
#[derive(Clone)]
struct RequestFacts {
    /// The config the request started with: one version for all of it,
    /// whatever is applied meanwhile.
    cfg: Arc<Config>,
    tenant: Arc<str>,
    /// The tenant's place in config (for cached metric handles).
    tenant_index: usize,
    session: Option<u64>,
    /// The zone the session is pinned to, else this node's.
    home: ZoneId,
    view: Arc<ClusterView>,
    request_id: RequestId,
    class: RequestClass,
    stream: bool,
    /// One deadline over every attempt, retry, fallback and continuation:
    /// the requested model's `total_timeout` from arrival.
    deadline: tokio::time::Instant,
    decision_version: u64,
    /// The traffic rule that routed the request (`x-zonegate-route`).
    rule: Option<Arc<str>>,
    /// The model the client named (once the routes know it): the
    /// `model` label of `zonegate_model_answers_total`.
    requested: Option<Arc<str>>,
    /// The request's span, when it is traced: its attempts', its
    /// continuations' and its shadows' parent.
    trace: Option<traces::Span>,
}

impl RequestFacts {
    /// The pin stage: the session, its home zone and the request's class
    /// (`caller, view`: the tenant and the view the count stage read;
    /// `path, headers`: the request's path and headers).
    fn new(
        gw: &Gateway,
        cfg: &Arc<Config>,
        (caller, view): (auth::Caller<'_>, Arc<ClusterView>),
        (path, headers): (&str, &ClientHeaders),
        meta: &RequestMeta,
        body_len: usize,
        deadline: tokio::time::Instant,
    ) -> Self {
        let embeddings = path == "/v1/embeddings";
        let tenant = caller.tenant;
        // A session is a tenant's: another tenant with the same session key
        // shares neither its pin nor its pin token.
        let session = session_key(headers, meta)
            .map(|s| hash_key(&[tenant.name.as_bytes(), &[0], s.as_bytes()].concat()));
        let pinned = session.and_then(|s| pinned_zone(gw, cfg, headers, &tenant.name, s));
        RequestFacts {
            cfg: Arc::clone(cfg),
            tenant: tenant.name.clone(),
            tenant_index: caller.index,
            session,
            home: pinned.unwrap_or_else(|| cfg.node.zone.clone()),
            request_id: RequestId::of(headers),
            class: classify(meta, body_len, embeddings, &cfg.affinity),
            stream: meta.stream,
            deadline,
            decision_version: view.decision_version,
            view,
            rule: None,
            requested: None,
            trace: None,
        }
    }
}

/// A request's id: the client's `x-request-id` when it is visible text
/// (sharing the request's bytes), else a fresh random one, 32 hex digits
/// held inline: written into the backend's request and the answer, and
/// logged, without an allocation.
#[derive(Clone)]
pub(super) enum RequestId {
    Client(http::HeaderValue),
    Fresh([u8; 32]),
}

impl RequestId {
    fn of(headers: &ClientHeaders) -> Self {
        if let Some(v) = headers
            .value(&forward::names::REQUEST_ID)
            .filter(|v| v.to_str().is_ok())
        {
            return Self::Client(v);
        }
        // Unguessable: seeded from the OS CSPRNG, no system call per id.
        let n = zonegate_net::random::id128();
        let mut hex = [0u8; 32];
        for (i, digit) in hex.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[((n >> (124 - 4 * i)) & 0xf) as usize];
        }
        Self::Fresh(hex)
    }

    /// Visible ASCII either way.
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Client(v) => v.as_bytes(),
            Self::Fresh(hex) => hex,
        }
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::str::from_utf8(self.as_bytes()).unwrap_or("-"))
    }
}

/// The header a client names its session with.
const SESSION_HEADER: http::HeaderName = http::HeaderName::from_static("x-session-id");

/// Session key: the `x-session-id` header, else the body's `user`.
fn session_key<'a>(headers: &'a ClientHeaders, meta: &'a RequestMeta) -> Option<&'a str> {
    headers
        .text(&SESSION_HEADER)
        .filter(|s| !s.is_empty())
        .or(meta.user.as_deref().filter(|s| !s.is_empty()))
}

/// The home zone a session is pinned to: from a valid token the client
/// echoed (good on any node), else from this node's pin table. Forged or
/// expired tokens are ignored, never an error.
fn pinned_zone(
    gw: &Gateway,
    cfg: &Config,
    headers: &ClientHeaders,
    tenant: &str,
    session: u64,
) -> Option<ZoneId> {
    if !cfg.affinity.zone_pin {
        return None;
    }
    let now = unix_s();
    headers
        .text(&forward::names::PIN)
        .and_then(|t| gw.pin_signer.verify(t, tenant, session, now))
        .or_else(|| gw.pins.get(session, now))
}

/// Pins (or refreshes) a session to `zone`; returns the token for the client.
pub(super) fn pin(gw: &Gateway, tenant: &str, session: u64, zone: &ZoneId) -> String {
    let expiry = gw.pins.put(session, zone.clone(), unix_s());
    gw.pin_signer.sign(tenant, session, zone, expiry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_the_clients_when_it_is_text_else_32_fresh_hex_digits() {
        let mut h = HeaderMap::new();
        let fresh = RequestId::of(&ClientHeaders::Map(h.clone())).to_string();
        assert_eq!(fresh.len(), 32, "{fresh}");
        assert!(fresh
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(
            fresh,
            RequestId::of(&ClientHeaders::Map(h.clone())).to_string(),
            "fresh ids differ"
        );

        h.insert("x-request-id", http::HeaderValue::from_static("req-123"));
        assert_eq!(
            RequestId::of(&ClientHeaders::Map(h.clone())).to_string(),
            "req-123"
        );
        assert_eq!(
            RequestId::of(&ClientHeaders::Map(h.clone())).as_bytes(),
            b"req-123"
        );

        // Not visible text: replaced, never logged or forwarded as is.
        h.insert(
            "x-request-id",
            http::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text is a valid value"),
        );
        assert_eq!(
            RequestId::of(&ClientHeaders::Map(h.clone()))
                .to_string()
                .len(),
            32
        );
    }
}
