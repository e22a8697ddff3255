//! Following the replicated routing config. A cluster node applies every
//! committed config version to its own file's node-local sections and
//! swaps the result in (`Gateway::reconfigure`); the leader seeds config
//! version 1 from its file when the cluster has none. A standalone node
//! reloads its file on SIGHUP.
//!
//! A committed version this node cannot apply (it does not validate here,
//! its build is over the cost cap, or building it panicked) leaves the node
//! routing with its last good config, ready, and reporting the failure
//! (`Gateway::record_config_apply`); it is not retried until a later
//! version is committed. Validation and the build run on a blocking
//! thread: they read files (CA bundles) and may take a while, and the
//! control plane's runtime must keep answering.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use zonegate_cluster::{Command, Decision, ProposeError};

use crate::config::{replicated, Config};
use crate::node::gateway::Gateway;

/// How often the seed is retried while the cluster has no config.
const SEED_RETRY: Duration = Duration::from_secs(1);

/// Applies each new config version of the view until `stop`.
pub async fn follow(gw: Arc<Gateway>, mut stop: watch::Receiver<bool>) {
    let mut view = gw.view.clone();
    let mut warned = false;
    loop {
        let current = view.borrow_and_update().config.clone();
        match current {
            Some((version, toml))
                if version != gw.cfg().config_version
                    && gw.config_failure().map(|f| f.version) != Some(version) =>
            {
                let on = Arc::clone(&gw);
                let applied =
                    tokio::task::spawn_blocking(move || apply(&on, version, &toml, warned)).await;
                match applied {
                    Ok(w) => warned = w,
                    Err(e) => gw.record_config_apply(
                        version,
                        Err(format!("validating it failed unexpectedly: {e}")),
                    ),
                }
            }
            Some(_) => {}
            None => seed(&gw).await,
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = view.changed() => if changed.is_err() { return },
            // While there is no config yet, try to seed it again.
            () = tokio::time::sleep(SEED_RETRY), if gw.view.borrow().config.is_none() => {}
        }
    }
}

/// Validates and swaps in config `version`; returns whether the warning
/// about this node's file differing has been given.
fn apply(gw: &Gateway, version: u64, toml: &str, mut warned: bool) -> bool {
    let base = gw.cfg_arc();
    let source = format!("cluster config v{version}");
    match base.with_replicated(toml, version, &source) {
        Ok(cfg) => {
            if !warned {
                warned = true;
                let own = replicated::cut(&base.file, &base.text).unwrap_or_default();
                let differs = replicated::differing(&own, toml);
                if !differs.is_empty() {
                    tracing::warn!(
                        file = %base.file,
                        sections = %differs.join(", "),
                        config_version = version,
                        "this node's file differs from the cluster's config in these sections; routing with the cluster's (the file only seeds a new cluster)"
                    );
                }
            }
            let backends = cfg.backends.len();
            match gw.reconfigure(cfg) {
                Ok(()) => {
                    gw.record_config_apply(version, Ok(()));
                    tracing::info!(
                        config_version = version,
                        backends,
                        "applied the cluster's routing config"
                    );
                }
                Err(e) => gw.record_config_apply(version, Err(e.to_string())),
            }
        }
        Err(e) => gw.record_config_apply(version, Err(format!("it does not validate: {e}"))),
    }
    warned
}

/// On the leader of a cluster without a config: propose this node's
/// replicated sections as config version 1.
async fn seed(gw: &Gateway) {
    let Some(node) = gw.cluster.as_ref() else {
        return;
    };
    if !node.status().is_leader {
        return;
    }
    let cfg = gw.cfg_arc();
    let cmd = Command::decide(
        Decision::Config {
            config_version: 1,
            toml: cfg.replicated_toml().into(),
        },
        format!("bootstrap:{}", cfg.node.id),
        format!(
            "the cluster's first config, from node {}'s file",
            cfg.node.id
        ),
    );
    match node.propose(cmd).await {
        Ok(a) => tracing::info!(
            version = a.version,
            "seeded the cluster's config (config version 1) from this node's file"
        ),
        Err(ProposeError::Rejected { .. } | ProposeError::NotLeader { .. }) => {}
        Err(e) => tracing::debug!("seeding the cluster config: {e}; retrying"),
    }
}

/// A standalone node: SIGHUP reloads the file; an invalid file keeps the
/// config in use and says why.
/// `hangup` is created before the node announces itself, so a SIGHUP
/// never meets the default action (exit).
pub async fn reload_on_hangup(
    gw: Arc<Gateway>,
    mut hangup: tokio::signal::unix::Signal,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            got = hangup.recv() => if got.is_none() { return },
        }
        let file = gw.cfg().file.clone();
        match Config::load(std::path::Path::new(&file)) {
            Ok(cfg) => {
                let backends = cfg.backends.len();
                match gw.reconfigure(cfg) {
                    Ok(()) => tracing::info!(file = %file, backends, "SIGHUP: config reloaded"),
                    Err(e) => tracing::error!(
                        "SIGHUP: the config was not reloaded, keeping the one in use: {e}"
                    ),
                }
            }
            Err(e) => {
                tracing::error!("SIGHUP: the config was not reloaded, keeping the one in use: {e}")
            }
        }
    }
}
