//! The config file's raw shapes, exactly as written in TOML
//! (`deny_unknown_fields`), before validation. The security and quota
//! sections keep their own (`security`, `quota`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::security::{RawBackendTls, RawLimits, RawTls};
use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) node: RawNode,
    #[serde(default)]
    pub(super) tenants: Vec<RawTenant>,
    #[serde(default)]
    pub(super) backends: Vec<RawBackend>,
    #[serde(default)]
    pub(super) models: Vec<RawModel>,
    #[serde(default)]
    pub(super) retry: RawRetry,
    #[serde(default)]
    pub(super) health: RawHealth,
    #[serde(default)]
    pub(super) affinity: RawAffinity,
    #[serde(default)]
    pub(super) balance: RawBalance,
    #[serde(default)]
    pub(super) admin: RawAdmin,
    #[serde(default)]
    pub(super) cluster: RawCluster,
    #[serde(default)]
    pub(super) zones: BTreeMap<String, RawZone>,
    #[serde(default)]
    pub(super) failover: RawFailover,
    #[serde(default)]
    pub(super) prompt_tiers: Vec<RawPromptTier>,
    #[serde(default)]
    pub(super) quotas: quota::RawQuotas,
    #[serde(default)]
    pub(super) rules: Vec<policy::RawRule>,
    #[serde(default)]
    pub(super) shadows: Vec<policy::RawShadow>,
    #[serde(default)]
    pub(super) telemetry: RawTelemetry,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Option<String>,
    pub(super) sampling: Option<f64>,
    pub(super) queue_size: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPromptTier {
    pub(super) min_bytes: u64,
    pub(super) min_tier: u32,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFailover {
    pub(super) enabled: Option<bool>,
    pub(super) period: Option<String>,
    pub(super) cutoff: Option<f64>,
    pub(super) min_periods: Option<u32>,
    pub(super) weights: Option<RawWeights>,
    pub(super) auto_failback: Option<bool>,
    pub(super) failback_threshold: Option<f64>,
    pub(super) failback_periods: Option<u32>,
    pub(super) history_periods: Option<u32>,
    pub(super) max_auto_failed_over: Option<u32>,
    pub(super) dwell: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWeights {
    pub(super) gw_error: f64,
    pub(super) timeout: f64,
    pub(super) gpu: f64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawZone {
    #[serde(default)]
    pub(super) fallback_order: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) id: u64,
    pub(super) zone: String,
    pub(super) listen: String,
    pub(super) admin_listen: String,
    pub(super) data_dir: PathBuf,
    pub(super) raft_listen: Option<String>,
    #[serde(default = "default_max_body_bytes")]
    pub(super) max_body_bytes: u64,
    pub(super) data_plane_threads: Option<u64>,
    pub(super) data_plane_scheduling: Option<String>,
    pub(super) drain_grace: Option<String>,
    pub(super) drain_timeout: Option<String>,
    pub(super) tls: Option<RawTls>,
    pub(super) limits: Option<RawLimits>,
}

pub(super) fn default_max_body_bytes() -> u64 {
    32 * 1024 * 1024
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub(super) name: String,
    pub(super) key_sha256: OneOrMany,
    #[serde(default = "default_priority")]
    pub(super) priority: Priority,
    pub(super) quota: Option<quota::RawLimits>,
    pub(super) zone_share: Option<BTreeMap<String, f64>>,
    pub(super) models: Option<Vec<String>>,
    #[serde(default)]
    pub(super) require_tags: Vec<String>,
    pub(super) budget: Option<super::cost::RawBudget>,
    pub(super) on_budget: Option<super::cost::OnBudget>,
}

pub(super) fn default_priority() -> Priority {
    Priority::P1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) name: String,
    pub(super) zone: String,
    pub(super) url: String,
    pub(super) models: Vec<String>,
    #[serde(default = "one")]
    pub(super) weight: u32,
    /// `/health`, or a provider's free model list.
    pub(super) health_path: Option<String>,
    pub(super) metrics_path: Option<String>,
    #[serde(default)]
    pub(super) model_names: BTreeMap<String, String>,
    pub(super) tls: Option<RawBackendTls>,
    pub(super) capacity: Option<u32>,
    #[serde(default)]
    pub(super) tags: Vec<String>,
    pub(super) price: Option<super::cost::RawPrice>,
    #[serde(default)]
    pub(super) provider: Provider,
    pub(super) api_key: Option<RawSecret>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    pub(super) api_version: Option<String>,
    pub(super) default_max_tokens: Option<u32>,
    pub(super) health: Option<RawBackendHealth>,
}

/// `{ env = "NAME" }` or `{ file = "/path" }`: where a secret is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    pub(super) env: Option<String>,
    pub(super) file: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackendHealth {
    pub(super) interval: Option<String>,
}

pub(super) fn one() -> u32 {
    1
}

pub(super) fn default_health_path() -> String {
    "/health".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) name: String,
    #[serde(default)]
    pub(super) balance: Balance,
    #[serde(default)]
    pub(super) fallback: Vec<String>,
    #[serde(default)]
    pub(super) context_fallback: Vec<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) ttft_timeout: Option<String>,
    /// Deprecated alias of `ttft_timeout`.
    pub(super) first_byte_timeout: Option<String>,
    pub(super) generation_timeout: Option<String>,
    pub(super) idle_timeout: Option<String>,
    pub(super) total_timeout: Option<String>,
    #[serde(default)]
    pub(super) continuation: Continuation,
    pub(super) tier: Option<u32>,
    pub(super) limits: Option<quota::RawModelLimits>,
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    pub(super) price: Option<super::cost::RawPrice>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) max_attempts: Option<u32>,
    pub(super) budget_ratio: Option<f64>,
    pub(super) min_concurrent_retries: Option<u32>,
    pub(super) default_cooldown: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) max_retry_after_wait: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) interval: Option<String>,
    pub(super) stable_interval: Option<String>,
    pub(super) jitter: Option<f64>,
    pub(super) timeout: Option<String>,
    pub(super) unhealthy_threshold: Option<u32>,
    pub(super) healthy_threshold: Option<u32>,
    pub(super) passive_failures: Option<u32>,
    pub(super) smoothing: Option<f64>,
    pub(super) moving_delta: Option<f64>,
    pub(super) weight_latency: Option<f64>,
    pub(super) weight_errors: Option<f64>,
    pub(super) weight_queue: Option<f64>,
    pub(super) weight_kv: Option<f64>,
    pub(super) latency_ms_bounds: Option<[f64; 2]>,
    pub(super) error_rate_bounds: Option<[f64; 2]>,
    pub(super) queue_depth_bounds: Option<[f64; 2]>,
    pub(super) kv_usage_bounds: Option<[f64; 2]>,
    pub(super) eject_below: Option<f64>,
    pub(super) rejoin_above: Option<f64>,
    pub(super) healthy_above: Option<f64>,
    pub(super) degraded_above: Option<f64>,
    pub(super) band_margin: Option<f64>,
    pub(super) degraded_multiplier: Option<f64>,
    pub(super) unstable_multiplier: Option<f64>,
    pub(super) slow_start: Option<String>,
    pub(super) slow_start_share: Option<f64>,
    pub(super) canary_share: Option<f64>,
    pub(super) canary_time: Option<String>,
    pub(super) rejoin_ramp: Option<String>,
    pub(super) ejection_time: Option<String>,
    pub(super) max_ejection_time: Option<String>,
    pub(super) watch_interval: Option<String>,
    pub(super) max_watch_interval: Option<String>,
    pub(super) max_ejected_percent: Option<f64>,
    pub(super) breaker_percent: Option<f64>,
    pub(super) floor_model: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAffinity {
    pub(super) zone_pin: Option<bool>,
    pub(super) pin_ttl: Option<String>,
    pub(super) pin_capacity: Option<usize>,
    pub(super) cross_zone_fallback: Option<CrossZone>,
    pub(super) short_max_tokens: Option<u64>,
    pub(super) short_max_prompt_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBalance {
    pub(super) vnodes: Option<u32>,
    pub(super) load_factor: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    #[serde(default)]
    pub(super) tokens: Vec<RawAdminToken>,
    pub(super) tls: Option<RawTls>,
    pub(super) limits: Option<RawLimits>,
    #[serde(default)]
    pub(super) metrics_auth: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    #[serde(default)]
    pub(super) members: Vec<RawMember>,
    pub(super) heartbeat: Option<String>,
    pub(super) election_timeout_min: Option<String>,
    pub(super) election_timeout_max: Option<String>,
    #[serde(default)]
    pub(super) ready_requires_leader: bool,
    pub(super) tls: Option<RawTls>,
    pub(super) limits: Option<RawLimits>,
    #[serde(default)]
    pub(super) allow_plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMember {
    pub(super) id: u64,
    pub(super) zone: String,
    pub(super) raft: String,
    pub(super) admin: String,
    #[serde(default = "default_role")]
    pub(super) role: zonegate_cluster::Role,
}

pub(super) fn default_role() -> zonegate_cluster::Role {
    zonegate_cluster::Role::Voter
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdminToken {
    pub(super) name: String,
    pub(super) sha256: String,
    pub(super) role: Role,
    #[serde(default)]
    pub(super) allow_from: Vec<String>,
}
