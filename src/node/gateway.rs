//! The state one node's data plane shares across requests: validated
//! config, the swappable route table, the latest cluster view, the upstream
//! pool, the retry budget, metrics and events.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use zonegate_cluster::{ClusterNode, ClusterView, ZoneObservation};

use crate::config::Config;
use crate::dataplane::affinity::{PinSigner, PinTable};
use crate::dataplane::observe::ZoneStats;
use crate::dataplane::retry::{RetryBudget, Retrying};
use crate::dataplane::routing::{Routes, TooCostly};
use crate::telemetry::events::EventLog;
use crate::telemetry::Metrics;
use zonegate_net::listen::{Handed, Stats};
use zonegate_net::sign::KeyRing;
use zonegate_net::spread::Spread;

pub struct Gateway {
    /// The config in effect: the node's file, with the cluster's replicated
    /// sections once it has them; swapped whole by [`Gateway::reconfigure`].
    config: ArcSwap<Config>,
    /// Built from the config; swapped whole with it (live backends kept by
    /// name); read per request without a lock.
    pub routes: ArcSwap<Routes>,
    /// The control plane's latest view; the data plane never waits on it.
    pub view: watch::Receiver<Arc<ClusterView>>,
    pub metrics: Metrics,
    pub events: Arc<EventLog>,
    /// This node's Raft member, or `None` when it runs standalone.
    pub cluster: Option<Arc<ClusterNode>>,
    /// Signs the session pins clients carry between nodes.
    pub pin_signer: PinSigner,
    /// Session pins this node remembers.
    pub pins: PinTable,
    /// This period's per-zone request results, reported to the leader.
    pub zone_stats: ZoneStats,
    /// Retries running on this node, for the `[retry]` budget.
    pub retry_budget: RetryBudget,
    /// Tenants' allocations on this node, models' limits, zone capacity.
    /// The quota stage's state, rebuilt with the config.
    pub quotas: ArcSwap<crate::dataplane::quota::Quotas>,
    /// Tenants' budgets on this node (rebuilt with the config, meters kept).
    pub budgets: ArcSwap<crate::dataplane::budget::Budgets>,
    /// What this node's answers cost, by the hour; on the leader `cluster_spend`
    /// holds what the nodes reported.
    pub spend: Arc<crate::dataplane::spend::Ledger>,
    pub cluster_spend: Arc<crate::dataplane::spend::Ledger>,
    /// Decided once from config: checked on every request.
    witness: bool,
    /// Set from SIGTERM on: readiness fails, the drain has begun.
    pub drain: crate::node::drain::Drain,
    /// The node's listeners (name, counters, connection budget), for
    /// metrics; filled by `node::start`.
    pub listeners: parking_lot::Mutex<Vec<(&'static str, Arc<Stats>, usize)>>,
    /// The data-plane threads' connections (`zonegate_net::spread`), for
    /// metrics; set by `node::start`.
    pub data_spread: std::sync::OnceLock<Arc<Spread<Handed>>>,
    /// The last committed config version this node could not apply, while
    /// it routes with an older one (cleared when a later one applies).
    config_failure: parking_lot::Mutex<Option<ApplyFailure>>,
    /// Shadow copies in flight and their comparison records, by shadow.
    pub shadows: crate::dataplane::policy::Shadows,
    /// Traces, with `[telemetry] otlp_endpoint`; set by `node::start`.
    /// Unset, a request tests it and nothing more.
    pub tracer: std::sync::OnceLock<crate::telemetry::traces::Tracer>,
}

/// A committed config version a node could not apply: it keeps routing
/// with the one it had (`kept`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ApplyFailure {
    /// The version that failed.
    pub version: u64,
    /// The version this node still routes with.
    pub kept: u64,
    pub reason: String,
}

/// Why a config could not be swapped in.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("too costly to build: {0}")]
    TooCostly(#[from] TooCostly),
    /// A bug, caught at the boundary: the node keeps its config and runs on.
    #[error("building it panicked: {0}")]
    Panicked(String),
}

impl Gateway {
    /// Starts a retry if the budget has room with `active` requests in
    /// flight (the asking one included), under the `[retry]` budget in
    /// effect: a config applied meanwhile changes the cap at once, and the
    /// retries running keep their places.
    pub fn try_retry(&self, active: u64) -> Option<Retrying> {
        let cfg = self.cfg();
        let r = &cfg.retry;
        self.retry_budget
            .try_retry(active, r.budget_ratio, r.min_concurrent_retries)
    }

    /// This period's observations of every zone, for the leader's detector:
    /// request results since the last call (see `observe`) and the share
    /// of each zone's backends that can take traffic, as seen from here
    /// (probes reach every zone's backends, so a zone whose own nodes are
    /// silent is still observed).
    pub fn zone_observations(&self) -> Vec<ZoneObservation> {
        let routes = self.routes.load();
        self.zone_stats
            .take()
            .into_iter()
            .map(|(zone, counts)| {
                let backends: Vec<_> = routes.backends.iter().filter(|b| b.zone == zone).collect();
                let gpu_health = if backends.is_empty() {
                    0.0
                } else {
                    backends.iter().map(|b| b.gpu_health()).sum::<f64>() / backends.len() as f64
                };
                ZoneObservation {
                    gw_error_rate: counts.error_rate(),
                    timeout_rate: counts.timeout_rate(),
                    gpu_health,
                    requests: counts.requests,
                    zone,
                }
            })
            .collect()
    }

    /// A witness votes in the Raft group but serves no data-plane traffic.
    pub fn is_witness(&self) -> bool {
        self.witness
    }

    /// [`Gateway::try_new`] for configs known to fit (tests, tools).
    ///
    /// # Panics
    /// When the config's route table is over the cost cap.
    pub fn new(
        cfg: Arc<Config>,
        view: watch::Receiver<Arc<ClusterView>>,
        cluster: Option<Arc<ClusterNode>>,
        pin_keys: KeyRing,
        metrics: Metrics,
    ) -> Self {
        Self::try_new(cfg, view, cluster, pin_keys, metrics)
            .unwrap_or_else(|e| panic!("the route table is too costly: {e}"))
    }

    /// A node's shared state from its config; a route table over the cost
    /// cap ([`crate::dataplane::routing::ring_points`]) is refused, naming
    /// the key.
    pub fn try_new(
        cfg: Arc<Config>,
        view: watch::Receiver<Arc<ClusterView>>,
        cluster: Option<Arc<ClusterNode>>,
        pin_keys: KeyRing,
        metrics: Metrics,
    ) -> Result<Self, TooCostly> {
        let routes = Routes::try_build(&cfg, None)?;
        for b in &routes.backends {
            metrics
                .backend_up
                .with_label_values(&[&b.name, b.zone.as_str()])
                .set(1);
            metrics
                .backend_in_flight
                .with_label_values(&[&b.name, b.zone.as_str()])
                .set(0);
        }
        let quotas = crate::dataplane::quota::Quotas::new(&cfg, &view.borrow(), &metrics);
        let budgets = Arc::new(crate::dataplane::budget::Budgets::new(
            &cfg,
            &metrics,
            None,
            crate::clock::unix_ms(),
        ));
        let spend = Arc::new(crate::dataplane::spend::Ledger::default());
        let cluster_spend = Arc::new(crate::dataplane::spend::Ledger::default());
        if let Some(node) = &cluster {
            feed_rebalance(node, &quotas, &cfg);
            crate::dataplane::budget::feed(node, &cfg, &quotas, &budgets, (&spend, &cluster_spend));
        }
        Ok(Self {
            config_failure: parking_lot::Mutex::new(None),
            shadows: Default::default(),
            quotas: ArcSwap::from_pointee(quotas),
            budgets: ArcSwap::new(budgets),
            spend,
            cluster_spend,
            routes: ArcSwap::from_pointee(routes),
            view,
            metrics,
            events: Arc::new(EventLog::default()),
            cluster,
            pin_signer: PinSigner::new(pin_keys),
            listeners: parking_lot::Mutex::new(Vec::new()),
            data_spread: std::sync::OnceLock::new(),
            tracer: std::sync::OnceLock::new(),
            pins: PinTable::new(cfg.affinity.pin_capacity, cfg.affinity.pin_ttl),
            witness: cfg
                .members
                .iter()
                .any(|m| m.id == cfg.node.id && m.role == zonegate_cluster::Role::Witness),
            zone_stats: ZoneStats::new(
                cfg.backends
                    .iter()
                    .map(|b| &b.zone)
                    .chain(cfg.members.iter().map(|m| &m.zone))
                    .chain([&cfg.node.zone]),
            ),
            drain: crate::node::drain::Drain::default(),
            retry_budget: RetryBudget::new(),
            config: ArcSwap::new(cfg),
        })
    }

    /// Routes with `cfg` from now on: the route table rebuilt (backends
    /// unchanged in address, zone, weight and TLS keep their live state;
    /// new ones start in slow start; removed ones finish what they carry
    /// and their probes stop) and the quota stage rebuilt, each swapped
    /// whole. Requests in flight keep the versions they started with.
    ///
    /// Nothing is swapped when the build fails: over the cost cap, or a
    /// panic, caught here so that a config one node cannot build leaves it
    /// on its last good one instead of taking it down (and down again at
    /// every restart, since it re-applies the committed config).
    pub fn reconfigure(&self, cfg: Config) -> Result<(), ApplyError> {
        let cfg = Arc::new(cfg);
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            debug_fail_point(&cfg);
            let routes = Routes::try_build(&cfg, Some(&self.routes.load()))?;
            let quotas =
                crate::dataplane::quota::Quotas::new(&cfg, &self.view.borrow(), &self.metrics);
            let budgets = crate::dataplane::budget::Budgets::new(
                &cfg,
                &self.metrics,
                Some(&self.budgets.load()),
                crate::clock::unix_ms(),
            );
            Ok::<_, TooCostly>((routes, quotas, budgets))
        }));
        let (routes, quotas, budgets) = match built {
            Ok(built) => built?,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "a panic without a message".into());
                return Err(ApplyError::Panicked(message));
            }
        };
        let budgets = Arc::new(budgets);
        if let Some(node) = &self.cluster {
            feed_rebalance(node, &quotas, &cfg);
            crate::dataplane::budget::feed(
                node,
                &cfg,
                &quotas,
                &budgets,
                (&self.spend, &self.cluster_spend),
            );
        }
        self.budgets.store(budgets);
        self.pins
            .resize(cfg.affinity.pin_capacity, cfg.affinity.pin_ttl);
        self.config.store(Arc::clone(&cfg));
        self.routes.store(Arc::new(routes));
        self.quotas.store(Arc::new(quotas));
        Ok(())
    }

    /// The committed config this node could not apply, if it routes with
    /// an older one because of it.
    pub fn config_failure(&self) -> Option<ApplyFailure> {
        self.config_failure.lock().clone()
    }

    /// Records the outcome of applying a committed config version: a
    /// failure is logged, counted (`zonegate_config_apply_failed_total`)
    /// and shown in `ctl status` until a later version applies.
    pub fn record_config_apply(&self, version: u64, outcome: Result<(), String>) {
        let mut failure = self.config_failure.lock();
        match outcome {
            Ok(()) => *failure = None,
            Err(reason) => {
                let kept = self.cfg().config_version;
                tracing::error!(
                    config_version = version,
                    routing_with = kept,
                    "the cluster's config version {version} cannot be applied on this node; it keeps routing with version {kept}: {reason}"
                );
                self.metrics.config_apply_failed.inc();
                *failure = Some(ApplyFailure {
                    version,
                    kept,
                    reason,
                });
            }
        }
    }

    /// The config in effect (cheap; hold it briefly, or take
    /// [`Gateway::cfg_arc`] to keep one version across awaits).
    pub fn cfg(&self) -> arc_swap::Guard<Arc<Config>> {
        self.config.load()
    }

    /// The config in effect, to keep across a whole request.
    pub fn cfg_arc(&self) -> Arc<Config> {
        self.config.load_full()
    }
}

/// Debug builds only (tests): `ZONEGATE_DEBUG_FAIL_CONFIG_APPLY=<node
/// id>:<text>` makes node `<id>` panic while building any config whose
/// replicated sections contain `<text>`, so a test can make one node's
/// build fail. Release builds never read it.
#[cfg(debug_assertions)]
fn debug_fail_point(cfg: &Config) {
    let Ok(v) = std::env::var("ZONEGATE_DEBUG_FAIL_CONFIG_APPLY") else {
        return;
    };
    if let Some((id, text)) = v.split_once(':') {
        if id.trim().parse() == Ok(cfg.node.id) && !text.is_empty() && cfg.replicated.contains(text)
        {
            panic!(
                "ZONEGATE_DEBUG_FAIL_CONFIG_APPLY: injected failure building config version {}",
                cfg.config_version
            );
        }
    }
}

#[cfg(not(debug_assertions))]
fn debug_fail_point(_: &Config) {}

/// The quota stage's demand goes into this node's zone reports and its
/// tenants' quotas into the leader's rebalance.
fn feed_rebalance(node: &ClusterNode, quotas: &crate::dataplane::quota::Quotas, cfg: &Config) {
    let tenants = quotas.tenants.clone();
    node.set_demand_source(Arc::new(move || {
        crate::dataplane::quota::Quotas::take_demand(&tenants)
    }));
    node.set_rebalance_plan(quotas.rebalance_plan(cfg));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!(
            "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\n\
             admin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\
             [[backends]]\nname = \"a\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"m\"]\n\
             {extra}"
        );
        Config::parse("t.toml", &text).expect("config")
    }

    #[test]
    fn the_retry_budget_follows_the_applied_config_and_keeps_running_retries() {
        let retry = "[retry]\nbudget_ratio = 0.0\nmin_concurrent_retries = 1\n";
        let cfg = Arc::new(config(retry));
        let (_tx, rx) = watch::channel(Arc::new(ClusterView::initial([&cfg.node.zone])));
        let gw = Gateway::new(
            cfg,
            rx,
            None,
            KeyRing::random(zonegate_net::sign::Purpose::Pin),
            Metrics::new(),
        );
        let first = gw.try_retry(1);
        assert!(first.is_some(), "the floor allows one");
        assert!(gw.try_retry(1).is_none(), "while it runs, no second");

        // A config with a higher floor: one more at once, the first still
        // counted.
        let more = "[[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:10\"\nmodels = [\"m\"]\n";
        gw.reconfigure(config(&format!(
            "{more}[retry]\nbudget_ratio = 0.0\nmin_concurrent_retries = 2\n"
        )))
        .unwrap();
        let second = gw.try_retry(1);
        assert!(second.is_some());
        assert!(gw.try_retry(1).is_none());
        drop((first, second));
        assert_eq!(gw.retry_budget.running(), 0);
        assert!(gw.try_retry(1).is_some(), "places are given back");
    }
}
