//! Traffic policy in the admin API: `GET /admin/v1/rules` (each rule's
//! configured share against the share it took on this node, and each
//! tenant's allowed models and tags), `GET /admin/v1/shadows[/{name}]`
//! (copies, agreement, latency and similarity distributions, the last
//! disagreements), the rule `explain` shows, and the config plan's policy
//! rules (`tenant_without_backend`, tenants whose reachable backends
//! shrink).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Value};

use crate::config::policy::Rule;
use crate::config::Config;
use crate::dataplane::error::error_body;
use crate::dataplane::policy::{eligible, rules};
use crate::node::gateway::Gateway;

fn share(e: u64, m: u64) -> Option<f64> {
    (e > 0).then(|| (m as f64 * 100.0 / e as f64 * 100.0).round() / 100.0)
}

/// The requests that met a rule's match and those it took under this
/// config version, and the share in percent.
fn realised(rule: &Rule) -> (u64, u64, Option<f64>) {
    use std::sync::atomic::Ordering::Relaxed;
    let (e, m) = (
        rule.counts.evaluated.load(Relaxed),
        rule.counts.matched.load(Relaxed),
    );
    (e, m, share(e, m))
}

/// `GET /admin/v1/rules`.
pub async fn rules(State(gw): State<Arc<Gateway>>) -> Response {
    let cfg = gw.cfg_arc();
    let list: Vec<Value> = cfg
        .policy
        .rules
        .iter()
        .map(|r| {
            let (evaluated, matched, now) = realised(r);
            let h = rules::handles(r, &gw.metrics);
            let (e, m) = (h.evaluated.get(), h.matched.get());
            json!({
                "name": r.name,
                "model": r.model,
                "match": {
                    "tenants": r.tenants,
                    "headers": r.headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.clone())).collect::<BTreeMap<_, _>>(),
                },
                "percent": r.percent,
                "route_to": r.route_to,
                "evaluated": evaluated,
                "matched": matched,
                "realised_percent": now,
                "since_start": {"evaluated": e, "matched": m, "realised_percent": share(e, m)},
            })
        })
        .collect();
    Json(json!({
        "node": cfg.node.id,
        "config_version": cfg.config_version,
        "rules": list,
        "tenants": tenants(&cfg),
        "note": "evaluated, matched and realised_percent count this node's requests under this config version (since_start: since the node started); sum zonegate_rule_*_total across nodes for the cluster",
    }))
    .into_response()
}

/// Each tenant's allowed models and required tags, with the backends of
/// each model it can reach.
fn tenants(cfg: &Config) -> Vec<Value> {
    cfg.tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = cfg.policy.tenants.get(i);
            let reach: BTreeMap<&str, Vec<&str>> = cfg
                .models
                .iter()
                .map(|m| (m.name.as_str(), eligible::reachable(cfg, i, &m.name)))
                .filter(|(_, b)| !b.is_empty())
                .collect();
            json!({
                "name": t.name,
                "models": p.and_then(|p| p.models.clone()),
                "require_tags": p.map(|p| p.require_tags.clone()).unwrap_or_default(),
                "reachable": reach,
            })
        })
        .collect()
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(i).map(|v| (v * 1000.0).round() / 1000.0)
}

fn distribution(samples: impl Iterator<Item = f64>) -> Value {
    let mut v: Vec<f64> = samples.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    json!({
        "samples": v.len(),
        "p50": quantile(&v, 0.5),
        "p90": quantile(&v, 0.9),
        "p99": quantile(&v, 0.99),
        "min": v.first(),
        "max": v.last(),
    })
}

fn summary(cfg: &Config, gw: &Gateway, s: &crate::config::policy::Shadow, detail: bool) -> Value {
    let state = gw.shadows.get(&s.name);
    let r = state.as_ref().map(|st| st.record()).unwrap_or_default();
    let mut v = json!({
        "name": s.name,
        "model": s.model,
        "to": s.to,
        "percent": s.percent,
        "max_in_flight": s.max_in_flight,
        "count_quota": s.count_quota,
        "timeout_ms": s.timeout.as_millis() as u64,
        "in_flight": state.as_ref().map_or(0, |st| st.in_flight()),
        "sampled": r.sampled,
        "sent": r.sent,
        "skipped_in_flight": r.skipped_in_flight,
        "skipped_quota": r.skipped_quota,
        "no_backend": r.no_backend,
        "ok": r.ok,
        "errors": r.errors,
        "timeouts": r.timeouts,
        "compared": r.compared,
        "agreed": r.agreed,
        "disagreed": r.disagreed,
        "agreement": (r.compared > 0).then(|| (r.agreed as f64 / r.compared as f64 * 1000.0).round() / 1000.0),
        "latency_delta_s": distribution(r.latency_delta_s.iter().copied()),
        "similarity": distribution(r.similarity.iter().copied()),
        // What the copies cost since this node started, apart from any
        // tenant's spend and budget.
        "spend": crate::dataplane::cost::units(r.spend_nanos),
        "currency": &*cfg.costs.currency,
    });
    if detail {
        v["disagreements"] = json!(r.disagreements.iter().rev().collect::<Vec<_>>());
        v["node"] = json!(cfg.node.id);
    }
    v
}

/// `GET /admin/v1/shadows`.
pub async fn shadows(State(gw): State<Arc<Gateway>>) -> Response {
    let cfg = gw.cfg_arc();
    let list: Vec<Value> = cfg
        .policy
        .shadows
        .iter()
        .map(|s| summary(&cfg, &gw, s, false))
        .collect();
    Json(json!({"node": cfg.node.id, "config_version": cfg.config_version, "shadows": list}))
        .into_response()
}

/// `GET /admin/v1/shadows/{name}`: one shadow with its last
/// disagreements (newest first, at most `shadow::RING`).
pub async fn shadow(State(gw): State<Arc<Gateway>>, Path(name): Path<String>) -> Response {
    let cfg = gw.cfg_arc();
    match cfg.policy.shadows.iter().find(|s| *s.name == *name) {
        Some(s) => Json(summary(&cfg, &gw, s, true)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(error_body(
                &format!(
                    "no shadow named `{name}` in config version {}",
                    cfg.config_version
                ),
                "invalid_request_error",
                "shadow_not_found",
            )),
        )
            .into_response(),
    }
    .into_response()
}

/// The rule a request of `tenant` for `model` would match (`user`: its
/// session or `user`; `header`: `name:value`), for `explain`. Counts
/// nothing.
pub fn explain_rule(
    cfg: &Config,
    tenant: Option<&str>,
    user: Option<&str>,
    header: Option<&str>,
    model: &str,
) -> Value {
    let Some(tenant) = tenant else {
        return json!({"note": "name a tenant (and a user) to see the rule a request would match"});
    };
    let Some(index) = cfg.tenants.iter().position(|t| &*t.name == tenant) else {
        return json!({"error": format!("no tenant `{tenant}`")});
    };
    if !eligible::allows_model(cfg, index, model) {
        return json!({"allowed": false, "note": format!("tenant `{tenant}` may not use `{model}`: 404 model_not_found")});
    }
    let (hname, hvalue) = header
        .and_then(|h| h.split_once(':'))
        .map_or((None, ""), |(k, v)| {
            (
                http::HeaderName::from_bytes(k.trim().as_bytes()).ok(),
                v.trim(),
            )
        });
    let user_hash = match user {
        Some(u) => rules::user_hash(tenant, u.as_bytes()),
        None => fastrand::u64(..),
    };
    let none = Vec::new();
    let candidates = cfg.policy.rules_by_model.get(model).unwrap_or(&none);
    let rule = rules::evaluate(
        &cfg.policy.rules,
        candidates,
        tenant,
        |n| (Some(n) == hname.as_ref()).then_some(hvalue.as_bytes()),
        user_hash,
        |m| eligible::allows_model(cfg, index, m),
        |_, _| {},
    );
    json!({
        "allowed": true,
        "rule": rule.map(|r| &*r.name),
        "route_to": rule.map(|r| r.route_to.as_str()),
        "rules_for_model": candidates.len(),
        "note": if user.is_some() { "the user's share is decided by a stable hash of tenant and user" } else { "no user given: a random draw decides the share" },
    })
}

/// The backends each tenant could reach through any model, in serving
/// zones.
fn reach(
    cfg: &Config,
    serving: &dyn Fn(&zonegate_cluster::ZoneId) -> bool,
) -> BTreeMap<String, BTreeSet<String>> {
    cfg.tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let set = cfg
                .models
                .iter()
                .flat_map(|m| eligible::reachable(cfg, i, &m.name))
                .filter(|b| {
                    cfg.backends
                        .iter()
                        .any(|c| c.name == *b && serving(&c.zone))
                })
                .map(str::to_owned)
                .collect();
            (t.name.to_string(), set)
        })
        .collect()
}

/// The config plan's policy rules: `tenant_without_backend` for a tenant
/// whose `models` or `require_tags` leave it no backend in a serving zone
/// (while some backend serves), and the tenants whose reachable backends
/// shrink (`old` → `new`), by the backends they lose.
pub fn plan(
    old: &Config,
    new: &Config,
    serving: &dyn Fn(&zonegate_cluster::ZoneId) -> bool,
) -> (Vec<super::config::Tripped>, BTreeMap<String, Vec<String>>) {
    let (before, after) = (reach(old, serving), reach(new, serving));
    let any = new.backends.iter().any(|b| serving(&b.zone));
    let mut tripped = Vec::new();
    for (i, t) in new.tenants.iter().enumerate() {
        let restricted = new
            .policy
            .tenants
            .get(i)
            .is_some_and(|p| p.models.is_some() || !p.require_tags.is_empty());
        if restricted && any && after.get(&*t.name).is_none_or(BTreeSet::is_empty) {
            tripped.push(super::config::Tripped {
                rule: "tenant_without_backend",
                message: format!(
                    "tenant {} would reach no backend in a serving zone with its models and require_tags",
                    t.name
                ),
            });
        }
    }
    let shrunk = before
        .iter()
        .filter_map(|(t, had)| {
            let now = after.get(t)?;
            let lost: Vec<String> = had.difference(now).cloned().collect();
            (!lost.is_empty()).then(|| (t.clone(), lost))
        })
        .collect();
    (tripped, shrunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;

    fn with(tenant: &str, tags: &str) -> Config {
        let text = MINIMAL
            .replace("priority = \"P0\"", &format!("priority = \"P0\"\n{tenant}"))
            .replace(
                "models = [\"qwen25-7b-instruct\"]",
                &format!("models = [\"qwen25-7b-instruct\"]\n{tags}"),
            );
        Config::parse("t", &text).unwrap()
    }

    #[test]
    fn a_tenant_left_without_backends_trips_the_rule_and_shrinks() {
        let all = |_: &zonegate_cluster::ZoneId| true;
        let old = with("require_tags = [\"private\"]", "tags = [\"private\"]");
        let new = with("require_tags = [\"private\"]", "");
        let (tripped, shrunk) = plan(&old, &new, &all);
        assert_eq!(tripped.len(), 1);
        assert_eq!(tripped[0].rule, "tenant_without_backend");
        assert_eq!(shrunk["deptA"], vec!["qwen-a1".to_owned()]);
        let (tripped, shrunk) = plan(&old, &old, &all);
        assert!(tripped.is_empty() && shrunk.is_empty());
        // Allowed models alone can leave a tenant nothing, too.
        let new = with("models = [\"other-*\"]", "");
        assert_eq!(plan(&old, &new, &all).0[0].rule, "tenant_without_backend");
        // An unrestricted tenant never trips it (model_without_backend does).
        let none = |_: &zonegate_cluster::ZoneId| false;
        assert!(plan(&old, &with("", ""), &none).0.is_empty());
    }

    #[test]
    fn explain_names_the_rule_a_user_would_match() {
        let text = format!(
            "{}\n[[rules]]\nname = \"all\"\nmodel = \"qwen25-7b-instruct\"\nmatch = {{ headers = {{ \"x-canary\" = \"1\" }} }}\nroute_to = \"b\"\n",
            MINIMAL.replace("models = [\"qwen25-7b-instruct\"]", "models = [\"qwen25-7b-instruct\", \"b\"]")
        );
        let cfg = Config::parse("t", &text).unwrap();
        let v = explain_rule(
            &cfg,
            Some("deptA"),
            Some("u1"),
            Some("x-canary: 1"),
            "qwen25-7b-instruct",
        );
        assert_eq!(v["rule"], "all");
        assert_eq!(v["route_to"], "b");
        let v = explain_rule(&cfg, Some("deptA"), Some("u1"), None, "qwen25-7b-instruct");
        assert_eq!(v["rule"], Value::Null);
    }
}
