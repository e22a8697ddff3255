//! A minimal keep-alive HTTP/1.1 server that answers at once, and a
//! measurement of the drill's load generator against it (so the
//! generator, not the server, is measured). Shared by the `load_rate` test
//! and bench.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use zonegate_chaos::load::{Entry, Load, Plan};
use zonegate_chaos::scenario::Mix;

/// Answers every request on a keep-alive connection with a tiny chat
/// completion.
pub async fn tiny_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let body = r#"{"choices":[{"message":{"content":"ok"}}]}"#;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-zonegate-zone: az-a\r\nx-zonegate-decision-version: 0\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut buf = Vec::with_capacity(8192);
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: head, then content-length bytes.
                    let end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p + 4;
                        }
                        match c.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + len {
                        match c.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + len);
                    if c.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

pub async fn measure(rps: f64, secs: u64) -> (f64, u64, u64) {
    let url = tiny_server().await;
    let start = Instant::now();
    let mut load = Load::start(
        Plan {
            rps,
            mix: Mix {
                short: 1.0,
                long: 0.0,
                stream: 0.0,
            },
            sessions: 100,
            api_keys: vec!["k".into()],
            model: "m".into(),
            timeout: Duration::from_secs(5),
            concurrency: 512,
            short_max_tokens: 16,
        },
        vec![Entry {
            node: 1,
            zone: "az-a".into(),
            url,
            in_rotation: true,
            clients_to: None,
        }],
        start,
        start,
    );
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let out = load.stop().await;
    let ok = out.samples.iter().filter(|s| s.ok).count() as u64;
    let sent = out.samples.len() as u64;
    (ok as f64 / secs as f64, sent, out.not_sent)
}
