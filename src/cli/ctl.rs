//! `zonegate ctl`: the operators' client for the admin API. Tables for
//! people, `--json` for scripts; a refused decision exits non-zero with the
//! safety rule's name in the message.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

/// One `ctl` verb and its arguments.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Verb {
    /// Cluster status: leader, term, decision version, zones, nodes.
    Status,
    /// Backends as this node sees them.
    Backends,
    /// The decision history, newest first.
    Decisions {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Move the traffic homed in one zone to another.
    Failover {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Give a failed-over zone its own traffic back.
    Failback {
        #[arg(long)]
        zone: String,
        #[command(flatten)]
        opts: DecideOpts,
    },
    /// Stop automatic decisions (operators still decide).
    Freeze {
        #[arg(long)]
        reason: Option<String>,
    },
    /// Allow automatic decisions again.
    Unfreeze {
        #[arg(long)]
        reason: Option<String>,
    },
}

/// What every zone decision takes besides its zones.
#[derive(Debug, Clone, clap::Args)]
pub struct DecideOpts {
    /// Why, for the decision history and the audit log.
    #[arg(long)]
    reason: Option<String>,
    /// Refuse unless the current decision version is this one.
    #[arg(long)]
    if_version: Option<u64>,
    /// Show what would move, or which rule would refuse it.
    #[arg(long)]
    dry_run: bool,
}

/// Runs one verb against `admin` (a URL like `http://127.0.0.1:9090`).
/// Prints the result; an error names why (and the rule, for a refusal).
pub async fn run(
    admin: &str,
    token: Option<&str>,
    json_out: bool,
    verb: Verb,
) -> anyhow::Result<()> {
    let admin = admin.trim_end_matches('/');
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build an HTTP client")?;
    let (method, path, body) = request_of(&verb);
    let mut req = client.request(method, format!("{admin}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach {admin}"))?;
    let status = resp.status();
    let text = resp.text().await.context("the answer was cut off")?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|_| anyhow!("{admin} answered {status} with a non-JSON body: {text}"))?;
    if !status.is_success() {
        let err = &value["error"];
        let code = err["code"].as_str().unwrap_or("error");
        let message = err["message"].as_str().unwrap_or(&text);
        if json_out {
            println!("{value}");
        }
        if message.contains(code) {
            bail!("{message} (HTTP {status})");
        }
        bail!("{code}: {message} (HTTP {status})");
    }
    if json_out {
        println!("{value}");
    } else {
        print!("{}", render(&verb, &value));
    }
    Ok(())
}

fn request_of(verb: &Verb) -> (reqwest::Method, String, Option<Value>) {
    use reqwest::Method;
    match verb {
        Verb::Status => (Method::GET, "/admin/v1/cluster".into(), None),
        Verb::Backends => (Method::GET, "/admin/v1/backends".into(), None),
        Verb::Decisions { limit } => (
            Method::GET,
            format!("/admin/v1/decisions?limit={limit}"),
            None,
        ),
        Verb::Failover { from, to, opts } => (
            Method::POST,
            "/admin/v1/failover".into(),
            Some(opts.body(json!({"from": from, "to": to}))),
        ),
        Verb::Failback { zone, opts } => (
            Method::POST,
            "/admin/v1/failback".into(),
            Some(opts.body(json!({"zone": zone}))),
        ),
        Verb::Freeze { reason } => (
            Method::POST,
            "/admin/v1/freeze".into(),
            Some(json!({"reason": reason})),
        ),
        Verb::Unfreeze { reason } => (
            Method::POST,
            "/admin/v1/unfreeze".into(),
            Some(json!({"reason": reason})),
        ),
    }
}

impl DecideOpts {
    fn body(&self, mut zones: Value) -> Value {
        zones["reason"] = json!(self.reason);
        zones["if_version"] = json!(self.if_version);
        zones["dry_run"] = json!(self.dry_run);
        zones
    }
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

/// The human rendering of an answer.
pub fn render(verb: &Verb, v: &Value) -> String {
    match verb {
        Verb::Status => {
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
                .map(|z| {
                    z.iter()
                        .map(|(name, st)| {
                            let score = st["score"]
                                .as_f64()
                                .map_or("-".into(), |x| format!("{x:.2}"));
                            let bad = match st["bad_periods"].as_u64() {
                                Some(n) if n > 0 => format!("{n} bad"),
                                _ => String::new(),
                            };
                            vec![name.clone(), s(&st["status"]), s(&st["target"]), score, bad]
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push_str(&table(
                &["ZONE", "STATUS", "TARGET", "SCORE", "PERIODS"],
                &zones,
            ));
            let nodes = rows(&v["nodes"], |n| {
                vec![
                    s(&n["id"]),
                    s(&n["zone"]),
                    s(&n["role"]),
                    s(&n["decision_version"]),
                    s(&n["reachable"]),
                    if n["leader"] == true {
                        "*".into()
                    } else {
                        String::new()
                    },
                ]
            });
            if !nodes.is_empty() {
                out.push('\n');
                out.push_str(&table(
                    &["NODE", "ZONE", "ROLE", "VERSION", "REACHABLE", "LEADER"],
                    &nodes,
                ));
            }
            out
        }
        Verb::Backends => {
            let list = rows(&v["backends"], |b| {
                vec![
                    s(&b["name"]),
                    s(&b["zone"]),
                    s(&b["state"]),
                    s(&b["score"]),
                    s(&b["in_flight"]),
                    s(&b["latency_ewma_ms"]),
                    s(&b["url"]),
                ]
            });
            table(
                &[
                    "BACKEND",
                    "ZONE",
                    "STATE",
                    "SCORE",
                    "IN_FLIGHT",
                    "LATENCY_MS",
                    "URL",
                ],
                &list,
            )
        }
        Verb::Decisions { .. } => {
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
        Verb::Failover { opts, .. } | Verb::Failback { opts, .. } if opts.dry_run => {
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
        _ => format!(
            "committed: {} as decision version {}\n",
            s(&v["kind"]),
            s(&v["version"])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
