//! Commercial providers behind the gateway, black-box: the real binary in
//! front of `mock-backend --provider … --expect-key …`. Credentials (from
//! the environment or a file, rotated without a restart, never shown),
//! Azure OpenAI's deployment paths, and errors and limits as a provider
//! means them (401 → ejected for `credentials`, 429 → cooled, never
//! ejected).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const AZURE_KEY: &str = "azure-key-7f3a9c1e";
const OPENAI_KEY: &str = "sk-openai-5b2d8e4f";

/// A `[[backends]]` entry for `mock` with provider settings.
fn provider_backend(mock: &Mock, models: &[&str], extra: &str) -> String {
    format!("{}\n{extra}\n\n", mock.backend_toml(models).trim_end())
}

fn model(name: &str) -> String {
    format!("[[models]]\nname = \"{name}\"\n\n")
}

/// An OpenAI-format provider mock `name` that accepts only `expect_key`,
/// weighted to be the first pick, beside `local` (a backend without
/// credentials), behind a node whose key variable holds `OPENAI_KEY`.
async fn weighted_provider_beside(
    name: &str,
    expect_key: &str,
    local: &Mock,
) -> (Mock, NodeProcess) {
    let provider = Mock::start_args(
        name,
        "az-a",
        &[MODEL],
        &["--provider", "openai", "--expect-key", expect_key],
    )
    .await;
    let rest = provider_backend(
        &provider,
        &[MODEL],
        "api_key = { env = \"ZG_TEST_OPENAI_KEY\" }\nweight = 100",
    ) + &local.backend_toml(&[MODEL])
        + &model(MODEL);
    let node =
        NodeProcess::start_env_logging("az-a", &rest, &[("ZG_TEST_OPENAI_KEY", OPENAI_KEY)]).await;
    (provider, node)
}

#[tokio::test]
async fn azure_chat_and_stream_reach_the_deployment_with_the_backends_key_never_the_clients() {
    let azure = Mock::start_args(
        "azure-a",
        "az-a",
        &["gpt-4o-prod"],
        &["--provider", "azure", "--expect-key", AZURE_KEY],
    )
    .await;
    let rest = provider_backend(
        &azure,
        &[MODEL],
        &format!(
            "provider = \"azure\"\napi_key = {{ env = \"ZG_TEST_AZURE_KEY\" }}\n\
             model_names = {{ \"{MODEL}\" = \"gpt-4o-prod\" }}\n\
             headers = {{ \"x-ms-client-tag\" = \"zonegate-test\" }}"
        ),
    ) + &model(MODEL);
    let node =
        NodeProcess::start_env_logging("az-a", &rest, &[("ZG_TEST_AZURE_KEY", AZURE_KEY)]).await;

    let resp = node
        .chat()
        .json(&chat_body(4, false))
        .send()
        .await
        .expect("chat");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["usage"]["completion_tokens"], 4);
    let stats = azure.stats().await;
    let seen = &stats["last_headers"];
    assert_eq!(seen["api-key"], AZURE_KEY, "{stats}");
    assert_eq!(seen["x-ms-client-tag"], "zonegate-test");
    assert!(
        seen.get("authorization").is_none(),
        "the client's key: {stats}"
    );
    assert_eq!(stats["auth_failures"], 0);

    let mut body = chat_body(3, true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = node.chat().json(&body).send().await.expect("stream");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("text");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"completion_tokens\":3"), "{text}");

    // Embeddings go to the deployment's embeddings path.
    let resp = client()
        .post(format!("{}/v1/embeddings", node.data))
        .bearer_auth(API_KEY)
        .json(&json!({"model": MODEL, "input": "hi"}))
        .send()
        .await
        .expect("embeddings");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    // The probe is Azure's free model list, with the key: never refused.
    assert_eq!(azure.stats().await["auth_failures"], 0);
}

#[tokio::test]
async fn a_rotated_key_file_is_used_by_the_next_requests_without_a_restart() {
    let openai = Mock::start_args("oa", "az-a", &[MODEL], &["--provider", "openai"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let key_file = dir.path().join("openai-key");
    std::fs::write(&key_file, "sk-first-1111\n").expect("write key");
    let rest = provider_backend(
        &openai,
        &[MODEL],
        &format!("api_key = {{ file = \"{}\" }}", key_file.display()),
    ) + &model(MODEL);
    let node = NodeProcess::start("az-a", &rest).await;
    let resp = node
        .chat()
        .json(&chat_body(2, false))
        .send()
        .await
        .expect("chat");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        openai.stats().await["last_headers"]["authorization"],
        "Bearer sk-first-1111"
    );
    // Rotated in place, as a secret manager does: a new file renamed over.
    let next = dir.path().join("openai-key.new");
    std::fs::write(&next, "sk-second-2222\n").expect("write key");
    std::fs::rename(&next, &key_file).expect("rename");
    eventually(
        Duration::from_secs(20),
        "the rotated key is used",
        || async {
            let resp = node
                .chat()
                .json(&chat_body(2, false))
                .send()
                .await
                .expect("chat");
            resp.status() == 200
                && openai.stats().await["last_headers"]["authorization"] == "Bearer sk-second-2222"
        },
    )
    .await;
}

#[tokio::test]
async fn a_provider_answering_401_is_ejected_for_credentials_and_traffic_moves_on() {
    let good = Mock::start("local-vllm", "az-a", &[MODEL]).await;
    let (wrong, node) =
        weighted_provider_beside("openai-wrong-key", "sk-the-right-one", &good).await;
    // The heavy weight makes the provider the first pick; its 401 moves
    // the request to the other backend and ejects it at once.
    let mut first_refusals = None;
    for _ in 0..20 {
        let resp = node
            .chat()
            .json(&chat_body(2, false))
            .send()
            .await
            .expect("chat");
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        let refusals = wrong.stats().await["auth_failures"].as_u64().unwrap_or(0);
        if refusals > 0 && first_refusals.is_none() {
            first_refusals = Some(refusals);
        }
    }
    let first = first_refusals.expect("the provider was tried");
    assert_eq!(first, 1, "ejected within one request");
    let backends = node.admin_get("/admin/v1/backends").await;
    let b = backends["backends"]
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == "openai-wrong-key"))
        .cloned()
        .unwrap_or_else(|| panic!("{backends}"));
    assert_eq!(b["state"], "down", "{b}");
    assert_eq!(b["ejected"]["cause"], "credentials", "{b}");
    assert_eq!(b["provider"], "openai");
    let events = node.admin_get("/admin/v1/events").await.to_string();
    assert!(events.contains("ejected_credentials"), "{events}");
    let metrics = node.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_backend_ejections_total",
            &["backend=\"openai-wrong-key\"", "cause=\"credentials\""]
        ),
        1.0,
        "{metrics}"
    );
    // Never retried in a loop: half-open trials back off (1 s, 2 s, …).
    let refusals = wrong.stats().await["auth_failures"].as_u64().unwrap_or(0);
    assert!(refusals <= 4, "{refusals} refusals");
    // The key the provider refused never shows in the log.
    let log = std::fs::read_to_string(node.dir.path().join("stderr.log")).expect("log");
    assert!(log.contains("credential"), "{log}");
    assert!(!log.contains(OPENAI_KEY), "{log}");
}

#[tokio::test]
async fn a_429_with_retry_after_or_an_exhausted_allowance_cools_a_provider_and_never_ejects_it() {
    let good = Mock::start("local-vllm", "az-a", &[MODEL]).await;
    let (busy, node) = weighted_provider_beside("openai-busy", OPENAI_KEY, &good).await;
    busy.faults(json!({"status_sequence": [429, 429, 429, 429, 429, 429], "retry_after": 30}))
        .await;
    for _ in 0..10 {
        let resp = node
            .chat()
            .json(&chat_body(2, false))
            .send()
            .await
            .expect("chat");
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    }
    // One 429 cooled it for its Retry-After: the rest went elsewhere.
    assert_eq!(busy.stats().await["requests"], 1);
    let backend = |list: Value, name: &str| {
        list["backends"]
            .as_array()
            .and_then(|l| l.iter().find(|b| b["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{list}"))
    };
    let b = backend(node.admin_get("/admin/v1/backends").await, "openai-busy");
    assert_eq!(b["state"], "up", "{b}");
    assert!(b["cooling_down_ms"].as_u64().unwrap_or(0) > 20_000, "{b}");
    assert_eq!(b["ejections"], 0);

    // A success that says the allowance is used up cools it too, before
    // it starts answering 429s.
    let (busy2, node2) = weighted_provider_beside("openai-spent", OPENAI_KEY, &good).await;
    busy2.faults(json!({"ratelimit_remaining": 0})).await;
    for _ in 0..30 {
        if busy2.stats().await["requests"] != 0 {
            break;
        }
        let resp = node2
            .chat()
            .json(&chat_body(2, false))
            .send()
            .await
            .expect("chat");
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(busy2.stats().await["requests"], 1);
    for _ in 0..5 {
        let resp = node2
            .chat()
            .json(&chat_body(2, false))
            .send()
            .await
            .expect("chat");
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(busy2.stats().await["requests"], 1, "cooled until its reset");
    let b = backend(node2.admin_get("/admin/v1/backends").await, "openai-spent");
    assert!(b["cooling_down_ms"].as_u64().unwrap_or(0) > 5_000, "{b}");
    assert_eq!(b["ejections"], 0);
    node.kill().await;
    node2.kill().await;
}

#[tokio::test]
async fn a_missing_key_variable_or_unreadable_key_file_fails_check_config_and_start() {
    let dir = tempfile::tempdir().expect("dir");
    for (secret, key, reason) in [
        (
            "{ env = \"ZG_TEST_SURELY_UNSET_KEY\" }",
            "backends[0].api_key.env",
            "the environment variable `ZG_TEST_SURELY_UNSET_KEY` is not set",
        ),
        (
            "{ file = \"/nonexistent/zonegate/key\" }",
            "backends[0].api_key.file",
            "cannot read `/nonexistent/zonegate/key`",
        ),
    ] {
        let config = format!(
            "{}[[backends]]\nname = \"p\"\nzone = \"az-a\"\nurl = \"https://api.openai.com\"\n\
             models = [\"m\"]\napi_key = {secret}\n",
            base_toml("az-a", &dir.path().join("data"), "")
        );
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write");
        for verb in [&["check-config"][..], &["serve", "--config"]] {
            let out = tokio::process::Command::new(bin())
                .args(verb)
                .arg(&path)
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .expect("runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{verb:?}: {stderr}");
            for part in [
                path.display().to_string(),
                key.to_owned(),
                reason.to_owned(),
            ] {
                assert!(stderr.contains(&part), "{verb:?} lacks {part:?}: {stderr}");
            }
        }
    }
}

#[tokio::test]
async fn no_key_value_appears_in_logs_admin_api_ctl_dashboard_or_metrics() {
    let azure = Mock::start_args(
        "azure-a",
        "az-a",
        &[MODEL],
        &["--provider", "azure", "--expect-key", AZURE_KEY],
    )
    .await;
    let openai = Mock::start_args(
        "oa",
        "az-a",
        &["other"],
        &["--provider", "openai", "--expect-key", OPENAI_KEY],
    )
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, format!("{OPENAI_KEY}\n")).expect("write");
    let rest = provider_backend(
        &azure,
        &[MODEL],
        "provider = \"azure\"\napi_key = { env = \"ZG_TEST_AZURE_KEY\" }",
    ) + &provider_backend(
        &openai,
        &["other"],
        &format!(
            "api_key = {{ file = \"{}\" }}\nheaders = {{ \"OpenAI-Organization\" = \"org-42\" }}",
            key_file.display()
        ),
    ) + &model(MODEL)
        + &model("other");
    let node = NodeProcess::start_env_logging(
        "az-a",
        &rest,
        &[
            ("ZG_TEST_AZURE_KEY", AZURE_KEY),
            ("RUST_LOG", "debug,openraft=off,hyper=off,h2=off"),
        ],
    )
    .await;
    for m in [MODEL, "other"] {
        let mut body = chat_body(2, false);
        body["model"] = json!(m);
        let resp = node.chat().json(&body).send().await.expect("chat");
        assert_eq!(resp.status(), 200, "{m}: {:?}", resp.text().await);
    }
    let mut outputs = Vec::new();
    for path in ["/admin/v1/config", "/admin/v1/backends", "/admin/v1/events"] {
        outputs.push((path.to_owned(), node.admin_get(path).await.to_string()));
    }
    let config = &outputs[0].1;
    assert!(
        config.contains("ZG_TEST_AZURE_KEY"),
        "the reference is shown: {config}"
    );
    for path in ["/metrics", "/dashboard", "/dashboard/app.js"] {
        let text = client()
            .get(format!("{}{path}", node.admin))
            .send()
            .await
            .expect("admin")
            .text()
            .await
            .expect("text");
        outputs.push((path.to_owned(), text));
    }
    let (code, out, err) = ctl(&node.admin, &["config", "show"]).await;
    assert_eq!(code, 0, "{err}");
    outputs.push(("ctl config show".into(), format!("{out}{err}")));
    let log = std::fs::read_to_string(node.dir.path().join("stderr.log")).expect("log");
    assert!(log.contains("DEBUG"), "the log at debug level: {log}");
    outputs.push(("log".into(), log));
    node.kill().await;
    for (what, text) in &outputs {
        for secret in [AZURE_KEY, OPENAI_KEY] {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
}

const ANTHROPIC_KEY: &str = "sk-ant-demo-9d4c2b7a";

/// An Anthropic mock serving `claude-mock`, and its `[[backends]]` entry
/// for logical model `model` (weight `weight`).
async fn anthropic(name: &str, model: &str, weight: u32) -> (Mock, String) {
    let mock = Mock::start_args(
        name,
        "az-a",
        &["claude-mock"],
        &["--provider", "anthropic", "--expect-key", ANTHROPIC_KEY],
    )
    .await;
    let toml = format!(
        "[[backends]]\nname = \"{name}\"\nzone = \"az-a\"\nurl = \"{}\"\nmodels = [\"{model}\"]\n\
         provider = \"anthropic\"\napi_key = {{ env = \"ZG_TEST_ANTHROPIC_KEY\" }}\n\
         model_names = {{ \"{model}\" = \"claude-mock\" }}\nweight = {weight}\n\n",
        mock.url
    );
    (mock, toml)
}

/// The text of an OpenAI event stream, and whether it ended with `[DONE]`.
fn streamed_text(sse: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for data in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{data}: {e}"));
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    (text, done)
}

#[tokio::test]
async fn anthropic_chat_stream_and_tools_come_back_in_openai_format() {
    let (mock, backend) = anthropic("claude-a", MODEL, 1).await;
    let node = NodeProcess::start_env_logging(
        "az-a",
        &(backend + &model(MODEL)),
        &[("ZG_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)],
    )
    .await;
    let mut body = chat_body(3, false);
    body["messages"] = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"}
    ]);
    let resp = node.chat().json(&body).send().await.expect("chat");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["model"], MODEL);
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 "
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(answer["usage"]["prompt_tokens"], 8);
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    let stats = mock.stats().await;
    let seen = &stats["last_headers"];
    assert_eq!(seen["x-api-key"], ANTHROPIC_KEY, "{stats}");
    assert_eq!(seen["anthropic-version"], "2023-06-01");
    assert!(seen.get("authorization").is_none(), "{stats}");

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = node.chat().json(&body).send().await.expect("stream");
    assert_eq!(resp.status(), 200);
    let sse = resp.text().await.expect("text");
    let (text, done) = streamed_text(&sse);
    assert_eq!(text, "tok0 tok1 tok2 ", "{sse}");
    assert!(done, "{sse}");
    assert!(sse.contains("\"completion_tokens\":3"), "{sse}");
    assert!(sse.contains("chat.completion.chunk"), "{sse}");

    let tools = json!({
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    });
    let resp = node.chat().json(&tools).send().await.expect("tools");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let answer: Value = resp.json().await.expect("json");
    assert_eq!(
        answer["choices"][0]["finish_reason"], "tool_calls",
        "{answer}"
    );
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "weather"
    );

    // A field Anthropic has no place for: a 400 naming it, nothing sent.
    let before = mock.stats().await["requests"].clone();
    let mut odd = chat_body(2, false);
    odd["logprobs"] = json!(true);
    let resp = node.chat().json(&odd).send().await.expect("chat");
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["param"], "logprobs", "{err}");
    assert_eq!(mock.stats().await["requests"], before, "nothing was sent");
    // The provider's own 400 reaches the client in OpenAI's error shape.
    mock.faults(json!({"status_sequence": [400]})).await;
    let resp = node
        .chat()
        .json(&chat_body(2, false))
        .send()
        .await
        .expect("chat");
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    assert!(err["error"]["message"].is_string(), "{err}");
    let before = mock.stats().await["requests"].clone();
    // The route table knows: no embeddings from Anthropic.
    let resp = client()
        .post(format!("{}/v1/embeddings", node.data))
        .bearer_auth(API_KEY)
        .json(&json!({"model": MODEL, "input": "hi"}))
        .send()
        .await
        .expect("embeddings");
    assert!(!resp.status().is_success(), "{:?}", resp.text().await);
    assert_eq!(mock.stats().await["requests"], before);
}

#[tokio::test]
async fn anthropic_529_and_429_cool_the_backend_and_never_eject_it() {
    let (mock, backend) = anthropic("claude-busy", MODEL, 100).await;
    let good = Mock::start("local-vllm", "az-a", &[MODEL]).await;
    let rest = backend + &good.backend_toml(&[MODEL]) + &model(MODEL);
    let node =
        NodeProcess::start_env_logging("az-a", &rest, &[("ZG_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)])
            .await;
    // Overloaded, again and again: more than `passive_failures` in a row
    // would eject a failing backend; a busy one stays in.
    mock.faults(json!({"error_rate": 1.0, "error_status": 529}))
        .await;
    for _ in 0..12 {
        let resp = node
            .chat()
            .json(&chat_body(2, false))
            .send()
            .await
            .expect("chat");
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    }
    mock.faults(json!({"error_rate": 0.0, "status_sequence": [429], "retry_after": 30}))
        .await;
    let backends = |v: Value| {
        v["backends"]
            .as_array()
            .and_then(|l| l.iter().find(|b| b["name"] == "claude-busy"))
            .cloned()
            .unwrap_or_else(|| panic!("{v}"))
    };
    eventually(
        Duration::from_secs(30),
        "the 429 cools it for 30 s",
        || async {
            let resp = node
                .chat()
                .json(&chat_body(2, false))
                .send()
                .await
                .expect("chat");
            assert_eq!(resp.status(), 200);
            let b = backends(node.admin_get("/admin/v1/backends").await);
            b["cooling_down_ms"].as_u64().unwrap_or(0) > 20_000
        },
    )
    .await;
    let b = backends(node.admin_get("/admin/v1/backends").await);
    assert_eq!(b["ejections"], 0, "{b}");
    assert_eq!(b["state"], "up", "{b}");
    assert!(mock.stats().await["requests"].as_u64().unwrap_or(0) >= 2);
}

#[tokio::test]
async fn a_stream_cut_from_anthropic_continues_on_an_openai_backend_exactly_once() {
    let (mock, backend) = anthropic("claude-cut", MODEL, 1).await;
    let openai = Mock::start("local-vllm", "az-a", &["qwen-fallback"]).await;
    let rest = backend
        + &openai.backend_toml(&["qwen-fallback"])
        + &format!("[[models]]\nname = \"{MODEL}\"\nfallback = [\"qwen-fallback\"]\n\n")
        + &model("qwen-fallback");
    let node =
        NodeProcess::start_env_logging("az-a", &rest, &[("ZG_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)])
            .await;
    // message_start, content_block_start, ping, then three words: cut.
    mock.faults(json!({"stream_cut_after": 6, "stream_interval_ms": 20}))
        .await;
    let resp = node
        .chat()
        .json(&chat_body(8, true))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    let sse = resp.text().await.expect("text");
    let (text, done) = streamed_text(&sse);
    let want: String = (0..8).map(|i| format!("tok{i} ")).collect();
    assert_eq!(text, want, "{sse}");
    assert!(done, "{sse}");
    assert_eq!(sse.matches("[DONE]").count(), 1, "{sse}");
    assert_eq!(mock.stats().await["requests"], 1);
    assert_eq!(openai.stats().await["requests"], 1, "continued once");
}

/// The venv's Python with the `openai` SDK (`.ci/run` installs it into
/// target/ci-venv); `None` (the test is skipped, loudly) without it,
/// unless `ZONEGATE_REQUIRE_TOOLS=1` says every tool must be there.
fn openai_sdk_python() -> Option<std::path::PathBuf> {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ci-venv/bin/python");
    let works = python.is_file()
        && std::process::Command::new(&python)
            .args(["-c", "import openai"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !works {
        assert!(
            std::env::var("ZONEGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "the openai SDK is not installed but ZONEGATE_REQUIRE_TOOLS=1: run the install lines of .ci/run"
        );
        eprintln!("SKIPPED: the openai Python SDK is not in target/ci-venv (.ci/run installs it)");
        return None;
    }
    Some(python)
}

#[tokio::test]
async fn the_openai_python_sdk_gets_the_mocks_answers_and_usage_from_anthropic_and_azure() {
    let Some(python) = openai_sdk_python() else {
        return;
    };
    let (claude, claude_backend) = anthropic("claude-sdk", "claude-sonnet", 1).await;
    let azure = Mock::start_args(
        "azure-sdk",
        "az-a",
        &["gpt-4o-prod"],
        &["--provider", "azure", "--expect-key", AZURE_KEY],
    )
    .await;
    let rest = claude_backend
        + &provider_backend(
            &azure,
            &["gpt-4o"],
            "provider = \"azure\"\napi_key = { env = \"ZG_TEST_AZURE_KEY\" }\n\
             model_names = { \"gpt-4o\" = \"gpt-4o-prod\" }",
        )
        + &model("claude-sonnet")
        + &model("gpt-4o");
    let node = NodeProcess::start_env_logging(
        "az-a",
        &rest,
        &[
            ("ZG_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY),
            ("ZG_TEST_AZURE_KEY", AZURE_KEY),
        ],
    )
    .await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/openai_sdk.py");
    for (model, mock, key_header, key) in [
        ("claude-sonnet", &claude, "x-api-key", ANTHROPIC_KEY),
        ("gpt-4o", &azure, "api-key", AZURE_KEY),
    ] {
        let out = tokio::process::Command::new(&python)
            .arg(&script)
            .arg(format!("{}/v1", node.data))
            .arg(API_KEY)
            .arg(model)
            .output()
            .await
            .expect("python runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{model}: {stderr}");
        let got: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{model}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        // The mocks answer word i as `tok{i} `, one word per token, with 8
        // prompt tokens.
        assert_eq!(got["chat"]["content"], "tok0 tok1 tok2 ", "{model}: {got}");
        assert_eq!(got["chat"]["finish_reason"], "stop", "{model}: {got}");
        assert_eq!(got["chat"]["usage"]["prompt_tokens"], 8, "{model}: {got}");
        assert_eq!(
            got["chat"]["usage"]["completion_tokens"], 3,
            "{model}: {got}"
        );
        assert_eq!(
            got["stream"]["text"], "tok0 tok1 tok2 tok3 ",
            "{model}: {got}"
        );
        assert_eq!(got["stream"]["finish_reason"], "stop", "{model}: {got}");
        assert_eq!(
            got["stream"]["usage"]["completion_tokens"], 4,
            "{model}: {got}"
        );
        assert_eq!(got["stream"]["usage"]["prompt_tokens"], 8, "{model}: {got}");
        assert_eq!(
            got["tools"]["finish_reason"], "tool_calls",
            "{model}: {got}"
        );
        assert_eq!(got["tools"]["name"], "weather", "{model}: {got}");
        assert!(
            got["tools"]["arguments"]["city"].is_string(),
            "{model}: {got}"
        );
        let stats = mock.stats().await;
        assert_eq!(stats["last_headers"][key_header], key, "{model}: {stats}");
        assert!(
            !stats["last_headers"].to_string().contains(API_KEY),
            "the client's key reached the provider: {stats}"
        );
        assert_eq!(stats["auth_failures"], 0, "{stats}");
    }
}

#[tokio::test]
async fn a_stream_cut_from_an_openai_backend_restarts_on_anthropic_exactly_once() {
    // Anthropic takes no prefill ending in whitespace, as the mock's words
    // do: its model continues by a prefix-verified restart instead.
    let (claude, backend) = anthropic("claude-next", "claude-fallback", 1).await;
    let openai = Mock::start("local-vllm", "az-a", &[MODEL]).await;
    let rest = openai.backend_toml(&[MODEL])
        + &backend
        + &format!("[[models]]\nname = \"{MODEL}\"\nfallback = [\"claude-fallback\"]\n\n")
        + "[[models]]\nname = \"claude-fallback\"\ncontinuation = \"restart\"\n\n";
    let node =
        NodeProcess::start_env_logging("az-a", &rest, &[("ZG_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)])
            .await;
    openai
        .faults(json!({"stream_cut_after": 3, "stream_interval_ms": 20}))
        .await;
    let resp = node
        .chat()
        .json(&chat_body(8, true))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    let sse = match resp.text().await {
        Ok(t) => t,
        Err(e) => panic!(
            "{e}: claude saw {}; log:\n{}",
            claude.stats().await,
            std::fs::read_to_string(node.dir.path().join("stderr.log")).unwrap_or_default()
        ),
    };
    let (text, done) = streamed_text(&sse);
    let want: String = (0..8).map(|i| format!("tok{i} ")).collect();
    assert_eq!(text, want, "{sse}");
    assert!(done, "{sse}");
    assert_eq!(sse.matches("[DONE]").count(), 1, "{sse}");
    assert_eq!(openai.stats().await["requests"], 1);
    assert_eq!(claude.stats().await["requests"], 1, "continued once");
}
