//! What a new operator and their clients trip on in the first hour, fixed
//! where it happens: unknown models that say what to send instead, model
//! aliases, logs without colour codes in files, and status and quotas that
//! explain themselves.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{json, Value};
use support::*;

const PHYSICAL: &str = "Qwen/Qwen2.5-7B-Instruct";

async fn chat_for(node: &NodeProcess, model: &str) -> (u16, Value) {
    let resp = node
        .chat()
        .json(&json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_names_what_to_send_instead_and_an_alias_is_served() {
    // A vLLM-style backend that answers only to its own model name.
    let mock = Mock::start("m1", "az-a", &[PHYSICAL]).await;
    let backend = mock.backend_toml(&[MODEL]).replace(
        "metrics_path",
        &format!("model_names = {{ \"{MODEL}\" = \"{PHYSICAL}\" }}\nmetrics_path"),
    );
    let models = format!("[[models]]\nname = \"{MODEL}\"\naliases = [\"qwen-7b\"]\n");
    let node = NodeProcess::start("az-a", &format!("{backend}{models}")).await;

    // A name nobody serves: the models this key may use, and where to look.
    let (status, v) = chat_for(&node, "gpt-4o").await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("models this key may use: `{MODEL}`")),
        "{msg}"
    );
    assert!(msg.contains("GET /v1/models"), "{msg}");

    // The backend's own name, from a client that called vLLM directly.
    let (status, v) = chat_for(&node, PHYSICAL).await;
    assert_eq!(status, 404, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(&format!("did you mean `{MODEL}`?")), "{msg}");

    // An alias is the model: the backend gets its own name.
    let (status, v) = chat_for(&node, "qwen-7b").await;
    assert_eq!(status, 200, "{v}");

    // `ctl explain` resolves aliases and gives the same hint.
    let (code, out, _) = ctl(&node.admin, &["explain", "--model", "qwen-7b"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = ctl(&node.admin, &["explain", "--model", "qwen"]).await;
    assert_ne!(code, 0);
    assert!(err.contains(&format!("`{MODEL}`")), "{err}");
}

#[test]
fn a_model_alias_may_not_shadow_a_served_model_or_another_alias() {
    let base = "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"/tmp/x\"\n\n\
                [[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:8000\"\nmodels = [\"a\", \"b\"]\n\n";
    for (models, key) in [
        ("[[models]]\nname = \"a\"\naliases = [\"b\"]\n", "models[0].aliases[0]"),
        (
            "[[models]]\nname = \"a\"\naliases = [\"x\"]\n[[models]]\nname = \"b\"\naliases = [\"x\"]\n",
            "models[1].aliases[0]",
        ),
        ("[[models]]\nname = \"a\"\naliases = [\"\"]\n", "models[0].aliases[0]"),
    ] {
        let e = zonegate::config::Config::parse("t.toml", &format!("{base}{models}")).unwrap_err();
        assert_eq!(e.key, key, "{e}");
    }
    let ok = zonegate::config::Config::parse(
        "t.toml",
        &format!("{base}[[models]]\nname = \"a\"\naliases = [\"A-1\"]\n"),
    )
    .unwrap();
    assert_eq!(ok.model_of_alias("A-1"), Some("a"));
}

/// `serve`'s log as a file holds it: `(text log, json log)`, each read
/// once the node announced itself.
async fn serve_logs(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = base_toml("az-a", &dir.path().join("data"), "")
        + "[[backends]]\nname = \"b\"\nzone = \"az-a\"\nurl = \"http://127.0.0.1:9\"\nmodels = [\"m\"]\n";
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("node.log");
    let mut child = tokio::process::Command::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .args(extra)
        .env("RUST_LOG", "info,openraft=off")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    eventually(
        std::time::Duration::from_secs(60),
        "the node to log that it serves",
        || {
            let log = log.clone();
            async move { std::fs::read_to_string(&log).is_ok_and(|t| t.contains("node serving")) }
        },
    )
    .await;
    let _ = child.kill().await;
    std::fs::read_to_string(&log).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_no_colour_codes_into_a_log_file_and_json_with_log_format_json() {
    let text = serve_logs(&[]).await;
    assert!(text.contains("node serving"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file:\n{text:?}"
    );

    let json = serve_logs(&["--log-format", "json"]).await;
    for line in json.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string(), "{line}");
    }
    assert!(json.contains("\"node serving\""), "{json}");
}
