//! Node configuration: raw TOML shapes (`deny_unknown_fields`) and their
//! validation into typed values. Every error names the file, the key and the
//! reason, and nothing starts until the whole file is valid.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use serde::Deserialize;
use zonegate_cluster::{FailoverConfig, Limits, Member, TenantQuota, ZoneId};
use zonegate_net::tls::{BackendTls, TlsFiles};

mod bounds;
mod cluster;
pub mod cost;
pub mod credential;
mod health;
mod models;
mod node;
pub mod policy;
pub mod provider;
mod quota;
mod raw;
#[cfg(test)]
mod reference_test;
pub mod replicated;
mod security;
mod validate;

use bounds::Bound;
pub use bounds::{MAX_RING_POINTS, MAX_RING_POINTS_PER_POOL};
pub use quota::QuotaConfig;
use raw::{RawConfig, RawHealth};
pub use security::{LimitSettings, Network};
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
    /// The node-local sections of `text`, parsed once: the base every
    /// replicated config is merged into (a node's file may seed the
    /// cluster with thousands of backends; they are not parsed again at
    /// each apply).
    pub(crate) local: std::sync::Arc<toml::Table>,
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
    /// Traffic policy: rules, shadows, tenants' models and tags.
    pub policy: policy::PolicyConfig,
    /// Prices (`[[models]]`/`[[backends]]` `price`) and the tenants'
    /// budgets (`[[tenants]] budget`, `on_budget`).
    pub costs: cost::CostConfig,
    /// `[telemetry]` (node-local): where traces go and how many.
    pub telemetry: TelemetryConfig,
}

/// `[telemetry]`: OpenTelemetry traces, exported over OTLP/HTTP.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://collector:4318`, no trailing
    /// slash): spans go to `{otlp_endpoint}/v1/traces`. `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// The share of requests traced when the client did not decide (a
    /// sampled `traceparent` is always traced), 0–1.
    pub sampling: f64,
    /// Finished spans waiting for export at most; more are dropped.
    pub queue_size: usize,
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
    /// What a commercial provider needs (its kind, key, headers); `None`
    /// for a plain OpenAI-format backend without a key or headers, whose
    /// requests pass through untouched.
    pub provider: Option<Arc<ProviderConfig>>,
    /// `[backends.health] interval`: this backend's own probe interval
    /// (30 s by default for a provider), instead of `[health]`'s.
    pub probe_interval: Option<Duration>,
}

/// `[[backends]] provider`: the wire format and credentials a backend
/// speaks.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// OpenAI's wire format (vLLM, TGI, SGLang, OpenAI, Together, Groq…):
    /// `Authorization: Bearer <key>`.
    #[default]
    Openai,
    /// Azure OpenAI: `/openai/deployments/{deployment}/…?api-version=…`
    /// and an `api-key` header; the deployment is the model's
    /// `model_names` entry.
    Azure,
    /// Anthropic's Messages API: `/v1/messages`, `x-api-key` and
    /// `anthropic-version`; requests and answers are translated.
    Anthropic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Azure => "azure",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// A provider backend's settings. The key is a reference (`Debug` and
/// every rendering show the variable's or the file's name, never a value).
#[derive(Debug, PartialEq)]
pub struct ProviderConfig {
    pub kind: Provider,
    pub key: Option<Arc<credential::Credential>>,
    /// `[[backends]] headers`: sent on every request to it (probes too).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Azure's `api-version`, Anthropic's `anthropic-version`.
    pub api_version: String,
    /// Anthropic requires `max_tokens`: sent when the client set none.
    pub default_max_tokens: u32,
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
    /// Other names clients may send for this model (e.g. the name a vLLM
    /// server answered to before zonegate fronted it).
    pub aliases: Vec<String>,
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
    /// The logical model `name` is an alias of (`[[models]] aliases`).
    pub fn model_of_alias(&self, name: &str) -> Option<&str> {
        self.models
            .iter()
            .find(|m| m.aliases.iter().any(|a| a == name))
            .map(|m| m.name.as_str())
    }

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
        let de = toml::Deserializer::parse(text).map_err(|e| syntax_error(file, text, &e))?;
        let raw: RawConfig =
            serde_path_to_error::deserialize(de).map_err(|e| deserialize_error(file, e))?;
        let mut cfg = Validator { file }.validate(raw)?;
        cfg.file = file.to_owned();
        cfg.text = text.into();
        let (local, replicated) = replicated::split(file, text)?;
        cfg.local = local.into();
        cfg.replicated = replicated.into();
        Ok(cfg)
    }

    /// A config from an already parsed table (a node's local sections
    /// merged with the cluster's): the same typed walk and validation as
    /// [`Config::parse`], without writing the table out as text and
    /// reading it back.
    pub(crate) fn from_table(file: &str, table: toml::Table) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| deserialize_error(file, e))?;
        Validator { file }.validate(raw)
    }
}

/// A deserialization error as file, key (the path serde was at) and reason.
fn deserialize_error(file: &str, e: serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
    let key = e.path().to_string();
    let reason = toml_reason(e.inner());
    ConfigError {
        file: file.to_owned(),
        key: if key == "." { "-".into() } else { key },
        reason,
    }
}

/// Text that is not TOML: where (line and column, from 1) and why.
pub(crate) fn syntax_error(file: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let reason = match e.span() {
        Some(span) => {
            // A span from the parser, never trusted to fall on a character.
            let start = (0..=span.start.min(text.len()))
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            let before = &text[..start];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {}", toml_reason(e))
        }
        None => toml_reason(e),
    };
    ConfigError {
        file: file.to_owned(),
        key: "-".into(),
        reason,
    }
}

/// What a TOML error says. Some parse errors carry no message (a control
/// character in a comment): then where it is, from the full text.
fn toml_reason(e: &toml::de::Error) -> String {
    match e.message().trim() {
        "" => e.to_string().lines().next().unwrap_or("").trim().to_owned(),
        message => message.to_owned(),
    }
}

/// Turns raw sections into typed values (the walk is `validate`, the
/// checks per section beside it); every error names the file and the key.
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
    fn a_toml_error_without_a_message_still_says_where_it_is() {
        // Found by the `config` fuzz target: toml gives a control
        // character in a comment no message.
        let e = error_of("a = 1\n# \0\n");
        assert_eq!(e.key, "-");
        assert!(e.reason.contains("line 2"), "{e:?}");
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
