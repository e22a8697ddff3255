//! The openraft type configuration of zonegate's Raft group and the member
//! record that every membership entry carries.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Response};
use crate::view::{NodeId, ZoneId};

openraft::declare_raft_types!(
    /// zonegate's Raft types: [`Command`] entries, [`Response`] results,
    /// [`Member`] node records, in-memory snapshot bytes.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// What a member does in the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Votes and serves traffic.
    #[default]
    Voter,
    /// Receives every decision, does not vote, serves traffic.
    Learner,
    /// Votes, serves no data-plane traffic (a third place's tie-breaker).
    Witness,
}

impl Role {
    /// Whether the member is a Raft voter (voters and witnesses).
    pub fn votes(self) -> bool {
        matches!(self, Role::Voter | Role::Witness)
    }

    /// Whether the member's zone serves data-plane traffic.
    pub fn serves(self) -> bool {
        matches!(self, Role::Voter | Role::Learner)
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Voter => "voter",
            Role::Learner => "learner",
            Role::Witness => "witness",
        }
    }
}

/// One configured cluster member. It is also openraft's node record, so
/// every membership entry replicates each member's zone, role and addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub zone: ZoneId,
    /// `host:port` of the member's Raft RPC listener.
    pub raft_addr: String,
    /// `host:port` of the member's admin API (where followers forward writes).
    pub admin_addr: String,
    pub role: Role,
}

/// openraft requires `Default` of node records; the empty member is never a
/// configured one.
impl Default for Member {
    fn default() -> Self {
        Self {
            id: 0,
            zone: ZoneId::new(""),
            raft_addr: String::new(),
            admin_addr: String::new(),
            role: Role::Voter,
        }
    }
}

/// Short names for openraft types specialised to [`TypeConfig`].
pub mod alias {
    use super::{Member, TypeConfig};
    use crate::view::NodeId;

    pub type Raft = openraft::Raft<TypeConfig>;
    pub type Entry = openraft::Entry<TypeConfig>;
    pub type LogId = openraft::LogId<NodeId>;
    pub type Vote = openraft::Vote<NodeId>;
    pub type StorageError = openraft::StorageError<NodeId>;
    pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
    pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
    pub type Snapshot = openraft::Snapshot<TypeConfig>;
    pub type RaftMetrics = openraft::RaftMetrics<NodeId, Member>;
    pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
    pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<NodeId>;
    pub type VoteRequest = openraft::raft::VoteRequest<NodeId>;
    pub type VoteResponse = openraft::raft::VoteResponse<NodeId>;
    pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
    pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<NodeId>;
    pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
    pub type RpcError<E = openraft::error::Infallible> =
        openraft::error::RPCError<NodeId, Member, RaftError<E>>;
}
