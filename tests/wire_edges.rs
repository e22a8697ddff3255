//! Black-box tests of what a backend or a client can do on the wire:
//! content codings (zonegate asks backends for none, and passes a coded
//! answer on untouched), statuses outside 100–599, zonegate's own headers
//! sent by a client, silent and crowding connections, early error answers
//! to large bodies, and requests without `Host`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The events of the stream the test backend sends: eight text chunks,
/// a usage chunk, `[DONE]`.
fn events() -> Vec<String> {
    let chunk = |delta: serde_json::Value, usage: serde_json::Value| {
        let v = json!({"id": "c1", "object": "chat.completion.chunk", "created": 7,
            "model": MODEL, "choices": delta, "usage": usage});
        format!("data: {v}\n\n")
    };
    let mut events: Vec<String> = (0..8)
        .map(|i| {
            let delta = json!([{"index": 0, "delta": {"content": format!("tok{i} ")},
                "finish_reason": null}]);
            chunk(delta, json!(null))
        })
        .collect();
    let usage = json!({"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13});
    events.push(chunk(json!([]), usage));
    events.push("data: [DONE]\n\n".into());
    events
}

/// When the test backend gzips its stream.
#[derive(Clone, Copy)]
enum Gzip {
    /// When the request's `Accept-Encoding` allows it (as a server
    /// honouring RFC 9110 §12.5.3 does).
    IfAccepted,
    /// Always, asked or not.
    Always,
}

/// Whether an `Accept-Encoding` value allows gzip (a `q=0` refuses it).
fn accepts_gzip(value: &str) -> bool {
    value.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or("");
        let refused = parts.any(|p| p.replace(' ', "") == "q=0");
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
    })
}

/// The request head at the front of `conn`'s bytes, and its body read
/// by its `Content-Length`; `None` when the connection ends first.
async fn read_request(conn: &mut TcpStream) -> Option<String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let length: usize = header(&head, "content-length").map_or(0, |v| v.parse().unwrap_or(0));
    let mut have = raw.len() - (end + 4);
    while have < length {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => have += n,
        }
    }
    Some(head)
}

/// The values of header `name` in `head` (lines after the first).
fn headers<'a>(head: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    head.split("\r\n").skip(1).filter_map(move |line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn header<'a>(head: &'a str, name: &'a str) -> Option<&'a str> {
    headers(head, name).next()
}

/// A backend that streams [`events`] for every POST, each event flushed
/// as its own chunk (gzipped per `gzip`, with a sync flush after each so
/// it leaves at once, as a streaming server's compressor does), and
/// answers anything else (health probes) with a small JSON. It hands the
/// head of each POST to the test.
async fn sse_backend(gzip: Gzip) -> (String, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (heads, got) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let Some(head) = read_request(&mut conn).await else {
                    return;
                };
                if !head.starts_with("POST ") {
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                        .await;
                    return;
                }
                let coded = match gzip {
                    Gzip::Always => true,
                    Gzip::IfAccepted => headers(&head, "accept-encoding").any(accepts_gzip),
                };
                let _ = heads.send(head);
                let mut out = String::from(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                     transfer-encoding: chunked\r\nconnection: close\r\n",
                );
                if coded {
                    out.push_str("content-encoding: gzip\r\n");
                }
                out.push_str("\r\n");
                if conn.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                let mut pieces: Vec<Vec<u8>> = Vec::new();
                for event in events() {
                    if coded {
                        gz.write_all(event.as_bytes()).unwrap();
                        gz.flush().unwrap();
                        pieces.push(std::mem::take(gz.get_mut()));
                    } else {
                        pieces.push(event.into_bytes());
                    }
                }
                if coded {
                    pieces.push(gz.finish().unwrap());
                }
                for piece in pieces.into_iter().filter(|p| !p.is_empty()) {
                    let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                    chunk.extend_from_slice(&piece);
                    chunk.extend_from_slice(b"\r\n");
                    if conn.write_all(&chunk).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let _ = conn.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    (url, got)
}

/// A node whose one backend, for [`MODEL`], is at `url`.
async fn node_with_backend(url: &str, node_extra: &str) -> NodeProcess {
    let backends = format!(
        "[[backends]]\nname = \"b1\"\nzone = \"az-a\"\nurl = \"{url}\"\nmodels = [\"{MODEL}\"]\n"
    );
    NodeProcess::start_with("az-a", node_extra, &backends).await
}

/// `request`'s bytes sent on a new connection to the node at `data`, and
/// every byte it answered until it closed.
async fn send_raw(data: &str, request: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(data.trim_start_matches("http://"))
        .await
        .unwrap();
    conn.write_all(request).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut raw))
        .await
        .expect("the answer ends")
        .unwrap();
    raw
}

/// A streamed chat completion POST with `extra` header lines, asking to
/// close after its answer.
fn stream_request(extra: &str) -> Vec<u8> {
    let body = chat_body(8, true).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {API_KEY}\r\n\
         content-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An answer's head and its body, de-chunked when it came chunked.
fn split_answer(raw: &[u8]) -> (String, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut rest = &raw[end + 4..];
    if header(&head, "transfer-encoding") != Some("chunked") {
        return (head, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk-size line");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16)
            .expect("a chunk size");
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (head, body);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_capable_backend_streams_plain_events_to_a_client_that_asked_for_gzip() {
    let (url, mut heads) = sse_backend(Gzip::IfAccepted).await;
    let gw = node_with_backend(&url, "").await;
    // As the Python SDKs send it.
    let raw = send_raw(
        &gw.data,
        &stream_request("accept-encoding: gzip, deflate\r\n"),
    )
    .await;
    let (head, body) = split_answer(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let seen = tokio::time::timeout(Duration::from_secs(30), heads.recv())
        .await
        .expect("the backend got the request")
        .unwrap();
    assert_eq!(
        headers(&seen, "accept-encoding").collect::<Vec<_>>(),
        ["identity"],
        "zonegate asks for no coding, whatever the client accepts: {seen}"
    );
    assert_eq!(header(&head, "content-encoding"), None, "{head}");
    assert_eq!(
        String::from_utf8_lossy(&body),
        events().concat(),
        "every event, whole, in order"
    );
    answered_ok(&gw, 1).await;
}

/// Waits until `n` requests ended `ok` (counted when their stream ended),
/// and checks that no stream was counted as broken.
async fn answered_ok(gw: &NodeProcess, n: u64) {
    eventually(
        Duration::from_secs(30),
        "the requests counted ok",
        || async {
            let metrics = gw.metrics().await;
            metric_sum(&metrics, "zonegate_requests_total", &["outcome=\"ok\""]) == n as f64
        },
    )
    .await;
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "zonegate_stream_aborts_total", &[]),
        0.0,
        "no malformed_chunk counted against a healthy backend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_gzipped_unasked_is_passed_on_untouched_and_never_counted_as_broken() {
    let (url, mut heads) = sse_backend(Gzip::Always).await;
    let gw = node_with_backend(&url, "").await;
    for _ in 0..2 {
        let raw = send_raw(&gw.data, &stream_request("accept-encoding: gzip\r\n")).await;
        let (head, body) = split_answer(&raw);
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert_eq!(header(&head, "content-encoding"), Some("gzip"), "{head}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .expect("the backend's gzip stream, whole and untouched");
        assert_eq!(text, events().concat());
        heads.recv().await.unwrap();
    }
    answered_ok(&gw, 2).await;
}

/// A backend that answers every request with `answer` (raw bytes) and
/// closes.
async fn raw_backend(answer: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_request(&mut conn).await.is_some() {
                    let _ = conn.write_all(answer).await;
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_status_outside_100_to_599_is_a_502() {
    let url =
        raw_backend(b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
    let gw = node_with_backend(&url, "").await;
    let resp = gw.chat().json(&chat_body(4, false)).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");
}

/// The `[node.limits]` table, for `NodeProcess::start_with`.
fn node_limits(keys: &str) -> String {
    format!("\n[node.limits]\n{keys}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_by_the_header_read_timeout_from_accept() {
    let url = raw_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
    let gw = node_with_backend(
        &url,
        &node_limits("header_read_timeout = \"500ms\"\nidle_timeout = \"120s\""),
    )
    .await;
    let mut silent = TcpStream::connect(gw.data.trim_start_matches("http://"))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), silent.read(&mut buf))
        .await
        .expect("closed long before the idle timeout");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    eventually(Duration::from_secs(30), "the close counted", || async {
        metric_sum(
            &gw.metrics().await,
            "zonegate_listener_closed_total",
            &["listener=\"data\"", "reason=\"header_timeout\""],
        ) == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_address_over_max_connections_per_ip_is_refused_at_accept() {
    let url = raw_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
    let gw = node_with_backend(&url, &node_limits("max_connections_per_ip = 3")).await;
    let addr = gw.data.trim_start_matches("http://").to_owned();
    // Three held open, each with a request answered (so each is counted
    // before the next connects, whichever thread took it).
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = TcpStream::connect(&addr).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        held.push(conn);
    }
    let mut fourth = TcpStream::connect(&addr).await.unwrap();
    let _ = fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await;
    let mut buf = [0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(30), fourth.read(&mut buf))
        .await
        .expect("closed at accept");
    assert!(matches!(read, Ok(0) | Err(_)), "served: {read:?}");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "zonegate_listener_closed_total",
            &["listener=\"data\"", "reason=\"per_ip_limit\""],
        ),
        1.0
    );
    // One closed: its place is free again.
    drop(held.pop());
    eventually(Duration::from_secs(30), "a place freed", || {
        let addr = addr.clone();
        async move {
            let mut conn = TcpStream::connect(&addr).await.unwrap();
            let _ = conn
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
                .await;
            let mut answer = Vec::new();
            let _ = conn.read_to_end(&mut answer).await;
            answer.starts_with(b"HTTP/1.1 200")
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_host_is_a_400_and_http10_without_one_is_served() {
    let url = raw_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
    let gw = node_with_backend(&url, "").await;
    let body = chat_body(4, false).to_string();
    let post = |version: &str, framing: String, host: &str| {
        format!(
            "POST /v1/chat/completions {version}\r\n{host}authorization: Bearer {API_KEY}\r\n\
             content-type: application/json\r\n{framing}connection: close\r\n\r\n"
        )
    };
    let length = format!("content-length: {}\r\n", body.len());
    let chunked = "transfer-encoding: chunked\r\n".to_string();
    let chunked_body = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let refused = [
        format!("{}{body}", post("HTTP/1.1", length.clone(), "")),
        format!("{}{chunked_body}", post("HTTP/1.1", chunked.clone(), "")),
        format!(
            "{}{body}",
            post("HTTP/1.1", length.clone(), "host: a\r\nhost: b\r\n")
        ),
    ];
    for request in refused {
        let raw = send_raw(&gw.data, request.as_bytes()).await;
        let answer = String::from_utf8_lossy(&raw);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{request}\n{answer}");
    }
    let raw = send_raw(
        &gw.data,
        format!("{}{body}", post("HTTP/1.0", length, "")).as_bytes(),
    )
    .await;
    let answer = String::from_utf8_lossy(&raw);
    assert!(answer.contains(" 200 "), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_reaches_a_client_still_uploading_a_large_body() {
    let url = raw_backend(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
    let gw = node_with_backend(&url, "").await;
    // More than loopback's socket buffers hold on both sides together.
    const BODY: usize = 32 * 1024 * 1024;
    let mut conn = TcpStream::connect(gw.data.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer wrong\r\n\
         content-type: application/json\r\ncontent-length: {BODY}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    while sent < BODY {
        conn.write_all(&chunk)
            .await
            .unwrap_or_else(|e| panic!("reset after {sent} bytes of the body: {e}"));
        sent += chunk.len();
    }
    conn.shutdown().await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut raw))
        .await
        .expect("closed")
        .expect("the answer, not a reset");
    let (head, body) = split_answer(&raw);
    assert!(head.starts_with("HTTP/1.1 401 "), "{head}");
    let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(error["error"]["message"].is_string(), "{error}");
}
