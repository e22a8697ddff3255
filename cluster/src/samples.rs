//! Sample values of every encoded type, for round-trip, fuzz and
//! golden-bytes tests (test builds only).

// openraft's answers are the (large) `Result<_, RaftError>` themselves.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use openraft::error::{Fatal, InstallSnapshotError, SnapshotMismatch};
use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, Vote};

use crate::codec::{self, CodecError};
use crate::command::{AutoLimits, Command, Decision, LeaderClock};
use crate::detect::{PeriodObservations, Report, TenantDemand, ZoneHealth, ZoneObservation};
use crate::failover::ReportAck;
use crate::quota::TenantWeights;
use crate::state::ClusterState;
use crate::store::{Applied, StoredSnapshot};
use crate::types::alias::{
    AppendEntriesRequest, AppendEntriesResponse, Entry, InstallSnapshotRequest,
    InstallSnapshotResponse, RaftError, SnapshotMeta, StoredMembership, VoteRequest, VoteResponse,
};
use crate::types::{Member, Role};
use crate::view::{ClusterView, NodeId, ZoneId};

pub(crate) fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 2), index)
}

pub(crate) fn member(id: NodeId, zone: &str, role: Role) -> Member {
    Member {
        id,
        zone: ZoneId::new(zone),
        raft_addr: format!("127.0.0.1:{}", 7070 + id),
        admin_addr: format!("127.0.0.1:{}", 9090 + id),
        role,
    }
}

pub(crate) fn membership() -> Membership<NodeId, Member> {
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

pub(crate) fn every_command() -> Vec<Command> {
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
        Command::automatic(
            Decision::QuotaRebalance {
                weights: [(
                    "deptA".to_owned(),
                    [(1, 700_000), (2, 300_000)].into_iter().collect(),
                )]
                .into_iter()
                .collect(),
            },
            "rebalancer:1",
            "tenant demand moved past the drift threshold",
            AutoLimits::default(),
        )
        .if_version(5)
        .stamped(1_700_000_065_000),
        Command::decide(
            Decision::Config {
                config_version: 1,
                toml: "[[backends]]\nname = \"qwen-b2\"\nzone = \"az-b\"\n".into(),
            },
            "ops",
            "add a backend in az-b",
        )
        .stamped(1_700_000_070_000),
        // Format 3: stamped with the leader's clock.
        Command::automatic(
            Decision::Rebalance {
                weights: [(
                    "deptA".to_owned(),
                    TenantWeights {
                        zones: [
                            (ZoneId::new("az-a"), 600_000),
                            (ZoneId::new("az-b"), 400_000),
                        ]
                        .into_iter()
                        .collect(),
                        nodes: [(1, 1_000_000), (2, 1_000_000)].into_iter().collect(),
                    },
                )]
                .into_iter()
                .collect(),
            },
            "rebalancer:2",
            "tenant demand moved past the drift threshold",
            AutoLimits::default(),
        )
        .if_version(6)
        .clocked(1_700_000_075_000, clock(2, 5_000)),
        Command::tick("detector:2").clocked(1_700_000_076_000, clock(2, 6_000)),
        Command::decide(
            Decision::Failback {
                zone: ZoneId::new("az-b"),
            },
            "ops",
            "recovered",
        )
        .clocked(1_700_000_080_000, clock(2, 10_000)),
        // Format 4: a rebalance with budgets.
        Command::automatic(
            Decision::RebalanceWithBudgets {
                weights: crate::quota::QuotaWeights::new(),
                budgets: [(
                    "deptA".to_owned(),
                    [(
                        crate::budget::Period::Day,
                        crate::budget::BudgetLine {
                            period: 19_675,
                            nodes: [(
                                1,
                                crate::budget::Grant {
                                    granted: 5_000_000,
                                    spent: 1_250_000,
                                },
                            )]
                            .into_iter()
                            .collect(),
                        },
                    )]
                    .into_iter()
                    .collect(),
                )]
                .into_iter()
                .collect(),
            },
            "rebalancer:2",
            "budget spend recorded",
            AutoLimits::default(),
        )
        .if_version(8)
        .clocked(1_700_000_085_000, clock(2, 15_000)),
    ]
}

fn clock(node: NodeId, mono_ms: u64) -> LeaderClock {
    LeaderClock {
        node,
        boot: 0x5eed_0000_0000_0001,
        mono_ms,
    }
}

pub(crate) fn every_entry() -> Vec<Entry> {
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

pub(crate) fn report() -> Report {
    let obs = |zone: &str, err: f64| ZoneObservation {
        zone: ZoneId::new(zone),
        gw_error_rate: err,
        timeout_rate: 0.25,
        gpu_health: 0.5,
        requests: 1234,
    };
    Report {
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
        demand: vec![TenantDemand {
            tenant: "deptA".into(),
            offered: 120,
            admitted: 100,
            spend: crate::detect::DemandSpend {
                models: vec![("qwen".into(), 1_500_000)],
                periods: [(crate::budget::Period::Day, (20_000, 9_000_000))]
                    .into_iter()
                    .collect(),
            },
        }],
    }
}

pub(crate) fn zone_health() -> ZoneHealth {
    ZoneHealth {
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
    }
}

pub(crate) fn report_acks() -> Vec<ReportAck> {
    vec![
        ReportAck {
            leader: true,
            zones: vec![zone_health()],
            period_end_ms: Some(1_700_000_002_000),
        },
        ReportAck {
            leader: false,
            zones: Vec::new(),
            period_end_ms: None,
        },
    ]
}

/// A state that went through every command.
pub(crate) fn state() -> ClusterState {
    let mut state = ClusterState::with_zones(["az-a", "az-b", "az-c"]);
    for cmd in every_command() {
        state.apply(&cmd);
    }
    state
}

pub(crate) fn stored_membership() -> StoredMembership {
    StoredMembership::new(Some(log_id(1, 2)), membership())
}

pub(crate) fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(3, 9)),
        last_membership: stored_membership(),
        snapshot_id: "3-9-1".to_string(),
    }
}

pub(crate) fn append_requests() -> Vec<AppendEntriesRequest> {
    vec![
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 2),
            prev_log_id: Some(log_id(1, 1)),
            entries: every_entry(),
            leader_commit: Some(log_id(1, 2)),
        },
        AppendEntriesRequest {
            vote: Vote::new(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        },
    ]
}

pub(crate) fn append_answers() -> Vec<Result<AppendEntriesResponse, RaftError>> {
    vec![
        Ok(AppendEntriesResponse::Success),
        Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(2, 4)))),
        Ok(AppendEntriesResponse::PartialSuccess(None)),
        Ok(AppendEntriesResponse::Conflict),
        Ok(AppendEntriesResponse::HigherVote(Vote::new(9, 3))),
        Err(RaftError::Fatal(Fatal::Stopped)),
        Err(RaftError::Fatal(Fatal::Panicked)),
    ]
}

pub(crate) fn vote_requests() -> Vec<VoteRequest> {
    vec![VoteRequest {
        vote: Vote::new(4, 1),
        last_log_id: Some(log_id(3, 9)),
    }]
}

pub(crate) fn vote_answers() -> Vec<Result<VoteResponse, RaftError>> {
    vec![
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
    ]
}

pub(crate) fn snapshot_requests() -> Vec<InstallSnapshotRequest> {
    vec![InstallSnapshotRequest {
        vote: Vote::new_committed(3, 2),
        meta: snapshot_meta(),
        offset: 1024,
        data: vec![0, 1, 2, 255],
        done: true,
    }]
}

pub(crate) fn snapshot_answers(
) -> Vec<Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>> {
    vec![
        Ok(InstallSnapshotResponse {
            vote: Vote::new_committed(3, 2),
        }),
        Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
            SnapshotMismatch {
                expect: ("3-9-1", 0).into(),
                got: ("3-9-1", 2048).into(),
            },
        ))),
        Err(RaftError::Fatal(Fatal::Panicked)),
    ]
}

pub(crate) fn applied() -> Applied {
    Applied {
        last_applied: Some(log_id(2, 7)),
        last_membership: stored_membership(),
        state: state(),
    }
}

pub(crate) fn stored_snapshot() -> StoredSnapshot {
    StoredSnapshot {
        meta: snapshot_meta(),
        data: crate::codec::encode(&state()).unwrap_or_default(),
    }
}

/// One decoder under test: a [`Bounded`] type, its decode, and valid
/// encodings of it.
pub(crate) struct Decoder {
    pub name: &'static str,
    pub decode: fn(&[u8]) -> Result<(), CodecError>,
    pub samples: Vec<Vec<u8>>,
}

macro_rules! decoder {
    ($name:literal, $t:ty, $values:expr) => {
        Decoder {
            name: $name,
            decode: |b| codec::decode::<$t>(b).map(drop),
            samples: $values
                .iter()
                .map(|v: &$t| codec::encode(v).expect("samples encode"))
                .collect(),
        }
    };
}

/// Every type the crate decodes, with samples. The names are the golden
/// fixtures' file names.
pub(crate) fn decoders() -> Vec<Decoder> {
    vec![
        decoder!(
            "vote",
            Vote<NodeId>,
            [Vote::new(3, 2), Vote::new_committed(5, 1)]
        ),
        decoder!("log_id", LogId<NodeId>, [log_id(4, 17)]),
        decoder!(
            "committed",
            Option<LogId<NodeId>>,
            [Some(log_id(4, 17)), None]
        ),
        decoder!("entry", Entry, every_entry()),
        decoder!("command", Command, every_command()),
        decoder!(
            "cluster_state",
            ClusterState,
            [state(), ClusterState::default()]
        ),
        decoder!("cluster_view", ClusterView, [state().view()]),
        decoder!("stored_membership", StoredMembership, [stored_membership()]),
        decoder!("applied", Applied, [applied(), Applied::default()]),
        decoder!("stored_snapshot", StoredSnapshot, [stored_snapshot()]),
        decoder!("append_request", AppendEntriesRequest, append_requests()),
        decoder!(
            "append_answer",
            Result<AppendEntriesResponse, RaftError>,
            append_answers()
        ),
        decoder!("vote_request", VoteRequest, vote_requests()),
        decoder!("vote_answer", Result<VoteResponse, RaftError>, vote_answers()),
        decoder!(
            "snapshot_request",
            InstallSnapshotRequest,
            snapshot_requests()
        ),
        decoder!(
            "snapshot_answer",
            Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>,
            snapshot_answers()
        ),
        decoder!("report", Report, [report()]),
        decoder!("report_ack", ReportAck, report_acks()),
    ]
}

/// `encoded` with the string `marker` (shorter than 251 bytes, so its
/// length is one byte before it) replaced by a length prefix claiming
/// 2^50 bytes and no data: the shape of the 12-byte body that aborted
/// nodes before decoding was bounded.
pub(crate) fn bomb_string(encoded: &[u8], marker: &str) -> Vec<u8> {
    let at = encoded
        .windows(marker.len())
        .position(|w| w == marker.as_bytes())
        .expect("marker in the encoding");
    let mut out = encoded[..at - 1].to_vec();
    out.push(0xfd);
    out.extend_from_slice(&(1u64 << 50).to_le_bytes());
    out.extend_from_slice(&encoded[at + marker.len()..]);
    out
}

/// An RPC answer carrying an error text (where a string bomb can hide).
pub(crate) fn append_error_answer(text: &str) -> Result<AppendEntriesResponse, RaftError> {
    let io = openraft::StorageIOError::read(openraft::AnyError::error(text));
    Err(RaftError::Fatal(Fatal::StorageError(io.into())))
}
