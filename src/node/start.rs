//! `zonegate serve`: binds the data-plane and admin listeners, starts the
//! health probes, and runs until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::middleware;
use axum::response::IntoResponse;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use zonegate_cluster::{ClusterConfig, ClusterNode, ClusterView, RaftListen};
use zonegate_net::listen::{Handed, ListenConfig};
use zonegate_net::sign::{KeyRing, Purpose};
use zonegate_net::spread::{Member, Spread};
use zonegate_net::tls::{ServerTls, TlsFiles};

use crate::config::Config;
use crate::node::drain;
use crate::node::gateway::Gateway;
use crate::node::lifecycle::{Stop, EXIT_SLACK};
use crate::telemetry::Metrics;
use crate::{admin, dataplane::proxy, health};

/// A node that is serving; [`RunningNode::drain`] (SIGTERM) or
/// [`RunningNode::shutdown`] stops it.
pub struct RunningNode {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    /// Turns true when the data-plane listeners stop accepting.
    data_stop: watch::Sender<bool>,
    /// Turns true when the admin API and the probes stop.
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    data_threads: Vec<std::thread::JoinHandle<()>>,
}

/// After the drain cut the streams: how long the last requests (cut
/// streams, and non-streaming generations still running) get to finish
/// before the node exits without them.
const AFTER_CUT: Duration = Duration::from_secs(2);

/// After the data plane stopped: how long the admin API, the probes and
/// the control plane (a leader's handover, Raft, the store) get to stop.
/// A wedged control plane is left behind: the process exits around it.
const STOP_REST: Duration = Duration::from_secs(8);

impl RunningNode {
    /// Stops at once: no grace, in-flight requests get `drain_timeout`.
    pub async fn shutdown(self) {
        self.drain(Duration::ZERO).await;
    }

    /// The graceful drain (see `node::drain`): `/readyz` fails now; a
    /// leader hands its leadership to a caught-up voter now (or, failing
    /// that, stops its Raft member so the group elects another) while this
    /// node still serves; after `grace` the listeners stop accepting;
    /// in-flight requests get `[node] drain_timeout`, then open streams end
    /// with the SSE error event; then the admin API, probes and Raft stop.
    pub async fn drain(mut self, grace: Duration) {
        let gw = Arc::clone(&self.gateway);
        let drain = &gw.drain;
        let timeout = gw.cfg().node.drain_timeout;
        drain.begin();
        gw.metrics.draining.set(1);
        tracing::info!(
            grace = ?grace,
            timeout = ?timeout,
            in_flight = drain.in_flight(),
            "draining: readiness fails from now on"
        );
        let cluster = gw.cluster.clone();
        // A draining node never campaigns; a leader hands over first.
        if let Some(node) = &cluster {
            node.stop_campaigning();
        }
        let step_down = cluster
            .as_ref()
            .filter(|node| node.status().is_leader)
            .map(|node| tokio::spawn(hand_over(Arc::clone(node), Arc::clone(&gw))));
        tokio::time::sleep(grace).await;
        let _ = self.data_stop.send(true);
        tracing::info!(
            in_flight = drain.in_flight(),
            "stopped accepting; waiting for in-flight requests"
        );
        if !drain.wait_idle(timeout).await {
            tracing::warn!(
                in_flight = drain.in_flight(),
                "drain timeout: ending open streams with the SSE error event"
            );
            drain.cut_streams();
            if !drain.wait_idle(AFTER_CUT).await {
                tracing::warn!(
                    in_flight = drain.in_flight(),
                    "requests still in flight after the drain; exiting without them"
                );
            }
        }
        // A thread still serving a request past the drain is left behind:
        // the process exits around it.
        let deadline = tokio::time::Instant::now() + AFTER_CUT;
        while self.data_threads.iter().any(|t| !t.is_finished())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.stop.send(true);
        let stop_by = tokio::time::Instant::now() + STOP_REST;
        let tasks = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout_at(stop_by, tasks).await.is_err() {
            tracing::warn!("the admin API or the probes did not stop in time");
            self.tasks.abort_all();
        }
        if let Some(task) = step_down {
            if tokio::time::timeout_at(stop_by, task).await.is_err() {
                tracing::warn!("the leadership handover did not end in time");
            }
        }
        if let Some(node) = cluster.filter(|_| !drain.raft_stopped()) {
            match tokio::time::timeout_at(stop_by, node.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("control plane did not stop cleanly: {e}"),
                Err(_) => tracing::warn!(
                    "the control plane did not stop within {STOP_REST:?}: exiting without it"
                ),
            }
        }
        tracing::info!("drained");
    }
}

/// A draining leader hands over to a caught-up voter and stays a follower
/// (it still votes) until the drain ends; if no voter takes over in time,
/// it stops its Raft member so the others elect one after its lease.
async fn hand_over(node: Arc<zonegate_cluster::ClusterNode>, gw: Arc<Gateway>) {
    use zonegate_cluster::Handover;
    let outcome = match node.hand_over().await {
        Handover::NotLeader | Handover::Alone => return,
        Handover::Transferred { to, after } => {
            tracing::info!(to, after = ?after, "draining leader: member {to} leads now");
            "transferred"
        }
        Handover::Failed(why) => {
            tracing::warn!(
                "draining leader: handover failed ({why}); stopping its Raft member so another member takes over"
            );
            gw.drain.mark_raft_stopped();
            match tokio::time::timeout(STOP_REST, node.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("control plane did not stop cleanly: {e}"),
                Err(_) => tracing::warn!("the control plane did not stop within {STOP_REST:?}"),
            }
            "failed"
        }
    };
    gw.metrics
        .raft_handovers
        .with_label_values(&[outcome])
        .inc();
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// How `zonegate serve` was asked to start, beyond its config file.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeOptions {
    /// `--rejoin`: this node lost its store; it catches up as a learner
    /// and is then promoted to its configured role.
    pub rejoin: bool,
}

/// Binds and starts everything a node runs; returns once it is serving.
pub async fn start(cfg: Config) -> anyhow::Result<RunningNode> {
    start_with(cfg, ServeOptions::default()).await
}

/// [`start`] with [`ServeOptions`].
pub async fn start_with(cfg: Config, opts: ServeOptions) -> anyhow::Result<RunningNode> {
    let cfg = Arc::new(cfg);
    for b in cfg.backends.iter().filter(|b| b.tls.insecure_skip_verify) {
        tracing::warn!(
            backend = %b.name,
            "tls.insecure_skip_verify: this backend's certificate is not verified (the connection is encrypted, not authenticated)"
        );
    }
    let budgets = Budgets::from_fd_limit(zonegate_net::listen::raise_fd_limit());
    let data = data_listeners(cfg.node.listen, cfg.node.data_plane_threads)?;
    let admin_l = bind(cfg.node.admin_listen, "node.admin_listen").await?;
    let data_addr = data[0].local_addr()?;
    let admin_addr = admin_l.local_addr()?;

    let (cluster, view_rx) = control_plane(&cfg, opts, budgets.raft).await?;
    // Pins are signed with a key derived from the cluster secret, so every
    // node honours every other node's pins; a standalone node without one
    // signs with a random key of its own (its pins are only ever read by
    // itself).
    let pin_keys = match std::env::var(SECRET_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
    {
        Some(secrets) => KeyRing::derive(&secrets, Purpose::Pin)
            .map_err(|e| anyhow::anyhow!("{SECRET_ENV}: {e}"))?,
        None => KeyRing::random(Purpose::Pin),
    };
    let gateway = Arc::new(
        Gateway::try_new(
            Arc::clone(&cfg),
            view_rx,
            cluster.clone(),
            pin_keys,
            Metrics::new(),
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.file))?,
    );
    let server_tls = |files: &Option<TlsFiles>, what: &str| {
        files
            .clone()
            .map(|f| ServerTls::load(f, &[b"h2", b"http/1.1"]))
            .transpose()
            .with_context(|| format!("{what}.tls"))
    };
    let data_listen = ListenConfig {
        name: "data",
        tls: server_tls(&cfg.node.tls, "node")?,
        limits: cfg.node.limits.resolve(budgets.data),
        stats: Arc::default(),
        peer: false,
    };
    let admin_listen = ListenConfig {
        name: "admin",
        tls: server_tls(&cfg.admin.tls, "admin")?,
        limits: cfg.admin.limits.resolve(budgets.admin),
        stats: Arc::default(),
        peer: true,
    };
    {
        let mut listeners = gateway.listeners.lock();
        for l in [&data_listen, &admin_listen] {
            listeners.push((l.name, Arc::clone(&l.stats), l.limits.max_connections));
        }
        if let Some(node) = &gateway.cluster {
            listeners.push((
                "raft",
                node.raft_listener_stats(),
                node.raft_max_connections(),
            ));
        }
    }
    let reloadable: Vec<Arc<ServerTls>> = [&data_listen.tls, &admin_listen.tls]
        .into_iter()
        .flatten()
        .cloned()
        .chain(gateway.cluster.as_ref().and_then(|n| n.raft_tls()))
        .collect();

    let (stop, _) = watch::channel(false);
    let (data_stop, _) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut threads = Vec::new();
    // The threads' connections kept even: the kernel's SO_REUSEPORT hash
    // is not (`zonegate_net::spread`).
    let (spread, members) = Spread::new(data.len());
    let _ = gateway.data_spread.set(spread);
    // Traces: exported by a task on this (the main) runtime.
    let tracer = crate::telemetry::traces::Tracer::start(
        &cfg.telemetry,
        opentelemetry_http::hyper::HyperClient::new(
            crate::dataplane::connect::connector(Duration::from_secs(5), &Default::default()),
            Duration::from_secs(10),
            None,
        ),
        gateway.metrics.trace_spans_dropped.clone(),
        gateway.metrics.trace_spans_exported.clone(),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.file))?;
    if let Some(tracer) = tracer {
        let _ = gateway.tracer.set(tracer);
    }
    for (i, (listener, member)) in data.into_iter().zip(members).enumerate() {
        // The drain layer wraps the request path from outside: readiness,
        // in-flight counting, cutting streams at the drain timeout; inside
        // it, readiness may require a leader.
        // Inference requests skip the router (`node::front`) but not the
        // drain's accounting.
        let rest = ready_requires_leader(proxy::router(Arc::clone(&gateway)), &gateway).layer(
            middleware::from_fn_with_state(Arc::clone(&gateway), drain::track),
        );
        let app = crate::node::front::Front::new(Arc::clone(&gateway), rest);
        // Plain inference POSTs skip `http`'s request and response types.
        let plain = Arc::new(crate::node::front::Inference::new(Arc::clone(&gateway)));
        let stopped = data_stop.subscribe();
        let listen = data_listen.clone();
        let scheduling = cfg.node.data_plane_scheduling;
        threads.push(
            std::thread::Builder::new()
                .name(format!("zonegate-data-{i}"))
                .spawn(move || {
                    if let Err(e) = crate::node::sched::apply(scheduling) {
                        tracing::warn!("data-plane thread {i} keeps the default scheduling: {e}");
                    }
                    data_plane_thread(listener, member, app, plain, listen, stopped)
                })
                .context("cannot start a data-plane thread")?,
        );
    }
    // The admin API shares the main runtime with probes and Raft.
    tasks.spawn(zonegate_net::listen::serve(
        admin_l,
        admin::router(Arc::clone(&gateway)),
        admin_listen,
        stop.subscribe(),
    ));
    if !reloadable.is_empty() {
        tasks.spawn(reload_certificates(
            reloadable,
            hangup_signal(),
            stop.subscribe(),
        ));
    }
    if let Some(hangup) = hangup_signal() {
        tasks.spawn(reload_backend_keys(
            Arc::clone(&gateway),
            hangup,
            stop.subscribe(),
        ));
    }
    if let Some(node) = &gateway.cluster {
        let gw = Arc::downgrade(&gateway);
        node.set_observation_source(Arc::new(move || {
            gw.upgrade()
                .map(|gw| gw.zone_observations())
                .unwrap_or_default()
        }));
    }
    if gateway.cluster.is_some() {
        tasks.spawn(super::reconfigure::follow(
            Arc::clone(&gateway),
            stop.subscribe(),
        ));
    } else {
        match hangup_signal() {
            Some(hangup) => {
                tasks.spawn(super::reconfigure::reload_on_hangup(
                    Arc::clone(&gateway),
                    hangup,
                    stop.subscribe(),
                ));
            }
            None => tracing::warn!("the config reloads only on restart"),
        }
    }
    tasks.spawn(super::heap::watch_floods(
        Arc::downgrade(&gateway),
        stop.subscribe(),
    ));
    let mut probes = health::spawn_probes(&gateway);
    let mut stopped = stop.subscribe();
    tasks.spawn(async move {
        let _ = stopped.wait_for(|s| *s).await;
        probes.shutdown().await;
    });
    Ok(RunningNode {
        data_addr,
        admin_addr,
        gateway,
        data_stop,
        stop,
        tasks,
        data_threads: threads,
    })
}

/// The Raft member when `[[cluster.members]]` is set, and the view the
/// data plane reads either way.
async fn control_plane(
    cfg: &Config,
    opts: ServeOptions,
    raft_budget: usize,
) -> anyhow::Result<(Option<Arc<ClusterNode>>, watch::Receiver<Arc<ClusterView>>)> {
    if let Some(node) = start_cluster(cfg, opts, raft_budget).await? {
        let view = node.view();
        return Ok((Some(Arc::new(node)), view));
    }
    if cfg.node.raft_listen.is_some() {
        tracing::warn!("node.raft_listen is set but no [[cluster.members]]: running standalone");
    }
    // Standalone: one view, version 0, every zone active; nothing will ever
    // change it, so the sender can go.
    let zones = cfg.backends.iter().map(|b| &b.zone).chain([&cfg.node.zone]);
    Ok((
        None,
        watch::channel(Arc::new(ClusterView::initial(zones))).1,
    ))
}

/// With `[cluster] ready_requires_leader = true`, `/readyz` answers 503
/// `stale_view` while this node has not heard from a leader with a quorum
/// for three election timeouts, so a load balancer can drain a
/// partitioned node. Off (the default), a partitioned node stays ready
/// and routes with its last view (fail static). A layer here rather than
/// a line in the data plane's `readyz`: the request path stays unaware of
/// the control plane.
fn ready_requires_leader(app: axum::Router, gw: &Arc<Gateway>) -> axum::Router {
    let Some(node) = gw
        .cluster
        .clone()
        .filter(|_| gw.cfg().cluster.ready_requires_leader)
    else {
        return app;
    };
    app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let node = node.clone();
            async move {
                if req.uri().path() == "/readyz" && !node.leader_contact() {
                    let body = crate::dataplane::error::error_body(
                        "this node's cluster view is stale: no leader with a quorum heard from recently ([cluster] ready_requires_leader = true)",
                        "server_error",
                        "stale_view",
                    );
                    return (http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(body))
                        .into_response();
                }
                next.run(req).await
            }
        },
    ))
}

/// Each listener's connection budget by default, from the open-files
/// limit (raised to the hard limit first): the admin API and Raft keep
/// their own small budgets; the data plane gets half of what is left,
/// since every proxied request also holds a connection to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Budgets {
    data: usize,
    admin: usize,
    raft: usize,
}

impl Budgets {
    fn from_fd_limit(fds: u64) -> Self {
        let fds = usize::try_from(fds).unwrap_or(usize::MAX);
        let (admin, raft) = (256, 512);
        // Headroom for the store, logs, probes and the process itself.
        let spare = fds.saturating_sub(admin + raft + 256);
        Self {
            data: (spare / 2).max(64),
            admin,
            raft,
        }
    }
}

/// Reloads listener certificates when their files change (checked every
/// few seconds) and on SIGHUP; a bad new file keeps the old certificate
/// and says why.
async fn reload_certificates(
    tls: Vec<Arc<ServerTls>>,
    mut hangup: Option<tokio::signal::unix::Signal>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CERT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        for t in &tls {
            let outcome = if forced {
                t.reload().map(|()| true)
            } else {
                t.reload_if_changed()
            };
            match outcome {
                Ok(true) => tracing::info!(tls = ?t, "certificate reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(tls = ?t, "certificate not reloaded, keeping the old one: {e}")
                }
            }
        }
    }
}

/// On SIGHUP, reads every backend's key file again (they are also read
/// again when they change: `config::credential`).
async fn reload_backend_keys(
    gw: Arc<Gateway>,
    mut hangup: tokio::signal::unix::Signal,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            Some(()) = hangup.recv() => {}
            else => return,
        }
        let routes = gw.routes.load_full();
        for b in &routes.backends {
            if let Some(key) = b.provider.as_ref().and_then(|p| p.key.as_ref()) {
                key.reload(true);
            }
        }
    }
}

/// A SIGHUP stream, registered now: before the node announces itself, so
/// a SIGHUP never meets the default action (which exits).
fn hangup_signal() -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .inspect_err(|e| tracing::warn!("cannot watch SIGHUP: {e}"))
        .ok()
}

/// How often certificate files are checked for changes.
const CERT_CHECK: Duration = Duration::from_secs(5);

/// One data-plane listener per core (or `[node] data_plane_threads`) on
/// the same address (SO_REUSEPORT, so the kernel spreads connections over
/// them), the nginx worker model: each is served by its own thread and
/// single-threaded runtime.
fn data_listeners(
    addr: SocketAddr,
    threads: Option<usize>,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // A plain bind first: SO_REUSEPORT would let a second zonegate (same
    // user) join an existing group silently and take half its traffic; a
    // socket without it fails with "address in use" instead.
    let mut at = std::net::TcpListener::bind(addr)
        .with_context(|| format!("cannot listen on {addr} (node.listen)"))?
        .local_addr()?;
    let mut out: Vec<std::net::TcpListener> = Vec::new();
    for _ in 0..n {
        let socket = Socket::new(Domain::for_address(at), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket
            .bind(&at.into())
            .with_context(|| format!("cannot listen on {at} (node.listen)"))?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        at = listener.local_addr()?;
        out.push(listener);
    }
    Ok(out)
}

/// Serves one data-plane listener on this thread until `stopped`.
fn data_plane_thread(
    listener: std::net::TcpListener,
    member: Member<Handed>,
    app: crate::node::front::Front,
    plain: Arc<crate::node::front::Inference>,
    listen: ListenConfig,
    stopped: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start a data-plane runtime: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        match TcpListener::from_std(listener) {
            Ok(l) => {
                zonegate_net::listen::serve_plain(
                    l,
                    app,
                    Some(plain),
                    listen,
                    Some(member),
                    stopped,
                )
                .await
            }
            Err(e) => tracing::error!("data-plane listener failed: {e}"),
        }
    });
}

/// Env var holding the cluster secret (a comma-separated list while
/// rotating: the first signs, any verifies). Raft and pin keys are derived
/// from it; it is never sent.
pub const SECRET_ENV: &str = "ZONEGATE_CLUSTER_SECRET";

/// Starts this node's Raft member when `[[cluster.members]]` is set.
async fn start_cluster(
    cfg: &Config,
    opts: ServeOptions,
    raft_budget: usize,
) -> anyhow::Result<Option<ClusterNode>> {
    if cfg.members.is_empty() {
        return Ok(None);
    }
    let secret = std::env::var(SECRET_ENV).unwrap_or_default();
    if secret.trim().is_empty() {
        anyhow::bail!("{SECRET_ENV} must be set (the shared Raft secret) when [[cluster.members]] is configured");
    }
    let raft_listen = cfg
        .node
        .raft_listen
        .context("node.raft_listen is required with [[cluster.members]]")?;
    std::fs::create_dir_all(&cfg.node.data_dir).with_context(|| {
        format!(
            "cannot create node.data_dir {}",
            cfg.node.data_dir.display()
        )
    })?;
    let node = ClusterNode::start(ClusterConfig {
        node_id: cfg.node.id,
        zone: cfg.node.zone.clone(),
        members: cfg.members.clone(),
        data_dir: cfg.node.data_dir.clone(),
        secret,
        raft_listen: RaftListen::Addr(raft_listen),
        timing: cfg.cluster.timing.clone(),
        faults: None,
        rejoin: opts.rejoin,
        tls: cfg.cluster.tls.clone(),
        limits: cfg.cluster.limits.resolve(raft_budget),
    })
    .await
    .context("cannot start the control plane")?;
    node.set_failover_config(cfg.failover.clone())
        .map_err(|e| anyhow::anyhow!("failover.{}: {}", e.key, e.reason))?;
    Ok(Some(node))
}

/// Runs a node until Ctrl-C or SIGTERM. Prints the bound addresses on
/// stdout (tests and the demo read them). SIGTERM drains with
/// `[node] drain_grace`; Ctrl-C drains without the grace (someone at a
/// terminal wants it gone).
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    run_with(cfg, ServeOptions::default()).await
}

/// [`run`] with [`ServeOptions`]. Also stops, with an error, when the
/// control plane finds out this node lost its store (a member knows it
/// held Raft state): serving on would risk acknowledged decisions.
pub async fn run_with(cfg: Config, opts: ServeOptions) -> anyhow::Result<()> {
    let (id, zone) = (cfg.node.id, cfg.node.zone.clone());
    let mut signals = super::lifecycle::StopSignals::install();
    let node = start_with(cfg, opts).await?;
    let scheme = |tls: &Option<TlsFiles>| if tls.is_some() { "https" } else { "http" };
    let cfg = node.gateway.cfg();
    println!(
        "zonegate: data plane listening on {}://{}",
        scheme(&cfg.node.tls),
        node.data_addr
    );
    println!(
        "zonegate: admin listening on {}://{}",
        scheme(&cfg.admin.tls),
        node.admin_addr
    );
    tracing::info!(node = id, zone = %zone, data = %node.data_addr, admin = %node.admin_addr, "node serving");
    let mut amnesia = match &node.gateway.cluster {
        Some(c) => c.amnesia(),
        None => watch::channel(None).1,
    };
    let lost = async move {
        match amnesia.wait_for(Option::is_some).await {
            Ok(msg) => msg.clone(),
            Err(_) => std::future::pending().await,
        }
    };
    let mut fatal = match &node.gateway.cluster {
        Some(c) => c.fatal(),
        None => watch::channel(None).1,
    };
    let failed = async move {
        match fatal.wait_for(Option::is_some).await {
            Ok(f) => f.clone(),
            Err(_) => std::future::pending().await,
        }
    };
    let node_cfg = node.gateway.cfg().node.clone();
    let (grace, fatal) = tokio::select! {
        stop = signals.recv() => match stop {
            Stop::Terminate => (node_cfg.drain_grace, None),
            Stop::Interrupt => (Duration::ZERO, None),
        },
        msg = lost => {
            super::lifecycle::exit_after(node_cfg.drain_timeout + EXIT_SLACK, "stopping");
            node.shutdown().await;
            anyhow::bail!("{}", msg.unwrap_or_default());
        }
        // The control plane stopped for good (a full disk): this node's
        // view no longer follows the cluster. Readiness fails now, the
        // data plane stops after the grace, and the process exits non-zero
        // so a supervisor restarts it.
        f = failed => (node_cfg.drain_grace, f),
    };
    // Whatever the control plane's state, the process ends within its
    // drain plus a small bound.
    super::lifecycle::exit_after(grace + node_cfg.drain_timeout + EXIT_SLACK, "the drain");
    if let Some(f) = &fatal {
        node.gateway.drain.begin_because(format!(
            "this node's control plane stopped for good ({}): it is shutting down",
            f.reason
        ));
    }
    tracing::info!("shutting down");
    node.drain(grace).await;
    if let Some(f) = fatal {
        anyhow::bail!(
            "the control plane stopped for good ({}): {}. The node drained and exits so that a supervisor restarts it; while the disk under node.data_dir is full it refuses to start (free space first: it then rejoins and catches up)",
            f.reason,
            f.cause
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_plane_gets_one_listener_per_thread_asked_for_on_one_port() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let three = data_listeners(any, Some(3)).unwrap();
        assert_eq!(three.len(), 3);
        let port = three[0].local_addr().unwrap().port();
        assert!(three.iter().all(|l| l.local_addr().unwrap().port() == port));
        let per_core = data_listeners(any, None).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(per_core.len(), cores);
    }
}
