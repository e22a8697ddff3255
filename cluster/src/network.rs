//! Raft RPC over HTTP: the client side openraft calls ([`Network`]), the
//! axum server side ([`server`]) and the test fault hook ([`FaultTable`]).
//!
//! Wire contract: `POST` with a bincode body (see [`crate::codec`]) to one
//! path per RPC; every request carries the cluster secret and the sender's
//! node id in headers. A `200` body is the bincode of
//! `Result<Response, RaftError<E>>`: a Raft-level refusal is a valid answer,
//! not a transport failure. `401` means a wrong or missing secret, `403` a
//! sender that is not a member or does not match the RPC's vote.

pub mod fault;
pub mod server;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use fault::FaultTable;
pub use wire::{NODE_HEADER, PATH_APPEND, PATH_REPORT, PATH_SNAPSHOT, PATH_VOTE, SECRET_HEADER};

use crate::codec;
use crate::detect::Report;
use crate::failover::{ReportAck, SendReport};
use crate::types::alias::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use crate::types::{Member, TypeConfig};
use crate::view::NodeId;

/// The failure of one RPC before a Raft answer came back.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("link {from} -> {to} is cut by the fault table")]
    Cut { from: NodeId, to: NodeId },
    #[error("request to node {to} at {addr}: {source}")]
    Http {
        to: NodeId,
        addr: String,
        source: reqwest::Error,
    },
    #[error(
        "node {to} refused the call with HTTP {status} (check the cluster secret and member ids)"
    )]
    Refused { to: NodeId, status: u16 },
    #[error("node {to} is not a configured member")]
    UnknownPeer { to: NodeId },
    #[error("body from node {to}: {source}")]
    Body {
        to: NodeId,
        source: codec::CodecError,
    },
}

/// openraft's network factory: one HTTP client shared by all peers.
#[derive(Clone)]
pub struct Network {
    node_id: NodeId,
    secret: Arc<str>,
    client: reqwest::Client,
    faults: Option<Arc<FaultTable>>,
}

impl Network {
    /// A network for node `node_id`; `faults`, when given, is consulted
    /// before every RPC.
    pub fn new(
        node_id: NodeId,
        secret: Arc<str>,
        connect_timeout: Duration,
        faults: Option<Arc<FaultTable>>,
    ) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            // Raft peers are addressed directly; an HTTP proxy from the
            // environment must never sit between them.
            .no_proxy()
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self {
            node_id,
            secret,
            client,
            faults,
        })
    }
}

/// Sends zone reports to the leader's Raft address, through the same
/// client and fault table as every Raft RPC.
#[derive(Clone)]
pub(crate) struct ReportClient {
    pub net: Network,
    pub members: Arc<BTreeMap<NodeId, Member>>,
}

impl SendReport for ReportClient {
    type Error = TransportError;

    async fn send_report(
        &self,
        to: NodeId,
        report: &Report,
        ttl: Duration,
    ) -> Result<ReportAck, TransportError> {
        let addr = self
            .members
            .get(&to)
            .map(|m| m.raft_addr.clone())
            .ok_or(TransportError::UnknownPeer { to })?;
        let peer = PeerClient {
            net: self.net.clone(),
            target: to,
            addr,
        };
        peer.send(PATH_REPORT, report, ttl).await
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            net: self.clone(),
            target,
            addr: node.raft_addr.clone(),
        }
    }
}

/// The RPC client for one peer.
pub struct PeerClient {
    net: Network,
    target: NodeId,
    addr: String,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<Resp, RaftError<NodeId, E>> = self
            .send(path, req, option.hard_ttl())
            .await
            .map_err(|e| match e {
                // Transport and refusal failures make openraft back off
                // (see `backoff`) instead of retrying in a tight loop.
                TransportError::Body { .. } => RPCError::Network(NetworkError::new(&e)),
                _ => RPCError::Unreachable(Unreachable::new(&e)),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn send<Req: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        req: &Req,
        ttl: Duration,
    ) -> Result<T, TransportError> {
        let (from, to) = (self.net.node_id, self.target);
        if let Some(faults) = &self.net.faults {
            if faults.is_blocked(from, to) {
                return Err(TransportError::Cut { from, to });
            }
        }
        let body = codec::encode(req).map_err(|source| TransportError::Body { to, source })?;
        let http = |source| TransportError::Http {
            to,
            addr: self.addr.clone(),
            source,
        };
        let resp = self
            .net
            .client
            .post(format!("http://{}{path}", self.addr))
            .header(SECRET_HEADER, &*self.net.secret)
            .header(NODE_HEADER, from.to_string())
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .timeout(ttl)
            .body(body)
            .send()
            .await
            .map_err(http)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(TransportError::Refused {
                to,
                status: status.as_u16(),
            });
        }
        let bytes = resp.bytes().await.map_err(http)?;
        codec::decode(&bytes).map_err(|source| TransportError::Body { to, source })
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(PATH_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse,
        RPCError<NodeId, Member, RaftError<NodeId, openraft::error::InstallSnapshotError>>,
    > {
        self.call(PATH_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(PATH_VOTE, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt::Debug;

    use openraft::error::{Fatal, InstallSnapshotError, SnapshotMismatch};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, StoredMembership, Vote};

    use super::*;
    use crate::command::{AutoLimits, Command, Decision, Outcome, RejectRule, Response};
    use crate::state::ClusterState;
    use crate::types::alias::{Entry, SnapshotMeta};
    use crate::types::Role;
    use crate::view::{ClusterView, ZoneId};

    /// Encode, decode, and compare: the decoded value prints the same and
    /// encodes to the same bytes.
    fn round_trip<T: Serialize + DeserializeOwned + Debug>(value: &T) {
        let bytes = codec::encode(value).unwrap();
        let back: T = codec::decode(&bytes).unwrap();
        assert_eq!(format!("{back:?}"), format!("{value:?}"));
        assert_eq!(codec::encode(&back).unwrap(), bytes);
    }

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 2), index)
    }

    fn member(id: NodeId, zone: &str, role: Role) -> Member {
        Member {
            id,
            zone: ZoneId::new(zone),
            raft_addr: format!("127.0.0.1:{}", 7070 + id),
            admin_addr: format!("127.0.0.1:{}", 9090 + id),
            role,
        }
    }

    fn membership() -> Membership<NodeId, Member> {
        let nodes: BTreeMap<NodeId, Member> = [
            (1, member(1, "az-a", Role::Voter)),
            (2, member(2, "az-b", Role::Voter)),
            (3, member(3, "az-c", Role::Witness)),
            (4, member(4, "az-a", Role::Learner)),
        ]
        .into_iter()
        .collect();
        Membership::new(vec![[1, 2, 3].into_iter().collect()], nodes)
    }

    fn every_command() -> Vec<Command> {
        let (a, b) = (ZoneId::new("az-a"), ZoneId::new("az-b"));
        vec![
            Command::decide(
                Decision::Failover {
                    from: a.clone(),
                    to: b,
                },
                "ops",
                "drill",
            )
            .if_version(0)
            .with_evidence("score 0.2")
            .stamped(1_700_000_000_123),
            Command::decide(Decision::Failback { zone: a }, "ops", "recovered"),
            Command::decide(Decision::Freeze, "ops", ""),
            Command::decide(Decision::Unfreeze, "détecteur ✓", "unicode survives"),
            Command::automatic(
                Decision::Failover {
                    from: ZoneId::new("az-b"),
                    to: ZoneId::new("az-a"),
                },
                "detector:1",
                "score below cutoff",
                AutoLimits {
                    max_auto_failed_over: 2,
                    dwell_ms: 30_000,
                },
            )
            .if_version(4)
            .with_evidence(r#"{"zone":"az-b"}"#)
            .stamped(1_700_000_060_000),
        ]
    }

    fn every_entry() -> Vec<Entry> {
        let mut entries = vec![
            Entry {
                log_id: log_id(1, 1),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(1, 2),
                payload: EntryPayload::Membership(membership()),
            },
        ];
        for (i, cmd) in every_command().into_iter().enumerate() {
            entries.push(Entry {
                log_id: log_id(2, 3 + i as u64),
                payload: EntryPayload::Normal(cmd),
            });
        }
        entries
    }

    #[test]
    fn every_command_and_outcome_round_trips() {
        for cmd in every_command() {
            round_trip(&cmd);
        }
        for entry in every_entry() {
            round_trip(&entry);
        }
        for rule in RejectRule::ALL {
            round_trip(&rule);
            round_trip(&Response {
                outcome: Some(Outcome::Rejected {
                    rule,
                    message: format!("refused by {rule}"),
                }),
            });
        }
        round_trip(&Response::default());
        round_trip(&Response {
            outcome: Some(Outcome::Applied { version: 42 }),
        });
    }

    #[test]
    fn zone_reports_acks_and_evidence_round_trip() {
        use crate::detect::{Evidence, PeriodObservations, Report, ZoneHealth, ZoneObservation};
        use crate::failover::ReportAck;
        let obs = |zone: &str, err: f64| ZoneObservation {
            zone: ZoneId::new(zone),
            gw_error_rate: err,
            timeout_rate: 0.25,
            gpu_health: 0.5,
            requests: 1234,
        };
        round_trip(&Report {
            node: 3,
            period_end_ms: 1_700_000_002_000,
            zones: vec![obs("az-a", 1.0), obs("az-b", 0.0)],
            history: vec![
                PeriodObservations {
                    period_end_ms: 1_700_000_000_000,
                    zones: Vec::new(),
                },
                PeriodObservations {
                    period_end_ms: 1_700_000_001_000,
                    zones: vec![obs("az-a", 0.125)],
                },
            ],
        });
        let health = ZoneHealth {
            zone: ZoneId::new("az-a"),
            score: Some(0.2),
            gw_error_rate: Some(0.9),
            timeout_rate: None,
            gpu_health: Some(0.0),
            bad_periods: 3,
            good_periods: 0,
            reporters: 2,
            silent: false,
            period_end_ms: Some(1_700_000_002_000),
        };
        round_trip(&ReportAck {
            leader: true,
            zones: vec![health.clone()],
            period_end_ms: Some(1_700_000_002_000),
        });
        round_trip(&ReportAck {
            leader: false,
            zones: Vec::new(),
            period_end_ms: None,
        });
        let evidence = Evidence {
            zone: ZoneId::new("az-a"),
            trigger: "below_cutoff".into(),
            threshold: 0.4,
            periods: Vec::new(),
            target: Some(ZoneId::new("az-b")),
            target_score: Some(1.0),
            assessed_at_ms: 7,
        };
        round_trip(&evidence);
        let json = serde_json::to_string(&evidence).unwrap();
        assert_eq!(serde_json::from_str::<Evidence>(&json).unwrap(), evidence);
    }

    #[test]
    fn operator_commands_keep_their_bincode_bytes() {
        // `Command::Decide` is variant 0 and its fields did not change, so
        // entries written before automatic decisions existed still decode.
        let cmd = Command::decide(Decision::Freeze, "ops", "r");
        let bytes = codec::encode(&cmd).unwrap();
        assert_eq!(bytes[0], 0, "Decide stays the first variant");
        let expected: Vec<u8> = [0u8, 2, 3]
            .into_iter()
            .chain(*b"ops")
            .chain([1])
            .chain(*b"r")
            .chain([0, 0, 0])
            .collect();
        assert_eq!(bytes, expected);
        // Old rule indices are unchanged.
        assert_eq!(codec::encode(&RejectRule::NotFrozen).unwrap(), vec![8]);
    }

    #[test]
    fn replicated_state_and_view_round_trip() {
        let mut state = ClusterState::with_zones(["az-a", "az-b", "az-c"]);
        for cmd in every_command() {
            state.apply(&cmd);
        }
        assert_eq!(state.decision_version(), 5);
        round_trip(&state);
        let back: ClusterState = codec::decode(&codec::encode(&state).unwrap()).unwrap();
        assert_eq!(back, state);
        let view: ClusterView = state.view();
        round_trip(&view);
        round_trip(&StoredMembership::new(Some(log_id(1, 2)), membership()));
    }

    #[test]
    fn every_raft_rpc_round_trips() {
        let vote = Vote::new_committed(3, 2);
        round_trip(&AppendEntriesRequest {
            vote,
            prev_log_id: Some(log_id(1, 1)),
            entries: every_entry(),
            leader_commit: Some(log_id(1, 2)),
        });
        round_trip(&AppendEntriesRequest {
            vote: Vote::new(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        });
        let append_answers: Vec<Result<AppendEntriesResponse, RaftError<NodeId>>> = vec![
            Ok(AppendEntriesResponse::Success),
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(2, 4)))),
            Ok(AppendEntriesResponse::PartialSuccess(None)),
            Ok(AppendEntriesResponse::Conflict),
            Ok(AppendEntriesResponse::HigherVote(Vote::new(9, 3))),
            Err(RaftError::Fatal(Fatal::Stopped)),
            Err(RaftError::Fatal(Fatal::Panicked)),
        ];
        for answer in &append_answers {
            round_trip(answer);
        }

        round_trip(&VoteRequest {
            vote: Vote::new(4, 1),
            last_log_id: Some(log_id(3, 9)),
        });
        let vote_answers: Vec<Result<VoteResponse, RaftError<NodeId>>> = vec![
            Ok(VoteResponse {
                vote: Vote::new(4, 1),
                vote_granted: true,
                last_log_id: Some(log_id(3, 9)),
            }),
            Ok(VoteResponse {
                vote: Vote::new_committed(5, 3),
                vote_granted: false,
                last_log_id: None,
            }),
            Err(RaftError::Fatal(Fatal::Stopped)),
        ];
        for answer in &vote_answers {
            round_trip(answer);
        }

        let meta = SnapshotMeta {
            last_log_id: Some(log_id(3, 9)),
            last_membership: StoredMembership::new(Some(log_id(1, 2)), membership()),
            snapshot_id: "3-9-1".to_string(),
        };
        round_trip(&InstallSnapshotRequest {
            vote,
            meta,
            offset: 1024,
            data: vec![0, 1, 2, 255],
            done: true,
        });
        let snapshot_answers: Vec<
            Result<InstallSnapshotResponse, RaftError<NodeId, InstallSnapshotError>>,
        > = vec![
            Ok(InstallSnapshotResponse { vote }),
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                SnapshotMismatch {
                    expect: ("3-9-1", 0).into(),
                    got: ("3-9-1", 2048).into(),
                },
            ))),
            Err(RaftError::Fatal(Fatal::Panicked)),
        ];
        for answer in &snapshot_answers {
            round_trip(answer);
        }
    }
}
