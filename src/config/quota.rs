//! The quota parts of the configuration: `[[tenants]] quota` and
//! `zone_share`, `[[models]] limits`, `[[backends]] capacity` and
//! `[quotas]`, raw (`deny_unknown_fields`) and validated.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use serde::Deserialize;
use zonegate_cluster::{Limits, ZoneId};

use super::bounds::{self, Bound};
use super::{BackendConfig, ConfigError, Validator};

/// A tenant's `quota = { rpm, tpm, concurrency, burst }`: any subset of
/// the limits, and the burst its buckets allow (a duration).
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    rpm: Option<u64>,
    tpm: Option<u64>,
    concurrency: Option<u64>,
    burst: Option<String>,
}

/// A model's `limits = { rpm, tpm }` per zone: any subset.
#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModelLimits {
    rpm: Option<u64>,
    tpm: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuotas {
    long_request_units: Option<u32>,
    p0_reserve: Option<f64>,
    queue_timeout: Option<String>,
    rebalance_interval: Option<String>,
    drift_threshold: Option<f64>,
    node_floor: Option<f64>,
}

/// `[quotas]`: how capacity is counted and how the leader rebalances.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaConfig {
    /// Capacity units a long request costs (a short one costs 1).
    pub long_request_units: u32,
    /// The share of a zone's capacity kept for P0 tenants: P1 and P2 leave
    /// `p0_reserve` of the units free for P0, P2 twice that for P0 and P1
    /// together, less what those already hold. In [0, 0.5).
    pub p0_reserve: f64,
    /// How long a request short of zone capacity waits for units (in
    /// priority order) before it is refused; zero: refused at once.
    pub queue_timeout: Duration,
    /// The leader issues a `QuotaRebalance` at most this often.
    pub rebalance_interval: Duration,
    /// A rebalance is issued only when some node's weight moved by more
    /// than this fraction of its group. In (0, 1].
    pub drift_threshold: f64,
    /// The fraction of a zone's allocation shared equally among its nodes
    /// whatever their demand, so an idle node can still admit. In [0, 1].
    pub node_floor: f64,
}

impl QuotaConfig {
    /// A tenant's `quota.burst` when it sets none: five seconds of its
    /// allocation may be used at once (the demo's 200 rpm per node: 17
    /// requests). Also the burst of a model's `limits`.
    pub const DEFAULT_BURST: Duration = Duration::from_secs(5);
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self {
            long_request_units: 4,
            p0_reserve: 0.2,
            queue_timeout: Duration::from_millis(100),
            rebalance_interval: Duration::from_secs(5),
            drift_threshold: 0.1,
            node_floor: 0.05,
        }
    }
}

/// Shares that sum to 1 within this much.
const SHARE_EPSILON: f64 = 1e-6;

impl Validator<'_> {
    pub(super) fn quotas(&self, raw: RawQuotas) -> Result<QuotaConfig, ConfigError> {
        let d = QuotaConfig::default();
        let p0_reserve = raw.p0_reserve.unwrap_or(d.p0_reserve);
        if !(0.0..0.5).contains(&p0_reserve) {
            return Err(self.err(
                "quotas.p0_reserve",
                format!("must be at least 0 and below 0.5 (P2 is shed past 1 − 2 × reserve), got {p0_reserve}"),
            ));
        }
        let drift_threshold = raw.drift_threshold.unwrap_or(d.drift_threshold);
        if !(drift_threshold > 0.0 && drift_threshold <= 1.0) {
            return Err(self.err(
                "quotas.drift_threshold",
                format!("must be above 0 and at most 1, got {drift_threshold}"),
            ));
        }
        let node_floor = raw.node_floor.unwrap_or(d.node_floor);
        if !(0.0..=1.0).contains(&node_floor) {
            return Err(self.err(
                "quotas.node_floor",
                format!("must be between 0 and 1, got {node_floor}"),
            ));
        }
        Ok(QuotaConfig {
            long_request_units: self.positive(
                "quotas.long_request_units",
                raw.long_request_units,
                d.long_request_units,
                bounds::LONG_UNITS,
            )?,
            p0_reserve,
            queue_timeout: match raw.queue_timeout.as_deref() {
                // `0s`: no queue (the duration reader refuses zero).
                Some(s) if humantime::parse_duration(s).is_ok_and(|d| d.is_zero()) => {
                    Duration::ZERO
                }
                s => self.duration(
                    "quotas.queue_timeout",
                    s,
                    d.queue_timeout,
                    bounds::QUEUE_TIMEOUT,
                )?,
            },
            rebalance_interval: self.duration(
                "quotas.rebalance_interval",
                raw.rebalance_interval.as_deref(),
                d.rebalance_interval,
                bounds::REBALANCE_INTERVAL,
            )?,
            drift_threshold,
            node_floor,
        })
    }

    /// A tenant's `quota`: every given limit at least 1, at least one
    /// given; and its burst, above zero and at most a minute.
    pub(super) fn tenant_limits(
        &self,
        key: &str,
        raw: Option<RawLimits>,
    ) -> Result<(Limits, Duration), ConfigError> {
        let Some(raw) = raw else {
            return Ok((Limits::default(), QuotaConfig::DEFAULT_BURST));
        };
        let burst_key = format!("{key}.burst");
        let burst = self.duration(
            &burst_key,
            raw.burst.as_deref(),
            QuotaConfig::DEFAULT_BURST,
            bounds::BURST,
        )?;
        let limits = Limits {
            rpm: self.limit(&format!("{key}.rpm"), raw.rpm, bounds::PER_MINUTE)?,
            tpm: self.limit(&format!("{key}.tpm"), raw.tpm, bounds::PER_MINUTE)?,
            concurrency: self.limit(
                &format!("{key}.concurrency"),
                raw.concurrency,
                bounds::CONCURRENCY,
            )?,
        };
        if limits.is_unlimited() {
            return Err(self.err(key, "set at least one of rpm, tpm, concurrency"));
        }
        Ok((limits, burst))
    }

    /// A model's `limits` per zone.
    pub(super) fn model_limits(
        &self,
        key: &str,
        raw: Option<RawModelLimits>,
    ) -> Result<Limits, ConfigError> {
        let Some(raw) = raw else {
            return Ok(Limits::default());
        };
        let limits = Limits {
            rpm: self.limit(&format!("{key}.rpm"), raw.rpm, bounds::PER_MINUTE)?,
            tpm: self.limit(&format!("{key}.tpm"), raw.tpm, bounds::PER_MINUTE)?,
            concurrency: None,
        };
        if limits.is_unlimited() {
            return Err(self.err(key, "set at least one of rpm, tpm"));
        }
        Ok(limits)
    }

    fn limit(&self, key: &str, v: Option<u64>, b: Bound<u64>) -> Result<Option<u64>, ConfigError> {
        match v {
            Some(0) => Err(self.err(key, "must be at least 1 (leave it out for no limit)")),
            Some(n) => self.int(key, Some(n), n, b).map(Some),
            None => Ok(None),
        }
    }

    /// A tenant's `zone_share`: zones that serve (have backends), each share
    /// in (0, 1], summing to 1. Left out: equal over the serving zones.
    pub(super) fn zone_share(
        &self,
        key: &str,
        raw: Option<BTreeMap<String, f64>>,
        serving: &BTreeSet<ZoneId>,
    ) -> Result<BTreeMap<ZoneId, f64>, ConfigError> {
        let Some(raw) = raw else {
            let n = serving.len().max(1) as f64;
            return Ok(serving.iter().map(|z| (z.clone(), 1.0 / n)).collect());
        };
        if raw.is_empty() {
            return Err(self.err(
                key,
                "must name at least one zone (leave it out for equal shares)",
            ));
        }
        let mut out = BTreeMap::new();
        for (zone, share) in raw {
            let id = ZoneId::new(zone.trim());
            if !serving.contains(&id) {
                return Err(self.err(
                    format!("{key}.{zone}"),
                    format!("`{zone}` is not a zone with backends in this config"),
                ));
            }
            if !(share > 0.0 && share <= 1.0) {
                return Err(self.err(
                    format!("{key}.{zone}"),
                    format!("a share must be above 0 and at most 1, got {share}"),
                ));
            }
            out.insert(id, share);
        }
        let sum: f64 = out.values().sum();
        if (sum - 1.0).abs() > SHARE_EPSILON {
            return Err(self.err(key, format!("shares must sum to 1, they sum to {sum}")));
        }
        Ok(out)
    }

    /// `capacity` is set on every backend of a zone or on none: a zone's
    /// capacity is the sum over its backends, and a backend without one
    /// would make the sum a guess.
    /// One pass to find the zones that declare a capacity, one to check:
    /// a scan of every backend per backend was 10⁸ zone comparisons (most
    /// of a second) at 10,000 backends.
    pub(super) fn capacities(&self, backends: &[BackendConfig]) -> Result<(), ConfigError> {
        let declared: HashSet<&ZoneId> = backends
            .iter()
            .filter(|b| b.capacity.is_some())
            .map(|b| &b.zone)
            .collect();
        for (i, b) in backends.iter().enumerate() {
            if b.capacity == Some(0) {
                return Err(self.err(format!("backends[{i}].capacity"), "must be at least 1"));
            }
            if b.capacity.is_none() && declared.contains(&b.zone) {
                return Err(self.err(
                    format!("backends[{i}].capacity"),
                    format!(
                        "other backends of zone `{}` declare a capacity: set it on every backend of the zone or on none",
                        b.zone
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error_of, MINIMAL};
    use super::super::Config;
    use super::*;

    const TWO_ZONES: &str = r#"
        [[backends]]
        name = "qwen-b1"
        zone = "az-b"
        url = "http://127.0.0.1:8001"
        models = ["qwen25-7b-instruct"]
    "#;

    fn with_tenant_line(line: &str) -> String {
        let text = MINIMAL.replace("priority = \"P0\"", &format!("priority = \"P0\"\n{line}"));
        format!("{text}\n{TWO_ZONES}")
    }

    #[test]
    fn quotas_are_read_with_defaults() {
        let c = Config::parse(
            "t.toml",
            &with_tenant_line("quota = { rpm = 6000, concurrency = 200 }"),
        )
        .unwrap();
        let t = &c.tenant_quotas[0];
        assert_eq!(t.tenant, "deptA");
        assert_eq!(t.global.rpm, Some(6000));
        assert_eq!(t.global.tpm, None);
        assert_eq!(t.global.concurrency, Some(200));
        assert_eq!(t.shares.len(), 2);
        assert!((t.shares[&ZoneId::new("az-b")] - 0.5).abs() < 1e-12);
        assert_eq!(c.tenant_bursts, [QuotaConfig::DEFAULT_BURST]);
        let c = Config::parse(
            "t.toml",
            &with_tenant_line("quota = { rpm = 60, burst = \"2500ms\" }"),
        )
        .unwrap();
        assert_eq!(c.tenant_bursts, [Duration::from_millis(2500)]);
        assert_eq!(c.quotas, QuotaConfig::default());
        for (text, want) in [
            ("0s", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
        ] {
            let c = Config::parse(
                "t.toml",
                &format!(
                    "{}\n[quotas]\nqueue_timeout = \"{text}\"",
                    with_tenant_line("")
                ),
            )
            .unwrap();
            assert_eq!(c.quotas.queue_timeout, want, "{text}");
        }
        assert!(c.models[0].limits.is_unlimited());
        let c = Config::parse(
            "t.toml",
            &format!(
                "{}\n[quotas]\nlong_request_units = 8\np0_reserve = 0.1\nrebalance_interval = \"2s\"\ndrift_threshold = 0.05\nnode_floor = 0.5\n[[models]]\nname = \"qwen25-7b-instruct\"\nlimits = {{ rpm = 100 }}",
                with_tenant_line("zone_share = { az-a = 0.25, az-b = 0.75 }")
            ),
        )
        .unwrap();
        assert_eq!(c.quotas.long_request_units, 8);
        assert_eq!(c.quotas.rebalance_interval, Duration::from_secs(2));
        assert_eq!(c.models[0].limits.rpm, Some(100));
        assert!(c.tenant_quotas[0].global.is_unlimited());
        assert!((c.tenant_quotas[0].shares[&ZoneId::new("az-a")] - 0.25).abs() < 1e-12);
    }

    #[test]
    fn invalid_quota_values_name_key_and_reason() {
        let q = |s: &str| format!("{}\n[quotas]\n{s}", with_tenant_line(""));
        let cases: Vec<(String, &str, &str)> = vec![
            (
                with_tenant_line("quota = { rpm = 0 }"),
                "tenants[0].quota.rpm",
                "at least 1",
            ),
            (
                with_tenant_line("quota = {}"),
                "tenants[0].quota",
                "at least one of",
            ),
            (
                with_tenant_line("quota = { rps = 5 }"),
                "tenants[0].quota.rps",
                "unknown field",
            ),
            (
                with_tenant_line("quota = { rpm = -5 }"),
                "tenants[0].quota.rpm",
                "invalid value",
            ),
            (
                with_tenant_line("quota = { rpm = 5, burst = \"0s\" }"),
                "tenants[0].quota.burst",
                "greater than zero",
            ),
            (
                with_tenant_line("quota = { rpm = 5, burst = \"2m\" }"),
                "tenants[0].quota.burst",
                "between 1ms and 1m (the limits are per minute)",
            ),
            (
                with_tenant_line("quota = { rpm = 5, burst = 5 }"),
                "tenants[0].quota.burst",
                "invalid type",
            ),
            (
                with_tenant_line("quota = { burst = \"5s\" }"),
                "tenants[0].quota",
                "at least one of",
            ),
            (
                with_tenant_line("zone_share = { az-a = 0.5, az-b = 0.4 }"),
                "tenants[0].zone_share",
                "sum to 1",
            ),
            (
                with_tenant_line("zone_share = { az-a = 0.5, az-z = 0.5 }"),
                "tenants[0].zone_share.az-z",
                "not a zone with backends",
            ),
            (
                with_tenant_line("zone_share = { az-a = 0.0, az-b = 1.0 }"),
                "tenants[0].zone_share.az-a",
                "above 0",
            ),
            (
                with_tenant_line("zone_share = { az-a = 1.5, az-b = -0.5 }"),
                "tenants[0].zone_share.az-a",
                "at most 1",
            ),
            (
                with_tenant_line("zone_share = {}"),
                "tenants[0].zone_share",
                "at least one zone",
            ),
            (q("p0_reserve = 0.5"), "quotas.p0_reserve", "below 0.5"),
            (
                q("queue_timeout = \"2m\""),
                "quotas.queue_timeout",
                "between 1ms and 1m",
            ),
            (
                q("queue_timeout = \"soon\""),
                "quotas.queue_timeout",
                "not a duration",
            ),
            (q("p0_reserve = -0.1"), "quotas.p0_reserve", "at least 0"),
            (
                q("drift_threshold = 0.0"),
                "quotas.drift_threshold",
                "above 0",
            ),
            (
                q("node_floor = 1.5"),
                "quotas.node_floor",
                "between 0 and 1",
            ),
            (
                q("long_request_units = 0"),
                "quotas.long_request_units",
                "at least 1",
            ),
            (
                q("rebalance_interval = \"often\""),
                "quotas.rebalance_interval",
                "not a duration",
            ),
            (q("burst = 3"), "quotas.burst", "unknown field"),
            (
                format!(
                    "{}\n[[models]]\nname = \"qwen25-7b-instruct\"\nlimits = {{ concurrency = 3 }}",
                    with_tenant_line("")
                ),
                "models[0].limits.concurrency",
                "unknown field",
            ),
            (
                format!(
                    "{}\n[[models]]\nname = \"qwen25-7b-instruct\"\nlimits = {{ tpm = 0 }}",
                    with_tenant_line("")
                ),
                "models[0].limits.tpm",
                "at least 1",
            ),
            (
                with_tenant_line("").replace(
                    "url = \"http://127.0.0.1:8000\"",
                    "url = \"http://127.0.0.1:8000\"\ncapacity = 0",
                ),
                "backends[0].capacity",
                "at least 1",
            ),
        ];
        for (text, key, reason) in &cases {
            let e = error_of(text);
            assert_eq!(e.file, "test.toml");
            assert_eq!(e.key, *key, "{e}");
            assert!(
                e.reason.contains(reason),
                "`{}` should say `{reason}`",
                e.reason
            );
        }
    }

    #[test]
    fn capacity_is_set_on_every_backend_of_a_zone_or_none() {
        let base = format!(
            "{MINIMAL}\n{}",
            TWO_ZONES
                .replace("az-b", "az-a")
                .replace("qwen-b1", "qwen-a2")
        );
        let one = base.replace(
            "url = \"http://127.0.0.1:8000\"",
            "url = \"http://127.0.0.1:8000\"\ncapacity = 8",
        );
        let e = error_of(&one);
        assert_eq!(e.key, "backends[1].capacity");
        assert!(e.reason.contains("every backend of the zone"), "{e}");
        let both = one.replace(
            "url = \"http://127.0.0.1:8001\"",
            "url = \"http://127.0.0.1:8001\"\ncapacity = 4",
        );
        let c = Config::parse("t", &both).unwrap();
        assert_eq!(c.backends[0].capacity, Some(8));
        assert_eq!(c.backends[1].capacity, Some(4));
    }
}
