//! Active health checking, the shell around the pure cores in
//! [`score`], [`state`] and [`scrape`]: one probe loop per backend on a
//! connection pool of its own (never the request pool) that GETs the health
//! path, scrapes Prometheus metrics where configured, feeds the score and
//! state machine, and sleeps an adaptive, jittered interval; and one sweeper
//! that republishes effective weights (ramps move with time), panic mode
//! and the global breaker for the pickers to read lock-free.

pub mod score;
pub mod scrape;
pub mod state;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use zonegate_net::tls::BackendTls;

use crate::dataplane::connect::{self, Connector};
use hyper_util::rt::TokioExecutor;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::clock::tokio_now_ms;
use crate::dataplane::backend::{Backend, ProbeRecord};
use crate::node::gateway::Gateway;
use score::{components, raw_score, Signals};
use scrape::Scraped;
use state::{Cause, Change};

/// How often the sweeper republishes weights when nothing kicks it: fine
/// enough that a ramp moves smoothly, cheap at thousands of backends.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// A metrics page larger than this is discarded whole: the probe then has
/// no scrape, as if the backend exported no metrics.
const MAX_SCRAPE_BYTES: usize = 1024 * 1024;

/// The `state` label values of `zonegate_backend_state`.
const BACKEND_STATES: &[&str] = &["unknown", "healthy", "degraded", "unstable", "down"];

/// What one active probe saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProbeSample {
    pub ok: bool,
    pub latency_ms: f64,
    pub scraped: Option<Scraped>,
    /// Whether the probe got through to the backend at all.
    pub reach: Reach,
}

/// Whether a probe got through to its backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reach {
    /// A response head came back, whatever its status.
    Answered,
    /// The connect was refused: nothing listens there.
    Refused,
    /// Neither for certain (a timeout, a connection that broke).
    #[default]
    Unknown,
}

/// Something that can probe a backend: HTTP in production, a script in
/// the paused-clock tests.
pub trait Prober: Send + Sync + 'static {
    fn probe<'a>(&'a self, backend: &'a Backend) -> impl Future<Output = ProbeSample> + Send + 'a;
}

type ProbeClient = Client<Connector, Empty<Bytes>>;

/// Probes over HTTP(S) on a small keep-alive pool of its own, so probes
/// never queue behind (or take connections from) real requests; one pool
/// per backend TLS setting.
#[derive(Clone)]
pub struct HttpProber {
    clients: Arc<parking_lot::Mutex<Vec<(BackendTls, ProbeClient)>>>,
    timeout: Duration,
}

impl HttpProber {
    pub fn new(timeout: Duration) -> Self {
        Self {
            clients: Arc::default(),
            timeout,
        }
    }

    fn client(&self, tls: &BackendTls) -> ProbeClient {
        let mut clients = self.clients.lock();
        if let Some((_, c)) = clients.iter().find(|(t, _)| t == tls) {
            return c.clone();
        }
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connect::connector(self.timeout, tls));
        clients.push((tls.clone(), client.clone()));
        client
    }

    /// GETs `path`: whether it answered 2xx and its body (`None` without
    /// a whole answer), and how far the probe got.
    async fn get(&self, backend: &Backend, path: &str) -> (Option<(bool, Bytes)>, Reach) {
        let Some(req) = Uri::builder()
            .scheme(backend.scheme.clone())
            .authority(backend.authority.clone())
            .path_and_query(path)
            .build()
            .ok()
            .and_then(|uri| {
                let mut req = Request::get(uri);
                if let Some(p) = &backend.provider {
                    // A provider's model list wants its credential too.
                    for (name, value) in
                        crate::dataplane::provider::probe_headers(p, crate::clock::now_ms())
                    {
                        req = req.header(name, value);
                    }
                }
                req.body(Empty::new()).ok()
            })
        else {
            return (None, Reach::Unknown);
        };
        let exchange = async {
            let resp = match self.client(&backend.tls).request(req).await {
                Ok(resp) => resp,
                Err(e) if connect::is_refused(&e) => return (None, Reach::Refused),
                Err(_) => return (None, Reach::Unknown),
            };
            let ok = resp.status().is_success();
            let body = Limited::new(resp.into_body(), MAX_SCRAPE_BYTES)
                .collect()
                .await
                .ok()
                .map(|b| (ok, b.to_bytes()));
            (body, Reach::Answered)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or((None, Reach::Unknown))
    }
}

impl Prober for HttpProber {
    async fn probe<'a>(&'a self, backend: &'a Backend) -> ProbeSample {
        let started = Instant::now();
        let (answer, reach) = self.get(backend, &backend.health_path).await;
        let ok = matches!(answer, Some((true, _)));
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        // A failed health probe scores 0 whatever the metrics say, so the
        // scrape is skipped then.
        let scraped = match (&backend.metrics_path, ok) {
            (Some(path), true) => match self.get(backend, path).await {
                (Some((true, body)), _) => Some(scrape::parse(&String::from_utf8_lossy(&body))),
                _ => None,
            },
            _ => None,
        };
        ProbeSample {
            ok,
            latency_ms,
            scraped,
            reach,
        }
    }
}

/// Starts the health task: the sweeper, which starts one probe loop per
/// backend (and for backends a route rebuild adds). Everything stops when
/// the returned set is dropped or shut down.
pub fn spawn_probes(gw: &Arc<Gateway>) -> JoinSet<()> {
    spawn_with(gw, Arc::new(HttpProber::new(gw.cfg().health.timeout)))
}

/// [`spawn_probes`] with any prober.
pub fn spawn_with<P: Prober>(gw: &Arc<Gateway>, prober: Arc<P>) -> JoinSet<()> {
    let mut set = JoinSet::new();
    set.spawn(sweeper(Arc::clone(gw), prober));
    set
}

async fn sweeper<P: Prober>(gw: Arc<Gateway>, prober: Arc<P>) {
    let kick = Arc::new(Notify::new());
    let mut loops = JoinSet::new();
    let mut probed: HashSet<usize> = HashSet::new();
    loop {
        let routes = gw.routes.load_full();
        for b in &routes.backends {
            if probed.insert(Arc::as_ptr(b) as usize) {
                let (gw, b, p, k) = (
                    Arc::clone(&gw),
                    Arc::clone(b),
                    Arc::clone(&prober),
                    Arc::clone(&kick),
                );
                loops.spawn(probe_loop(gw, b, p, k));
            }
        }
        sweep(&gw, &routes, tokio_now_ms());
        tokio::select! {
            () = tokio::time::sleep(SWEEP_EVERY) => {}
            () = kick.notified() => {}
        }
    }
}

/// Republishes weights, panic flags and the breaker as of `now_ms`, and
/// reports what changed. The sweeper runs it every `SWEEP_EVERY`; a passive
/// ejection or refusal runs it at once, so the request path sees a pool in
/// panic before the next request, not a sweep later.
fn sweep(gw: &Gateway, routes: &crate::dataplane::routing::Routes, now_ms: u64) {
    let sweep = routes.sweep(now_ms, &gw.cfg().health);
    for p in sweep.panics {
        let reason = if p.on {
            format!(
                "{} of {} backends look bad, more than max_ejected_percent ({}%) lets go: \
                 routing over all of them by score",
                p.bad,
                p.of,
                gw.cfg().health.max_ejected_percent
            )
        } else {
            format!("{} of {} backends look bad: normal routing", p.bad, p.of)
        };
        gw.events
            .panic(&gw.metrics, &p.model, p.zone.as_str(), p.on, &reason);
    }
    if let Some(b) = sweep.breaker {
        let cfg = gw.cfg();
        let floor = cfg.health.floor_model.as_deref().unwrap_or("none");
        let reason = format!(
            "{} of {} models have no healthy backend (breaker at {}%); floor model: {floor}",
            b.unhealthy,
            b.of,
            gw.cfg().health.breaker_percent
        );
        gw.events.breaker(&gw.metrics, b.open, &reason);
    }
}

async fn probe_loop<P: Prober>(
    gw: Arc<Gateway>,
    backend: Arc<Backend>,
    prober: Arc<P>,
    kick: Arc<Notify>,
) {
    // Start at a random point of the interval so probes of many backends
    // (and of many gateway nodes) never arrive in lockstep.
    tokio::time::sleep(gw.cfg().health.interval.mul_f64(fastrand::f64())).await;
    loop {
        if !gw
            .routes
            .load()
            .backends
            .iter()
            .any(|b| Arc::ptr_eq(b, &backend))
        {
            return; // removed by a route rebuild
        }
        let started = Instant::now();
        let sample = prober.probe(&backend).await;
        gw.metrics
            .probe_duration
            .with_label_values(&[&backend.name])
            .observe(started.elapsed().as_secs_f64());
        let (next, changed) = evaluate(&gw, &backend, sample, tokio_now_ms());
        if changed {
            kick.notify_one();
        }
        tokio::time::sleep(next).await;
    }
}

/// Scores one probe sample with the passive signals gathered since the
/// last one, steps the state machine, reports what changed, and returns
/// when to probe next and whether anything changed.
pub fn evaluate(
    gw: &Gateway,
    backend: &Backend,
    sample: ProbeSample,
    now_ms: u64,
) -> (Duration, bool) {
    let cfg = &gw.cfg().health;
    match sample.reach {
        Reach::Answered => reached(backend),
        Reach::Refused => refused(backend, now_ms),
        Reach::Unknown => {}
    }
    let scraped = sample.scraped.unwrap_or_default();
    let signals = Signals {
        probe_ok: sample.ok,
        latency_ms: sample.ok.then_some(sample.latency_ms),
        error_rate: backend.take_error_rate(),
        queue_depth: scraped.queue_depth,
        kv_usage: scraped.kv_usage,
    };
    let comps = components(&signals, &cfg.score);
    let raw = raw_score(sample.ok, &comps, &cfg.score);
    let routes = gw.routes.load();
    let (eval, next, state, ejections) = routes.serialised(|| {
        backend.with_health(now_ms, cfg, |h| {
            h.components = comps;
            h.last_probe = Some(ProbeRecord {
                at_ms: now_ms,
                ok: sample.ok,
                latency_ms: (sample.latency_ms * 10.0).round() / 10.0,
                scraped: sample.scraped,
                raw_score: raw,
            });
            let eval = h.machine.evaluate(raw, sample.ok, now_ms, cfg, || {
                routes.may_eject(backend, cfg)
            });
            let next = match backend.probe_interval {
                // A provider's own interval while it serves (jittered by
                // up to a tenth); the watch list's backoff while it is out.
                Some(every) if h.machine.state != state::State::Down => {
                    every.mul_f64(0.9 + 0.2 * fastrand::f64())
                }
                _ => h.machine.next_probe(cfg, fastrand::f64()),
            };
            (eval, next, h.machine.state, h.machine.ejections)
        })
    });
    let zone = backend.zone.as_str();
    let labels = [backend.name.as_str(), zone];
    gw.metrics
        .backend_health_score
        .with_label_values(&labels)
        .set(eval.score);
    crate::telemetry::metrics::set_state(
        &gw.metrics.backend_state,
        &labels,
        BACKEND_STATES,
        state.as_str(),
    );
    gw.metrics
        .backend_effective_weight
        .with_label_values(&labels)
        .set(backend.effective_weight());
    let Some(change) = eval.change else {
        return (next, false);
    };
    let probe = if sample.ok {
        format!("probe ok in {:.0} ms", sample.latency_ms)
    } else {
        "probe failed".to_owned()
    };
    let reason = match change {
        Change::Ejected(_) => {
            backend.arm_trials(now_ms);
            format!(
                "score {:.0} under {} for {} evaluations ({probe}); out for at least {:?}",
                eval.score,
                cfg.eject_below,
                cfg.unhealthy_threshold,
                backend.health().machine.watch_time(cfg)
            )
        }
        Change::Rejoined => {
            backend.forget_past();
            format!(
                "score {:.0} above {} for {} evaluations; canary at {}% of its share, \
                 full after {:?} (ejection #{ejections})",
                eval.score,
                cfg.rejoin_above,
                cfg.healthy_threshold,
                cfg.canary_share * 100.0,
                cfg.canary_time + cfg.rejoin_ramp
            )
        }
        Change::EjectionRefused => format!(
            "score {:.0} under {} for {} evaluations, but ejecting it would take more than \
             max_ejected_percent ({}%) of a pool out: kept in",
            eval.score, cfg.eject_below, cfg.unhealthy_threshold, cfg.max_ejected_percent
        ),
        Change::Moved { .. } => format!("score {:.0} ({probe})", eval.score),
    };
    gw.events.backend(&gw.metrics, backend, change, &reason);
    (next, true)
}

/// A real request failed on `backend` (called by the request path): its
/// passive signal, which ejects it after `passive_failures` in a row
/// unless the pool-wide cap says no. Every change is an event.
pub fn passive_failure(gw: &Gateway, backend: &Backend, error: &str, now_ms: u64) {
    let cfg = &gw.cfg().health;
    let routes = gw.routes.load();
    // Serialised with every other ejection, so two racing ones cannot both
    // see room under the cap.
    let change = routes.serialised(|| {
        backend.record_failure(now_ms, cfg, || routes.may_eject_passive(backend, cfg))
    });
    let Some(change) = change else { return };
    let reason = match change {
        Change::Ejected(Cause::Passive) => format!(
            "{} consecutive failed requests, the last: {error}; half-open trials from 1s",
            cfg.passive_failures
        ),
        Change::EjectionRefused => format!(
            "{} consecutive failed requests, but ejecting it would take more than \
             max_ejected_percent ({}%) of a pool out: kept in, the pool routes in panic mode",
            cfg.passive_failures, cfg.max_ejected_percent
        ),
        _ => error.to_owned(),
    };
    gw.events.backend(&gw.metrics, backend, change, &reason);
    sweep(gw, &routes, now_ms);
}

/// A provider refused `backend`'s credential (401/403): ejected at once
/// with the cause `credentials` (an event, `zonegate_backend_ejections_total`
/// and the `ZonegateBackendCredentialsRefused` alert), never counted
/// against its zone.
pub fn credentials_refused(gw: &Gateway, backend: &Backend, error: &str, now_ms: u64) {
    let cfg = &gw.cfg().health;
    let routes = gw.routes.load();
    let change = routes.serialised(|| backend.credentials_refused(now_ms, cfg));
    let Some(change) = change else { return };
    let reason = format!(
        "{error}: its api_key is wrong, expired or not allowed the model; fix the key \
         (a key file is read again when it changes); half-open trials from 1s"
    );
    gw.events.backend(&gw.metrics, backend, change, &reason);
    sweep(gw, &routes, now_ms);
}

/// A connect to `backend` was refused (a request's or a probe's): it leaves
/// every pick until something reaches it again. Logged once per spell.
pub fn refused(backend: &Backend, now_ms: u64) {
    if backend.refused(now_ms) {
        tracing::warn!(
            backend = %backend.name,
            zone = %backend.zone,
            "connection refused: out of every pick (panic mode included) until a probe or a \
             half-open trial reaches it"
        );
    }
}

/// A response head came from `backend`: reachable. Logged when that ends a
/// spell of refused connects.
pub fn reached(backend: &Backend) {
    if backend.reached() {
        tracing::info!(
            backend = %backend.name,
            zone = %backend.zone,
            "answered again after refused connects: back in the picks"
        );
    }
}

/// A half-open trial on an ejected backend ended. A success brings it back
/// early, as a canary; a failure doubles the wait for the next trial.
pub fn trial_ended(gw: &Gateway, backend: &Backend, ok: bool, now_ms: u64) {
    backend.end_trial(ok, now_ms);
    if !ok {
        return;
    }
    let cfg = &gw.cfg().health;
    if let Some(change) =
        backend.with_health(now_ms, cfg, |h| h.machine.trial_succeeded(now_ms, cfg))
    {
        backend.forget_past();
        let reason = format!(
            "a trial request succeeded while it was out; canary at {}% of its share",
            cfg.canary_share * 100.0
        );
        gw.events.backend(&gw.metrics, backend, change, &reason);
    }
}

#[cfg(test)]
mod tests {
    //! The shell under a paused tokio clock: real timers, scripted probes,
    //! no waiting.

    use super::*;
    use crate::config::Config;
    use crate::telemetry::Metrics;
    use parking_lot::Mutex;
    use state::State;
    use tokio::time::Instant as TokioInstant;
    use zonegate_cluster::ClusterView;

    /// Probes answered by a script of the time since the test started.
    struct Script {
        start: TokioInstant,
        healthy: fn(&str, Duration) -> bool,
        calls: Mutex<Vec<(String, Duration)>>,
    }

    impl Prober for Script {
        async fn probe<'a>(&'a self, backend: &'a Backend) -> ProbeSample {
            let t = self.start.elapsed();
            self.calls.lock().push((backend.name.clone(), t));
            let ok = (self.healthy)(&backend.name, t);
            ProbeSample {
                ok,
                latency_ms: 5.0,
                scraped: None,
                reach: if ok { Reach::Answered } else { Reach::Unknown },
            }
        }
    }

    fn gateway() -> Arc<Gateway> {
        let text = "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\n\
                    admin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\
                    [[backends]]\nname = \"a\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"m\"]\n\
                    [[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:10\"\nmodels = [\"m\"]\n";
        let cfg = Arc::new(Config::parse("t.toml", text).unwrap());
        let (_tx, rx) =
            tokio::sync::watch::channel(Arc::new(ClusterView::initial([&cfg.node.zone])));
        Arc::new(Gateway::new(
            cfg,
            rx,
            None,
            zonegate_net::sign::KeyRing::random(zonegate_net::sign::Purpose::Pin),
            Metrics::new(),
        ))
    }

    fn script(healthy: fn(&str, Duration) -> bool) -> Arc<Script> {
        Arc::new(Script {
            start: TokioInstant::now(),
            healthy,
            calls: Mutex::new(Vec::new()),
        })
    }

    fn backend(gw: &Gateway, name: &str) -> Arc<Backend> {
        let routes = gw.routes.load();
        Arc::clone(routes.backends.iter().find(|b| b.name == name).unwrap())
    }

    /// Gaps between consecutive probes of `name`, in seconds.
    fn gaps(s: &Script, name: &str) -> Vec<f64> {
        let calls = s.calls.lock();
        let times: Vec<f64> = calls
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| t.as_secs_f64())
            .collect();
        times.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn within_jitter(gap: f64, base: f64) -> bool {
        gap >= base * 0.9 - 0.01 && gap <= base * 1.1 + 0.01
    }

    fn backend_at(port: u16) -> Backend {
        let cfg = crate::config::BackendConfig {
            name: "p".into(),
            zone: zonegate_cluster::ZoneId::new("az-a"),
            scheme: http::uri::Scheme::HTTP,
            authority: format!("127.0.0.1:{port}").parse().unwrap(),
            models: vec!["m".into()],
            weight: 1,
            health_path: "/health".into(),
            metrics_path: None,
            model_names: Default::default(),
            tls: BackendTls::default(),
            capacity: None,
            provider: None,
            probe_interval: None,
        };
        Backend::new(&cfg, &crate::config::HealthConfig::default(), 0)
    }

    #[tokio::test]
    async fn a_probe_tells_a_refused_connect_from_an_answer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let prober = HttpProber::new(Duration::from_secs(5));
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = prober.probe(&backend_at(closed)).await;
        assert_eq!((s.ok, s.reach), (false, Reach::Refused));

        // Up but unhealthy: it answered, so it is reachable.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                .await;
        });
        let s = prober.probe(&backend_at(port)).await;
        assert_eq!((s.ok, s.reach), (false, Reach::Answered));
    }

    #[tokio::test(start_paused = true)]
    async fn probe_interval_adapts_and_backs_off_on_the_watch_list() {
        let gw = gateway();
        // `b` is healthy for 60 s, fails until 600 s, then recovers.
        let s = script(|name, t| {
            name != "b" || t < Duration::from_secs(60) || t > Duration::from_secs(600)
        });
        let _tasks = spawn_with(&gw, Arc::clone(&s));
        tokio::time::sleep(Duration::from_secs(59)).await;
        let g = gaps(&s, "b");
        // The first evaluation moves the score (fast), then steady: 10 s.
        assert!(within_jitter(g[0], 2.0), "{g:?}");
        assert!(g[1..].iter().all(|&x| within_jitter(x, 10.0)), "{g:?}");

        tokio::time::sleep(Duration::from_secs(600 - 59)).await;
        let g = gaps(&s, "b");
        let failing_from = g.iter().position(|&x| within_jitter(x, 2.0) && x < 3.0);
        let tail: Vec<f64> = g.iter().rev().take(4).rev().copied().collect();
        // Once ejected, failing probes back off 30 → 60 → … → 300 s.
        assert!(g.iter().any(|&x| within_jitter(x, 30.0)), "{g:?}");
        assert!(g.iter().any(|&x| within_jitter(x, 60.0)), "{g:?}");
        assert!(g.iter().any(|&x| within_jitter(x, 120.0)), "{g:?}");
        assert!(failing_from.is_some(), "a moving score probes fast: {g:?}");
        assert!(
            tail.iter().all(|&x| x > 25.0),
            "watch list is probed slowly: {g:?}"
        );
        assert_eq!(backend(&gw, "b").health().machine.state, State::Down);

        // Recovery: the next passing probe switches to the fast interval
        // to gather the five evaluations a rejoin needs.
        tokio::time::sleep(Duration::from_secs(330)).await;
        let m = backend(&gw, "b").health().machine;
        assert_ne!(m.state, State::Down, "{m:?}");
        let g = gaps(&s, "b");
        let last_backoff = g.iter().rposition(|&x| x > 250.0).unwrap();
        let after = &g[last_backoff + 1..];
        assert!(after.len() >= 6, "{g:?}");
        assert!(after[..4].iter().all(|&x| within_jitter(x, 2.0)), "{g:?}");
        // Rejoined and steady again: back to 10 s.
        assert!(within_jitter(*g.last().unwrap(), 10.0), "{g:?}");
        // `a` never moved: steady 10 s the whole time, not in lockstep
        // with `b`.
        assert!(gaps(&s, "a")[1..].iter().all(|&x| within_jitter(x, 10.0)));
    }

    #[tokio::test(start_paused = true)]
    async fn slow_start_then_canary_ramp_after_a_rejoin() {
        let gw = gateway();
        // `b` fails between 320 s and 340 s.
        let s = script(|name, t| {
            name != "b" || t < Duration::from_secs(320) || t > Duration::from_secs(340)
        });
        let _tasks = spawn_with(&gw, Arc::clone(&s));
        let (a, b) = (backend(&gw, "a"), backend(&gw, "b"));
        assert!(b.effective_weight() < 0.02, "slow start at 1%");
        tokio::time::sleep(Duration::from_secs(150)).await;
        let w = b.effective_weight();
        assert!(
            (w - 0.505).abs() < 0.02,
            "half-way through the 5 min ramp: {w}"
        );
        tokio::time::sleep(Duration::from_secs(160)).await;
        assert_eq!(a.effective_weight(), 1.0);
        assert_eq!(b.effective_weight(), 1.0);

        tokio::time::sleep(Duration::from_secs(35)).await; // t = 345 s
        assert_eq!(b.health().machine.state, State::Down);
        assert_eq!(b.effective_weight(), 0.0);
        // Wait for the rejoin, one second at a time.
        let mut waited = 0;
        while b.health().machine.state == State::Down {
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += 1;
            assert!(waited < 600, "never rejoined");
        }
        let ramp = b.health().machine.ramp.unwrap();
        let at = |offset_s: u64| ramp.start_ms + offset_s * 1000;
        let wait_until = |ms: u64| {
            let now = crate::clock::tokio_now_ms();
            tokio::time::sleep(Duration::from_millis(ms.saturating_sub(now)))
        };
        wait_until(at(10)).await;
        let w = b.effective_weight();
        assert!((w - 0.05).abs() < 0.005, "a canary at 5%: {w}");
        wait_until(at(30 + 60)).await;
        let w = b.effective_weight();
        assert!((w - 0.525).abs() < 0.02, "half-way up the ramp: {w}");
        wait_until(at(30 + 120 + 1)).await;
        assert_eq!(b.effective_weight(), 1.0);
    }
}
