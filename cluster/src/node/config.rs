//! What a node is started with: the member list, the data directory, the
//! Raft listener and timers, their validation, and openraft's settings
//! derived from them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ClusterError;
use crate::clock::millis;
use crate::network::FaultTable;
use crate::types::Member;
use crate::view::{NodeId, ZoneId};

/// Raft timers and the log-compaction cadence. The defaults elect a new leader within about 1.4 s of the
/// old one dying on loopback, inside the 2 s budget:
///
/// - openraft 0.9 lets a follower campaign only after the leader lease
///   (= `election_timeout_max`, 600 ms) plus its own random election timeout
///   (300–600 ms) have passed without a heartbeat, checked on a tick of
///   1.5 × heartbeat (150 ms): 0.9–1.35 s. One loopback vote round adds a
///   few ms.
/// - Heartbeats every 100 ms give a healthy leader six chances per lease, so
///   a busy 2-core host that stalls a task for a few hundred ms does not
///   trigger a spurious election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// How long `propose` waits for its entry to apply before answering
    /// [`ProposeError::OutcomeUnknown`](crate::ProposeError::OutcomeUnknown).
    pub propose_timeout: Duration,
    /// Log compaction: a snapshot every this many applied entries; half as
    /// many entries stay in the log behind it, so a briefly lagging
    /// follower catches up from the log rather than a snapshot.
    pub snapshot_every_logs: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(300),
            election_timeout_max: Duration::from_millis(600),
            propose_timeout: Duration::from_secs(5),
            snapshot_every_logs: 5000,
        }
    }
}

/// Where the Raft RPC server listens.
#[derive(Debug)]
pub enum RaftListen {
    /// An already bound listener (tests bind 127.0.0.1:0 first, so the
    /// address is known before the cluster config is written).
    Listener(std::net::TcpListener),
    /// An address to bind.
    Addr(SocketAddr),
}

/// Everything one node needs to join the cluster. `members` is the same on
/// every node. `Debug` never prints the secret.
pub struct ClusterConfig {
    pub node_id: NodeId,
    /// This node's zone; must match its entry in `members`.
    pub zone: ZoneId,
    pub members: Vec<Member>,
    /// Holds the sled store (`raft.sled`); reused across restarts.
    pub data_dir: PathBuf,
    /// The cluster secret (a comma-separated list while rotating: the
    /// first signs, any verifies). Raft calls are signed with a key
    /// derived from it; it is never sent.
    pub secret: String,
    /// Mutual TLS between members: this member's certificate and key, and
    /// the cluster CA (`client_ca`) peers must chain to.
    pub tls: Option<zonegate_net::tls::TlsFiles>,
    /// The Raft listener's connection budget and timeouts.
    pub limits: zonegate_net::listen::Limits,
    pub raft_listen: RaftListen,
    pub timing: Timing,
    /// Test hook: when set, RPCs on links it blocks are dropped.
    pub faults: Option<Arc<FaultTable>>,
    /// `zonegate serve --rejoin`: this node lost its store; catch up as a
    /// learner, then be promoted to its configured role.
    pub rejoin: bool,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("node_id", &self.node_id)
            .field("zone", &self.zone)
            .field("members", &self.members)
            .field("data_dir", &self.data_dir)
            .field("secret", &"<redacted>")
            .field("raft_listen", &self.raft_listen)
            .field("timing", &self.timing)
            .field("faults", &self.faults.is_some())
            .field("rejoin", &self.rejoin)
            .finish()
    }
}

/// The most entries in one append RPC.
pub const MAX_PAYLOAD_ENTRIES: u64 = 64;

pub(super) fn validate(config: &ClusterConfig) -> Result<BTreeMap<NodeId, Member>, ClusterError> {
    let invalid = |m: String| Err(ClusterError::InvalidConfig(m));
    let mut members = BTreeMap::new();
    for m in &config.members {
        if members.insert(m.id, m.clone()).is_some() {
            return invalid(format!("member id {} appears twice", m.id));
        }
        if m.zone.as_str().is_empty() {
            return invalid(format!("member {} has an empty zone", m.id));
        }
    }
    let Some(me) = members.get(&config.node_id) else {
        return invalid(format!(
            "node id {} is not among the members",
            config.node_id
        ));
    };
    if me.zone != config.zone {
        return invalid(format!(
            "node {} is in zone {} but the members list says {}",
            config.node_id, config.zone, me.zone
        ));
    }
    if !members.values().any(|m| m.role.votes()) {
        return invalid("no voter or witness among the members".into());
    }
    if config.secret.is_empty() {
        return invalid("the cluster secret is empty".into());
    }
    let t = &config.timing;
    if t.snapshot_every_logs == 0 {
        return invalid("timing.snapshot_every_logs must be at least 1".into());
    }
    if !(t.heartbeat < t.election_timeout_min && t.election_timeout_min < t.election_timeout_max) {
        return invalid(format!(
            "timing needs heartbeat < election_timeout_min < election_timeout_max, got {:?} / {:?} / {:?}",
            t.heartbeat, t.election_timeout_min, t.election_timeout_max
        ));
    }
    Ok(members)
}

pub(super) async fn bind(listen: RaftListen) -> Result<tokio::net::TcpListener, ClusterError> {
    match listen {
        RaftListen::Listener(l) => {
            let addr = l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "pre-bound listener".into());
            let err = |source| ClusterError::Listen {
                addr: addr.clone(),
                source,
            };
            l.set_nonblocking(true).map_err(err)?;
            tokio::net::TcpListener::from_std(l).map_err(err)
        }
        RaftListen::Addr(addr) => {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ClusterError::Listen {
                    addr: addr.to_string(),
                    source,
                })
        }
    }
}

/// openraft's settings from [`Timing`].
pub(super) fn raft_config(timing: &Timing) -> Result<openraft::Config, ClusterError> {
    openraft::Config {
        cluster_name: "zonegate".into(),
        heartbeat_interval: millis(timing.heartbeat),
        election_timeout_min: millis(timing.election_timeout_min),
        election_timeout_max: millis(timing.election_timeout_max),
        // Keep snapshot chunks well under the RPC body limit.
        snapshot_max_chunk_size: 1024 * 1024,
        // With every entry bounded (`Command::validate`), a batch of this
        // many entries stays far below the append decode limit and the
        // RPC body limit, so a lagging follower can always catch up.
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(timing.snapshot_every_logs),
        max_in_snapshot_log_to_keep: timing.snapshot_every_logs / 2,
        // Elections are driven by `crate::prevote` (a pre-vote round
        // first), never by openraft's own timer.
        enable_elect: false,
        ..Default::default()
    }
    .validate()
    .map_err(|e| ClusterError::InvalidConfig(e.to_string()))
}
