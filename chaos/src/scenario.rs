//! Drill scenario files: raw TOML shapes (`deny_unknown_fields`) validated
//! into typed values. Every error names the file, the key and the reason,
//! like the node config, and nothing runs until the whole file is valid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A scenario error: which file, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {reason}")]
pub struct ScenarioError {
    pub file: String,
    pub key: String,
    pub reason: String,
}

/// The `/mock/faults` keys a `backend_fault` step may set (the mock
/// backend refuses others; checking here fails the file, not the drill).
pub const FAULT_KEYS: &[&str] = &[
    "latency_ms",
    "generation_ms",
    "error_rate",
    "error_status",
    "queue_depth",
    "kv_cache_usage",
    "hang",
    "reset",
    "stream_cut_after",
    "retry_after",
    "stream_interval_ms",
    "unhealthy",
    "status_sequence",
    "stream_stall_after",
    "cut_inside_event",
    "malformed_chunk_after",
    "error_event_after",
    "reject_prefill",
    "context_length_exceeded",
    "answer_salt",
    "only_models",
];

mod action;
mod raw;
mod step;
mod validate;

pub use action::{Action, BackendSel, Condition, Direction, NodeSel, PartitionSel};
use raw::RawScenario;
use validate::validate;

// ---------------------------------------------------------------------------
// Validated shapes.

/// A validated drill scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// The file it came from (relative paths in it resolve against its
    /// folder).
    pub file: PathBuf,
    pub target: Target,
    pub load: Load,
    pub steps: Vec<Step>,
    pub expect: Expect,
    pub safety: Safety,
}

/// What the drill runs against.
#[derive(Clone, Debug)]
pub enum Target {
    /// The drill starts the cluster itself: one child process per member
    /// of the topology, a mock backend per configured backend, Raft traffic
    /// through relays it controls.
    Local {
        /// Folder of node configs (e.g. `config/local-3az/`).
        topology: PathBuf,
        /// Merged into every node's config (e.g. `[failover] period`).
        node_config: toml::Table,
    },
    /// An existing cluster, reached through its admin and data-plane URLs.
    Cluster {
        admin: Vec<String>,
        data: Vec<String>,
        token_env: String,
        api_key_env: String,
        /// Mock backends the drill may fault: name → base URL.
        backends: BTreeMap<String, String>,
    },
}

impl Target {
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Local { .. } => "local",
            Target::Cluster { .. } => "cluster",
        }
    }
}

/// The load: open-loop requests per second with a mix of request shapes.
#[derive(Clone, Debug)]
pub struct Load {
    pub rps: f64,
    /// From t = 0 (the first step's clock) to the end of the drill.
    pub duration: Duration,
    /// Load before t = 0: the baseline for `p99_added_ms`.
    pub warmup: Duration,
    pub mix: Mix,
    /// Distinct `x-session-id`s; 0 sends no session header.
    pub sessions: u32,
    /// Tenants (API keys) the requests rotate over (local target).
    pub tenants: u32,
    /// Requests in flight at most; beyond it the generator counts a
    /// request as not sent (it is then the bottleneck, and says so).
    pub concurrency: usize,
    pub timeout: Duration,
    /// Zones whose nodes receive client traffic; empty = every zone.
    pub entry_zones: Vec<String>,
    /// Model to request; default: the first model of the topology.
    pub model: Option<String>,
    pub short_max_tokens: u32,
    /// Drill tenant `i + 1`'s quota (local target): the node config's
    /// `quota = { rpm, tpm, concurrency }`; tenants past the list have none.
    pub tenant_quotas: Vec<TenantQuota>,
}

/// A drill tenant's quota, as the nodes' `[[tenants]] quota` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantQuota {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub concurrency: Option<u64>,
}

impl TenantQuota {
    /// The `quota = { ... }` table of a node's `[[tenants]]` entry.
    pub fn to_table(&self) -> toml::Table {
        let mut t = toml::Table::new();
        for (k, v) in [
            ("rpm", self.rpm),
            ("tpm", self.tpm),
            ("concurrency", self.concurrency),
        ] {
            if let Some(v) = v {
                t.insert(k.into(), toml::Value::Integer(v as i64));
            }
        }
        t
    }
}

/// Shares of short, long and streaming requests (normalized to sum 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    pub short: f64,
    pub long: f64,
    pub stream: f64,
}

/// One timed step.
#[derive(Clone, Debug)]
pub struct Step {
    /// When it starts, from t = 0; `None`: right after the previous step.
    pub at: Option<Duration>,
    pub action: Action,
    pub note: Option<String>,
}

/// Expectations; `None` is not checked.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    pub short_success: Option<f64>,
    pub long_success: Option<f64>,
    pub stream_success: Option<f64>,
    pub failover_committed_within: Option<Duration>,
    pub no_failover: Option<bool>,
    pub max_leaders_per_term: Option<u32>,
    /// Every term any node reported during the drill is the same one:
    /// nobody campaigned (a follower that resumes from a pause must not
    /// unseat a healthy leader).
    pub term_unchanged: Option<bool>,
    pub no_lost_decisions: Option<bool>,
    pub converged_within: Option<Duration>,
    pub p99_added_ms: Option<f64>,
    /// No drill tenant with an rpm quota was admitted more than its
    /// quota's rate over the load, plus the burst a bucket allows (the
    /// default `quota.burst`, 5 s).
    pub quota_cap_held: Option<bool>,
    /// Tenants offered less than their rpm quota are throttled (429) no
    /// later than this after the first failover is seen committed, and
    /// never before it: the receiving zone's quota stretched.
    pub quota_stretched_within: Option<Duration>,
}

/// Guards for drills against real clusters.
#[derive(Clone, Debug, Default)]
pub struct Safety {
    pub blocked: Vec<crate::window::Window>,
    /// Abort (and restore) when short-request success stays below this
    /// for `abort_after`.
    pub abort_below: Option<f64>,
    pub abort_after: Duration,
    /// Prometheus base URL and an alert query: abort when it returns any
    /// series.
    pub alert: Option<(String, String)>,
    /// Before the first step, with the warm-up's load running: refuse to
    /// go on (exit 2) unless the zones the drill leaves serving have the
    /// capacity units for everything in flight.
    pub capacity_check: bool,
}

/// Formats a duration the way scenarios write them.
pub fn fmt_dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

// ---------------------------------------------------------------------------
// Loading.

impl Scenario {
    /// Reads and validates `path`, after applying `overrides` (`KEY=VALUE`,
    /// dotted keys, `VALUE` in TOML syntax or a bare string), e.g.
    /// `load.duration=12s` or `steps.0.at=2s`.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            key: "(file)".into(),
            reason: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, path, overrides)
    }

    /// Like [`Scenario::load`] from text; `path` names it in errors and
    /// anchors relative paths.
    pub fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let err = |key: &str, reason: String| ScenarioError {
            file: file.clone(),
            key: key.to_owned(),
            reason,
        };
        let mut doc: toml::Value = toml::from_str::<toml::Table>(text)
            .map(toml::Value::Table)
            .map_err(|e| {
                let reason = e.message().to_owned();
                let key = match e.span() {
                    Some(span) => format!(
                        "(line {})",
                        text[..span.start.min(text.len())].lines().count().max(1)
                    ),
                    None => "(syntax)".into(),
                };
                err(&key, reason)
            })?;
        for o in overrides {
            apply_override(&mut doc, o).map_err(|(key, reason)| err(&key, reason))?;
        }
        let raw: RawScenario = serde_path_to_error::deserialize(doc).map_err(|e| {
            let path = e.path().to_string();
            let reason = e.into_inner().message().to_owned();
            // A missing key is named itself, not its table (an unknown
            // key is already in the path).
            let named = reason
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next());
            let key = match (named, path.as_str()) {
                (Some(k), ".") => k.to_owned(),
                (Some(k), p) => format!("{p}.{k}"),
                (None, p) => p.to_owned(),
            };
            err(&key, reason)
        })?;
        validate(raw, path).map_err(|(key, reason)| err(&key, reason))
    }
}

type Invalid = (String, String);

fn bad<T>(key: impl Into<String>, reason: impl Into<String>) -> Result<T, Invalid> {
    Err((key.into(), reason.into()))
}

/// Sets a dotted key (`a.b.0.c`) of `doc` to `value` (`KEY=VALUE`).
fn apply_override(doc: &mut toml::Value, o: &str) -> Result<(), Invalid> {
    let Some((key, value)) = o.split_once('=') else {
        return bad(format!("--set {o}"), "expected KEY=VALUE");
    };
    let key = key.trim();
    let value = value.trim();
    // A TOML value (`12`, `"12s"`, `true`, `[1, 2]`), else a bare string.
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = doc;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let here = parts[..=i].join(".");
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    t.insert((*part).to_owned(), parsed);
                    return Ok(());
                }
                t.entry((*part).to_owned())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            }
            toml::Value::Array(a) => {
                let idx: usize = part
                    .parse()
                    .map_err(|_| (here.clone(), "expected an index into the list".to_owned()))?;
                let len = a.len();
                let Some(slot) = a.get_mut(idx) else {
                    return bad(here, format!("index out of range (the list has {len})"));
                };
                if last {
                    *slot = parsed;
                    return Ok(());
                }
                slot
            }
            _ => return bad(here, "is not a table or a list"),
        };
    }
    Ok(())
}

/// The longest duration a scenario may name (any key): a drill longer
/// than a day is a typo, and every duration is added to an `Instant`, which
/// panics on overflow (`18446744073709551615s` parsed fine).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

fn duration(key: &str, s: &str) -> Result<Duration, Invalid> {
    let d = humantime::parse_duration(s)
        .map_err(|e| (key.to_owned(), format!("`{s}` is not a duration ({e})")))?;
    if d > MAX_DURATION {
        return Err((
            key.to_owned(),
            format!(
                "`{s}` is longer than the most a drill allows ({})",
                fmt_dur(MAX_DURATION)
            ),
        ));
    }
    Ok(d)
}

fn node_sel(key: &str, v: &toml::Value) -> Result<NodeSel, Invalid> {
    match v {
        toml::Value::Integer(i) if *i > 0 => Ok(NodeSel::Id(*i as u64)),
        toml::Value::String(s) if s == "leader" => Ok(NodeSel::Leader),
        toml::Value::String(s) if s == "follower" => Ok(NodeSel::Follower),
        toml::Value::String(s) if !s.is_empty() => Ok(NodeSel::Zone(s.clone())),
        _ => bad(
            key,
            "expected a node id, \"leader\", \"follower\" or a zone name",
        ),
    }
}

fn fraction(key: &str, v: f64) -> Result<f64, Invalid> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        bad(key, format!("{v} is not a fraction between 0 and 1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(text, Path::new("t.toml"), &[])
    }

    const MINIMAL: &str = r#"
[target]
kind = "local"
topology = "../config/local-3az"
[load]
rps = 10
duration = "10s"
"#;

    #[test]
    fn a_minimal_scenario_parses_with_defaults() {
        let s = parse(MINIMAL).unwrap();
        assert_eq!(s.name, "t");
        assert_eq!(s.load.mix.short, 1.0);
        assert_eq!(s.load.warmup, Duration::from_secs(3));
        assert!(s.steps.is_empty());
    }

    /// Each bad input names its key and why.
    #[test]
    fn bad_files_name_the_file_key_and_reason() {
        let cases: &[(&str, &str, &str)] = &[
            ("[load]\nrps = 1\nduration = \"1s\"", "target", "missing field"),
            (
                &format!("{MINIMAL}\n[expect]\nshort_succes = 0.9"),
                "expect.short_succes",
                "unknown field `short_succes`",
            ),
            (
                &format!("{MINIMAL}\n[expect]\nshort_success = 1.5"),
                "expect.short_success",
                "not a fraction",
            ),
            (
                &MINIMAL.replace("\"10s\"", "\"ten\""),
                "load.duration",
                "not a duration",
            ),
            (
                &MINIMAL.replace("\"10s\"", "\"18446744073709551615s\""),
                "load.duration",
                "longer than the most a drill allows (1day)",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"pause\"\nnode = 1\nfor = \"25h\""),
                "steps[0].for",
                "longer than the most a drill allows",
            ),
            (
                &format!("{MINIMAL}\n[safety]\nabort_after = \"30days\""),
                "safety.abort_after",
                "longer than the most a drill allows",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"explode\""),
                "steps[0].action",
                "not an action",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"backend_fault\"\nzone = \"az-a\"\nfaults = {{ eror_rate = 1 }}"),
                "steps[0].faults.eror_rate",
                "not a mock fault",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"kill\"\nnode = 1\nfaults = {{ hang = true }}"),
                "steps[0].faults",
                "not used by action `kill`",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"kill\"\nnode = 1\nat = \"1h\""),
                "steps[0].at",
                "after the load ends",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"partition\"\ngroups = [[1], [1, 2]]"),
                "steps[0].groups",
                "on both sides",
            ),
            (
                &MINIMAL.replace("\"local\"", "\"cloud\""),
                "target.kind",
                "not a target kind",
            ),
            (
                &format!("{MINIMAL}\n[safety]\nblocked = [\"Someday 08:00-20:00 UTC\"]"),
                "safety.blocked[0]",
                "day",
            ),
            ("[target\nkind = 1", "(line 1)", ""),
            (
                &format!("{MINIMAL}tenant_quotas = [{{ rpm = 60, rps = 1 }}]"),
                "load.tenant_quotas[0].rps",
                "not a quota key",
            ),
            (
                &format!("{MINIMAL}tenant_quotas = [{{ rpm = 0 }}]"),
                "load.tenant_quotas[0].rpm",
                "not a whole number >= 1",
            ),
            (
                &format!("{MINIMAL}tenant_quotas = [{{ rpm = 60 }}, {{ tpm = 10 }}]"),
                "load.tenant_quotas",
                "2 quotas for 1 tenants",
            ),
            (
                &format!("{MINIMAL}tenant_quotas = [{{ tpm = 600 }}]\n[expect]\nquota_cap_held = true"),
                "expect.quota_cap_held",
                "needs a tenant with an rpm quota",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"move_clients\"\nzone = \"az-a\""),
                "steps[0].to",
                "required",
            ),
            (
                &format!("{MINIMAL}entry_zones = [\"az-a\"]\n[[steps]]\naction = \"move_clients\"\nzone = \"az-a\"\nto = \"az-b\""),
                "steps[0].to",
                "no node in the clients' rotation",
            ),
            (
                &format!("{MINIMAL}\n[[steps]]\naction = \"kill\"\nnode = 1\nto = \"az-b\""),
                "steps[0].to",
                "not used by action `kill`",
            ),
        ];
        for (text, key, reason) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.file, "t.toml");
            assert_eq!(&e.key, key, "{e}");
            assert!(e.reason.contains(reason), "{e}");
        }
    }

    /// The zones a scenario's steps name as taken out of service, for the
    /// capacity pre-check.
    #[test]
    fn steps_name_the_zones_they_take_out() {
        let text = format!(
            "{MINIMAL}[safety]\ncapacity_check = true\n{}",
            [
                "action = \"backend_fault\"\nzone = \"az-a\"\nfaults = { error_rate = 1.0 }",
                "action = \"kill\"\nnode = \"az-b\"",
                "action = \"pause\"\nnode = \"leader\"",
                "action = \"ctl\"\nargs = [\"failover\", \"--to\", \"az-x\", \"--from\", \"az-c\"]",
                "action = \"ctl\"\nargs = [\"failover\", \"--from=az-d\"]",
                "action = \"ctl\"\nargs = [\"failback\", \"--zone\", \"az-e\"]",
                "action = \"ctl\"\nargs = [\"failover\", \"--from\"]",
            ]
            .map(|s| format!("[[steps]]\n{s}\n"))
            .concat()
        );
        let s = parse(&text).unwrap();
        assert!(s.safety.capacity_check);
        let out: Vec<Option<&str>> = s.steps.iter().map(|s| s.action.zone_out()).collect();
        assert_eq!(
            out,
            [
                Some("az-a"),
                Some("az-b"),
                None,
                Some("az-c"),
                Some("az-d"),
                None,
                None
            ]
        );
    }

    #[test]
    fn cluster_targets_refuse_process_steps() {
        let text = r#"
[target]
kind = "cluster"
admin = ["http://10.0.0.1:9090"]
data = ["http://10.0.0.1:8080"]
[load]
rps = 10
duration = "10s"
[[steps]]
action = "kill"
node = "leader"
"#;
        let e = parse(text).unwrap_err();
        assert_eq!(e.key, "steps[0].action");
        assert!(e.reason.contains("local target"), "{e}");
    }

    #[test]
    fn overrides_set_dotted_keys_before_validation() {
        let text = format!("{MINIMAL}\n[[steps]]\naction = \"kill\"\nnode = 1\nat = \"5s\"");
        let s = Scenario::parse(
            &text,
            Path::new("t.toml"),
            &[
                "load.duration=4s".into(),
                "steps.0.at=\"2s\"".into(),
                "load.rps=50".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.load.duration, Duration::from_secs(4));
        assert_eq!(s.steps[0].at, Some(Duration::from_secs(2)));
        assert_eq!(s.load.rps, 50.0);
        let e = Scenario::parse(&text, Path::new("t.toml"), &["steps.3.at=1s".into()]).unwrap_err();
        assert_eq!(e.key, "steps.3");
    }
}
