//! Black-box tests of `zonegate ctl` as the on-call engineer uses it:
//! readable times, `--json` anywhere, failover without `--to`, dry runs
//! with their undo command, the automation's "next" line, and `watch`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tokio::io::AsyncBufReadExt;

fn json_of(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// `2026-12-01 08:01:02Z, 3s ago`: a date, a UTC time and an age.
fn has_iso_time_and_age(text: &str) -> bool {
    text.lines().any(|l| {
        l.split("Z, ")
            .nth(1)
            .is_some_and(|rest| rest.contains(" ago"))
            && l.split_whitespace().any(|w| {
                let b = w.as_bytes();
                b.len() == 10 && b[4] == b'-' && b[7] == b'-'
            })
    })
}

/// Polls until every node knows the leader's score of every zone (it
/// picks targets by score), sending a few requests through every node meanwhile.
async fn wait_for_scores(cluster: &TestCluster) {
    let admins: Vec<String> = cluster.running().map(|n| n.admin.clone()).collect();
    eventually(
        Duration::from_secs(60),
        "the leader scores every zone",
        || {
            let chats: Vec<_> = cluster.running().map(|n| n.chat()).collect();
            let admins = admins.clone();
            async move {
                for c in chats {
                    let _ = c.json(&chat_body(8, false)).send().await;
                }
                for admin in admins {
                    let o = get_json(&format!("{admin}/admin/v1/outlook"), Some(ADMIN_TOKEN)).await;
                    if !ZONES
                        .iter()
                        .all(|z| o["zones"][z]["score"].as_f64().is_some())
                    {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_without_to_previews_the_leaders_target_and_its_undo() {
    let cluster = TestCluster::start(1, "[failover]\nperiod = \"1s\"\n").await;
    cluster.leader().await;
    wait_for_scores(&cluster).await;
    let admin = cluster.in_zone("az-c").admin.clone();
    let outlook = get_json(&format!("{admin}/admin/v1/outlook"), Some(ADMIN_TOKEN)).await;
    let target = outlook["zones"]["az-a"]["failover_target"]
        .as_str()
        .unwrap_or_else(|| panic!("no target: {outlook}"))
        .to_owned();
    assert_ne!(target, "az-a");

    let out = ctl_ok(&admin, &["failover", "--from", "az-a", "--dry-run"]).await;
    assert!(
        out.contains(&format!("target: {target} (the leader's choice")),
        "{out}"
    );
    assert!(
        out.contains("az-a") && out.contains("rules checked:"),
        "{out}"
    );
    assert!(
        out.contains("undo: zonegate ctl failback --zone az-a --if-version 1"),
        "{out}"
    );
    // A dry run writes nothing.
    let v = json_of(&ctl_ok(&admin, &["status", "--json"]).await);
    assert_eq!(v["decision_version"], 0, "{v}");

    // Without a terminal the commit never prompts (stdin is /dev/null).
    let out = ctl_ok(&admin, &["failover", "--from", "az-a", "--reason", "drill"]).await;
    assert!(
        out.contains("committed: failover as decision version 1"),
        "{out}"
    );
    assert!(out.contains("undo: zonegate ctl failback --zone az-a --if-version 1"));
    cluster.all_at(1).await;
    let v = json_of(&ctl_ok(&admin, &["--json", "status"]).await);
    assert_eq!(v["zones"]["az-a"]["target"], target.as_str(), "{v}");

    // Refusals still exit 1 and name their rule.
    let (code, _, err) = ctl(&admin, &["failover", "--from", "az-a", "--to", &target]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("already_failed_over"), "{err}");
    let (code, _, err) = ctl(&admin, &["failover", "--from", &target, "--to", "az-a"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("target_not_active"), "{err}");
    // A failback's dry run names the failover that undoes it.
    let out = ctl_ok(&admin, &["failback", "--zone", "az-a", "--dry-run"]).await;
    assert!(
        out.contains(&format!(
            "undo: zonegate ctl failover --from az-a --to {target} --if-version 2"
        )),
        "{out}"
    );
    // So does the committed failback (without a terminal: no prompt).
    let out = ctl_ok(&admin, &["failback", "--zone", "az-a"]).await;
    assert!(
        out.contains(&format!(
            "undo: zonegate ctl failover --from az-a --to {target} --if-version 2"
        )),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_and_status_show_utc_times_with_ages_and_json_keeps_epoch_ms() {
    let cluster = TestCluster::start(1, "").await;
    cluster.leader().await;
    let admin = cluster.in_zone("az-b").admin.clone();
    ctl_ok(
        &admin,
        &[
            "failover", "--from", "az-a", "--to", "az-b", "--reason", "GPUs",
        ],
    )
    .await;
    cluster.all_at(1).await;

    let out = ctl_ok(&admin, &["decisions"]).await;
    assert!(out.contains("AT (UTC)"), "{out}");
    assert!(has_iso_time_and_age(&out), "{out}");
    assert!(out.contains("token:ops") && out.contains("GPUs"), "{out}");

    let out = ctl_ok(&admin, &["status"]).await;
    assert!(out.contains("last decision: version 1 failover"), "{out}");
    assert!(has_iso_time_and_age(&out), "{out}");
    assert!(out.contains("token:ops"), "{out}");
    // Not a terminal: no colour codes.
    assert!(!out.contains('\x1b'), "{out:?}");

    for args in [["decisions", "--json"], ["--json", "decisions"]] {
        let v = json_of(&ctl_ok(&admin, &args).await);
        let at = v["decisions"][0]["at_ms"].as_u64();
        assert!(at.is_some_and(|t| t > 1_600_000_000_000), "{args:?}: {v}");
    }

    // --token after the verb too; without --admin: usage, 2.
    let out = tokio::process::Command::new(bin())
        .args(["ctl", "--admin", &admin, "decisions", "--json"])
        .args(["--token", ADMIN_TOKEN])
        .env_remove("ZONEGATE_ADMIN")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(json_of(&String::from_utf8_lossy(&out.stdout))["decisions"][0]["at_ms"].is_u64());
    let out = tokio::process::Command::new(bin())
        .args(["ctl", "status"])
        .env_remove("ZONEGATE_ADMIN")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--admin"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_bad_periods_and_the_next_step_while_a_zone_fails_and_frozen_when_frozen() {
    // Many periods needed: the zone stays failing (not failed over) long
    // enough to read its count on a busy machine.
    let cluster = TestCluster::start(
        1,
        "[failover]\nperiod = \"1s\"\nmin_periods = 10\nhistory_periods = 20\n",
    )
    .await;
    cluster.leader().await;
    let a = cluster.in_zone("az-a");
    let admin = a.admin.clone();
    wait_for_scores(&cluster).await;
    for (name, mock) in &cluster.mocks {
        if name.starts_with("az-a-") {
            mock.faults(json!({"error_rate": 1.0})).await;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (req, stop) = (a.chat(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = req
                    .try_clone()
                    .unwrap()
                    .json(&chat_body(8, false))
                    .send()
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let last = ctl_ok(&admin, &["status"]).await;
        let next = last
            .lines()
            .find(|l| l.trim_start().starts_with("az-a:"))
            .unwrap_or_default()
            .to_owned();
        if next.contains("of 10 bad periods; will fail over to az-")
            && next.contains("unless it recovers")
            && last.contains("of 10 bad")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no bad-period count or next line:\n{last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ctl_ok(&admin, &["freeze", "--reason", "investigating"]).await;
    eventually(Duration::from_secs(20), "status says frozen", || {
        let admin = admin.clone();
        async move {
            let out = ctl_ok(&admin, &["status"]).await;
            out.contains("az-a: frozen: operators only")
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_without_a_terminal_prints_one_line_per_change() {
    let cluster = TestCluster::start(1, "").await;
    cluster.leader().await;
    let admin = cluster.in_zone("az-a").admin.clone();
    let mut child = ctl_command(&admin)
        .args(["watch", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Reads lines until one satisfies `want`; returns it.
    async fn until(
        lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
        seen: &mut Vec<String>,
        want: impl Fn(&str) -> bool,
    ) {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(end, lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("watch printed no such line; saw:\n{}", seen.join("\n")))
                .unwrap()
                .expect("watch exited");
            seen.push(line.clone());
            if want(&line) {
                return;
            }
        }
    }
    until(&mut lines, &mut seen, |l| {
        l.contains("version 0") && l.contains("az-a=active")
    })
    .await;
    ctl_ok(&admin, &["failover", "--from", "az-a", "--to", "az-b"]).await;
    until(&mut lines, &mut seen, |l| {
        l.contains("az-a=failed_over→az-b")
    })
    .await;
    ctl_ok(&admin, &["failback", "--zone", "az-a"]).await;
    until(&mut lines, &mut seen, |l| {
        l.contains("version 2") && l.contains("az-a=active")
    })
    .await;
    // One line per change: no state printed twice in a row.
    for pair in seen.windows(2) {
        let strip = |l: &str| l.split_once(' ').map(|x| x.1).unwrap_or(l).to_owned();
        let (a, b) = (strip(&pair[0]), strip(&pair[1]));
        // The timestamp is `YYYY-MM-DD HH:MM:SSZ`: two words.
        let tail = |l: &str| {
            l.split_once(' ')
                .map(|x| x.1.to_owned())
                .unwrap_or_default()
        };
        assert_ne!(tail(&a), tail(&b), "a line repeated:\n{}", seen.join("\n"));
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_agrees_with_the_data_plane_for_a_pinned_session_in_a_failed_over_zone() {
    let cluster = TestCluster::start(2, "").await;
    cluster.leader().await;
    let a = cluster.in_zone("az-a");
    let admin = a.admin.clone();
    let send = || async {
        let r = a
            .chat()
            .header("x-session-id", "s-explain")
            .json(&chat_body(32, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let h = |n: &str| {
            r.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        (
            h("x-zonegate-zone"),
            h("x-zonegate-backend"),
            h("x-zonegate-route"),
        )
    };
    // The session is pinned to az-a by its first request.
    let (zone, _, _) = send().await;
    assert_eq!(zone, "az-a");
    let args = [
        "explain",
        "--model",
        MODEL,
        "--session",
        "s-explain",
        "--max-tokens",
        "32",
    ];
    let v = json_of(&ctl_ok(&admin, &[&args[..], &["--json"]].concat()).await);
    assert_eq!(v["home"], "az-a", "{v}");
    assert_eq!(v["effective_zone"], "az-a", "{v}");

    ctl_ok(&admin, &["failover", "--from", "az-a", "--to", "az-b"]).await;
    cluster.all_at(1).await;
    let v = json_of(&ctl_ok(&admin, &[&args[..], &["--json"]].concat()).await);
    assert_eq!(v["home"], "az-a", "{v}");
    assert_eq!(v["effective_zone"], "az-b", "{v}");
    assert_eq!(v["class"], "short", "{v}");
    let first = &v["zones"][0];
    assert_eq!(first["zone"], "az-b", "{v}");
    let candidates: Vec<String> = first["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect();
    let (zone, backend, route) = send().await;
    assert_eq!(zone, "az-b", "route {route}");
    assert!(
        candidates.contains(&backend),
        "{backend} not in {candidates:?}"
    );
    let out = ctl_ok(&admin, &args).await;
    assert!(
        out.contains("effective zone: az-b (az-a is failed over to az-b"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_man_page_come_from_the_cli_definition() {
    for (args, want) in [
        (&["completions", "bash"][..], "failover"),
        (&["completions", "zsh"][..], "--dry-run"),
        (&["completions", "fish"][..], "explain"),
        (&["man"][..], ".TH zonegate"),
    ] {
        let out = tokio::process::Command::new(bin())
            .args(args)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(want), "{args:?} lacks {want}");
    }
}

/// `zonegate ARGS…` without a terminal and without the caller's admin
/// environment; returns (exit code, stdout, stderr).
async fn zonegate(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .env_remove("ZONEGATE_ADMIN")
        .env_remove("ZONEGATE_ADMIN_TOKEN")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_admin_token_is_named_as_such_with_its_own_exit_code() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let node = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    let admin = node.admin.as_str();
    for args in [
        &["ctl", "--admin", admin, "--token", "wrong", "status"][..],
        &["ctl", "--admin", admin, "--token", "wrong", "members"][..],
        &["ctl", "--admin", admin, "status"][..],
        &["ctl", "--admin", admin, "backends"][..],
    ] {
        let (code, out, err) = zonegate(args).await;
        assert_eq!(code, 4, "{args:?}: {err}{out}");
        let given = args.contains(&"--token");
        let want = if given {
            "admin token rejected"
        } else {
            "no admin token given"
        };
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            err.contains("--token or ZONEGATE_ADMIN_TOKEN"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("API key"), "data-plane words: {err}");
    }
    let (code, _, err) =
        zonegate(&["ctl", "--admin", admin, "--token", ADMIN_TOKEN, "status"]).await;
    assert_eq!(code, 0, "{err}");
}

/// "Did traffic move?" needs no curl: `status` shows each zone's share of
/// the requests every node reported to the leader, asked of any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_per_zone_traffic_from_the_leaders_reports_even_asked_of_a_follower() {
    let cluster = TestCluster::start(1, "[failover]\nperiod = \"1s\"\n").await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .find(|n| n.admin != cluster.node(leader).admin)
        .unwrap()
        .admin
        .clone();
    let out = Arc::new(parking_lot::Mutex::new(String::new()));
    eventually(
        Duration::from_secs(60),
        "status on a follower to show per-zone traffic",
        || {
            let chats: Vec<_> = cluster.running().map(|n| n.chat()).collect();
            let (follower, out) = (follower.clone(), Arc::clone(&out));
            async move {
                for c in chats {
                    let _ = c.json(&chat_body(4, false)).send().await;
                }
                let (code, text, _) = ctl(&follower, &["status"]).await;
                let seen = code == 0
                    && text.contains("ZONE  REQ/S  SHARE  ERRORS  TIMEOUTS")
                    && ZONES.iter().any(|z| {
                        text.lines()
                            .any(|l| l.starts_with(z) && l.contains('%') && !l.contains(" 0%"))
                    });
                *out.lock() = text;
                seen
            }
        },
    )
    .await;
    assert!(out
        .lock()
        .contains("traffic (every node's report to the leader"));
}
