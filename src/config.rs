//! Node configuration: raw TOML shapes (`deny_unknown_fields`) and their
//! validation into typed values. Every error names the file, the key and the
//! reason, and nothing starts until the whole file is valid.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use serde::Deserialize;
use zonegate_cluster::{
    FailoverConfig, Limits, Member, Role as MemberRole, ScoreWeights, TenantQuota, ZoneId,
};
use zonegate_net::tls::{BackendTls, TlsFiles};

mod bounds;
mod quota;
#[cfg(test)]
mod reference_test;
pub mod replicated;
mod security;

use bounds::Bound;
pub use bounds::{MAX_RING_POINTS, MAX_RING_POINTS_PER_POOL};
pub use quota::QuotaConfig;
pub use security::{LimitSettings, Network};
use security::{RawBackendTls, RawLimits, RawTls};
/// Tenant priority: P0 is never starved, P2 yields first (the quota
/// arithmetic's type, so the control plane reads the same values).
pub use zonegate_cluster::Priority;

/// A configuration error: which file, which key, and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {reason}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub reason: String,
}

/// How a model's backends are chosen within a zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Power of two choices on in-flight × latency EWMA.
    #[default]
    P2c,
    /// Smooth weighted round robin (nginx's algorithm).
    RoundRobin,
    /// Weighted random, for canary splits.
    Random,
    /// Consistent hashing with bounded load, keyed by session.
    Ring,
}

impl Balance {
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::P2c => "p2c",
            Balance::RoundRobin => "round_robin",
            Balance::Random => "random",
            Balance::Ring => "ring",
        }
    }
}

/// Which requests may leave their zone when it has no usable backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrossZone {
    None,
    #[default]
    Short,
    All,
}

// ---------------------------------------------------------------------------
// Raw shapes, exactly as written in TOML.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node: RawNode,
    #[serde(default)]
    tenants: Vec<RawTenant>,
    #[serde(default)]
    backends: Vec<RawBackend>,
    #[serde(default)]
    models: Vec<RawModel>,
    #[serde(default)]
    retry: RawRetry,
    #[serde(default)]
    health: RawHealth,
    #[serde(default)]
    affinity: RawAffinity,
    #[serde(default)]
    balance: RawBalance,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    cluster: RawCluster,
    #[serde(default)]
    zones: BTreeMap<String, RawZone>,
    #[serde(default)]
    failover: RawFailover,
    #[serde(default)]
    prompt_tiers: Vec<RawPromptTier>,
    #[serde(default)]
    quotas: quota::RawQuotas,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPromptTier {
    min_bytes: u64,
    min_tier: u32,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFailover {
    enabled: Option<bool>,
    period: Option<String>,
    cutoff: Option<f64>,
    min_periods: Option<u32>,
    weights: Option<RawWeights>,
    auto_failback: Option<bool>,
    failback_threshold: Option<f64>,
    failback_periods: Option<u32>,
    history_periods: Option<u32>,
    max_auto_failed_over: Option<u32>,
    dwell: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeights {
    gw_error: f64,
    timeout: f64,
    gpu: f64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawZone {
    #[serde(default)]
    fallback_order: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: u64,
    zone: String,
    listen: String,
    admin_listen: String,
    data_dir: PathBuf,
    raft_listen: Option<String>,
    #[serde(default = "default_max_body_bytes")]
    max_body_bytes: u64,
    data_plane_threads: Option<u64>,
    data_plane_scheduling: Option<String>,
    drain_grace: Option<String>,
    drain_timeout: Option<String>,
    tls: Option<RawTls>,
    limits: Option<RawLimits>,
}

/// `[node] data_plane_scheduling`: the kernel's policy for the data-plane
/// threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheduling {
    /// `SCHED_BATCH`: a thread that wakes does not preempt the one running
    /// on its core, it waits for that one's time slice. A proxy's threads
    /// wake for every packet; on cores shared with other work (a sidecar,
    /// the backend in a benchmark) preempting on each wake-up costs more
    /// than it saves. On an otherwise idle core nothing changes.
    #[default]
    Batch,
    /// The policy the process started with: the kernel's default
    /// (`SCHED_OTHER`, where every wake-up may preempt) unless the
    /// operator started it under another (`chrt`).
    Normal,
}

/// More data-plane threads than this is a typo, not a machine.
const MAX_DATA_PLANE_THREADS: u64 = 1024;

fn default_max_body_bytes() -> u64 {
    32 * 1024 * 1024
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    key_sha256: OneOrMany,
    #[serde(default = "default_priority")]
    priority: Priority,
    quota: Option<quota::RawLimits>,
    zone_share: Option<BTreeMap<String, f64>>,
}

fn default_priority() -> Priority {
    Priority::P1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: String,
    zone: String,
    url: String,
    models: Vec<String>,
    #[serde(default = "one")]
    weight: u32,
    #[serde(default = "default_health_path")]
    health_path: String,
    metrics_path: Option<String>,
    #[serde(default)]
    model_names: BTreeMap<String, String>,
    tls: Option<RawBackendTls>,
    capacity: Option<u32>,
}

fn one() -> u32 {
    1
}

fn default_health_path() -> String {
    "/health".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    #[serde(default)]
    balance: Balance,
    #[serde(default)]
    fallback: Vec<String>,
    #[serde(default)]
    context_fallback: Vec<String>,
    connect_timeout: Option<String>,
    ttft_timeout: Option<String>,
    /// Deprecated alias of `ttft_timeout`.
    first_byte_timeout: Option<String>,
    generation_timeout: Option<String>,
    idle_timeout: Option<String>,
    total_timeout: Option<String>,
    #[serde(default)]
    continuation: Continuation,
    tier: Option<u32>,
    limits: Option<quota::RawModelLimits>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    max_attempts: Option<u32>,
    budget_ratio: Option<f64>,
    min_concurrent_retries: Option<u32>,
    default_cooldown: Option<String>,
    connect_timeout: Option<String>,
    max_retry_after_wait: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    interval: Option<String>,
    stable_interval: Option<String>,
    jitter: Option<f64>,
    timeout: Option<String>,
    unhealthy_threshold: Option<u32>,
    healthy_threshold: Option<u32>,
    passive_failures: Option<u32>,
    smoothing: Option<f64>,
    moving_delta: Option<f64>,
    weight_latency: Option<f64>,
    weight_errors: Option<f64>,
    weight_queue: Option<f64>,
    weight_kv: Option<f64>,
    latency_ms_bounds: Option<[f64; 2]>,
    error_rate_bounds: Option<[f64; 2]>,
    queue_depth_bounds: Option<[f64; 2]>,
    kv_usage_bounds: Option<[f64; 2]>,
    eject_below: Option<f64>,
    rejoin_above: Option<f64>,
    healthy_above: Option<f64>,
    degraded_above: Option<f64>,
    band_margin: Option<f64>,
    degraded_multiplier: Option<f64>,
    unstable_multiplier: Option<f64>,
    slow_start: Option<String>,
    slow_start_share: Option<f64>,
    canary_share: Option<f64>,
    canary_time: Option<String>,
    rejoin_ramp: Option<String>,
    ejection_time: Option<String>,
    max_ejection_time: Option<String>,
    watch_interval: Option<String>,
    max_watch_interval: Option<String>,
    max_ejected_percent: Option<f64>,
    breaker_percent: Option<f64>,
    floor_model: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAffinity {
    zone_pin: Option<bool>,
    pin_ttl: Option<String>,
    pin_capacity: Option<usize>,
    cross_zone_fallback: Option<CrossZone>,
    short_max_tokens: Option<u64>,
    short_max_prompt_bytes: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBalance {
    vnodes: Option<u32>,
    load_factor: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    #[serde(default)]
    tokens: Vec<RawAdminToken>,
    tls: Option<RawTls>,
    limits: Option<RawLimits>,
    #[serde(default)]
    metrics_auth: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    #[serde(default)]
    members: Vec<RawMember>,
    heartbeat: Option<String>,
    election_timeout_min: Option<String>,
    election_timeout_max: Option<String>,
    #[serde(default)]
    ready_requires_leader: bool,
    tls: Option<RawTls>,
    limits: Option<RawLimits>,
    #[serde(default)]
    allow_plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMember {
    id: u64,
    zone: String,
    raft: String,
    admin: String,
    #[serde(default = "default_role")]
    role: zonegate_cluster::Role,
}

fn default_role() -> zonegate_cluster::Role {
    zonegate_cluster::Role::Voter
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdminToken {
    name: String,
    sha256: String,
    role: Role,
    #[serde(default)]
    allow_from: Vec<String>,
}

// ---------------------------------------------------------------------------
// Validated, typed configuration.

/// A fully validated node configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file this config was read from (error messages, relative paths).
    pub file: String,
    /// The file's text: the base a replicated config is merged into.
    pub text: std::sync::Arc<str>,
    /// The replicated config version this node routes with: 0 for its own
    /// file (standalone, or before the cluster's first config).
    pub config_version: u64,
    /// The replicated sections in effect, as TOML.
    pub replicated: std::sync::Arc<str>,
    pub node: NodeConfig,
    pub tenants: Vec<Tenant>,
    /// Each API key's digest → its tenant's index in `tenants`: a request's
    /// key is found with one lookup, however many keys there are (digests
    /// are unique, checked above; a fast hash suffices, since nobody can
    /// choose a SHA-256 digest).
    pub tenant_keys: HashMap<[u8; 32], usize, foldhash::fast::RandomState>,
    pub backends: Vec<BackendConfig>,
    /// Every logical model served by some backend, with defaults filled in.
    pub models: Vec<ModelConfig>,
    pub retry: RetryConfig,
    pub health: HealthConfig,
    pub affinity: AffinityConfig,
    pub balance: BalanceConfig,
    pub admin: AdminConfig,
    /// Raft group members; empty means this node runs standalone.
    pub members: Vec<Member>,
    /// `[cluster]` settings besides the members.
    pub cluster: ClusterSettings,
    /// Per-zone preference order of cross-zone fallback targets.
    pub fallback_order: HashMap<ZoneId, Vec<ZoneId>>,
    /// Zone reports, the leader's detector and automatic decisions.
    pub failover: FailoverConfig,
    /// Complexity estimate: (body bytes at least, minimum tier), sorted by
    /// bytes. A request this large needs a model of at least that tier.
    pub prompt_tiers: Vec<(u64, u32)>,
    /// `[quotas]`: capacity units and the leader's rebalancing.
    pub quotas: QuotaConfig,
    /// Per tenant, in the order of `tenants`: its global limits (`quota`,
    /// unlimited in every unit when not set) and each serving zone's share
    /// (`zone_share`, summing to 1).
    pub tenant_quotas: Vec<TenantQuota>,
    /// Per tenant, in the order of `tenants`: how much of a minute's
    /// allocation its buckets admit at once (`quota.burst`).
    pub tenant_bursts: Vec<Duration>,
}

/// `[cluster]`: Raft timing and readiness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// Raft timers (`heartbeat`, `election_timeout_min/max`); the defaults
    /// suit one region (100 ms, 300–600 ms). Raise them for cross-region
    /// members or slow disks.
    pub timing: zonegate_cluster::Timing,
    /// `/readyz` fails while this node's view is stale (no leader with a
    /// quorum heard from within a few election timeouts). Off by default:
    /// a partitioned node keeps serving with its last view (fail static).
    pub ready_requires_leader: bool,
    /// `[cluster.tls]`: mutual TLS between members (Raft, reports).
    pub tls: Option<TlsFiles>,
    /// `[cluster.limits]`: the Raft listener's budget and timeouts.
    pub limits: LimitSettings,
    /// `[cluster] allow_plaintext`: run a multi-zone cluster without TLS
    /// (local demos and tests).
    pub allow_plaintext: bool,
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: u64,
    pub zone: ZoneId,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub data_dir: PathBuf,
    pub raft_listen: Option<SocketAddr>,
    pub max_body_bytes: usize,
    /// Data-plane threads, each with its own listener and runtime (nginx's
    /// `worker_processes`, Envoy's `--concurrency`); `None`: one per core.
    pub data_plane_threads: Option<usize>,
    /// How the kernel schedules the data-plane threads.
    pub data_plane_scheduling: Scheduling,
    /// On SIGTERM: how long the node keeps serving with `/readyz` failing,
    /// so load balancers take it out before it stops accepting.
    pub drain_grace: Duration,
    /// After the grace: how long in-flight requests may finish; streams
    /// still open then end with the SSE error event.
    pub drain_timeout: Duration,
    /// `[node.tls]`: HTTPS (HTTP/1.1 and HTTP/2 by ALPN) on the data plane.
    pub tls: Option<TlsFiles>,
    /// `[node.limits]`: the data plane's budget and timeouts.
    pub limits: LimitSettings,
}

#[derive(Clone, Debug)]
pub struct Tenant {
    /// Shared, not copied, by every request's record of its tenant.
    pub name: Arc<str>,
    /// SHA-256 digests of the tenant's API keys.
    pub key_hashes: Vec<[u8; 32]>,
    pub priority: Priority,
}

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub name: String,
    pub zone: ZoneId,
    pub scheme: Scheme,
    pub authority: Authority,
    pub models: Vec<String>,
    pub weight: u32,
    pub health_path: String,
    pub metrics_path: Option<String>,
    /// Logical model name → the backend's own name, where they differ.
    pub model_names: HashMap<String, String>,
    /// How an `https://` backend is verified.
    pub tls: BackendTls,
    /// Capacity units this backend carries (a request costs 1, a long one
    /// `quotas.long_request_units`); `None` when undeclared.
    pub capacity: Option<u32>,
}

/// How a stream that broke after bytes reached the client is continued
/// on this model (`[[models]] continuation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Continuation {
    /// Resend with the text delivered so far as an assistant prefill.
    #[default]
    Prefill,
    /// Resend the original request and stream on only if the regenerated
    /// text begins with exactly what was delivered (deterministic decoding).
    Restart,
    /// Never continue: the client gets the SSE error event.
    None,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub name: String,
    pub balance: Balance,
    pub fallback: Vec<String>,
    /// Larger-context models a `context_length_exceeded` answer goes to.
    pub context_fallback: Vec<String>,
    pub timeouts: Timeouts,
    pub continuation: Continuation,
    /// Capability tier (higher is more capable); `None` when undeclared,
    /// which counts as tier 0 against a request's minimum.
    pub tier: Option<u32>,
    /// `limits`: per-zone rpm/tpm that protect the backends (unlimited when
    /// not set).
    pub limits: Limits,
}

#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Attempts per model, the first included.
    pub max_attempts: u32,
    /// Retries running at once, as a share of the requests in flight.
    pub budget_ratio: f64,
    /// Retries always allowed to run at once, so a quiet node can retry.
    pub min_concurrent_retries: u32,
    /// Cooldown after a 429 without `Retry-After`.
    pub default_cooldown: Duration,
    pub connect_timeout: Duration,
    /// A 429 whose `Retry-After` is at most this is waited out on the same
    /// model when no other backend of it is free.
    pub max_retry_after_wait: Duration,
}

/// A model's timeouts, fitted to LLM work: a long generation is work, not
/// a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// To open a connection to a backend.
    pub connect: Duration,
    /// Streams: from sending to the first body byte (time to first token).
    pub ttft: Duration,
    /// Non-streaming: to the first byte of the response, which servers
    /// send only when the generation is complete.
    pub generation: Duration,
    /// Between two chunks of a response body.
    pub idle: Duration,
    /// One deadline over every attempt, retry and fallback of a request.
    pub total: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            ttft: Duration::from_secs(30),
            generation: Duration::from_secs(600),
            idle: Duration::from_secs(30),
            total: Duration::from_secs(600),
        }
    }
}

/// Health model settings (`[health]`). Scores are 0–100; shares and
/// multipliers are fractions of a backend's configured weight.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Probe interval while the score moves or the state is not HEALTHY.
    pub interval: Duration,
    /// Probe interval while HEALTHY and steady.
    pub stable_interval: Duration,
    /// Each probe period is stretched or shrunk by up to this share.
    pub jitter: f64,
    pub timeout: Duration,
    /// Consecutive evaluations below `eject_below` that eject a backend.
    pub unhealthy_threshold: u32,
    /// Consecutive evaluations above `rejoin_above` before it rejoins.
    pub healthy_threshold: u32,
    /// Consecutive failed requests that eject a backend at once.
    pub passive_failures: u32,
    /// EWMA share of each new raw score in the smoothed score.
    pub smoothing: f64,
    /// A raw score this far from the smoothed one means "moving".
    pub moving_delta: f64,
    pub score: ScoreConfig,
    pub eject_below: f64,
    pub rejoin_above: f64,
    /// Smoothed score at or above which a backend is HEALTHY...
    pub healthy_above: f64,
    /// ...and above which it is DEGRADED rather than UNSTABLE.
    pub degraded_above: f64,
    /// Moving up a band needs the score this far past its boundary.
    pub band_margin: f64,
    pub degraded_multiplier: f64,
    pub unstable_multiplier: f64,
    /// A new backend ramps from `slow_start_share` to full over this time.
    pub slow_start: Duration,
    pub slow_start_share: f64,
    /// A rejoining backend holds `canary_share` for `canary_time`, then
    /// ramps to full over `rejoin_ramp`.
    pub canary_share: f64,
    pub canary_time: Duration,
    pub rejoin_ramp: Duration,
    /// Minimum time out after the n-th ejection: n × this, at most the max.
    pub ejection_time: Duration,
    pub max_ejection_time: Duration,
    /// Probe backoff of an ejected backend whose probes fail: doubles from
    /// `watch_interval` up to `max_watch_interval`.
    pub watch_interval: Duration,
    pub max_watch_interval: Duration,
    /// Never eject (on score) more than this percentage of one model's
    /// backends in one zone; beyond it the pool routes in panic mode.
    pub max_ejected_percent: f64,
    /// When more than this percentage of models has no healthy backend,
    /// their requests go to `floor_model`.
    pub breaker_percent: f64,
    pub floor_model: Option<String>,
}

impl Default for HealthConfig {
    /// Every `[health]` default, as an empty section validates to.
    fn default() -> Self {
        let v = Validator { file: "defaults" };
        // An empty section with no floor model cannot fail validation.
        v.health(RawHealth::default(), &[])
            .unwrap_or_else(|e| unreachable!("health defaults are invalid: {e}"))
    }
}

/// How the four dimensions become a score: weights and the (good, bad)
/// normalisation bounds of each signal. A signal at or better than `good`
/// scores 100, at or worse than `bad` 0, linearly between.
#[derive(Clone, Debug)]
pub struct ScoreConfig {
    pub weight_latency: f64,
    pub weight_errors: f64,
    pub weight_queue: f64,
    pub weight_kv: f64,
    pub latency_ms: (f64, f64),
    pub error_rate: (f64, f64),
    pub queue_depth: (f64, f64),
    pub kv_usage: (f64, f64),
}

#[derive(Clone, Debug)]
pub struct AffinityConfig {
    /// Pin sessions to the zone that first served them.
    pub zone_pin: bool,
    /// How long a pin lives without being used.
    pub pin_ttl: Duration,
    /// Sessions this node remembers (least recently used out first).
    pub pin_capacity: usize,
    pub cross_zone_fallback: CrossZone,
    pub short_max_tokens: u64,
    pub short_max_prompt_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct BalanceConfig {
    /// Virtual nodes per unit of weight on the hash ring.
    pub vnodes: u32,
    /// Bounded-load factor c: no backend takes more than c × the mean load.
    pub load_factor: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// May read (GET).
    Viewer,
    /// May read and write (GET and POST).
    Operator,
}

#[derive(Clone, Debug, Default)]
pub struct AdminConfig {
    pub tokens: Vec<AdminToken>,
    /// `[admin.tls]`: HTTPS on the admin API.
    pub tls: Option<TlsFiles>,
    /// `[admin.limits]`: the admin listener's budget and timeouts.
    pub limits: LimitSettings,
    /// `/metrics` needs a viewer token.
    pub metrics_auth: bool,
}

#[derive(Clone, Debug)]
pub struct AdminToken {
    pub name: String,
    pub hash: [u8; 32],
    pub role: Role,
    /// Source networks the token is accepted from; empty: any.
    pub allow_from: Vec<Network>,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            key: "-".into(),
            reason: format!("cannot read: {e}"),
        })?;
        Self::parse(&file, &text)
    }

    /// Validates config text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|e| {
                let key = e.path().to_string();
                let inner = e.into_inner();
                ConfigError {
                    file: file.to_owned(),
                    key: if key == "." { "-".into() } else { key },
                    reason: inner.message().trim().to_owned(),
                }
            })?;
        let mut cfg = Validator { file }.validate(raw)?;
        cfg.file = file.to_owned();
        cfg.text = text.into();
        cfg.replicated = replicated::cut(file, text)?.into();
        Ok(cfg)
    }
}

struct Validator<'a> {
    file: &'a str,
}

impl Validator<'_> {
    fn err(&self, key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            key: key.into(),
            reason: reason.into(),
        }
    }

    fn addr(&self, key: &str, s: &str) -> Result<SocketAddr, ConfigError> {
        s.parse()
            .map_err(|_| self.err(key, format!("`{s}` is not an IP:port address")))
    }

    fn sha256(&self, key: &str, s: &str) -> Result<[u8; 32], ConfigError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)
            .map_err(|_| self.err(key, "must be 64 hex characters (a SHA-256 digest)"))?;
        Ok(out)
    }

    /// A count of at least 1, within `b`.
    fn positive(
        &self,
        key: &str,
        v: Option<u32>,
        default: u32,
        b: Bound<u64>,
    ) -> Result<u32, ConfigError> {
        self.int(key, v, default, b)
    }

    fn validate(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let mut node = self.node(raw.node)?;
        let mut raw_cluster = raw.cluster;
        let cluster = self.cluster(&mut raw_cluster)?;
        let members = self.members(raw_cluster, &mut node)?;
        let zones: HashSet<&ZoneId> = members.iter().map(|m| &m.zone).collect();
        if zones.len() > 1 && cluster.tls.is_none() && !cluster.allow_plaintext {
            return Err(self.err(
                "cluster.tls",
                "a multi-zone cluster needs mutual TLS between members ([cluster.tls] with cert, key and client_ca); set [cluster] allow_plaintext = true only for local demos and tests",
            ));
        }
        let witness = members
            .iter()
            .any(|m| m.id == node.id && m.role == MemberRole::Witness);
        let mut raw_tenants = raw.tenants;
        let tenant_quotas: Vec<_> = raw_tenants
            .iter_mut()
            .map(|t| (t.quota.take(), t.zone_share.take()))
            .collect();
        for (key, n, b) in [
            ("tenants", raw_tenants.len(), bounds::TENANTS),
            ("backends", raw.backends.len(), bounds::BACKENDS),
            ("models", raw.models.len(), bounds::MODELS),
            ("prompt_tiers", raw.prompt_tiers.len(), bounds::PROMPT_TIERS),
        ] {
            if n as u64 > b.max {
                return Err(self.err(key, format!("{n} entries, at most {} ({})", b.max, b.why)));
            }
        }
        let tenants = self.tenants(raw_tenants)?;
        let backends = self.backends(raw.backends, witness)?;
        self.capacities(&backends)?;
        let serving: std::collections::BTreeSet<ZoneId> =
            backends.iter().map(|b| b.zone.clone()).collect();
        let mut tenant_bursts = Vec::with_capacity(tenants.len());
        let tenant_quotas = tenants
            .iter()
            .zip(tenant_quotas)
            .enumerate()
            .map(|(i, (t, (limits, share)))| {
                let (global, burst) = self.tenant_limits(&format!("tenants[{i}].quota"), limits)?;
                tenant_bursts.push(burst);
                Ok(TenantQuota {
                    tenant: t.name.to_string(),
                    priority: t.priority,
                    global,
                    shares: self.zone_share(
                        &format!("tenants[{i}].zone_share"),
                        share,
                        &serving,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let quotas = self.quotas(raw.quotas)?;
        let retry = self.retry(raw.retry)?;
        let models = self.models(raw.models, &backends, retry.connect_timeout)?;
        let health = self.health(raw.health, &models)?;
        let affinity = AffinityConfig {
            zone_pin: raw.affinity.zone_pin.unwrap_or(true),
            pin_ttl: self.duration(
                "affinity.pin_ttl",
                raw.affinity.pin_ttl.as_deref(),
                Duration::from_secs(3600),
                bounds::PIN_TTL,
            )?,
            pin_capacity: self.int(
                "affinity.pin_capacity",
                raw.affinity.pin_capacity,
                1_000_000,
                bounds::PIN_CAPACITY,
            )?,
            cross_zone_fallback: raw.affinity.cross_zone_fallback.unwrap_or_default(),
            short_max_tokens: self.int(
                "affinity.short_max_tokens",
                raw.affinity.short_max_tokens,
                512,
                bounds::SHORT_TOKENS,
            )?,
            short_max_prompt_bytes: self.int(
                "affinity.short_max_prompt_bytes",
                raw.affinity.short_max_prompt_bytes,
                16 * 1024,
                bounds::PROMPT_BYTES,
            )?,
        };
        let balance = BalanceConfig {
            vnodes: self.positive("balance.vnodes", raw.balance.vnodes, 160, bounds::VNODES)?,
            load_factor: self.real(
                "balance.load_factor",
                raw.balance.load_factor,
                1.25,
                bounds::LOAD_FACTOR,
            )?,
        };
        let admin = self.admin(raw.admin)?;
        let known: HashSet<&ZoneId> = backends
            .iter()
            .map(|b| &b.zone)
            .chain(members.iter().map(|m| &m.zone))
            .chain([&node.zone])
            .collect();
        let mut fallback_order = HashMap::new();
        for (zone, z) in raw.zones {
            for (i, target) in z.fallback_order.iter().enumerate() {
                if !known.contains(&ZoneId::new(target)) || *target == zone {
                    return Err(self.err(
                        format!("zones.{zone}.fallback_order[{i}]"),
                        format!("`{target}` is not another zone of this config"),
                    ));
                }
            }
            let order = z.fallback_order.iter().map(|o| ZoneId::new(o)).collect();
            fallback_order.insert(ZoneId::new(&zone), order);
        }
        let failover = self.failover(raw.failover, &fallback_order)?;
        let mut prompt_tiers: Vec<(u64, u32)> = raw
            .prompt_tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let key = format!("prompt_tiers[{i}]");
                Ok((
                    self.int(
                        &format!("{key}.min_bytes"),
                        Some(t.min_bytes),
                        0,
                        bounds::PROMPT_BYTES,
                    )?,
                    self.int(
                        &format!("{key}.min_tier"),
                        Some(t.min_tier),
                        0,
                        bounds::TIER,
                    )?,
                ))
            })
            .collect::<Result<_, ConfigError>>()?;
        prompt_tiers.sort_unstable();
        let tenant_keys = tenants
            .iter()
            .enumerate()
            .flat_map(|(i, t)| t.key_hashes.iter().map(move |h| (*h, i)))
            .collect();
        Ok(Config {
            file: String::new(),
            text: "".into(),
            config_version: 0,
            replicated: "".into(),
            quotas,
            tenant_quotas,
            tenant_bursts,
            prompt_tiers,
            failover,
            node,
            tenants,
            tenant_keys,
            backends,
            models,
            retry,
            health,
            affinity,
            balance,
            admin,
            members,
            cluster,
            fallback_order,
        })
    }

    /// `[cluster]` timing: election_timeout_min ≥ 3 × heartbeat (several
    /// heartbeats per timeout, so one slow beat elects nobody) and min <
    /// max (openraft draws its timeout between them).
    fn cluster(&self, raw: &mut RawCluster) -> Result<ClusterSettings, ConfigError> {
        let d = zonegate_cluster::Timing::default();
        let heartbeat = self.duration(
            "cluster.heartbeat",
            raw.heartbeat.as_deref(),
            d.heartbeat,
            bounds::HEARTBEAT,
        )?;
        let min = self.duration(
            "cluster.election_timeout_min",
            raw.election_timeout_min.as_deref(),
            d.election_timeout_min,
            bounds::ELECTION_TIMEOUT,
        )?;
        let max = self.duration(
            "cluster.election_timeout_max",
            raw.election_timeout_max.as_deref(),
            d.election_timeout_max,
            bounds::ELECTION_TIMEOUT,
        )?;
        if min < heartbeat * 3 {
            return Err(self.err(
                "cluster.election_timeout_min",
                format!(
                    "must be at least 3 x cluster.heartbeat ({:?}), got {min:?}",
                    heartbeat * 3
                ),
            ));
        }
        if max <= min {
            return Err(self.err(
                "cluster.election_timeout_max",
                format!("must be greater than cluster.election_timeout_min ({min:?}), got {max:?}"),
            ));
        }
        Ok(ClusterSettings {
            timing: zonegate_cluster::Timing {
                heartbeat,
                election_timeout_min: min,
                election_timeout_max: max,
                ..d
            },
            ready_requires_leader: raw.ready_requires_leader,
            tls: self.tls("cluster", raw.tls.take(), true)?,
            limits: self.limits("cluster", raw.limits.take())?,
            allow_plaintext: raw.allow_plaintext,
        })
    }

    /// Validates `[[cluster.members]]`: unique ids, this node among them
    /// in its own zone, at least one voter. Fills `node.raft_listen` from
    /// this node's entry when it is not set.
    fn members(&self, raw: RawCluster, node: &mut NodeConfig) -> Result<Vec<Member>, ConfigError> {
        if raw.members.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = HashSet::new();
        let mut members = Vec::new();
        for (i, m) in raw.members.into_iter().enumerate() {
            let key = format!("cluster.members[{i}]");
            if !ids.insert(m.id) {
                return Err(self.err(format!("{key}.id"), format!("duplicate member id {}", m.id)));
            }
            if m.zone.trim().is_empty() {
                return Err(self.err(format!("{key}.zone"), "must not be empty"));
            }
            for (field, addr) in [("raft", &m.raft), ("admin", &m.admin)] {
                let port_ok = addr.rsplit_once(':').is_some_and(|(host, port)| {
                    !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
                });
                if !port_ok {
                    return Err(self.err(
                        format!("{key}.{field}"),
                        format!("`{addr}` is not a host:port address"),
                    ));
                }
            }
            members.push(Member {
                id: m.id,
                zone: ZoneId::new(m.zone.trim()),
                raft_addr: m.raft,
                admin_addr: m.admin,
                role: m.role,
            });
        }
        let Some(me) = members.iter().find(|m| m.id == node.id) else {
            return Err(self.err(
                "cluster.members",
                format!("node.id {} is not one of the members", node.id),
            ));
        };
        if me.zone != node.zone {
            return Err(self.err(
                "cluster.members",
                format!(
                    "member {} is in zone `{}` but node.zone is `{}`",
                    me.id, me.zone, node.zone
                ),
            ));
        }
        if !members.iter().any(|m| m.role.votes()) {
            return Err(self.err(
                "cluster.members",
                "at least one member must be a voter or witness",
            ));
        }
        if node.raft_listen.is_none() {
            node.raft_listen = Some(me.raft_addr.parse().map_err(|_| {
                self.err(
                    "node.raft_listen",
                    format!("not set, and this member's raft address `{}` is not an IP:port to listen on", me.raft_addr),
                )
            })?);
        }
        Ok(members)
    }

    fn node(&self, raw: RawNode) -> Result<NodeConfig, ConfigError> {
        if raw.zone.trim().is_empty() {
            return Err(self.err("node.zone", "must not be empty"));
        }
        let max_body_bytes = self.int(
            "node.max_body_bytes",
            Some(raw.max_body_bytes),
            0,
            bounds::BODY_BYTES,
        )?;
        let raft_listen = match raw.raft_listen.as_deref() {
            Some(s) => Some(self.addr("node.raft_listen", s)?),
            None => None,
        };
        let data_plane_threads = match raw.data_plane_threads {
            None => None,
            Some(n @ 1..=MAX_DATA_PLANE_THREADS) => Some(n as usize),
            Some(_) => {
                return Err(self.err(
                    "node.data_plane_threads",
                    format!(
                    "must be between 1 and {MAX_DATA_PLANE_THREADS} (or left out: one per core)"
                ),
                ))
            }
        };
        let data_plane_scheduling = match raw.data_plane_scheduling.as_deref() {
            None | Some("batch") => Scheduling::Batch,
            Some("normal") => Scheduling::Normal,
            Some(other) => {
                return Err(self.err(
                    "node.data_plane_scheduling",
                    format!("must be \"batch\" or \"normal\", not {other:?}"),
                ))
            }
        };
        Ok(NodeConfig {
            id: raw.id,
            zone: ZoneId::new(raw.zone.trim()),
            listen: self.addr("node.listen", &raw.listen)?,
            admin_listen: self.addr("node.admin_listen", &raw.admin_listen)?,
            data_dir: raw.data_dir,
            raft_listen,
            max_body_bytes: usize::try_from(max_body_bytes)
                .map_err(|_| self.err("node.max_body_bytes", "too large for this machine"))?,
            data_plane_threads,
            data_plane_scheduling,
            drain_grace: self.duration(
                "node.drain_grace",
                raw.drain_grace.as_deref(),
                Duration::from_secs(5),
                bounds::DRAIN_TIME,
            )?,
            drain_timeout: self.duration(
                "node.drain_timeout",
                raw.drain_timeout.as_deref(),
                Duration::from_secs(30),
                bounds::DRAIN_TIME,
            )?,
            tls: self.tls("node", raw.tls, false)?,
            limits: self.limits("node", raw.limits)?,
        })
    }

    fn tenants(&self, raw: Vec<RawTenant>) -> Result<Vec<Tenant>, ConfigError> {
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        raw.into_iter()
            .enumerate()
            .map(|(i, t)| {
                let key = format!("tenants[{i}]");
                if t.name.is_empty() {
                    return Err(self.err(format!("{key}.name"), "must not be empty"));
                }
                if !names.insert(t.name.clone()) {
                    return Err(self.err(
                        format!("{key}.name"),
                        format!("duplicate tenant `{}`", t.name),
                    ));
                }
                let keys = match t.key_sha256 {
                    OneOrMany::One(s) => vec![s],
                    OneOrMany::Many(v) => v,
                };
                if keys.is_empty() {
                    return Err(
                        self.err(format!("{key}.key_sha256"), "needs at least one key digest")
                    );
                }
                let key_hashes = keys
                    .iter()
                    .map(|k| {
                        let h = self.sha256(&format!("{key}.key_sha256"), k)?;
                        if !hashes.insert(h) {
                            return Err(self.err(
                                format!("{key}.key_sha256"),
                                "this key digest is already used by another tenant",
                            ));
                        }
                        Ok(h)
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Tenant {
                    name: t.name.into(),
                    key_hashes,
                    priority: t.priority,
                })
            })
            .collect()
    }

    /// A witness serves no traffic, so it alone may have no backends.
    fn backends(
        &self,
        raw: Vec<RawBackend>,
        witness: bool,
    ) -> Result<Vec<BackendConfig>, ConfigError> {
        if raw.is_empty() && !witness {
            return Err(self.err("backends", "at least one [[backends]] entry is required"));
        }
        let mut names = HashSet::new();
        raw.into_iter()
            .enumerate()
            .map(|(i, b)| {
                let key = format!("backends[{i}]");
                if b.name.is_empty() || !names.insert(b.name.clone()) {
                    return Err(self.err(
                        format!("{key}.name"),
                        format!("backend names must be unique and non-empty (`{}`)", b.name),
                    ));
                }
                if b.zone.trim().is_empty() {
                    return Err(self.err(format!("{key}.zone"), "must not be empty"));
                }
                let uri: http::Uri = b.url.parse().map_err(|e| {
                    self.err(
                        format!("{key}.url"),
                        format!("`{}` is not a URL: {e}", b.url),
                    )
                })?;
                let scheme = uri.scheme().cloned();
                let scheme = match scheme {
                    Some(s) if s == Scheme::HTTP || s == Scheme::HTTPS => s,
                    _ => {
                        return Err(
                            self.err(format!("{key}.url"), "must be an http:// or https:// URL")
                        )
                    }
                };
                if scheme == Scheme::HTTP && b.tls.is_some() {
                    return Err(self.err(format!("{key}.tls"), "is only for https:// backends"));
                }
                let tls = self.backend_tls(&key, b.tls)?;
                let authority = uri
                    .authority()
                    .cloned()
                    .ok_or_else(|| self.err(format!("{key}.url"), "needs a host and port"))?;
                if !matches!(uri.path(), "" | "/") {
                    return Err(self.err(
                        format!("{key}.url"),
                        "must be the server root (http://host:port); paths are not supported",
                    ));
                }
                if b.models.is_empty() {
                    return Err(self.err(format!("{key}.models"), "must list at least one model"));
                }
                let weight =
                    self.int(&format!("{key}.weight"), Some(b.weight), 1, bounds::WEIGHT)?;
                if let Some(c) = b.capacity {
                    self.int(&format!("{key}.capacity"), Some(c), c, bounds::CAPACITY)?;
                }
                for (path_key, path) in [
                    ("health_path", Some(&b.health_path)),
                    ("metrics_path", b.metrics_path.as_ref()),
                ] {
                    if let Some(p) = path {
                        if !p.starts_with('/') {
                            return Err(
                                self.err(format!("{key}.{path_key}"), "must start with `/`")
                            );
                        }
                    }
                }
                for m in b.model_names.keys() {
                    if !b.models.contains(m) {
                        return Err(self.err(
                            format!("{key}.model_names.{m}"),
                            "names a model this backend does not list in `models`",
                        ));
                    }
                }
                Ok(BackendConfig {
                    name: b.name,
                    zone: ZoneId::new(b.zone.trim()),
                    scheme,
                    tls,
                    authority,
                    models: b.models,
                    weight,
                    health_path: b.health_path,
                    metrics_path: b.metrics_path,
                    model_names: b.model_names.into_iter().collect(),
                    capacity: b.capacity,
                })
            })
            .collect()
    }

    /// A model's timeouts; `first_byte_timeout` is read as the deprecated
    /// alias of `ttft_timeout` (with a warning).
    fn timeouts(
        &self,
        key: &str,
        m: &RawModel,
        default_connect: Duration,
    ) -> Result<Timeouts, ConfigError> {
        let d = Timeouts::default();
        let ttft = match (&m.ttft_timeout, &m.first_byte_timeout) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    format!("{key}.first_byte_timeout"),
                    "set only ttft_timeout (first_byte_timeout is its deprecated alias)",
                ))
            }
            (None, Some(old)) => {
                tracing::warn!(
                    file = %self.file,
                    "{key}.first_byte_timeout is deprecated: it is now ttft_timeout, and applies to streams only"
                );
                self.duration(
                    &format!("{key}.first_byte_timeout"),
                    Some(old),
                    d.ttft,
                    bounds::REQUEST_TIMEOUT,
                )?
            }
            (new, None) => self.duration(
                &format!("{key}.ttft_timeout"),
                new.as_deref(),
                d.ttft,
                bounds::REQUEST_TIMEOUT,
            )?,
        };
        let field = |name: &str, v: &Option<String>, default| {
            self.duration(
                &format!("{key}.{name}"),
                v.as_deref(),
                default,
                bounds::REQUEST_TIMEOUT,
            )
        };
        let t = Timeouts {
            connect: self.duration(
                &format!("{key}.connect_timeout"),
                m.connect_timeout.as_deref(),
                default_connect,
                bounds::CONNECT_TIMEOUT,
            )?,
            ttft,
            generation: field("generation_timeout", &m.generation_timeout, d.generation)?,
            idle: field("idle_timeout", &m.idle_timeout, d.idle)?,
            total: field("total_timeout", &m.total_timeout, d.total)?,
        };
        if t.total < t.ttft {
            return Err(self.err(
                format!("{key}.total_timeout"),
                "must be at least ttft_timeout: the deadline bounds every attempt",
            ));
        }
        Ok(t)
    }

    fn models(
        &self,
        raw: Vec<RawModel>,
        backends: &[BackendConfig],
        default_connect: Duration,
    ) -> Result<Vec<ModelConfig>, ConfigError> {
        let served: Vec<&str> = {
            let mut seen = HashSet::new();
            backends
                .iter()
                .flat_map(|b| b.models.iter().map(String::as_str))
                .filter(|m| seen.insert(*m))
                .collect()
        };
        let mut out: Vec<ModelConfig> = Vec::new();
        for (i, m) in raw.into_iter().enumerate() {
            let key = format!("models[{i}]");
            if !served.contains(&m.name.as_str()) {
                return Err(self.err(
                    format!("{key}.name"),
                    format!("no backend serves model `{}`", m.name),
                ));
            }
            if out.iter().any(|o| o.name == m.name) {
                return Err(self.err(
                    format!("{key}.name"),
                    format!("duplicate model `{}`", m.name),
                ));
            }
            for (j, f) in m.fallback.iter().enumerate() {
                if !served.contains(&f.as_str()) || *f == m.name {
                    return Err(self.err(
                        format!("{key}.fallback[{j}]"),
                        format!("`{f}` is not another model served by some backend"),
                    ));
                }
            }
            for (j, f) in m.context_fallback.iter().enumerate() {
                if !served.contains(&f.as_str()) || *f == m.name {
                    return Err(self.err(
                        format!("{key}.context_fallback[{j}]"),
                        format!("`{f}` is not another model served by some backend"),
                    ));
                }
            }
            let timeouts = self.timeouts(&key, &m, default_connect)?;
            if let Some(t) = m.tier {
                self.int(&format!("{key}.tier"), Some(t), t, bounds::TIER)?;
            }
            let limits = self.model_limits(&format!("{key}.limits"), m.limits)?;
            out.push(ModelConfig {
                limits,
                name: m.name,
                balance: m.balance,
                fallback: m.fallback,
                context_fallback: m.context_fallback,
                timeouts,
                continuation: m.continuation,
                tier: m.tier,
            });
        }
        for (list, edges) in [
            (
                "fallback",
                (|m: &ModelConfig| &m.fallback) as fn(&ModelConfig) -> &Vec<String>,
            ),
            ("context_fallback", |m: &ModelConfig| &m.context_fallback),
        ] {
            if let Some((i, cycle)) = fallback_cycle(&out, edges) {
                return Err(self.err(
                    format!("models[{i}].{list}"),
                    format!("{list} cycle: {}", cycle.join(" → ")),
                ));
            }
        }
        for name in served {
            if !out.iter().any(|m| m.name == name) {
                out.push(ModelConfig {
                    name: name.to_owned(),
                    balance: Balance::default(),
                    fallback: Vec::new(),
                    context_fallback: Vec::new(),
                    timeouts: Timeouts {
                        connect: default_connect,
                        ..Timeouts::default()
                    },
                    continuation: Continuation::default(),
                    tier: None,
                    limits: Limits::default(),
                });
            }
        }
        Ok(out)
    }

    fn retry(&self, raw: RawRetry) -> Result<RetryConfig, ConfigError> {
        let budget_ratio = raw.budget_ratio.unwrap_or(0.2);
        if !(0.0..=1.0).contains(&budget_ratio) {
            return Err(self.err("retry.budget_ratio", "must be between 0.0 and 1.0"));
        }
        Ok(RetryConfig {
            max_attempts: self.positive(
                "retry.max_attempts",
                raw.max_attempts,
                3,
                bounds::MAX_ATTEMPTS,
            )?,
            budget_ratio,
            min_concurrent_retries: self.int(
                "retry.min_concurrent_retries",
                raw.min_concurrent_retries,
                10,
                bounds::MIN_CONCURRENT_RETRIES,
            )?,
            default_cooldown: self.duration(
                "retry.default_cooldown",
                raw.default_cooldown.as_deref(),
                Duration::from_secs(1),
                bounds::RETRY_WAIT,
            )?,
            connect_timeout: self.duration(
                "retry.connect_timeout",
                raw.connect_timeout.as_deref(),
                Duration::from_secs(2),
                bounds::CONNECT_TIMEOUT,
            )?,
            max_retry_after_wait: self.duration(
                "retry.max_retry_after_wait",
                raw.max_retry_after_wait.as_deref(),
                Duration::from_secs(3),
                bounds::RETRY_WAIT,
            )?,
        })
    }

    fn fraction(&self, key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(0.0..=1.0).contains(&v) {
            return Err(self.err(key, "must be between 0.0 and 1.0"));
        }
        Ok(v)
    }

    fn score_value(&self, key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(0.0..=100.0).contains(&v) {
            return Err(self.err(key, "must be a score between 0 and 100"));
        }
        Ok(v)
    }

    fn bounds(
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
    fn health_score(&self, raw: &RawHealth) -> Result<ScoreConfig, ConfigError> {
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

    fn health(&self, raw: RawHealth, models: &[ModelConfig]) -> Result<HealthConfig, ConfigError> {
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

    fn failover(
        &self,
        raw: RawFailover,
        fallback_order: &HashMap<ZoneId, Vec<ZoneId>>,
    ) -> Result<FailoverConfig, ConfigError> {
        let d = FailoverConfig::default();
        let cfg = FailoverConfig {
            enabled: raw.enabled.unwrap_or(d.enabled),
            period: self.duration(
                "failover.period",
                raw.period.as_deref(),
                d.period,
                bounds::FAILOVER_PERIOD,
            )?,
            weights: match raw.weights {
                None => d.weights,
                Some(w) => {
                    let weight = |k: &str, v: f64| {
                        self.real(
                            &format!("failover.weights.{k}"),
                            Some(v),
                            v,
                            bounds::REL_WEIGHT,
                        )
                    };
                    ScoreWeights {
                        gw_error: weight("gw_error", w.gw_error)?,
                        timeout: weight("timeout", w.timeout)?,
                        gpu: weight("gpu", w.gpu)?,
                    }
                }
            },
            cutoff: self.real("failover.cutoff", raw.cutoff, d.cutoff, bounds::RATIO)?,
            min_periods: self.positive(
                "failover.min_periods",
                raw.min_periods,
                d.min_periods,
                bounds::STREAK,
            )?,
            auto_failback: raw.auto_failback.unwrap_or(d.auto_failback),
            failback_threshold: self.real(
                "failover.failback_threshold",
                raw.failback_threshold,
                d.failback_threshold,
                bounds::RATIO,
            )?,
            failback_periods: self.positive(
                "failover.failback_periods",
                raw.failback_periods,
                d.failback_periods,
                bounds::STREAK,
            )?,
            history_periods: self.positive(
                "failover.history_periods",
                raw.history_periods,
                d.history_periods,
                bounds::HISTORY_PERIODS,
            )?,
            max_auto_failed_over: self.int(
                "failover.max_auto_failed_over",
                raw.max_auto_failed_over,
                d.max_auto_failed_over,
                bounds::FAILED_OVER_ZONES,
            )?,
            dwell: self.duration(
                "failover.dwell",
                raw.dwell.as_deref(),
                d.dwell,
                bounds::FAILOVER_DWELL,
            )?,
            fallback_order: fallback_order
                .iter()
                .map(|(z, o)| (z.clone(), o.clone()))
                .collect(),
        };
        cfg.validate()
            .map_err(|e| self.err(format!("failover.{}", e.key), e.reason))?;
        Ok(cfg)
    }

    fn admin(&self, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
        let tokens = raw
            .tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                Ok(AdminToken {
                    hash: self.sha256(&format!("admin.tokens[{i}].sha256"), &t.sha256)?,
                    allow_from: self
                        .networks(&format!("admin.tokens[{i}].allow_from"), &t.allow_from)?,
                    name: t.name,
                    role: t.role,
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(AdminConfig {
            tokens,
            tls: self.tls("admin", raw.tls, false)?,
            limits: self.limits("admin", raw.limits)?,
            metrics_auth: raw.metrics_auth,
        })
    }
}

/// The first cycle of the graph `edges` draws over `models` (a model's
/// list of other models): the index of the model it starts from, and the
/// names along it, back to the first. Models only listed (not configured)
/// have no list, so they end every path.
fn fallback_cycle(
    models: &[ModelConfig],
    edges: fn(&ModelConfig) -> &Vec<String>,
) -> Option<(usize, Vec<String>)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let index: HashMap<&str, usize> = models
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.as_str(), i))
        .collect();
    let mut marks = vec![Mark::New; models.len()];
    for start in 0..models.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (model, next edge to follow).
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        marks[start] = Mark::OnPath;
        while let Some(&mut (m, ref mut next)) = path.last_mut() {
            let targets = edges(&models[m]);
            if *next == targets.len() {
                marks[m] = Mark::Done;
                path.pop();
                continue;
            }
            let target = targets[*next].as_str();
            *next += 1;
            let Some(&t) = index.get(target) else {
                continue;
            };
            match marks[t] {
                Mark::Done => {}
                Mark::New => {
                    marks[t] = Mark::OnPath;
                    path.push((t, 0));
                }
                Mark::OnPath => {
                    let from = path.iter().position(|(p, _)| *p == t).unwrap_or(0);
                    let mut names: Vec<String> = path[from..]
                        .iter()
                        .map(|(p, _)| models[*p].name.clone())
                        .collect();
                    names.push(models[t].name.clone());
                    return Some((t, names));
                }
            }
        }
    }
    None
}

/// Hex SHA-256 of a secret, as written in `key_sha256` and `sha256`.
pub fn sha256_hex(secret: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
        [node]
        id = 1
        zone = "az-a"
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        data_dir = "data/node-1"

        [[tenants]]
        name = "deptA"
        key_sha256 = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
        priority = "P0"

        [[backends]]
        name = "qwen-a1"
        zone = "az-a"
        url = "http://127.0.0.1:8000"
        models = ["qwen25-7b-instruct"]
    "#;

    pub(crate) fn error_of(text: &str) -> ConfigError {
        Config::parse("test.toml", text).expect_err("config should be rejected")
    }

    #[test]
    fn raft_timing_is_read_and_validated() {
        let with = |t: &str| format!("{MINIMAL}\n[cluster]\n{t}\n");
        let c = Config::parse(
            "test.toml",
            &with("heartbeat = \"500ms\"\nelection_timeout_min = \"2s\"\nelection_timeout_max = \"4s\"\nready_requires_leader = true"),
        )
        .unwrap();
        assert_eq!(c.cluster.timing.heartbeat, Duration::from_millis(500));
        assert_eq!(
            c.cluster.timing.election_timeout_min,
            Duration::from_secs(2)
        );
        assert_eq!(
            c.cluster.timing.election_timeout_max,
            Duration::from_secs(4)
        );
        assert!(c.cluster.ready_requires_leader);
        let d = Config::parse("test.toml", MINIMAL).unwrap().cluster;
        assert_eq!(d, ClusterSettings::default());
        let e = error_of(&with("heartbeat = \"200ms\""));
        assert_eq!(e.key, "cluster.election_timeout_min");
        assert!(e.reason.contains("3 x cluster.heartbeat"), "{e}");
        let e = error_of(&with("election_timeout_min = \"700ms\""));
        assert_eq!(e.key, "cluster.election_timeout_max");
        let e = error_of(&with("heartbeat = \"soon\""));
        assert_eq!(e.key, "cluster.heartbeat");
        assert!(
            e.to_string().starts_with("test.toml: cluster.heartbeat:"),
            "{e}"
        );
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse("test.toml", MINIMAL).unwrap();
        assert_eq!(c.models.len(), 1);
        assert_eq!(c.models[0].balance, Balance::P2c);
        assert_eq!(c.models[0].timeouts, Timeouts::default());
        assert_eq!(c.node.max_body_bytes, 32 * 1024 * 1024);
        assert_eq!(c.retry.max_attempts, 3);
        assert_eq!(c.tenants[0].priority, Priority::P0);
        assert_eq!(c.node.limits.send_timeout, Duration::from_secs(60));
        assert_eq!(c.node.data_plane_threads, None, "one per core");
    }

    #[test]
    fn data_plane_scheduling_is_batch_unless_said_otherwise() {
        let with = |v: &str| {
            MINIMAL.replace(
                "[[tenants]]",
                &format!("data_plane_scheduling = {v}\n\n        [[tenants]]"),
            )
        };
        let c = Config::parse("test.toml", MINIMAL).unwrap();
        assert_eq!(c.node.data_plane_scheduling, Scheduling::Batch);
        let c = Config::parse("test.toml", &with("\"normal\"")).unwrap();
        assert_eq!(c.node.data_plane_scheduling, Scheduling::Normal);
        let c = Config::parse("test.toml", &with("\"batch\"")).unwrap();
        assert_eq!(c.node.data_plane_scheduling, Scheduling::Batch);
        let e = error_of(&with("\"fifo\""));
        assert_eq!(e.key, "node.data_plane_scheduling");
        assert!(e.to_string().contains("\"batch\" or \"normal\""), "{e}");
        let e = Config::parse("test.toml", &with("1")).unwrap_err();
        assert!(e.to_string().contains("data_plane_scheduling"), "{e}");
    }

    #[test]
    fn data_plane_threads_are_read_and_bounded() {
        let with = |n: &str| {
            MINIMAL.replace(
                "[[tenants]]",
                &format!("data_plane_threads = {n}\n\n        [[tenants]]"),
            )
        };
        let c = Config::parse("test.toml", &with("3")).unwrap();
        assert_eq!(c.node.data_plane_threads, Some(3));
        for bad in ["0", "1025", "-1"] {
            let e = error_of(&with(bad));
            assert_eq!(e.key, "node.data_plane_threads", "{bad}: {e}");
        }
        let e = error_of(&with("\"auto\""));
        assert!(e.key.contains("data_plane_threads"), "{e}");
    }

    #[test]
    fn listener_limits_are_read_per_listener() {
        let text = format!(
            "{MINIMAL}\n[node.limits]\nsend_timeout = \"5s\"\nidle_timeout = \"2m\"\nmax_connections_per_ip = 64\n[admin.limits]\nmax_connections = 7"
        );
        let c = Config::parse("test.toml", &text).unwrap();
        let data = c.node.limits.resolve(100);
        assert_eq!(data.send_timeout, Duration::from_secs(5));
        assert_eq!(data.idle_timeout, Duration::from_secs(120));
        assert_eq!(data.max_connections, 100);
        assert_eq!(data.max_connections_per_ip, Some(64));
        assert_eq!(c.admin.limits.resolve(100).max_connections, 7);
        assert_eq!(
            c.admin.limits.max_connections_per_ip, None,
            "no cap unless set"
        );
        assert_eq!(c.admin.limits.send_timeout, Duration::from_secs(60));
    }

    #[test]
    fn errors_name_file_key_and_reason() {
        let cases: &[(&str, &str, &str)] = &[
            (r#"weight = 1"#, "weight", "unknown field"),
            (
                &MINIMAL.replace("listen = \"127.0.0.1:0\"\n        admin", "listen = \"nope\"\n        admin"),
                "node.listen",
                "not an IP:port",
            ),
            (
                &MINIMAL.replace("models = [\"qwen25-7b-instruct\"]", "models = [\"m\"]\n        colour = 1"),
                "backends[0].colour",
                "unknown field",
            ),
            (&MINIMAL.replace("2c26b4", "zz26b4"), "tenants[0].key_sha256", "64 hex"),
            (&MINIMAL.replace("http://127", "ftp://127"), "backends[0].url", "http:// or https://"),
            (
                &MINIMAL.replace("models = [\"qwen25-7b-instruct\"]", "models = [\"qwen25-7b-instruct\"]\n        tls = { insecure_skip_verify = true }"),
                "backends[0].tls",
                "only for https://",
            ),
            (
                &MINIMAL.replace("http://127", "https://127").replace("models = [\"qwen25-7b-instruct\"]", "models = [\"qwen25-7b-instruct\"]\n        tls = { ca = \"/nonexistent/ca.pem\" }"),
                "backends[0].tls.ca",
                "/nonexistent/ca.pem",
            ),
            (
                &format!("{MINIMAL}\n[node.tls]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\""),
                "node.tls",
                "/nonexistent/c.pem",
            ),
            (
                &format!("{MINIMAL}\n[node.limits]\nmax_connections = 0"),
                "node.limits.max_connections",
                "at least 1",
            ),
            (
                &format!("{MINIMAL}\n[node.limits]\nmax_connections_per_ip = 0"),
                "node.limits.max_connections_per_ip",
                "at least 1",
            ),
            (
                &format!("{MINIMAL}\n[node.limits]\nmax_connections = 10\nmax_connections_per_ip = 11"),
                "node.limits.max_connections_per_ip",
                "at most max_connections (10)",
            ),
            (
                &format!("{MINIMAL}\n[admin.limits]\nidle_timeout = \"forever\""),
                "admin.limits.idle_timeout",
                "duration",
            ),
            (
                &format!("{MINIMAL}\n[node.limits]\nsend_timeout = \"0s\""),
                "node.limits.send_timeout",
                "greater than zero",
            ),
            (
                &format!("{MINIMAL}\n[[admin.tokens]]\nname = \"o\"\nsha256 = \"{}\"\nrole = \"operator\"\nallow_from = [\"10.0.0.0/40\"]", sha256_hex("t")),
                "admin.tokens[0].allow_from",
                "IP network",
            ),
            (
                &format!("{MINIMAL}\n[[cluster.members]]\nid = 1\nzone = \"az-a\"\nraft = \"127.0.0.1:7001\"\nadmin = \"127.0.0.1:9001\"\n[[cluster.members]]\nid = 2\nzone = \"az-b\"\nraft = \"127.0.0.1:7002\"\nadmin = \"127.0.0.1:9002\""),
                "cluster.tls",
                "mutual TLS",
            ),
            (
                &format!("{MINIMAL}\n[[models]]\nname = \"other\""),
                "models[0].name",
                "no backend serves",
            ),
            (
                &format!("{MINIMAL}\n[[models]]\nname = \"qwen25-7b-instruct\"\nfirst_byte_timeout = \"soon\""),
                "models[0].first_byte_timeout",
                "not a duration",
            ),
            (
                &format!("{MINIMAL}\n[[models]]\nname = \"qwen25-7b-instruct\"\nbalance = \"fastest\""),
                "models[0].balance",
                "unknown variant",
            ),
            (&format!("{MINIMAL}\n[retry]\nbudget_ratio = 2.0"), "retry.budget_ratio", "between"),
        ];
        for (text, key, reason) in cases {
            let e = error_of(text);
            assert_eq!(e.file, "test.toml");
            assert!(
                e.key.contains(key),
                "key `{}` should name `{key}` ({e})",
                e.key
            );
            assert!(
                e.reason.contains(reason),
                "reason `{}` should say `{reason}`",
                e.reason
            );
        }
    }

    #[test]
    fn degenerate_values_are_refused_with_file_key_and_reason() {
        let with = |section: &str| format!("{MINIMAL}\n{section}\n");
        let cases = [
            (
                "[health]\ninterval = \"1ns\"",
                "health.interval",
                "between 100ms and 1h",
            ),
            (
                "[failover]\ndwell = \"500000000years\"",
                "failover.dwell",
                "between",
            ),
            (
                "[retry]\nmax_attempts = 4294967295",
                "retry.max_attempts",
                "between 1 and 10",
            ),
            (
                "[balance]\nvnodes = 100000000",
                "balance.vnodes",
                "between 1 and 10000",
            ),
            (
                "[affinity]\npin_capacity = 9223372036854775807",
                "affinity.pin_capacity",
                "in memory",
            ),
        ];
        for (section, key, reason) in cases {
            let e = error_of(&with(section));
            assert_eq!(e.file, "test.toml");
            assert_eq!(e.key, key, "{e}");
            assert!(e.reason.contains(reason), "{e}");
        }
        let e = error_of(&MINIMAL.replace(
            "models = [\"qwen25-7b-instruct\"]",
            "models = [\"qwen25-7b-instruct\"]\nweight = 4000000",
        ));
        assert_eq!(e.key, "backends[0].weight", "{e}");
        let many: String = (0..10_001)
            .map(|i| format!("[[backends]]\nname = \"b{i}\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:1\"\nmodels = [\"m\"]\n"))
            .collect();
        let e = error_of(&format!("{MINIMAL}\n{many}"));
        assert_eq!(e.key, "backends", "{e}");
        assert!(e.reason.contains("at most 10000"), "{e}");
    }

    #[test]
    fn fallback_cycles_are_refused_naming_the_cycle() {
        let models = |a: &str, b: &str, c: &str| {
            format!(
                "{}\n[[models]]\nname = \"a\"\n{a}\n[[models]]\nname = \"b\"\n{b}\n[[models]]\nname = \"c\"\n{c}\n",
                MINIMAL.replace("models = [\"qwen25-7b-instruct\"]", "models = [\"a\", \"b\", \"c\"]")
            )
        };
        // A chain is fine; so is two models falling back to one.
        Config::parse("t", &models("fallback = [\"b\"]", "fallback = [\"c\"]", "")).unwrap();
        Config::parse("t", &models("fallback = [\"c\"]", "fallback = [\"c\"]", "")).unwrap();
        let e = error_of(&models(
            "fallback = [\"b\"]",
            "fallback = [\"c\"]",
            "fallback = [\"a\"]",
        ));
        assert_eq!(e.key, "models[0].fallback", "{e}");
        assert!(e.reason.contains("fallback cycle: a → b → c → a"), "{e}");
        let e = error_of(&models(
            "",
            "context_fallback = [\"c\"]",
            "context_fallback = [\"b\"]",
        ));
        assert_eq!(e.key, "models[1].context_fallback", "{e}");
        assert!(e.reason.contains("b → c → b"), "{e}");
    }

    #[test]
    fn key_sha256_accepts_a_list() {
        let text = MINIMAL.replace(
            "key_sha256 = \"2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"",
            &format!(
                "key_sha256 = [\"{}\", \"{}\"]",
                sha256_hex("a"),
                sha256_hex("b")
            ),
        );
        let c = Config::parse("t", &text).unwrap();
        assert_eq!(c.tenants[0].key_hashes.len(), 2);
        // Every digest finds its tenant, and nothing else is indexed.
        let mut indexed = 0;
        for (i, t) in c.tenants.iter().enumerate() {
            for h in &t.key_hashes {
                assert_eq!(c.tenant_keys.get(h), Some(&i));
                indexed += 1;
            }
        }
        assert_eq!(c.tenant_keys.len(), indexed);
    }

    #[test]
    fn sha256_hex_matches_known_digest() {
        assert_eq!(
            sha256_hex("foo"),
            "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
        );
    }
}
