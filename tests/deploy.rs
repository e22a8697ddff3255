//! `deploy/` checked: the alert rules with promtool (syntax and unit
//! tests), the compose file and Kubernetes manifests for the invariants a
//! three-zone cluster needs, the systemd unit with systemd-analyze, and
//! the Grafana board against a running node's `/metrics`.
//!
//! Tools are installed by `.ci/run`. A missing tool fails the test (CI
//! must not pass without running it) unless `ZONEGATE_SKIP_TOOL_TESTS=1`
//! says, loudly, that this machine cannot run them.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The path of `name` on PATH; panics when it is missing unless tool
/// tests are explicitly skipped (then `None`).
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() && std::env::var("ZONEGATE_SKIP_TOOL_TESTS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: `{name}` is not installed and ZONEGATE_SKIP_TOOL_TESTS=1");
        return None;
    }
    Some(found.unwrap_or_else(|| {
        panic!("`{name}` is not installed: run the install lines of .ci/run (or set ZONEGATE_SKIP_TOOL_TESTS=1 to skip, loudly)")
    }))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = root().join("deploy/prometheus");
    let out = run(Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(dir.join("alerts.yml")));
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run(Command::new(&promtool)
        .current_dir(&dir)
        .arg("test")
        .arg("rules")
        .arg("alerts.test.yml"));
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every alert has a summary, a description, and a runbook section that
/// exists in deploy/RUNBOOK.md; the required alerts are all there.
#[test]
fn every_alert_has_annotations_and_a_runbook_section() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read(&root().join("deploy/prometheus/alerts.yml"))).unwrap();
    let runbook = read(&root().join("deploy/RUNBOOK.md"));
    let anchors: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase().replace(' ', "-"))
        .collect();
    let tests = read(&root().join("deploy/prometheus/alerts.test.yml"));
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            alerts.push(name.to_owned());
            let a = &rule["annotations"];
            for key in ["summary", "description", "runbook"] {
                assert!(
                    a[key].as_str().is_some_and(|s| !s.is_empty()),
                    "{name} lacks {key}"
                );
            }
            let anchor = a["runbook"]
                .as_str()
                .unwrap()
                .strip_prefix("deploy/RUNBOOK.md#")
                .unwrap_or_else(|| panic!("{name}: runbook must point into deploy/RUNBOOK.md"));
            assert!(
                anchors.iter().any(|h| h == anchor),
                "{name}: no section `## …` for #{anchor} in RUNBOOK.md"
            );
            assert!(
                ["page", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{name}: severity"
            );
        }
    }
    for required in [
        "ZonegateNoRaftLeader",
        "ZonegateLeaderFlapping",
        "ZonegateViewStale",
        "ZonegateDecisionVersionsDiverged",
        "ZonegateZoneFailedOver",
        "ZonegateZoneFailedOverTooLong",
        "ZonegateFailStatic",
        "ZonegateEjectionStorm",
        "ZonegateBreakerOpen",
        "ZonegateErrorBudgetBurnFast",
        "ZonegateErrorBudgetBurnSlow",
        "ZonegateNearFileDescriptorLimit",
    ] {
        assert!(alerts.iter().any(|a| a == required), "{required} missing");
    }
    for tested in ["ZonegateNoRaftLeader", "ZonegateViewStale"] {
        assert!(
            tests.contains(&format!("alertname: {tested}")),
            "{tested} has no promtool test"
        );
    }
}

/// Every metric an alert or recording rule reads is declared in the
/// metrics table (or a standard `process_*`/`up`), so a rename cannot
/// silently blind an alert.
#[test]
fn alert_expressions_read_declared_metrics() {
    let rules = read(&root().join("deploy/prometheus/alerts.yml"));
    let declared: Vec<&str> = zonegate::telemetry::metrics::DECLARED
        .iter()
        .map(|(n, _, _)| *n)
        .collect();
    let names = metric_names(&rules);
    assert!(names.len() >= 12, "the alerts read {names:?}");
    for name in names {
        assert!(
            declared.contains(&name.as_str())
                || ["up", "process_open_fds", "process_max_fds"].contains(&name.as_str()),
            "alerts.yml reads `{name}`, which no node exports"
        );
    }
}

/// Metric names in PromQL text: `zonegate_*`, `process_*` and `up`
/// identifiers (recording-rule names `zonegate:...` excluded).
pub fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &text[start..i];
            let metric = (word.starts_with("zonegate_") || word.starts_with("process_"))
                && !word.contains(':');
            if metric || word == "up" && text[i..].starts_with('{') {
                let name = word
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_count")
                    .trim_end_matches("_sum");
                let name = if word.ends_with("_seconds_bucket")
                    || word.ends_with("_seconds_count")
                    || word.ends_with("_seconds_sum")
                {
                    name
                } else {
                    word
                };
                if !out.iter().any(|n: &String| n == name) {
                    out.push(name.to_owned());
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// docs/metrics.md documents exactly the declared metrics, each with the
/// type the table gives it.
#[test]
fn metrics_doc_lists_every_declared_metric() {
    let doc = read(&root().join("docs/metrics.md"));
    let rows: Vec<(&str, &str)> = doc
        .lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let name = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name, cells.next()?))
        })
        .filter(|(n, _)| n.starts_with("zonegate_"))
        .collect();
    for (name, kind, _) in zonegate::telemetry::metrics::DECLARED {
        assert!(
            rows.contains(&(*name, kind.prometheus_type())),
            "docs/metrics.md lacks `{name}` ({})",
            kind.prometheus_type()
        );
    }
    assert_eq!(
        rows.len(),
        zonegate::telemetry::metrics::DECLARED.len(),
        "{rows:?}"
    );
}
