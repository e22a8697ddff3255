//! Entry points for the fuzz targets in `fuzz/`, not an API (hidden from
//! the docs): every type the crate decodes, by name, through
//! [`codec::decode`](crate::codec::decode) as a node decodes it.

use serde::Serialize;

use crate::codec::{self, Bounded};
use crate::command::Command;
use crate::detect::Report;
use crate::failover::ReportAck;
use crate::state::ClusterState;
use crate::store::{Applied, StoredSnapshot};
use crate::types::alias::{
    AppendEntriesRequest, AppendEntriesResponse, Entry, InstallSnapshotRequest,
    InstallSnapshotResponse, LogId, RaftError, StoredMembership, Vote, VoteRequest, VoteResponse,
};
use crate::view::ClusterView;

/// What one decode found: refused (an error, never a panic), or a value
/// that re-encodes and decodes again; `Err` when it did not.
pub type Outcome = Result<bool, String>;

/// A decoder of one type, as [`KINDS`] lists it.
pub type Decode = fn(&[u8]) -> Outcome;

/// Decodes `bytes` as `T`; a value it yields must encode and decode again.
fn again<T: Bounded + Serialize>(bytes: &[u8]) -> Outcome {
    let Ok(value) = codec::decode::<T>(bytes) else {
        return Ok(false);
    };
    let encoded = codec::encode(&value).map_err(|e| format!("decoded, not encodable: {e}"))?;
    codec::decode::<T>(&encoded).map_err(|e| format!("re-encoded, not decodable: {e}"))?;
    Ok(true)
}

/// Each decoded type, by its golden fixtures' name (`tests/fixtures/`).
pub const KINDS: [(&str, Decode); 18] = [
    ("vote", again::<Vote>),
    ("log_id", again::<LogId>),
    ("committed", again::<Option<LogId>>),
    ("entry", again::<Entry>),
    ("command", again::<Command>),
    ("cluster_state", again::<ClusterState>),
    ("cluster_view", again::<ClusterView>),
    ("stored_membership", again::<StoredMembership>),
    ("applied", again::<Applied>),
    ("stored_snapshot", again::<StoredSnapshot>),
    ("append_request", again::<AppendEntriesRequest>),
    (
        "append_answer",
        again::<Result<AppendEntriesResponse, RaftError>>,
    ),
    ("vote_request", again::<VoteRequest>),
    ("vote_answer", again::<Result<VoteResponse, RaftError>>),
    ("snapshot_request", again::<InstallSnapshotRequest>),
    (
        "snapshot_answer",
        again::<Result<InstallSnapshotResponse, RaftError<openraft::error::InstallSnapshotError>>>,
    ),
    ("report", again::<Report>),
    ("report_ack", again::<ReportAck>),
];
