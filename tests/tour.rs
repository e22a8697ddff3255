//! The README's tour, run as a reader runs it: the fault step's commands,
//! copied from README.md, against `zonegate demo` (curl and bash, on the
//! ports the demo picked).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The demo's data, admin and az-a backend URLs, read from its output.
async fn demo() -> (tokio::process::Child, String, String, String) {
    let mut child = tokio::process::Command::new(bin())
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let read = async {
        let (mut data, mut admin, mut backend) = (None, None, None);
        while let Some(line) = lines.next_line().await.unwrap() {
            let value = |p: &str| line.strip_prefix(p).map(|s| s.trim().to_owned());
            data = data.or(value("data plane:"));
            admin = admin.or(value("admin:"));
            if backend.is_none() && line.contains("(az-a): http") {
                backend = line
                    .split_whitespace()
                    .find(|w| w.starts_with("http://"))
                    .map(str::to_owned);
            }
            if line.starts_with("Ctrl-C") {
                break;
            }
        }
        (data.unwrap(), admin.unwrap(), backend.unwrap())
    };
    let (data, admin, backend) = tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("the demo prints its URLs");
    (child, data, admin, backend)
}

/// The shell block of README.md that follows the paragraph starting with
/// `intro`.
fn readme_block(intro: &str) -> String {
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let from = text
        .find(intro)
        .unwrap_or_else(|| panic!("README lost {intro:?}"));
    let rest = &text[from..];
    let start = rest.find("```sh\n").unwrap() + "```sh\n".len();
    let end = rest[start..].find("```").unwrap();
    rest[start..start + end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tours_fault_step_shows_the_ejection_and_undoes_the_fault() {
    let (mut child, data, admin, backend) = demo().await;
    let script = readme_block("Break one az-a backend")
        .replace("http://127.0.0.1:PORT", &backend)
        .replace("http://127.0.0.1:8080", &data)
        .replace("http://127.0.0.1:9090", &admin);
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("bash")
            .args(["-c", &script])
            .output(),
    )
    .await
    .expect("the fault step ends")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.to_lowercase().contains("x-zonegate-backend:"),
        "the loop prints who served each request:\n{stdout}"
    );
    assert!(
        stdout.contains("\"ejected_"),
        "the event is shown:\n{stdout}"
    );
    assert!(
        stdout.contains("zonegate_backend_ejections_total{"),
        "{stdout}"
    );
    let faults = get_json(&format!("{backend}/mock/faults"), None).await;
    assert_eq!(faults["error_rate"], 0.0, "the fault is undone: {faults}");
    let _ = child.kill().await;
}

/// `bash -c script`'s (exit ok, stdout + stderr), within four minutes.
async fn run_bash(script: &str) -> (bool, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("bash")
            .args(["-c", script])
            .output(),
    )
    .await
    .expect("the tour's commands end")
    .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tours_requests_quota_and_failover_steps_do_what_the_readme_says() {
    let (mut child, data, admin, _) = demo().await;
    let local = |s: String| {
        s.replace("http://127.0.0.1:8080", &data)
            .replace("http://127.0.0.1:9090", &admin)
    };

    // A chat completion and a stream.
    let (ok, out) = run_bash(&local(readme_block("In another\nterminal:"))).await;
    assert!(ok, "{out}");
    let lower = out.to_lowercase();
    assert!(lower.contains("x-zonegate-backend:"), "{out}");
    assert!(out.contains("data: [DONE]"), "{out}");

    // Over the quota: 429 with the rate-limit headers.
    let (ok, out) = run_bash(&local(readme_block("Over its quota"))).await;
    assert!(ok, "{out}");
    assert!(out.contains("429"), "{out}");
    assert!(out.to_lowercase().contains("x-ratelimit-"), "{out}");

    // Failover and back with `zg`, the binary in place of `cargo run`.
    let script = local(readme_block("Fail a zone over and back"))
        .replace("cargo run --release -q --", &bin().display().to_string())
        .replace("zg watch  ", "zg watch & sleep 3; kill $!  ");
    let (_, out) = run_bash(&format!("shopt -s expand_aliases\n{script}")).await;
    for want in [
        "target_not_active",
        "soft_limit",
        "failover",
        "effective zone",
        "az-b",
    ] {
        assert!(out.contains(want), "the tour lacks {want:?}:\n{out}");
    }
    assert!(!out.contains("model_not_found"), "{out}");
    let _ = child.kill().await;
}
