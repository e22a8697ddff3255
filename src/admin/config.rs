//! `GET|POST /admin/v1/config`: the replicated routing config, its
//! versions, and changes to it. A change is validated on the leader with
//! the validation of a start (file, key and reason), checked against the
//! config safety rules, and committed as the next config version; a
//! follower forwards it first, so the leader's validation is the one that
//! counts. Before any rule is checked the leader builds what every node
//! will build from it (route tables, rings, quota stage) within the cost
//! cap, off the runtime: a config no node could carry is refused (rule
//! `too_costly`, or `build_failed`), dry run or not, `--force` or not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::json;
use zonegate_cluster::command::MAX_CONFIG_BYTES;
use zonegate_cluster::{config_digest, ClusterView, Decision, ZoneId};

use super::cluster::{decide, forward_write, AdminError, Identity, Write, FORWARDED};
use crate::config::{replicated, Config};
use crate::dataplane::routing::Routes;
use crate::node::gateway::Gateway;
use crate::telemetry::Metrics;

#[derive(Deserialize, Default)]
pub struct ConfigQuery {
    version: Option<u64>,
}

/// What a viewer sees in place of a tenant's API-key digest.
pub const REDACTED: &str = "(redacted: operators only)";

/// `toml` with every tenant's `key_sha256` digests replaced by
/// [`REDACTED`]. The digests are unsalted SHA-256: whoever reads one can
/// test guesses of a weak key offline, so only operators see them.
pub fn redact_digests(toml: &str) -> String {
    let Ok(mut t) = toml.parse::<toml::Table>() else {
        return format!("# {REDACTED}: the config is not readable as TOML\n");
    };
    let redacted = || toml::Value::String(REDACTED.into());
    if let Some(toml::Value::Array(tenants)) = t.get_mut("tenants") {
        for tenant in tenants.iter_mut().filter_map(toml::Value::as_table_mut) {
            if let Some(keys) = tenant.get_mut("key_sha256") {
                *keys = match keys {
                    toml::Value::Array(list) => {
                        toml::Value::Array(list.iter().map(|_| redacted()).collect())
                    }
                    _ => redacted(),
                };
            }
        }
    }
    toml::to_string(&t).unwrap_or_else(|_| format!("# {REDACTED}\n"))
}

/// `GET /admin/v1/config[?version=V]`: the replicated sections in effect
/// (or of a kept version), and the kept versions. Viewers get the tenants'
/// key digests redacted, and each version's digest taken over the redacted
/// text (the digest of the full text would let them test key guesses too).
pub async fn show(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Identity>,
    Query(q): Query<ConfigQuery>,
) -> Response {
    let operator = who.role == crate::config::Role::Operator;
    let shown = |toml: &str| {
        if operator {
            toml.to_owned()
        } else {
            redact_digests(toml)
        }
    };
    let cfg = gw.cfg_arc();
    let history: Vec<_> = gw
        .cluster
        .as_ref()
        .map(|n| n.state_snapshot().configs())
        .unwrap_or_default();
    let toml = match q.version {
        None => shown(cfg.replicated_toml()),
        Some(v) => match history.iter().find(|c| c.version == v) {
            Some(c) => shown(&c.toml),
            None => {
                return AdminError::BadRequest(format!(
                    "config version {v} is not kept (the last {} are)",
                    zonegate_cluster::CONFIG_HISTORY_LIMIT
                ))
                .into_response()
            }
        },
    };
    Json(json!({
        "config_version": gw.view.borrow().config_version(),
        "routing_with": cfg.config_version,
        "version": q.version.unwrap_or(cfg.config_version),
        "toml": toml,
        "history": history.iter().map(|c| json!({
            "version": c.version,
            "actor": c.actor,
            "reason": c.reason,
            "at_ms": c.at_ms,
            "digest": config_digest(&shown(&c.toml)),
            "bytes": c.toml.len(),
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// The body of `POST /admin/v1/config`: JSON, or the TOML itself.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ApplyBody {
    toml: Option<String>,
    /// Commit a copy of kept version V as the next version.
    rollback_to: Option<u64>,
    /// Compare-and-set on the config version.
    if_version: Option<u64>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    force: bool,
    reason: Option<String>,
}

/// One safety rule a config would trip.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct Tripped {
    pub rule: &'static str,
    pub message: String,
}

/// What a config would change: backends added and removed per zone and
/// model, and the safety rules it trips.
#[derive(Serialize, Debug, Default)]
pub struct Plan {
    pub added: BTreeMap<String, Vec<String>>,
    pub removed: BTreeMap<String, Vec<String>>,
    pub sections: Vec<String>,
    pub rules: Vec<Tripped>,
    /// Tenants whose reachable backends shrink, by the backends they lose.
    pub tenants_shrunk: BTreeMap<String, Vec<String>>,
}

/// Pure: the changes from `old` to `new` and the rules they trip, given
/// the zones that serve (`view`) and the tenants with traffic in the last
/// hour.
pub fn plan(old: &Config, new: &Config, view: &ClusterView, recent: &BTreeSet<String>) -> Plan {
    let key = |zone: &ZoneId, model: &str| format!("{zone}/{model}");
    let pairs = |c: &Config| -> BTreeSet<(String, String)> {
        c.backends
            .iter()
            .flat_map(|b| b.models.iter().map(|m| (key(&b.zone, m), b.name.clone())))
            .collect()
    };
    let (before, after) = (pairs(old), pairs(new));
    let mut p = Plan {
        sections: replicated::differing(old.replicated_toml(), new.replicated_toml()),
        ..Plan::default()
    };
    for (k, b) in after.difference(&before) {
        p.added.entry(k.clone()).or_default().push(b.clone());
    }
    for (k, b) in before.difference(&after) {
        p.removed.entry(k.clone()).or_default().push(b.clone());
    }
    let serving = |z: &ZoneId| {
        view.zones
            .get(z)
            .is_none_or(|s| matches!(s, zonegate_cluster::ZoneStatus::Active))
    };
    for m in &new.models {
        let served = new
            .backends
            .iter()
            .any(|b| b.models.contains(&m.name) && serving(&b.zone));
        if !served {
            p.rules.push(Tripped {
                rule: "model_without_backend",
                message: format!("model {} would have no backend in a serving zone", m.name),
            });
        }
    }
    let zones =
        |c: &Config| -> BTreeSet<ZoneId> { c.backends.iter().map(|b| b.zone.clone()).collect() };
    for z in zones(old).difference(&zones(new)) {
        if serving(z) {
            p.rules.push(Tripped {
                rule: "zone_emptied",
                message: format!("every backend of active zone {z} would be removed"),
            });
        }
    }
    let (tripped, shrunk) = super::policy::plan(old, new, &serving);
    p.rules.extend(tripped);
    p.tenants_shrunk = shrunk;
    for t in old.tenants.iter().filter(|t| recent.contains(&*t.name)) {
        let kept = new
            .tenants
            .iter()
            .find(|n| n.name == t.name)
            .is_some_and(|n| n.key_hashes.iter().any(|h| t.key_hashes.contains(h)));
        if !kept {
            p.rules.push(Tripped {
                rule: "tenant_keys_removed",
                message: format!(
                    "tenant {} had traffic in the last hour and would keep none of its keys",
                    t.name
                ),
            });
        }
    }
    p
}

/// `POST /admin/v1/config`.
pub async fn apply(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Identity>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match apply_inner(&gw, &who, &uri, &headers, &body).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(target: "zonegate::audit", token = %who.name, kind = "config", error = %e, "config not committed");
            e.into_response()
        }
    }
}

async fn apply_inner(
    gw: &Gateway,
    who: &Identity,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, AdminError> {
    let node = gw.cluster.as_deref().ok_or_else(|| {
        AdminError::BadRequest(
            "this node runs standalone: edit its file and send it SIGHUP to reload".into(),
        )
    })?;
    // The leader validates: a follower hands the request on unread.
    let status = node.status();
    if !status.is_leader && !headers.contains_key(FORWARDED) {
        if let (Some(leader), Some(addr)) = (status.leader, status.leader_admin_addr.clone()) {
            let check = gw.view.borrow().decision_version + 1;
            return forward_write(gw, node, &addr, leader, check, headers, uri, body).await;
        }
        return Err(AdminError::NoLeader(
            "no leader with a quorum right now; nothing was written; retry shortly".into(),
        ));
    }
    if body.len() > MAX_CONFIG_BYTES + 64 * 1024 {
        return Err(AdminError::BadRequest(format!(
            "the config is larger than {MAX_CONFIG_BYTES} bytes"
        )));
    }
    let req = parse(headers, body)?;
    let state = node.state_snapshot();
    let current = state.config_version();
    if let Some(v) = req.if_version.filter(|v| *v != current) {
        return Err(AdminError::Rejected {
            rule: "stale_version",
            message: format!("made against config version {v}, but the cluster is at {current}"),
        });
    }
    let toml = match (req.toml, req.rollback_to) {
        (Some(t), None) => t,
        (None, Some(v)) => state
            .configs()
            .into_iter()
            .find(|c| c.version == v)
            .map(|c| c.toml.to_string())
            .ok_or_else(|| {
                AdminError::BadRequest(format!(
                    "config version {v} is not kept; see `ctl config history`"
                ))
            })?,
        _ => {
            return Err(AdminError::BadRequest(
                "send either the config (TOML, or JSON with `toml`) or `rollback_to`".into(),
            ))
        }
    };
    if toml.len() > MAX_CONFIG_BYTES {
        return Err(AdminError::BadRequest(format!(
            "the config is {} bytes; at most {MAX_CONFIG_BYTES} are allowed",
            toml.len()
        )));
    }
    let next = current + 1;
    let base = gw.cfg_arc();
    let new = build(gw, Arc::clone(&base), toml.clone(), next).await?;
    let recent: BTreeSet<String> = node
        .tenants_seen_since(crate::clock::unix_ms().saturating_sub(3_600_000))
        .into_iter()
        .collect();
    let plan = plan(&base, &new, &gw.view.borrow(), &recent);
    if req.dry_run {
        return Ok(Json(json!({
            "dry_run": true,
            "would_apply": plan.rules.is_empty() || req.force,
            "config_version": next,
            "plan": plan,
        }))
        .into_response());
    }
    if !plan.rules.is_empty() && !req.force {
        let names: Vec<&str> = plan.rules.iter().map(|r| r.rule).collect();
        return Err(AdminError::Rejected {
            rule: plan.rules[0].rule,
            message: format!(
                "{} (rules: {}; --force overrides)",
                plan.rules
                    .iter()
                    .map(|r| r.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
                names.join(", ")
            ),
        });
    }
    let reason = req.reason.unwrap_or_else(|| match req.rollback_to {
        Some(v) => format!("rollback to config version {v}"),
        None => "operator request".into(),
    });
    let write = Write {
        decision: Decision::Config {
            config_version: next,
            toml: toml.into(),
        },
        reason: Some(reason),
        if_version: None,
        dry_run: false,
    };
    decide(gw, who, headers, uri, body, write).await
}

/// One dry build at a time: each may hold a full route table.
static BUILDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Validates `toml` as config version `next` and builds what every node
/// will build from it, on a blocking thread (validation reads CA files; a
/// build may take a while), within the cost cap. A panic while doing so is
/// caught and refuses the config.
async fn build(
    gw: &Gateway,
    base: Arc<Config>,
    toml: String,
    next: u64,
) -> Result<Config, AdminError> {
    let _one = BUILDS
        .acquire()
        .await
        .map_err(|_| AdminError::Fatal("the config build queue is closed".into()))?;
    let previous = gw.routes.load_full();
    let view = gw.view.borrow().clone();
    let built = tokio::task::spawn_blocking(move || -> Result<Config, AdminError> {
        let new = base
            .with_replicated(&toml, next, "submitted config")
            .map_err(|e| AdminError::InvalidConfig {
                file: e.file,
                key: e.key,
                reason: e.reason,
            })?;
        Routes::try_build(&new, Some(&previous)).map_err(|e| AdminError::Rejected {
            rule: "too_costly",
            message: format!(
                "no node could carry this config: {e} (--force does not override this rule)"
            ),
        })?;
        crate::dataplane::quota::Quotas::new(&new, &view, &Metrics::new());
        Ok(new)
    })
    .await;
    built.unwrap_or_else(|e| {
        Err(AdminError::Rejected {
            rule: "build_failed",
            message: format!("building this config failed on the leader: {e}"),
        })
    })
}

fn parse(headers: &HeaderMap, body: &Bytes) -> Result<ApplyBody, AdminError> {
    let json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json {
        serde_json::from_slice(body)
            .map_err(|e| AdminError::BadRequest(format!("invalid JSON body: {e}")))
    } else {
        let toml = std::str::from_utf8(body)
            .map_err(|_| AdminError::BadRequest("the config is not UTF-8".into()))?;
        Ok(ApplyBody {
            toml: Some(toml.to_owned()),
            ..ApplyBody::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = r#"
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "data"
"#;

    fn tenant(key: &str) -> String {
        format!(
            "\n[[tenants]]\nname = \"deptA\"\nkey_sha256 = \"{}\"\n",
            crate::config::sha256_hex(key)
        )
    }

    fn backend(name: &str, zone: &str, model: &str) -> String {
        format!("\n[[backends]]\nname = \"{name}\"\nzone = \"{zone}\"\nurl = \"http://127.0.0.1:1\"\nmodels = [\"{model}\"]\n")
    }

    fn cfg(parts: &[String]) -> Config {
        Config::parse("t.toml", &format!("{HEAD}{}", parts.concat())).unwrap()
    }

    fn view(failed_over: &[&str]) -> ClusterView {
        let zones = [ZoneId::new("az-a"), ZoneId::new("az-b")];
        let mut v = ClusterView::initial(zones.iter());
        for z in failed_over {
            v.zones.insert(
                ZoneId::new(z),
                zonegate_cluster::ZoneStatus::FailedOver {
                    target: ZoneId::new("az-a"),
                },
            );
        }
        v
    }

    #[test]
    fn viewers_get_every_key_digest_redacted() {
        let text = format!(
            "{}\n[[tenants]]\nname = \"two\"\nkey_sha256 = [\"{}\", \"{}\"]\n{}",
            tenant("k1"),
            crate::config::sha256_hex("k2"),
            crate::config::sha256_hex("k3"),
            backend("a1", "az-a", "m")
        );
        let redacted = redact_digests(&text);
        for k in ["k1", "k2", "k3"] {
            assert!(
                !redacted.contains(&crate::config::sha256_hex(k)),
                "{redacted}"
            );
        }
        let t: toml::Table = redacted.parse().unwrap();
        let tenants = t["tenants"].as_array().unwrap();
        assert_eq!(tenants[0]["key_sha256"].as_str(), Some(REDACTED));
        assert_eq!(tenants[1]["key_sha256"].as_array().unwrap().len(), 2);
        assert_eq!(tenants[1]["name"].as_str(), Some("two"));
        assert_eq!(t["backends"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_config_rules_table() {
        let old = cfg(&[
            tenant("k1"),
            backend("a1", "az-a", "m"),
            backend("b1", "az-b", "m"),
            backend("b2", "az-b", "x"),
        ]);
        let recent: BTreeSet<String> = ["deptA".to_owned()].into();
        let none = BTreeSet::new();
        // (name, new config, failed-over zones, recent tenants, rules tripped)
        type Case<'a> = (
            &'a str,
            Config,
            &'a [&'a str],
            &'a BTreeSet<String>,
            Vec<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "one backend more",
                cfg(&[
                    tenant("k1"),
                    backend("a1", "az-a", "m"),
                    backend("b1", "az-b", "m"),
                    backend("b2", "az-b", "x"),
                    backend("a2", "az-a", "m"),
                ]),
                &[],
                &recent,
                vec![],
            ),
            (
                "az-b emptied",
                cfg(&[
                    tenant("k1"),
                    backend("a1", "az-a", "m"),
                    backend("a2", "az-a", "x"),
                ]),
                &[],
                &recent,
                vec!["zone_emptied"],
            ),
            (
                "az-b emptied while failed over",
                cfg(&[
                    tenant("k1"),
                    backend("a1", "az-a", "m"),
                    backend("a2", "az-a", "x"),
                ]),
                &["az-b"],
                &recent,
                vec![],
            ),
            (
                "x only in a failed-over zone",
                old.clone(),
                &["az-b"],
                &recent,
                vec!["model_without_backend"],
            ),
            (
                "keys rotated away with traffic",
                cfg(&[
                    tenant("k2"),
                    backend("a1", "az-a", "m"),
                    backend("b1", "az-b", "m"),
                    backend("b2", "az-b", "x"),
                ]),
                &[],
                &recent,
                vec!["tenant_keys_removed"],
            ),
            (
                "keys rotated away, no traffic",
                cfg(&[
                    tenant("k2"),
                    backend("a1", "az-a", "m"),
                    backend("b1", "az-b", "m"),
                    backend("b2", "az-b", "x"),
                ]),
                &[],
                &none,
                vec![],
            ),
        ];
        for (name, new, failed, recent, want) in cases {
            let p = plan(&old, &new, &view(failed), recent);
            let got: Vec<&str> = p.rules.iter().map(|r| r.rule).collect();
            assert_eq!(got, want, "{name}: {p:?}");
        }
        let p = plan(
            &old,
            &cfg(&[
                tenant("k1"),
                backend("a1", "az-a", "m"),
                backend("b2", "az-b", "x"),
            ]),
            &view(&[]),
            &none,
        );
        assert_eq!(p.removed.get("az-b/m"), Some(&vec!["b1".to_owned()]));
        assert_eq!(p.sections, vec!["backends".to_owned()]);
    }
}
