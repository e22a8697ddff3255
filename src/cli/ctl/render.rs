//! `zonegate ctl`'s tables: one function per answer, columns left-aligned.

use std::fmt::Write as _;

use serde_json::Value;

use super::Verb;

/// The human rendering of an answer.
pub fn render(verb: &Verb, v: &Value) -> String {
    match verb {
        Verb::Status => status(v),
        Verb::Backends => backends(v),
        Verb::Decisions { .. } => decisions(v),
        Verb::Failover { opts, .. } | Verb::Failback { opts, .. } if opts.dry_run => preview(v),
        _ => format!(
            "committed: {} as decision version {}\n",
            s(&v["kind"]),
            s(&v["version"])
        ),
    }
}

fn status(v: &Value) -> String {
    let mut out = format!(
        "node {} ({}, {})  control plane: {}  leader: {}  term: {}  decision version: {}  automation: {}\n\n",
        s(&v["node_id"]),
        s(&v["zone"]),
        s(&v["role"]),
        s(&v["control_plane"]),
        s(&v["leader"]),
        s(&v["term"]),
        s(&v["decision_version"]),
        s(&v["automation"]),
    );
    let zones: Vec<Vec<String>> = v["zones"]
        .as_object()
        .map(|z| z.iter().map(|(name, st)| zone_row(name, st)).collect())
        .unwrap_or_default();
    out.push_str(&table(
        &["ZONE", "STATUS", "TARGET", "SCORE", "PERIODS"],
        &zones,
    ));
    let nodes = rows(&v["nodes"], |n| {
        let leader = if n["leader"] == true { "*" } else { "" };
        // A node whose view is older than a few election timeouts routes
        // with its last decisions (fail static); say so.
        let view = match (n["stale"].as_bool(), n["view_age_ms"].as_u64()) {
            (Some(true), Some(ms)) => format!("STALE ({:.1}s)", ms as f64 / 1000.0),
            (Some(true), None) => "STALE (no leader yet)".into(),
            (Some(false), _) => "fresh".into(),
            _ => "-".into(),
        };
        vec![
            s(&n["id"]),
            s(&n["zone"]),
            s(&n["role"]),
            s(&n["decision_version"]),
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
                "REACHABLE",
                "VIEW",
                "LEADER",
            ],
            &nodes,
        ));
    }
    out
}

fn zone_row(name: &str, st: &Value) -> Vec<String> {
    let score = st["score"]
        .as_f64()
        .map_or("-".into(), |x| format!("{x:.2}"));
    let bad = match st["bad_periods"].as_u64() {
        Some(n) if n > 0 => format!("{n} bad"),
        _ => String::new(),
    };
    vec![
        name.to_owned(),
        s(&st["status"]),
        s(&st["target"]),
        score,
        bad,
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

fn decisions(v: &Value) -> String {
    let list = rows(&v["decisions"], |d| {
        let zones: Vec<String> = d["zones"]
            .as_array()
            .map(|z| z.iter().map(s).collect())
            .unwrap_or_default();
        vec![
            s(&d["version"]),
            s(&d["kind"]),
            zones.join(","),
            s(&d["actor"]),
            s(&d["at_ms"]),
            s(&d["reason"]),
        ]
    });
    table(
        &["VERSION", "KIND", "ZONES", "ACTOR", "AT_MS", "REASON"],
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
    fn committed_decision_renders_its_version() {
        let verb = Verb::Freeze { reason: None };
        let out = render(
            &verb,
            &json!({"version": 4, "kind": "freeze", "committed": true}),
        );
        assert_eq!(out, "committed: freeze as decision version 4\n");
    }
}
