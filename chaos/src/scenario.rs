//! Drill scenario files: raw TOML shapes (`deny_unknown_fields`) validated
//! into typed values. Every error names the file, the key and the reason,
//! like the node config, and nothing runs until the whole file is valid.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

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

// ---------------------------------------------------------------------------
// Raw shapes.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<String>,
    description: Option<String>,
    target: RawTarget,
    load: RawLoad,
    #[serde(default)]
    steps: Vec<RawStep>,
    #[serde(default)]
    expect: RawExpect,
    #[serde(default)]
    safety: RawSafety,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    kind: String,
    topology: Option<String>,
    node_config: Option<toml::Table>,
    #[serde(default)]
    admin: Vec<String>,
    #[serde(default)]
    data: Vec<String>,
    token_env: Option<String>,
    api_key_env: Option<String>,
    #[serde(default)]
    backends: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    rps: f64,
    duration: String,
    warmup: Option<String>,
    mix: Option<RawMix>,
    sessions: Option<u32>,
    tenants: Option<u32>,
    concurrency: Option<usize>,
    timeout: Option<String>,
    #[serde(default)]
    entry_zones: Vec<String>,
    model: Option<String>,
    short_max_tokens: Option<u32>,
    #[serde(default)]
    tenant_quotas: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMix {
    #[serde(default)]
    short: f64,
    #[serde(default)]
    long: f64,
    #[serde(default)]
    stream: f64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawStep {
    action: String,
    at: Option<String>,
    #[serde(rename = "for")]
    for_: Option<String>,
    node: Option<toml::Value>,
    zone: Option<String>,
    backends: Option<Vec<String>>,
    faults: Option<toml::Table>,
    groups: Option<Vec<Vec<u64>>>,
    isolate: Option<toml::Value>,
    direction: Option<String>,
    args: Option<Vec<String>>,
    expect_exit: Option<i32>,
    condition: Option<String>,
    kind: Option<String>,
    version: Option<u64>,
    timeout: Option<String>,
    to: Option<String>,
    note: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    short_success: Option<f64>,
    long_success: Option<f64>,
    stream_success: Option<f64>,
    failover_committed_within: Option<String>,
    no_failover: Option<bool>,
    max_leaders_per_term: Option<u32>,
    term_unchanged: Option<bool>,
    no_lost_decisions: Option<bool>,
    converged_within: Option<String>,
    p99_added_ms: Option<f64>,
    quota_cap_held: Option<bool>,
    quota_stretched_within: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSafety {
    #[serde(default)]
    blocked: Vec<String>,
    abort_below: Option<f64>,
    abort_after: Option<String>,
    alert_url: Option<String>,
    alert_query: Option<String>,
    capacity_check: Option<bool>,
}

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

/// Which node a step acts on, resolved when the step runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSel {
    Id(u64),
    /// The node the others name as leader when the step runs.
    Leader,
    /// Any running node that is not the leader.
    Follower,
    /// The (first) node of a zone.
    Zone(String),
}

impl fmt::Display for NodeSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeSel::Id(id) => write!(f, "node {id}"),
            NodeSel::Leader => f.write_str("the leader"),
            NodeSel::Follower => f.write_str("a follower"),
            NodeSel::Zone(z) => write!(f, "the node of {z}"),
        }
    }
}

/// Which mock backends a fault step acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSel {
    Names(Vec<String>),
    Zone(String),
}

impl fmt::Display for BackendSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendSel::Names(n) => write!(f, "backends {}", n.join(", ")),
            BackendSel::Zone(z) => write!(f, "every backend of {z}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Both,
    /// Messages from the first group to the second are dropped; the other
    /// way still flows (and so do the answers to it).
    OneWay,
}

/// How a partition names its sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionSel {
    /// Two groups of node ids.
    Groups(Vec<u64>, Vec<u64>),
    /// One node against all others.
    Isolate(NodeSel),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// A committed decision (of `kind`, touching `zone`) newer than the
    /// drill's start.
    Decision {
        kind: Option<String>,
        zone: Option<String>,
    },
    /// A leader other than the one when the step started.
    LeaderChange,
    /// Every running node names the same leader.
    Leader,
    /// Every running node on the same decision version.
    Converged,
    /// Every running node at least at this version.
    Version(u64),
}

#[derive(Clone, Debug)]
pub enum Action {
    BackendFault {
        target: BackendSel,
        faults: serde_json::Map<String, serde_json::Value>,
        /// Restore after this long (else at the end of the drill).
        for_: Option<Duration>,
    },
    /// Puts the named backends' faults back to what they were before the
    /// drill.
    BackendRestore {
        target: BackendSel,
    },
    Kill {
        node: NodeSel,
    },
    Pause {
        node: NodeSel,
        for_: Option<Duration>,
    },
    /// Resumes `node`, or every paused node.
    Resume {
        node: Option<NodeSel>,
    },
    /// Restarts `node` (SIGTERM, wait, start on the same data), or starts
    /// every killed node again.
    Restart {
        node: Option<NodeSel>,
    },
    Partition {
        sides: PartitionSel,
        direction: Direction,
        for_: Option<Duration>,
    },
    Heal,
    /// `zonegate ctl --admin <node> --token <t> --json ARGS`.
    Ctl {
        args: Vec<String>,
        node: Option<NodeSel>,
        expect_exit: Option<i32>,
    },
    WaitFor {
        condition: Condition,
        timeout: Duration,
    },
    /// The clients that send to `from`'s node send to `to`'s node from
    /// now on (as a DNS or load-balancer change after a failover moves
    /// them); `to == from` moves them back.
    MoveClients {
        from: String,
        to: String,
    },
}

impl Action {
    /// The zone this step takes out of service when it names one: a
    /// fault on a zone's backends, `ctl failover --from ZONE`, or a kill
    /// or pause of a zone's node. (Backends named one by one are mapped to
    /// their zones by the run; nodes named by id or role are not counted.)
    pub fn zone_out(&self) -> Option<&str> {
        match self {
            Action::BackendFault {
                target: BackendSel::Zone(z),
                ..
            } => Some(z),
            Action::Kill {
                node: NodeSel::Zone(z),
            }
            | Action::Pause {
                node: NodeSel::Zone(z),
                ..
            } => Some(z),
            Action::Ctl { args, .. } if args.first().is_some_and(|a| a == "failover") => {
                args.iter().enumerate().find_map(|(i, a)| {
                    a.strip_prefix("--from=").or_else(|| {
                        (a == "--from")
                            .then(|| args.get(i + 1).map(String::as_str))
                            .flatten()
                    })
                })
            }
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Action::BackendFault { .. } => "backend_fault",
            Action::BackendRestore { .. } => "backend_restore",
            Action::Kill { .. } => "kill",
            Action::Pause { .. } => "pause",
            Action::Resume { .. } => "resume",
            Action::Restart { .. } => "restart",
            Action::Partition { .. } => "partition",
            Action::Heal => "heal",
            Action::Ctl { .. } => "ctl",
            Action::WaitFor { .. } => "wait_for",
            Action::MoveClients { .. } => "move_clients",
        }
    }

    /// Whether the step injects a fault (the clock of
    /// `failover_committed_within` starts at the first one).
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Action::BackendFault { .. }
                | Action::Kill { .. }
                | Action::Pause { .. }
                | Action::Partition { .. }
        )
    }

    /// One line for plans and timelines.
    pub fn describe(&self) -> String {
        match self {
            Action::BackendFault {
                target,
                faults,
                for_,
            } => format!(
                "backend_fault {} on {target}{}",
                serde_json::Value::Object(faults.clone()),
                for_.map(|d| format!(" for {}", fmt_dur(d)))
                    .unwrap_or_default()
            ),
            Action::BackendRestore { target } => format!("backend_restore {target}"),
            Action::Kill { node } => format!("kill -9 {node}"),
            Action::Pause { node, for_ } => format!(
                "pause (SIGSTOP) {node}{}",
                for_.map(|d| format!(" for {}", fmt_dur(d)))
                    .unwrap_or_default()
            ),
            Action::Resume { node } => match node {
                Some(n) => format!("resume (SIGCONT) {n}"),
                None => "resume every paused node".into(),
            },
            Action::Restart { node } => match node {
                Some(n) => format!("restart {n}"),
                None => "start every killed node again".into(),
            },
            Action::Partition {
                sides,
                direction,
                for_,
            } => {
                let sides = match sides {
                    PartitionSel::Groups(a, b) => format!("{a:?} | {b:?}"),
                    PartitionSel::Isolate(n) => format!("{n} | the rest"),
                };
                format!(
                    "partition {sides} ({}){}",
                    match direction {
                        Direction::Both => "both ways",
                        Direction::OneWay => "one way",
                    },
                    for_.map(|d| format!(" for {}", fmt_dur(d)))
                        .unwrap_or_default()
                )
            }
            Action::Heal => "heal every partition".into(),
            Action::Ctl { args, node, .. } => format!(
                "ctl {}{}",
                args.join(" "),
                node.as_ref()
                    .map(|n| format!(" (via {n})"))
                    .unwrap_or_default()
            ),
            Action::WaitFor { condition, timeout } => {
                format!("wait_for {condition:?} (up to {})", fmt_dur(*timeout))
            }
            Action::MoveClients { from, to } if from == to => {
                format!("move_clients of {from} back to {from}")
            }
            Action::MoveClients { from, to } => {
                format!("move_clients of {from} to {to}")
            }
        }
    }
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

fn validate(raw: RawScenario, path: &Path) -> Result<Scenario, Invalid> {
    let base = path.parent().unwrap_or(Path::new("."));
    let target = match raw.target.kind.as_str() {
        "local" => {
            let Some(topology) = raw.target.topology else {
                return bad("target.topology", "required for a local target");
            };
            for (k, set) in [
                ("target.admin", !raw.target.admin.is_empty()),
                ("target.data", !raw.target.data.is_empty()),
                ("target.backends", !raw.target.backends.is_empty()),
                ("target.token_env", raw.target.token_env.is_some()),
                ("target.api_key_env", raw.target.api_key_env.is_some()),
            ] {
                if set {
                    return bad(k, "only for a cluster target");
                }
            }
            Target::Local {
                topology: base.join(topology),
                node_config: raw.target.node_config.unwrap_or_default(),
            }
        }
        "cluster" => {
            if raw.target.admin.is_empty() {
                return bad("target.admin", "a cluster target needs its admin URLs");
            }
            if raw.target.data.is_empty() {
                return bad("target.data", "a cluster target needs data-plane URLs");
            }
            if raw.target.topology.is_some() {
                return bad("target.topology", "only for a local target");
            }
            if raw.target.node_config.is_some() {
                return bad("target.node_config", "only for a local target");
            }
            for (i, u) in raw.target.admin.iter().chain(&raw.target.data).enumerate() {
                if !u.starts_with("http://") && !u.starts_with("https://") {
                    let key = if i < raw.target.admin.len() {
                        format!("target.admin[{i}]")
                    } else {
                        format!("target.data[{}]", i - raw.target.admin.len())
                    };
                    return bad(key, format!("`{u}` is not an http(s) URL"));
                }
            }
            Target::Cluster {
                admin: raw.target.admin,
                data: raw.target.data,
                token_env: raw
                    .target
                    .token_env
                    .unwrap_or_else(|| "ZONEGATE_ADMIN_TOKEN".into()),
                api_key_env: raw
                    .target
                    .api_key_env
                    .unwrap_or_else(|| "ZONEGATE_API_KEY".into()),
                backends: raw.target.backends,
            }
        }
        other => {
            return bad(
                "target.kind",
                format!("`{other}` is not a target kind (local, cluster)"),
            )
        }
    };
    let local = matches!(target, Target::Local { .. });

    let l = raw.load;
    if !(l.rps > 0.0 && l.rps <= 100_000.0) {
        return bad("load.rps", format!("{} is not in (0, 100000]", l.rps));
    }
    let mix = match l.mix {
        None => Mix {
            short: 1.0,
            long: 0.0,
            stream: 0.0,
        },
        Some(m) => {
            for (k, v) in [("short", m.short), ("long", m.long), ("stream", m.stream)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(format!("load.mix.{k}"), "must be a share >= 0");
                }
            }
            let sum = m.short + m.long + m.stream;
            if sum <= 0.0 {
                return bad("load.mix", "the shares add up to 0");
            }
            Mix {
                short: m.short / sum,
                long: m.long / sum,
                stream: m.stream / sum,
            }
        }
    };
    let mut load = Load {
        rps: l.rps,
        duration: duration("load.duration", &l.duration)?,
        warmup: match l.warmup {
            Some(w) => duration("load.warmup", &w)?,
            None => Duration::from_secs(3),
        },
        mix,
        sessions: l.sessions.unwrap_or(0),
        tenants: match l.tenants {
            Some(0) => return bad("load.tenants", "at least 1"),
            Some(n) if !local && n != 1 => {
                return bad("load.tenants", "a cluster target uses one API key")
            }
            Some(n) => n,
            None => 1,
        },
        concurrency: match l.concurrency {
            Some(0) => return bad("load.concurrency", "at least 1"),
            Some(n) => n,
            None => 256,
        },
        timeout: match l.timeout {
            Some(t) => duration("load.timeout", &t)?,
            None => Duration::from_secs(15),
        },
        entry_zones: l.entry_zones,
        model: l.model,
        short_max_tokens: l.short_max_tokens.unwrap_or(16),
        tenant_quotas: Vec::new(),
    };
    if !l.tenant_quotas.is_empty() && !local {
        return bad(
            "load.tenant_quotas",
            "only for a local target (the drill makes its tenants)",
        );
    }
    if l.tenant_quotas.len() > load.tenants as usize {
        return bad(
            "load.tenant_quotas",
            format!(
                "{} quotas for {} tenants (load.tenants)",
                l.tenant_quotas.len(),
                load.tenants
            ),
        );
    }
    for (i, t) in l.tenant_quotas.into_iter().enumerate() {
        load.tenant_quotas
            .push(tenant_quota(&format!("load.tenant_quotas[{i}]"), t)?);
    }
    if load.duration.is_zero() {
        return bad("load.duration", "must be longer than 0");
    }

    let mut steps = Vec::new();
    for (i, s) in raw.steps.into_iter().enumerate() {
        let step = validate_step(i, s, local)?;
        if let (Some(at), Some(prev)) = (step.at, steps.iter().rev().find_map(|p: &Step| p.at)) {
            if at < prev {
                return bad(
                    format!("steps[{i}].at"),
                    format!(
                        "{} is before the previous step's {}",
                        fmt_dur(at),
                        fmt_dur(prev)
                    ),
                );
            }
        }
        if let Some(at) = step.at {
            if at > load.duration {
                return bad(
                    format!("steps[{i}].at"),
                    format!(
                        "{} is after the load ends ({})",
                        fmt_dur(at),
                        fmt_dur(load.duration)
                    ),
                );
            }
        }
        steps.push(step);
    }

    let e = raw.expect;
    let expect = Expect {
        short_success: e
            .short_success
            .map(|v| fraction("expect.short_success", v))
            .transpose()?,
        long_success: e
            .long_success
            .map(|v| fraction("expect.long_success", v))
            .transpose()?,
        stream_success: e
            .stream_success
            .map(|v| fraction("expect.stream_success", v))
            .transpose()?,
        failover_committed_within: e
            .failover_committed_within
            .map(|s| duration("expect.failover_committed_within", &s))
            .transpose()?,
        no_failover: e.no_failover,
        max_leaders_per_term: match e.max_leaders_per_term {
            Some(0) => return bad("expect.max_leaders_per_term", "at least 1"),
            v => v,
        },
        term_unchanged: e.term_unchanged,
        no_lost_decisions: e.no_lost_decisions,
        converged_within: e
            .converged_within
            .map(|s| duration("expect.converged_within", &s))
            .transpose()?,
        p99_added_ms: match e.p99_added_ms {
            Some(v) if !(v >= 0.0 && v.is_finite()) => {
                return bad("expect.p99_added_ms", "must be >= 0")
            }
            v => v,
        },
        quota_cap_held: e.quota_cap_held,
        quota_stretched_within: e
            .quota_stretched_within
            .map(|s| duration("expect.quota_stretched_within", &s))
            .transpose()?,
    };
    let with_rpm = load.tenant_quotas.iter().any(|q| q.rpm.is_some());
    for (key, set) in [
        ("expect.quota_cap_held", expect.quota_cap_held == Some(true)),
        (
            "expect.quota_stretched_within",
            expect.quota_stretched_within.is_some(),
        ),
    ] {
        if set && !with_rpm {
            return bad(key, "needs a tenant with an rpm quota (load.tenant_quotas)");
        }
    }
    if expect.quota_stretched_within.is_some() && expect.no_failover == Some(true) {
        return bad(
            "expect.no_failover",
            "contradicts expect.quota_stretched_within (measured from a failover)",
        );
    }
    for (i, step) in steps.iter().enumerate() {
        if let Action::MoveClients { from, to } = &step.action {
            for (key, zone) in [("zone", from), ("to", to)] {
                if !load.entry_zones.is_empty() && !load.entry_zones.contains(zone) {
                    return bad(
                        format!("steps[{i}].{key}"),
                        format!("{zone} has no node in the clients' rotation (load.entry_zones)"),
                    );
                }
            }
        }
    }
    if expect.failover_committed_within.is_some() && expect.no_failover == Some(true) {
        return bad(
            "expect.no_failover",
            "contradicts expect.failover_committed_within",
        );
    }

    let s = raw.safety;
    let mut blocked = Vec::new();
    for (i, w) in s.blocked.iter().enumerate() {
        blocked.push(
            crate::window::Window::parse(w).map_err(|r| (format!("safety.blocked[{i}]"), r))?,
        );
    }
    let safety = Safety {
        blocked,
        abort_below: s
            .abort_below
            .map(|v| fraction("safety.abort_below", v))
            .transpose()?,
        abort_after: match s.abort_after {
            Some(d) => duration("safety.abort_after", &d)?,
            None => Duration::from_secs(5),
        },
        alert: match (s.alert_url, s.alert_query) {
            (Some(u), Some(q)) => Some((u, q)),
            (None, None) => None,
            (Some(_), None) => return bad("safety.alert_query", "required with alert_url"),
            (None, Some(_)) => return bad("safety.alert_url", "required with alert_query"),
        },
        capacity_check: s.capacity_check.unwrap_or(false),
    };

    let name = raw.name.unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "drill".into())
    });
    Ok(Scenario {
        name,
        description: raw.description.unwrap_or_default(),
        file: path.to_owned(),
        target,
        load,
        steps,
        expect,
        safety,
    })
}

fn validate_step(i: usize, s: RawStep, local: bool) -> Result<Step, Invalid> {
    let k = |f: &str| format!("steps[{i}].{f}");
    let at = s.at.as_deref().map(|a| duration(&k("at"), a)).transpose()?;
    let for_ = s
        .for_
        .as_deref()
        .map(|a| duration(&k("for"), a))
        .transpose()?;
    let node = s
        .node
        .as_ref()
        .map(|n| node_sel(&k("node"), n))
        .transpose()?;
    // Which optional keys each action reads; any other key set is an error.
    let (uses, action): (&[&str], Action) = match s.action.as_str() {
        "backend_fault" => {
            let target = backend_sel(&k(""), s.backends.clone(), s.zone.clone())?;
            let Some(table) = s.faults.clone() else {
                return bad(k("faults"), "required: the /mock/faults keys to set");
            };
            let mut faults = serde_json::Map::new();
            for (key, v) in table {
                if !FAULT_KEYS.contains(&key.as_str()) {
                    return bad(
                        k(&format!("faults.{key}")),
                        format!("not a mock fault (known: {})", FAULT_KEYS.join(", ")),
                    );
                }
                let json = serde_json::to_value(&v)
                    .map_err(|e| (k(&format!("faults.{key}")), e.to_string()))?;
                faults.insert(key, json);
            }
            (
                &["backends", "zone", "faults", "for"],
                Action::BackendFault {
                    target,
                    faults,
                    for_,
                },
            )
        }
        "backend_restore" => (
            &["backends", "zone"],
            Action::BackendRestore {
                target: backend_sel(&k(""), s.backends.clone(), s.zone.clone())?,
            },
        ),
        "kill" => (
            &["node"],
            Action::Kill {
                node: node.clone().ok_or_else(|| (k("node"), "required".to_owned()))?,
            },
        ),
        "pause" => (
            &["node", "for"],
            Action::Pause {
                node: node.clone().ok_or_else(|| (k("node"), "required".to_owned()))?,
                for_,
            },
        ),
        "resume" => (&["node"], Action::Resume { node: node.clone() }),
        "restart" => (&["node"], Action::Restart { node: node.clone() }),
        "partition" => {
            let sides = match (&s.groups, &s.isolate) {
                (Some(g), None) => {
                    if g.len() != 2 || g.iter().any(Vec::is_empty) {
                        return bad(k("groups"), "expected two non-empty groups of node ids");
                    }
                    if g[0].iter().any(|id| g[1].contains(id)) {
                        return bad(k("groups"), "a node is on both sides");
                    }
                    PartitionSel::Groups(g[0].clone(), g[1].clone())
                }
                (None, Some(n)) => PartitionSel::Isolate(node_sel(&k("isolate"), n)?),
                (Some(_), Some(_)) => {
                    return bad(k("isolate"), "give either groups or isolate, not both")
                }
                (None, None) => return bad(k("groups"), "required (or isolate)"),
            };
            let direction = match s.direction.as_deref() {
                None | Some("both") => Direction::Both,
                Some("one-way") | Some("one_way") => Direction::OneWay,
                Some(d) => return bad(k("direction"), format!("`{d}` is not both or one-way")),
            };
            (
                &["groups", "isolate", "direction", "for"],
                Action::Partition {
                    sides,
                    direction,
                    for_,
                },
            )
        }
        "heal" => (&[], Action::Heal),
        "ctl" => {
            let Some(args) = s.args.clone() else {
                return bad(k("args"), "required, e.g. [\"freeze\"]");
            };
            if args.is_empty() {
                return bad(k("args"), "empty");
            }
            if args
                .iter()
                .any(|a| a == "--admin" || a == "--token" || a.starts_with("--admin=") || a.starts_with("--token="))
            {
                return bad(k("args"), "the drill sets --admin and --token itself");
            }
            (
                &["args", "node", "expect_exit"],
                Action::Ctl {
                    args,
                    node: node.clone(),
                    expect_exit: s.expect_exit,
                },
            )
        }
        "wait_for" => {
            let condition = match s.condition.as_deref() {
                Some("decision") => Condition::Decision {
                    kind: s.kind.clone(),
                    zone: s.zone.clone(),
                },
                Some("leader_change") => Condition::LeaderChange,
                Some("leader") => Condition::Leader,
                Some("converged") => Condition::Converged,
                Some("version") => Condition::Version(
                    s.version
                        .ok_or_else(|| (k("version"), "required for condition version".to_owned()))?,
                ),
                Some(c) => {
                    return bad(
                        k("condition"),
                        format!("`{c}` is not one of decision, leader_change, leader, converged, version"),
                    )
                }
                None => return bad(k("condition"), "required"),
            };
            if let Some(kind) = &s.kind {
                if !["failover", "failback", "freeze", "unfreeze"].contains(&kind.as_str()) {
                    return bad(k("kind"), format!("`{kind}` is not a decision kind"));
                }
            }
            let timeout = match &s.timeout {
                Some(t) => duration(&k("timeout"), t)?,
                None => Duration::from_secs(30),
            };
            (
                &["condition", "kind", "zone", "version", "timeout"],
                Action::WaitFor { condition, timeout },
            )
        }
        "move_clients" => {
            let Some(from) = s.zone.clone() else {
                return bad(k("zone"), "required: the zone whose clients move");
            };
            let Some(to) = s.to.clone() else {
                return bad(k("to"), "required: the zone they move to");
            };
            (&["zone", "to"], Action::MoveClients { from, to })
        }
        other => {
            return bad(
                k("action"),
                format!(
                    "`{other}` is not an action (backend_fault, backend_restore, kill, pause, resume, restart, partition, heal, ctl, wait_for, move_clients)"
                ),
            )
        }
    };
    let set: [(&str, bool); 15] = [
        ("for", s.for_.is_some()),
        ("node", s.node.is_some()),
        ("zone", s.zone.is_some()),
        ("backends", s.backends.is_some()),
        ("faults", s.faults.is_some()),
        ("groups", s.groups.is_some()),
        ("isolate", s.isolate.is_some()),
        ("direction", s.direction.is_some()),
        ("args", s.args.is_some()),
        ("expect_exit", s.expect_exit.is_some()),
        ("condition", s.condition.is_some()),
        ("kind", s.kind.is_some()),
        ("version", s.version.is_some()),
        ("timeout", s.timeout.is_some()),
        ("to", s.to.is_some()),
    ];
    for (key, present) in set {
        if present && !uses.contains(&key) {
            return bad(k(key), format!("not used by action `{}`", action.name()));
        }
    }
    if !local
        && matches!(
            action,
            Action::Kill { .. }
                | Action::Pause { .. }
                | Action::Resume { .. }
                | Action::Restart { .. }
                | Action::Partition { .. }
                | Action::Heal
        )
    {
        return bad(
            k("action"),
            format!(
                "`{}` needs the processes and relays of a local target",
                action.name()
            ),
        );
    }
    Ok(Step {
        at,
        action,
        note: s.note,
    })
}

/// A `load.tenant_quotas` entry: the keys of a node's `quota` table, each
/// a whole number of at least 1, at least one given.
fn tenant_quota(key: &str, t: toml::Table) -> Result<TenantQuota, Invalid> {
    if t.is_empty() {
        return bad(key, "empty: give rpm, tpm or concurrency");
    }
    let mut q = TenantQuota::default();
    for (k, v) in t {
        let slot = match k.as_str() {
            "rpm" => &mut q.rpm,
            "tpm" => &mut q.tpm,
            "concurrency" => &mut q.concurrency,
            _ => {
                return bad(
                    format!("{key}.{k}"),
                    "not a quota key (rpm, tpm, concurrency)",
                )
            }
        };
        match v.as_integer() {
            Some(n) if n >= 1 => *slot = Some(n as u64),
            _ => {
                return bad(
                    format!("{key}.{k}"),
                    format!("{v} is not a whole number >= 1"),
                )
            }
        }
    }
    Ok(q)
}

fn backend_sel(
    key: &str,
    backends: Option<Vec<String>>,
    zone: Option<String>,
) -> Result<BackendSel, Invalid> {
    match (backends, zone) {
        (Some(b), None) if !b.is_empty() => Ok(BackendSel::Names(b)),
        (None, Some(z)) => Ok(BackendSel::Zone(z)),
        (Some(_), Some(_)) => bad(
            format!("{key}zone"),
            "give either backends or zone, not both",
        ),
        _ => bad(format!("{key}backends"), "required (or zone)"),
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
