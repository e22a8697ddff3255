//! The simulated network: each RPC is handed to the target node's own axum
//! router in-process, after a seeded delay, unless the link is cut, the
//! target is down or the message is lost. A lost message or a cut link
//! is silence (the caller times out), a down node refuses at once (no
//! process listens). Delays are drawn per message, so messages overtake
//! one another.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower::ServiceExt;
use zonegate_cluster::sim::{Answer, Net};
use zonegate_cluster::NodeId;

use super::rng::Rng;

#[derive(Default)]
struct Links {
    routers: BTreeMap<NodeId, axum::Router>,
    down: BTreeSet<NodeId>,
    /// Directed `(from, to)` pairs that drop everything.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Parts per million of messages lost.
    loss_ppm: u64,
    /// Each message's one-way delay: `base` plus up to `jitter` ms.
    base_ms: u64,
    jitter_ms: u64,
    rng: Rng,
    delivered: u64,
}

pub struct SimNet {
    links: Arc<Mutex<Links>>,
}

fn lock(links: &Mutex<Links>) -> std::sync::MutexGuard<'_, Links> {
    links.lock().unwrap_or_else(|p| p.into_inner())
}

fn passes(links: &Mutex<Links>, from: NodeId, to: NodeId) -> bool {
    let l = lock(links);
    !l.cut.contains(&(from, to)) && !l.down.contains(&to)
}

impl SimNet {
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(Self {
            links: Arc::new(Mutex::new(Links {
                rng: Rng::new(seed ^ 0x6E65_7477_6F72_6B21),
                base_ms: 1,
                jitter_ms: 2,
                ..Links::default()
            })),
        })
    }

    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        lock(&self.links)
    }

    pub fn set_down(&self, node: NodeId, down: bool) {
        let mut l = self.links();
        if down {
            l.down.insert(node);
            l.routers.remove(&node);
        } else {
            l.down.remove(&node);
        }
    }

    pub fn cut(&self, from: NodeId, to: NodeId) {
        self.links().cut.insert((from, to));
    }

    /// Cut every link between the groups, both ways.
    pub fn partition(&self, a: &[NodeId], b: &[NodeId]) {
        let mut l = self.links();
        for &x in a {
            for &y in b {
                l.cut.insert((x, y));
                l.cut.insert((y, x));
            }
        }
    }

    pub fn heal(&self) {
        let mut l = self.links();
        l.cut.clear();
        l.loss_ppm = 0;
        l.base_ms = 1;
        l.jitter_ms = 2;
    }

    pub fn set_weather(&self, loss_ppm: u64, base_ms: u64, jitter_ms: u64) {
        let mut l = self.links();
        l.loss_ppm = loss_ppm;
        l.base_ms = base_ms;
        l.jitter_ms = jitter_ms;
    }

    pub fn delivered(&self) -> u64 {
        self.links().delivered
    }
}

impl Net for SimNet {
    fn serve(&self, node: NodeId, router: axum::Router) {
        let mut l = self.links();
        l.routers.insert(node, router);
        l.down.remove(&node);
    }

    fn exchange(
        &self,
        from: NodeId,
        to: NodeId,
        request: axum::http::Request<axum::body::Body>,
        ttl: Duration,
    ) -> Answer {
        let (router, there, back, lost_there, lost_back) = {
            let mut l = self.links();
            let router = l
                .routers
                .get(&to)
                .cloned()
                .filter(|_| !l.down.contains(&to));
            let (base, jitter, loss) = (l.base_ms, l.jitter_ms, l.loss_ppm);
            let mut delay = || base + l.rng.below(jitter + 1);
            let (there, back) = (delay(), delay());
            let lost_there = l.rng.below(1_000_000) < loss;
            let lost_back = l.rng.below(1_000_000) < loss;
            (router, there, back, lost_there, lost_back)
        };
        let net = self.links.clone();
        Box::pin(async move {
            let Some(router) = router else {
                return Err(format!("node {to} is down: connection refused"));
            };
            let trip = async {
                tokio::time::sleep(Duration::from_millis(there)).await;
                if lost_there || !passes(&net, from, to) {
                    return std::future::pending().await;
                }
                lock(&net).delivered += 1;
                // The server works on even if the caller gives up.
                let handled = tokio::spawn(router.oneshot(request));
                let response = match handled.await {
                    Ok(Ok(response)) => response,
                    Ok(Err(never)) => match never {},
                    Err(e) => return Err(format!("node {to}'s handler failed: {e}")),
                };
                tokio::time::sleep(Duration::from_millis(back)).await;
                if lost_back || !passes(&net, to, from) {
                    return std::future::pending().await;
                }
                Ok(response)
            };
            tokio::time::timeout(ttl, trip)
                .await
                .unwrap_or_else(|_| Err(format!("no answer from node {to} within {ttl:?}")))
        })
    }
}
