//! The control plane's admin endpoints: cluster status, decision history,
//! and the operators' writes (failover, failback, freeze, unfreeze). A write
//! sent to a follower is forwarded to the leader; every committed write is
//! audited (token name, reason, resulting version).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use http::{header, HeaderMap, StatusCode, Uri};
use serde::Deserialize;
use serde_json::{json, Value};
use zonegate_cluster::{ClusterNode, Command, Decision, ProposeError, ZoneId};

use crate::dataplane::error::error_body;
use crate::node::gateway::Gateway;

/// The admin token that authorised a request (set by the auth layer).
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: String,
    pub role: crate::config::Role,
}

/// Header a forwarded write carries, so it is never forwarded twice.
pub(crate) const FORWARDED: &str = "x-zonegate-forwarded-by";

/// How long a follower waits for the leader's answer to a forwarded write:
/// past the leader's own propose timeout (5 s), so the leader's answer
/// (applied, refused or its own "outcome unknown") normally arrives first.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an admin request was refused or a write did not (knowingly)
/// commit; rendered once, in OpenAI's error shape.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    BadRequest(String),
    #[error("token `{0}` is a viewer and may not change anything")]
    Forbidden(String),
    #[error(
        "this node runs standalone (no [[cluster.members]]): there is no control plane to decide"
    )]
    NoControlPlane,
    #[error("{0}")]
    NoLeader(String),
    #[error("refused by rule {rule}: {message}")]
    Rejected { rule: &'static str, message: String },
    /// The write may have committed: never "failed". `check_version` is
    /// the decision version it takes if it committed (or a later one with
    /// its reason): look for it in the history before retrying.
    #[error("outcome unknown: {message}; check `zonegate ctl decisions` (GET /admin/v1/decisions) for version {check_version} or later before retrying")]
    OutcomeUnknown { message: String, check_version: u64 },
    /// A membership change whose commit could not be confirmed.
    #[error("outcome unknown: {0}; check `zonegate ctl members` (GET /admin/v1/members) before retrying")]
    MembershipUnknown(String),
    #[error("the leader could not be reached: {0}")]
    LeaderUnreachable(String),
    #[error("control plane failed: {0}")]
    Fatal(String),
    /// A submitted config that does not validate.
    #[error("{file}: {key}: {reason}")]
    InvalidConfig {
        file: String,
        key: String,
        reason: String,
    },
}

impl AdminError {
    fn status(&self) -> StatusCode {
        match self {
            AdminError::BadRequest(_) | AdminError::InvalidConfig { .. } => StatusCode::BAD_REQUEST,
            AdminError::Forbidden(_) => StatusCode::FORBIDDEN,
            AdminError::NoControlPlane | AdminError::NoLeader(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Rejected { .. } => StatusCode::CONFLICT,
            AdminError::OutcomeUnknown { .. } | AdminError::MembershipUnknown(_) => {
                StatusCode::GATEWAY_TIMEOUT
            }
            AdminError::LeaderUnreachable(_) => StatusCode::BAD_GATEWAY,
            AdminError::Fatal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `code`; for a refusal, the safety rule's name.
    fn code(&self) -> &'static str {
        match self {
            AdminError::BadRequest(_) => "invalid_request",
            AdminError::InvalidConfig { .. } => "invalid_config",
            AdminError::Forbidden(_) => "forbidden",
            AdminError::NoControlPlane => "no_control_plane",
            AdminError::NoLeader(_) => "no_leader",
            AdminError::Rejected { rule, .. } => rule,
            AdminError::OutcomeUnknown { .. } | AdminError::MembershipUnknown(_) => {
                "outcome_unknown"
            }
            AdminError::LeaderUnreachable(_) => "leader_unreachable",
            AdminError::Fatal(_) => "internal_error",
        }
    }

    /// The `outcome` label of `zonegate_decisions_total`.
    fn outcome(&self) -> &'static str {
        match self {
            AdminError::Rejected { .. } => "rejected",
            AdminError::OutcomeUnknown { .. } | AdminError::MembershipUnknown(_) => "unknown",
            AdminError::BadRequest(_) | AdminError::InvalidConfig { .. } => "invalid",
            _ => "failed",
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let kind = match self {
            AdminError::BadRequest(_) | AdminError::InvalidConfig { .. } => "invalid_request_error",
            AdminError::Forbidden(_) => "permission_error",
            AdminError::Rejected { .. } => "decision_rejected",
            _ => "server_error",
        };
        let mut body = error_body(&self.to_string(), kind, self.code());
        if let AdminError::OutcomeUnknown { check_version, .. } = &self {
            body["error"]["check_version"] = json!(check_version);
        }
        if let AdminError::InvalidConfig { file, key, reason } = &self {
            body["error"]["file"] = json!(file);
            body["error"]["key"] = json!(key);
            body["error"]["reason"] = json!(reason);
        }
        (self.status(), Json(body)).into_response()
    }
}

pub(crate) fn http() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_default()
    })
}

/// The client and base URL for member `peer`'s admin API at `addr`: plain
/// HTTP; or, with `[admin.tls]`, HTTPS: under `[cluster.tls]` presenting
/// this member's certificate and accepting only the peer's
/// (`node-<id>.zonegate`, whatever address was dialled), else trusting the
/// system's roots for the address's name.
pub(crate) fn peer_admin(
    cfg: &crate::config::Config,
    peer: u64,
    addr: &str,
) -> Result<(reqwest::Client, String), AdminError> {
    if cfg.admin.tls.is_none() {
        return Ok((http().clone(), format!("http://{addr}")));
    }
    let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(1));
    let builder = match &cfg.cluster.tls {
        Some(files) => {
            let member = zonegate_net::tls::MemberTls {
                files: files.clone(),
            };
            let config = member
                .client_for(peer)
                .map_err(|e| AdminError::Fatal(format!("cluster.tls: {e}")))?;
            builder.use_preconfigured_tls(config)
        }
        None => builder,
    };
    let client = builder
        .build()
        .map_err(|e| AdminError::Fatal(format!("admin client: {e}")))?;
    Ok((client, format!("https://{addr}")))
}

/// Control-plane metrics read at scrape time (called by `/metrics`): the
/// counters kept by the cluster crate are carried over into their
/// Prometheus counters.
pub fn scrape(gw: &Gateway, node: &ClusterNode) {
    let m = &gw.metrics;
    m.cluster_view_age
        .set(node.view_age().map_or(-1.0, |a| a.as_secs_f64()));
    m.cluster_leader_contact
        .set(i64::from(node.leader_contact()));
    for (reason, n) in zonegate_cluster::network::refusals() {
        let c = gw.metrics.raft_rpc_refused.with_label_values(&[reason]);
        c.inc_by(n.saturating_sub(c.get()));
    }
    let fatal = node.fatal().borrow().as_ref().map(|f| f.reason);
    for reason in zonegate_cluster::FATAL_REASONS {
        m.cluster_fatal
            .with_label_values(&[reason])
            .set(i64::from(fatal == Some(reason)));
    }
    if let Ok(free) = zonegate_cluster::store::free_bytes(&gw.cfg().node.data_dir) {
        m.data_dir_free_bytes
            .set(i64::try_from(free).unwrap_or(i64::MAX));
    }
}

#[derive(Deserialize, Default)]
pub struct ClusterQuery {
    /// `local`: this node only, without asking its peers.
    scope: Option<String>,
}

/// `GET /admin/v1/cluster`: this node's view, and each member's decision
/// version and reachability (asked over their admin APIs with the caller's
/// token, 1 s each, in parallel).
pub async fn cluster(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<ClusterQuery>,
    headers: HeaderMap,
) -> Json<Value> {
    let view = gw.view.borrow().clone();
    let zones: serde_json::Map<String, Value> = view
        .zones
        .iter()
        .map(|(z, s)| (z.to_string(), serde_json::to_value(s).unwrap_or_default()))
        .collect();
    let Some(node) = &gw.cluster else {
        return Json(json!({
            "node_id": gw.cfg().node.id,
            "zone": gw.cfg().node.zone,
            "control_plane": "standalone",
            "leader": null,
            "term": 0,
            "decision_version": view.decision_version,
            "config_version": gw.cfg().config_version,
            "automation": view.automation,
            "zones": zones,
            "nodes": [],
        }));
    };
    let status = node.status();
    // Zone scores: the leader's own assessment, or the leader's as last
    // returned to this node's report (about a period old).
    let failover = node.failover_status();
    let mut zones = zones;
    for h in &failover.zones {
        if let Some(Value::Object(z)) = zones.get_mut(h.zone.as_str()) {
            z.insert("score".into(), json!(h.score));
            z.insert("gw_error_rate".into(), json!(h.gw_error_rate));
            z.insert("timeout_rate".into(), json!(h.timeout_rate));
            z.insert("gpu_health".into(), json!(h.gpu_health));
            z.insert("bad_periods".into(), json!(h.bad_periods));
            z.insert("silent".into(), json!(h.silent));
        }
    }
    let view_age_ms = node.view_age().map(|a| a.as_millis());
    let stale = !node.leader_contact();
    let me = json!({
        "id": status.node_id,
        "zone": status.zone,
        "role": status.role,
        "decision_version": view.decision_version,
        "config_version": gw.cfg().config_version,
        // A committed config this node could not apply (it routes with
        // `kept`); `null` when none.
        "config_failure": gw.config_failure(),
        "reachable": true,
        "leader": status.is_leader,
        "view_age_ms": view_age_ms,
        "stale": stale,
    });
    let nodes =
        if q.scope.as_deref() == Some("local") {
            vec![me]
        } else {
            let auth = headers.get(header::AUTHORIZATION).cloned();
            let peers = status.members.iter().filter(|m| m.member.id != status.node_id).map(|m| {
            let (member, auth) = (m.member.clone(), auth.clone());
            let leader = status.leader == Some(member.id);
            let peer = peer_admin(&gw.cfg(), member.id, &member.admin_addr);
            async move {
                let answer = match peer {
                    Ok((client, base)) => {
                        let mut req = client
                            .get(format!("{base}/admin/v1/cluster?scope=local"))
                            .timeout(Duration::from_secs(1));
                        if let Some(a) = auth {
                            req = req.header(header::AUTHORIZATION, a);
                        }
                        match req.send().await {
                            Ok(r) if r.status().is_success() => r.json::<Value>().await.ok(),
                            _ => None,
                        }
                    }
                    Err(_) => None,
                };
                json!({
                    "id": member.id,
                    "zone": member.zone,
                    "role": member.role,
                    "decision_version": answer.as_ref().map(|a| a["decision_version"].clone()),
                    "config_version": answer.as_ref().map(|a| a["config_version"].clone()),
                    "config_failure": answer.as_ref().map(|a| a["config_failure"].clone()),
                    "reachable": answer.is_some(),
                    "leader": leader,
                    "view_age_ms": answer.as_ref().map(|a| a["view_age_ms"].clone()),
                    "stale": answer.as_ref().map(|a| a["stale"].clone()),
                })
            }
        });
            let mut all = vec![me];
            all.extend(futures_util::future::join_all(peers).await);
            all
        };
    Json(json!({
        "node_id": status.node_id,
        "zone": status.zone,
        "role": status.role,
        "control_plane": "raft",
        "leader": status.leader,
        "is_leader": status.is_leader,
        "term": status.term,
        "millis_since_quorum_ack": status.millis_since_quorum_ack,
        "cluster_id": node.cluster_id(),
        "view_age_ms": view_age_ms,
        "stale": stale,
        "rejoining": node.rejoining(),
        "voters": status.voters,
        // Where this node's [[cluster.members]] differs from the
        // replicated membership (the truth after formation).
        "bootstrap_differs": status.bootstrap_differs,
        "decision_version": view.decision_version,
        "config_version": gw.cfg().config_version,
        "config_failure": gw.config_failure(),
        "automation": view.automation,
        "zones": zones,
        "fail_static": failover.fail_static,
        "nodes": nodes,
    }))
}

#[derive(Deserialize)]
pub struct DecisionsQuery {
    limit: Option<usize>,
    /// Also the quota rebalances (`?all=true`).
    #[serde(default)]
    all: bool,
}

/// `GET /admin/v1/decisions`: the applied zone decisions (failover,
/// failback, freeze, unfreeze), newest first; with `?all=true` the quota
/// rebalances too (their own history), merged by version.
pub async fn decisions(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<DecisionsQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100);
    match &gw.cluster {
        Some(node) if q.all => {
            Json(json!({ "decisions": node.state_snapshot().all_decisions(limit) })).into_response()
        }
        Some(node) => Json(json!({ "decisions": node.decisions(limit) })).into_response(),
        None => Json(json!({ "decisions": [] })).into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverBody {
    from: String,
    to: String,
    reason: Option<String>,
    if_version: Option<u64>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailbackBody {
    zone: String,
    reason: Option<String>,
    if_version: Option<u64>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PlainBody {
    reason: Option<String>,
    if_version: Option<u64>,
    #[serde(default)]
    dry_run: bool,
}

fn parse<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, AdminError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_required(body)
}

fn parse_required<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, AdminError> {
    serde_json::from_slice(body)
        .map_err(|e| AdminError::BadRequest(format!("invalid JSON body: {e}")))
}

/// One operator write, as parsed from its body.
pub(crate) struct Write {
    pub decision: Decision,
    pub reason: Option<String>,
    pub if_version: Option<u64>,
    pub dry_run: bool,
}

/// `POST /admin/v1/{failover,failback,freeze,unfreeze}`.
pub async fn write(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Identity>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let kind = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
    let parsed = match kind.as_str() {
        "failover" => parse_required::<FailoverBody>(&body).map(|b| Write {
            decision: Decision::Failover {
                from: ZoneId::new(&b.from),
                to: ZoneId::new(&b.to),
            },
            reason: b.reason,
            if_version: b.if_version,
            dry_run: b.dry_run,
        }),
        "failback" => parse_required::<FailbackBody>(&body).map(|b| Write {
            decision: Decision::Failback {
                zone: ZoneId::new(&b.zone),
            },
            reason: b.reason,
            if_version: b.if_version,
            dry_run: b.dry_run,
        }),
        "freeze" | "unfreeze" => parse::<PlainBody>(&body).map(|b| Write {
            decision: if kind == "freeze" {
                Decision::Freeze
            } else {
                Decision::Unfreeze
            },
            reason: b.reason,
            if_version: b.if_version,
            dry_run: b.dry_run,
        }),
        other => Err(AdminError::BadRequest(format!(
            "unknown decision `{other}`"
        ))),
    };
    let result = match parsed {
        Ok(w) => decide(&gw, &who, &headers, &uri, &body, w).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(resp) => resp,
        Err(e) => {
            gw.metrics
                .decisions
                .with_label_values(&[&kind, e.outcome()])
                .inc();
            tracing::warn!(target: "zonegate::audit", token = %who.name, kind, error = %e, "decision not committed");
            e.into_response()
        }
    }
}

/// The quota overflows in force if `preview` applied: each tenant with a
/// quota whose allocation in a failed-over zone its target would hold
/// (the receiving zone's limits lifted, the global cap kept), as fields
/// and as its `cross_zone overflow` line. From the tenants' quotas as this
/// node (the leader, which answers dry runs) has them, and its view with
/// the preview's zone changes.
fn quota_overflow(gw: &Gateway, preview: &zonegate_cluster::Preview) -> Vec<Value> {
    let mut zones = gw.view.borrow().zones.clone();
    for c in &preview.changes {
        zones.insert(c.zone.clone(), c.after.clone());
    }
    let tenants: Vec<zonegate_cluster::TenantQuota> = gw
        .quotas
        .load()
        .tenants
        .iter()
        .map(|t| t.quota.clone())
        .collect();
    zonegate_cluster::quota::overflows(&tenants, &zones)
        .iter()
        .map(|o| {
            json!({
                "tenant": o.tenant,
                "from": o.from,
                "to": o.to,
                "priority": o.priority.to_string(),
                "line": o.line(preview.version),
            })
        })
        .collect()
}

/// What the leader answered a write or a dry run.
enum Answer {
    Preview(zonegate_cluster::Preview),
    Applied(zonegate_cluster::Applied),
}

pub(crate) async fn decide(
    gw: &Gateway,
    who: &Identity,
    headers: &HeaderMap,
    uri: &Uri,
    body: &Bytes,
    w: Write,
) -> Result<Response, AdminError> {
    let node: &ClusterNode = gw.cluster.as_deref().ok_or(AdminError::NoControlPlane)?;
    let kind = w.decision.kind();
    let config_version = match &w.decision {
        Decision::Config { config_version, .. } => Some(*config_version),
        _ => None,
    };
    let reason = w.reason.unwrap_or_else(|| "operator request".to_owned());
    let mut cmd = Command::decide(w.decision, format!("token:{}", who.name), reason.clone());
    if let Some(v) = w.if_version {
        cmd = cmd.if_version(v);
    }
    // A dry run is answered by the leader, against everything committed
    // (a linearizable read), never from this node's applied state, which
    // may lag: it is forwarded like a write.
    let answer = if w.dry_run {
        node.preview(&cmd).await.map(Answer::Preview)
    } else {
        node.propose(cmd).await.map(Answer::Applied)
    };
    match answer {
        Ok(Answer::Preview(preview)) => {
            let mut answer = json!({"dry_run": true, "would_apply": true});
            if matches!(kind, "failover" | "failback") {
                answer["quota_overflow"] = json!(quota_overflow(gw, &preview));
            }
            answer["preview"] = json!(preview);
            Ok(Json(answer).into_response())
        }
        Ok(Answer::Applied(applied)) => {
            gw.metrics
                .decisions
                .with_label_values(&[kind, "applied"])
                .inc();
            tracing::info!(
                target: "zonegate::audit",
                token = %who.name,
                kind,
                reason = %reason,
                version = applied.version,
                "decision committed"
            );
            let mut answer = json!({"version": applied.version, "kind": kind, "committed": true, "leader": node.id()});
            if let Some(v) = config_version {
                answer["config_version"] = json!(v);
            }
            Ok(Json(answer).into_response())
        }
        Err(ProposeError::NotLeader { leader, admin_addr }) => match admin_addr {
            Some(addr) if !headers.contains_key(FORWARDED) => {
                gw.metrics
                    .decisions
                    .with_label_values(&[kind, "forwarded"])
                    .inc();
                let check_version = gw.view.borrow().decision_version + 1;
                forward_write(gw, node, &addr, leader, check_version, headers, uri, body).await
            }
            _ => Err(AdminError::NoLeader(format!(
                "node {leader} leads but cannot be reached through this node; nothing was written"
            ))),
        },
        Err(ProposeError::NoLeader) => Err(AdminError::NoLeader(
            "no leader with a quorum right now; nothing was written; retry shortly".into(),
        )),
        Err(ProposeError::Rejected { rule, message }) => Err(AdminError::Rejected {
            rule: rule.name(),
            message,
        }),
        Err(ProposeError::OutcomeUnknown(u)) => Err(AdminError::OutcomeUnknown {
            message: format!(
                "the decision was submitted but {} (after {:?})",
                u.why, u.waited
            ),
            check_version: u.check_version,
        }),
        Err(ProposeError::Fatal(e)) => Err(AdminError::Fatal(e)),
    }
}

/// Sends a write on to the leader's admin API with the caller's token, and
/// relays its answer unchanged. Only a failure to connect means nothing was
/// sent; once the request may have reached the leader, a lost answer (reset,
/// closed connection, timeout) is "outcome unknown", never "failed":
/// the leader may have committed it before it died. `check_version` is
/// this node's applied version + 1, the earliest the write can take.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward_write(
    gw: &Gateway,
    node: &ClusterNode,
    addr: &str,
    leader: u64,
    check_version: u64,
    headers: &HeaderMap,
    uri: &Uri,
    body: &Bytes,
) -> Result<Response, AdminError> {
    let (client, base) = peer_admin(&gw.cfg(), leader, addr)?;
    let req = client
        .post(format!("{base}{}", uri.path()))
        .timeout(FORWARD_TIMEOUT);
    let lost = |e: reqwest::Error| AdminError::OutcomeUnknown {
        message: format!(
            "the write was sent to leader {leader} at {addr}, whose answer was lost ({e})"
        ),
        check_version,
    };
    relay_to_leader(node, req, leader, addr, headers, body.clone(), lost).await
}

/// Sends `req` (its method, URL and timeout set) on to the leader, with
/// this node's id, the caller's token and `body`, and relays its answer
/// unchanged. A failure to connect means
/// nothing was sent (`leader_unreachable`); any later failure is `lost(e)`,
/// the caller's word for "it may have reached the leader". Shared by every
/// write an admin API forwards.
pub(crate) async fn relay_to_leader(
    node: &ClusterNode,
    req: reqwest::RequestBuilder,
    leader: u64,
    addr: &str,
    headers: &HeaderMap,
    body: Bytes,
    lost: impl Fn(reqwest::Error) -> AdminError,
) -> Result<Response, AdminError> {
    let mut req = req
        .header(FORWARDED, node.id().to_string())
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(a) = headers.get(header::AUTHORIZATION) {
        req = req.header(header::AUTHORIZATION, a.clone());
    }
    let resp = req.send().await.map_err(|e| {
        if e.is_connect() {
            AdminError::LeaderUnreachable(format!("node {leader} at {addr}: {e}; nothing was sent"))
        } else {
            lost(e)
        }
    })?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let bytes = resp.bytes().await.map_err(&lost)?;
    Ok((
        status,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (
                header::HeaderName::from_static("x-zonegate-forwarded-to"),
                leader.to_string(),
            ),
        ],
        bytes,
    )
        .into_response())
}
