//! The five-minute tour runs as written. The tour is README.md's section
//! "A five-minute tour" between its `ANCHOR: tour` marks; the guide's
//! Tour chapter (docs/src/tour.md) includes that text, so this one test
//! runs both. Every command of its `sh` blocks runs in `sh` against a
//! `zonegate demo` listening on port 0 (the tour's 8080 and 9090, the
//! backend's PORT and `cargo run --release -q --` replaced by this build's
//! addresses and binary) and must exit as its comment says: 0, or the
//! `exit code N` it names, with the rule a `refused:` comment names.
//!
//! Needs `curl` (the tour's client): without it the test is skipped with
//! a note, unless `ZONEGATE_REQUIRE_TOOLS=1` (`.ci/run`).

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text between `ANCHOR: name` and `ANCHOR_END: name` of `text`.
fn anchored(text: &str, name: &str) -> String {
    let (start, end) = (format!("ANCHOR: {name} "), format!("ANCHOR_END: {name} "));
    let marks = |l: &str, m: &str| format!("{} ", l.trim()).contains(m);
    text.lines()
        .skip_while(|l| !marks(l, &start))
        .skip(1)
        .take_while(|l| !marks(l, &end))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One command of the tour: the shell line and what its comment expects.
#[derive(Debug, PartialEq)]
struct Step {
    line: String,
    /// The exit code (`exit code N` in its comment, else 0).
    exit: i32,
    /// The rule a `refused: rule` comment names, looked for on stderr.
    refused: Option<String>,
}

/// The commands of the `sh` blocks of `text`: continuation lines joined,
/// comment-only lines dropped, each with what its comment expects.
fn steps(text: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    let mut depth = 0usize;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        // A `for …; do` … `done` loop is one command, its lines kept.
        let opens = |l: &str| l.trim_end().ends_with("; do") || l.trim_end().ends_with("; then");
        let closes = |l: &str| matches!(l.trim(), "done" | "fi");
        if opens(line) {
            depth += 1;
        } else if closes(line) && depth > 0 {
            depth -= 1;
        }
        if depth > 0 {
            pending.push_str(line);
            pending.push('\n');
            continue;
        }
        let whole = format!("{pending}{line}");
        pending.clear();
        if whole.trim().is_empty() || whole.trim_start().starts_with('#') {
            continue;
        }
        // A comment starts at ` # ` outside quotes (the tour's quotes
        // never hold one).
        let (command, comment) = match whole.find(" # ") {
            Some(i) => (&whole[..i], &whole[i + 3..]),
            None => (whole.as_str(), ""),
        };
        let exit = comment
            .split("exit code ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let refused = comment
            .strip_prefix("refused: ")
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned);
        out.push(Step {
            line: command.trim_end().to_owned(),
            exit,
            refused,
        });
    }
    out
}

/// `alias name='value'` → `name() { value "$@"; }` (a script's `sh` does
/// not expand aliases).
fn alias_as_function(line: &str) -> Option<String> {
    let rest = line.strip_prefix("alias ")?;
    let (name, value) = rest.split_once('=')?;
    let value = value.trim_matches('\'');
    Some(format!("{name}() {{ {value} \"$@\"; }}"))
}

/// `NAME=value` with nothing after it: a shell variable for later lines.
fn is_assignment(line: &str) -> bool {
    line.split_once('=').is_some_and(|(name, value)| {
        !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
            && !value.contains(' ')
    })
}

fn curl_installed() -> bool {
    std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `script` in `sh` from `dir` with `HOME` there; returns (exit
/// code, stdout, stderr). `run_for`: it runs at most that long (`None`: until it
/// exits, within 120 s) and counts as exit 0 when still running then.
async fn sh(dir: &Path, script: &str, run_for: Option<Duration>) -> (i32, String, String) {
    let child = tokio::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .env("HOME", dir)
        .env_remove("ZONEGATE_ADMIN")
        .env_remove("ZONEGATE_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let limit = run_for.unwrap_or(Duration::from_secs(120));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(out) => {
            let out = out.unwrap();
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            // The whole group: `sh` and the command it runs. The `--` is
            // load-bearing: without it procps' kill(1) reads `-1234` as
            // options and sends kill(-1, SIGKILL), every process on the
            // machine (it took a CI run down when `sh` had pid 1xxxx).
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{pid}")])
                .status();
            assert!(run_for.is_some(), "`{script}` did not end within {limit:?}");
            (0, String::new(), String::new())
        }
    }
}

#[test]
fn the_tours_commands_are_read_with_their_expected_exits() {
    let text = "```sh\n# a comment\ncurl -s a \\\n  -d b\nzg x --y 2   # refused: some_rule (exit code 1)\n```\n```text\nnot a command\n```\n";
    assert_eq!(
        steps(text),
        vec![
            Step {
                line: "curl -s a   -d b".into(),
                exit: 0,
                refused: None
            },
            Step {
                line: "zg x --y 2".into(),
                exit: 1,
                refused: Some("some_rule".into())
            },
        ]
    );
    let looped = "```sh\nB=http://x\nfor i in $(seq 2); do\n  curl $B \\\n    -d c\ndone\n```\n";
    assert_eq!(
        steps(looped)
            .iter()
            .map(|s| s.line.as_str())
            .collect::<Vec<_>>(),
        vec![
            "B=http://x",
            "for i in $(seq 2); do\n  curl $B     -d c\ndone"
        ]
    );
    assert!(is_assignment("B=http://127.0.0.1:PORT") && !is_assignment("zg x --y=2"));
    assert_eq!(
        alias_as_function("alias zg='a b --c d'").as_deref(),
        Some("zg() { a b --c d \"$@\"; }")
    );
}

#[test]
fn the_guides_tour_chapter_is_the_readmes_tour() {
    let chapter = std::fs::read_to_string(root().join("docs/src/tour.md")).unwrap();
    assert!(
        chapter.contains("{{#include ../../README.md:tour}}"),
        "docs/src/tour.md must include the README's tour, the text this file runs"
    );
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    assert!(summary.contains("(tour.md)"), "the tour is in the book");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_of_the_five_minute_tour_runs_against_the_demo() {
    if !curl_installed() {
        assert!(
            std::env::var("ZONEGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "curl is not installed but ZONEGATE_REQUIRE_TOOLS=1"
        );
        eprintln!("skipped: the tour's commands need curl");
        return;
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let tour = anchored(&readme, "tour");
    let steps = steps(&tour);
    assert!(steps.len() >= 20, "the tour's commands: {steps:?}");

    let demo = Demo::start("error,openraft=off").await;
    let (data, admin) = (&demo.data, &demo.admin);
    let backend = demo.backends.first().expect("the demo prints its backends");
    // A reader starts the tour once the demo has run a few seconds: the
    // leader has zone scores, so `failover --from az-a` has a target.
    let outlook = format!("{admin}/admin/v1/outlook");
    eventually(
        Duration::from_secs(60),
        "a failover target for az-a",
        || {
            let (outlook, token) = (outlook.clone(), demo.admin_token.clone());
            async move {
                get_json(&outlook, Some(&token)).await["zones"]["az-a"]["failover_target"]
                    .is_string()
            }
        },
    )
    .await;
    let bin = bin().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    // Where the tour installs the bash completions.
    std::fs::create_dir_all(dir.path().join(".local/share/bash-completion/completions")).unwrap();
    let mut prelude = String::new();
    let mut version = None::<String>;
    let mut outputs = Vec::new();
    for step in &steps {
        let mut line = step
            .line
            .replace("http://127.0.0.1:8080", data)
            .replace("http://127.0.0.1:9090", admin)
            .replace("http://127.0.0.1:PORT", backend)
            .replace("cargo run --release -q --", &bin);
        if let Some(rest) = line.strip_prefix("zonegate ") {
            line = format!("{bin} {rest}");
        }
        if let Some(function) = alias_as_function(&line) {
            prelude.push_str(&function);
            prelude.push('\n');
            continue;
        }
        // `B=…`: a variable the next commands use.
        if is_assignment(&line) {
            prelude.push_str(&line);
            prelude.push('\n');
            continue;
        }
        // The tour's `--if-version 2` is the version its failover printed
        // ("say 2").
        if let Some(v) = &version {
            line = line.replace("--if-version 2", &format!("--if-version {v}"));
        }
        // `zg watch` redraws until stopped: it runs for 3 s.
        let run_for = line
            .starts_with("zg watch")
            .then_some(Duration::from_secs(3));
        if line.contains("man -l")
            && !std::process::Command::new("man")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        {
            eprintln!("skipped (no man): {line}");
            continue;
        }
        let started = std::time::Instant::now();
        let (code, out, err) = sh(dir.path(), &format!("{prelude}{line}"), run_for).await;
        let took = started.elapsed();
        assert_eq!(
            code, step.exit,
            "`{}` exited {code}, the tour says {}:\n{out}\n{err}",
            step.line, step.exit
        );
        if let Some(rule) = &step.refused {
            assert!(err.contains(rule), "`{}` names {rule}: {err}", step.line);
        }
        if line.starts_with("zg failover --from az-a --to az-b") {
            version = out
                .split("as decision version ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned);
            assert!(version.is_some(), "the failover prints its version: {out}");
        }
        outputs.push((step.line.clone(), out, took));
    }
    // What the tour says the reader sees.
    let said = |cmd: &str| {
        outputs
            .iter()
            .find(|(l, _, _)| l.contains(cmd))
            .map(|(_, out, took)| (out.clone(), *took))
            .unwrap_or_else(|| panic!("the tour runs `{cmd}`"))
    };
    let (first, _) = said("curl -si");
    assert!(
        first.contains("x-zonegate-zone") && first.contains("x-zonegate-decision-version"),
        "{first}"
    );
    // 80 requests over this node's part of 600 a minute: 200 a minute
    // (a burst of about 17) before the leader's split has seen the tour's
    // traffic, at most 540 (a burst of 45, 9 more a second) after. A 429
    // comes when they are sent within 2 s (a machine too busy for that
    // refills the bucket as fast as curl starts).
    let (burst, took) = said("for i in $(seq 80)");
    assert!(burst.contains("200"), "{burst}");
    if took < Duration::from_secs(2) {
        assert!(
            burst.contains("429"),
            "over its quota in {took:?}, 429: {burst}"
        );
    } else {
        eprintln!("the burst took {took:?}: 429 not required ({burst})");
    }
    let (limited, _) = said("| grep -i '^HTTP");
    assert!(limited.contains("x-ratelimit-limit-requests"), "{limited}");
    // The fault step: who answered each request, then the ejection's
    // event and counter, then the fault undone.
    let (fault_loop, _) = said("for i in $(seq 200)");
    assert!(
        fault_loop.to_lowercase().contains("x-zonegate-backend:"),
        "the loop prints who served each request:\n{fault_loop}"
    );
    let event = outputs
        .iter()
        .find(|(l, _, _)| l.starts_with("curl -s http://127.0.0.1:9090/admin/v1/events"))
        .map(|(_, out, _)| out.clone())
        .expect("the tour shows the events");
    assert!(event.contains("\"ejected_"), "the event is shown: {event}");
    let (ejections, _) = said("zonegate_backend_ejections_total");
    assert!(
        ejections.contains("zonegate_backend_ejections_total{"),
        "{ejections}"
    );
    let faults = get_json(&format!("{backend}/mock/faults"), None).await;
    assert_eq!(faults["error_rate"], 0.0, "the fault is undone: {faults}");
    assert!(said("zg status").0.contains("az-a"));
    assert!(said("zonegate completions bash").0.is_empty());
    assert!(std::fs::read_to_string(
        dir.path()
            .join(".local/share/bash-completion/completions/zonegate")
    )
    .unwrap()
    .contains("failover"));
}
