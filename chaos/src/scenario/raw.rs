//! The TOML shapes of a scenario file as written (`deny_unknown_fields`),
//! before validation.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) target: RawTarget,
    pub(super) load: RawLoad,
    #[serde(default)]
    pub(super) steps: Vec<RawStep>,
    #[serde(default)]
    pub(super) expect: RawExpect,
    #[serde(default)]
    pub(super) safety: RawSafety,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) kind: String,
    pub(super) topology: Option<String>,
    pub(super) node_config: Option<toml::Table>,
    #[serde(default)]
    pub(super) admin: Vec<String>,
    #[serde(default)]
    pub(super) data: Vec<String>,
    pub(super) token_env: Option<String>,
    pub(super) api_key_env: Option<String>,
    #[serde(default)]
    pub(super) backends: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLoad {
    pub(super) rps: f64,
    pub(super) duration: String,
    pub(super) warmup: Option<String>,
    pub(super) mix: Option<RawMix>,
    pub(super) sessions: Option<u32>,
    pub(super) tenants: Option<u32>,
    pub(super) concurrency: Option<usize>,
    pub(super) timeout: Option<String>,
    #[serde(default)]
    pub(super) entry_zones: Vec<String>,
    pub(super) model: Option<String>,
    pub(super) short_max_tokens: Option<u32>,
    #[serde(default)]
    pub(super) tenant_quotas: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMix {
    #[serde(default)]
    pub(super) short: f64,
    #[serde(default)]
    pub(super) long: f64,
    #[serde(default)]
    pub(super) stream: f64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStep {
    pub(super) action: String,
    pub(super) at: Option<String>,
    #[serde(rename = "for")]
    pub(super) for_: Option<String>,
    pub(super) node: Option<toml::Value>,
    pub(super) zone: Option<String>,
    pub(super) backends: Option<Vec<String>>,
    pub(super) faults: Option<toml::Table>,
    pub(super) groups: Option<Vec<Vec<u64>>>,
    pub(super) isolate: Option<toml::Value>,
    pub(super) direction: Option<String>,
    pub(super) args: Option<Vec<String>>,
    pub(super) expect_exit: Option<i32>,
    pub(super) condition: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) version: Option<u64>,
    pub(super) timeout: Option<String>,
    pub(super) to: Option<String>,
    pub(super) note: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    pub(super) short_success: Option<f64>,
    pub(super) long_success: Option<f64>,
    pub(super) stream_success: Option<f64>,
    pub(super) failover_committed_within: Option<String>,
    pub(super) no_failover: Option<bool>,
    pub(super) max_leaders_per_term: Option<u32>,
    pub(super) term_unchanged: Option<bool>,
    pub(super) no_lost_decisions: Option<bool>,
    pub(super) converged_within: Option<String>,
    pub(super) p99_added_ms: Option<f64>,
    pub(super) quota_cap_held: Option<bool>,
    pub(super) quota_stretched_within: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSafety {
    #[serde(default)]
    pub(super) blocked: Vec<String>,
    pub(super) abort_below: Option<f64>,
    pub(super) abort_after: Option<String>,
    pub(super) alert_url: Option<String>,
    pub(super) alert_query: Option<String>,
    pub(super) capacity_check: Option<bool>,
}
