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

use crate::command::{Command, Rejection};
use crate::detect::{FailoverConfig, FailoverConfigError, ZoneHealth};
use crate::failover::{Failover, FailoverStatus, LeadLoop, ObservationSource, ReportLoop};
use crate::identity::Identity;
use crate::lock::lock;
use crate::members::{effective_role, MemberChange, MemberInfo, MemberRefusal, Situation, Step};
use crate::network::server::{self, RaftService};
use crate::network::{Network, ReportClient};
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

mod config;
mod join;

use config::{bind, raft_config, validate};
pub use config::{ClusterConfig, RaftListen, Timing, MAX_PAYLOAD_ENTRIES};
use join::{check_identity, keep_learners, rejoin_loop, Pristine, HELLO_TIMEOUT};

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
    leader_contact: Arc<Mutex<Option<tokio::time::Instant>>>,
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

/// How long `shutdown` waits for the store to close.
const STORE_CLOSE_WAIT: Duration = Duration::from_secs(10);

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
        let log_reader = Arc::new(log_store.clone());
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
        .with_prevote_window(timing.election_timeout_max)
        .with_log(Arc::downgrade(&log_reader));
        let leader_contact = service.leader_contact();
        let app = server::router(Arc::new(service));
        #[cfg(feature = "sim")]
        if let Some(net) = crate::sim::net() {
            net.serve(node_id, app.clone());
        }
        let proposer = Proposer {
            raft: raft.clone(),
            propose_timeout: timing.propose_timeout,
            election_timeout_max: timing.election_timeout_max,
            members: roster.clone(),
            state_rx: state_rx.clone(),
            append_order: Arc::default(),
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
            log: log_reader,
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
            Step::RemoveVoter(id) => {
                // Removing without `retain` drops every voter the new
                // config leaves out: atop another change's joint config
                // (a rejoin's), that member too. Refused then, as at the
                // start of the change.
                let joint = self
                    .raft
                    .metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .get_joint_config()
                    .len()
                    > 1;
                if joint {
                    return Err(MemberChangeError::Refused(MemberRefusal {
                        rule: crate::members::MemberRule::ChangeInProgress,
                        message:
                            "another membership change is still being committed; retry shortly"
                                .into(),
                    }));
                }
                (
                    format!("removing voter {id}"),
                    ChangeMembers::RemoveVoters([id].into()),
                )
            }
            Step::RemoveLearner(id) => (
                format!("removing learner {id}"),
                ChangeMembers::RemoveNodes([id].into()),
            ),
            Step::SetNode(member) => (
                format!("re-addressing {}", member.id),
                ChangeMembers::SetNodes([(member.id, member)].into()),
            ),
        };
        // Only a removed voter leaves the membership: any other step keeps
        // every voter the new config leaves out as a learner (`retain`).
        // A step may land on another change's joint config: a member's
        // rejoin runs its own changes (`network::server`), and with
        // `retain` off, promoting a voter atop the joint config of a
        // rejoiner's demotion dropped the rejoiner from the membership for
        // good (the simulation's seed 2001565: node 2 rejoined forever).
        let retain = !matches!(change, ChangeMembers::RemoveVoters(_));
        match tokio::time::timeout(timeout, self.raft.change_membership(change, retain)).await {
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

/// The Raft listener's counters (one node per process).
pub static RAFT_LISTENER: std::sync::LazyLock<Arc<Stats>> = std::sync::LazyLock::new(Arc::default);

#[cfg(test)]
mod tests;
