//! The admin listener: Prometheus `/metrics` (open, for scrapers), the
//! `/dashboard` page (open; it asks for a token and calls the API with
//! it), and the `/admin/v1/*` API behind bearer tokens with
//! viewer/operator roles.

mod cluster;
mod config;
mod dashboard;
mod explain;
mod members;
mod outlook;
mod policy;
mod quotas;
mod spend;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{header, Method, Uri};
use serde_json::json;

use crate::clock::now_ms;
use crate::config::{AdminToken, Config};
use crate::dataplane::auth;
use crate::dataplane::error::ApiError;
use crate::node::gateway::Gateway;

pub fn router(gw: Arc<Gateway>) -> Router {
    let api = Router::new()
        .route("/admin/v1/cluster", get(cluster::cluster))
        .route("/admin/v1/decisions", get(cluster::decisions))
        .route("/admin/v1/failover", post(cluster::write))
        .route("/admin/v1/failback", post(cluster::write))
        .route("/admin/v1/freeze", post(cluster::write))
        .route("/admin/v1/unfreeze", post(cluster::write))
        .route(
            "/admin/v1/members",
            get(members::list).post(members::change),
        )
        .route("/admin/v1/outlook", get(outlook::outlook))
        .route("/admin/v1/explain", get(explain::explain))
        .route("/admin/v1/quotas", get(quotas::quotas))
        .route("/admin/v1/rules", get(policy::rules))
        .route("/admin/v1/shadows", get(policy::shadows))
        .route("/admin/v1/shadows/{name}", get(policy::shadow))
        .route("/admin/v1/spend", get(spend::spend))
        .route("/admin/v1/config", get(config::show).post(config::apply))
        .route("/admin/v1/backends", get(backends))
        .route("/admin/v1/events", get(events))
        .route("/admin/v1/whoami", get(whoami))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&gw),
            require_token,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .merge(dashboard::router())
        .merge(api)
        .method_not_allowed_fallback(|m: Method| async move {
            ApiError::MethodNotAllowed(m.to_string())
        })
        .fallback(|uri: Uri| async move { ApiError::UnknownPath(uri.path().to_owned()) })
        .with_state(gw)
}

/// Why a request's admin token was not accepted.
enum Refused {
    Key(ApiError),
    /// A known token used from outside its `allow_from` networks.
    NotFrom(String),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Key(e) => e.into_response(),
            Refused::NotFrom(name) => cluster::AdminError::Forbidden(name).into_response(),
        }
    }
}

/// The admin token of a request, checked against its source network.
fn token_of<'a>(cfg: &'a Config, req: &Request) -> Result<&'a AdminToken, Refused> {
    let token = auth::bearer(auth::authorization(req.headers())).ok_or(ApiError::MissingKey);
    let token = token
        .and_then(|t| auth::admin_token(t, &cfg.admin.tokens).ok_or(ApiError::WrongKey))
        .map_err(Refused::Key)?;
    let source = source(req);
    if !token.allow_from.is_empty()
        && !source.is_some_and(|ip| token.allow_from.iter().any(|n| n.contains(ip)))
    {
        tracing::warn!(
            target: "zonegate::audit",
            token = %token.name,
            source = ?source,
            path = %req.uri().path(),
            "admin token used from a network it is not allowed from"
        );
        return Err(Refused::NotFrom(token.name.clone()));
    }
    Ok(token)
}

/// The address a request came from (its TCP peer).
fn source(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<zonegate_net::listen::Peer>()
        .map(|p| p.addr.ip())
}

/// Bearer token, role and source network; every write is audited with the
/// token's name, the source address, the request id and the answer.
async fn require_token(State(gw): State<Arc<Gateway>>, mut req: Request, next: Next) -> Response {
    let cfg = gw.cfg_arc();
    let t = match token_of(&cfg, &req) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    if !auth::allows(t.role, req.method()) {
        return cluster::AdminError::Forbidden(t.name.clone()).into_response();
    }
    req.extensions_mut().insert(cluster::Identity {
        name: t.name.clone(),
        role: t.role,
    });
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    if !write {
        return next.run(req).await;
    }
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| zonegate_net::random::hex(8), str::to_owned);
    let (source, path) = (source(&req), req.uri().path().to_owned());
    let answer = next.run(req).await;
    tracing::info!(
        target: "zonegate::audit",
        token = %t.name,
        source = ?source,
        request_id = %request_id,
        path = %path,
        status = answer.status().as_u16(),
        "admin write"
    );
    answer
}

async fn metrics(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    if gw.cfg().admin.metrics_auth {
        if let Err(refused) = token_of(&gw.cfg(), &req) {
            return refused.into_response();
        }
    }
    refresh_metrics(&gw);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
        .into_response()
}

const ZONE_STATUSES: &[&str] = &["active", "failed_over", "draining"];

/// Gauges of live state are read at scrape time, not kept per request;
/// series of zones and backends that are gone are dropped here.
fn refresh_metrics(gw: &Gateway) {
    use crate::telemetry::metrics::{mirror, retain, set_state};
    let m = &gw.metrics;
    let _one_scrape_at_a_time = m.scrape_guard();
    for (name, stats, limit) in gw.listeners.lock().iter() {
        use std::sync::atomic::Ordering::Relaxed;
        let l = [*name];
        m.listener_connections
            .with_label_values(&l)
            .set(i64::try_from(stats.open.load(Relaxed)).unwrap_or(i64::MAX));
        m.listener_connection_limit
            .with_label_values(&l)
            .set(i64::try_from(*limit).unwrap_or(i64::MAX));
        mirror(
            &m.listener_accepted.with_label_values(&l),
            stats.accepted.load(Relaxed),
        );
        mirror(
            &m.listener_refused.with_label_values(&l),
            stats.refused.load(Relaxed),
        );
        for (reason, n) in [
            ("idle", &stats.closed_idle),
            ("header_timeout", &stats.closed_header_timeout),
            ("send_timeout", &stats.closed_send_timeout),
            ("tls_failed", &stats.tls_failed),
            ("per_ip_limit", &stats.refused_per_ip),
        ] {
            mirror(
                &m.listener_closed.with_label_values(&[name, reason]),
                n.load(Relaxed),
            );
        }
    }
    if let Some(spread) = gw.data_spread.get() {
        for (thread, open) in spread.open().into_iter().enumerate() {
            m.listener_thread_connections
                .with_label_values(&["data", &thread.to_string()])
                .set(i64::try_from(open).unwrap_or(i64::MAX));
        }
        mirror(
            &m.listener_handed_over.with_label_values(&["data"]),
            spread.handed(),
        );
    }
    m.in_flight
        .set(i64::try_from(gw.drain.in_flight()).unwrap_or(i64::MAX));
    // Quota allocations follow the view even when no request came.
    gw.quotas.load().refresh(&gw.view.borrow().clone());
    if let Some(node) = &gw.cluster {
        let s = node.status();
        m.raft_term.set(i64::try_from(s.term).unwrap_or(i64::MAX));
        // A draining leader that stopped its Raft member leads nothing.
        let stopped = gw.drain.raft_stopped();
        m.raft_is_leader.set(i64::from(s.is_leader && !stopped));
        m.raft_has_leader
            .set(i64::from(s.leader.is_some() && !stopped));
        m.raft_applied_index.set(
            s.last_applied_index
                .map_or(0, |i| i64::try_from(i).unwrap_or(i64::MAX)),
        );
        m.raft_quorum_ack_age.set(
            s.millis_since_quorum_ack
                .map_or(0.0, |ms| ms as f64 / 1000.0),
        );
        let f = node.failover_status();
        // The leader's latest assessment only: a zone it no longer scores
        // (or a node that stopped leading) exports nothing stale.
        for g in [
            &m.zone_health_score,
            &m.zone_error_ratio,
            &m.zone_timeout_ratio,
            &m.zone_gpu_health_ratio,
        ] {
            g.reset();
        }
        for z in &f.zones {
            for (g, value) in [
                (&m.zone_health_score, z.score),
                (&m.zone_error_ratio, z.gw_error_rate),
                (&m.zone_timeout_ratio, z.timeout_rate),
                (&m.zone_gpu_health_ratio, z.gpu_health),
            ] {
                if let Some(v) = value {
                    g.with_label_values(&[z.zone.as_str()]).set(v);
                }
            }
        }
        if let Some(d) = f.last_detect_latency {
            m.failover_detect_seconds.set(d.as_secs_f64());
        }
        m.failover_fail_static.set(i64::from(f.fail_static));
        mirror(&m.failover_fail_static_periods, f.fail_static_periods);
        cluster::scrape(gw, node);
        for (outcome, n) in [
            ("proposed", f.auto_proposed),
            ("applied", f.auto_applied),
            ("refused", f.auto_refused),
        ] {
            mirror(&m.failover_auto_decisions.with_label_values(&[outcome]), n);
        }
    }
    let view = gw.view.borrow().clone();
    m.decision_version
        .set(i64::try_from(view.decision_version).unwrap_or(i64::MAX));
    retain(&m.zone_status, "zone", |z| {
        view.zones.keys().any(|k| k.as_str() == z)
    });
    for (zone, status) in &view.zones {
        set_state(
            &m.zone_status,
            &[zone.as_str()],
            ZONE_STATUSES,
            status.name(),
        );
    }
    let routes = gw.routes.load();
    for b in routes.backends.iter() {
        let labels = [b.name.as_str(), b.zone.as_str()];
        m.backend_in_flight
            .with_label_values(&labels)
            .set(i64::try_from(b.in_flight()).unwrap_or(i64::MAX));
        m.backend_up
            .with_label_values(&labels)
            .set(i64::from(b.is_up()));
    }
    for (model, cfg) in &routes.models {
        for p in &cfg.pools {
            let labels = [model.as_str(), p.zone.as_str()];
            let up = p.backends.iter().filter(|b| b.is_up()).count();
            m.pool_backends
                .with_label_values(&labels)
                .set(i64::try_from(p.backends.len()).unwrap_or(i64::MAX));
            m.pool_backends_up
                .with_label_values(&labels)
                .set(i64::try_from(up).unwrap_or(i64::MAX));
            // Also set by the panic events; read here too so every pool
            // exports 0 until it panics.
            m.pool_panic
                .with_label_values(&labels)
                .set(i64::from(p.in_panic()));
        }
    }
    let known = |b: &str| routes.backends.iter().any(|x| x.name == b);
    for g in [&m.backend_in_flight, &m.backend_up] {
        retain(g, "backend", known);
    }
    retain(&m.backend_state, "backend", known);
    for g in [&m.backend_health_score, &m.backend_effective_weight] {
        retain(g, "backend", known);
    }
}

async fn backends(State(gw): State<Arc<Gateway>>) -> Json<serde_json::Value> {
    let now = now_ms();
    let routes = gw.routes.load();
    let round = |v: f64| (v * 10.0).round() / 10.0;
    let list: Vec<_> = routes
        .backends
        .iter()
        .map(|b| {
            let h = b.health();
            let m = &h.machine;
            let pools: Vec<_> = routes
                .models
                .iter()
                .flat_map(|(name, model)| model.pools.iter().map(move |p| (name, p)))
                .filter(|(_, p)| p.backends.iter().any(|x| Arc::ptr_eq(x, b)))
                .map(|(name, p)| json!({"model": name, "zone": p.zone, "panic": p.in_panic()}))
                .collect();
            json!({
                "name": b.name,
                "zone": b.zone,
                "url": format!("{}://{}", b.scheme, b.authority),
                "provider": b.provider.as_ref().map(|p| p.kind.as_str()),
                // Whether it takes traffic outside panic mode ("up"/"down").
                "state": if b.is_up() { "up" } else { "down" },
                "health_state": m.state,
                "score": m.score.map(round),
                "components": {
                    "latency": h.components.latency.map(round),
                    "errors": h.components.errors.map(round),
                    "queue": h.components.queue.map(round),
                    "kv_free": h.components.kv_free.map(round),
                },
                "weight": b.weight,
                "effective_weight": (b.effective_weight() * 1000.0).round() / 1000.0,
                "ramp": m.ramp.map(|r| json!({
                    "share": (r.factor(now) * 1000.0).round() / 1000.0,
                    "from": r.from,
                    "elapsed_ms": now.saturating_sub(r.start_ms),
                })),
                "in_flight": b.in_flight(),
                "latency_ewma_ms": round(b.latency_ewma_ms()),
                "cooling_down_ms": b.cooldown_until_ms().saturating_sub(now),
                "ejections": m.ejections,
                "ejected": (m.state == crate::health::state::State::Down).then(|| json!({
                    "cause": m.cause,
                    "for_ms": now.saturating_sub(m.down_since_ms),
                    "watch_ms": u64::try_from(m.watch_time(&gw.cfg().health).as_millis()).unwrap_or(u64::MAX),
                })),
                "last_probe": h.last_probe.as_ref().map(|p| json!({
                    "ago_ms": now.saturating_sub(p.at_ms),
                    "ok": p.ok,
                    "latency_ms": p.latency_ms,
                    "raw_score": round(p.raw_score),
                    "scraped": p.scraped,
                })),
                "pools": pools,
            })
        })
        .collect();
    Json(json!({
        "breaker_open": routes.breaker_open(),
        "floor_model": gw.cfg().health.floor_model,
        "backends": list,
    }))
}

/// `GET /admin/v1/whoami`: the token's name and role (the dashboard shows
/// the operators' actions only to operators).
async fn whoami(
    axum::Extension(who): axum::Extension<cluster::Identity>,
) -> Json<serde_json::Value> {
    let role = match who.role {
        crate::config::Role::Viewer => "viewer",
        crate::config::Role::Operator => "operator",
    };
    Json(json!({ "name": who.name, "role": role }))
}

/// Recent eject, rejoin, refused-ejection, panic and breaker events,
/// newest first.
async fn events(State(gw): State<Arc<Gateway>>) -> Json<serde_json::Value> {
    Json(json!({ "events": gw.events.recent(200) }))
}
