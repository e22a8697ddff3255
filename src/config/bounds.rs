//! What one node can carry: the bounds of every numeric and duration key,
//! each with the reason a value past it is refused. A config is replicated
//! to every node, so a value no node can carry (a ring of 10⁸ points per
//! pool, a probe every nanosecond, a deadline of 500 000 years) would take
//! every node down at once; it is refused here instead, with the file, the
//! key and the reason, at start, by `check-config`, by the leader's dry
//! run and by every node's apply alike. The test
//! `every_numeric_and_duration_key_is_bounded` walks every key of the raw
//! config types, so a new key cannot arrive unbounded.

use std::time::Duration;

use super::{ConfigError, Validator};

/// An inclusive range of accepted values, and why values outside it are
/// refused.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bound<T> {
    pub min: T,
    pub max: T,
    pub why: &'static str,
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

// Durations.

/// Active probes: every node probes every backend this often.
pub(super) const PROBE_INTERVAL: Bound<Duration> = Bound {
    min: ms(100),
    max: secs(HOUR),
    why: "every node probes every backend this often",
};
/// Probes of an ejected backend (backoff from `watch_interval` up to
/// `max_watch_interval`).
pub(super) const WATCH_INTERVAL: Bound<Duration> = Bound {
    min: ms(100),
    max: secs(DAY),
    why: "every node probes every ejected backend this often",
};
/// A probe's own timeout.
pub(super) const PROBE_TIMEOUT: Bound<Duration> = Bound {
    min: ms(10),
    max: secs(300),
    why: "a probe holds a connection this long",
};
/// Health timers: slow start, canary, ramps, ejection times.
pub(super) const HEALTH_TIME: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(7 * DAY),
    why: "a health timer longer than a week is a typo",
};
/// Connecting to a backend.
pub(super) const CONNECT_TIMEOUT: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(300),
    why: "a connection attempt holds a request this long",
};
/// A request's timeouts (first token, generation, idle, overall).
pub(super) const REQUEST_TIMEOUT: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(DAY),
    why: "a request holds a connection and its quota this long",
};
/// A quota's burst: what its buckets allow at once.
pub(super) const BURST: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(60),
    why: "the limits are per minute",
};
/// `[retry]` timers: cooldowns, the wait for a short Retry-After.
pub(super) const RETRY_WAIT: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(HOUR),
    why: "a request or a backend waits this long",
};
/// How long a session pin lives unused.
pub(super) const PIN_TTL: Bound<Duration> = Bound {
    min: secs(1),
    max: secs(30 * DAY),
    why: "pins are kept in memory and signed with an expiry",
};
/// The detector's period (zone reports, assessments).
pub(super) const FAILOVER_PERIOD: Bound<Duration> = Bound {
    min: ms(10),
    max: secs(600),
    why: "every node reports to the leader once a period",
};
/// The dwell between automatic decisions on one zone.
pub(super) const FAILOVER_DWELL: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(DAY),
    why: "a longer dwell would keep a zone from failing over or back for more than a day",
};
/// The leader's quota rebalance interval.
pub(super) const REBALANCE_INTERVAL: Bound<Duration> = Bound {
    min: ms(100),
    max: secs(HOUR),
    why: "the leader commits a rebalance at most this often",
};
/// How long a request waits for a zone's capacity units.
pub(super) const QUEUE_TIMEOUT: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(60),
    why: "a request waiting for capacity holds its connection and body; \"0s\" turns the queue off",
};
/// Drain grace and timeout.
pub(super) const DRAIN_TIME: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(DAY),
    why: "a draining node waits this long before it stops",
};
/// Raft heartbeat.
pub(super) const HEARTBEAT: Bound<Duration> = Bound {
    min: ms(10),
    max: secs(10),
    why: "the leader sends a heartbeat this often",
};
/// Raft election timeouts.
pub(super) const ELECTION_TIMEOUT: Bound<Duration> = Bound {
    min: ms(30),
    max: secs(60),
    why: "a cluster without a leader waits this long to elect one",
};
/// Listener timeouts (header, body, idle, send).
pub(super) const LISTENER_TIMEOUT: Bound<Duration> = Bound {
    min: ms(1),
    max: secs(DAY),
    why: "a connection is held this long",
};

// Counts and sizes.

/// Virtual nodes per unit of weight on a hash ring.
pub(super) const VNODES: Bound<u64> = Bound {
    min: 1,
    max: 10_000,
    why: "each backend puts vnodes × weight points on the ring of every pool it serves",
};
/// A backend's weight.
/// Anthropic's `max_tokens` sent when the client set none.
pub(super) const MAX_TOKENS: Bound<u64> = Bound {
    min: 1,
    max: 1_000_000,
    why: "no model answers with more than a million tokens",
};
pub(super) const WEIGHT: Bound<u64> = Bound {
    min: 1,
    max: 10_000,
    why: "a backend puts vnodes × weight points on the ring of every pool it serves",
};
/// A backend's capacity units.
pub(super) const CAPACITY: Bound<u64> = Bound {
    min: 1,
    max: 100_000_000,
    why: "capacity units are summed per zone and multiplied into allocations",
};
/// A model's capability tier, a request's minimum tier.
pub(super) const TIER: Bound<u64> = Bound {
    min: 0,
    max: 1_000,
    why: "tiers rank models; more than a thousand ranks is a typo",
};
/// Attempts per model.
pub(super) const MAX_ATTEMPTS: Bound<u64> = Bound {
    min: 1,
    max: 10,
    why: "every attempt may wait a full connect and first-token timeout",
};
/// Retries always allowed at once, whatever the budget's ratio.
pub(super) const MIN_CONCURRENT_RETRIES: Bound<u64> = Bound {
    min: 0,
    max: 100_000,
    why: "retries running at once on a node, beyond the budget's share",
};
/// Consecutive evaluations or failures (health thresholds, failover
/// periods).
pub(super) const STREAK: Bound<u64> = Bound {
    min: 1,
    max: 1_000,
    why: "counted one evaluation or request at a time",
};
/// Periods of zone reports the leader keeps.
pub(super) const HISTORY_PERIODS: Bound<u64> = Bound {
    min: 1,
    max: 10_000,
    why: "the leader keeps this many periods of reports per node and zone",
};
/// Zones the automation may hold failed over at once.
pub(super) const FAILED_OVER_ZONES: Bound<u64> = Bound {
    min: 0,
    max: 1_000,
    why: "more zones than any cluster has",
};
/// Sessions pinned in memory.
pub(super) const PIN_CAPACITY: Bound<u64> = Bound {
    min: 1,
    max: 10_000_000,
    why: "each pin is kept in memory",
};
/// Output tokens of a short request.
pub(super) const SHORT_TOKENS: Bound<u64> = Bound {
    min: 0,
    max: 10_000_000,
    why: "more than any model's context",
};
/// Bytes of a request body (and of anything compared with one).
pub(super) const BODY_BYTES: Bound<u64> = Bound {
    min: 1,
    max: 1024 * 1024 * 1024,
    why: "a request body is held in memory",
};
/// Body bytes at which a prompt tier starts (0: every request).
pub(super) const PROMPT_BYTES: Bound<u64> = Bound {
    min: 0,
    max: 1024 * 1024 * 1024,
    why: "compared with request bodies, which are at most 1 GiB",
};
/// Connections one listener accepts.
pub(super) const CONNECTIONS: Bound<u64> = Bound {
    min: 1,
    max: 10_000_000,
    why: "each connection holds a file descriptor and buffers",
};
/// Requests or tokens per minute (quotas and model limits).
pub(super) const PER_MINUTE: Bound<u64> = Bound {
    min: 1,
    max: 1_000_000_000_000,
    why: "allocations multiply this; leave it out for no limit",
};
/// Requests in flight (a tenant's concurrency).
pub(super) const CONCURRENCY: Bound<u64> = Bound {
    min: 1,
    max: 100_000_000,
    why: "leave it out for no limit",
};
/// Capacity units a long request costs.
pub(super) const LONG_UNITS: Bound<u64> = Bound {
    min: 1,
    max: 1_000,
    why: "a long request costs this many short ones",
};

/// Entries of the replicated lists. Each node keeps every tenant's keys in
/// memory and builds a pool per model and zone from the backends.
pub(super) const TENANTS: Bound<u64> = Bound {
    min: 0,
    max: 100_000,
    why: "every node indexes every tenant's keys",
};
pub(super) const BACKENDS: Bound<u64> = Bound {
    min: 0,
    max: 10_000,
    why: "every node probes every backend",
};
pub(super) const MODELS: Bound<u64> = Bound {
    min: 0,
    max: 10_000,
    why: "every node builds a pool per model and zone",
};
pub(super) const PROMPT_TIERS: Bound<u64> = Bound {
    min: 0,
    max: 1_000,
    why: "every request is compared with them",
};

// Real numbers.

/// A relative weight (score dimensions, zone score weights).
pub(super) const REL_WEIGHT: Bound<f64> = Bound {
    min: 0.0,
    max: 1_000.0,
    why: "weights are relative to each other",
};
/// The bounded-load factor.
/// `[[rules]]` per config.
pub(super) const RULES: Bound<u64> = Bound {
    min: 0,
    max: 1_000,
    why: "the rules for a request's model are checked on every request",
};
/// `[[shadows]]` per config.
pub(super) const SHADOWS: Bound<u64> = Bound {
    min: 0,
    max: 100,
    why: "each keeps a comparison ring in every node's memory",
};
/// A rule's or shadow's share of requests.
pub(super) const PERCENT: Bound<f64> = Bound {
    min: 0.0,
    max: 100.0,
    why: "a share of requests, in percent",
};
/// Shadow copies of one shadow in flight on a node.
pub(super) const SHADOW_IN_FLIGHT: Bound<u64> = Bound {
    min: 1,
    max: 10_000,
    why: "each copy holds a connection and a body in memory",
};
/// A shadow copy's own deadline.
pub(super) const SHADOW_TIMEOUT: Bound<Duration> = Bound {
    min: ms(100),
    max: secs(HOUR),
    why: "a copy holds a connection and its slot this long",
};
pub(super) const LOAD_FACTOR: Bound<f64> = Bound {
    min: 1.0,
    max: 100.0,
    why: "no backend takes more than this × the mean load; past 100 the bound is none",
};
/// A health signal's normalisation bound, in its unit (ms, ratio, depth).
pub(super) const LATENCY_MS: Bound<f64> = Bound {
    min: 0.0,
    max: 3_600_000.0,
    why: "milliseconds, at most an hour",
};
pub(super) const RATIO: Bound<f64> = Bound {
    min: 0.0,
    max: 1.0,
    why: "a ratio",
};
/// A price per million tokens, in base units of the currency.
pub(super) const PRICE: Bound<f64> = Bound {
    min: 0.0,
    max: 1_000_000.0,
    why: "base units per million tokens; more than a million is a typo",
};
/// A budget per day or month, in base units of the currency (kept in
/// nano-units as a 64-bit integer).
pub(super) const BUDGET: Bound<f64> = Bound {
    min: 0.000_001,
    max: 1_000_000_000.0,
    why: "base units of the currency; budgets are kept in nano-units",
};
/// `[telemetry] queue_size`: finished spans held for export.
pub(super) const SPAN_QUEUE: Bound<u64> = Bound {
    min: 1,
    max: 1_000_000,
    why: "spans held in memory while the collector is slow (a few hundred bytes each)",
};
pub(super) const QUEUE_DEPTH: Bound<f64> = Bound {
    min: 0.0,
    max: 1_000_000.0,
    why: "requests waiting",
};

/// Ring points one pool (one model in one zone) may hold: vnodes × the sum
/// of its backends' weights. 16 bytes each: 16 MiB per pool.
pub const MAX_RING_POINTS_PER_POOL: u64 = 1 << 20;
/// Ring points a whole route table may hold (every pool of every model):
/// 64 MiB, built on every node at every config change.
pub const MAX_RING_POINTS: u64 = 1 << 22;

impl Validator<'_> {
    /// A duration key: humantime text (`"30s"`), within `b`.
    pub(super) fn duration(
        &self,
        key: &str,
        s: Option<&str>,
        default: Duration,
        b: Bound<Duration>,
    ) -> Result<Duration, ConfigError> {
        let Some(s) = s else { return Ok(default) };
        let d = humantime::parse_duration(s)
            .map_err(|e| self.err(key, format!("`{s}` is not a duration like \"30s\": {e}")))?;
        if d.is_zero() {
            return Err(self.err(key, "must be greater than zero"));
        }
        if d < b.min || d > b.max {
            return Err(self.err(
                key,
                format!(
                    "`{s}` is out of range: must be between {} and {} ({})",
                    humantime::format_duration(b.min),
                    humantime::format_duration(b.max),
                    b.why
                ),
            ));
        }
        Ok(d)
    }

    /// An integer key within `b` (`default` when left out).
    pub(super) fn int<T>(
        &self,
        key: &str,
        v: Option<T>,
        default: T,
        b: Bound<u64>,
    ) -> Result<T, ConfigError>
    where
        T: Copy + TryInto<u64>,
    {
        let Some(v) = v else { return Ok(default) };
        match v.try_into() {
            Ok(n) if (b.min..=b.max).contains(&n) => Ok(v),
            Ok(n) if n == 0 && b.min == 1 => Err(self.err(key, "must be at least 1")),
            Ok(n) => Err(self.out_of_range(key, n, b)),
            Err(_) => Err(self.err(
                key,
                format!("must be between {} and {} ({})", b.min, b.max, b.why),
            )),
        }
    }

    fn out_of_range(&self, key: &str, n: u64, b: Bound<u64>) -> ConfigError {
        self.err(
            key,
            format!(
                "{n} is out of range: must be between {} and {} ({})",
                b.min, b.max, b.why
            ),
        )
    }

    /// A real-number key within `b` (finite).
    pub(super) fn real(
        &self,
        key: &str,
        v: Option<f64>,
        default: f64,
        b: Bound<f64>,
    ) -> Result<f64, ConfigError> {
        let v = v.unwrap_or(default);
        if !(v.is_finite() && v >= b.min && v <= b.max) {
            return Err(self.err(
                key,
                format!(
                    "{v} is out of range: must be a number between {} and {} ({})",
                    b.min, b.max, b.why
                ),
            ));
        }
        Ok(v)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The walk over every key: each key of the raw config types is found
    //! through the parser itself (an unknown key's error lists the known
    //! ones), so a key added to any section is walked without a change
    //! here.

    use toml::{Table, Value};

    use super::super::{sha256_hex, Config};

    /// A config that holds one of every table and array of tables, so the
    /// walk reaches every key (a required field's table must exist for its
    /// siblings to be tried one at a time).
    fn base() -> Table {
        let text = format!(
            r#"
[node]
id = 1
zone = "az-a"
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
data_dir = "data"

[[tenants]]
name = "deptA"
key_sha256 = "{key}"
zone_share = {{ az-a = 1.0 }}

[[backends]]
name = "a1"
zone = "az-a"
url = "http://127.0.0.1:8000"
models = ["m", "s"]
capacity = 8

[[backends]]
name = "c1"
zone = "az-a"
url = "https://api.anthropic.com"
models = ["m"]
provider = "anthropic"
api_key = {{ env = "PATH" }}
default_max_tokens = 1024
health = {{ interval = "30s" }}
capacity = 8

[[models]]
name = "m"
fallback = ["s"]

[[rules]]
name = "r"
model = "m"
route_to = "s"
match = {{ tenants = ["deptA"] }}

[[shadows]]
name = "sh"
model = "m"
to = "s"

[[prompt_tiers]]
min_bytes = 100
min_tier = 1

[zones.az-a]
fallback_order = []

[failover]
weights = {{ gw_error = 0.4, timeout = 0.4, gpu = 0.2 }}

[[admin.tokens]]
name = "ops"
sha256 = "{key}"
role = "operator"

[[cluster.members]]
id = 1
zone = "az-a"
raft = "127.0.0.1:7001"
admin = "127.0.0.1:9001"
"#,
            key = sha256_hex("k")
        );
        text.parse().unwrap()
    }

    /// Keys that may hold any value of their type, and why.
    const UNBOUNDED: &[(&str, &str)] = &[
        ("node.id", "an identity: any u64 names a node"),
        ("cluster.members[0].id", "an identity: any u64 names a node"),
    ];

    #[derive(Clone, Debug)]
    enum Seg {
        Key(String),
        Index(usize),
    }

    fn path_str(path: &[Seg]) -> String {
        let mut out = String::new();
        for s in path {
            match s {
                Seg::Key(k) if out.is_empty() => out.push_str(k),
                Seg::Key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }

    /// `root` with `value` at `path`, creating tables on the way.
    fn with(root: &Table, path: &[Seg], value: Value) -> Table {
        fn put(v: &mut Value, path: &[Seg], value: Value) {
            let Some((first, rest)) = path.split_first() else {
                *v = value;
                return;
            };
            match first {
                Seg::Key(k) => {
                    if !v.is_table() {
                        *v = Value::Table(Table::new());
                    }
                    let t = v.as_table_mut().unwrap();
                    let slot = t
                        .entry(k.clone())
                        .or_insert_with(|| Value::Table(Table::new()));
                    put(slot, rest, value);
                }
                Seg::Index(i) => put(&mut v.as_array_mut().unwrap()[*i], rest, value),
            }
        }
        let mut v = Value::Table(root.clone());
        put(&mut v, path, value);
        match v {
            Value::Table(t) => t,
            _ => unreachable!(),
        }
    }

    fn get<'a>(root: &'a Table, path: &[Seg]) -> Option<&'a Value> {
        let mut v: &Value = root.get(match path.first()? {
            Seg::Key(k) => k.as_str(),
            Seg::Index(_) => return None,
        })?;
        for s in &path[1..] {
            v = match s {
                Seg::Key(k) => v.as_table()?.get(k)?,
                Seg::Index(i) => v.as_array()?.get(*i)?,
            };
        }
        Some(v)
    }

    fn parse(t: &Table) -> Result<(), super::super::ConfigError> {
        Config::parse("walk.toml", &toml::to_string(t).unwrap()).map(|_| ())
    }

    /// The field names an unknown key's error lists, or `None` when the
    /// table takes any key (a map).
    fn fields(root: &Table, path: &[Seg]) -> Option<Vec<String>> {
        let mut probe = path.to_vec();
        probe.push(Seg::Key("zz_probe".into()));
        let e = parse(&with(root, &probe, Value::Integer(0))).err()?;
        if !e.reason.contains("unknown field `zz_probe`") {
            return None;
        }
        let expected = e.reason.split_once("expected")?.1;
        Some(
            expected
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect(),
        )
    }

    struct Walk {
        /// Every key the walk reached, tables included.
        seen: Vec<String>,
        root: Table,
        checked: Vec<String>,
        failures: Vec<String>,
    }

    impl Walk {
        /// `value` at `path` must be refused, naming the key.
        fn refused(&mut self, path: &[Seg], value: Value, what: &str) -> bool {
            let key = path_str(path);
            match parse(&with(&self.root, path, value.clone())) {
                Ok(()) => {
                    self.failures
                        .push(format!("{key} = {value} ({what}) is accepted: bound it"));
                    false
                }
                Err(e) if e.key == key => true,
                Err(e) => {
                    self.failures.push(format!(
                        "{key} = {value} ({what}) is refused under another key: {e}"
                    ));
                    false
                }
            }
        }

        fn table(&mut self, path: &[Seg]) {
            let names = match fields(&self.root, path) {
                Some(names) => names,
                // A map: walk the entries the base holds.
                None => match get(&self.root, path).and_then(Value::as_table) {
                    Some(t) => t.keys().cloned().collect(),
                    None => return,
                },
            };
            for name in names {
                let mut p = path.to_vec();
                p.push(Seg::Key(name));
                self.key(&p);
            }
        }

        fn key(&mut self, path: &[Seg]) {
            let key = path_str(path);
            self.seen.push(key.clone());
            if UNBOUNDED.iter().any(|(k, _)| *k == key) {
                return;
            }
            let huge = Value::Integer(i64::MAX);
            let e = match parse(&with(&self.root, path, huge.clone())) {
                Ok(()) => {
                    self.failures
                        .push(format!("{key} = {} is accepted: bound it", i64::MAX));
                    return;
                }
                Err(e) => e,
            };
            let r = e.reason.as_str();
            if e.key != key {
                self.failures.push(format!(
                    "{key} = i64::MAX is refused under another key: {e}"
                ));
                return;
            }
            let width = [
                ("expected u32", u64::from(u32::MAX)),
                ("expected u16", u64::from(u16::MAX)),
                ("expected u8", u64::from(u8::MAX)),
            ]
            .into_iter()
            .find(|(t, _)| r.contains(t));
            if let Some((_, max)) = width {
                let max = i64::try_from(max).unwrap();
                if self.refused(path, Value::Integer(max), "its type's max") {
                    self.checked.push(key);
                }
            } else if r.contains("invalid type: integer") && r.contains("string") {
                self.string(path);
            } else if r.contains("boolean") || r.contains("enum") || r.contains("variant") {
                // Booleans and enums cannot be out of range.
            } else if r.contains("invalid type: integer")
                && (r.contains("struct") || r.contains("map"))
            {
                self.table(path);
            } else if r.contains("invalid type: integer")
                && (r.contains("sequence") || r.contains("array"))
            {
                self.array(path);
            } else if !r.contains("invalid type") {
                // A number refused by its bound.
                self.checked.push(key);
            }
        }

        /// A string key that is a duration must refuse a huge one and a
        /// tiny one.
        fn string(&mut self, path: &[Seg]) {
            let key = path_str(path);
            let not = parse(&with(
                &self.root,
                path,
                Value::String("not-a-duration".into()),
            ));
            let is_duration =
                matches!(&not, Err(e) if e.key == key && e.reason.contains("not a duration"));
            if !is_duration {
                return;
            }
            let huge = self.refused(path, Value::String("500000000years".into()), "huge");
            let tiny = self.refused(path, Value::String("1ns".into()), "tiny");
            if huge && tiny {
                self.checked.push(key);
            }
        }

        fn array(&mut self, path: &[Seg]) {
            let key = path_str(path);
            if let Some(Value::Array(items)) = get(&self.root, path) {
                if items.first().is_some_and(Value::is_table) {
                    let mut p = path.to_vec();
                    p.push(Seg::Index(0));
                    self.table(&p);
                    return;
                }
            }
            let pair = Value::Array(vec![Value::Integer(0), Value::Integer(i64::MAX)]);
            match parse(&with(&self.root, path, pair)) {
                Err(e) if e.reason.contains("string") => {}
                Err(e) if e.reason.contains("struct") => self.failures.push(format!(
                    "{key} is an array of tables the walk's base lacks: add one"
                )),
                Err(e) if e.key.starts_with(&key) => self.checked.push(key),
                Err(e) => self.failures.push(format!(
                    "{key} = [0, i64::MAX] is refused under another key: {e}"
                )),
                Ok(()) => self
                    .failures
                    .push(format!("{key} = [0, i64::MAX] is accepted: bound it")),
            }
        }
    }

    /// Every leaf key the raw config types accept (`backends[0].weight`,
    /// `zones.az-a.fallback_order`), found by the walk below; the
    /// configuration reference test checks each is documented.
    pub(crate) fn every_key() -> Vec<String> {
        let mut walk = Walk {
            seen: Vec::new(),
            root: base(),
            checked: Vec::new(),
            failures: Vec::new(),
        };
        walk.table(&[]);
        let seen = walk.seen;
        seen.iter()
            .filter(|k| {
                !seen.iter().any(|o| {
                    o.len() > k.len()
                        && o.starts_with(k.as_str())
                        && matches!(o.as_bytes()[k.len()], b'.' | b'[')
                })
            })
            .cloned()
            .collect()
    }

    #[test]
    fn every_numeric_and_duration_key_is_bounded() {
        let root = base();
        parse(&root).expect("the walk's base config is valid");
        let mut walk = Walk {
            seen: Vec::new(),
            root,
            checked: Vec::new(),
            failures: Vec::new(),
        };
        walk.table(&[]);
        assert!(
            walk.failures.is_empty(),
            "unbounded or misreported keys:\n{}",
            walk.failures.join("\n")
        );
        // The walk reached every section (a sample of each).
        for key in [
            "balance.vnodes",
            "backends[0].weight",
            "backends[0].capacity",
            "health.interval",
            "failover.dwell",
            "retry.max_attempts",
            "tenants[0].quota.rpm",
            "models[0].total_timeout",
            "models[0].limits.tpm",
            "node.limits.max_connections",
            "cluster.heartbeat",
            "quotas.rebalance_interval",
            "prompt_tiers[0].min_tier",
            "affinity.pin_capacity",
            "telemetry.queue_size",
        ] {
            assert!(
                walk.checked.iter().any(|k| k == key),
                "{key} was not walked; walked: {:?}",
                walk.checked
            );
        }
    }
}
