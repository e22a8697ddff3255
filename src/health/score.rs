//! The health score: four signals (latency, error rate, queue depth, KV
//! cache use) normalised to 0–100, weighted, and smoothed. Pure: no clock,
//! no I/O, so every case is a table row.

use serde::Serialize;

use crate::config::ScoreConfig;

/// What one evaluation knows about a backend. `None` means "not measured"
/// (no metrics endpoint, no traffic in the window): the score is then taken
/// over the dimensions that were measured, so a backend without metrics is
/// judged on what it has rather than on guesses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// Whether the health endpoint answered 2xx within the timeout.
    pub probe_ok: bool,
    /// Health probe round trip.
    pub latency_ms: Option<f64>,
    /// Failed share of real requests since the last evaluation.
    pub error_rate: Option<f64>,
    /// Requests waiting in the backend's queue (scraped).
    pub queue_depth: Option<f64>,
    /// KV-cache / GPU memory in use, 0–1 (scraped).
    pub kv_usage: Option<f64>,
}

/// Each dimension on 0–100 (higher is healthier); `None` when unmeasured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Components {
    pub latency: Option<f64>,
    pub errors: Option<f64>,
    pub queue: Option<f64>,
    pub kv_free: Option<f64>,
}

/// 100 at or below `good`, 0 at or above `bad`, linear between.
fn normalise(value: f64, (good, bad): (f64, f64)) -> f64 {
    if value.is_nan() {
        return 0.0;
    }
    (100.0 * (bad - value) / (bad - good)).clamp(0.0, 100.0)
}

pub fn components(s: &Signals, cfg: &ScoreConfig) -> Components {
    Components {
        latency: s.latency_ms.map(|v| normalise(v, cfg.latency_ms)),
        errors: s.error_rate.map(|v| normalise(v, cfg.error_rate)),
        queue: s.queue_depth.map(|v| normalise(v, cfg.queue_depth)),
        kv_free: s.kv_usage.map(|v| normalise(v, cfg.kv_usage)),
    }
}

/// The unsmoothed score of one evaluation. A failed health probe scores 0
/// whatever the other signals say: the health endpoint is a gate (the
/// backend says it is not fit, or cannot be reached in time), and the four
/// dimensions grade a backend that passes it.
pub fn raw_score(probe_ok: bool, c: &Components, cfg: &ScoreConfig) -> f64 {
    if !probe_ok {
        return 0.0;
    }
    let parts = [
        (c.latency, cfg.weight_latency),
        (c.errors, cfg.weight_errors),
        (c.queue, cfg.weight_queue),
        (c.kv_free, cfg.weight_kv),
    ];
    let (sum, weights) = parts
        .iter()
        .filter_map(|(v, w)| v.map(|v| (v * w, *w)))
        .fold((0.0, 0.0), |(s, ws), (v, w)| (s + v, ws + w));
    if weights <= 0.0 {
        // Reachable and nothing else known: no evidence against it.
        return 100.0;
    }
    sum / weights
}

/// One EWMA step; the first evaluation is taken as is.
pub fn smooth(previous: Option<f64>, raw: f64, alpha: f64) -> f64 {
    match previous {
        Some(p) => p + alpha * (raw - p),
        None => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HealthConfig;

    fn sig(lat: f64, err: Option<f64>, queue: Option<f64>, kv: Option<f64>) -> Signals {
        Signals {
            probe_ok: true,
            latency_ms: Some(lat),
            error_rate: err,
            queue_depth: queue,
            kv_usage: kv,
        }
    }

    #[test]
    fn score_table() {
        let cfg = HealthConfig::default().score;
        // (what, signals, expected raw score)
        let cases: &[(&str, Signals, f64)] = &[
            ("all good", sig(5.0, Some(0.0), Some(0.0), Some(0.1)), 100.0),
            ("probe failed", Signals::default(), 0.0),
            (
                "failed probe beats good metrics",
                Signals {
                    probe_ok: false,
                    ..sig(5.0, Some(0.0), Some(0.0), Some(0.1))
                },
                0.0,
            ),
            (
                "reachable, nothing else known",
                Signals {
                    probe_ok: true,
                    ..Default::default()
                },
                100.0,
            ),
            // Only latency and errors measured: their mean, not a penalty
            // for the missing metrics.
            (
                "no metrics endpoint",
                sig(5.0, Some(0.0), None, None),
                100.0,
            ),
            ("no metrics, slow", sig(1000.0, Some(0.0), None, None), 50.0),
            // Busy with long legal requests: no errors, full queue. Scores
            // 80, below HEALTHY (85): less traffic, never ejected.
            (
                "deep queue only",
                sig(5.0, Some(0.0), Some(64.0), Some(0.1)),
                80.0,
            ),
            (
                "all errors only",
                sig(5.0, Some(1.0), Some(0.0), Some(0.1)),
                70.0,
            ),
            ("kv full", sig(5.0, Some(0.0), Some(0.0), Some(0.98)), 80.0),
            (
                "half-way latency",
                sig(550.0, Some(0.0), Some(0.0), Some(0.1)),
                85.0,
            ),
            (
                "brownout that still answers probes",
                sig(1000.0, Some(0.5), Some(8.0), Some(0.84)),
                0.0 * 0.3 + 0.0 * 0.3 + 50.0 * 0.2 + 50.0 * 0.2,
            ),
            (
                "error rate at good bound",
                sig(5.0, Some(0.01), Some(0.0), Some(0.0)),
                100.0,
            ),
        ];
        for (what, s, want) in cases {
            let got = raw_score(s.probe_ok, &components(s, &cfg), &cfg);
            assert!((got - want).abs() < 1e-9, "{what}: got {got}, want {want}");
        }
    }

    #[test]
    fn components_are_bounded_and_monotonic() {
        let cfg = HealthConfig::default().score;
        let mut last = 101.0;
        for lat in [0.0, 100.0, 200.0, 500.0, 999.0, 1000.0, 1e9] {
            let c = components(&sig(lat, None, None, None), &cfg)
                .latency
                .unwrap();
            assert!((0.0..=100.0).contains(&c) && c <= last, "{lat} → {c}");
            last = c;
        }
        assert_eq!(normalise(f64::NAN, (0.0, 1.0)), 0.0);
    }

    #[test]
    fn smoothing_moves_part_way() {
        assert_eq!(smooth(None, 40.0, 0.5), 40.0);
        assert_eq!(smooth(Some(100.0), 0.0, 0.5), 50.0);
        assert_eq!(smooth(Some(50.0), 0.0, 0.5), 25.0);
    }
}
