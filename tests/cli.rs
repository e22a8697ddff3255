//! The command line: `check-config` on every example under `config/` and on
//! broken files, and the one-command `demo`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Command as StdCommand;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

fn config_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            config_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_example_under_config_is_valid() {
    let mut files = Vec::new();
    config_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config"),
        &mut files,
    );
    assert!(files.len() >= 2, "examples missing: {files:?}");
    for f in files {
        zonegate::config::Config::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let out = StdCommand::new(bin())
            .arg("check-config")
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn check_config_names_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/minimal.toml"))
            .unwrap()
            .replace(
                "url = \"http://127.0.0.1:8000\"",
                "url = \"http://127.0.0.1:8000\"\nweight = 0",
            );
    std::fs::write(&path, text).unwrap();
    let out = StdCommand::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("backends[0].weight"), "{err}");
    assert!(err.contains("at least 1"), "{err}");

    let out = StdCommand::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve refuses an invalid config");
    let missing = StdCommand::new(bin())
        .args(["check-config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_starts_a_working_gateway_and_stops_on_sigterm() {
    let mut child = tokio::process::Command::new(bin())
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let read = async {
        let (mut data, mut admin, mut key, mut token) = (None, None, None, None);
        while let Some(line) = lines.next_line().await.unwrap() {
            let value = |p: &str| line.strip_prefix(p).map(|s| s.trim().to_owned());
            data = data.or(value("data plane:"));
            admin = admin.or(value("admin:"));
            key = key.or(value("api key:"));
            token = token.or(value("admin token:"));
            if line.starts_with("Ctrl-C") {
                break;
            }
        }
        (data.unwrap(), admin.unwrap(), key.unwrap(), token.unwrap())
    };
    let (data, admin, key, token) = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("demo prints its URLs");
    let resp = client()
        .post(format!("{data}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&chat_body(4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A Claude-style model behind the same API (an Anthropic-format mock
    // with the demo's key from the environment).
    let mut claude = chat_body(4, false);
    claude["model"] = serde_json::json!("claude-demo");
    let resp = client()
        .post(format!("{data}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&claude)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["model"], "claude-demo");
    let backends = get_json(&format!("{admin}/admin/v1/backends"), Some(&token)).await;
    assert_eq!(backends["backends"].as_array().unwrap().len(), 7);
    let cluster = get_json(&format!("{admin}/admin/v1/cluster"), Some(&token)).await;
    assert_eq!(cluster["control_plane"], "raft");
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 3);

    // SIGTERM: the demo stops its children and exits cleanly.
    let pid = child.id().unwrap().to_string();
    StdCommand::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    eventually(
        Duration::from_secs(20),
        "the demo's gateway to stop",
        || async {
            client()
                .get(format!("{data}/healthz"))
                .send()
                .await
                .is_err()
        },
    )
    .await;
}
