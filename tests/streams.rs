//! Black-box tests of requests over time, against mock backends: long
//! generations are work, not failures; broken streams are continued so the
//! client gets the answer exactly once, or end in an error event a strict
//! SSE parser reads; same-model retries, short `Retry-After` waits,
//! context-length fallback, half-open recovery, the passive ejection cap,
//! p2c ties and outcome labels; a client that stops reading is closed and
//! frees its backend.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

const BIG: &str = "big";
const SMALL: &str = "small";

/// The mock's whole answer of `n` words.
fn answer(n: u64) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

fn stream_body(model: &str, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": true,
        "messages": [{"role": "user", "content": "count"}],
    })
}

/// A stream as a strict client reads it: every event's data is JSON or
/// `[DONE]` (anything else panics, as the `openai` SDK would raise), the
/// text of every delta in order, errors and comments apart.
#[derive(Debug, Default)]
struct Sse {
    text: String,
    done: bool,
    errors: Vec<Value>,
    comments: Vec<String>,
    ids: Vec<String>,
    /// The connection was aborted rather than ended.
    aborted: bool,
}

async fn read_sse(mut resp: reqwest::Response) -> Sse {
    let mut raw = String::new();
    let mut sse = Sse::default();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => raw.push_str(std::str::from_utf8(&c).expect("UTF-8 stream")),
            Ok(None) => break,
            Err(_) => {
                sse.aborted = true;
                break;
            }
        }
    }
    assert!(
        raw.is_empty() || raw.ends_with("\n\n"),
        "the stream ends on an event boundary: {raw:?}"
    );
    for event in raw.split("\n\n").filter(|e| !e.is_empty()) {
        for line in event.lines() {
            if let Some(c) = line.strip_prefix(':') {
                sse.comments.push(c.trim().to_owned());
                continue;
            }
            let data = line
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {line:?} in {raw}"));
            assert!(!sse.done, "nothing may follow [DONE]: {raw}");
            if data == "[DONE]" {
                sse.done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("event is not JSON ({e}): {data:?}"));
            if v.get("error").is_some() {
                sse.errors.push(v);
                continue;
            }
            if let Some(id) = v["id"].as_str() {
                sse.ids.push(id.to_owned());
            }
            let choice = &v["choices"][0];
            let piece = choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
                .unwrap_or("");
            sse.text.push_str(piece);
        }
    }
    sse
}

fn assert_whole(sse: &Sse, n: u64) {
    assert_eq!(sse.text, answer(n), "the answer exactly once: {sse:?}");
    assert!(sse.done && sse.errors.is_empty() && !sse.aborted, "{sse:?}");
    let first = &sse.ids[0];
    assert!(
        sse.ids.iter().all(|id| id == first),
        "one completion id: {sse:?}"
    );
}

/// A node with `big` on two backends (both failing the same way after 40
/// chunks) and `small` as its fallback on a third.
async fn two_backends_and_a_fallback(fault: Value, model_extra: &str) -> (NodeProcess, Vec<Mock>) {
    let b1 = Mock::start("b1", "az-a", &[BIG]).await;
    let b2 = Mock::start("b2", "az-a", &[BIG]).await;
    let s1 = Mock::start("s1", "az-a", &[SMALL]).await;
    for m in [&b1, &b2] {
        m.faults(fault.clone()).await;
    }
    let rest = format!(
        "{}{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n{model_extra}\n",
        b1.backend_toml(&[BIG]),
        b2.backend_toml(&[BIG]),
        s1.backend_toml(&[SMALL]),
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    (gw, vec![b1, b2, s1])
}

async fn continued_on_the_second_backend(fault: Value, model_extra: &str) {
    let (gw, mocks) = two_backends_and_a_fallback(fault, model_extra).await;
    let started = Instant::now();
    let resp = gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let sse = read_sse(resp).await;
    assert_whole(&sse, 60);
    assert_eq!(sse.comments.len(), 1, "one seam: {sse:?}");
    let seam = format!("after {} chars", answer(40).len());
    assert!(
        sse.comments[0].starts_with("zonegate continued on b") && sse.comments[0].ends_with(&seam),
        "{:?}",
        sse.comments
    );
    println!("whole answer after a break in {:?}", started.elapsed());
    let stats = [mocks[0].stats().await, mocks[1].stats().await];
    let asked: u64 = stats.iter().map(|s| s["requests"].as_u64().unwrap()).sum();
    assert_eq!(asked, 2, "one request, one continuation");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_stream_continuations_total",
            &["outcome=\"continued\""]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "zonegate_requests_total", &["outcome=\"ok\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_40_of_60_tokens_is_continued_on_another_backend() {
    continued_on_the_second_backend(json!({"stream_cut_after": 40}), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stalls_is_continued_after_the_idle_timeout() {
    continued_on_the_second_backend(json!({"stream_stall_after": 40}), "idle_timeout = \"1s\"\n")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunk_is_never_forwarded_and_the_stream_is_continued() {
    continued_on_the_second_backend(json!({"malformed_chunk_after": 40}), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_inside_an_event_is_continued_on_the_fallback_model() {
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    big.faults(json!({"stream_cut_after": 40, "cut_inside_event": true}))
        .await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let resp = gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap();
    let sse = read_sse(resp).await;
    assert_whole(&sse, 60);
    assert!(sse.comments[0].contains("s1/small"), "{:?}", sse.comments);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continuation_none_a_cut_inside_an_event_ends_in_a_parseable_error() {
    let (gw, mocks) = two_backends_and_a_fallback(
        json!({"stream_cut_after": 40, "cut_inside_event": true}),
        "continuation = \"none\"\n",
    )
    .await;
    let resp = gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap();
    let sse = read_sse(resp).await;
    assert_eq!(sse.text, answer(40), "the whole events before the cut");
    assert!(!sse.done, "a truncated stream never looks complete");
    assert!(sse.aborted, "and the connection is aborted");
    assert_eq!(sse.errors.len(), 1, "{sse:?}");
    assert_eq!(sse.errors[0]["error"]["code"], "stream_interrupted");
    assert_eq!(mocks[2].stats().await["requests"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_without_prefill_continues_by_a_restart_whose_prefix_matches() {
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    big.faults(json!({"stream_cut_after": 40})).await;
    small.faults(json!({"reject_prefill": true})).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n\n[[models]]\nname = \"{SMALL}\"\ncontinuation = \"restart\"\n",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let sse = read_sse(gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap()).await;
    assert_whole(&sse, 60);

    // A regenerated answer that differs ends in the error event, carrying
    // the original failure.
    small.faults(json!({"answer_salt": "x"})).await;
    let sse = read_sse(gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap()).await;
    assert_eq!(sse.text, answer(40));
    assert!(!sse.done && sse.errors.len() == 1, "{sse:?}");
    let message = sse.errors[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("upstream reset"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prefill_is_never_what_the_client_sees() {
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    big.faults(json!({"stream_cut_after": 40})).await;
    small.faults(json!({"reject_prefill": true})).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let sse = read_sse(gw.chat().json(&stream_body(BIG, 60)).send().await.unwrap()).await;
    assert_eq!(sse.text, answer(40));
    assert_eq!(sse.errors.len(), 1, "{sse:?}");
    let message = sse.errors[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("upstream reset") && !message.contains("prefill"),
        "{message}"
    );
    assert_eq!(small.stats().await["requests"], 1, "the prefill was asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_40s_non_streaming_generation_is_work_not_a_failure() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let other = Mock::start("m2", "az-a", &[MODEL]).await;
    let rest = format!(
        "{}{}",
        mock.backend_toml(&[MODEL]),
        other.backend_toml(&[MODEL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    for m in [&mock, &other] {
        m.faults(json!({"generation_ms": 40_000})).await;
    }
    let started = Instant::now();
    let resp = gw.chat().json(&chat_body(8, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(started.elapsed() >= Duration::from_secs(40));
    let route = resp.headers()["x-zonegate-route"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(!route.contains("retry"), "one attempt: {route}");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], answer(8));
    let asked = mock.stats().await["requests"].as_u64().unwrap()
        + other.stats().await["requests"].as_u64().unwrap();
    assert_eq!(asked, 1, "the GPU work is never repeated");
    let metrics = gw.metrics().await;
    let attempts = metric_sum(&metrics, "zonegate_forward_attempts_total", &[]);
    assert_eq!(attempts, 1.0, "{metrics}");
    assert_eq!(
        metric_sum(&metrics, "zonegate_requests_total", &["outcome=\"ok\""]),
        1.0
    );
    for b in gw.admin_get("/admin/v1/backends").await["backends"]
        .as_array()
        .unwrap()
    {
        assert_eq!(b["state"], "up", "{b}");
        assert_eq!(b["ejections"], 0, "{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_backend_answering_500_once_serves_the_model_on_the_second_try() {
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    big.faults(json!({"status_sequence": [500, 200]})).await;
    let mut body = stream_body(BIG, 4);
    body["stream"] = false.into();
    let resp = gw.chat().json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-model"], BIG);
    assert_eq!(resp.headers()["x-zonegate-route"], "p2c, retry:1");
    assert_eq!(big.stats().await["requests"], 2);
    assert_eq!(small.stats().await["requests"], 0);

    // A 429 asking for 2 s is waited out on the same model.
    big.faults(json!({"status_sequence": [429, 200], "retry_after": 2}))
        .await;
    let started = Instant::now();
    let resp = gw.chat().json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(resp.headers()["x-zonegate-model"], BIG);
    assert_eq!(small.stats().await["requests"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_length_exceeded_goes_to_the_larger_model_once() {
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    small.faults(json!({"context_length_exceeded": true})).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{SMALL}\"\ncontext_fallback = [\"{BIG}\"]\n",
        small.backend_toml(&[SMALL]),
        big.backend_toml(&[BIG])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let mut body = stream_body(SMALL, 4);
    body["stream"] = false.into();
    let resp = gw.chat().json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-zonegate-model"], BIG);
    assert!(resp.headers()["x-zonegate-route"]
        .to_str()
        .unwrap()
        .contains("context-fallback"));
    assert_eq!(small.stats().await["requests"], 1, "asked once");

    // Without a larger model, the client gets the backend's own 400.
    big.faults(json!({"context_length_exceeded": true})).await;
    let resp = gw.chat().json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_primary_serves_again_within_5s_through_half_open_trials() {
    let big = Mock::start("b1", "az-a", &[BIG]).await;
    let small = Mock::start("s1", "az-a", &[SMALL]).await;
    let rest = format!(
        "{}{}[[models]]\nname = \"{BIG}\"\nfallback = [\"{SMALL}\"]\n",
        big.backend_toml(&[BIG]),
        small.backend_toml(&[SMALL])
    );
    let gw = NodeProcess::start("az-a", &rest).await;
    let mut body = stream_body(BIG, 4);
    body["stream"] = false.into();
    big.faults(json!({"error_rate": 1.0})).await;
    let started = Instant::now();
    let mut recovered_at = None;
    let mut served_by_big_after = None;
    while served_by_big_after.is_none() {
        let t = started.elapsed();
        if recovered_at.is_none() && t >= Duration::from_secs(6) {
            big.faults(json!({"error_rate": 0.0})).await;
            recovered_at = Some(t);
        }
        let resp = gw.chat().json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200, "every request is answered");
        if let Some(r) = recovered_at {
            if resp.headers()["x-zonegate-model"] == BIG {
                served_by_big_after = Some(started.elapsed() - r);
            }
        }
        assert!(t < Duration::from_secs(40), "the primary never came back");
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    let after = served_by_big_after.unwrap();
    println!("primary serving again {after:?} after it recovered");
    assert!(after <= Duration::from_secs(5), "{after:?}");
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "zonegate_backend_ejections_total",
            &["backend=\"b1\""]
        ) >= 1.0,
        "the lone primary was ejected, and came back through a trial: {metrics}"
    );
    assert!(small.stats().await["requests"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_requests_eject_at_most_max_ejected_percent_of_a_pool() {
    let mocks = [
        Mock::start("p1", "az-a", &[MODEL]).await,
        Mock::start("p2", "az-a", &[MODEL]).await,
        Mock::start("p3", "az-a", &[MODEL]).await,
    ];
    let rest: String = mocks.iter().map(|m| m.backend_toml(&[MODEL])).collect();
    let gw = NodeProcess::start("az-a", &rest).await;
    for m in &mocks {
        m.faults(json!({"error_rate": 1.0})).await;
    }
    for _ in 0..5 {
        let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
        assert!(resp.status().is_server_error());
    }
    let backends = gw.admin_get("/admin/v1/backends").await;
    let down = backends["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["state"] == "down")
        .count();
    assert!(down <= 1, "50% of 3 is 1: {backends}");
    for m in &mocks {
        m.faults(json!({"error_rate": 0.0})).await;
    }
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the model still answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_requests_over_two_equal_backends_reach_both() {
    let a = Mock::start("e1", "az-a", &[MODEL]).await;
    let b = Mock::start("e2", "az-a", &[MODEL]).await;
    let rest = format!("{}{}", a.backend_toml(&[MODEL]), b.backend_toml(&[MODEL]));
    let gw = NodeProcess::start("az-a", &rest).await;
    for _ in 0..20 {
        let resp = gw.chat().json(&chat_body(2, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let (na, nb) = (
        a.stats().await["requests"].clone(),
        b.stats().await["requests"].clone(),
    );
    assert!(
        na.as_u64().unwrap() > 0 && nb.as_u64().unwrap() > 0,
        "{na} / {nb}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_successes_are_counted_ok_and_bad_utf8_is_a_400() {
    let mock = Mock::start("m1", "az-a", &[MODEL]).await;
    let gw = NodeProcess::start("az-a", &mock.backend_toml(&[MODEL])).await;
    for _ in 0..3 {
        let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "zonegate_requests_total", &["outcome=\"ok\""]),
        3.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_requests_total",
            &["outcome=\"client_gone\""]
        ),
        0.0
    );
    let mut body =
        br#"{"model":"qwen25-7b-instruct","messages":[{"role":"user","content":"caf"#.to_vec();
    body.extend_from_slice(&[0xC3, 0x28]);
    body.extend_from_slice(br#""}]}"#);
    let resp = gw
        .chat()
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(mock.stats().await["requests"], 3, "never forwarded");
}

#[tokio::test]
async fn a_client_that_stops_reading_its_stream_is_closed_and_frees_the_backend() {
    use tokio::io::AsyncWriteExt;
    let mock = Mock::start("m1", "az-a", &[BIG]).await;
    // Events of ~90 KB (a long salt in every word), more in all than the
    // kernel's largest send buffer (4 MiB), and the backend stays
    // connected after 60 of them: only the gateway can end the request.
    mock.faults(json!({"answer_salt": "s".repeat(90_000), "stream_stall_after": 60}))
        .await;
    let node = NodeProcess::start(
        "az-a",
        &format!(
            "{}[node.limits]\nsend_timeout = \"500ms\"\n",
            mock.backend_toml(&[BIG])
        ),
    )
    .await;
    // A client with a small receive window that sends its request and
    // never reads: the gateway's writes fill the socket and block.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = node.data.trim_start_matches("http://").parse().unwrap();
    let mut client = socket.connect(addr).await.unwrap();
    let body = stream_body(BIG, 64).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    client.write_all(body.as_bytes()).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the stream reaches the backend",
        || async { mock.stats().await["in_flight"] == 1 },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the connection is closed by the send timeout",
        || async {
            metric_sum(
                &node.metrics().await,
                "zonegate_listener_closed_total",
                &["listener=\"data\"", "reason=\"send_timeout\""],
            ) == 1.0
        },
    )
    .await;
    // The request and its backend connection went with it, while the
    // client still holds its end open.
    eventually(
        Duration::from_secs(30),
        "the backend is released",
        || async { mock.stats().await["in_flight"] == 0 },
    )
    .await;
    drop(client);
    node.kill().await;
}
