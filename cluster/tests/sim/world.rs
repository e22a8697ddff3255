//! One simulated run from one seed: the real `ClusterNode`s (openraft, the
//! state machine, the sled store in a per-run temp dir, reporters and the
//! detector) on one current-thread runtime with tokio's paused clock, the
//! simulated network, a client, and faults drawn from the seed. Then the
//! faults heal, the run waits for convergence and hands its history to
//! the checker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use zonegate_cluster::quota::{allocate, Limits as Quota, Priority, RebalancePlan, TenantQuota};
use zonegate_cluster::{
    sim, ClusterConfig, ClusterNode, Command, Decision, FailoverConfig, Member, MemberChange,
    NodeId, Origin, ProposeError, RaftListen, Role, TenantDemand, Timing, ZoneId, ZoneObservation,
    HISTORY_LIMIT,
};

use super::check::{self, Ack, Entry, History, QuotaSeen, Violation};
use super::net::SimNet;
use super::rng::Rng;

/// What one run does.
#[derive(Clone, Debug)]
pub struct Options {
    /// Simulated ms of faults and client operations before the heal.
    pub chaos_ms: u64,
    /// Simulated ms the nodes get to converge after the heal.
    pub converge_bound_ms: u64,
    /// Switch the planted bug on (feature `sim-bug-ack-before-commit`).
    pub bug: bool,
    /// Inject faults (off: the client and membership changes only).
    pub faults: bool,
    /// What the simulation gained after its first version, drawn from
    /// their own stream (off, a seed runs the scenario it ran before):
    /// faults that wipe a member's data directory (restarted with
    /// `--rejoin`) or slow a member's disk down, and in half the runs a
    /// quiet operator (no failovers or failbacks, so the detector's
    /// automatic decisions and the dwell rule get their turn).
    pub extended: bool,
    /// Three voters only, and no member added: the benchmark's layout
    /// (else 3 voters and a learner, or 4 voters, a witness and a
    /// learner, and a voter added during the run).
    pub three_voters: bool,
}

impl Default for Options {
    /// 20 simulated seconds of faults. `ZONEGATE_SIM_BENCH=1`: the
    /// benchmark's scenario instead, 3 voters and 60 simulated seconds.
    fn default() -> Self {
        let bench = std::env::var_os("ZONEGATE_SIM_BENCH").is_some();
        Self {
            chaos_ms: if bench { 60_000 } else { 20_000 },
            converge_bound_ms: 30_000,
            bug: false,
            faults: std::env::var_os("ZONEGATE_SIM_NO_FAULTS").is_none(),
            extended: true,
            three_voters: bench,
        }
    }
}

impl Options {
    /// The faults of the simulation's first version: no wiped members, no
    /// slow disks (the seeds found then replay their scenario).
    pub fn classic() -> Self {
        Self {
            extended: false,
            ..Self::default()
        }
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub layout: &'static str,
    pub violations: Vec<Violation>,
    pub converged_ms: Option<u64>,
    pub ops: u64,
    pub acked: usize,
    pub faults: Vec<String>,
    pub messages: u64,
    /// `(term, node)` of every leadership seen, in order.
    pub leaders: Vec<(u64, NodeId)>,
    /// How the client's operations were answered, by kind.
    pub outcomes: BTreeMap<String, u64>,
    /// Committed automatic decisions that changed a zone (the dwell
    /// rule's cases), and committed decisions whose stamp was unknown.
    pub auto_zone: usize,
    pub unstamped: usize,
}

impl Report {
    /// A run that panicked: one violation saying why.
    pub fn panicked(seed: u64, what: String) -> Self {
        Self {
            seed,
            layout: "unknown",
            violations: vec![Violation::Panicked(what)],
            converged_ms: None,
            ops: 0,
            acked: 0,
            faults: Vec::new(),
            messages: 0,
            leaders: Vec::new(),
            outcomes: BTreeMap::new(),
            auto_zone: 0,
            unstamped: 0,
        }
    }
}

const SECRET: &str = "sim-cluster-secret";
const TENANT: &str = "t1";
const ZONES: [&str; 3] = ["az-a", "az-b", "az-c"];
/// The wall clock at the start of every run (2026-01-01), plus up to a day
/// from the seed.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// The automatic decisions' dwell (`[failover] dwell`).
const DWELL_MS: u64 = 10_000;

/// Run seed `seed` to the end on a fresh runtime; never panics on a
/// violation (the caller decides).
pub fn run(seed: u64, opts: &Options) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = rt.block_on(run_async(seed, opts.clone()));
    sim::uninstall();
    drop(rt);
    report
}

struct Slot {
    member: Member,
    /// Its `[[cluster.members]]`: the original members, plus itself when
    /// it joined later.
    bootstrap: Vec<Member>,
    node: Option<Arc<ClusterNode>>,
    incarnation: u32,
    restart_at: Option<tokio::time::Instant>,
    /// Start with `--rejoin` (its data directory was wiped once; the flag
    /// is ignored while the store holds the cluster).
    rejoin: bool,
}

struct World {
    net: Arc<SimNet>,
    members: Vec<Member>,
    slots: BTreeMap<NodeId, Slot>,
    dir: PathBuf,
    history: Arc<Mutex<History>>,
    zone_bad: Arc<Mutex<BTreeSet<ZoneId>>>,
    demand: Arc<Mutex<BTreeMap<NodeId, u64>>>,
    tenant: TenantQuota,
    serving: Vec<(NodeId, ZoneId)>,
    rng: Rng,
    faults: Vec<String>,
    ops: u64,
    /// Membership changes draw from their own stream, so adding them left
    /// the other draws of a seed as they were.
    member_rng: Rng,
    /// How the client's operations were answered, by kind.
    outcomes: Arc<Mutex<BTreeMap<String, u64>>>,
    /// When the current link faults and weather end (each lasts 0.5–4 s).
    calm_at: Option<tokio::time::Instant>,
    /// Clock jumps to undo, and when.
    unjump: Vec<(tokio::time::Instant, NodeId)>,
    /// Wiped members and slow disks draw from their own stream.
    disk_rng: Rng,
    /// Slow disks to make fast again, and when.
    unslow: Vec<(tokio::time::Instant, NodeId)>,
    /// The operator leaves zones to the detector: its failovers and
    /// failbacks are unfreezes instead.
    quiet: bool,
    opts: Options,
    /// The run's start, for the leaderships' report times.
    origin: tokio::time::Instant,
}

/// The id of the member the operator adds during a run.
const JOINER: NodeId = 100;

fn z(name: &str) -> ZoneId {
    ZoneId::new(name)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where run directories go: memory-backed when the machine has it, so
/// the store's flushes cost no disk.
fn scratch() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

async fn run_async(seed: u64, opts: Options) -> Report {
    let mut rng = Rng::new(seed);
    let net = SimNet::new(seed);
    sim::install(net.clone(), seed, EPOCH_MS + rng.below(86_400_000));
    sim::plant_bug(opts.bug);
    let three = rng.chance(70);
    let (layout, roles): (&'static str, Vec<(&str, Role)>) = if opts.three_voters {
        (
            "3 voters",
            vec![
                (ZONES[0], Role::Voter),
                (ZONES[1], Role::Voter),
                (ZONES[2], Role::Voter),
            ],
        )
    } else if three {
        (
            "3 voters + learner",
            vec![
                (ZONES[0], Role::Voter),
                (ZONES[1], Role::Voter),
                (ZONES[2], Role::Voter),
                (ZONES[0], Role::Learner),
            ],
        )
    } else {
        (
            "4 voters + witness + learner",
            vec![
                (ZONES[0], Role::Voter),
                (ZONES[1], Role::Voter),
                (ZONES[2], Role::Voter),
                (ZONES[0], Role::Voter),
                (ZONES[1], Role::Witness),
                (ZONES[2], Role::Learner),
            ],
        )
    };
    let members: Vec<Member> = roles
        .iter()
        .enumerate()
        .map(|(i, (zone, role))| {
            let id = i as NodeId + 1;
            Member {
                id,
                zone: z(zone),
                raft_addr: format!("127.0.0.1:{}", 17000 + id),
                admin_addr: format!("127.0.0.1:{}", 18000 + id),
                role: *role,
            }
        })
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("zonegate-sim-")
        .tempdir_in(scratch())
        .expect("a temp dir");
    let serving = members
        .iter()
        .filter(|m| m.role.serves())
        .map(|m| (m.id, m.zone.clone()))
        .collect();
    let mut world = World {
        net: net.clone(),
        slots: members
            .iter()
            .map(|m| {
                let slot = Slot {
                    member: m.clone(),
                    bootstrap: members.clone(),
                    node: None,
                    incarnation: 0,
                    restart_at: None,
                    rejoin: false,
                };
                (m.id, slot)
            })
            .collect(),
        members,
        dir: dir.path().to_path_buf(),
        history: Arc::default(),
        zone_bad: Arc::default(),
        demand: Arc::default(),
        tenant: TenantQuota {
            tenant: TENANT.into(),
            priority: Priority::P1,
            global: Quota {
                rpm: Some(6000),
                tpm: Some(1_000_000),
                concurrency: Some(97),
            },
            shares: ZONES
                .iter()
                .zip([0.5, 0.3, 0.2])
                .map(|(n, s)| (z(n), s))
                .collect(),
        },
        serving,
        rng,
        faults: Vec::new(),
        ops: 0,
        member_rng: Rng::new(seed ^ 0x6D65_6D62_6572_7321),
        outcomes: Arc::default(),
        calm_at: None,
        unjump: Vec::new(),
        disk_rng: Rng::new(seed ^ 0x6469_736B_7321),
        unslow: Vec::new(),
        quiet: false,
        origin: tokio::time::Instant::now(),
        opts: opts.clone(),
    };
    world.quiet = opts.extended && world.disk_rng.chance(50);
    if world.quiet {
        let start = tokio::time::Instant::now();
        world.fault(start, "quiet operator: zones left to the detector".into());
    }
    let ids: Vec<NodeId> = world.slots.keys().copied().collect();
    for id in &ids {
        world.start(*id).await;
    }
    world.chaos(opts.chaos_ms, opts.faults).await;
    let healed = tokio::time::Instant::now();
    world.heal().await;
    let converged = world.converge(opts.converge_bound_ms).await;
    let converged_ms = converged.then(|| millis(healed.elapsed()));
    world.finish().await;
    let mut history = lock(&world.history).clone();
    history.converged_ms = converged_ms;
    history.convergence_bound_ms = opts.converge_bound_ms;
    history.dwell_ms = DWELL_MS;
    let violations = check::check(&history);
    let acked = history.acks.len();
    let committed = check::committed(&history);
    let auto_zone = committed
        .values()
        .filter(|e| e.auto && !e.zones.is_empty())
        .count();
    let unstamped = committed.values().filter(|e| e.stamp_ms.is_none()).count();
    let outcomes = lock(&world.outcomes).clone();
    let history = history;
    drop(dir);
    Report {
        seed,
        layout,
        violations,
        converged_ms,
        ops: world.ops,
        acked,
        faults: world.faults,
        messages: net.delivered(),
        leaders: history.leaders.clone(),
        outcomes,
        auto_zone,
        unstamped,
    }
}

fn now_plus(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(ms)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl World {
    fn fault(&mut self, at: tokio::time::Instant, what: String) {
        self.faults
            .push(format!("{:>6}ms {what}", millis(at.elapsed())));
    }

    fn live(&self) -> Vec<(NodeId, Arc<ClusterNode>)> {
        self.slots
            .iter()
            .filter_map(|(id, s)| s.node.clone().map(|n| (*id, n)))
            .collect()
    }

    fn leader(&self) -> Option<NodeId> {
        self.live().into_iter().find_map(|(id, n)| {
            let m = n.raft_metrics().borrow().clone();
            (m.state == ServerState::Leader).then_some(id)
        })
    }

    async fn start(&mut self, id: NodeId) {
        let slot = self.slots.get_mut(&id).expect("a member");
        slot.incarnation += 1;
        let incarnation = slot.incarnation;
        let member = slot.member.clone();
        let rejoin = slot.rejoin;
        let bootstrap = slot.bootstrap.clone();
        sim::restart(id);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let config = ClusterConfig {
            node_id: id,
            zone: member.zone.clone(),
            members: bootstrap,
            data_dir: self.data_dir(id),
            secret: SECRET.into(),
            tls: None,
            limits: zonegate_net::listen::Limits::with_max(64),
            raft_listen: RaftListen::Listener(listener),
            timing: Timing {
                propose_timeout: Duration::from_secs(3),
                ..Timing::default()
            },
            faults: None,
            rejoin,
        };
        let node = match ClusterNode::start(config).await {
            Ok(n) => Arc::new(n),
            Err(e) => panic!("node {id} did not start: {e}"),
        };
        // The extended runs assess every second (not every 2 s), so the
        // detector fails a zone over and back within a run.
        let period = Duration::from_millis(if self.opts.extended { 1_000 } else { 2_000 });
        let failover = FailoverConfig {
            auto_failback: true,
            dwell: Duration::from_millis(DWELL_MS),
            period,
            ..FailoverConfig::default()
        };
        node.set_failover_config(failover)
            .expect("a valid failover config");
        let bad = self.zone_bad.clone();
        let zones: Vec<ZoneId> = ZONES.iter().map(|n| z(n)).collect();
        // A sick zone scores 0.42 by the classic numbers, above the
        // default cutoff (0.4): the detector never acted on them. The
        // extended runs' sick zones score below it.
        let (error, timeout, gpu) = if self.opts.extended {
            (0.9, 0.6, 0.0)
        } else {
            (0.6, 0.4, 0.1)
        };
        node.set_observation_source(Arc::new(move || {
            let bad = lock(&bad);
            zones
                .iter()
                .map(|zone| {
                    let sick = bad.contains(zone);
                    ZoneObservation {
                        zone: zone.clone(),
                        gw_error_rate: if sick { error } else { 0.0 },
                        timeout_rate: if sick { timeout } else { 0.0 },
                        gpu_health: if sick { gpu } else { 1.0 },
                        requests: 200,
                    }
                })
                .collect()
        }));
        let demand = self.demand.clone();
        node.set_demand_source(Arc::new(move || {
            let offered = lock(&demand).get(&id).copied().unwrap_or(100);
            vec![TenantDemand {
                tenant: TENANT.into(),
                offered,
                admitted: offered,
                spend: Default::default(),
            }]
        }));
        node.set_rebalance_plan(RebalancePlan {
            tenants: vec![self.tenant.clone()],
            nodes: self.serving.clone(),
            node_floor: 0.1,
            drift_threshold: 0.05,
            interval_ms: 2_000,
        });
        self.watch(id, incarnation, &node);
        let slot = self.slots.get_mut(&id).expect("a member");
        slot.node = Some(node);
        slot.restart_at = None;
    }

    /// Record every leadership, every applied version and every quota
    /// table this incarnation of `id` shows.
    fn watch(&self, id: NodeId, incarnation: u32, node: &ClusterNode) {
        let mut metrics = node.raft_metrics();
        let history = self.history.clone();
        let origin = self.origin;
        tokio::spawn(async move {
            let mut last = None;
            loop {
                {
                    let m = metrics.borrow_and_update();
                    if m.state == ServerState::Leader {
                        let term = m.current_term;
                        if last != Some(term) {
                            last = Some(term);
                            let mut h = lock(&history);
                            h.leaders.push((term, id));
                            let at = millis(origin.elapsed());
                            h.leader_ms.entry((term, id)).or_insert(at);
                        }
                    }
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut view = node.view();
        let history = self.history.clone();
        let tenant = self.tenant.clone();
        let serving = self.serving.clone();
        tokio::spawn(async move {
            let mut seen = None;
            loop {
                let v = view.borrow_and_update().clone();
                if seen != Some(v.decision_version) {
                    seen = Some(v.decision_version);
                    let (allocations, _) =
                        allocate(&tenant, &v.zones, &serving, v.quota.get(TENANT));
                    let mut h = lock(&history);
                    h.versions.push((id, incarnation, v.decision_version));
                    for (unit, global) in [
                        ("rpm", tenant.global.rpm),
                        ("tpm", tenant.global.tpm),
                        ("concurrency", tenant.global.concurrency),
                    ] {
                        let Some(global) = global else { continue };
                        let pick = |l: &Quota| match unit {
                            "rpm" => l.rpm,
                            "tpm" => l.tpm,
                            _ => l.concurrency,
                        };
                        let sum = allocations
                            .iter()
                            .filter_map(|a| pick(&a.limits))
                            .fold(0u64, u64::saturating_add);
                        h.quota.push(QuotaSeen {
                            node: id,
                            version: v.decision_version,
                            tenant: TENANT.into(),
                            unit,
                            sum,
                            global,
                        });
                    }
                }
                if view.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    fn data_dir(&self, id: NodeId) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    /// A fault from the extended stream (every 1–5 s): a member's data directory wiped
    /// (crashed, the directory removed, restarted 0.3–3 s later with
    /// `--rejoin`: it rejoins through the leader as a learner and is
    /// promoted back), its disk slow (every flush waits 5–300 ms, for
    /// 1–6 s), or a zone turning sick or well in every node's observations.
    async fn disk_fault(&mut self, start: tokio::time::Instant) {
        let draw = self.disk_rng.below(10);
        if draw >= 5 {
            let Some(zone) = self.disk_rng.pick(&ZONES).map(|n| z(n)) else {
                return;
            };
            let sick = self.disk_rng.chance(50);
            {
                let mut bad = lock(&self.zone_bad);
                if sick {
                    bad.insert(zone.clone());
                } else {
                    bad.remove(&zone);
                }
            }
            self.fault(start, format!("zone {zone} sick: {sick}"));
            return;
        }
        let wipe = draw < 2;
        let members: Vec<NodeId> = self.in_membership().into_iter().collect();
        let Some(&victim) = self.disk_rng.pick(&members) else {
            return;
        };
        let (a, b) = (
            self.disk_rng.between(300, 3_000),
            self.disk_rng.between(5, 300),
        );
        let lasting = self.disk_rng.between(1_000, 6_000);
        if !wipe {
            if self.slots.get(&victim).is_some_and(|s| s.node.is_some()) {
                sim::set_disk_delay(&self.data_dir(victim), Duration::from_millis(b));
                self.unslow.push((now_plus(lasting), victim));
                self.fault(
                    start,
                    format!("disk of node {victim} slow: {b}ms per flush for {lasting}ms"),
                );
            }
            return;
        }
        // One member away at a time: none down, none still rejoining, and
        // the last rejoin's repair complete on every member (see
        // `World::membership_whole`).
        let live = self.live();
        if live.len() < self.slots.len()
            || live.iter().any(|(_, n)| n.rejoining())
            || !self.membership_whole()
        {
            return;
        }
        self.fault(
            start,
            format!("wipe node {victim}'s data directory, restart with --rejoin in {a}ms"),
        );
        self.crash(victim).await;
        let dir = self.data_dir(victim);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            panic!("cannot wipe {}: {e}", dir.display());
        }
        let slot = self.slots.get_mut(&victim).expect("a member");
        slot.rejoin = true;
        slot.restart_at = Some(now_plus(a));
        let next = slot.incarnation + 1;
        lock(&self.history).wiped.insert((victim, next));
    }

    /// A crash: the node falls silent at once (no process answers, it sends
    /// nothing), then its tasks and store stop. The store made every entry
    /// durable before acknowledging it, so this is what a killed process
    /// leaves behind (a power loss is not simulated).
    async fn crash(&mut self, id: NodeId) {
        let Some(node) = self.slots.get_mut(&id).and_then(|s| s.node.take()) else {
            return;
        };
        self.net.set_down(id, true);
        for other in self.slots.keys() {
            self.net.cut(id, *other);
        }
        if let Err(e) = node.shutdown().await {
            panic!("node {id} did not stop: {e}");
        }
        wait_for_store_lock(&self.data_dir(id));
    }

    async fn chaos(&mut self, chaos_ms: u64, faults: bool) {
        let start = tokio::time::Instant::now();
        let end = start + Duration::from_millis(chaos_ms);
        let mut next_fault = start + Duration::from_millis(self.rng.between(500, 2_000));
        let mut next_op = start + Duration::from_millis(self.rng.between(500, 1_000));
        let mut next_member = start + Duration::from_millis(self.member_rng.between(1_000, 6_000));
        let disk_faults = faults && self.opts.extended;
        let mut next_disk = start + Duration::from_millis(self.disk_rng.between(1_000, 5_000));
        loop {
            let now = tokio::time::Instant::now();
            if now >= end {
                return;
            }
            let restarts: Vec<NodeId> = self
                .slots
                .iter()
                .filter(|(_, s)| s.restart_at.is_some_and(|t| t <= now))
                .map(|(id, _)| *id)
                .collect();
            for id in restarts {
                self.fault(start, format!("restart node {id}"));
                self.reconnect(id);
                self.start(id).await;
            }
            if self.calm_at.is_some_and(|t| t <= now) {
                self.calm_at = None;
                self.calm_links();
                self.fault(start, "links and weather calm".into());
            }
            let jumps: Vec<NodeId> = self
                .unjump
                .iter()
                .filter(|(t, _)| *t <= now)
                .map(|(_, n)| *n)
                .collect();
            self.unjump.retain(|(t, _)| *t > now);
            for node in jumps {
                sim::set_skew(node, 0);
                self.fault(start, format!("clock of node {node} set right"));
            }
            let fast: Vec<NodeId> = self
                .unslow
                .iter()
                .filter(|(t, _)| *t <= now)
                .map(|(_, n)| *n)
                .collect();
            self.unslow.retain(|(t, _)| *t > now);
            for node in fast {
                sim::set_disk_delay(&self.data_dir(node), Duration::ZERO);
                self.fault(start, format!("disk of node {node} fast again"));
            }
            if disk_faults && now >= next_disk {
                self.disk_fault(start).await;
                next_disk = now + Duration::from_millis(self.disk_rng.between(1_000, 5_000));
            }
            if now >= next_fault {
                if faults {
                    self.inject(start).await;
                }
                next_fault = now + Duration::from_millis(self.rng.between(300, 2_500));
            }
            if now >= next_member {
                self.membership(start).await;
                next_member = now + Duration::from_millis(self.member_rng.between(1_000, 6_000));
            }
            if now >= next_op {
                // Operators act concurrently now and then: a burst of two
                // or three operations at once.
                let burst = if self.rng.chance(30) {
                    self.rng.between(2, 3)
                } else {
                    1
                };
                for _ in 0..burst {
                    self.client_op();
                }
                next_op = now + Duration::from_millis(self.rng.between(50, 700));
            }
            let wake = self
                .slots
                .values()
                .filter_map(|s| s.restart_at)
                .chain(self.calm_at)
                .chain(self.unjump.iter().map(|(t, _)| *t))
                .chain(self.unslow.iter().map(|(t, _)| *t))
                .chain(disk_faults.then_some(next_disk))
                .chain([next_fault, next_op, next_member, end])
                .min()
                .unwrap_or(end);
            tokio::time::sleep_until(wake).await;
        }
    }

    /// End the link faults and the weather; a down node's own links stay
    /// cut until it restarts.
    fn calm_links(&self) {
        self.net.heal();
        for (id, slot) in &self.slots {
            if slot.node.is_none() {
                for o in self.slots.keys() {
                    self.net.cut(*id, *o);
                }
            }
        }
    }

    /// Restore the links of a node that comes back (the rest of the
    /// partition stays as it was).
    fn reconnect(&self, id: NodeId) {
        self.net.set_down(id, false);
    }

    async fn inject(&mut self, start: tokio::time::Instant) {
        if self.calm_at.is_none() {
            self.calm_at = Some(now_plus(self.rng.between(500, 4_000)));
        }
        let ids: Vec<NodeId> = self.slots.keys().copied().collect();
        let voters: Vec<NodeId> = self
            .members
            .iter()
            .filter(|m| m.role.votes())
            .map(|m| m.id)
            .collect();
        match self.rng.below(10) {
            0 | 1 => {
                let mut a = Vec::new();
                let mut b = Vec::new();
                for id in &ids {
                    if self.rng.chance(50) {
                        a.push(*id);
                    } else {
                        b.push(*id);
                    }
                }
                self.net.partition(&a, &b);
                self.fault(start, format!("partition {a:?} | {b:?}"));
            }
            2 => {
                if let Some(l) = self.leader() {
                    let others: Vec<NodeId> = ids.iter().copied().filter(|i| *i != l).collect();
                    self.net.partition(&[l], &others);
                    self.fault(start, format!("isolate leader {l}"));
                }
            }
            3 => {
                let from = self.leader().or_else(|| self.rng.pick(&ids).copied());
                if let Some(from) = from {
                    if self.rng.chance(50) {
                        for to in ids.iter().filter(|i| **i != from) {
                            self.net.cut(from, *to);
                        }
                        self.fault(start, format!("one-way: {from} -> all cut"));
                    } else {
                        for to in ids.iter().filter(|i| **i != from) {
                            self.net.cut(*to, from);
                        }
                        self.fault(start, format!("one-way: all -> {from} cut"));
                    }
                }
            }
            4 => {
                self.calm_links();
                self.fault(start, "heal links".into());
            }
            5 | 6 => {
                let down: Vec<NodeId> = self
                    .slots
                    .iter()
                    .filter(|(_, s)| s.node.is_none())
                    .map(|(i, _)| *i)
                    .collect();
                // A rejoining member does not vote until promoted again.
                let rejoining = self
                    .live()
                    .into_iter()
                    .filter(|(_, n)| n.rejoining())
                    .map(|(i, _)| i);
                let down_voters = down
                    .iter()
                    .copied()
                    .chain(rejoining)
                    .filter(|i| voters.contains(i))
                    .count();
                let victim = if self.rng.chance(40) {
                    self.leader()
                } else {
                    self.rng.pick(&ids).copied()
                };
                let Some(victim) = victim.filter(|v| !down.contains(v)) else {
                    return;
                };
                if voters.contains(&victim) && (down_voters + 1) * 2 >= voters.len() {
                    return;
                }
                let back = self.rng.between(300, 5_000);
                self.fault(start, format!("crash node {victim}, restart in {back}ms"));
                self.crash(victim).await;
                if let Some(s) = self.slots.get_mut(&victim) {
                    s.restart_at = Some(tokio::time::Instant::now() + Duration::from_millis(back));
                }
            }
            7 => {
                let Some(&node) = self.rng.pick(&ids) else {
                    return;
                };
                let skew = if self.rng.chance(70) {
                    self.rng.below(4_000) as i64 - 2_000
                } else {
                    self.rng.below(240_000) as i64 - 120_000
                };
                sim::set_skew(node, skew);
                if skew.unsigned_abs() > 2_000 {
                    let back = self.rng.between(1_000, 5_000);
                    self.unjump.push((now_plus(back), node));
                }
                self.fault(start, format!("clock of node {node} set {skew:+}ms off"));
            }
            8 => {
                let loss = self.rng.below(150_000);
                let base = self.rng.below(30);
                let jitter = self.rng.below(150);
                self.net.set_weather(loss, base, jitter);
                self.fault(
                    start,
                    format!("weather: loss {}%, delay {base}+{jitter}ms", loss / 10_000),
                );
            }
            _ => {
                let Some(zone) = self.rng.pick(&ZONES).map(|n| z(n)) else {
                    return;
                };
                let sick = self.rng.chance(50);
                {
                    let mut bad = lock(&self.zone_bad);
                    if sick {
                        bad.insert(zone.clone());
                    } else {
                        bad.remove(&zone);
                    }
                }
                for (id, _) in self.serving.clone() {
                    let d = self.rng.between(0, 500);
                    lock(&self.demand).insert(id, d);
                }
                self.fault(start, format!("zone {zone} sick: {sick}; demand redrawn"));
            }
        }
    }

    /// One client operation, in its own task: a decision (sometimes a
    /// compare-and-set against the version a random node shows), a config,
    /// or a membership change, sent to a random live node and forwarded
    /// once to the leader it names.
    fn client_op(&mut self) {
        let live = self.live();
        let Some((_, node)) = self.rng.pick(&live).cloned() else {
            return;
        };
        self.ops += 1;
        let reason = format!("op-{}", self.ops);
        let zones: Vec<ZoneId> = ZONES.iter().map(|n| z(n)).collect();
        let a = zones[self.rng.below(3) as usize].clone();
        let b = zones[self.rng.below(3) as usize].clone();
        let seen = node.view().borrow().clone();
        let history = self.history.clone();
        let nodes: BTreeMap<NodeId, Arc<ClusterNode>> = live.into_iter().collect();
        let kind = self.rng.below(20);
        if kind <= 2 {
            let config_version = seen.config_version() + 1;
            let toml = format!("# sim config {reason}\n");
            let decision = Decision::Config {
                config_version,
                toml: toml.clone().into(),
            };
            let cmd = Command::decide(decision, "sim", reason);
            let outcomes = self.outcomes.clone();
            tokio::spawn(async move {
                let answer = send(&nodes, &node, cmd).await;
                tally(&outcomes, &answer);
                if answer.is_ok() {
                    lock(&history).acks.push(Ack::Config {
                        config_version,
                        toml,
                    });
                }
            });
            return;
        }
        let decision = match kind {
            3..=13 if self.quiet => Decision::Unfreeze,
            3..=8 => Decision::Failover { from: a, to: b },
            9..=13 => Decision::Failback { zone: a },
            14..=16 => Decision::Freeze,
            _ => Decision::Unfreeze,
        };
        let mut cmd = Command::decide(decision, "sim", reason.clone());
        let if_version = self.rng.chance(50).then_some(seen.decision_version);
        if let Some(v) = if_version {
            cmd = cmd.if_version(v);
        }
        let outcomes = self.outcomes.clone();
        tokio::spawn(async move {
            let answer = send(&nodes, &node, cmd).await;
            tally(&outcomes, &answer);
            if let Ok(applied) = answer {
                lock(&history).acks.push(Ack::Decision {
                    reason,
                    version: applied.version,
                    if_version,
                });
            }
        });
    }

    /// The operator's membership changes, at the leader: a new member
    /// (`JOINER`, configured as a voter) is started and added (as a
    /// learner first), then promoted; otherwise a member is readdressed.
    async fn membership(&mut self, start: tokio::time::Instant) {
        let Some(leader) = self.leader() else { return };
        let Some(node) = self.slots.get(&leader).and_then(|s| s.node.clone()) else {
            return;
        };
        let membership = node.raft_metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        let change = if !self.slots.contains_key(&JOINER) && !self.opts.three_voters {
            let zone = z(ZONES[self.member_rng.below(3) as usize]);
            let member = Member {
                id: JOINER,
                zone,
                raft_addr: format!("127.0.0.1:{}", 17000 + JOINER),
                admin_addr: format!("127.0.0.1:{}", 18000 + JOINER),
                role: Role::Voter,
            };
            let mut bootstrap = self.members.clone();
            bootstrap.push(member.clone());
            let slot = Slot {
                member: member.clone(),
                bootstrap,
                node: None,
                incarnation: 0,
                restart_at: None,
                rejoin: false,
            };
            self.slots.insert(JOINER, slot);
            self.start(JOINER).await;
            MemberChange::Add { member }
        } else if self.slots.contains_key(&JOINER) && membership.get_node(&JOINER).is_none() {
            let member = self.slots[&JOINER].member.clone();
            MemberChange::Add { member }
        } else if self.slots.contains_key(&JOINER) && !membership.voter_ids().any(|v| v == JOINER) {
            MemberChange::Promote { id: JOINER }
        } else {
            let Some(m) = self.member_rng.pick(&self.members).cloned() else {
                return;
            };
            MemberChange::Readdress {
                id: m.id,
                raft_addr: format!("127.0.0.1:{}", 20_000 + self.member_rng.below(10_000)),
                admin_addr: m.admin_addr.clone(),
            }
        };
        self.fault(start, format!("membership at leader {leader}: {change:?}"));
        tokio::spawn(async move {
            let _ = node.change_members(change).await;
        });
    }

    /// Whether every live member's membership is one config (no joint
    /// change under way) in which every member configured to vote, if
    /// present, votes (the joiner once it was wiped). A wiped voter's repair ends only there: its rejoin
    /// makes it a learner (the config loses a voter) and promotes it back
    /// through a joint config, and a rejoiner counts as back (`rejoining`
    /// false) once it is a voter in the joint config. Seeds 2003428 and
    /// 3000778 wiped another voter of `{1, 2}` (or `[{2, 3}, {1, 2, 3}]`)
    /// then: a second member's data lost in a config that tolerates none,
    /// which no Raft survives without an operator; not the fault
    /// tolerance the simulation asserts. (Checked at every member, so the
    /// entry that ended the change is on every majority.)
    fn membership_whole(&self) -> bool {
        // The joiner counts once wiped: before, its promotion is the
        // operator's change, not a repair.
        let voters: BTreeSet<NodeId> = self
            .slots
            .values()
            .filter(|s| s.member.role.votes() && (s.member.id != JOINER || s.rejoin))
            .map(|s| s.member.id)
            .collect();
        self.live().iter().all(|(_, n)| {
            let m = n.raft_metrics().borrow().membership_config.clone();
            let m = m.membership();
            let voting: BTreeSet<NodeId> = m.voter_ids().collect();
            m.get_joint_config().len() == 1
                && voters
                    .iter()
                    .all(|v| m.get_node(v).is_none() || voting.contains(v))
        })
    }

    /// The members of the applied membership, as the leader (else any
    /// live node) knows it.
    fn in_membership(&self) -> BTreeSet<NodeId> {
        let live = self.live();
        let from = self
            .leader()
            .and_then(|l| live.iter().find(|(i, _)| *i == l))
            .or_else(|| live.first());
        let Some((_, node)) = from else {
            return BTreeSet::new();
        };
        let m = node.raft_metrics().borrow().membership_config.clone();
        m.membership().nodes().map(|(id, _)| *id).collect()
    }

    /// Every fault ends: links, weather, clocks, zones; down nodes restart.
    async fn heal(&mut self) {
        self.net.heal();
        let ids: Vec<NodeId> = self.slots.keys().copied().collect();
        for id in &ids {
            sim::set_skew(*id, 0);
            sim::set_disk_delay(&self.data_dir(*id), Duration::ZERO);
        }
        self.unslow.clear();
        lock(&self.zone_bad).clear();
        for id in ids {
            if self.slots[&id].node.is_none() {
                self.reconnect(id);
                self.start(id).await;
            }
        }
    }

    /// Wait until a write commits, every node applied the same log and no
    /// wiped member is still rejoining.
    async fn converge(&mut self, bound_ms: u64) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(bound_ms);
        let mut committed = false;
        while tokio::time::Instant::now() < deadline {
            let live = self.live();
            if !committed {
                if let Some(l) = self.leader() {
                    let node = live.iter().find(|(i, _)| *i == l).map(|(_, n)| n.clone());
                    if let Some(node) = node {
                        let probe = Command::tick("sim-probe");
                        let answer =
                            tokio::time::timeout(Duration::from_secs(1), node.propose(probe));
                        committed = matches!(answer.await, Ok(Ok(_)));
                    }
                }
            }
            // A wiped member is back once it left rejoining (promoted
            // back to its configured role). A wiped node the membership
            // does not hold (the joiner, whose add a leader change undid)
            // waits for an operator's add, as it should: not a member's
            // repair (seed 5001005).
            let members = self.in_membership();
            let rejoined = live
                .iter()
                .filter(|(id, _)| members.contains(id))
                .all(|(_, n)| !n.rejoining());
            if committed && rejoined {
                let applied: BTreeSet<_> = live
                    .iter()
                    .filter(|(id, _)| members.contains(id))
                    .map(|(_, n)| {
                        let m = n.raft_metrics().borrow().clone();
                        let v = n.view().borrow().clone();
                        (m.last_applied, v.decision_version, v.config_version())
                    })
                    .collect();
                if applied.len() == 1 {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if std::env::var_os("ZONEGATE_SIM_SEED").is_some() {
            // A replay says where each node stands when convergence failed.
            eprintln!(
                "  not converged: committed {committed}, leader {:?}",
                self.leader()
            );
            for (id, n) in self.live() {
                let m = n.raft_metrics().borrow().clone();
                let v = n.view().borrow().clone();
                eprintln!(
                    "    node {id}: rejoining {}, state {:?}, term {}, leader {:?}, applied {:?}, decision v{}, config v{}, membership {:?}",
                    n.rejoining(),
                    m.state,
                    m.current_term,
                    m.current_leader,
                    m.last_applied,
                    v.decision_version,
                    v.config_version(),
                    m.membership_config.membership(),
                );
            }
        }
        false
    }

    /// Record each node's final applied log and stop every node.
    async fn finish(&mut self) {
        let live = self.live();
        let members = self.in_membership();
        // Each decision record's stamp, on the true clock: by actor,
        // reason and wall-clock stamp (unknown when two stamps match).
        let mut stamps: BTreeMap<(String, String, u64), BTreeSet<u64>> = BTreeMap::new();
        for s in sim::stamps() {
            stamps
                .entry((s.actor, s.reason, s.at_ms))
                .or_default()
                .insert(s.true_ms);
        }
        {
            let mut h = lock(&self.history);
            h.applied = sim::applied_clocks();
            for (id, node) in live.iter().filter(|(id, _)| members.contains(id)) {
                let state = node.state_snapshot();
                let log: Vec<Entry> = state
                    .all_decisions(HISTORY_LIMIT * 2)
                    .into_iter()
                    .map(|r| {
                        let found = stamps
                            .get(&(r.actor.clone(), r.reason.clone(), r.at_ms))
                            .filter(|t| t.len() == 1)
                            .and_then(|t| t.first().copied());
                        Entry {
                            version: r.version,
                            kind: r.kind.clone(),
                            key: format!("{}|{}|{}|{}", r.kind, r.actor, r.reason, r.at_ms),
                            auto: r.origin == Origin::Automatic,
                            zones: r.zones.iter().map(|z| z.as_str().to_owned()).collect(),
                            stamp_ms: found,
                        }
                    })
                    .collect();
                h.finals.insert(*id, log);
                let configs = state
                    .configs()
                    .into_iter()
                    .map(|c| (c.version, c.toml.to_string()))
                    .collect();
                h.final_configs.insert(*id, configs);
            }
        }
        for (id, _) in live {
            self.crash(id).await;
        }
    }
}

/// How many crashes found sled still holding its directory's lock after
/// the node stopped (see [`wait_for_store_lock`]), over this process.
pub static STORE_LOCK_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Wait, in real time, until sled let go of the lock on the store under
/// `dir` (`raft.sled/db`; nothing to wait for without one).
///
/// `shutdown` returns once every handle of the store dropped, but sled
/// 0.34 releases its `flock` only when its own background threads (the
/// pool that writes its I/O buffers) drop their references, moments later
/// (spacejam/sled#1234, #1289). A real crash ends the process, and the
/// kernel releases the lock before anything can restart it; the
/// simulation restarts in this process, and 0.3 simulated seconds on
/// the paused clock may be no real time at all: seed 2003425 reopened
/// node 2's store while the lock was still held (under a slow disk, and
/// only on a busy machine). So this waits as long as the process exit
/// would have, on the runtime's only thread: simulated time stands still
/// meanwhile, and no other node runs.
fn wait_for_store_lock(dir: &std::path::Path) {
    use fs2::FileExt;
    let db = dir.join("raft.sled").join("db");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut waited = false;
    loop {
        let Ok(file) = std::fs::OpenOptions::new().read(true).open(&db) else {
            return;
        };
        // Closing the file releases the probe's own lock.
        if file.try_lock_exclusive().is_ok() {
            return;
        }
        if !waited {
            waited = true;
            STORE_LOCK_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "sled still locks {} 30 s after its node stopped",
                db.display()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Count an answer by its kind (`ok`, `rejected:<rule>`, `no_leader`...).
fn tally(
    outcomes: &Mutex<BTreeMap<String, u64>>,
    answer: &Result<zonegate_cluster::Applied, ProposeError>,
) {
    let kind = match answer {
        Ok(_) => "ok".to_string(),
        Err(ProposeError::Rejected { rule, .. }) => format!("rejected:{}", rule.name()),
        Err(ProposeError::NotLeader { .. }) => "not_leader".into(),
        Err(ProposeError::NoLeader) => "no_leader".into(),
        Err(ProposeError::OutcomeUnknown(_)) => "outcome_unknown".into(),
        Err(ProposeError::Fatal(_)) => "fatal".into(),
    };
    *lock(outcomes).entry(kind).or_default() += 1;
}

/// Propose `cmd` at `node`; forward once to the leader it names.
async fn send(
    nodes: &BTreeMap<NodeId, Arc<ClusterNode>>,
    node: &ClusterNode,
    cmd: Command,
) -> Result<zonegate_cluster::Applied, ProposeError> {
    match node.propose(cmd.clone()).await {
        Err(ProposeError::NotLeader { leader, .. }) => match nodes.get(&leader) {
            Some(l) => l.propose(cmd).await,
            None => Err(ProposeError::NoLeader),
        },
        other => other,
    }
}
