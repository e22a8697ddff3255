//! `GET /admin/v1/spend?since=24h[&tenant=T]`: what each tenant spent per
//! model since then (hour resolution), in base units of the config's
//! currency: this node's answers, and on the leader also the cluster's
//! (from the spend in the nodes' demand reports while it leads). With
//! each budgeted tenant's budgets and this node's grant in force, and,
//! apart, what this node's shadow copies cost (`shadow_spend`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::clock::unix_ms as now_ms;
use crate::dataplane::cost::units;
use crate::dataplane::error::error_body;
use crate::dataplane::spend::{Line, KEEP_HOURS};
use crate::node::gateway::Gateway;

#[derive(Deserialize)]
pub struct SpendQuery {
    /// A duration back from now (`24h`, `30m`, `7d`); default 24 hours.
    since: Option<String>,
    tenant: Option<String>,
}

/// `GET /admin/v1/spend`.
pub async fn spend(State(gw): State<Arc<Gateway>>, Query(q): Query<SpendQuery>) -> Response {
    let since = match q.since.as_deref().map(humantime::parse_duration) {
        None => Duration::from_secs(24 * 3600),
        Some(Ok(d)) if d.as_secs() <= KEEP_HOURS * 3600 => d,
        Some(Ok(_)) | Some(Err(_)) => {
            let msg = format!(
                "since must be a duration such as 24h or 7d, at most {} days",
                KEEP_HOURS / 24
            );
            return (
                StatusCode::BAD_REQUEST,
                Json(error_body(&msg, "invalid_request_error", "invalid_request")),
            )
                .into_response();
        }
    };
    let now = now_ms();
    let from = now.saturating_sub(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    Json(report(&gw, from, now, q.tenant.as_deref())).into_response()
}

/// The answer: spend per tenant and model from `from_ms` to `now_ms`.
pub fn report(gw: &Gateway, from_ms: u64, now_ms: u64, tenant: Option<&str>) -> Value {
    let cfg = gw.cfg();
    let leader = gw.cluster.as_ref().is_some_and(|c| c.status().is_leader);
    let node = tenants(&gw.spend.since(from_ms, now_ms, tenant));
    let cluster = leader.then(|| tenants(&gw.cluster_spend.since(from_ms, now_ms, tenant)));
    // Shadow copies' spend on this node, per shadow and target model:
    // apart from the tenants' (no budget reads it), so not per tenant.
    let shadows: Vec<Value> = tenants(&gw.shadows.spend.since(from_ms, now_ms, None))
        .into_iter()
        .map(|mut v| {
            if let Some(o) = v.as_object_mut() {
                if let Some(name) = o.remove("tenant") {
                    o.insert("shadow".into(), name);
                }
            }
            v
        })
        .collect();
    let view = gw.view.borrow().clone();
    let budgets: Vec<Value> = cfg
        .tenants
        .iter()
        .zip(&cfg.costs.budgets)
        .filter(|(t, b)| b.is_limited() && tenant.is_none_or(|w| w == &*t.name))
        .map(|(t, b)| {
            let lines = view.budgets.get(&*t.name);
            let periods: Vec<Value> = [
                (zonegate_cluster::budget::Period::Day, b.per_day),
                (zonegate_cluster::budget::Period::Month, b.per_month),
            ]
            .into_iter()
            .filter_map(|(p, limit)| {
                let limit = limit?;
                let line = lines.and_then(|l| l.get(&p));
                Some(json!({
                    "period": p.name(),
                    "limit": units(limit),
                    "granted": line.map(|l| units(l.granted())),
                    "recorded_spent": line.map(|l| units(l.spent())),
                    "ends_ms": line.map(|l| p.end_ms(l.period)),
                }))
            })
            .collect();
            json!({
                "tenant": &*t.name,
                "on_budget": match b.on_budget {
                    crate::config::cost::OnBudget::Reject => "reject",
                    crate::config::cost::OnBudget::Cheapest => "cheapest",
                },
                "periods": periods,
            })
        })
        .collect();
    json!({
        "node": cfg.node.id,
        "zone": cfg.node.zone.as_str(),
        "currency": &*cfg.costs.currency,
        "since_ms": from_ms,
        "until_ms": now_ms,
        "leader": leader,
        "node_spend": node,
        "cluster_spend": cluster,
        "shadow_spend": shadows,
        "budgets": budgets,
    })
}

/// Lines grouped per tenant: its total and each model's spend.
fn tenants(lines: &[Line]) -> Vec<Value> {
    let mut by: BTreeMap<&str, Vec<&Line>> = BTreeMap::new();
    for l in lines {
        by.entry(&l.tenant).or_default().push(l);
    }
    by.into_iter()
        .map(|(t, ls)| {
            let total = ls.iter().fold(0u64, |a, l| a.saturating_add(l.nanos));
            json!({
                "tenant": t,
                "spend": units(total),
                "models": ls
                    .iter()
                    .map(|l| json!({"model": l.model, "spend": units(l.nanos)}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect()
}
