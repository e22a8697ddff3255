//! `zonegate serve`: binds the data-plane and admin listeners, starts the
//! health probes, and runs until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use zonegate_cluster::{ClusterConfig, ClusterNode, ClusterView, RaftListen, Timing};

use crate::config::Config;
use crate::gateway::Gateway;
use crate::telemetry::Metrics;
use crate::{admin, health, proxy};

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

/// Binds and starts everything a node runs; returns once it is serving.
pub async fn start(cfg: Config) -> anyhow::Result<RunningNode> {
    let cfg = Arc::new(cfg);
    let data = bind(cfg.node.listen, "node.listen").await?;
    let admin_l = bind(cfg.node.admin_listen, "node.admin_listen").await?;
    let (data_addr, admin_addr) = (data.local_addr()?, admin_l.local_addr()?);

    let (cluster, view_rx) = match start_cluster(&cfg).await? {
        Some(node) => {
            let view = node.view();
            (Some(Arc::new(node)), view)
        }
        None => {
            if cfg.node.raft_listen.is_some() {
                tracing::warn!(
                    "node.raft_listen is set but no [[cluster.members]]: running standalone"
                );
            }
            // Standalone: one view, version 0, every zone active; nothing
            // will ever change it, so the sender can go.
            let zones = cfg.backends.iter().map(|b| &b.zone).chain([&cfg.node.zone]);
            (
                None,
                watch::channel(Arc::new(ClusterView::initial(zones))).1,
            )
        }
    };
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
    let data_app = proxy::router(Arc::clone(&gateway));
    let admin_app = admin::router(Arc::clone(&gateway));
    for (listener, app) in [(data, data_app), (admin_l, admin_app)] {
        let mut stopped = stop.subscribe();
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tasks.spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!("listener failed: {e}");
            }
        });
    }
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
    Ok(RunningNode {
        data_addr,
        admin_addr,
        gateway,
        stop,
        tasks,
    })
}

/// Env var holding the secret every Raft RPC carries.
pub const SECRET_ENV: &str = "ZONEGATE_CLUSTER_SECRET";

/// Starts this node's Raft member when `[[cluster.members]]` is set.
async fn start_cluster(cfg: &Config) -> anyhow::Result<Option<ClusterNode>> {
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
        timing: Timing::default(),
        faults: None,
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
    let (id, zone) = (cfg.node.id, cfg.node.zone.clone());
    let node = start(cfg).await?;
    println!(
        "zonegate: data plane listening on http://{}",
        node.data_addr
    );
    println!("zonegate: admin listening on http://{}", node.admin_addr);
    tracing::info!(node = id, zone = %zone, data = %node.data_addr, admin = %node.admin_addr, "node serving");
    shutdown_signal().await;
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(())
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
