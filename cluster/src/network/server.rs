//! The Raft RPC server: an axum router that authenticates each call, checks
//! the sender's identity, and hands the request to the local Raft node.
//!
//! Architecture Invariant: a call without a valid, fresh, unreplayed
//! signature, or from a node that is not a member (or, with mutual TLS,
//! whose certificate does not name it), is refused before its body is
//! read; one whose vote names another node than the sender is answered
//! before the Raft node sees it. Either way it changes nothing. The one
//! non-member heard: a leader whose committed vote names it, appending
//! or sending a snapshot (a member added after this node's log ends; see
//! `beyond_our_log`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Serialize;
use zonegate_net::listen::{self, BodyError, Peer};
use zonegate_net::sign::{self, Call, KeyRing, SignError, Verifier, SIGNATURE_HEADER};

use super::answer_digest_input;
use super::wire::{
    NODE_HEADER, PATH_APPEND, PATH_ELECT, PATH_HELLO, PATH_PREVOTE, PATH_REJOIN, PATH_REPORT,
    PATH_SNAPSHOT, PATH_VOTE,
};
use crate::clock::unix_ms_on;
use crate::codec::{self, Bounded};
use crate::detect::Report;
use crate::failover::Failover;
use crate::identity::{Identity, Mismatch, CLUSTER_HEADER, JOINED_HEADER};
use crate::roster::Roster;
use crate::types::alias::{AppendEntriesRequest, InstallSnapshotRequest, Raft, Vote, VoteRequest};
use crate::view::NodeId;

/// What the RPC handlers share.
pub struct RaftService {
    raft: Raft,
    node_id: NodeId,
    verifier: Verifier,
    /// Callers must present a client certificate naming them.
    mutual_tls: bool,
    body_read_timeout: std::time::Duration,
    members: Roster,
    failover: Option<Arc<Failover>>,
    identity: Option<Arc<Identity>>,
    /// When an append from a current leader last arrived.
    leader_contact: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    /// A pre-vote is refused while this node heard from a live leader
    /// within this long (`election_timeout_max`).
    prevote_window: std::time::Duration,
    /// This node's log, whose last entry a granted pre-vote names. Weak:
    /// the election driver holds it, so a stopped node's store closes
    /// while handlers still run.
    log: std::sync::Weak<crate::store::LogStore>,
}

impl RaftService {
    pub(crate) fn new(
        raft: Raft,
        node_id: NodeId,
        keys: KeyRing,
        members: Roster,
        mutual_tls: bool,
        body_read_timeout: std::time::Duration,
    ) -> Self {
        Self {
            raft,
            node_id,
            verifier: Verifier::new(keys),
            mutual_tls,
            body_read_timeout,
            members,
            failover: None,
            identity: None,
            leader_contact: Arc::default(),
            prevote_window: std::time::Duration::from_millis(600),
            log: std::sync::Weak::new(),
        }
    }

    /// Refuse pre-votes while a leader was heard from within `window`.
    /// A granted pre-vote names this log's last entry (`crate::prevote`).
    pub(crate) fn with_log(mut self, log: std::sync::Weak<crate::store::LogStore>) -> Self {
        self.log = log;
        self
    }

    pub(crate) fn with_prevote_window(mut self, window: std::time::Duration) -> Self {
        self.prevote_window = window;
        self
    }

    /// When this node last accepted an append from a leader of the
    /// current term (the follower's "heard from a leader").
    pub(crate) fn leader_contact(&self) -> Arc<std::sync::Mutex<Option<tokio::time::Instant>>> {
        self.leader_contact.clone()
    }

    /// Check, adopt and answer with this node's cluster identity.
    pub(crate) fn with_identity(mut self, identity: Arc<Identity>) -> Self {
        self.identity = Some(identity);
        self
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
        .route(PATH_HELLO, post(hello))
        .route(PATH_REJOIN, post(rejoin))
        .route(PATH_ELECT, post(elect))
        .route(PATH_PREVOTE, post(prevote))
        .with_state(service)
}

/// Why a call was turned away before reaching Raft.
#[derive(Debug)]
enum Refusal {
    /// Unsigned, badly signed, stale or replayed.
    Signature(SignError),
    /// Mutual TLS: the client certificate does not name the sender.
    PeerCertificate {
        sender: NodeId,
    },
    /// The body did not arrive in time, or exceeds the endpoint's limit.
    Body(BodyError),
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
    /// Another cluster's id, or this node lost its store (amnesia).
    Identity(Mismatch),
    /// This node is rejoining: it votes only once promoted again.
    Rejoining,
}

/// The `reason` labels of refused calls, in [`REFUSED`]'s order.
const REFUSAL_REASONS: [&str; 12] = [
    "unsigned",
    "not_a_member",
    "sender_mismatch",
    "bad_body",
    "wrong_cluster",
    "amnesia",
    "unknown_key",
    "bad_signature",
    "stale",
    "replayed",
    "bad_certificate",
    "slow_body",
];

/// Calls refused by this process's Raft servers, per reason.
static REFUSED: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];

/// How many Raft RPCs and reports this process refused before they reached
/// Raft, per reason (`unsigned`, `unknown_key`, `bad_signature`, `stale`,
/// `replayed`: the signature checks; `bad_certificate`: a client
/// certificate not naming the sender; `slow_body`: a body not received in
/// time; `not_a_member`, `sender_mismatch`: a
/// vote or report naming another node, `bad_body`: undecodable or over the
/// endpoint's limit,
/// `wrong_cluster`: another cluster id, `amnesia`: this node lost its
/// store and a member knows it held the id), plus
/// `newer_format`: values in a newer format version, refused by any decode
/// (RPC bodies, peer answers, stored values). For
/// `zonegate_raft_rpc_refused_total{reason}`. Process-wide: one node per
/// process.
pub fn refusals() -> Vec<(&'static str, u64)> {
    let mut all: Vec<(&'static str, u64)> = REFUSAL_REASONS
        .iter()
        .zip(&REFUSED)
        .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
        .collect();
    all.push(("newer_format", codec::newer_format_refusals()));
    all
}

impl Refusal {
    /// Index into [`REFUSED`]; `None` for what is not a peer's fault or is
    /// counted elsewhere (a newer format version, by the codec).
    fn counter(&self) -> Option<usize> {
        match self {
            Refusal::Signature(e) => Some(match e.reason() {
                "unknown_key" => 6,
                "bad_signature" => 7,
                "stale" => 8,
                "replayed" => 9,
                _ => 0,
            }),
            Refusal::PeerCertificate { .. } => Some(10),
            Refusal::Body(BodyError::TooLarge) => Some(3),
            Refusal::Body(_) => Some(11),
            Refusal::UnknownSender => Some(1),
            Refusal::SenderMismatch { .. } | Refusal::ReportMismatch { .. } => Some(2),
            Refusal::BadBody(codec::CodecError::NewerFormat { .. })
            | Refusal::NoDetector
            | Refusal::Rejoining => None,
            Refusal::BadBody(_) => Some(3),
            Refusal::Identity(Mismatch::WrongCluster { .. }) => Some(4),
            Refusal::Identity(Mismatch::Amnesia(_)) => Some(5),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        if let Some(i) = self.counter() {
            REFUSED[i].fetch_add(1, Ordering::Relaxed);
        }
        // Debug, not warn: a misconfigured peer retries every backoff
        // interval and must not flood the log.
        match self {
            Refusal::Signature(e) => {
                tracing::debug!(error = %e, "raft rpc refused: signature");
                (StatusCode::UNAUTHORIZED, e.to_string()).into_response()
            }
            Refusal::PeerCertificate { sender } => {
                tracing::debug!(
                    sender,
                    "raft rpc refused: the client certificate does not name the sender"
                );
                (
                    StatusCode::FORBIDDEN,
                    "the client certificate does not name the sending member",
                )
                    .into_response()
            }
            Refusal::Body(e) => {
                tracing::debug!(error = %e, "raft rpc refused: body");
                let status = match e {
                    BodyError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                    _ => StatusCode::REQUEST_TIMEOUT,
                };
                (status, e.to_string()).into_response()
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
            Refusal::Identity(m) => {
                tracing::warn!(error = %m, "raft rpc refused");
                (StatusCode::CONFLICT, m.to_string()).into_response()
            }
            Refusal::Rejoining => (
                StatusCode::CONFLICT,
                "this node is rejoining and votes only once promoted",
            )
                .into_response(),
            Refusal::BadBody(e) => {
                tracing::debug!(error = %e, "raft rpc refused: undecodable body");
                (StatusCode::BAD_REQUEST, "undecodable body").into_response()
            }
        }
    }
}

/// A call that passed authentication: who sent it, the nonce its answer
/// is bound to, and its body.
struct Received {
    sender: NodeId,
    /// Whether this node knows the sender as a member. Only appends and
    /// snapshots come from senders it does not (see [`beyond_our_log`]).
    member: bool,
    nonce: String,
    /// The key the call was signed with; its answer is signed with it too.
    kid: String,
    path: &'static str,
    headers: HeaderMap,
    body: Bytes,
}

/// Authenticates a call before its body is read: a valid, fresh,
/// unreplayed signature over a member's node id, and with mutual TLS a client
/// certificate naming that member. Then reads the body (at most `limit`
/// bytes, within the body-read timeout) and checks it against its signed
/// digest.
async fn receive(
    service: &RaftService,
    req: Request,
    path: &'static str,
    limit: usize,
) -> Result<Received, Refusal> {
    let (parts, body) = req.into_parts();
    // An unsigned or badly signed call is a 401 whoever it claims to be;
    // the signature covers the claimed node id.
    let sender = parts
        .headers
        .get(NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<NodeId>().ok());
    let signature = parts
        .headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok());
    let call = Call {
        method: parts.method.as_str(),
        path,
        node: sender.unwrap_or_default(),
    };
    let signed = service
        .verifier
        .check_head(signature, call, unix_ms_on(service.node_id))
        .map_err(Refusal::Signature)?;
    let sender = sender.ok_or(Refusal::UnknownSender)?;
    let member = service.members.contains(sender);
    if !member && !matches!(path, PATH_APPEND | PATH_SNAPSHOT) {
        return Err(Refusal::UnknownSender);
    }
    if service.mutual_tls {
        let named = parts
            .extensions
            .get::<Peer>()
            .and_then(|p| p.certs.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|cert| zonegate_net::tls::names_member(cert, sender));
        if !named {
            return Err(Refusal::PeerCertificate { sender });
        }
    }
    let body = listen::read_body(
        axum::body::Body::new(body),
        limit,
        service.body_read_timeout,
    )
    .await
    .map_err(Refusal::Body)?;
    sign::check_body(&signed, &body).map_err(Refusal::Signature)?;
    Ok(Received {
        sender,
        member,
        nonce: signed.nonce,
        kid: signed.kid,
        path,
        headers: parts.headers,
        body,
    })
}

impl RaftService {
    /// The answer to an authenticated call: `result`'s body or refusal,
    /// this node's identity headers, and a signature over all of them
    /// bound to the call's nonce.
    async fn answer(&self, call: &Received, result: Result<Response, Refusal>) -> Response {
        let answer = with_identity(self, result.unwrap_or_else(IntoResponse::into_response));
        let (mut parts, body) = answer.into_parts();
        // Answers are built from bytes already in memory.
        let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let digest_input =
            answer_digest_input(&body, &header(CLUSTER_HEADER), &header(JOINED_HEADER));
        let me = Call {
            method: "POST",
            path: call.path,
            node: self.node_id,
        };
        let key = self
            .verifier
            .ring()
            .find(&call.kid)
            .unwrap_or_else(|| self.verifier.ring().signer());
        let signature = sign::sign_answer(
            key,
            parts.status.as_u16(),
            me,
            &call.nonce,
            &digest_input,
            unix_ms_on(self.node_id),
        );
        if let Ok(v) = HeaderValue::from_str(&signature.header()) {
            parts.headers.insert(SIGNATURE_HEADER, v);
        }
        Response::from_parts(parts, axum::body::Body::from(body))
    }
}

/// A sender this node does not know as a member may still be the leader:
/// a member added by a membership entry this node has not received yet
/// (it was cut off or down while the member joined). Refusing it would
/// leave this node behind for good, since only the leader can send it
/// that entry. So an append or a snapshot from an unknown sender passes
/// when its vote is committed (a quorum elected it, and voters refuse
/// candidates they do not know) and names it; openraft then checks the
/// vote against this node's as for any leader. Node ids are never
/// reused, and a removed member cannot win a new committed vote.
fn beyond_our_log(call: &Received, vote: &Vote) -> Result<(), Refusal> {
    if call.member || (vote.is_committed() && vote.leader_id().voted_for() == Some(call.sender)) {
        Ok(())
    } else {
        Err(Refusal::UnknownSender)
    }
}

/// A rejoining node takes an append or snapshot only from a leader that
/// made it a learner, or a later one (`Identity::admits`).
fn rejoin_admits(service: &RaftService, vote: &Vote) -> Result<(), Refusal> {
    let (term, node) = (vote.leader_id().term, vote.leader_id().voted_for());
    let admits = service
        .identity
        .as_ref()
        .is_none_or(|i| i.admits(term, node.unwrap_or_default()));
    if admits {
        Ok(())
    } else {
        Err(Refusal::Rejoining)
    }
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

/// The sender's cluster identity: adopt it, record it, or refuse the call
/// (durably, before the call reaches Raft).
async fn admit(service: &RaftService, sender: NodeId, headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(identity) = &service.identity else {
        return Ok(());
    };
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    identity
        .on_request(sender, header(CLUSTER_HEADER), header(JOINED_HEADER))
        .await
        .map_err(Refusal::Identity)
}

/// `answer` with this node's cluster id and joined set in headers.
fn with_identity(service: &RaftService, mut answer: Response) -> Response {
    if let Some(identity) = &service.identity {
        let (id, joined) = identity.headers();
        for (name, value) in [(CLUSTER_HEADER, id), (JOINED_HEADER, joined)] {
            if let Ok(v) = axum::http::HeaderValue::from_str(&value) {
                answer.headers_mut().insert(name, v);
            }
        }
    }
    answer
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

/// One authenticated RPC: receive (authenticate, read the body), decode
/// the message, `handle` it, and answer signed. Every refusal after
/// authentication is signed too, so the caller can tell it from a forgery.
async fn serve_call<T: Bounded>(
    service: &RaftService,
    req: Request,
    path: &'static str,
    handle: impl AsyncFnOnce(&Received, T) -> Result<Response, Refusal>,
) -> Response {
    let call = match receive(service, req, path, T::LIMIT).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let result = match decode::<T>(&call.body) {
        Ok(message) => handle(&call, message).await,
        Err(r) => Err(r),
    };
    service.answer(&call, result).await
}

async fn append(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    serve_call(&service, req, PATH_APPEND, async |call, rpc: AppendEntriesRequest| {
        check_vote(call.sender, &rpc.vote)?;
        beyond_our_log(call, &rpc.vote)?;
        admit(&service, call.sender, &call.headers).await?;
        rejoin_admits(&service, &rpc.vote)?;
        let result = service.raft.append_entries(rpc).await;
        if matches!(&result, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_)))
        {
            *crate::lock::lock(&service.leader_contact) = Some(tokio::time::Instant::now());
        }
        Ok(reply(&result))
    })
    .await
}

async fn vote(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    serve_call(&service, req, PATH_VOTE, async |call, rpc: VoteRequest| {
        check_vote(call.sender, &rpc.vote)?;
        admit(&service, call.sender, &call.headers).await?;
        if service.identity.as_ref().is_some_and(|i| i.rejoining()) {
            return Err(Refusal::Rejoining);
        }
        Ok(reply(&service.raft.vote(rpc).await))
    })
    .await
}

async fn snapshot(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    serve_call(
        &service,
        req,
        PATH_SNAPSHOT,
        async |call, rpc: InstallSnapshotRequest| {
            check_vote(call.sender, &rpc.vote)?;
            beyond_our_log(call, &rpc.vote)?;
            admit(&service, call.sender, &call.headers).await?;
            rejoin_admits(&service, &rpc.vote)?;
            Ok(reply(&service.raft.install_snapshot(rpc).await))
        },
    )
    .await
}

/// A node's zone observations: handed to the detector, answered with the
/// leader's latest assessment (or `leader: false`).
async fn report(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    serve_call(&service, req, PATH_REPORT, async |call, report: Report| {
        if let Some(identity) = &service.identity {
            let theirs = call
                .headers
                .get(CLUSTER_HEADER)
                .and_then(|v| v.to_str().ok());
            identity.check(theirs).map_err(Refusal::Identity)?;
        }
        let sender = call.sender;
        if report.node != sender {
            return Err(Refusal::ReportMismatch {
                sender,
                named: report.node,
            });
        }
        let failover = service.failover.as_ref().ok_or(Refusal::NoDetector)?;
        let zone = service
            .members
            .get(sender)
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
            unix_ms_on(service.node_id),
        )))
    })
    .await
}

/// The start-up check of a node without a store: this node's cluster id
/// and joined set, in headers.
async fn hello(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    match receive(&service, req, PATH_HELLO, 0).await {
        Ok(call) => {
            service
                .answer(&call, Ok(StatusCode::OK.into_response()))
                .await
        }
        Err(r) => r.into_response(),
    }
}

/// The leader hands over (`crate::handover`): it asks this voter to
/// campaign now. Answers 202 when the campaign started, 409 when this
/// node follows another leader than the sender, or is no voter, or is
/// rejoining.
async fn elect(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    let call = match receive(&service, req, PATH_ELECT, 0).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = admit(&service, call.sender, &call.headers).await {
        return service.answer(&call, Err(r)).await;
    }
    let answer = campaign(&service, call.sender).await;
    service.answer(&call, Ok(answer)).await
}

async fn campaign(service: &RaftService, sender: NodeId) -> Response {
    let (may_campaign, is_voter) = {
        let m = service.raft.metrics();
        let m = m.borrow();
        let is_voter = m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == service.node_id);
        let follows_sender =
            m.current_leader == Some(sender) && m.state == openraft::ServerState::Follower;
        // A campaign that lost leaves nobody leading: campaigning again
        // disturbs no leader.
        let leaderless = m.current_leader.is_none() && !m.vote.is_committed();
        (follows_sender || leaderless, is_voter)
    };
    let rejoining = service.identity.as_ref().is_some_and(|i| i.rejoining());
    if !may_campaign || !is_voter || rejoining {
        return (
            StatusCode::CONFLICT,
            "not a voter following the sender as leader, nor leaderless",
        )
            .into_response();
    }
    match service.raft.trigger().elect().await {
        Ok(()) => {
            tracing::info!(
                leader = sender,
                "handover: campaigning at the leader's request"
            );
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// A voter asks whether it may campaign (`crate::prevote`): 200 when this
/// node heard from no live leader within the election timeout, 409 when
/// it did (or it is rejoining: it has no opinion worth a term). Nothing
/// changes here either way.
async fn prevote(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    let call = match receive(&service, req, PATH_PREVOTE, 0).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    if let Err(r) = admit(&service, call.sender, &call.headers).await {
        return service.answer(&call, Err(r)).await;
    }
    let heard = {
        let m = service.raft.metrics();
        let m = m.borrow();
        let age = crate::lock::lock(&service.leader_contact).map(|t| t.elapsed());
        crate::prevote::heard_from_leader(
            m.state,
            m.millis_since_quorum_ack,
            m.current_leader.is_some_and(|l| l != service.node_id),
            age,
            service.prevote_window,
        )
    };
    let rejoining = service.identity.as_ref().is_some_and(|i| i.rejoining());
    let answer = if heard || rejoining {
        tracing::debug!(
            candidate = call.sender,
            "pre-vote refused: a live leader was heard from"
        );
        (StatusCode::CONFLICT, "a live leader was heard from").into_response()
    } else {
        // The grant names this node's last log entry: the candidate counts
        // it only when its own log is at least as up to date (a vote would
        // refuse it otherwise; see `crate::prevote`).
        let log = service.log.upgrade().map(|log| (*log).clone());
        let last = match log {
            Some(mut log) => {
                use openraft::storage::RaftLogStorage;
                log.get_log_state().await.ok().and_then(|s| s.last_log_id)
            }
            None => None,
        };
        (StatusCode::OK, crate::prevote::encode_last(last)).into_response()
    };
    service.answer(&call, Ok(answer)).await
}

/// A rejoining member asks the leader for its next step: a voter in the
/// membership is first made a learner (it lost the state its vote stood
/// for); a learner that has caught up with the leader's applied log is
/// promoted back to its configured role. One membership change at a time
/// (openraft refuses a second while one is in flight; the member asks
/// again). Answers 202 when a change was started or none is needed yet,
/// with the body `learner TERM NODE` (this leader's vote) once the member
/// is a learner in a membership this leader committed (the member then
/// takes its appends: `Identity::admits`); 409 when this node does not
/// lead, naming the leader it follows (`leader ID ADDR`) when it knows
/// one.
async fn rejoin(State(service): State<Arc<RaftService>>, req: Request) -> Response {
    let call = match receive(&service, req, PATH_REJOIN, 0).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let answer = start_rejoin_step(&service, call.sender);
    service.answer(&call, Ok(answer)).await
}

fn start_rejoin_step(service: &RaftService, sender: NodeId) -> Response {
    use openraft::ChangeMembers;
    let m = service.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    if m.state != openraft::ServerState::Leader {
        // Name the leader this node follows, so a rejoiner that knows no
        // leader (it takes no appends yet) asks it next.
        let leader = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| (l, n.raft_addr.clone())));
        let body = match leader {
            Some((l, addr)) => format!("leader {l} {addr}"),
            None => "not the leader".to_owned(),
        };
        return (StatusCode::CONFLICT, body).into_response();
    }
    let is_voter = membership.voter_ids().any(|id| id == sender);
    let present = membership.get_node(&sender).is_some();
    // A learner in a membership this leader committed: the rejoiner may
    // take this leader's appends (`Identity::admits`).
    let committed = m.membership_config.log_id().as_ref() <= m.last_applied.as_ref();
    let learner = (present && !is_voter && committed).then(|| {
        format!(
            "learner {} {}",
            m.vote.leader_id().term,
            m.vote.leader_id().voted_for().unwrap_or_default()
        )
    });
    let change = if is_voter {
        Some(ChangeMembers::RemoveVoters([sender].into()))
    } else if present {
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&sender).copied().flatten())
            .map(|l| l.index);
        let applied = m.last_applied.map(|l| l.index);
        // Its bootstrap role, else the role its membership record names
        // (a member added by `ctl members`).
        let votes = service
            .members
            .bootstrap()
            .get(&sender)
            .cloned()
            .or_else(|| membership.get_node(&sender).cloned())
            .is_some_and(|mm| mm.role.votes());
        (votes && matched.is_some() && matched >= applied)
            .then(|| ChangeMembers::AddVoterIds([sender].into()))
    } else {
        None
    };
    if let Some(change) = change {
        let raft = service.raft.clone();
        let what = format!("{change:?}");
        tokio::spawn(async move {
            match raft.change_membership(change, true).await {
                Ok(_) => {
                    tracing::info!(member = sender, change = %what, "rejoining member: membership changed")
                }
                Err(e) => {
                    tracing::info!(member = sender, change = %what, error = %e, "rejoining member: membership change not made (retried)")
                }
            }
        });
    }
    (StatusCode::ACCEPTED, learner.unwrap_or_default()).into_response()
}
