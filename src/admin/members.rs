//! Membership operations over the admin API: `GET /admin/v1/members` (the
//! replicated membership with role, addresses, match index and lag, as
//! the leader sees them) and `POST /admin/v1/members` (one change, the
//! body a `MemberChange`: `{"op": "add"|"remove"|"promote"|"readdress",
//! …}`, operator token). Both are answered by the leader: a follower
//! forwards, like the decision writes in `cluster.rs`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use http::{HeaderMap, Method};
use serde_json::json;
use zonegate_cluster::{ClusterNode, MemberChange, MemberChangeError, ProposeError};

use super::cluster::{peer_admin, AdminError, Identity, FORWARDED};
use crate::node::gateway::Gateway;

/// A membership change may wait for a learner to catch up, then commit a
/// joint and a final configuration: longer than a decision.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /admin/v1/members`.
pub async fn list(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let Some(node) = gw.cluster.as_deref() else {
        return AdminError::NoControlPlane.into_response();
    };
    let status = node.status();
    if !status.is_leader && !headers.contains_key(FORWARDED) {
        if let (Some(leader), Some(addr)) = (status.leader, status.leader_admin_addr.clone()) {
            if let Ok(resp) = forward(&gw, Method::GET, &addr, leader, &headers, Bytes::new()).await
            {
                return resp;
            }
        }
    }
    // Not the leader and it cannot be asked: this node's view, without
    // match indexes.
    Json(json!({
        "answered_by": node.id(),
        "leader": status.leader,
        "members": node.members(),
        "bootstrap_differs": status.bootstrap_differs,
    }))
    .into_response()
}

/// `POST /admin/v1/members`.
pub async fn change(
    State(gw): State<Arc<Gateway>>,
    Extension(who): Extension<Identity>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = change_inner(&gw, &headers, body).await;
    match result {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(target: "zonegate::audit", token = %who.name, error = %e, "membership change not made");
            e.into_response()
        }
    }
}

async fn change_inner(
    gw: &Gateway,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    let node: &ClusterNode = gw.cluster.as_deref().ok_or(AdminError::NoControlPlane)?;
    let change: MemberChange = serde_json::from_slice(&body)
        .map_err(|e| AdminError::BadRequest(format!("invalid membership change: {e}")))?;
    let kind = change.kind();
    match node.change_members(change).await {
        Ok(()) => {
            tracing::info!(target: "zonegate::audit", kind, "membership changed");
            Ok(Json(json!({"committed": true, "op": kind, "leader": node.id(), "members": node.members()}))
                .into_response())
        }
        Err(MemberChangeError::Refused(r)) => Err(AdminError::Rejected {
            rule: r.rule.name(),
            message: r.message,
        }),
        Err(MemberChangeError::OutcomeUnknown(message)) => {
            Err(AdminError::MembershipUnknown(message))
        }
        Err(MemberChangeError::Propose(ProposeError::NotLeader { leader, admin_addr })) => {
            match admin_addr {
                Some(addr) if !headers.contains_key(FORWARDED) => {
                    forward(gw, Method::POST, &addr, leader, headers, body).await
                }
                _ => Err(AdminError::NoLeader(format!(
                    "node {leader} leads but cannot be reached through this node; nothing was changed"
                ))),
            }
        }
        Err(MemberChangeError::Propose(ProposeError::NoLeader)) => Err(AdminError::NoLeader(
            "no leader with a quorum right now; nothing was changed; retry shortly".into(),
        )),
        Err(MemberChangeError::Propose(e)) => Err(AdminError::Fatal(e.to_string())),
    }
}

/// Sends the request on to the leader with the caller's token and relays
/// its answer. Only a failed connection means nothing was sent.
async fn forward(
    gw: &Gateway,
    method: Method,
    addr: &str,
    leader: u64,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, AdminError> {
    let node = gw.cluster.as_deref().ok_or(AdminError::NoControlPlane)?;
    let writes = method == Method::POST;
    let (client, base) = peer_admin(&gw.cfg, leader, addr)?;
    let req = client
        .request(method, format!("{base}/admin/v1/members"))
        .timeout(FORWARD_TIMEOUT);
    let lost = |e: reqwest::Error| {
        if writes {
            AdminError::MembershipUnknown(format!(
                "the membership change was sent to leader {leader} at {addr}, whose answer was lost ({e})"
            ))
        } else {
            AdminError::LeaderUnreachable(format!("node {leader} at {addr}: {e}"))
        }
    };
    super::cluster::relay_to_leader(node, req, leader, addr, headers, body, lost).await
}
