//! `zonegate ctl`'s tables: one function per answer, columns left-aligned.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use super::Verb;

/// How to print for this stdout: colour only on a terminal, and never
/// with `NO_COLOR` set (https://no-color.org); `now_ms` for ages.
#[derive(Clone, Debug)]
pub struct Look {
    pub color: bool,
    pub now_ms: u64,
}

impl Look {
    pub fn for_stdout() -> Self {
        use std::io::IsTerminal as _;
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Self {
            color: !no_color && std::io::stdout().is_terminal(),
            now_ms: crate::clock::unix_ms(),
        }
    }

    /// Plain text, ages against `now_ms`.
    pub fn plain(now_ms: u64) -> Self {
        Self {
            color: false,
            now_ms,
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn warn(&self, text: &str) -> String {
        self.paint("33", text)
    }

    fn bad(&self, text: &str) -> String {
        self.paint("31", text)
    }
}

/// The human rendering of an answer, plain, ages against the wall clock.
pub fn render(verb: &Verb, v: &Value) -> String {
    render_with(verb, v, &Look::plain(crate::clock::unix_ms()))
}

/// The human rendering of an answer.
pub fn render_with(verb: &Verb, v: &Value, look: &Look) -> String {
    match verb {
        Verb::Status | Verb::Watch { .. } => status(v, look),
        Verb::Backends => backends(v),
        Verb::Quotas => quotas(v),
        Verb::Decisions { .. } => decisions(v, look),
        Verb::Explain { .. } => explain(v),
        Verb::Failover { opts, .. } | Verb::Failback { opts, .. } if opts.dry_run => preview(v),
        _ => format!(
            "committed: {} as decision version {}\n",
            s(&v["kind"]),
            s(&v["version"])
        ),
    }
}

/// `2026-12-01 08:01:02Z, 3m ago` for epoch milliseconds.
pub fn when(at_ms: u64, now_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(at_ms);
    let iso = humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace('T', " ");
    let age = if at_ms > now_ms {
        format!("in {}", human_ms(at_ms - now_ms))
    } else {
        format!("{} ago", human_ms(now_ms - at_ms))
    };
    format!("{iso}, {age}")
}

/// A short human duration: `850ms`, `4s`, `2m10s`, `1h05m`, `3d04h`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn status(v: &Value, look: &Look) -> String {
    let automation = match v["automation"].as_str() {
        Some("frozen") => look.warn("frozen"),
        _ => s(&v["automation"]),
    };
    let mut out = format!(
        "node {} ({}, {})  control plane: {}  leader: {}  term: {}  decision version: {}  automation: {}\n\n",
        s(&v["node_id"]),
        s(&v["zone"]),
        s(&v["role"]),
        s(&v["control_plane"]),
        s(&v["leader"]),
        s(&v["term"]),
        s(&v["decision_version"]),
        automation,
    );
    let outlook = &v["outlook"];
    let zones: Vec<Vec<String>> = v["zones"]
        .as_object()
        .map(|z| {
            z.iter()
                .map(|(name, st)| zone_row(name, st, &outlook["zones"][name.as_str()]))
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&table(
        &["ZONE", "STATUS", "TARGET", "SCORE", "PERIODS", "DWELL"],
        &zones,
    ));
    if let Some(zs) = outlook["zones"].as_object() {
        for (name, z) in zs {
            if let Some(line) = dwell_words(name, &v["zones"][name.as_str()], z) {
                let _ = writeln!(out, "  {name}: {line}");
            }
            if let Some(next) = z["next"].as_str() {
                let line = if z["bad_periods"].as_u64().unwrap_or(0) > 0 {
                    look.warn(next)
                } else {
                    next.to_owned()
                };
                let _ = writeln!(out, "  {name}: {line}");
            }
        }
    }
    out.push_str(&traffic(&outlook["traffic"]));
    let nodes = rows(&v["nodes"], |n| {
        let leader = if n["leader"] == true { "*" } else { "" };
        // A node whose view is older than a few election timeouts routes
        // with its last decisions (fail static); say so.
        let view = match (n["stale"].as_bool(), n["view_age_ms"].as_u64()) {
            (Some(true), Some(ms)) => look.bad(&format!("STALE ({})", human_ms(ms))),
            (Some(true), None) => look.bad("STALE (no leader yet)"),
            (Some(false), _) => "fresh".into(),
            _ => "-".into(),
        };
        vec![
            s(&n["id"]),
            s(&n["zone"]),
            s(&n["role"]),
            s(&n["decision_version"]),
            config_cell(n, look),
            s(&n["reachable"]),
            view,
            leader.into(),
        ]
    });
    if !nodes.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "NODE",
                "ZONE",
                "ROLE",
                "VERSION",
                "CONFIG",
                "REACHABLE",
                "VIEW",
                "LEADER",
            ],
            &nodes,
        ));
    }
    let d = &v["last_decision"];
    if d.is_object() {
        let _ = writeln!(
            out,
            "\nlast decision: version {} {} {} by {} ({}) at {}: {}",
            s(&d["version"]),
            s(&d["kind"]),
            zones_of(d),
            s(&d["actor"]),
            s(&d["origin"]),
            d["at_ms"]
                .as_u64()
                .map_or("-".into(), |t| when(t, look.now_ms)),
            s(&d["reason"]),
        );
    }
    out
}

/// A node's CONFIG cell: the version it routes with, or, when it could
/// not apply a committed one, `v8 FAILED (kept v7)`.
fn config_cell(n: &Value, look: &Look) -> String {
    let f = &n["config_failure"];
    match (f["version"].as_u64(), f["kept"].as_u64()) {
        (Some(v), Some(kept)) => look.bad(&format!("v{v} FAILED (kept v{kept})")),
        _ => s(&n["config_version"]),
    }
}

fn explain(v: &Value) -> String {
    let mut out = format!(
        "model {} ({} request) on node {} at decision version {}\n",
        s(&v["model"]),
        s(&v["class"]),
        s(&v["node"]),
        s(&v["decision_version"]),
    );
    let _ = writeln!(out, "home: {} ({})", s(&v["home"]), s(&v["home_why"]));
    let _ = writeln!(
        out,
        "effective zone: {} ({})",
        s(&v["effective_zone"]),
        s(&v["effective_why"])
    );
    let withheld: Vec<String> = v["withheld_zones"]
        .as_array()
        .map(|z| z.iter().map(s).collect())
        .unwrap_or_default();
    let cross = if v["may_cross_zones"] == true {
        "yes".to_owned()
    } else if withheld.is_empty() {
        "no (no other active zone)".to_owned()
    } else {
        format!(
            "no ({} withheld for this request class)",
            withheld.join(",")
        )
    };
    let _ = writeln!(out, "may cross zones: {cross}");
    let fallbacks: Vec<String> = v["fallback_models"]
        .as_array()
        .map(|m| m.iter().map(s).collect())
        .unwrap_or_default();
    if !fallbacks.is_empty() {
        let _ = writeln!(out, "fallback models: {}", fallbacks.join(" → "));
    }
    if let Some(rule) = v["rule"]["rule"].as_str() {
        let _ = writeln!(out, "rule: {rule} → {}", s(&v["rule"]["route_to"]));
    }
    let mut list = Vec::new();
    if let Some(zones) = v["zones"].as_array() {
        for (i, z) in zones.iter().enumerate() {
            for b in z["backends"].as_array().into_iter().flatten() {
                list.push(vec![
                    (i + 1).to_string(),
                    s(&z["zone"]),
                    s(&b["name"]),
                    s(&b["state"]),
                    s(&b["weight"]),
                    s(&b["effective_weight"]),
                    s(&b["in_flight"]),
                ]);
            }
        }
    }
    out.push('\n');
    out.push_str(&table(
        &[
            "ORDER",
            "ZONE",
            "BACKEND",
            "STATE",
            "WEIGHT",
            "EFFECTIVE",
            "IN_FLIGHT",
        ],
        &list,
    ));
    let _ = writeln!(out, "note: {}", s(&v["note"]));
    out
}

fn zones_of(d: &Value) -> String {
    let zones: Vec<String> = d["zones"]
        .as_array()
        .map(|z| z.iter().map(s).collect())
        .unwrap_or_default();
    zones.join(",")
}

/// A dry run: the target (and who chose it), what moves, the rules
/// checked, and the command that undoes it.
pub fn dry_run(kind: &str, zones: &Value, v: &Value, chosen: Option<&str>, look: &Look) -> String {
    let mut out = String::new();
    if let Some(to) = chosen {
        let _ = writeln!(
            out,
            "target: {to} (the leader's choice: the zone its detector would pick, the healthiest active zone)"
        );
    }
    out.push_str(&preview(v));
    // A leader before the quota lines sends none: say nothing then.
    if let Some(lines) = v["quota_overflow"].as_array() {
        if lines.is_empty() {
            out.push_str(
                "quota overflow: none (no tenant with a quota would draw on another zone)\n",
            );
        } else {
            out.push_str("quota overflow (the target's limits take the failed zone's share; global caps kept):\n");
            for l in lines {
                let _ = writeln!(out, "  {}", s(&l["line"]));
            }
        }
    }
    let _ = writeln!(out, "rules checked: {} (all passed)", RULES.join(", "));
    let version = v["preview"]["version"].as_u64().unwrap_or(0);
    if let Some(undo) = undo(kind, zones, &v["preview"]["changes"], version) {
        let _ = writeln!(out, "undo: {}", look.paint("1", &undo));
    }
    out
}

/// What a committed zone decision says, with the command that undoes it.
pub fn committed(
    kind: &str,
    zones: &Value,
    v: &Value,
    changes: &Value,
    chosen: Option<&str>,
    look: &Look,
) -> String {
    let mut out = String::new();
    if let Some(to) = chosen {
        let _ = writeln!(out, "target: {to} (the leader's choice)");
    }
    let _ = writeln!(
        out,
        "committed: {} as decision version {}",
        s(&v["kind"]),
        s(&v["version"])
    );
    let version = v["version"].as_u64().unwrap_or(0);
    if let Some(moved) = moved(kind, zones) {
        let _ = writeln!(out, "moved: {moved}");
        let _ = writeln!(
            out,
            "next: with tenant quotas, the leader rebalances them in a decision of its own (version {} or later: `zonegate ctl decisions --all`); `zonegate ctl status` shows traffic per zone",
            version.saturating_add(1)
        );
    }
    if let Some(undo) = undo(kind, zones, changes, version) {
        let _ = writeln!(out, "undo: {}", look.paint("1", &undo));
    }
    out
}

/// What a committed zone decision moved, in words.
fn moved(kind: &str, zones: &Value) -> Option<String> {
    match kind {
        "failover" => Some(format!(
            "traffic homed in {} now goes to {}",
            zones["from"].as_str()?,
            zones["to"].as_str()?
        )),
        "failback" => {
            let z = zones["zone"].as_str()?;
            Some(format!("{z} serves its own traffic again"))
        }
        _ => None,
    }
}

/// The safety rules an operator's zone decision is checked against.
const RULES: &[&str] = &[
    "unknown_zone",
    "same_zone",
    "target_not_active",
    "already_failed_over",
    "not_failed_over",
    "last_serving_zone",
    "stale_version",
];

/// The command that reverts a zone decision applied as `version`.
fn undo(kind: &str, zones: &Value, changes: &Value, version: u64) -> Option<String> {
    match kind {
        "failover" => Some(format!(
            "zonegate ctl failback --zone {} --if-version {version}",
            zones["from"].as_str()?
        )),
        "failback" => {
            let zone = zones["zone"].as_str()?;
            // The target it had before, from the preview when there is one.
            let before = changes
                .as_array()
                .and_then(|c| c.iter().find(|c| c["zone"] == zone))
                .and_then(|c| c["before"]["target"].as_str());
            Some(match before {
                Some(to) => {
                    format!("zonegate ctl failover --from {zone} --to {to} --if-version {version}")
                }
                None => format!("zonegate ctl failover --from {zone} --if-version {version}"),
            })
        }
        _ => None,
    }
}

/// The dwell in words: what it holds back (the automation), and what it
/// does not (operators).
fn dwell_words(name: &str, st: &Value, outlook: &Value) -> Option<String> {
    let ms = outlook["dwell_left_ms"].as_u64().filter(|ms| *ms > 0)?;
    let what = if st["status"] == "failed_over" {
        format!("automatic failback of {name}")
    } else {
        format!("automatic decisions on {name}")
    };
    Some(format!(
        "{what} allowed in {} (dwell after the last decision); operators may act now",
        human_ms(ms)
    ))
}

/// Per-zone traffic from the leader's reports, or nothing when the node
/// asked is not the leader.
fn traffic(t: &Value) -> String {
    let Some(zones) = t["zones"].as_object().filter(|z| !z.is_empty()) else {
        return String::new();
    };
    let pct = |v: &Value| {
        v.as_f64()
            .map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
    };
    let list: Vec<Vec<String>> = zones
        .iter()
        .map(|(zone, z)| {
            vec![
                zone.clone(),
                z["requests_per_s"]
                    .as_f64()
                    .map_or("-".into(), |x| format!("{x:.1}")),
                format!("{:.0}%", z["share"].as_f64().unwrap_or(0.0) * 100.0),
                pct(&z["gw_error_rate"]),
                pct(&z["timeout_rate"]),
            ]
        })
        .collect();
    let period = t["period_ms"].as_u64().map_or("-".into(), human_ms);
    format!(
        "
traffic (every node's report to the leader, last {period} period):
{}",
        table(&["ZONE", "REQ/S", "SHARE", "ERRORS", "TIMEOUTS"], &list)
    )
}

fn zone_row(name: &str, st: &Value, outlook: &Value) -> Vec<String> {
    let score = st["score"]
        .as_f64()
        .map_or("-".into(), |x| format!("{x:.2}"));
    let bad = st["bad_periods"].as_u64().unwrap_or(0);
    let periods = match outlook["min_periods"].as_u64() {
        Some(min) if bad > 0 => format!("{bad} of {min} bad"),
        Some(_) => "0 bad".into(),
        None if bad > 0 => format!("{bad} bad"),
        None => String::new(),
    };
    let dwell = match outlook["dwell_left_ms"].as_u64() {
        Some(ms) if ms > 0 => format!("{} left", human_ms(ms)),
        _ => String::new(),
    };
    vec![
        name.to_owned(),
        s(&st["status"]),
        s(&st["target"]),
        score,
        periods,
        dwell,
    ]
}

fn backends(v: &Value) -> String {
    let list = rows(&v["backends"], |b| {
        [
            "name",
            "zone",
            "state",
            "score",
            "in_flight",
            "latency_ewma_ms",
            "url",
        ]
        .iter()
        .map(|k| s(&b[*k]))
        .collect()
    });
    let header = [
        "BACKEND",
        "ZONE",
        "STATE",
        "SCORE",
        "IN_FLIGHT",
        "LATENCY_MS",
        "URL",
    ];
    table(&header, &list)
}

/// One row per tenant, zone and node: the allocation; then this node's
/// usage per tenant and the overflow lines.
fn quotas(v: &Value) -> String {
    let unit = |l: &Value, k: &str| match l[k].as_u64() {
        Some(n) => n.to_string(),
        None => "-".into(),
    };
    let mut rows_out = Vec::new();
    for t in v["tenants"].as_array().into_iter().flatten() {
        if t["limited"] != Value::Bool(true) {
            rows_out.push(vec![
                s(&t["tenant"]),
                s(&t["priority"]),
                "-".into(),
                "-".into(),
                "-".into(),
                "unlimited".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
            continue;
        }
        for z in t["zones"].as_array().into_iter().flatten() {
            for n in z["nodes"].as_array().into_iter().flatten() {
                let share = z["share"].as_f64().unwrap_or(0.0);
                rows_out.push(vec![
                    s(&t["tenant"]),
                    s(&t["priority"]),
                    s(&z["zone"]),
                    format!("{:.0}%", share * 100.0),
                    s(&n["node"]),
                    s(&z["mode"]),
                    unit(&n["limits"], "rpm"),
                    unit(&n["limits"], "tpm"),
                    unit(&n["limits"], "concurrency"),
                ]);
            }
        }
    }
    let mut out = format!(
        "decision version {} (node {} in {})\n",
        s(&v["decision_version"]),
        s(&v["node"]),
        s(&v["zone"])
    );
    out.push_str(&table(
        &[
            "TENANT",
            "PRIORITY",
            "ZONE",
            "SHARE",
            "NODE",
            "MODE",
            "RPM",
            "TPM",
            "CONCURRENCY",
        ],
        &rows_out,
    ));
    let usage = rows(&v["tenants"], |t| {
        let u = &t["usage"];
        vec![
            s(&t["tenant"]),
            s(&t["global"]["rpm"]),
            s(&t["global"]["tpm"]),
            s(&t["global"]["concurrency"]),
            s(&u["in_flight"]),
            s(&u["admitted_total"]),
            u["rejected_total"]
                .as_object()
                .filter(|m| !m.is_empty())
                .map_or("-".into(), |m| {
                    m.iter()
                        .map(|(k, n)| format!("{k}={n}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                }),
        ]
    });
    out.push_str(&format!("\nthis node ({}):\n", s(&v["node"])));
    out.push_str(&table(
        &[
            "TENANT",
            "GLOBAL_RPM",
            "GLOBAL_TPM",
            "GLOBAL_CONC",
            "IN_FLIGHT",
            "ADMITTED",
            "REJECTED",
        ],
        &usage,
    ));
    for t in v["tenants"].as_array().into_iter().flatten() {
        for o in t["overflow"].as_array().into_iter().flatten() {
            out.push_str(&format!("{}\n", s(&o["line"])));
        }
    }
    out.push_str(&foreign_allocations(v));
    out
}

/// Why a node holds another zone's allocation: its own zone failed over
/// there, so the traffic entering it is answered by that zone's backends.
/// Node zones and zone states come from `v["cluster"]` (added by `ctl`).
fn foreign_allocations(v: &Value) -> String {
    let node_zone = |id: &Value| {
        v["cluster"]["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["id"] == *id)
            .and_then(|n| n["zone"].as_str())
    };
    let mut lines = std::collections::BTreeSet::new();
    for t in v["tenants"].as_array().into_iter().flatten() {
        for z in t["zones"].as_array().into_iter().flatten() {
            let zone = z["zone"].as_str().unwrap_or("-");
            for n in z["nodes"].as_array().into_iter().flatten() {
                let Some(home) = node_zone(&n["node"]).filter(|h| *h != zone) else {
                    continue;
                };
                let st = &v["cluster"]["zones"][home];
                let why = if st["status"] == "failed_over" && st["target"] == zone {
                    format!("{home}, failed over to {zone}")
                } else {
                    home.to_owned()
                };
                lines.insert(format!(
                    "node {} ({why}) holds {zone}'s allocation in {}: the traffic entering it is answered in {zone}\n",
                    s(&n["node"]),
                    s(&z["mode"]),
                ));
            }
        }
    }
    lines.into_iter().collect()
}

fn decisions(v: &Value, look: &Look) -> String {
    let list = rows(&v["decisions"], |d| {
        vec![
            s(&d["version"]),
            s(&d["kind"]),
            zones_of(d),
            s(&d["actor"]),
            d["at_ms"]
                .as_u64()
                .map_or("-".into(), |t| when(t, look.now_ms)),
            s(&d["reason"]),
        ]
    });
    table(
        &["VERSION", "KIND", "ZONES", "ACTOR", "AT (UTC)", "REASON"],
        &list,
    )
}

fn preview(v: &Value) -> String {
    let changes = rows(&v["preview"]["changes"], |c| {
        let st = |x: &Value| match x["target"].as_str() {
            Some(t) => format!("{} → {t}", s(&x["status"])),
            None => s(&x["status"]),
        };
        vec![s(&c["zone"]), st(&c["before"]), st(&c["after"])]
    });
    format!(
        "dry run: would apply as version {}\n{}",
        s(&v["preview"]["version"]),
        table(&["ZONE", "BEFORE", "AFTER"], &changes)
    )
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One table row per element of a JSON array.
fn rows(list: &Value, cells: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array()
        .map(|l| l.iter().map(cells).collect())
        .unwrap_or_default()
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect(), &mut out);
    for r in rows {
        line(r.clone(), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_renders_zones_and_nodes() {
        let v = json!({
            "node_id": 1, "zone": "az-a", "role": "voter", "control_plane": "raft", "leader": 2,
            "term": 3, "decision_version": 7, "automation": "auto",
            "zones": {"az-a": {"status": "failed_over", "target": "az-b"}, "az-b": {"status": "active"}},
            "nodes": [{"id": 1, "zone": "az-a", "role": "voter", "decision_version": 7, "reachable": true, "leader": false}]
        });
        let out = render(&Verb::Status, &v);
        assert!(out.contains("leader: 2"), "{out}");
        assert!(out.contains("az-a  failed_over  az-b"), "{out}");
        assert!(out.contains("az-b  active"), "{out}");
        assert!(out.contains("NODE  ZONE  ROLE"), "{out}");
        let v2 = json!({"zones": {"az-a": {"status": "active", "score": 0.31, "bad_periods": 2}}});
        let out = render(&Verb::Status, &v2);
        assert!(out.contains("0.31") && out.contains("2 bad"), "{out}");
    }

    #[test]
    fn status_shows_a_node_that_could_not_apply_the_committed_config() {
        let v = json!({
            "zones": {},
            "nodes": [
                {"id": 1, "zone": "az-a", "role": "voter", "decision_version": 9, "config_version": 8,
                 "config_failure": null, "reachable": true, "leader": true},
                {"id": 2, "zone": "az-b", "role": "voter", "decision_version": 9, "config_version": 7,
                 "config_failure": {"version": 8, "kept": 7, "reason": "too costly"},
                 "reachable": true, "leader": false}
            ]
        });
        let out = render(&Verb::Status, &v);
        let row = |id: &str| {
            out.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(row("2 ").contains("v8 FAILED (kept v7)"), "{out}");
        assert!(!row("1 ").contains("FAILED"), "{out}");
        assert!(row("1 ").contains(" 8 "), "{out}");
    }

    #[test]
    fn quotas_render_allocations_usage_and_overflow() {
        let v = json!({
            "node": 2, "zone": "az-b", "decision_version": 5,
            "tenants": [
                {"tenant": "deptA", "priority": "P0", "limited": true,
                 "global": {"rpm": 600, "tpm": null, "concurrency": 10},
                 "zones": [{"zone": "az-b", "share": 0.5, "mode": "soft_limit", "overflow_from": ["az-a"],
                            "nodes": [{"node": 2, "limits": {"rpm": 600, "tpm": null, "concurrency": 10}}]}],
                 "overflow": [{"line": "cross_zone overflow tenant=deptA from=az-a to=az-b mode=soft_limit priority=P0 version=5"}],
                 "usage": {"in_flight": 1, "admitted_total": 42, "rejected_total": {"rpm": 3}}},
                {"tenant": "free", "priority": "P1", "limited": false, "global": {}, "zones": [],
                 "overflow": [], "usage": {"in_flight": 0, "admitted_total": 7, "rejected_total": {}}}
            ]
        });
        let out = render(&Verb::Quotas, &v);
        assert!(out.contains("decision version 5"), "{out}");
        assert!(out.contains("soft_limit"), "{out}");
        assert!(out.contains("600"), "{out}");
        assert!(out.contains("rpm=3"), "{out}");
        assert!(out.contains("unlimited"), "{out}");
        assert!(
            out.contains("cross_zone overflow tenant=deptA from=az-a to=az-b"),
            "{out}"
        );
    }

    #[test]
    fn status_says_what_dwell_holds_back_and_where_traffic_goes() {
        let v = json!({
            "zones": {"az-a": {"status": "failed_over", "target": "az-b"}, "az-b": {"status": "active"}},
            "outlook": {
                "zones": {"az-a": {"dwell_left_ms": 56_000}, "az-b": {"dwell_left_ms": 0}},
                "traffic": {"period_ms": 2000, "zones": {
                    "az-a": {"requests_per_s": 0.0, "share": 0.0, "gw_error_rate": null, "timeout_rate": null},
                    "az-b": {"requests_per_s": 12.5, "share": 1.0, "gw_error_rate": 0.02, "timeout_rate": 0.0}
                }}
            }
        });
        let out = render(&Verb::Status, &v);
        assert!(
            out.contains("az-a: automatic failback of az-a allowed in 56s (dwell after the last decision); operators may act now"),
            "{out}"
        );
        assert!(!out.contains("az-b: automatic"), "{out}");
        assert!(
            out.contains("ZONE  REQ/S  SHARE  ERRORS  TIMEOUTS"),
            "{out}"
        );
        assert!(out.contains("az-b  12.5   100%   2.0%    0.0%"), "{out}");
    }

    #[test]
    fn quotas_say_why_a_node_holds_another_zones_allocation() {
        let v = json!({
            "node": 1, "zone": "az-a", "decision_version": 3,
            "tenants": [{"tenant": "deptA", "priority": "P0", "limited": true, "global": {"rpm": 600},
                "zones": [{"zone": "az-b", "share": 0.5, "mode": "soft_limit",
                           "nodes": [{"node": 1, "limits": {"rpm": 300}}, {"node": 2, "limits": {"rpm": 300}}]}],
                "overflow": [], "usage": {}}],
            "cluster": {
                "zones": {"az-a": {"status": "failed_over", "target": "az-b"}, "az-b": {"status": "active"}},
                "nodes": [{"id": 1, "zone": "az-a"}, {"id": 2, "zone": "az-b"}]
            }
        });
        let out = render(&Verb::Quotas, &v);
        assert!(
            out.contains(
                "node 1 (az-a, failed over to az-b) holds az-b's allocation in soft_limit"
            ),
            "{out}"
        );
        assert!(
            !out.contains("node 2 ("),
            "a node in its own zone needs no line: {out}"
        );
    }

    /// A failover's dry run names the tenants whose quota would overflow
    /// into the target, says so when none would, and says nothing when
    /// the leader sent no quota lines (an older version).
    #[test]
    fn a_dry_run_shows_the_quota_overflow_it_would_cause() {
        let zones = json!({"from": "az-a", "to": "az-b"});
        let line = "cross_zone overflow tenant=deptA from=az-a to=az-b mode=soft_limit priority=P0 version=8";
        let v = |overflow: Option<Value>| {
            let mut v = json!({"dry_run": true, "would_apply": true, "preview": {
                "version": 8, "kind": "failover", "automation": "auto",
                "changes": [{"zone": "az-a", "before": {"status": "active"},
                             "after": {"status": "failed_over", "target": "az-b"}}]}});
            if let Some(o) = overflow {
                v["quota_overflow"] = o;
            }
            v
        };
        let look = Look::plain(0);
        let entry = json!({"tenant": "deptA", "from": "az-a", "to": "az-b", "priority": "P0", "line": line});
        let out = dry_run("failover", &zones, &v(Some(json!([entry]))), None, &look);
        assert!(out.contains("quota overflow (the target's limits"), "{out}");
        assert!(out.contains(&format!("  {line}\n")), "{out}");
        assert!(
            out.contains("undo: zonegate ctl failback --zone az-a --if-version 8"),
            "{out}"
        );
        let out = dry_run("failover", &zones, &v(Some(json!([]))), None, &look);
        assert!(out.contains("quota overflow: none"), "{out}");
        let out = dry_run("failover", &zones, &v(None), None, &look);
        assert!(!out.contains("quota overflow"), "{out}");
    }

    #[test]
    fn a_committed_failover_says_what_moved_and_what_comes_next() {
        let zones = json!({"from": "az-a", "to": "az-b"});
        let out = committed(
            "failover",
            &zones,
            &json!({"kind": "failover", "version": 2}),
            &Value::Null,
            None,
            &Look::plain(0),
        );
        assert!(
            out.contains("moved: traffic homed in az-a now goes to az-b"),
            "{out}"
        );
        assert!(out.contains("the leader rebalances them"), "{out}");
        assert!(out.contains("version 3 or later"), "{out}");
    }

    #[test]
    fn committed_decision_renders_its_version() {
        let verb = Verb::Freeze { reason: None };
        let out = render(
            &verb,
            &json!({"version": 4, "kind": "freeze", "committed": true}),
        );
        assert_eq!(out, "committed: freeze as decision version 4\n");
    }
}
