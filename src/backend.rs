//! One inference backend at run time: where it is, and the live signals the
//! balancer reads (in-flight, latency EWMA, 429 cooldown, up/down). All
//! fields the request path touches are atomics, so picking never locks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use zonegate_cluster::ZoneId;

use crate::config::{BackendConfig, HealthConfig};

/// Milliseconds on a process-wide monotonic clock (never goes backwards,
/// unaffected by wall-clock jumps).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Smoothing of the latency EWMA: each sample moves it by this share.
const LATENCY_ALPHA: f64 = 0.2;
/// What a backend without samples is assumed to take, so new backends are
/// neither starved nor flooded by p2c.
const INITIAL_LATENCY_MS: f64 = 50.0;
/// Without fresh samples the EWMA drifts back to the prior with this time
/// constant, so a backend that was slow once is tried again eventually
/// instead of being shunned forever on stale evidence.
const LATENCY_DECAY_MS: f64 = 10_000.0;

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub zone: ZoneId,
    pub scheme: Scheme,
    pub authority: Authority,
    pub weight: u32,
    pub health_path: String,
    pub metrics_path: Option<String>,
    model_names: HashMap<String, String>,
    in_flight: AtomicU64,
    latency_ewma_ms: AtomicU64,
    latency_sampled_at_ms: AtomicU64,
    cooldown_until_ms: AtomicU64,
    up: AtomicBool,
    passive_failures: AtomicU32,
    probe_failures: AtomicU32,
    probe_successes: AtomicU32,
}

/// Why a backend changed between up and down; becomes the event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Taken out after consecutive failed requests.
    EjectedPassive,
    /// Taken out after consecutive failed probes.
    EjectedProbe,
    /// Returned after consecutive passing probes.
    Rejoined,
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::EjectedPassive => "ejected_passive",
            Transition::EjectedProbe => "ejected_probe",
            Transition::Rejoined => "rejoined",
        }
    }
}

impl Backend {
    pub fn new(cfg: &BackendConfig) -> Self {
        Self {
            name: cfg.name.clone(),
            zone: cfg.zone.clone(),
            scheme: cfg.scheme.clone(),
            authority: cfg.authority.clone(),
            weight: cfg.weight,
            health_path: cfg.health_path.clone(),
            metrics_path: cfg.metrics_path.clone(),
            model_names: cfg.model_names.clone(),
            in_flight: AtomicU64::new(0),
            latency_ewma_ms: AtomicU64::new(INITIAL_LATENCY_MS.to_bits()),
            latency_sampled_at_ms: AtomicU64::new(0),
            cooldown_until_ms: AtomicU64::new(0),
            up: AtomicBool::new(true),
            passive_failures: AtomicU32::new(0),
            probe_failures: AtomicU32::new(0),
            probe_successes: AtomicU32::new(0),
        }
    }

    /// The backend's own name for a logical model, when it differs.
    pub fn physical_model(&self, logical: &str) -> Option<&str> {
        self.model_names.get(logical).map(String::as_str)
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Whether a new request may go here at `now_ms`.
    pub fn is_usable(&self, now_ms: u64) -> bool {
        self.is_up() && self.cooldown_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The latency EWMA as of `now_ms`, decayed toward the prior for the
    /// time since its last sample.
    pub fn latency_ewma_ms(&self, now_ms: u64) -> f64 {
        let stored = f64::from_bits(self.latency_ewma_ms.load(Ordering::Relaxed));
        let age = now_ms.saturating_sub(self.latency_sampled_at_ms.load(Ordering::Relaxed)) as f64;
        INITIAL_LATENCY_MS + (stored - INITIAL_LATENCY_MS) * (-age / LATENCY_DECAY_MS).exp()
    }

    pub fn cooldown_until_ms(&self) -> u64 {
        self.cooldown_until_ms.load(Ordering::Relaxed)
    }

    /// 0–1: how much GPU capacity this backend offers the zone score. An
    /// ejected backend offers none; a busy one (429) still counts.
    pub fn gpu_health(&self, _now_ms: u64) -> f64 {
        if self.is_up() {
            1.0
        } else {
            0.0
        }
    }

    /// p2c's load figure: requests in flight (this one included) × latency.
    pub fn cost(&self, now_ms: u64) -> f64 {
        (self.in_flight() + 1) as f64 * self.latency_ewma_ms(now_ms)
    }

    /// Counts a request in flight until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// A request got its first byte after `latency`, at `now_ms`.
    pub fn record_success(&self, latency: Duration, now_ms: u64) {
        self.passive_failures.store(0, Ordering::Relaxed);
        let sample = latency.as_secs_f64() * 1000.0;
        // A lost update between two racing requests only drops one sample.
        let old = self.latency_ewma_ms(now_ms);
        let new = old + LATENCY_ALPHA * (sample - old);
        self.latency_ewma_ms.store(new.to_bits(), Ordering::Relaxed);
        self.latency_sampled_at_ms.store(now_ms, Ordering::Relaxed);
    }

    /// A request failed (connect error, reset, 5xx, timeout). Returns the
    /// transition if this failure took the backend out.
    pub fn record_failure(&self, cfg: &HealthConfig) -> Option<Transition> {
        let n = self.passive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= cfg.passive_failures && self.up.swap(false, Ordering::Relaxed) {
            self.probe_successes.store(0, Ordering::Relaxed);
            return Some(Transition::EjectedPassive);
        }
        None
    }

    /// A 429: busy, not broken. No health penalty; no new requests until
    /// the cooldown passes.
    pub fn cool_down(&self, now_ms: u64, wait: Duration) {
        let until = now_ms + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX / 2);
        self.cooldown_until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// Result of one active probe. Returns the transition it caused, if any.
    pub fn record_probe(&self, ok: bool, cfg: &HealthConfig) -> Option<Transition> {
        if ok {
            self.probe_failures.store(0, Ordering::Relaxed);
            let n = self.probe_successes.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= cfg.healthy_threshold && !self.up.load(Ordering::Relaxed) {
                self.passive_failures.store(0, Ordering::Relaxed);
                self.up.store(true, Ordering::Relaxed);
                return Some(Transition::Rejoined);
            }
        } else {
            self.probe_successes.store(0, Ordering::Relaxed);
            let n = self.probe_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if n >= cfg.unhealthy_threshold && self.up.swap(false, Ordering::Relaxed) {
                return Some(Transition::EjectedProbe);
            }
        }
        None
    }
}

/// Holds one request's place in a backend's in-flight count.
#[derive(Debug)]
pub struct InFlight(Arc<Backend>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend() -> Backend {
        let cfg = BackendConfig {
            name: "b".into(),
            zone: ZoneId::new("az-a"),
            scheme: Scheme::HTTP,
            authority: "127.0.0.1:1".parse().unwrap(),
            models: vec!["m".into()],
            weight: 1,
            health_path: "/health".into(),
            metrics_path: None,
            model_names: HashMap::new(),
        };
        Backend::new(&cfg)
    }

    fn health() -> HealthConfig {
        HealthConfig {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            passive_failures: 5,
        }
    }

    #[test]
    fn passive_failures_eject_after_threshold_and_success_resets() {
        let b = backend();
        let h = health();
        for _ in 0..4 {
            assert_eq!(b.record_failure(&h), None);
        }
        b.record_success(Duration::from_millis(5), 0);
        for _ in 0..4 {
            assert_eq!(b.record_failure(&h), None);
        }
        assert_eq!(b.record_failure(&h), Some(Transition::EjectedPassive));
        assert!(!b.is_up());
        assert_eq!(b.record_failure(&h), None, "already out: no second event");
    }

    #[test]
    fn probes_take_out_and_bring_back_with_hysteresis() {
        let b = backend();
        let h = health();
        assert_eq!(b.record_probe(false, &h), None);
        assert_eq!(b.record_probe(false, &h), None);
        assert_eq!(b.record_probe(false, &h), Some(Transition::EjectedProbe));
        assert_eq!(
            b.record_probe(true, &h),
            None,
            "one good probe is not enough"
        );
        assert_eq!(b.record_probe(false, &h), None);
        assert_eq!(b.record_probe(true, &h), None);
        assert_eq!(b.record_probe(true, &h), Some(Transition::Rejoined));
        assert!(b.is_up());
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
    fn latency_ewma_moves_toward_samples_and_decays_without_them() {
        let b = backend();
        for _ in 0..50 {
            b.record_success(Duration::from_millis(200), 1_000);
        }
        assert!((b.latency_ewma_ms(1_000) - 200.0).abs() < 1.0);
        let later = b.latency_ewma_ms(1_000 + 10 * LATENCY_DECAY_MS as u64);
        assert!(
            (later - INITIAL_LATENCY_MS).abs() < 1.0,
            "stale evidence fades: {later}"
        );
    }
}
