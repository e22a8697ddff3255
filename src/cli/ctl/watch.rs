//! `zonegate ctl watch`: the cluster live. On a terminal it redraws the
//! status (with recent decisions) every interval; otherwise (a pipe, a
//! shared incident channel) it prints one line each time the cluster's
//! state changes. Ctrl-C stops it.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use super::render::{self, Look};
use super::{status_of, Api, Verb};

/// Polls `api` every `interval` seconds until Ctrl-C.
pub(crate) async fn run(
    api: &Api,
    interval: f64,
    json_out: bool,
    look: &Look,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let every = Duration::from_secs_f64(interval.clamp(0.1, 3600.0));
    let redraw = !json_out && std::io::stdout().is_terminal();
    let quiet = api.quiet();
    let mut last: Option<String> = None;
    loop {
        let now = crate::clock::unix_ms();
        let look = Look {
            now_ms: now,
            ..look.clone()
        };
        let polled = status_of(&quiet).await;
        if redraw {
            let mut screen = String::from("\x1b[2J\x1b[H");
            let _ = writeln!(
                screen,
                "zonegate ctl watch  {}  (Ctrl-C to stop)\n",
                render::when(now, now)
            );
            match &polled {
                Ok(v) => {
                    screen.push_str(&render::render_with(&Verb::Status, v, &look));
                    if let Ok(d) = quiet
                        .call(reqwest::Method::GET, "/admin/v1/decisions?limit=5", None)
                        .await
                    {
                        screen.push_str("\nrecent decisions:\n");
                        screen.push_str(&render::render_with(
                            &Verb::Decisions { limit: 5 },
                            &d,
                            &look,
                        ));
                    }
                }
                Err(e) => {
                    let _ = writeln!(screen, "{e:#}");
                }
            }
            print!("{screen}");
        } else {
            let line = match &polled {
                Ok(v) if json_out => summary_json(v).to_string(),
                Ok(v) => summary(v),
                Err(e) => format!("unreachable: {e:#}"),
            };
            if last.as_deref() != Some(line.as_str()) {
                if json_out {
                    println!("{line}");
                } else {
                    println!(
                        "{} {line}",
                        render::when(now, now).split(',').next().unwrap_or_default()
                    );
                }
                last = Some(line);
            }
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// One line of the state that matters in an incident (no scores or ages,
/// which change every period): leader, term, version, automation, zones,
/// each node's version and reachability.
pub fn summary(v: &Value) -> String {
    let mut out = format!(
        "leader {} term {} version {} automation {} |",
        render_s(&v["leader"]),
        render_s(&v["term"]),
        render_s(&v["decision_version"]),
        render_s(&v["automation"]),
    );
    if let Some(zones) = v["zones"].as_object() {
        for (name, z) in zones {
            let _ = match z["target"].as_str() {
                Some(t) => write!(out, " {name}={}→{t}", render_s(&z["status"])),
                None => write!(out, " {name}={}", render_s(&z["status"])),
            };
        }
    }
    out.push_str(" | nodes");
    if let Some(nodes) = v["nodes"].as_array() {
        for n in nodes {
            let reach = if n["reachable"] == false { "!" } else { "" };
            let stale = if n["stale"] == true { " STALE" } else { "" };
            let _ = write!(
                out,
                " {}:v{}{reach}{stale}",
                render_s(&n["id"]),
                render_s(&n["decision_version"])
            );
        }
    }
    out
}

/// The same as JSON, for `--json` (raw values).
fn summary_json(v: &Value) -> Value {
    serde_json::json!({
        "at_ms": crate::clock::unix_ms(),
        "leader": v["leader"],
        "term": v["term"],
        "decision_version": v["decision_version"],
        "automation": v["automation"],
        "zones": v["zones"].as_object().map(|z| z.iter().map(|(k, s)| (k.clone(), serde_json::json!({"status": s["status"], "target": s["target"]}))).collect::<serde_json::Map<_, _>>()),
        "nodes": v["nodes"].as_array().map(|n| n.iter().map(|n| serde_json::json!({"id": n["id"], "decision_version": n["decision_version"], "reachable": n["reachable"], "stale": n["stale"]})).collect::<Vec<_>>()),
    })
}

fn render_s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
