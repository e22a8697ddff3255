//! `zonegate ctl watch`: the cluster live. On a terminal it redraws the
//! status (with each zone's score trend, recent decisions and events)
//! every interval; otherwise (a pipe, a
//! shared incident channel) it prints one line each time the cluster's
//! state changes. Ctrl-C stops it.

use std::collections::{BTreeMap, VecDeque};
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
    let mut trends: BTreeMap<String, VecDeque<f64>> = BTreeMap::new();
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
                    record(&mut trends, v);
                    screen.push_str("\nscore trend (oldest to newest):\n");
                    for (zone, t) in &trends {
                        let _ = writeln!(screen, "  {zone:<10} {}", spark(t));
                    }
                    if let Ok(d) = quiet
                        .call(reqwest::Method::GET, "/admin/v1/decisions?limit=5", None)
                        .await
                    {
                        screen.push_str("\nrecent decisions:\n");
                        screen.push_str(&render::render_with(
                            &Verb::Decisions {
                                limit: 5,
                                all: false,
                            },
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

/// How many scores a zone's trend keeps.
const TREND: usize = 20;

/// Appends each zone's current score (0 when unscored) to its trend.
fn record(trends: &mut BTreeMap<String, VecDeque<f64>>, v: &Value) {
    for (zone, z) in v["zones"].as_object().into_iter().flatten() {
        let t = trends.entry(zone.clone()).or_default();
        t.push_back(z["score"].as_f64().unwrap_or(0.0));
        if t.len() > TREND {
            t.pop_front();
        }
    }
}

/// A sparkline of scores in [0, 1], with the latest value.
pub fn spark(t: &VecDeque<f64>) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let line: String = t
        .iter()
        .map(|x| BARS[((x.clamp(0.0, 1.0) * 7.0).round()) as usize])
        .collect();
    match t.back() {
        Some(x) => format!("{line} {x:.2}"),
        None => line,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summary_names_what_changes_in_an_incident() {
        let v = json!({
            "leader": 2, "term": 3, "decision_version": 1, "automation": "auto",
            "zones": {"az-a": {"status": "failed_over", "target": "az-b", "score": 0.1}, "az-b": {"status": "active"}},
            "nodes": [{"id": 1, "decision_version": 1, "reachable": true, "stale": false},
                      {"id": 3, "decision_version": 0, "reachable": false}]
        });
        assert_eq!(
            summary(&v),
            "leader 2 term 3 version 1 automation auto | az-a=failed_over→az-b az-b=active | nodes 1:v1 3:v0!"
        );
    }

    #[test]
    fn trend_is_a_sparkline_with_the_latest_score() {
        let t: VecDeque<f64> = [0.0, 0.5, 1.0].into_iter().collect();
        assert_eq!(spark(&t), "▁▅█ 1.00");
    }
}
