//! Black-box tests of one gateway node in front of mock backends: the OpenAI
//! endpoints, streaming, bad input, request-level retry, 429 cooldown,
//! stream cuts, the model fallback chain and the heap given back after a flood.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

const SMALL: &str = "qwen25-3b-instruct";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_chat_completions_embeddings_and_models_through_the_mock() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;

    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["x-zonegate-backend"], "m1");
    assert_eq!(h["x-zonegate-zone"], "az-a");
    assert_eq!(h["x-zonegate-decision-version"], "0");
    assert_eq!(h["x-zonegate-route"], "p2c");
    assert_eq!(h["x-zonegate-model"], MODEL);
    assert!(h.contains_key("x-request-id"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 tok3 "
    );

    let resp = gw.chat().json(&chat_body(3, true)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    assert_eq!(text.matches("chat.completion.chunk").count(), 3);
    assert!(text.trim_end().ends_with("data: [DONE]"));

    let resp = client()
        .post(format!("{}/v1/completions", gw.data))
        .bearer_auth(API_KEY)
        .header("x-request-id", "req-123")
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-request-id"],
        "req-123",
        "a client's request id is kept"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");

    let resp = client()
        .post(format!("{}/v1/embeddings", gw.data))
        .bearer_auth(API_KEY)
        .json(&json!({"model": MODEL, "input": ["a", "b"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);

    let resp = client()
        .get(format!("{}/v1/models", gw.data))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);

    let health = client()
        .get(format!("{}/healthz", gw.data))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = client()
        .get(format!("{}/readyz", gw.data))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
}

/// `request`'s bytes sent on a new connection to the node at `data`, and
/// every byte it answered until it closed.
async fn send_raw(data: &str, request: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = data.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut raw))
        .await
        .expect("the answer ends")
        .unwrap();
    raw
}

/// A chat completion POST of `body` that asks to close after its answer.
fn raw_request(body: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {API_KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// One request on a new connection, written and read as bytes: the
/// answer's head lines (lower-cased names) and its body.
async fn raw_exchange(data: &str, body: &str) -> (Vec<(String, String)>, Vec<u8>) {
    let raw = send_raw(data, &raw_request(body)).await;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8(raw[..end].to_vec()).unwrap();
    let lines = head
        .lines()
        .skip(1)
        .map(|l| {
            let (name, value) = l.split_once(':').unwrap();
            (name.to_ascii_lowercase(), value.trim().to_string())
        })
        .collect();
    (lines, raw[end + 4..].to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_answer_keeps_the_backends_headers_its_length_and_one_date() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    let count =
        |lines: &[(String, String)], name: &str| lines.iter().filter(|(n, _)| n == name).count();
    let value = |lines: &[(String, String)], name: &str| {
        lines
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };

    // A plain answer: framed by length as the backend framed it, with the
    // backend's content type and date (one: the server adds none), and
    // zonegate's headers.
    let (lines, body) = raw_exchange(&gw.data, &chat_body(4, false).to_string()).await;
    let length: usize = value(&lines, "content-length")
        .expect("a length")
        .parse()
        .unwrap();
    assert_eq!(length, body.len(), "{lines:?}");
    assert_eq!(count(&lines, "transfer-encoding"), 0, "{lines:?}");
    assert_eq!(count(&lines, "date"), 1, "{lines:?}");
    assert_eq!(count(&lines, "content-length"), 1, "{lines:?}");
    assert_eq!(
        value(&lines, "content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(value(&lines, "x-zonegate-backend").as_deref(), Some("m1"));
    assert_eq!(value(&lines, "x-zonegate-zone").as_deref(), Some("az-a"));
    assert_eq!(
        value(&lines, "x-zonegate-config-version").as_deref(),
        Some("0")
    );
    assert_eq!(count(&lines, "x-request-id"), 1, "{lines:?}");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 tok3 "
    );

    // A stream: chunked, an event stream, the same headers.
    let (lines, body) = raw_exchange(&gw.data, &chat_body(3, true).to_string()).await;
    assert_eq!(
        value(&lines, "transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert_eq!(count(&lines, "content-length"), 0, "{lines:?}");
    assert_eq!(count(&lines, "date"), 1, "{lines:?}");
    assert!(value(&lines, "content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(value(&lines, "x-zonegate-backend").as_deref(), Some("m1"));
    let text = String::from_utf8_lossy(&body);
    assert_eq!(text.matches("chat.completion.chunk").count(), 3, "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
}

/// A backend that answers every request with one small chat completion
/// and closes, and hands the head of each POST it got to the test.
async fn recording_backend() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (heads, got) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let end = loop {
                    if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end;
                    }
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&raw[..end]).into_owned();
                if head.starts_with("POST ") {
                    let _ = heads.send(head);
                }
                let body = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_gets_the_clients_headers_less_hop_by_hop_credentials_framing_and_zonegates() {
    let (url, mut heads) = recording_backend().await;
    let backends = format!(
        "[[backends]]\nname = \"rec\"\nzone = \"az-a\"\nurl = \"{url}\"\nmodels = [\"{MODEL}\"]\n"
    );
    let gw = NodeProcess::start("az-a", &backends).await;
    let body = chat_body(4, false).to_string();
    let host = url.trim_start_matches("http://");
    // Names in the client's own case; a `Connection` header that names one
    // more hop-by-hop header. Framed by length, the lean server takes the
    // request; chunked, hyper does: both pass on the same headers.
    let framings = [
        (format!("Content-Length: {}", body.len()), body.clone()),
        (
            "Transfer-Encoding: chunked".to_string(),
            format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()),
        ),
    ];
    for (framing, sent) in framings {
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {API_KEY}\r\n\
             Content-Type: application/json\r\nX-Request-Id: req-42\r\nConnection: close, X-Hop\r\n\
             X-Hop: 1\r\nX-Custom:  kept \r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
             Accept-Encoding: gzip, deflate\r\nX-Zonegate-Backend: forged\r\n\
             x-zonegate-min-tier: 1\r\n{framing}\r\n\r\n{sent}"
        );
        let raw = send_raw(&gw.data, &request).await;
        let answer = String::from_utf8_lossy(&raw);
        assert!(answer.starts_with("HTTP/1.1 200 "), "{framing}: {answer}");
        assert!(answer.contains("x-request-id: req-42\r\n"), "{answer}");

        let head = tokio::time::timeout(Duration::from_secs(30), heads.recv())
            .await
            .expect("the backend got the request")
            .unwrap();
        let mut lines: Vec<String> = head
            .split("\r\n")
            .skip(1)
            .map(|l| {
                let (name, value) = l.split_once(": ").expect("name: value");
                format!("{}: {value}", name.to_ascii_lowercase())
            })
            .collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                // zonegate's own: it reads what the backend answers.
                "accept-encoding: identity".to_string(),
                format!("content-length: {}", body.len()),
                "content-type: application/json".to_string(),
                format!("host: {host}"),
                "x-custom: kept".to_string(),
                "x-request-id: req-42".to_string(),
            ],
            "{framing}: {head}"
        );
    }

    // Hostile bytes in a header (a DEL, a NUL, a bare CR): refused with a
    // 400, and nothing reaches the backend.
    for bad in ["a\x7fb", "a\0b", "a\rb"] {
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {API_KEY}\r\n\
             X-Bad: {bad}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let raw = send_raw(&gw.data, &request).await;
        let answer = String::from_utf8_lossy(&raw);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
    }
    // A well-formed request after them is the backend's next POST.
    let raw = send_raw(&gw.data, &raw_request(&body)).await;
    assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200 "));
    let next = tokio::time::timeout(Duration::from_secs(30), heads.recv())
        .await
        .expect("the backend got the request")
        .unwrap();
    assert!(!next.contains("X-Bad") && !next.contains("x-bad"), "{next}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_streamed_chunk_reaches_the_client_before_the_backend_finishes() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    // 8 chunks, 400 ms apart: the backend needs about 3 s to finish.
    mock.faults(json!({"stream_interval_ms": 400})).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;

    let mut resp = gw.chat().json(&chat_body(8, true)).send().await.unwrap();
    let first = resp.chunk().await.unwrap().expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).contains("tok0"));
    // The backend is still generating: it counts the request as running.
    let stats = mock.stats().await;
    assert_eq!(
        stats["in_flight"], 1,
        "backend finished before the first chunk arrived: {stats}"
    );
    let mut rest = Vec::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_errors_and_the_node_keeps_serving() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    // A small body limit to test 413 cheaply.
    let gw = NodeProcess::start_with(
        "az-a",
        "max_body_bytes = 4096",
        &mock.backend_toml(&[MODEL]),
    )
    .await;
    let url = format!("{}/v1/chat/completions", gw.data);
    let c = client();
    let big =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(8 * 1024)}]});
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "no key",
            c.post(&url).json(&chat_body(4, false)),
            401,
            "missing_api_key",
        ),
        (
            "wrong key",
            c.post(&url).bearer_auth("nope").json(&chat_body(4, false)),
            401,
            "invalid_api_key",
        ),
        (
            "malformed JSON",
            c.post(&url).bearer_auth(API_KEY).body("{\"model\":"),
            400,
            "invalid_request",
        ),
        (
            "not an object",
            c.post(&url).bearer_auth(API_KEY).body("[1,2]"),
            400,
            "invalid_request",
        ),
        (
            "wrong type",
            c.post(&url)
                .bearer_auth(API_KEY)
                .json(&json!({"model": MODEL, "stream": "yes"})),
            400,
            "invalid_request",
        ),
        (
            "no model",
            c.post(&url)
                .bearer_auth(API_KEY)
                .json(&json!({"messages": []})),
            400,
            "invalid_request",
        ),
        (
            "unknown model",
            c.post(&url)
                .bearer_auth(API_KEY)
                .json(&json!({"model": "gpt-9"})),
            404,
            "model_not_found",
        ),
        (
            "unknown path",
            c.post(format!("{}/v1/nothing", gw.data))
                .bearer_auth(API_KEY),
            404,
            "unknown_url",
        ),
        (
            "wrong method",
            c.get(&url).bearer_auth(API_KEY),
            405,
            "method_not_allowed",
        ),
        (
            "oversized body",
            c.post(&url).bearer_auth(API_KEY).json(&big),
            413,
            "payload_too_large",
        ),
    ];
    for (what, req, status, code) in cases {
        let resp = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(resp.status().as_u16(), status, "{what}");
        if !matches!(what, "unknown path" | "wrong method") {
            assert_eq!(resp.headers()["x-zonegate-decision-version"], "0", "{what}");
        }
        let v: Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        assert!(v["error"]["type"].is_string(), "{what}");
    }
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the node still serves after bad input");
    assert_eq!(
        mock.stats().await["requests"],
        1,
        "bad requests never reached the backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_and_a_failing_one_never_fail_a_request() {
    let mut doomed = Mock::start("doomed", "az-a", &[MODEL]).await;
    let broken = Mock::start("broken", "az-a", &[MODEL]).await;
    let good = Mock::start("good", "az-a", &[MODEL]).await;
    broken
        .faults(json!({"error_rate": 1.0, "error_status": 500}))
        .await;
    let mut rest: String = [&doomed, &broken, &good]
        .iter()
        .map(|m| m.backend_toml(&[MODEL]))
        .collect();
    // Eight workers can fail on both bad backends at once before either is
    // out: a floor of eight concurrent retries lets each retry at once,
    // whatever the default; the retry budget is not what this test is about.
    rest.push_str("[retry]\nmin_concurrent_retries = 8\n");
    let gw = Arc::new(NodeProcess::start("az-a", &rest).await);

    let killed = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (gw, killed) = (Arc::clone(&gw), Arc::clone(&killed));
        workers.push(tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..40 {
                let was_killed = killed.load(Ordering::SeqCst);
                let resp = gw
                    .chat()
                    .json(&chat_body(4, false))
                    .send()
                    .await
                    .expect("gateway answers");
                let status = resp.status();
                let backend = resp
                    .headers()
                    .get("x-zonegate-backend")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("?")
                    .to_owned();
                let body = resp.text().await.unwrap_or_default();
                assert_eq!(status, 200, "a request failed: {body}");
                served.push((backend, was_killed));
            }
            served
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    doomed.kill().await;
    killed.store(true, Ordering::SeqCst);
    let mut total = 0;
    for w in workers {
        for (backend, after_kill) in w.await.expect("worker finished") {
            total += 1;
            assert_ne!(
                backend, "broken",
                "a 500-answering backend was reported as the server"
            );
            if after_kill {
                assert_ne!(
                    backend, "doomed",
                    "a dead backend was reported as the server"
                );
            }
        }
    }
    assert_eq!(total, 320);
    // Every 500 the broken backend answered was retried elsewhere.
    let broken_answers = broken.stats().await["requests"].as_f64().unwrap();
    let metrics = gw.metrics().await;
    let retries = metric_sum(&metrics, "zonegate_forward_retries_total", &[]);
    assert!(
        retries >= broken_answers,
        "{retries} retries for {broken_answers} failures"
    );
    let backends = gw.admin_get("/admin/v1/backends").await;
    let good_state = backends["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "good")
        .map(|b| b["state"].clone());
    assert_eq!(good_state, Some(json!("up")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_cools_the_backend_down_without_counting_as_a_failure() {
    let busy = Mock::start("busy", "az-a", &[MODEL]).await;
    let calm = Mock::start("calm", "az-a", &[MODEL]).await;
    busy.faults(json!({"error_rate": 1.0, "error_status": 429, "retry_after": 30}))
        .await;
    let rest = format!(
        "{}{}",
        busy.backend_toml(&[MODEL]),
        calm.backend_toml(&[MODEL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;

    for _ in 0..30 {
        let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-zonegate-backend"], "calm");
    }
    // The busy backend was asked at most once: after its 429 it cools down
    // for the 30 s it asked for.
    assert!(busy.stats().await["requests"].as_u64().unwrap() <= 1);
    let backends = gw.admin_get("/admin/v1/backends").await;
    let b = backends["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "busy")
        .unwrap()
        .clone();
    assert_eq!(b["state"], "up", "a 429 never ejects: {b}");
    let events = gw.admin_get("/admin/v1/events").await;
    assert_eq!(events["events"].as_array().unwrap().len(), 0, "{events}");

    // With every backend busy the client gets a 429 with Retry-After.
    calm.faults(json!({"error_rate": 1.0, "error_status": 429, "retry_after": 7}))
        .await;
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "backends_busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_midway_ends_with_an_error_event_and_no_done() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    mock.faults(json!({"stream_cut_after": 2})).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;

    let mut resp = gw.chat().json(&chat_body(8, true)).send().await.unwrap();
    assert_eq!(
        resp.status(),
        200,
        "the stream had started, so the status was already sent"
    );
    let mut text = String::new();
    let mut transport_error = false;
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => break,
            Err(_) => {
                transport_error = true;
                break;
            }
        }
    }
    assert!(
        text.contains("tok1"),
        "chunks before the cut arrive: {text}"
    );
    assert!(
        text.contains("\"code\":\"stream_interrupted\""),
        "an SSE error event ends it: {text}"
    );
    assert!(
        !text.contains("[DONE]"),
        "a truncated stream must never look complete"
    );
    assert!(
        transport_error,
        "the HTTP body is aborted too, not ended cleanly"
    );
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_stream_aborts_total",
            &["backend=\"m1\""]
        ),
        1.0
    );
    assert_eq!(
        mock.stats().await["requests"],
        1,
        "a started stream is never retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_fallback_chain_answers_when_the_primary_has_no_backend() {
    let mut primary = Mock::start("big", "az-a", &[MODEL]).await;
    let small = Mock::start("small", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{MODEL}\"\nfallback = [\"{SMALL}\"]\n",
        primary.backend_toml(&[MODEL]),
        small.backend_toml(&[SMALL]),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    primary.kill().await;

    for _ in 0..10 {
        let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-zonegate-model"], SMALL);
        assert_eq!(resp.headers()["x-zonegate-backend"], "small");
        assert!(resp.headers()["x-zonegate-route"]
            .to_str()
            .unwrap()
            .contains("fallback-model"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_backend_left_is_a_502_that_says_how_many_were_tried() {
    let a = Mock::start("a", "az-a", &[MODEL]).await;
    let b = Mock::start("b", "az-a", &[MODEL]).await;
    for m in [&a, &b] {
        m.faults(json!({"error_rate": 1.0, "error_status": 503}))
            .await;
    }
    let rest = format!("{}{}", a.backend_toml(&[MODEL]), b.backend_toml(&[MODEL]));
    let gw = NodeProcess::start("az-a", &rest).await;
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("all 2 tried"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_model_name_is_rewritten_only_where_it_differs() {
    let mock = Mock::start("m1", "az-a", &["Qwen/Qwen2.5-7B-Instruct"]).await;
    let rest = mock.backend_toml(&[MODEL]).replace(
        "metrics_path",
        &format!("model_names = {{ \"{MODEL}\" = \"Qwen/Qwen2.5-7B-Instruct\" }}\nmetrics_path"),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the mock only knows the physical name");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["model"], "Qwen/Qwen2.5-7B-Instruct");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_balance_keeps_a_session_on_one_backend() {
    let a = Mock::start("a", "az-a", &[MODEL]).await;
    let b = Mock::start("b", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{MODEL}\"\nbalance = \"ring\"\n",
        a.backend_toml(&[MODEL]),
        b.backend_toml(&[MODEL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let mut seen = std::collections::HashSet::new();
    for session in 0..20 {
        let mut first = None;
        for _ in 0..5 {
            let resp = gw
                .chat()
                .header("x-session-id", format!("session-{session}"))
                .json(&chat_body(2, false))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.headers()["x-zonegate-route"], "ring");
            let backend = resp.headers()["x-zonegate-backend"]
                .to_str()
                .unwrap()
                .to_owned();
            assert_eq!(
                first.get_or_insert(backend.clone()),
                &backend,
                "session {session} moved"
            );
            seen.insert(backend);
        }
    }
    assert_eq!(seen.len(), 2, "20 sessions spread over both backends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_short_requests_cross_zones_when_the_home_zone_cannot_serve() {
    let mut home = Mock::start("a1", "az-a", &[MODEL]).await;
    let away = Mock::start("b1", "az-b", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        home.backend_toml(&[MODEL]),
        away.backend_toml(&[MODEL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;

    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(
        resp.headers()["x-zonegate-zone"],
        "az-a",
        "the home zone serves while it can"
    );
    home.kill().await;

    for _ in 0..10 {
        let resp = gw.chat().json(&chat_body(64, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-zonegate-zone"], "az-b");
        let route = resp.headers()["x-zonegate-route"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(route.contains("fallback:cross-zone"), "{route}");
    }
    // No max_tokens: long, so it stays home and gets a clear 503.
    let long = json!({"model": MODEL, "messages": [{"role": "user", "content": "write a novel"}]});
    let resp = gw.chat().json(&long).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "zone_unavailable", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_taken_address_refuses_to_start() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    let taken = gw.data.trim_start_matches("http://").to_owned();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}{}",
        base_toml("az-a", &dir.path().join("data"), ""),
        mock.backend_toml(&[MODEL])
    )
    .replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{taken}\""),
        1,
    );
    let path = dir.path().join("second.toml");
    std::fs::write(&path, config).unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    assert!(
        !out.status.success(),
        "the data-plane listeners use SO_REUSEPORT; a second node must not join them"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node.listen") && err.contains("in use"),
        "{err}"
    );
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the first node keeps serving");
}

/// The scheduling policy (field 41 of `stat`) of each of `pid`'s
/// data-plane threads.
fn data_plane_policies(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("zonegate-data") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        let policy = zonegate::node::sched::stat_field(&stat, 41).unwrap();
        out.push(policy.parse().unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_threads_carry_connections_within_two_of_each_other() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start_with(
        "az-a",
        "data_plane_threads = 2",
        &mock.backend_toml(&[MODEL]),
    )
    .await;
    // One client each: twelve keep-alive connections, held open.
    let mut clients = Vec::new();
    for _ in 0..12 {
        let c = client();
        let r = c
            .post(format!("{}/v1/chat/completions", gw.data))
            .bearer_auth(API_KEY)
            .json(&chat_body(2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        clients.push(c);
    }
    let text = gw.metrics().await;
    let per_thread: Vec<f64> = ["thread=\"0\"", "thread=\"1\""]
        .iter()
        .map(|t| metric_sum(&text, "zonegate_listener_thread_connections", &[t]))
        .collect();
    assert_eq!(per_thread.iter().sum::<f64>(), 12.0, "{per_thread:?}");
    assert!(
        (per_thread[0] - per_thread[1]).abs() <= 2.0,
        "{per_thread:?}"
    );
    // The handovers are counted (how many depends on the kernel's hash).
    assert!(
        text.contains("zonegate_listener_handed_over_total{listener=\"data\"}"),
        "{text}"
    );
    drop(clients);
    gw.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_threads_run_under_sched_batch_unless_configured_normal() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    for (node_extra, want) in [
        ("data_plane_threads = 2", SCHED_BATCH),
        (
            "data_plane_threads = 2\ndata_plane_scheduling = \"normal\"",
            SCHED_OTHER,
        ),
    ] {
        let gw = NodeProcess::start_with("az-a", node_extra, &mock.backend_toml(&[MODEL])).await;
        // The policy is set as each thread starts, before it serves.
        let r = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let policies = data_plane_policies(gw.pid().unwrap());
        assert_eq!(policies, vec![want; 2], "{node_extra}");
        gw.kill().await;
    }
}

/// A flood's end gives its memory back (`node::heap`): 600 connections
/// held open, then closed, make the node trim its heap once, counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_flood_of_connections_trims_the_heap() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    let addr = gw.data.trim_start_matches("http://").to_owned();
    let trims = |text: &str| metric_sum(text, "zonegate_heap_trims_total", &[]);
    assert_eq!(trims(&gw.metrics().await), 0.0, "no flood yet");
    let mut held = Vec::new();
    for _ in 0..600 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    eventually(Duration::from_secs(30), "600 connections open", || async {
        let text = gw.metrics().await;
        metric_sum(
            &text,
            "zonegate_listener_connections",
            &["listener=\"data\""],
        ) >= 600.0
    })
    .await;
    // The node samples its load once a second: let it see the peak.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(held);
    eventually(
        Duration::from_secs(60),
        "a trim after the flood",
        || async { trims(&gw.metrics().await) >= 1.0 },
    )
    .await;
    let text = gw.metrics().await;
    assert!(
        text.contains("zonegate_heap_released_bytes_total"),
        "{text}"
    );
    gw.kill().await;
}
