//! One member of the Raft group: starts the store, the Raft RPC server and
//! openraft, forms the cluster, and offers propose / view / status.
//!
//! Cluster formation (openraft 0.9): `Raft::initialize` must run on exactly
//! one pristine node, or on several with the identical voter set. Here only
//! the lowest-id voting member initialises, and only while its store is
//! empty, with every voting member (voters and witnesses) of the shared
//! config; that entry is log index 0 and identical whoever writes it, so a
//! restart never forms a second cluster. Learners are added afterwards, one
//! membership change at a time, by whichever node is leader and sees one
//! missing (openraft forbids concurrent membership changes).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::RaftError;
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::millis;
use crate::command::{Command, Rejection};
use crate::detect::{FailoverConfig, FailoverConfigError, ZoneHealth};
use crate::failover::{Failover, FailoverStatus, LeadLoop, ObservationSource, ReportLoop};
use crate::identity::Identity;
use crate::lock::lock;
use crate::members::{effective_role, MemberChange, MemberInfo, MemberRefusal, Situation, Step};
use crate::network::server::{self, RaftService};
use crate::network::{FaultTable, Network, ReportClient};
use crate::prevote::Campaigns;
pub use crate::propose::{Applied, ProposeError};
use crate::propose::{Propose, Proposer};
use crate::roster::Roster;
use crate::state::{ClusterState, DecisionRecord, Preview};
use crate::store::{self, StoreError, StoreLiveness};
use crate::types::alias::Raft;
use crate::types::{Member, Role};
use crate::view::{Automation, ClusterView, NodeId, ZoneId};
use zonegate_net::listen::{self, ListenConfig, Stats};
use zonegate_net::sign::{KeyRing, Purpose};
use zonegate_net::tls::MemberTls;

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
    /// [`ProposeError::OutcomeUnknown`].
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

/// Why a membership change did not (knowingly) happen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberChangeError {
    /// Not the leader, no leader with a quorum, or Raft failed.
    #[error(transparent)]
    Propose(#[from] ProposeError),
    /// A membership rule refused it; nothing changed.
    #[error(transparent)]
    Refused(#[from] MemberRefusal),
    /// Submitted to Raft, commit not confirmed in time.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
}

/// Starting or stopping a node failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster config: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen for raft rpc on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot build the raft rpc client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("raft: {0}")]
    Raft(String),
    #[error("the store under {0} did not close within {1:?}")]
    StoreStillOpen(PathBuf, Duration),
    /// This node's store is empty but the cluster knows it held state, or
    /// its cluster id differs from the members'.
    #[error("{0}")]
    Identity(String),
}

/// This node's Raft member stopped for good while the process runs: a
/// write to its store failed (a full disk), or openraft panicked. openraft
/// never restarts its core, so the node's view stops following the
/// cluster: the process should stop serving and exit, so a supervisor
/// restarts it (a restart with the disk still full refuses to start, with
/// the reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fatal {
    /// One of [`FATAL_REASONS`].
    pub reason: &'static str,
    /// What failed, for the log and the exit message.
    pub cause: String,
}

/// The reasons of [`Fatal`]: `no_space` (the filesystem under the data
/// directory is full), `storage` (another store failure), `panicked`.
pub const FATAL_REASONS: [&str; 3] = ["no_space", "storage", "panicked"];

/// One member as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub member: Member,
    /// Whether the member is in the applied Raft membership yet (learners
    /// join after the cluster forms).
    pub in_membership: bool,
    /// Last log index known replicated to it; only the leader knows.
    pub matched_index: Option<u64>,
}

/// A point-in-time status of this node and the group as it sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node_id: NodeId,
    pub zone: ZoneId,
    pub role: Role,
    pub leader: Option<NodeId>,
    pub leader_admin_addr: Option<String>,
    pub is_leader: bool,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    /// On the leader: ms since a quorum last acknowledged it. `None` on
    /// followers. Automatic decisions are proposed only while this is
    /// below the election timeout (0.9 has no check-quorum).
    pub millis_since_quorum_ack: Option<u64>,
    pub decision_version: u64,
    pub automation: Automation,
    /// Voter ids of the applied Raft membership (voters and witnesses).
    pub voters: Vec<NodeId>,
    /// Every member of the applied membership and of the bootstrap list
    /// (the applied record wins), with its place in the membership.
    pub members: Vec<MemberStatus>,
    /// Where this node's bootstrap list (`[[cluster.members]]`) differs
    /// from the replicated membership, one sentence each; empty when they
    /// agree. After formation the replicated membership is the truth.
    pub bootstrap_differs: Vec<String>,
}

/// A running member of the Raft group. `Send + Sync`: share it behind an
/// `Arc` with the admin API.
pub struct ClusterNode {
    id: NodeId,
    zone: ZoneId,
    role: Role,
    raft: Raft,
    members: Arc<BTreeMap<NodeId, Member>>,
    proposer: Proposer,
    raft_addr: SocketAddr,
    failover: Arc<Failover>,
    data_dir: PathBuf,
    view_rx: watch::Receiver<Arc<ClusterView>>,
    state_rx: watch::Receiver<Arc<ClusterState>>,
    stop_tx: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    liveness: StoreLiveness,
    identity: Arc<Identity>,
    network: Network,
    leader_contact: Arc<Mutex<Option<std::time::Instant>>>,
    election_timeout_max: Duration,
    roster: Roster,
    /// One membership change at a time from this node.
    member_change: tokio::sync::Mutex<()>,
    /// The Raft listener's TLS (reloaded by the node's certificate task).
    raft_tls: Option<Arc<zonegate_net::tls::ServerTls>>,
    raft_max_connections: usize,
    /// Whether this node may campaign (`crate::prevote`).
    campaigns: Campaigns,
    /// `Some` once Raft stopped for good (see [`Fatal`]).
    fatal: watch::Receiver<Option<Fatal>>,
}

/// The most entries in one append RPC.
pub const MAX_PAYLOAD_ENTRIES: u64 = 64;

/// How long `shutdown` waits for the store to close.
const STORE_CLOSE_WAIT: Duration = Duration::from_secs(10);

fn validate(config: &ClusterConfig) -> Result<BTreeMap<NodeId, Member>, ClusterError> {
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

async fn bind(listen: RaftListen) -> Result<tokio::net::TcpListener, ClusterError> {
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

impl ClusterNode {
    /// The Raft listener's counters.
    pub fn raft_listener_stats(&self) -> Arc<Stats> {
        Arc::clone(&RAFT_LISTENER)
    }

    /// The Raft listener's connection budget.
    pub fn raft_max_connections(&self) -> usize {
        self.raft_max_connections
    }

    /// The Raft listener's TLS, when mutual TLS is on.
    pub fn raft_tls(&self) -> Option<Arc<zonegate_net::tls::ServerTls>> {
        self.raft_tls.clone()
    }

    /// Start this member: open the store under `data_dir`, serve Raft RPC,
    /// and join the group. Starting every member forms the cluster; a node
    /// restarted with its `data_dir` resumes where it stopped.
    pub async fn start(config: ClusterConfig) -> Result<ClusterNode, ClusterError> {
        let members = Arc::new(validate(&config)?);
        let ClusterConfig {
            node_id,
            zone,
            data_dir,
            secret,
            raft_listen,
            timing,
            faults,
            rejoin,
            tls,
            limits,
            ..
        } = config;
        let role = members[&node_id].role;
        let listener = bind(raft_listen).await?;
        let raft_addr = listener
            .local_addr()
            .map_err(|source| ClusterError::Listen {
                addr: "raft listener".into(),
                source,
            })?;

        let (log_store, sm_store, liveness, identities) = store::open_with_identity(&data_dir)?;
        let identity = Arc::new(Identity::new(node_id, identities)?);
        let view_rx = sm_store.subscribe_view();
        let state_rx = sm_store.subscribe_state();
        let keys = KeyRing::derive(&secret, Purpose::Raft)
            .map_err(|e| ClusterError::InvalidConfig(format!("cluster secret: {e}")))?;
        let member_tls = tls.clone().map(|files| MemberTls { files });
        let network = Network::new(
            node_id,
            Arc::new(keys.clone()),
            member_tls,
            timing.election_timeout_min,
            faults,
        )?
        .with_identity(identity.clone());
        let pristine = check_identity(&network, &identity, &members, node_id, rejoin).await?;
        let raft_config = Arc::new(raft_config(&timing)?);
        let raft = Raft::new(node_id, raft_config, network.clone(), log_store, sm_store)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;

        let (stop_tx, stop_rx) = watch::channel(false);
        let failover = Arc::new(Failover::new(node_id, FailoverConfig::default()));
        let roster = Roster::new(members.clone(), raft.metrics());
        let server_tls = tls
            .map(|files| zonegate_net::tls::ServerTls::load(files, &[b"http/1.1"]))
            .transpose()
            .map_err(|e| ClusterError::InvalidConfig(format!("cluster.tls: {e}")))?;
        let listen_config = ListenConfig {
            name: "raft",
            tls: server_tls.clone(),
            limits,
            stats: Arc::clone(&RAFT_LISTENER),
            peer: true,
        };
        let service = RaftService::new(
            raft.clone(),
            node_id,
            keys,
            roster.clone(),
            server_tls.is_some(),
            limits.body_read_timeout,
        )
        .with_failover(failover.clone())
        .with_identity(identity.clone())
        .with_prevote_window(timing.election_timeout_max);
        let leader_contact = service.leader_contact();
        let app = server::router(Arc::new(service));
        let proposer = Proposer {
            raft: raft.clone(),
            propose_timeout: timing.propose_timeout,
            election_timeout_max: timing.election_timeout_max,
            members: roster.clone(),
            state_rx: state_rx.clone(),
        };
        let reporter = ReportLoop {
            failover: failover.clone(),
            sender: ReportClient {
                net: network.clone(),
                members: roster.clone(),
            },
            metrics: raft.metrics(),
            zone: zone.clone(),
            stop: stop_rx.clone(),
        };
        let leader_loop = LeadLoop {
            failover: failover.clone(),
            proposer: proposer.clone(),
            metrics: raft.metrics(),
            election_timeout_max: timing.election_timeout_max,
            state_rx: state_rx.clone(),
            stop: stop_rx.clone(),
        };
        // openraft's own election timer is off (`raft_config`): this
        // drives elections, each after a pre-vote round. A rejoining node
        // (a learner until promoted) neither campaigns nor votes.
        let campaigns = Campaigns::allowed();
        let elections = crate::prevote::Driver {
            raft: raft.clone(),
            network: network.clone(),
            roster: roster.clone(),
            identity: identity.clone(),
            me: node_id,
            heartbeat: timing.heartbeat,
            election_timeout_min: timing.election_timeout_min,
            election_timeout_max: timing.election_timeout_max,
            contact: leader_contact.clone(),
            campaigns: campaigns.clone(),
            stop: stop_rx.clone(),
        };
        let (fatal_tx, fatal) = watch::channel(None);
        let tasks = vec![
            tokio::spawn(watch_fatal(
                raft.metrics(),
                liveness.clone(),
                fatal_tx,
                stop_rx.clone(),
            )),
            tokio::spawn(listen::serve(listener, app, listen_config, stop_rx.clone())),
            tokio::spawn(reporter.run()),
            tokio::spawn(leader_loop.run()),
            tokio::spawn(crate::prevote::run(elections)),
        ];
        let node = ClusterNode {
            id: node_id,
            zone,
            role,
            raft,
            members,
            proposer,
            raft_addr,
            failover,
            data_dir,
            view_rx,
            state_rx,
            stop_tx,
            tasks: Mutex::new(tasks),
            liveness,
            identity,
            network,
            leader_contact,
            election_timeout_max: timing.election_timeout_max,
            roster,
            member_change: tokio::sync::Mutex::new(()),
            raft_tls: server_tls,
            raft_max_connections: limits.max_connections,
            campaigns,
            fatal,
        };
        node.initialize_if_first(pristine == Pristine::MayForm)
            .await?;
        if node.identity.rejoining() {
            let task = rejoin_loop(
                node.raft.clone(),
                node.identity.clone(),
                node.network.clone(),
                node.members.clone(),
                node_id,
                stop_rx.clone(),
            );
            node.tasks_lock().push(tokio::spawn(task));
        }
        let learners = node.members.values().filter(|m| m.role == Role::Learner);
        let keeper = keep_learners(
            node.raft.clone(),
            node.identity.clone(),
            node_id,
            learners.cloned().collect(),
            stop_rx,
        );
        node.tasks_lock().push(tokio::spawn(keeper));
        tracing::info!(node_id, zone = %node.zone, role = role.name(), %raft_addr, "cluster node started");
        Ok(node)
    }

    /// The lowest-id voting member forms the cluster, once: only while its
    /// store is pristine, and always with the same voter set.
    /// `may_form` is false once members answered with a cluster id: a
    /// node without a store then waits to be contacted, it never forms a
    /// second cluster.
    async fn initialize_if_first(&self, may_form: bool) -> Result<(), ClusterError> {
        let voters: BTreeMap<NodeId, Member> = self
            .members
            .iter()
            .filter(|(_, m)| m.role.votes())
            .map(|(id, m)| (*id, m.clone()))
            .collect();
        if voters.keys().next() != Some(&self.id) {
            return Ok(());
        }
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        if initialized {
            if self.identity.cluster_id().is_none() {
                // A store from before cluster ids: give the cluster one.
                let id = self
                    .identity
                    .form()
                    .await
                    .map_err(|e| ClusterError::Identity(e.to_string()))?;
                tracing::info!(cluster_id = %id, "gave the existing cluster an id");
            }
            return Ok(());
        }
        if !may_form {
            return Ok(());
        }
        let cluster_id = self
            .identity
            .form()
            .await
            .map_err(|e| ClusterError::Identity(e.to_string()))?;
        match self.raft.initialize(voters).await {
            Ok(()) => {
                tracing::info!(node_id = self.id, %cluster_id, "formed the cluster");
                Ok(())
            }
            // Someone already wrote a log here: the cluster exists.
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(ClusterError::Raft(e.to_string())),
        }
    }

    fn tasks_lock(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        lock(&self.tasks)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The cluster id fixed at formation, once this node holds it.
    pub fn cluster_id(&self) -> Option<String> {
        self.identity.cluster_id()
    }

    /// How old this node's view is: on the leader, the time since a quorum
    /// last acknowledged it; elsewhere, since an append from a leader last
    /// arrived. `None` before either happened.
    pub fn view_age(&self) -> Option<Duration> {
        let m = self.raft.metrics().borrow().clone();
        if m.state == ServerState::Leader {
            return m.millis_since_quorum_ack.map(Duration::from_millis);
        }
        lock(&self.leader_contact).map(|t| t.elapsed())
    }

    /// A view older than this is stale: three leader leases without word
    /// from a leader with a quorum.
    pub fn stale_after(&self) -> Duration {
        self.election_timeout_max * 3
    }

    /// Whether this node heard from a leader with a quorum recently.
    pub fn leader_contact(&self) -> bool {
        self.view_age().is_some_and(|a| a <= self.stale_after())
    }

    /// Turns `Some` when this node's Raft member stops for good (see
    /// [`Fatal`]); logged once, with the cause, when it happens.
    pub fn fatal(&self) -> watch::Receiver<Option<Fatal>> {
        self.fatal.clone()
    }

    /// Whether this node is rejoining (a learner until promoted).
    pub fn rejoining(&self) -> bool {
        self.identity.rejoining()
    }

    /// Turns `Some(message)` when this node learns at run time that it lost
    /// its store (a member knows it held the cluster id): the process
    /// should stop with the message, as it would have at start-up.
    pub fn amnesia(&self) -> watch::Receiver<Option<String>> {
        self.identity.amnesia()
    }

    pub fn zone(&self) -> &ZoneId {
        &self.zone
    }

    /// The address the Raft RPC server is bound to.
    pub fn raft_addr(&self) -> SocketAddr {
        self.raft_addr
    }

    /// The latest applied view; a new `Arc` is sent after every applied
    /// entry. The data plane reads `borrow().clone()` per request.
    pub fn view(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view_rx.clone()
    }

    /// The full applied state (history included), as last applied here.
    pub fn state_snapshot(&self) -> Arc<ClusterState> {
        self.state_rx.borrow().clone()
    }

    /// The most recent `limit` applied decisions, newest first.
    pub fn decisions(&self, limit: usize) -> Vec<DecisionRecord> {
        self.state_rx.borrow().decisions(limit)
    }

    /// What `cmd` would do against this node's applied state (`--dry-run`),
    /// or why it would be refused (a bound of [`Command::validate`] or a
    /// safety rule). Advisory: the leader's apply is the authority.
    pub fn dry_run(&self, cmd: &Command) -> Result<Preview, Rejection> {
        cmd.validate()?;
        self.state_rx.borrow().check(cmd)
    }

    /// What `cmd` would do against everything committed so far: checked on
    /// the leader after a linearizable read, so a dry run never answers
    /// from a lagging applied state (a follower, or a node that has not
    /// applied the formation entry yet, knows no zones). On a follower this
    /// is `NotLeader` with the leader to forward to, like a write.
    pub async fn preview(&self, cmd: &Command) -> Result<Preview, ProposeError> {
        cmd.validate()?;
        self.proposer.check_quorum().await?;
        self.proposer.preview(cmd).await
    }

    /// Propose a decision. Only the leader can; others answer `NotLeader`
    /// with the leader to forward to. The leader stamps `at_ms` with its
    /// wall clock. `Ok` means committed and applied as that version.
    /// A command over its bounds ([`Command::validate`]) or one the safety
    /// rules refuse against everything committed so far is answered
    /// `Rejected` without entering the log.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, ProposeError> {
        self.proposer.propose(cmd).await
    }

    /// Use `config` for this node's reporter and detector from the next
    /// period on. Limits for automatic decisions travel in each command,
    /// so nodes with different settings still apply identically.
    pub fn set_failover_config(&self, config: FailoverConfig) -> Result<(), FailoverConfigError> {
        config.validate()?;
        self.failover.set_config(config);
        Ok(())
    }

    /// The failover settings in use.
    pub fn failover_config(&self) -> FailoverConfig {
        self.failover.config()
    }

    /// Where this node's per-period zone observations come from. Until one
    /// is set the node reports empty periods (alive, no evidence), and
    /// silence alone never fails a zone over without evidence.
    pub fn set_observation_source(&self, source: ObservationSource) {
        self.failover.set_source(source);
    }

    /// Tenants with traffic on any node since `since_ms`, as this node
    /// heard while leading (the config rule on removed tenant keys).
    pub fn tenants_seen_since(&self, since_ms: u64) -> Vec<String> {
        self.failover.tenants_seen_since(since_ms)
    }

    /// Where this node's per-period tenant demand comes from (for the
    /// leader's quota rebalance). Until one is set the node reports none.
    pub fn set_demand_source(&self, source: crate::failover::DemandSource) {
        self.failover.set_demand_source(source);
    }

    /// The quota rebalance's inputs (tenants' quotas, serving nodes,
    /// `[quotas]` knobs); the leader rebalances only once they are set.
    pub fn set_rebalance_plan(&self, plan: crate::quota::RebalancePlan) {
        self.failover.set_rebalance_plan(plan);
    }

    /// The tenants' budgets for the leader's split, and where the leader
    /// hands the spend in reports (`crate::budget`).
    pub fn set_budgets(&self, plan: crate::budget::BudgetPlan, sink: crate::failover::SpendSink) {
        self.failover.set_budgets(plan, sink);
    }

    /// Per-zone health: on the leader, its latest assessment; on a
    /// follower, the leader's latest assessment as returned for this node's
    /// last report (at most about one period old); empty before either.
    pub fn zone_health(&self) -> Vec<ZoneHealth> {
        self.failover.status().zones
    }

    /// The detector's counters and latest assessment (for metrics:
    /// fail-static periods, automatic decisions, detection latency).
    pub fn failover_status(&self) -> FailoverStatus {
        self.failover.status()
    }

    /// Status of this node and of the group as it sees it.
    pub fn status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let state = self.state_snapshot();
        let membership = m.membership_config.membership();
        let in_membership: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        let matched: BTreeMap<NodeId, Option<u64>> = m
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
            .unwrap_or_default();
        // The applied membership is the truth after formation; bootstrap
        // members it does not hold (yet) are listed too.
        let mut records: BTreeMap<NodeId, Member> = (*self.members).clone();
        for (id, member) in membership.nodes() {
            records.insert(*id, member.clone());
        }
        let members = records
            .into_values()
            .map(|member| MemberStatus {
                in_membership: in_membership.contains(&member.id),
                matched_index: matched.get(&member.id).copied().flatten(),
                member,
            })
            .collect();
        let bootstrap_differs = bootstrap_differences(&self.members, membership);
        let is_leader = m.state == ServerState::Leader;
        ClusterStatus {
            node_id: self.id,
            zone: self.zone.clone(),
            role: self.role,
            leader: m.current_leader,
            leader_admin_addr: m
                .current_leader
                .and_then(|l| self.roster.get(l))
                .map(|l| l.admin_addr),
            is_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied_index: m.last_applied.map(|l| l.index),
            millis_since_quorum_ack: if is_leader {
                m.millis_since_quorum_ack
            } else {
                None
            },
            decision_version: state.decision_version(),
            automation: state.automation(),
            voters: membership.voter_ids().collect(),
            members,
            bootstrap_differs,
        }
    }

    /// The applied membership as `ctl members` lists it; matched index
    /// and lag are known only on the leader.
    pub fn members(&self) -> Vec<MemberInfo> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last = m.last_log_index.unwrap_or(0);
        let leader = m.state == ServerState::Leader;
        membership
            .nodes()
            .map(|(id, r)| {
                let matched = if leader && *id == self.id {
                    m.last_log_index
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|rep| rep.get(id).copied().flatten())
                        .map(|l| l.index)
                };
                MemberInfo {
                    id: *id,
                    zone: r.zone.clone(),
                    role: effective_role(r, voters.contains(id)),
                    raft_addr: r.raft_addr.clone(),
                    admin_addr: r.admin_addr.clone(),
                    leader: m.current_leader == Some(*id),
                    matched_index: matched,
                    lag: matched.map(|i| last.saturating_sub(i)),
                }
            })
            .collect()
    }

    /// Change the membership: on the leader only (others answer
    /// `NotLeader` with the leader to forward to), one change at a time,
    /// checked by [`Situation::check`] against a fresh probe of every
    /// member, and carried out by openraft's joint consensus. `Ok` means
    /// every step committed.
    pub async fn change_members(&self, change: MemberChange) -> Result<(), MemberChangeError> {
        let _one = self.member_change.lock().await;
        self.proposer.check_quorum().await?;
        self.proposer.ensure_read().await?;
        let situation = self.situation().await;
        let steps = situation.check(&change)?;
        let kind = change.kind();
        tracing::info!(kind, ?change, "membership change started");
        for step in steps {
            self.run_step(step).await?;
        }
        tracing::info!(kind, "membership change committed");
        Ok(())
    }

    /// What the leader knows right now, members probed in parallel.
    async fn situation(&self) -> Situation {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let nodes: BTreeMap<NodeId, Member> =
            membership.nodes().map(|(id, r)| (*id, r.clone())).collect();
        let lag: BTreeMap<NodeId, Option<u64>> =
            self.members().into_iter().map(|i| (i.id, i.lag)).collect();
        let mut probes = tokio::task::JoinSet::new();
        for (id, r) in nodes.iter().filter(|(id, _)| **id != self.id) {
            let (network, id, addr) = (self.network.clone(), *id, r.raft_addr.clone());
            probes.spawn(async move {
                let answer = network
                    .post_empty(id, &addr, crate::network::PATH_HELLO, HELLO_TIMEOUT)
                    .await;
                (id, matches!(answer, Ok((200, _, _))))
            });
        }
        let mut healthy: BTreeSet<NodeId> = [self.id].into();
        for (id, answered) in probes.join_all().await {
            let caught_up = lag
                .get(&id)
                .copied()
                .flatten()
                .is_some_and(|l| l <= crate::members::PROMOTE_MAX_LAG);
            if answered && caught_up {
                healthy.insert(id);
            }
        }
        Situation {
            voters: membership.voter_ids().collect(),
            joint: membership.get_joint_config().len() > 1,
            healthy,
            lag,
            retired: self.identity.current().joined,
            zones_needing_voter: self
                .members
                .values()
                .filter(|b| b.role.votes())
                .map(|b| b.zone.clone())
                .collect(),
            nodes,
        }
    }

    async fn run_step(&self, step: Step) -> Result<(), MemberChangeError> {
        use openraft::ChangeMembers;
        let raft_err = |e: RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Member>>| {
            use openraft::error::ClientWriteError;
            match e {
                RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                    MemberChangeError::Propose(
                        self.proposer.not_leader_for(f.leader_id, f.leader_node),
                    )
                }
                RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                    MemberChangeError::Refused(MemberRefusal {
                        rule: crate::members::MemberRule::ChangeInProgress,
                        message: e.to_string(),
                    })
                }
                RaftError::Fatal(e) => {
                    MemberChangeError::Propose(ProposeError::Fatal(e.to_string()))
                }
            }
        };
        let timeout = self.proposer.propose_timeout * 2;
        let unknown = |what: String| {
            MemberChangeError::OutcomeUnknown(format!(
                "{what} was submitted but its commit was not confirmed within {timeout:?}"
            ))
        };
        let (what, change) = match step {
            Step::AddLearner(member) => {
                let what = format!("adding learner {}", member.id);
                let added = self.raft.add_learner(member.id, member, false);
                return match tokio::time::timeout(timeout, added).await {
                    Err(_) => Err(unknown(what)),
                    Ok(r) => r.map(|_| ()).map_err(raft_err),
                };
            }
            Step::Promote(id) => {
                self.wait_caught_up(id, timeout).await?;
                (
                    format!("promoting {id}"),
                    ChangeMembers::AddVoterIds([id].into()),
                )
            }
            Step::RemoveVoter(id) => (
                format!("removing voter {id}"),
                ChangeMembers::RemoveVoters([id].into()),
            ),
            Step::RemoveLearner(id) => (
                format!("removing learner {id}"),
                ChangeMembers::RemoveNodes([id].into()),
            ),
            Step::SetNode(member) => (
                format!("re-addressing {}", member.id),
                ChangeMembers::SetNodes([(member.id, member)].into()),
            ),
        };
        match tokio::time::timeout(timeout, self.raft.change_membership(change, false)).await {
            Err(_) => Err(unknown(what)),
            Ok(r) => r.map(|_| ()).map_err(raft_err),
        }
    }

    /// Wait until a learner's matched index is within the promotion lag.
    async fn wait_caught_up(&self, id: NodeId, timeout: Duration) -> Result<(), MemberChangeError> {
        let mut metrics = self.raft.metrics();
        let caught_up = metrics.wait_for(|m| {
            let last = m.last_log_index.unwrap_or(0);
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .is_some_and(|l| last.saturating_sub(l.index) <= crate::members::PROMOTE_MAX_LAG)
        });
        let caught_up = tokio::time::timeout(timeout, caught_up)
            .await
            .is_ok_and(|r| r.is_ok());
        match caught_up {
            true => Ok(()),
            false => Err(MemberChangeError::Refused(MemberRefusal {
                rule: crate::members::MemberRule::LearnerBehind,
                message: format!(
                    "learner {id} did not catch up within {timeout:?}; it stays a learner: promote it once `ctl members` shows it caught up"
                ),
            })),
        }
    }

    /// openraft's metrics, for gauges (term, leader, quorum ack).
    pub fn raft_metrics(&self) -> watch::Receiver<crate::types::alias::RaftMetrics> {
        self.raft.metrics()
    }

    /// A draining leader makes a caught-up voter leader (see
    /// [`crate::handover`]); gives up after twice the election timeout.
    /// This node does not campaign again until it restarts.
    pub async fn hand_over(&self) -> crate::Handover {
        self.campaigns.stop();
        crate::handover::hand_over(
            &self.raft,
            &self.network,
            &self.roster,
            self.id,
            self.election_timeout_max * 2,
        )
        .await
    }

    /// This node stops campaigning (it still votes) until it restarts: a
    /// draining follower must not become leader on its way out.
    pub fn stop_campaigning(&self) {
        self.campaigns.stop();
    }

    /// Stop Raft, the RPC server and background tasks, and wait until the
    /// store is closed (so the same `data_dir` can be reopened).
    pub async fn shutdown(&self) -> Result<(), ClusterError> {
        self.stop_tx.send_replace(true);
        let raft_result = self.raft.shutdown().await;
        self.identity.close();
        let tasks: Vec<JoinHandle<()>> = self.tasks_lock().drain(..).collect();
        for task in tasks {
            // The server drains in-flight RPCs (answered quickly now that
            // Raft is stopped); past the wait it is cut off.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let deadline = tokio::time::Instant::now() + STORE_CLOSE_WAIT;
        while self.liveness.is_open() {
            if tokio::time::Instant::now() > deadline {
                return Err(ClusterError::StoreStillOpen(
                    self.data_dir.clone(),
                    STORE_CLOSE_WAIT,
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        raft_result.map_err(|e| ClusterError::Raft(e.to_string()))?;
        tracing::info!(node_id = self.id, "cluster node stopped");
        Ok(())
    }
}

/// Reports (once) when openraft's core stops on its own: not stopped by
/// [`ClusterNode::shutdown`], but by a failed store write or a panic.
async fn watch_fatal(
    mut metrics: watch::Receiver<crate::types::alias::RaftMetrics>,
    liveness: StoreLiveness,
    fatal: watch::Sender<Option<Fatal>>,
    mut stop: watch::Receiver<bool>,
) {
    let stopped = tokio::select! {
        _ = stop.wait_for(|s| *s) => return,
        m = metrics.wait_for(|m| m.running_state.is_err()) => match m {
            Ok(m) => m.running_state.clone().err(),
            // The core's task ended without saying why: it panicked (a
            // shutdown sets `stop` first, checked below).
            Err(_) => Some(openraft::error::Fatal::Panicked),
        },
    };
    let Some(err) = stopped else { return };
    if matches!(err, openraft::error::Fatal::Stopped) || *stop.borrow() {
        return;
    }
    let failure = liveness.failure();
    let reason = match (&err, &failure) {
        (_, Some(f)) if f.no_space => "no_space",
        (openraft::error::Fatal::Panicked, _) => "panicked",
        _ => "storage",
    };
    let cause = match failure {
        Some(f) => format!("{err} (the first failed write: {})", f.message),
        None => err.to_string(),
    };
    tracing::error!(
        reason,
        %cause,
        "the control plane stopped for good: this node's view no longer follows the cluster"
    );
    fatal.send_replace(Some(Fatal { reason, cause }));
}

/// Where the bootstrap list differs from the applied membership.
fn bootstrap_differences(
    bootstrap: &BTreeMap<NodeId, Member>,
    membership: &openraft::Membership<NodeId, Member>,
) -> Vec<String> {
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let mut out = Vec::new();
    for (id, b) in bootstrap {
        let Some(r) = membership.get_node(id) else {
            out.push(format!(
                "member {id} ({}, {}) is in [[cluster.members]] but not in the replicated membership",
                b.zone,
                b.role.name()
            ));
            continue;
        };
        if b.raft_addr != r.raft_addr || b.admin_addr != r.admin_addr {
            out.push(format!(
                "member {id}: configured at raft {} admin {}, replicated at raft {} admin {}",
                b.raft_addr, b.admin_addr, r.raft_addr, r.admin_addr
            ));
        }
        let role = effective_role(r, voters.contains(id));
        if role != b.role {
            out.push(format!(
                "member {id}: configured as {}, replicated as {}",
                b.role.name(),
                role.name()
            ));
        }
    }
    for (id, r) in membership.nodes() {
        if !bootstrap.contains_key(id) {
            out.push(format!(
                "member {id} ({}, {}) is in the replicated membership but not in [[cluster.members]]",
                r.zone,
                effective_role(r, voters.contains(id)).name()
            ));
        }
    }
    out
}

/// What the start-up identity check found.
#[derive(Debug, PartialEq, Eq)]
enum Pristine {
    /// No cluster is known yet: the lowest-id voter may form it.
    MayForm,
    /// A cluster exists (this node holds its id, or members answered
    /// with one): never form another.
    Exists,
}

/// The start-up half of the amnesia check (the run-time half is in
/// [`Identity::on_request`]). A node without a store asks every member
/// for its cluster id: if one knows this node held the id, its store was
/// lost, and it starts only with `--rejoin`. A node with a store checks
/// that the members it reaches name the same cluster.
async fn check_identity(
    network: &Network,
    identity: &Identity,
    members: &BTreeMap<NodeId, Member>,
    me: NodeId,
    rejoin: bool,
) -> Result<Pristine, ClusterError> {
    let mut asks = tokio::task::JoinSet::new();
    for m in members.values().filter(|m| m.id != me) {
        let (network, id, addr) = (network.clone(), m.id, m.raft_addr.clone());
        asks.spawn(async move {
            let answer = network
                .post_empty(id, &addr, crate::network::PATH_HELLO, HELLO_TIMEOUT)
                .await;
            (id, answer)
        });
    }
    let answers: Vec<(NodeId, String, BTreeSet<NodeId>)> = asks
        .join_all()
        .await
        .into_iter()
        .filter_map(|(id, a)| match a {
            Ok((200, cluster, joined)) if !cluster.is_empty() => Some((
                id,
                cluster,
                joined.split(',').filter_map(|s| s.parse().ok()).collect(),
            )),
            _ => None,
        })
        .collect();
    if let Some(ours) = identity.cluster_id() {
        if let Some((peer, theirs, _)) = answers.iter().find(|(_, c, _)| *c != ours) {
            return Err(ClusterError::Identity(format!(
                "this node's store belongs to cluster {ours} but member {peer} is in cluster {theirs}: the data_dir is from another cluster. Fix: point node.data_dir at this cluster's store, or move it away and start with `zonegate serve --rejoin`"
            )));
        }
        if rejoin {
            tracing::info!("--rejoin ignored: this node holds its store (cluster {ours})");
        }
        return Ok(Pristine::Exists);
    }
    if rejoin {
        identity
            .set_rejoining(true)
            .await
            .map_err(|e| ClusterError::Identity(e.to_string()))?;
        tracing::info!(
            "rejoining: a learner until caught up, then promoted to its configured role"
        );
        return Ok(Pristine::Exists);
    }
    if let Some((peer, cluster, _)) = answers.iter().find(|(_, _, j)| j.contains(&me)) {
        return Err(ClusterError::Identity(format!(
            "node {me} lost its Raft state: its data_dir holds none, but member {peer} knows it as a member of cluster {cluster} that held Raft state before. Refusing to start with an empty store (acknowledged decisions could be lost). Fix: restore its data_dir if you can; otherwise start it with `zonegate serve --rejoin` (it catches up as a learner and is then promoted to its configured role)"
        )));
    }
    Ok(if answers.is_empty() {
        Pristine::MayForm
    } else {
        Pristine::Exists
    })
}

/// How long the start-up check waits for each member's answer.
const HELLO_TIMEOUT: Duration = Duration::from_millis(500);

/// On a rejoining node: ask the leader, every half second, for the next
/// step (made a learner, then promoted once caught up) until this node
/// is back in its configured role; then it may vote and campaign again.
async fn rejoin_loop(
    raft: Raft,
    identity: Arc<Identity>,
    network: Network,
    members: Arc<BTreeMap<NodeId, Member>>,
    me: NodeId,
    mut stop: watch::Receiver<bool>,
) {
    let configured_votes = members.get(&me).is_some_and(|m| m.role.votes());
    let mut was_learner = false;
    loop {
        let (leader, is_voter, is_learner) = {
            let m = raft.metrics().borrow().clone();
            let membership = m.membership_config.membership();
            let is_voter = membership.voter_ids().any(|id| id == me);
            let is_learner = !is_voter && membership.get_node(&me).is_some();
            (m.current_leader, is_voter, is_learner)
        };
        was_learner |= is_learner;
        let done = if configured_votes {
            was_learner && is_voter
        } else {
            is_learner
        };
        if done {
            if identity.set_rejoining(false).await.is_ok() {
                tracing::info!(node_id = me, "rejoined: back in its configured role");
                return;
            }
        } else if let Some((to, addr)) = leader
            .filter(|l| *l != me)
            .and_then(|l| members.get(&l).map(|m| (l, m.raft_addr.clone())))
        {
            if let Err(e) = network
                .post_empty(to, &addr, crate::network::PATH_REJOIN, HELLO_TIMEOUT)
                .await
            {
                tracing::debug!(error = %e, "rejoin request failed; retrying");
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// openraft's settings from [`Timing`].
fn raft_config(timing: &Timing) -> Result<openraft::Config, ClusterError> {
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

/// The Raft listener's counters (one node per process).
pub static RAFT_LISTENER: std::sync::LazyLock<Arc<Stats>> = std::sync::LazyLock::new(Arc::default);

/// On the leader, add configured learners missing from the membership, one
/// change at a time; retried while any is missing.
async fn keep_learners(
    raft: Raft,
    identity: Arc<Identity>,
    me: NodeId,
    learners: Vec<Member>,
    mut stop: watch::Receiver<bool>,
) {
    if learners.is_empty() {
        return;
    }
    let mut metrics = raft.metrics();
    loop {
        let missing = {
            let m = metrics.borrow_and_update();
            let leading = m.state == ServerState::Leader && m.current_leader == Some(me);
            // A learner that held the cluster's state and is missing was
            // removed by an operator (`ctl members remove`): not re-added.
            let joined = identity.current().joined;
            leading
                .then(|| {
                    learners
                        .iter()
                        .filter(|l| !joined.contains(&l.id))
                        .find(|l| m.membership_config.membership().get_node(&l.id).is_none())
                        .cloned()
                })
                .flatten()
        };
        if let Some(learner) = missing {
            match raft.add_learner(learner.id, learner.clone(), false).await {
                Ok(_) => {
                    tracing::info!(learner = learner.id, zone = %learner.zone, "learner added");
                    continue;
                }
                Err(e) => {
                    // E.g. another membership change in progress: retry
                    // after a pause rather than spin.
                    tracing::debug!(learner = learner.id, error = %e, "adding learner failed");
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn node_and_errors_can_be_shared_across_tasks() {
        assert_send_sync::<ClusterNode>();
        assert_send_sync::<ProposeError>();
        assert_send_sync::<ClusterError>();
    }

    #[test]
    fn config_debug_does_not_print_the_secret() {
        let config = ClusterConfig {
            node_id: 1,
            zone: ZoneId::new("az-a"),
            members: Vec::new(),
            data_dir: PathBuf::from("/tmp/x"),
            secret: "hunter2".into(),
            raft_listen: RaftListen::Addr(SocketAddr::from(([127, 0, 0, 1], 0))),
            timing: Timing::default(),
            faults: None,
            rejoin: false,
            tls: None,
            limits: zonegate_net::listen::Limits::with_max(16),
        };
        let printed = format!("{config:?}");
        assert!(!printed.contains("hunter2"));
        assert!(printed.contains("<redacted>"));
    }

    /// The bytes of an append batch of `MAX_PAYLOAD_ENTRIES` copies of
    /// `largest`, with the largest ids.
    fn full_batch(largest: Command) -> Vec<u8> {
        use crate::types::alias::{AppendEntriesRequest, Entry};
        let log_id = |i| openraft::LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 1), i);
        let request = AppendEntriesRequest {
            vote: openraft::Vote::new_committed(u64::MAX, 1),
            prev_log_id: Some(log_id(u64::MAX - 100)),
            entries: (0..MAX_PAYLOAD_ENTRIES)
                .map(|i| Entry {
                    log_id: log_id(u64::MAX - 64 + i),
                    payload: openraft::EntryPayload::Normal(largest.clone()),
                })
                .collect(),
            leader_commit: Some(log_id(u64::MAX - 1)),
        };
        crate::codec::encode(&request).unwrap()
    }

    #[test]
    fn a_full_append_batch_of_the_largest_valid_entries_decodes_within_its_limit() {
        use crate::codec::{self, limits};
        use crate::command::{
            AutoLimits, Decision, MAX_ACTOR_BYTES, MAX_EVIDENCE_BYTES, MAX_REASON_BYTES,
            MAX_ZONE_BYTES,
        };
        use crate::types::alias::AppendEntriesRequest;
        let zone = |c: &str| ZoneId::new(&c.repeat(MAX_ZONE_BYTES));
        let largest = Command::automatic(
            Decision::Failover {
                from: zone("a"),
                to: zone("b"),
            },
            "x".repeat(MAX_ACTOR_BYTES),
            "y".repeat(MAX_REASON_BYTES),
            AutoLimits::default(),
        )
        .if_version(u64::MAX)
        .with_evidence("z".repeat(MAX_EVIDENCE_BYTES))
        .stamped(u64::MAX);
        assert_eq!(largest.validate(), Ok(()));
        let bytes = full_batch(largest);
        // Far below the limit, so the body limit and timeouts never bite.
        assert!(bytes.len() * 16 < limits::APPEND, "{} bytes", bytes.len());
        let back: AppendEntriesRequest = codec::decode(&bytes).unwrap();
        assert_eq!(back.entries.len(), MAX_PAYLOAD_ENTRIES as usize);
    }

    #[test]
    fn a_full_append_batch_of_the_largest_configs_decodes_within_its_limit() {
        use crate::codec::{self, limits};
        use crate::command::{Decision, MAX_ACTOR_BYTES, MAX_CONFIG_BYTES, MAX_REASON_BYTES};
        use crate::types::alias::AppendEntriesRequest;
        let largest = Command::decide(
            Decision::Config {
                config_version: u64::MAX,
                toml: "t".repeat(MAX_CONFIG_BYTES).into(),
            },
            "x".repeat(MAX_ACTOR_BYTES),
            "y".repeat(MAX_REASON_BYTES),
        )
        .if_version(u64::MAX)
        .stamped(u64::MAX);
        assert_eq!(largest.validate(), Ok(()));
        let bytes = full_batch(largest);
        assert!(bytes.len() < limits::APPEND, "{} bytes", bytes.len());
        let back: AppendEntriesRequest = codec::decode(&bytes).unwrap();
        assert_eq!(back.entries.len(), MAX_PAYLOAD_ENTRIES as usize);
    }

    #[test]
    fn default_timing_fits_the_two_second_failover_budget() {
        let t = Timing::default();
        // Lease (= max) + the slowest random timeout + one tick of 1.5 x
        // heartbeat: the latest a follower starts campaigning.
        let worst = t.election_timeout_max * 2 + t.heartbeat * 3 / 2;
        assert!(worst < Duration::from_secs(2), "{worst:?}");
        assert!(t.heartbeat * 5 <= t.election_timeout_min + t.election_timeout_max);
    }
}
