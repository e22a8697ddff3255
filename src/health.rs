//! Basic active health checks: a periodic GET of each backend's health path
//! on a connection pool of its own (never the request pool), feeding the
//! up/down hysteresis in [`Backend::record_probe`]. Passive failures from
//! real traffic are recorded by the request path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;

use crate::backend::Backend;
use crate::gateway::Gateway;

type ProbeClient = Client<HttpConnector, Empty<Bytes>>;

fn probe_client(timeout: Duration) -> ProbeClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(timeout));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(http)
}

/// Starts one probe loop per backend; they stop when the set is dropped.
pub fn spawn_probes(gw: &Arc<Gateway>) -> JoinSet<()> {
    let client = probe_client(gw.cfg.health.timeout);
    let mut set = JoinSet::new();
    for backend in gw.routes.load().backends.iter() {
        let (gw, backend, client) = (Arc::clone(gw), Arc::clone(backend), client.clone());
        set.spawn(async move { probe_loop(gw, backend, client).await });
    }
    set
}

async fn probe_loop(gw: Arc<Gateway>, backend: Arc<Backend>, client: ProbeClient) {
    let interval = gw.cfg.health.interval;
    // Start at a random point of the interval so probes of many backends
    // (and of many gateway nodes) never arrive in lockstep.
    tokio::time::sleep(interval.mul_f64(fastrand::f64())).await;
    loop {
        let ok = probe(&gw, &backend, &client).await;
        if let Some(t) = backend.record_probe(ok, &gw.cfg.health) {
            let reason = if ok {
                "health probes passing"
            } else {
                "health probes failing"
            };
            gw.events.backend(&gw.metrics, &backend, t, reason);
        }
        // ±10% jitter on every period keeps the spread.
        tokio::time::sleep(interval.mul_f64(0.9 + 0.2 * fastrand::f64())).await;
    }
}

async fn probe(gw: &Gateway, backend: &Backend, client: &ProbeClient) -> bool {
    let uri = Uri::builder()
        .scheme(backend.scheme.clone())
        .authority(backend.authority.clone())
        .path_and_query(backend.health_path.as_str())
        .build();
    let Ok(uri) = uri else { return false };
    let Ok(req) = Request::get(uri).body(Empty::new()) else {
        return false;
    };
    let started = Instant::now();
    let result = tokio::time::timeout(gw.cfg.health.timeout, client.request(req)).await;
    gw.metrics
        .probe_duration
        .with_label_values(&[&backend.name])
        .observe(started.elapsed().as_secs_f64());
    matches!(result, Ok(Ok(resp)) if resp.status().is_success())
}
