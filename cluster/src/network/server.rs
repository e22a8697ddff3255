//! The Raft RPC server: an axum router that authenticates each call, checks
//! the sender's identity, and hands the request to the local Raft node.
//!
//! Architecture Invariant: a call without the right secret, or from a node
//! that is not a member, or whose vote names another node than the sender,
//! is answered before the Raft node sees it, so it changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Serialize;
use subtle::ConstantTimeEq;

use super::wire::{NODE_HEADER, PATH_APPEND, PATH_REPORT, PATH_SNAPSHOT, PATH_VOTE, SECRET_HEADER};
use crate::clock::now_ms;
use crate::codec::{self, Bounded};
use crate::detect::Report;
use crate::failover::Failover;
use crate::types::alias::{AppendEntriesRequest, InstallSnapshotRequest, Raft, Vote, VoteRequest};
use crate::types::Member;
use crate::view::NodeId;

/// A ceiling on every RPC body, above axum's 2 MiB default: the largest
/// bodies are snapshot chunks (the node sets openraft's
/// `snapshot_max_chunk_size` to 1 MiB) and append batches.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// What the RPC handlers share.
pub struct RaftService {
    raft: Raft,
    secret: Arc<str>,
    members: BTreeMap<NodeId, Member>,
    failover: Option<Arc<Failover>>,
}

impl RaftService {
    pub fn new(raft: Raft, secret: Arc<str>, members: BTreeMap<NodeId, Member>) -> Self {
        Self {
            raft,
            secret,
            members,
            failover: None,
        }
    }

    /// Accept zone reports for this node's detector.
    pub(crate) fn with_failover(mut self, failover: Arc<Failover>) -> Self {
        self.failover = Some(failover);
        self
    }
}

/// The router serving the three Raft RPCs and zone reports.
pub fn router(service: Arc<RaftService>) -> Router {
    Router::new()
        .route(PATH_APPEND, post(append))
        .route(PATH_VOTE, post(vote))
        .route(PATH_SNAPSHOT, post(snapshot))
        .route(PATH_REPORT, post(report))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(service)
}

/// Why a call was turned away before reaching Raft.
#[derive(Debug)]
enum Refusal {
    BadSecret,
    UnknownSender,
    SenderMismatch {
        sender: NodeId,
        vote: Option<NodeId>,
    },
    BadBody(codec::CodecError),
    /// A report naming another node than its sender.
    ReportMismatch {
        sender: NodeId,
        named: NodeId,
    },
    /// This node runs no detector.
    NoDetector,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        // Debug, not warn: a misconfigured peer retries every backoff
        // interval and must not flood the log.
        match self {
            Refusal::BadSecret => {
                tracing::debug!("raft rpc refused: bad cluster secret");
                (StatusCode::UNAUTHORIZED, "bad cluster secret").into_response()
            }
            Refusal::UnknownSender => {
                tracing::debug!("raft rpc refused: sender is not a member");
                (StatusCode::FORBIDDEN, "sender is not a member").into_response()
            }
            Refusal::SenderMismatch { sender, vote } => {
                tracing::debug!(
                    sender,
                    ?vote,
                    "raft rpc refused: sender does not match vote"
                );
                (
                    StatusCode::FORBIDDEN,
                    "sender does not match the rpc's vote",
                )
                    .into_response()
            }
            Refusal::ReportMismatch { sender, named } => {
                tracing::debug!(sender, named, "report refused: sender does not match");
                (
                    StatusCode::FORBIDDEN,
                    "sender does not match the report's node",
                )
                    .into_response()
            }
            Refusal::NoDetector => (StatusCode::NOT_FOUND, "no detector").into_response(),
            Refusal::BadBody(e) => {
                tracing::debug!(error = %e, "raft rpc refused: undecodable body");
                (StatusCode::BAD_REQUEST, "undecodable body").into_response()
            }
        }
    }
}

/// Check the secret (constant time) and that the sender is a member.
fn authenticate(service: &RaftService, headers: &HeaderMap) -> Result<NodeId, Refusal> {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !bool::from(given.ct_eq(service.secret.as_bytes())) {
        return Err(Refusal::BadSecret);
    }
    let sender = headers
        .get(NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<NodeId>().ok())
        .ok_or(Refusal::UnknownSender)?;
    if !service.members.contains_key(&sender) {
        return Err(Refusal::UnknownSender);
    }
    Ok(sender)
}

/// A vote names the candidate or leader that sent it; anything else is a
/// node speaking for another.
fn check_vote(sender: NodeId, vote: &Vote) -> Result<(), Refusal> {
    let named = vote.leader_id().voted_for();
    if named == Some(sender) {
        Ok(())
    } else {
        Err(Refusal::SenderMismatch {
            sender,
            vote: named,
        })
    }
}

fn decode<T: Bounded>(body: &Bytes) -> Result<T, Refusal> {
    codec::decode(body).map_err(Refusal::BadBody)
}

fn reply<T: Serialize>(answer: &T) -> Response {
    match codec::encode(answer) {
        Ok(bytes) => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode raft rpc answer");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn append(
    State(service): State<Arc<RaftService>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let sender = authenticate(&service, &headers)?;
    let req: AppendEntriesRequest = decode(&body)?;
    check_vote(sender, &req.vote)?;
    Ok(reply(&service.raft.append_entries(req).await))
}

async fn vote(
    State(service): State<Arc<RaftService>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let sender = authenticate(&service, &headers)?;
    let req: VoteRequest = decode(&body)?;
    check_vote(sender, &req.vote)?;
    Ok(reply(&service.raft.vote(req).await))
}

async fn snapshot(
    State(service): State<Arc<RaftService>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let sender = authenticate(&service, &headers)?;
    let req: InstallSnapshotRequest = decode(&body)?;
    check_vote(sender, &req.vote)?;
    Ok(reply(&service.raft.install_snapshot(req).await))
}

/// A node's zone observations: handed to the detector, answered with the
/// leader's latest assessment (or `leader: false`).
async fn report(
    State(service): State<Arc<RaftService>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refusal> {
    let sender = authenticate(&service, &headers)?;
    let report: Report = decode(&body)?;
    if report.node != sender {
        return Err(Refusal::ReportMismatch {
            sender,
            named: report.node,
        });
    }
    let failover = service.failover.as_ref().ok_or(Refusal::NoDetector)?;
    let zone = service
        .members
        .get(&sender)
        .map(|m| m.zone.clone())
        .ok_or(Refusal::UnknownSender)?;
    let leading_term = {
        let m = service.raft.metrics();
        let m = m.borrow();
        (m.state == openraft::ServerState::Leader).then_some(m.current_term)
    };
    Ok(reply(&failover.receive(
        leading_term,
        &zone,
        &report,
        now_ms(),
    )))
}
