//! Validation of `[health]`: probes, outlier ejection and the health
//! score's weights and bounds.

use std::time::Duration;

use super::bounds::{self, Bound};
use super::raw::*;
use super::Validator;
use super::*;

impl Validator<'_> {
    pub(super) fn fraction(
        &self,
        key: &str,
        v: Option<f64>,
        default: f64,
    ) -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(0.0..=1.0).contains(&v) {
            return Err(self.err(key, "must be between 0.0 and 1.0"));
        }
        Ok(v)
    }

    pub(super) fn score_value(
        &self,
        key: &str,
        v: Option<f64>,
        default: f64,
    ) -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(0.0..=100.0).contains(&v) {
            return Err(self.err(key, "must be a score between 0 and 100"));
        }
        Ok(v)
    }

    pub(super) fn bounds(
        &self,
        key: &str,
        v: Option<[f64; 2]>,
        default: (f64, f64),
        b: Bound<f64>,
    ) -> Result<(f64, f64), ConfigError> {
        let (good, bad) = v.map_or(default, |[g, b]| (g, b));
        if !(good.is_finite() && bad.is_finite() && good >= 0.0 && bad > good) {
            return Err(self.err(key, "must be [good, bad] with 0 ≤ good < bad"));
        }
        if bad > b.max {
            return Err(self.err(
                key,
                format!(
                    "{bad} is out of range: must be at most {} ({})",
                    b.max, b.why
                ),
            ));
        }
        Ok((good, bad))
    }

    /// `[health]`'s score weights and bounds (see `health::score`).
    pub(super) fn health_score(&self, raw: &RawHealth) -> Result<ScoreConfig, ConfigError> {
        let weight = |key: &str, v: Option<f64>, default: f64| {
            self.real(key, v, default, bounds::REL_WEIGHT)
        };
        let score = ScoreConfig {
            weight_latency: weight("health.weight_latency", raw.weight_latency, 0.3)?,
            weight_errors: weight("health.weight_errors", raw.weight_errors, 0.3)?,
            weight_queue: weight("health.weight_queue", raw.weight_queue, 0.2)?,
            weight_kv: weight("health.weight_kv", raw.weight_kv, 0.2)?,
            latency_ms: self.bounds(
                "health.latency_ms_bounds",
                raw.latency_ms_bounds,
                (100.0, 1000.0),
                bounds::LATENCY_MS,
            )?,
            error_rate: self.bounds(
                "health.error_rate_bounds",
                raw.error_rate_bounds,
                (0.01, 0.25),
                bounds::RATIO,
            )?,
            queue_depth: self.bounds(
                "health.queue_depth_bounds",
                raw.queue_depth_bounds,
                (0.0, 16.0),
                bounds::QUEUE_DEPTH,
            )?,
            kv_usage: self.bounds(
                "health.kv_usage_bounds",
                raw.kv_usage_bounds,
                (0.7, 0.98),
                bounds::RATIO,
            )?,
        };
        if score.weight_latency + score.weight_errors + score.weight_queue + score.weight_kv <= 0.0
        {
            return Err(self.err(
                "health.weight_latency",
                "the four weights must not all be 0",
            ));
        }
        Ok(score)
    }

    pub(super) fn health(
        &self,
        raw: RawHealth,
        models: &[ModelConfig],
    ) -> Result<HealthConfig, ConfigError> {
        let d = |key: &str, v: &Option<String>, secs: u64| {
            self.duration(
                key,
                v.as_deref(),
                Duration::from_secs(secs),
                bounds::HEALTH_TIME,
            )
        };
        let probe = |key: &str, v: &Option<String>, secs: u64, b| {
            self.duration(key, v.as_deref(), Duration::from_secs(secs), b)
        };
        let score = self.health_score(&raw)?;
        let eject_below = self.score_value("health.eject_below", raw.eject_below, 30.0)?;
        let rejoin_above = self.score_value("health.rejoin_above", raw.rejoin_above, 70.0)?;
        if rejoin_above <= eject_below {
            return Err(self.err(
                "health.rejoin_above",
                "must be above eject_below, or a backend could flap",
            ));
        }
        let healthy_above = self.score_value("health.healthy_above", raw.healthy_above, 85.0)?;
        let degraded_above = self.score_value("health.degraded_above", raw.degraded_above, 55.0)?;
        if healthy_above <= degraded_above {
            return Err(self.err("health.healthy_above", "must be above degraded_above"));
        }
        let smoothing = self.fraction("health.smoothing", raw.smoothing, 0.5)?;
        if smoothing == 0.0 {
            return Err(self.err("health.smoothing", "must be greater than 0"));
        }
        let floor_model = match raw.floor_model {
            Some(f) if !models.iter().any(|m| m.name == f) => {
                return Err(self.err(
                    "health.floor_model",
                    format!("`{f}` is not a model served by some backend"),
                ))
            }
            f => f,
        };
        Ok(HealthConfig {
            interval: probe("health.interval", &raw.interval, 2, bounds::PROBE_INTERVAL)?,
            stable_interval: probe(
                "health.stable_interval",
                &raw.stable_interval,
                10,
                bounds::PROBE_INTERVAL,
            )?,
            jitter: self.fraction("health.jitter", raw.jitter, 0.1)?,
            timeout: probe("health.timeout", &raw.timeout, 1, bounds::PROBE_TIMEOUT)?,
            unhealthy_threshold: self.positive(
                "health.unhealthy_threshold",
                raw.unhealthy_threshold,
                3,
                bounds::STREAK,
            )?,
            healthy_threshold: self.positive(
                "health.healthy_threshold",
                raw.healthy_threshold,
                5,
                bounds::STREAK,
            )?,
            passive_failures: self.positive(
                "health.passive_failures",
                raw.passive_failures,
                5,
                bounds::STREAK,
            )?,
            smoothing,
            moving_delta: self.score_value("health.moving_delta", raw.moving_delta, 5.0)?,
            score,
            eject_below,
            rejoin_above,
            healthy_above,
            degraded_above,
            band_margin: self.score_value("health.band_margin", raw.band_margin, 5.0)?,
            degraded_multiplier: self.fraction(
                "health.degraded_multiplier",
                raw.degraded_multiplier,
                0.6,
            )?,
            unstable_multiplier: self.fraction(
                "health.unstable_multiplier",
                raw.unstable_multiplier,
                0.2,
            )?,
            slow_start: d("health.slow_start", &raw.slow_start, 300)?,
            slow_start_share: self.fraction(
                "health.slow_start_share",
                raw.slow_start_share,
                0.01,
            )?,
            canary_share: self.fraction("health.canary_share", raw.canary_share, 0.05)?,
            canary_time: d("health.canary_time", &raw.canary_time, 30)?,
            rejoin_ramp: d("health.rejoin_ramp", &raw.rejoin_ramp, 120)?,
            ejection_time: d("health.ejection_time", &raw.ejection_time, 30)?,
            max_ejection_time: d("health.max_ejection_time", &raw.max_ejection_time, 300)?,
            watch_interval: probe(
                "health.watch_interval",
                &raw.watch_interval,
                30,
                bounds::WATCH_INTERVAL,
            )?,
            max_watch_interval: probe(
                "health.max_watch_interval",
                &raw.max_watch_interval,
                300,
                bounds::WATCH_INTERVAL,
            )?,
            max_ejected_percent: self.score_value(
                "health.max_ejected_percent",
                raw.max_ejected_percent,
                50.0,
            )?,
            breaker_percent: self.score_value(
                "health.breaker_percent",
                raw.breaker_percent,
                30.0,
            )?,
            floor_model,
        })
    }
}
