//! `GET /admin/v1/explain?model=M[&session=S][&zone=Z][&max_tokens=N]`:
//! how this node would route such a request now (`zonegate ctl explain`),
//! without sending it: the home and effective zone and why, the zone order
//! with each candidate backend's state and weight, the model fallback chain
//! and whether the request may cross zones.
//!
//! It calls the data plane's own public stages (`classify`, `plan_zones`
//! and the plan's `order`, the pin table, `Routes::model`) on this node's
//! current view. Two approximations, both said in the answer: a session's
//! home comes from this node's pin table (a client's pin token is not
//! seen), and the prompt size is taken as small.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use zonegate_cluster::ZoneId;

use crate::clock::unix_s;
use crate::dataplane::balance::hash_key;
use crate::dataplane::error::error_body;
use crate::dataplane::policy::allows_model;
use crate::dataplane::proxy::unknown_model;
use crate::dataplane::request::{classify, RequestMeta};
use crate::dataplane::routing::plan_zones;
use crate::node::gateway::Gateway;

#[derive(Deserialize)]
pub struct ExplainQuery {
    model: String,
    session: Option<String>,
    /// The zone the request enters at (default: this node's).
    zone: Option<String>,
    max_tokens: Option<u64>,
    /// Traffic policy: the tenant, its user and one `name:value` header.
    tenant: Option<String>,
    user: Option<String>,
    header: Option<String>,
}

/// `GET /admin/v1/explain`.
pub async fn explain(State(gw): State<Arc<Gateway>>, Query(q): Query<ExplainQuery>) -> Response {
    let routes = gw.routes.load();
    let cfg = gw.cfg_arc();
    let aliased = || cfg.model_of_alias(&q.model).and_then(|m| routes.model(m));
    let Some(model) = routes.model(&q.model).or_else(aliased) else {
        let tenant =
            (q.tenant.as_deref()).and_then(|t| cfg.tenants.iter().position(|x| *x.name == *t));
        let may_use = |m: &str| tenant.is_none_or(|i| allows_model(&cfg, i, m));
        let msg = unknown_model(&cfg, &routes, &q.model, &may_use).to_string();
        return (
            StatusCode::NOT_FOUND,
            Json(error_body(&msg, "invalid_request_error", "model_not_found")),
        )
            .into_response();
    };
    let view = gw.view.borrow().clone();
    let entry = q
        .zone
        .as_deref()
        .map_or_else(|| gw.cfg().node.zone.clone(), ZoneId::new);
    let pinned = q
        .session
        .as_deref()
        .filter(|_| gw.cfg().affinity.zone_pin)
        .and_then(|s| gw.pins.get(hash_key(s.as_bytes()), unix_s()));
    let (home, home_why) = match (&pinned, &q.zone) {
        (Some(z), _) => (
            z.clone(),
            format!("session pinned to {z} in this node's pin table"),
        ),
        (None, Some(z)) => (ZoneId::new(z), format!("enters at {z}")),
        (None, None) => (entry.clone(), format!("this node's zone, {entry}")),
    };
    let meta = RequestMeta {
        model: q.model.clone(),
        stream: false,
        max_tokens: q.max_tokens,
        user: None,
        plain_text: true,
    };
    // A small prompt: the class then depends on max_tokens alone.
    let class = classify(&meta, 256, false, &gw.cfg().affinity);
    let policy = gw.cfg().affinity.cross_zone_fallback;
    let plan = plan_zones(&home, &view, &model.zones, class, policy);
    let effective_why = if *plan.effective == home {
        format!("{home} is active")
    } else {
        format!(
            "{home} is failed over to {} as of decision version {}",
            plan.effective, view.decision_version
        )
    };
    // The order the data plane tries zones in (`ZonePlan::order`).
    let cfg = gw.cfg();
    let order: Vec<&ZoneId> = plan.order(&cfg, model).collect();
    let zones: Vec<Value> = order
        .iter()
        .map(|z| {
            let pool = model.pool(z);
            json!({
                "zone": z,
                "panic": pool.is_some_and(|p| p.in_panic()),
                "backends": pool.map(|p| p.backends.iter().map(|b| json!({
                    "name": b.name,
                    "state": if b.is_up() { "up" } else { "down" },
                    "weight": b.weight,
                    "effective_weight": (b.effective_weight() * 1000.0).round() / 1000.0,
                    "in_flight": b.in_flight(),
                })).collect::<Vec<_>>()).unwrap_or_default(),
            })
        })
        .collect();
    Json(json!({
        "model": q.model,
        "node": gw.cfg().node.id,
        "decision_version": view.decision_version,
        "class": match class {
            crate::dataplane::request::RequestClass::Short => "short",
            crate::dataplane::request::RequestClass::Long => "long",
        },
        "home": home,
        "home_why": home_why,
        "effective_zone": plan.effective,
        "effective_why": effective_why,
        "may_cross_zones": !plan.fallbacks.is_empty(),
        "withheld_zones": plan.withheld,
        "zones": zones,
        "fallback_models": model.cfg.fallback,
        "rule": super::policy::explain_rule(&cfg, q.tenant.as_deref(), q.user.as_deref(), q.header.as_deref(), &q.model),
        "note": "the session's home is read from this node's pin table; the prompt is taken as small",
    }))
    .into_response()
}
