//! Black-box tests of `zonegate drill`: shipped scenarios run end to end
//! (shortened with `--set`) and pass; an impossible expectation exits 1
//! and is marked failed in report.json; Ctrl-C and both alarms restore
//! every fault; the capacity pre-check stops a drill before its first
//! step; the cluster target drills a running cluster; report.html is well-formed HTML with an inline SVG.
//!
//! The drills start real 3-node clusters, so they run one at a time.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// One drill at a time: each is a 3-node cluster with six mock backends.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zonegate"))
}

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("chaos/scenarios")
        .join(format!("{name}.toml"))
}

fn drill(file: &Path, report: &Path, sets: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("drill")
        .arg(file)
        .arg("--report")
        .arg(report)
        .arg("--exit-with-parent");
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    report: Value,
    html: String,
    took: Duration,
}

async fn run_drill(file: &Path, sets: &[&str]) -> Ran {
    run_drill_env(file, sets, &[]).await
}

/// [`run_drill`] with environment variables (a cluster target's token
/// and key).
async fn run_drill_env(file: &Path, sets: &[&str], env: &[(&str, &str)]) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = drill(file, dir.path(), sets)
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
    // Kept open: the drill runs with --exit-with-parent.
    let stdin = child.stdin.take();
    let out = tokio::time::timeout(Duration::from_secs(170), child.wait_with_output())
        .await
        .expect("the drill ends within 170 s")
        .unwrap();
    drop(stdin);
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = std::fs::read_to_string(dir.path().join("report.json"))
        .unwrap_or_else(|e| panic!("no report.json ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(md.starts_with("# Drill `"), "{md}");
    eprintln!("{stdout}");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout,
        stderr,
        report: serde_json::from_str(&json).unwrap(),
        html,
        took,
    }
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {}", report["checks"]))
}

/// report.html must parse as XML (so every element is closed), hold one
/// inline SVG with the three panels' lines, and load nothing from
/// elsewhere.
fn assert_well_formed_html(html: &str) {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(html, opts)
        .unwrap_or_else(|e| panic!("report.html is not well-formed: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "html");
    let svgs: Vec<_> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "svg")
        .collect();
    assert_eq!(svgs.len(), 1, "one inline SVG timeline");
    assert_eq!(
        svgs[0].tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let lines = svgs[0]
        .descendants()
        .filter(|n| n.tag_name().name() == "polyline")
        .count();
    assert!(lines >= 3, "success, p99 and zone lines: {lines}");
    for n in doc.descendants().filter(|n| n.is_element()) {
        for a in ["src", "href"] {
            assert!(
                n.attribute(a).is_none(),
                "self-contained: <{}> has {a}",
                n.tag_name().name()
            );
        }
        assert_ne!(n.tag_name().name(), "script");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_failover_drill_passes_and_its_report_is_well_formed() {
    let _one = SERIAL.lock().await;
    let ran = run_drill(
        &scenario("manual-failover-drill"),
        &[
            "load.rps=50",
            "load.warmup=2s",
            "load.duration=12s",
            "steps.0.at=1s",
            "steps.2.at=6s",
        ],
    )
    .await;
    eprintln!("manual-failover-drill took {:?}", ran.took);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "PASS");
    assert_eq!(ran.report["exit_code"], 0);
    assert_eq!(
        check(&ran.report, "failover_committed_within")["pass"],
        true
    );
    let decisions = ran.report["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert_eq!(decisions[0]["kind"], "failover");
    assert_eq!(decisions[1]["kind"], "failback");
    for d in decisions {
        assert_eq!(d["origin"], "operator", "{d}");
        assert!(d["commit_ms"].as_i64().is_some(), "{d}");
        assert!(d["apply_ms"].as_i64().is_some(), "{d}");
        assert!(d["traffic_ms"].as_i64().is_some(), "{d}");
    }
    assert_eq!(ran.report["restore"]["verified"], true);
    assert_well_formed_html(&ran.html);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_partition_drill_passes() {
    let _one = SERIAL.lock().await;
    let ran = run_drill(
        &scenario("minority-partition"),
        &[
            "load.rps=50",
            "load.warmup=2s",
            "load.duration=14s",
            "steps.1.at=1s",
            "steps.2.at=3s",
            "steps.3.at=7s",
        ],
    )
    .await;
    eprintln!("minority-partition drill took {:?}", ran.took);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "PASS");
    // freeze, failover, failback, unfreeze: all acknowledged, none lost.
    assert!(ran.report["acks"].as_array().unwrap().len() >= 4);
    assert_eq!(check(&ran.report, "no_lost_decisions")["pass"], true);
    assert_eq!(check(&ran.report, "max_leaders_per_term")["pass"], true);
    assert!(ran.report["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["text"].as_str().unwrap().contains("partition")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_blackout_drill_fails_the_zone_over_and_short_requests_survive() {
    let _one = SERIAL.lock().await;
    let ran = run_drill(
        &scenario("zone-blackout"),
        &["load.rps=50", "load.duration=16s"],
    )
    .await;
    eprintln!("zone-blackout drill took {:?}", ran.took);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "PASS");
    assert_eq!(
        check(&ran.report, "failover_committed_within")["pass"],
        true
    );
    assert_eq!(check(&ran.report, "short_success")["pass"], true);
}

/// After az-a fails over and its clients move to az-b's node, a tenant
/// under its quota is admitted there (az-b's allocation took az-a's), and
/// a tenant over its quota stays at its global cap throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_quota_overflow_drill_stretches_the_receiving_zone_and_keeps_the_cap() {
    let _one = SERIAL.lock().await;
    let ran = run_drill(
        &scenario("failover-quota-overflow"),
        // The scenario's own 5 s of warm-up, so the leader has split the
        // quotas by every node's reported demand before the first counted
        // request (with 3 s the test failed once under a full suite's load).
        &["load.warmup=5s", "load.duration=16s", "steps.0.at=4s"],
    )
    .await;
    eprintln!("failover-quota-overflow drill took {:?}", ran.took);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "PASS");
    let cap = check(&ran.report, "quota_cap_held");
    assert_eq!(cap["pass"], true, "{cap}");
    let measured = cap["measured"].as_str().unwrap();
    assert!(
        measured.contains("drill-1: ") && measured.contains("drill-2: "),
        "{measured}"
    );
    let stretch = check(&ran.report, "quota_stretched_within");
    assert_eq!(stretch["pass"], true, "{stretch}");
    assert!(
        stretch["measured"].as_str().unwrap().contains("(drill-1: "),
        "{stretch}"
    );
    let moved = ran.report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["action"] == "move_clients")
        .unwrap();
    assert_eq!(moved["ok"], true, "{moved}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_expectation_exits_1_and_is_marked_failed() {
    let _one = SERIAL.lock().await;
    let ran = run_drill(
        &scenario("manual-failover-drill"),
        &[
            "load.rps=20",
            "load.warmup=1s",
            "load.duration=8s",
            "steps.0.at=1s",
            "steps.2.at=4s",
            "expect.failover_committed_within=1ms",
        ],
    )
    .await;
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "FAIL");
    let c = check(&ran.report, "failover_committed_within");
    assert_eq!(c["pass"], false, "{c}");
    assert_eq!(c["expected"], "<= 1ms");
    assert!(
        ran.stdout.contains("FAIL failover_committed_within"),
        "{}",
        ran.stdout
    );
    assert_well_formed_html(&ran.html);
}

/// `safety.capacity_check`: with no capacity declared the drill cannot
/// tell and stops before its first step (exit 2, nothing faulted); with
/// capacity declared on every backend it says what is in flight and what
/// the zones left serving hold, and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_precheck_stops_a_drill_it_cannot_vouch_for() {
    let _one = SERIAL.lock().await;
    let short = [
        "load.rps=20",
        "load.warmup=2s",
        "load.duration=8s",
        "steps.0.at=1s",
        "steps.2.at=4s",
        "safety.capacity_check=true",
    ];
    let ran = run_drill(&scenario("manual-failover-drill"), &short).await;
    assert_eq!(ran.code, 2, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "ABORTED");
    let reason = ran.report["reason"].as_str().unwrap();
    assert!(
        reason.contains("capacity pre-check: az-b, az-c declare no capacity units"),
        "{reason}"
    );
    assert_eq!(
        ran.report["steps"].as_array().unwrap().len(),
        0,
        "no step ran"
    );
    assert_not_evaluated(&ran);

    // The same topology with 100 units per backend.
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("topology");
    std::fs::create_dir(&topo).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/local-3az");
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "models = [\"qwen25-7b-instruct\"]",
            "models = [\"qwen25-7b-instruct\"]\ncapacity = 100",
        );
        std::fs::write(topo.join(path.file_name().unwrap()), text).unwrap();
    }
    let file = dir.path().join("drill.toml");
    let text = std::fs::read_to_string(scenario("manual-failover-drill"))
        .unwrap()
        .replace(
            "\"../../config/local-3az\"",
            &format!("{:?}", topo.display().to_string()),
        );
    std::fs::write(&file, text).unwrap();
    let ran = run_drill(&file, &short).await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let said = ran.report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["text"].as_str())
        .find(|t| t.starts_with("capacity pre-check: "))
        .unwrap_or_else(|| panic!("no pre-check event: {}", ran.report["events"]));
    assert!(
        said.contains("units in flight fit in the 400 of az-b, az-c left serving"),
        "{said}"
    );
}

/// An aborted drill judges none of its expectations: each is "not
/// evaluated" (JSON `null`, `n/a` on stdout), never met nor missed (it
/// printed `FAIL converged_within: never`, and `ok steps: 0 of 0 ran` for
/// a drill stopped before its first step).
fn assert_not_evaluated(ran: &Ran) {
    let checks = ran.report["checks"].as_array().unwrap();
    assert!(!checks.is_empty(), "{}", ran.report);
    for c in checks {
        assert!(c["pass"].is_null(), "{c}");
        assert_eq!(c["measured"], "not evaluated: the drill was aborted", "{c}");
        let name = c["name"].as_str().unwrap();
        assert!(
            ran.stdout.contains(&format!("n/a  {name}: not evaluated")),
            "{}",
            ran.stdout
        );
    }
    // No expectation line says met or missed.
    assert!(
        !ran.stdout
            .lines()
            .any(|l| l.starts_with("  ok   ") || l.starts_with("  FAIL ")),
        "{}",
        ran.stdout
    );
}

/// A scenario on the shipped local topology: `body` holds its `[load]`,
/// steps and `[safety]`.
fn local_scenario(dir: &Path, body: &str) -> PathBuf {
    let topology = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/local-3az");
    let file = dir.join("drill.toml");
    std::fs::write(
        &file,
        format!(
            "[target]\nkind = \"local\"\ntopology = {:?}\n{body}",
            topology.display().to_string()
        ),
    )
    .unwrap();
    file
}

/// An alarm stopped the drill (exit 1, ABORTED) well before its 40 s of
/// load, after its first step's fault, which was restored and verified.
fn assert_stopped_by_an_alarm_after_its_fault(ran: &Ran) {
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "ABORTED");
    assert_not_evaluated(ran);
    assert_eq!(
        ran.report["steps"][0]["ok"], true,
        "{}",
        ran.report["steps"]
    );
    let restore = &ran.report["restore"];
    assert_eq!(restore["verified"], true, "{restore}");
    assert!(
        restore["actions"].as_array().is_some_and(|a| !a.is_empty()),
        "{restore}"
    );
    assert!(
        ran.took < Duration::from_secs(40),
        "stopped early: {:?}",
        ran.took
    );
}

/// Both alarms stop a drill early with exit 1 and every fault restored:
/// short-request success below `abort_below` for `abort_after` (every
/// backend failing), and an alert query that returns a series (a stand-in
/// Prometheus on 127.0.0.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_abort_a_drill_and_restore_its_faults() {
    let _one = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let every = "[\"qwen-a1\", \"qwen-a2\", \"qwen-b1\", \"qwen-b2\", \"qwen-c1\", \"qwen-c2\"]";
    let file = local_scenario(
        dir.path(),
        &format!(
            "[load]\nrps = 30\nduration = \"40s\"\nwarmup = \"2s\"\n\
             [[steps]]\nat = \"1s\"\naction = \"backend_fault\"\nbackends = {every}\nfaults = {{ error_rate = 1.0 }}\n\
             [safety]\nabort_below = 0.5\nabort_after = \"2s\"\n"
        ),
    );
    let ran = run_drill(&file, &[]).await;
    assert_stopped_by_an_alarm_after_its_fault(&ran);
    let reason = ran.report["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("alarm: short-request success ") && reason.contains("for 2s"),
        "{reason}"
    );

    // The alert query: a Prometheus whose alert fires from its fifth
    // query on (the alarm asks once a second, from the warm-up on; the
    // fault is injected two seconds in).
    let prometheus = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", prometheus.local_addr().unwrap());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(move || async move {
            let n = asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let result = if n >= 4 {
                serde_json::json!([{"metric": {"alertname": "ZonegateShortRequestsFailing"}, "value": [0, "1"]}])
            } else {
                serde_json::json!([])
            };
            axum::Json(serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}}))
        }),
    );
    let server = tokio::spawn(async move { axum::serve(prometheus, app).await });
    let file = local_scenario(
        dir.path(),
        &format!(
            "[load]\nrps = 20\nduration = \"40s\"\nwarmup = \"1s\"\n\
             [[steps]]\nat = \"1s\"\naction = \"backend_fault\"\nzone = \"az-a\"\nfaults = {{ latency_ms = 50 }}\n\
             [safety]\nalert_url = \"{url}\"\nalert_query = 'ALERTS{{alertstate=\"firing\"}}'\n"
        ),
    );
    let ran = run_drill(&file, &[]).await;
    server.abort();
    assert_stopped_by_an_alarm_after_its_fault(&ran);
    assert_eq!(
        ran.report["reason"],
        "alarm: the alert query `ALERTS{alertstate=\"firing\"}` fired"
    );
}

/// The cluster (staging) target: a drill against a running cluster it did
/// not start, through its admin and data-plane URLs, with the token and
/// key from the environment: it faults a mock backend by name, fails a
/// zone over and back with `ctl`, judges the load, and puts the mock's
/// faults back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drill_against_a_running_cluster_passes_and_restores_its_mock() {
    let _one = SERIAL.lock().await;
    let cluster = support::TestCluster::start(1, "[failover]\nperiod = \"1s\"\n").await;
    cluster.leader().await;
    let list = |urls: Vec<String>| {
        urls.iter()
            .map(|u| format!("{u:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let admin = list(cluster.running().map(|n| n.admin.clone()).collect());
    let data = list(cluster.running().map(|n| n.data.clone()).collect());
    let mut names: Vec<&String> = cluster.mocks.keys().collect();
    names.sort();
    let backends = names
        .iter()
        .map(|n| format!("{n:?} = {:?}", cluster.mocks[*n].url))
        .collect::<Vec<_>>()
        .join(", ");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("staging.toml");
    std::fs::write(
        &file,
        format!(
            "[target]\nkind = \"cluster\"\nadmin = [{admin}]\ndata = [{data}]\nbackends = {{ {backends} }}\n\
             [load]\nmodel = {:?}\nrps = 20\nduration = \"8s\"\nwarmup = \"1s\"\n\
             [[steps]]\nat = \"1s\"\naction = \"backend_fault\"\nbackends = [\"az-a-1\"]\nfaults = {{ latency_ms = 20 }}\n\
             [[steps]]\naction = \"ctl\"\nargs = [\"failover\", \"--from\", \"az-a\", \"--to\", \"az-b\", \"--reason\", \"staging drill\"]\n\
             [[steps]]\naction = \"wait_for\"\ncondition = \"decision\"\nkind = \"failover\"\ntimeout = \"10s\"\n\
             [[steps]]\nat = \"5s\"\naction = \"ctl\"\nargs = [\"failback\", \"--zone\", \"az-a\", \"--reason\", \"staging drill over\"]\n\
             [expect]\nshort_success = 0.99\nfailover_committed_within = \"3s\"\nno_lost_decisions = true\n",
            support::MODEL
        ),
    )
    .unwrap();
    let ran = run_drill_env(
        &file,
        &[],
        &[
            ("ZONEGATE_ADMIN_TOKEN", support::ADMIN_TOKEN),
            ("ZONEGATE_API_KEY", support::API_KEY),
        ],
    )
    .await;
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.report["verdict"], "PASS");
    assert_eq!(ran.report["target"], "cluster");
    assert_eq!(
        ran.report["restore"]["verified"], true,
        "{}",
        ran.report["restore"]
    );
    // The mock answers without the drill's latency again.
    let faults: Value = reqwest::get(format!("{}/mock/faults", cluster.mocks["az-a-1"].url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(faults["latency_ms"], 0, "{faults}");
    // The zone is back: the drill's own failback.
    cluster.all_at(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_drill_restores_every_fault() {
    let _one = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = drill(
        &scenario("zone-blackout"),
        dir.path(),
        &["load.rps=20", "load.warmup=1s", "steps.0.at=1s"],
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait until the fault is in force.
    let faulted = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("{line}");
            if line.contains("step 0: backend_fault") {
                return;
            }
        }
        panic!("the drill ended before its first step");
    })
    .await;
    assert!(faulted.is_ok(), "no fault within 120 s");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    let status = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            rest.push_str(&line);
            rest.push('\n');
        }
        child.wait().await.unwrap()
    })
    .await
    .expect("the drill stops within 90 s of Ctrl-C");
    eprintln!("{rest}");
    assert_eq!(
        status.code(),
        Some(2),
        "Ctrl-C: the drill did not run to the end"
    );
    assert!(
        rest.contains("restore: every fault restored and verified"),
        "{rest}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["verdict"], "ABORTED");
    assert_eq!(report["restore"]["verified"], true, "{}", report["restore"]);
    let actions = report["restore"]["actions"].as_array().unwrap();
    assert!(
        actions.iter().any(|a| a
            .as_str()
            .unwrap()
            .contains("faults restored on qwen-a1, qwen-a2")),
        "{actions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_prints_the_plan_and_a_bad_scenario_exits_2() {
    let out = Command::new(bin())
        .arg("drill")
        .arg(scenario("leader-kill"))
        .arg("--dry-run")
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("kill -9 the leader"), "{text}");
    assert!(text.contains("restore:"), "{text}");

    let out = Command::new(bin())
        .arg("drill")
        .arg(scenario("leader-kill"))
        .args(["--dry-run", "--set", "expect.short_success=2"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("leader-kill.toml: expect.short_success: 2 is not a fraction"),
        "{err}"
    );
}
