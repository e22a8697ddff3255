//! One inference backend at run time: where it is, and the live signals the
//! balancer reads (in-flight, latency EWMA, 429 cooldown, effective weight)
//! plus its health state. Everything a pick reads is an atomic, so picking
//! never locks; the health state sits behind a lock that only the health
//! task and a passive ejection take.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use zonegate_cluster::ZoneId;
use zonegate_net::tls::BackendTls;

use parking_lot::Mutex;
use serde::Serialize;

use crate::config::{BackendConfig, HealthConfig, ProviderConfig};
use crate::health::score::Components;
use crate::health::scrape::Scraped;
use crate::health::state::{Cause, Change, Machine, State};

/// Smoothing of the latency EWMA: each sample moves it by this share.
const LATENCY_ALPHA: f64 = 0.2;
/// Smoothing of the recent success share: each request's outcome moves it
/// by this share, so it follows the last five or so.
const SUCCESS_ALPHA: f64 = 0.2;
/// The least share of its panic weight a backend keeps however it fails:
/// still sampled now and then, so a recovery is noticed, but retries are
/// not spent on it.
const FAILING_SHARE: f64 = 0.01;
/// What a backend without samples is assumed to take, so new backends are
/// neither starved nor flooded by p2c.
const INITIAL_LATENCY_MS: f64 = 50.0;
/// How long a latency sample counts as evidence. Older than this, a
/// backend is judged by its pool's typical latency instead (see
/// [`Backend::fresh_latency_ms`]), and its next sample starts afresh.
const LATENCY_FRESH_MS: u64 = 10_000;

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub zone: ZoneId,
    /// `name` and `zone` as the response headers that name them.
    pub name_value: Option<http::HeaderValue>,
    pub zone_value: Option<http::HeaderValue>,
    pub scheme: Scheme,
    pub authority: Authority,
    /// The `Host` header of requests to it.
    pub host_value: Option<http::HeaderValue>,
    /// How an `https://` backend is verified.
    pub tls: BackendTls,
    pub weight: u32,
    pub health_path: String,
    pub metrics_path: Option<String>,
    model_names: HashMap<String, String>,
    /// A commercial provider's settings (`None`: a plain OpenAI-format
    /// backend, whose requests pass through untouched).
    pub provider: Option<Arc<ProviderConfig>>,
    /// Its own probe interval, if it has one (providers: 30 s).
    pub probe_interval: Option<Duration>,
    hot: Hot,
    /// Consecutive failed requests (any success resets it).
    passive_streak: AtomicU32,
    /// `[health] passive_failures`: a streak this long means "failing now".
    passive_threshold: u32,
    /// Requests and failures since the health task last looked.
    window_requests: AtomicU64,
    window_failures: AtomicU64,
    /// Half-open trials while ejected: when the next may start (ms on the
    /// monotonic clock), the current interval, and whether one is running.
    trial_at_ms: AtomicU64,
    trial_interval_ms: AtomicU64,
    trial_running: AtomicBool,
    health: Mutex<Health>,
}

/// The `Host` header for requests to `authority`: its host, and its port
/// unless the scheme's default (as HTTP clients write it).
fn host_value(scheme: &Scheme, authority: &Authority) -> Option<http::HeaderValue> {
    let default = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    match authority.port_u16() {
        Some(port) if port != default => {
            http::HeaderValue::from_str(&format!("{}:{port}", authority.host())).ok()
        }
        _ => http::HeaderValue::from_str(authority.host()).ok(),
    }
}

/// The first half-open trial comes this long after an ejection; each
/// failed one doubles the wait, up to [`TRIAL_MAX_MS`].
const TRIAL_FIRST_MS: u64 = 1_000;
const TRIAL_MAX_MS: u64 = 30_000;

/// Everything a pick reads, in one cache line: at thousands of backends a
/// pick touches a few random ones, and one miss each beats several.
#[derive(Debug)]
#[repr(C, align(64))]
struct Hot {
    in_flight: AtomicU64,
    cooldown_until_ms: AtomicU64,
    /// Config weight × state multiplier × slow-start/canary ramp (f64
    /// bits), kept current by the health task; what the pickers read.
    effective_weight: AtomicU64,
    /// Config weight × score/100 (f64 bits): the weight in panic mode.
    panic_weight: AtomicU64,
    latency_ewma_ms: AtomicU64,
    latency_sampled_at_ms: AtomicU64,
    /// Share of recent requests that succeeded, 0–1 (f64 bits): what
    /// panic mode weighs a backend by, besides its score and load.
    recent_success: AtomicU64,
    /// Mirrors `health.machine.state == Down` for lock-free readers.
    down: AtomicBool,
    /// A connect to it was refused: out of every pick, panic mode
    /// included, until a probe or a half-open trial gets an answer.
    unreachable: AtomicBool,
}

/// The health model's view of one backend, behind a lock that only the
/// health task and a passive ejection take (never a pick).
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    pub machine: Machine,
    pub components: Components,
    pub last_probe: Option<ProbeRecord>,
}

/// The most recent active probe, for the admin API.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeRecord {
    /// On the monotonic clock of [`crate::clock::now_ms`].
    pub at_ms: u64,
    pub ok: bool,
    pub latency_ms: f64,
    pub scraped: Option<Scraped>,
    pub raw_score: f64,
}

impl Backend {
    pub fn new(cfg: &BackendConfig, health: &HealthConfig, now_ms: u64) -> Self {
        let machine = Machine::new(now_ms, health);
        let weight = f64::from(cfg.weight);
        Self {
            name: cfg.name.clone(),
            zone: cfg.zone.clone(),
            name_value: crate::dataplane::forward::shared_value(&cfg.name),
            zone_value: crate::dataplane::forward::shared_value(cfg.zone.as_str()),
            scheme: cfg.scheme.clone(),
            authority: cfg.authority.clone(),
            host_value: host_value(&cfg.scheme, &cfg.authority),
            tls: cfg.tls.clone(),
            weight: cfg.weight,
            health_path: cfg.health_path.clone(),
            metrics_path: cfg.metrics_path.clone(),
            model_names: cfg.model_names.clone(),
            provider: cfg.provider.clone(),
            probe_interval: cfg.probe_interval,
            hot: Hot {
                in_flight: AtomicU64::new(0),
                latency_ewma_ms: AtomicU64::new(INITIAL_LATENCY_MS.to_bits()),
                latency_sampled_at_ms: AtomicU64::new(0),
                recent_success: AtomicU64::new(1.0f64.to_bits()),
                cooldown_until_ms: AtomicU64::new(0),
                down: AtomicBool::new(false),
                unreachable: AtomicBool::new(false),
                effective_weight: AtomicU64::new(
                    (weight * machine.factor(now_ms, health)).to_bits(),
                ),
                panic_weight: AtomicU64::new(weight.to_bits()),
            },
            passive_streak: AtomicU32::new(0),
            passive_threshold: health.passive_failures,
            window_requests: AtomicU64::new(0),
            window_failures: AtomicU64::new(0),
            trial_at_ms: AtomicU64::new(0),
            trial_interval_ms: AtomicU64::new(TRIAL_FIRST_MS),
            trial_running: AtomicBool::new(false),
            health: Mutex::new(Health {
                machine,
                components: Components::default(),
                last_probe: None,
            }),
        }
    }

    /// The backend's own name for a logical model, when it differs.
    pub fn physical_model(&self, logical: &str) -> Option<&str> {
        self.model_names.get(logical).map(String::as_str)
    }

    /// Whether it serves requests to `endpoint` (an Anthropic backend
    /// has no embeddings or legacy completions).
    pub fn serves(&self, endpoint: crate::dataplane::provider::Endpoint) -> bool {
        self.provider
            .as_ref()
            .is_none_or(|p| crate::dataplane::provider::serves(p.kind, endpoint))
    }

    /// A provider refused its credential: out at once (`credentials`),
    /// whatever the pool-wide cap (a backend that cannot authenticate
    /// serves nobody, panic mode included), with half-open trials backing
    /// off so the provider is not asked again in a loop. `None` when it
    /// was out already.
    pub fn credentials_refused(&self, now_ms: u64, cfg: &HealthConfig) -> Option<Change> {
        self.window_requests.fetch_add(1, Ordering::Relaxed);
        self.note_outcome(false);
        let change = self.with_health(now_ms, cfg, |h| h.machine.credentials_refused(now_ms));
        if change.is_some() {
            self.arm_trials(now_ms);
        }
        change
    }

    /// Not ejected.
    pub fn is_up(&self) -> bool {
        !self.hot.down.load(Ordering::Relaxed)
    }

    /// Whether a new request may go here at `now_ms` outside panic mode.
    pub fn is_usable(&self, now_ms: u64) -> bool {
        self.is_up() && !self.is_unreachable() && !self.is_cooling(now_ms)
    }

    /// A connect to it was refused, and nothing has reached it since.
    pub fn is_unreachable(&self) -> bool {
        self.hot.unreachable.load(Ordering::Relaxed)
    }

    /// A connect was refused at `now_ms`: nothing listens there, which is
    /// certain (a timeout is not), so it leaves every pick until a probe or
    /// a half-open trial gets an answer from it. Returns whether this is
    /// news (it was reachable until now).
    pub fn refused(&self, now_ms: u64) -> bool {
        let news = !self.hot.unreachable.swap(true, Ordering::Relaxed);
        // An ejected backend has its trials scheduled already.
        if news && self.is_up() {
            self.arm_trials(now_ms);
        }
        news
    }

    /// A response head came from it (a probe's or a request's): it is
    /// reachable. Returns whether it was marked unreachable until now.
    /// Writes only on a change: this runs on every answer.
    pub fn reached(&self) -> bool {
        self.is_unreachable() && self.hot.unreachable.swap(false, Ordering::Relaxed)
    }

    /// Share of its recent requests that succeeded, in
    /// [`FAILING_SHARE`, 1]; at the floor while its last `passive_failures`
    /// requests all failed.
    pub fn recent_success(&self) -> f64 {
        if self.failing_now() {
            return FAILING_SHARE;
        }
        f64::from_bits(self.hot.recent_success.load(Ordering::Relaxed)).clamp(FAILING_SHARE, 1.0)
    }

    fn note_outcome(&self, ok: bool) {
        let old = f64::from_bits(self.hot.recent_success.load(Ordering::Relaxed));
        if ok && old >= 1.0 {
            return; // the usual case: no write on the request path
        }
        let target = if ok { 1.0 } else { 0.0 };
        let mut new = old + SUCCESS_ALPHA * (target - old);
        if new > 0.999 {
            new = 1.0;
        }
        // A lost update between two racing requests only drops one sample.
        self.hot
            .recent_success
            .store(new.to_bits(), Ordering::Relaxed);
    }

    /// The weight a picker gives this backend at `now_ms`: none while it
    /// is unreachable or cooling down after a 429; in panic mode its
    /// score-based weight times its recent success; else its effective
    /// weight.
    pub fn pick_weight(&self, panic: bool, now_ms: u64) -> f64 {
        if self.is_unreachable() || self.is_cooling(now_ms) {
            return 0.0;
        }
        if panic {
            self.panic_weight() * self.recent_success()
        } else {
            self.effective_weight()
        }
    }

    /// The cost p2c compares at `now_ms`: requests in flight (this one
    /// included) × latency, where a backend without recent latency samples
    /// is taken to be as fast as its pool typically is (`typical_ms`). In
    /// panic mode the cost is divided by its recent success: a backend
    /// that fails fast looks idle and quick by load alone, and must not
    /// win every comparison for that.
    pub fn pick_cost(&self, panic: bool, now_ms: u64, typical_ms: f64) -> f64 {
        let latency = self.fresh_latency_ms(now_ms).unwrap_or(typical_ms);
        let cost = (self.in_flight() + 1) as f64 * latency;
        if panic {
            cost / self.recent_success()
        } else {
            cost
        }
    }

    pub fn is_cooling(&self, now_ms: u64) -> bool {
        self.hot.cooldown_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// The weight the pickers use: 0 while ejected.
    pub fn effective_weight(&self) -> f64 {
        f64::from_bits(self.hot.effective_weight.load(Ordering::Relaxed))
    }

    /// The weight in panic mode: by score, 0 only when passively ejected.
    pub fn panic_weight(&self) -> f64 {
        f64::from_bits(self.hot.panic_weight.load(Ordering::Relaxed))
    }

    /// A copy of the health state (takes the health lock briefly).
    pub fn health(&self) -> Health {
        self.health.lock().clone()
    }

    /// Runs `f` on the health state under its lock, then republishes the
    /// lock-free mirrors (down flag, weights) as of `now_ms`.
    pub fn with_health<R>(
        &self,
        now_ms: u64,
        cfg: &HealthConfig,
        f: impl FnOnce(&mut Health) -> R,
    ) -> R {
        let mut h = self.health.lock();
        let r = f(&mut h);
        self.publish(&h.machine, now_ms, cfg);
        r
    }

    /// Recomputes the weights the pickers read (ramps move with time);
    /// returns whether the health model counts the backend as bad.
    pub fn refresh(&self, now_ms: u64, cfg: &HealthConfig) -> bool {
        let h = self.health.lock();
        self.publish(&h.machine, now_ms, cfg);
        h.machine.is_bad()
    }

    fn publish(&self, m: &Machine, now_ms: u64, cfg: &HealthConfig) {
        let weight = f64::from(self.weight);
        let down = m.state == State::Down;
        self.hot.down.store(down, Ordering::Relaxed);
        let effective = weight * m.factor(now_ms, cfg);
        self.hot
            .effective_weight
            .store(effective.to_bits(), Ordering::Relaxed);
        // Panic mode routes by score, but never to a backend that is
        // failing real requests right now.
        let panic = if m.cause == Some(Cause::Passive) && down {
            0.0
        } else {
            weight * m.score.unwrap_or(100.0).max(1.0) / 100.0
        };
        self.hot
            .panic_weight
            .store(panic.to_bits(), Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> u64 {
        self.hot.in_flight.load(Ordering::Relaxed)
    }

    /// The latency EWMA as last sampled (the prior before any sample),
    /// however old; for display and as the last-resort cost.
    pub fn latency_ewma_ms(&self) -> f64 {
        f64::from_bits(self.hot.latency_ewma_ms.load(Ordering::Relaxed))
    }

    /// The latency EWMA if a request sampled it within
    /// `LATENCY_FRESH_MS`; `None` for a backend without recent evidence (new,
    /// rejoined, or idle), which the pickers then judge by its pool's
    /// typical latency instead of a fixed prior: a 50 ms prior makes a
    /// backend look 50× slower than 1 ms peers (never picked by p2c, so a
    /// canary would never get its share) or far faster than 2 s peers
    /// (flooded).
    pub fn fresh_latency_ms(&self, now_ms: u64) -> Option<f64> {
        let at = self.hot.latency_sampled_at_ms.load(Ordering::Relaxed);
        let fresh = at != 0 && now_ms.saturating_sub(at) <= LATENCY_FRESH_MS;
        fresh.then(|| self.latency_ewma_ms())
    }

    pub fn cooldown_until_ms(&self) -> u64 {
        self.hot.cooldown_until_ms.load(Ordering::Relaxed)
    }

    /// 0–1: what this backend adds to its zone's GPU health: its health
    /// score (latency, errors, queue, free KV cache) while it takes traffic,
    /// nothing while ejected. Takes the health lock: for the 2 s reports,
    /// never the request path.
    pub fn gpu_health(&self) -> f64 {
        if !self.is_up() {
            return 0.0;
        }
        self.health
            .lock()
            .machine
            .score
            .map_or(1.0, |s| (s / 100.0).clamp(0.0, 1.0))
    }

    /// Its last `passive_failures` real requests all failed.
    pub fn failing_now(&self) -> bool {
        self.passive_streak.load(Ordering::Relaxed) >= self.passive_threshold
    }

    /// Counts a request in flight until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> InFlight {
        self.hot.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// A request got its first byte after `latency`, at `now_ms`.
    pub fn record_success(&self, latency: Duration, now_ms: u64) {
        self.passive_streak.store(0, Ordering::Relaxed);
        self.note_outcome(true);
        self.window_requests.fetch_add(1, Ordering::Relaxed);
        let sample = latency.as_secs_f64() * 1000.0;
        // A lost update between two racing requests only drops one sample.
        // The first sample after a silence stands alone: blending it with
        // stale evidence (or the prior) would misjudge the backend for
        // another freshness period, starving it under p2c.
        let new = match self.fresh_latency_ms(now_ms) {
            Some(old) => old + LATENCY_ALPHA * (sample - old),
            None => sample,
        };
        self.hot
            .latency_ewma_ms
            .store(new.to_bits(), Ordering::Relaxed);
        // 0 means "never sampled".
        self.hot
            .latency_sampled_at_ms
            .store(now_ms.max(1), Ordering::Relaxed);
    }

    /// A request failed (connect error, reset, 5xx, time-to-first-token
    /// timeout, a stream that broke). Returns the ejection it caused, if
    /// any; `may_eject` (the pool-wide cap) is asked only when one is due.
    pub fn record_failure(
        &self,
        now_ms: u64,
        cfg: &HealthConfig,
        may_eject: impl FnOnce() -> bool,
    ) -> Option<Change> {
        self.window_requests.fetch_add(1, Ordering::Relaxed);
        self.window_failures.fetch_add(1, Ordering::Relaxed);
        self.note_outcome(false);
        let streak = self.passive_streak.fetch_add(1, Ordering::Relaxed) + 1;
        if streak < cfg.passive_failures || !self.is_up() {
            return None;
        }
        let change = self.with_health(now_ms, cfg, |h| {
            h.machine.passive_failures(streak, now_ms, cfg, may_eject)
        });
        if change.is_some_and(|c| matches!(c, Change::Ejected(_))) {
            self.arm_trials(now_ms);
        }
        change
    }

    /// Starts the half-open schedule of a backend just ejected.
    pub fn arm_trials(&self, now_ms: u64) {
        self.trial_interval_ms
            .store(TRIAL_FIRST_MS, Ordering::Relaxed);
        self.trial_at_ms
            .store(now_ms.saturating_add(TRIAL_FIRST_MS), Ordering::Relaxed);
    }

    /// Claims the one trial request an ejected or unreachable backend may
    /// take now (its model has nothing better than a fallback); `false`
    /// when it is not out, not due, or a trial is already running.
    pub fn claim_trial(&self, now_ms: u64) -> bool {
        (!self.is_up() || self.is_unreachable())
            && self.trial_at_ms.load(Ordering::Relaxed) <= now_ms
            && !self.trial_running.swap(true, Ordering::AcqRel)
    }

    /// Ends a claimed trial. A failed one doubles the wait for the next.
    pub fn end_trial(&self, ok: bool, now_ms: u64) {
        if !ok {
            let next = self
                .trial_interval_ms
                .load(Ordering::Relaxed)
                .saturating_mul(2)
                .min(TRIAL_MAX_MS);
            self.trial_interval_ms.store(next, Ordering::Relaxed);
            self.trial_at_ms
                .store(now_ms.saturating_add(next), Ordering::Relaxed);
        }
        self.trial_running.store(false, Ordering::Release);
    }

    /// Forgets the failure streak and the latency seen before an
    /// ejection (on rejoin: a canary is judged on what it does now).
    pub fn forget_past(&self) {
        self.passive_streak.store(0, Ordering::Relaxed);
        self.hot
            .recent_success
            .store(1.0f64.to_bits(), Ordering::Relaxed);
        self.hot.latency_sampled_at_ms.store(0, Ordering::Relaxed);
    }

    /// The failed share of requests since the last call; `None` without
    /// traffic (an ejected backend's error rate is unknown, not zero).
    pub fn take_error_rate(&self) -> Option<f64> {
        let requests = self.window_requests.swap(0, Ordering::Relaxed);
        let failures = self.window_failures.swap(0, Ordering::Relaxed);
        (requests > 0).then(|| (failures.min(requests)) as f64 / requests as f64)
    }

    /// A 429: busy, not broken. No health penalty; no new requests until
    /// the cooldown passes.
    pub fn cool_down(&self, now_ms: u64, wait: Duration) {
        let until = now_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        self.hot
            .cooldown_until_ms
            .fetch_max(until, Ordering::Relaxed);
    }
}

/// Holds one request's place in a backend's in-flight count.
#[derive(Debug)]
pub struct InFlight(Arc<Backend>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.hot.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_names_the_port_only_when_it_is_not_the_default() {
        for (scheme, authority, want) in [
            (Scheme::HTTP, "127.0.0.1:8000", "127.0.0.1:8000"),
            (Scheme::HTTP, "vllm.internal:80", "vllm.internal"),
            (Scheme::HTTP, "vllm.internal", "vllm.internal"),
            (Scheme::HTTPS, "api.example.com:443", "api.example.com"),
            (
                Scheme::HTTPS,
                "api.example.com:8443",
                "api.example.com:8443",
            ),
            (Scheme::HTTP, "[::1]:8000", "[::1]:8000"),
            (Scheme::HTTP, "user:secret@10.0.0.5:9000", "10.0.0.5:9000"),
        ] {
            let authority: Authority = authority.parse().expect("authority");
            let got = host_value(&scheme, &authority).expect("a header value");
            assert_eq!(got, want, "{scheme}://{authority}");
        }
    }

    fn backend() -> Backend {
        let cfg = BackendConfig {
            name: "b".into(),
            zone: ZoneId::new("az-a"),
            scheme: Scheme::HTTP,
            authority: "127.0.0.1:1".parse().unwrap(),
            models: vec!["m".into()],
            weight: 2,
            health_path: "/health".into(),
            metrics_path: None,
            model_names: HashMap::new(),
            tls: BackendTls::default(),
            capacity: None,
            provider: None,
            probe_interval: None,
        };
        Backend::new(&cfg, &HealthConfig::default(), 0)
    }

    #[test]
    fn passive_failures_eject_after_threshold_and_success_resets() {
        let b = backend();
        let h = HealthConfig::default();
        for _ in 0..4 {
            assert_eq!(b.record_failure(1, &h, || true), None);
        }
        b.record_success(Duration::from_millis(5), 1);
        for _ in 0..4 {
            assert_eq!(b.record_failure(1, &h, || true), None);
        }
        assert_eq!(
            b.record_failure(1, &h, || true),
            Some(Change::Ejected(Cause::Passive))
        );
        assert!(!b.is_up());
        assert_eq!(b.effective_weight(), 0.0);
        assert_eq!(
            b.panic_weight(),
            0.0,
            "failing real traffic: not even in panic"
        );
        assert_eq!(
            b.record_failure(1, &h, || true),
            None,
            "already out: no second event"
        );
        assert_eq!(b.take_error_rate(), Some(10.0 / 11.0));
        assert_eq!(b.take_error_rate(), None, "no traffic since: unknown");
    }

    #[test]
    fn new_backends_start_slow_and_ramp() {
        let b = backend();
        let h = HealthConfig::default();
        assert!((b.effective_weight() - 0.02).abs() < 1e-9, "1% of weight 2");
        b.refresh(150_000, &h);
        assert!((b.effective_weight() - 2.0 * 0.505).abs() < 1e-9);
        b.refresh(300_000, &h);
        assert_eq!(b.effective_weight(), 2.0);
    }

    #[test]
    fn cooldown_makes_backend_unusable_until_it_passes() {
        let b = backend();
        b.cool_down(1_000, Duration::from_secs(2));
        assert!(b.is_up(), "a 429 is not a health failure");
        assert!(!b.is_usable(2_999));
        assert!(b.is_usable(3_000));
    }

    #[test]
    fn a_refused_backend_weighs_nothing_in_any_mode_until_it_is_reached() {
        let b = backend();
        let now = 1_000;
        assert!(b.pick_weight(false, now) > 0.0 && b.pick_weight(true, now) > 0.0);
        assert!(!b.claim_trial(now), "up and reachable: no trials");
        assert!(b.refused(now), "news the first time");
        assert!(!b.refused(now), "not the second");
        assert_eq!(b.pick_weight(false, now), 0.0);
        assert_eq!(b.pick_weight(true, now), 0.0, "panic mode too");
        assert!(!b.is_usable(now) && b.is_up(), "out of picks, not ejected");
        // Half-open trials, one at a time, the first after a second.
        assert!(!b.claim_trial(now));
        let due = now + TRIAL_FIRST_MS;
        assert!(b.claim_trial(due));
        assert!(!b.claim_trial(due), "one at a time");
        b.end_trial(false, due);
        assert!(
            !b.claim_trial(due + TRIAL_FIRST_MS),
            "a failed trial doubles the wait"
        );
        assert!(b.reached(), "an answer ends the spell");
        assert!(!b.reached(), "once");
        assert!(b.pick_weight(false, now) > 0.0 && b.pick_weight(true, now) > 0.0);
        assert!(b.is_usable(now));
    }

    #[test]
    fn in_panic_a_backend_that_fails_fast_does_not_look_cheap() {
        let b = backend();
        let h = HealthConfig::default();
        let now = 1_000;
        b.record_success(Duration::from_millis(1), now);
        assert_eq!(b.pick_cost(true, now, 5.0), 1.0);
        b.record_failure(now, &h, || false);
        let after_one = b.pick_cost(true, now, 5.0);
        assert!((after_one - 1.25).abs() < 1e-9, "{after_one}");
        for _ in 0..4 {
            b.record_failure(now, &h, || false);
        }
        // Its last five failed: the floor share, a hundredfold cost.
        assert!((b.pick_cost(true, now, 5.0) - 100.0).abs() < 1e-9);
        assert!((b.pick_weight(true, now) - b.panic_weight() * FAILING_SHARE).abs() < 1e-12);
        assert_eq!(
            b.pick_cost(false, now, 5.0),
            1.0,
            "outside panic: load and latency alone"
        );
        // Successes win it back, a step at a time.
        b.record_success(Duration::from_millis(1), now);
        let share = b.recent_success();
        assert!(share > FAILING_SHARE && share < 0.5, "{share}");
        b.forget_past();
        assert_eq!(b.recent_success(), 1.0);
    }

    /// The pool: `a` ejected for failing requests, `b` killed (its
    /// connects refused) yet the cheapest by its last latency, `c` healthy
    /// and slower. More bad than the cap lets go: panic mode.
    #[test]
    fn a_panicking_pool_never_picks_a_refused_backend_however_cheap_it_looked() {
        use crate::config::{Balance, Config};
        use crate::dataplane::routing::Routes;
        let text = "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\n\
                    admin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\
                    [[backends]]\nname = \"a\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"m\"]\n\
                    [[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:10\"\nmodels = [\"m\"]\n\
                    [[backends]]\nname = \"c\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:11\"\nmodels = [\"m\"]\n";
        let cfg = Config::parse("t.toml", text).unwrap();
        let routes = Routes::build(&cfg, None);
        let h = &cfg.health;
        let now = crate::clock::now_ms();
        let by_name = |n: &str| routes.backends.iter().find(|b| b.name == n).unwrap();
        let (a, b, c) = (by_name("a"), by_name("b"), by_name("c"));
        for _ in 0..h.passive_failures {
            a.record_failure(now, h, || true);
        }
        assert!(!a.is_up());
        b.record_success(Duration::from_millis(1), now);
        c.record_success(Duration::from_millis(6), now);
        for _ in 0..h.passive_failures {
            b.record_failure(now, h, || false);
        }
        routes.sweep(now, h);
        let pool = &routes.model("m").unwrap().pools[0];
        assert!(pool.in_panic());
        let mut rng = fastrand::Rng::with_seed(41);
        let pick = |rng: &mut fastrand::Rng| {
            pool.pick(Balance::P2c, None, now, &[], rng)
                .map(|(i, _)| pool.backends[i].name.as_str())
        };
        // Failing, not yet refused: weighed by its recent success, `b`
        // loses every comparison with `c`.
        assert!((0..10_000).all(|_| pick(&mut rng) == Some("c")));
        // Refused: out of every pick.
        b.refused(now);
        assert!((0..10_000).all(|_| pick(&mut rng) == Some("c")));
        // With `c` tried already, nothing is left to pick (a trial or the
        // next candidate must answer).
        let tried = [Arc::as_ptr(c) as usize];
        assert_eq!(pool.pick(Balance::P2c, None, now, &tried, &mut rng), None);
    }

    #[test]
    fn latency_ewma_moves_toward_samples_and_stale_evidence_is_set_aside() {
        let b = backend();
        assert_eq!(b.fresh_latency_ms(1_000), None, "no sample yet");
        assert_eq!(b.latency_ewma_ms(), INITIAL_LATENCY_MS);
        for _ in 0..50 {
            b.record_success(Duration::from_millis(200), 1_000);
        }
        let fresh = b.fresh_latency_ms(1_000).unwrap();
        assert!((fresh - 200.0).abs() < 1.0, "{fresh}");
        let later = 1_000 + LATENCY_FRESH_MS + 1;
        assert_eq!(
            b.fresh_latency_ms(later),
            None,
            "stale evidence is not used"
        );
        // The first sample after the silence stands alone.
        b.record_success(Duration::from_millis(10), later);
        assert_eq!(b.fresh_latency_ms(later), Some(10.0));
    }
}
