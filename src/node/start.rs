//! `zonegate serve`: binds the data-plane and admin listeners, starts the
//! health probes, and runs until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::response::IntoResponse;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use zonegate_cluster::{ClusterConfig, ClusterNode, ClusterView, RaftListen};

use crate::config::Config;
use crate::node::gateway::Gateway;
use crate::telemetry::Metrics;
use crate::{admin, dataplane::proxy, health};

/// A node that is serving; dropping it or calling [`RunningNode::shutdown`]
/// stops its listeners and probes.
pub struct RunningNode {
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl RunningNode {
    /// Stops accepting, lets in-flight requests finish, and returns.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
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
    let data = data_listeners(cfg.node.listen)?;
    let admin_l = bind(cfg.node.admin_listen, "node.admin_listen").await?;
    let data_addr = data[0].local_addr()?;
    let admin_addr = admin_l.local_addr()?;

    let (cluster, view_rx) = control_plane(&cfg, opts).await?;
    // Pins are signed with the cluster secret, so every node honours every
    // other node's pins; a standalone node without one signs with a random
    // key of its own (its pins are only ever read by itself).
    let pin_secret = std::env::var(SECRET_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| format!("{:032x}", fastrand::u128(..)));
    let gateway = Arc::new(Gateway::new(
        Arc::clone(&cfg),
        view_rx,
        cluster.clone(),
        pin_secret.as_bytes(),
        Metrics::new(),
    ));

    let (stop, _) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut threads = Vec::new();
    for (i, listener) in data.into_iter().enumerate() {
        let app = ready_requires_leader(proxy::router(Arc::clone(&gateway)), &gateway);
        let stopped = stop.subscribe();
        threads.push(
            std::thread::Builder::new()
                .name(format!("zonegate-data-{i}"))
                .spawn(move || data_plane_thread(listener, app, stopped))
                .context("cannot start a data-plane thread")?,
        );
    }
    // The admin API shares the main runtime with probes and Raft.
    tasks.spawn(serve_admin(
        admin_l,
        admin::router(Arc::clone(&gateway)),
        stop.subscribe(),
    ));
    if let Some(node) = &gateway.cluster {
        let gw = Arc::downgrade(&gateway);
        node.set_observation_source(Arc::new(move || {
            gw.upgrade()
                .map(|gw| gw.zone_observations())
                .unwrap_or_default()
        }));
    }
    let mut probes = health::spawn_probes(&gateway);
    let mut stopped = stop.subscribe();
    tasks.spawn(async move {
        let _ = stopped.wait_for(|s| *s).await;
        probes.shutdown().await;
        if let Some(node) = cluster {
            if let Err(e) = node.shutdown().await {
                tracing::warn!("control plane did not stop cleanly: {e}");
            }
        }
    });
    tasks.spawn(async move {
        for t in threads {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    });
    Ok(RunningNode {
        data_addr,
        admin_addr,
        gateway,
        stop,
        tasks,
    })
}

/// The Raft member when `[[cluster.members]]` is set, and the view the
/// data plane reads either way.
async fn control_plane(
    cfg: &Config,
    opts: ServeOptions,
) -> anyhow::Result<(Option<Arc<ClusterNode>>, watch::Receiver<Arc<ClusterView>>)> {
    if let Some(node) = start_cluster(cfg, opts).await? {
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
        .filter(|_| gw.cfg.cluster.ready_requires_leader)
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

/// Serves the admin API until `stop` turns true.
async fn serve_admin(listener: TcpListener, app: axum::Router, mut stop: watch::Receiver<bool>) {
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!("admin listener failed: {e}");
    }
}

/// One data-plane listener per core on the same address (SO_REUSEPORT, so
/// the kernel spreads connections over them), the nginx worker model: each
/// is served by its own thread and single-threaded runtime.
fn data_listeners(addr: SocketAddr) -> anyhow::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Socket, Type};
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
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
    app: axum::Router,
    mut stopped: watch::Receiver<bool>,
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
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            Err(e) => {
                tracing::error!("data-plane listener failed: {e}");
                return;
            }
        };
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("data-plane listener failed: {e}");
        }
    });
}

/// Env var holding the secret every Raft RPC carries.
pub const SECRET_ENV: &str = "ZONEGATE_CLUSTER_SECRET";

/// Starts this node's Raft member when `[[cluster.members]]` is set.
async fn start_cluster(cfg: &Config, opts: ServeOptions) -> anyhow::Result<Option<ClusterNode>> {
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
    })
    .await
    .context("cannot start the control plane")?;
    node.set_failover_config(cfg.failover.clone())
        .map_err(|e| anyhow::anyhow!("failover.{}: {}", e.key, e.reason))?;
    Ok(Some(node))
}

/// Runs a node until Ctrl-C or SIGTERM. Prints the bound addresses on
/// stdout (tests and the demo read them).
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    run_with(cfg, ServeOptions::default()).await
}

/// [`run`] with [`ServeOptions`]. Also stops, with an error, when the
/// control plane finds out this node lost its store (a member knows it
/// held Raft state): serving on would risk acknowledged decisions.
pub async fn run_with(cfg: Config, opts: ServeOptions) -> anyhow::Result<()> {
    let (id, zone) = (cfg.node.id, cfg.node.zone.clone());
    let node = start_with(cfg, opts).await?;
    println!(
        "zonegate: data plane listening on http://{}",
        node.data_addr
    );
    println!("zonegate: admin listening on http://{}", node.admin_addr);
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
    tokio::select! {
        () = super::lifecycle::shutdown_signal() => {}
        msg = lost => {
            node.shutdown().await;
            anyhow::bail!("{}", msg.unwrap_or_default());
        }
    }
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(())
}
