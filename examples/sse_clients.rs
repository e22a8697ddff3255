//! The client of `benches/streams.sh`: CONNS keep-alive connections, each
//! asking for one streamed chat completion after another for SECONDS, and
//! what a reader of the streams saw: the token events delivered, the gaps
//! between one stream's consecutive token events (the inter-token latency a
//! user watches) and the time to the first token.
//!
//! ```text
//! sse_clients URL CONNS SECONDS BODY KEY
//! RESULT streams tokens errors gap_p50_us gap_p99_us gap_p999_us gap_max_us ttft_p99_us
//! ```
//!
//! Connections start spread over the first second so the streams' events
//! are spread in phase, as independent users' are; gaps and first tokens
//! are counted from the second second on. One thread: the client's own
//! scheduling delay is in every target's gaps alike, so a proxy's added
//! inter-token latency is its gaps' percentile minus direct's.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Request};
use tokio::net::TcpStream;

/// What one connection saw.
#[derive(Default)]
struct Seen {
    streams: u64,
    tokens: u64,
    errors: u64,
    /// Microseconds between consecutive token events of one stream.
    gaps: Vec<u32>,
    /// Microseconds from sending the request to its first token event.
    first_tokens: Vec<u32>,
}

struct Target {
    addr: String,
    host: String,
    path: String,
    body: Bytes,
    key: String,
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Token events in one body chunk: `data: {` lines (not `data: [DONE]`).
fn token_events(chunk: &[u8]) -> usize {
    memchr::memmem::find_iter(chunk, b"data: {").count()
}

async fn client(target: &Target, start: Instant, counted_from: Instant, end: Instant) -> Seen {
    tokio::time::sleep_until(start.into()).await;
    let mut seen = Seen::default();
    while Instant::now() < end {
        let Ok(tcp) = TcpStream::connect(&target.addr).await else {
            seen.errors += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let io = hyper_util::rt::TokioIo::new(tcp);
        let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(io).await else {
            seen.errors += 1;
            continue;
        };
        tokio::spawn(conn);
        while Instant::now() < end {
            let req = Request::post(target.path.as_str())
                .header(header::HOST, target.host.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::AUTHORIZATION, format!("Bearer {}", target.key))
                .body(Full::new(target.body.clone()))
                .expect("a valid request");
            let sent = Instant::now();
            let Ok(resp) = sender.send_request(req).await else {
                seen.errors += 1;
                break;
            };
            let ok = resp.status().is_success();
            let mut body = resp.into_body();
            let mut last = None::<Instant>;
            let mut done = true;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    done = false;
                    break;
                };
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                let now = Instant::now();
                let n = token_events(data);
                if n == 0 {
                    continue;
                }
                seen.tokens += n as u64;
                if now >= counted_from {
                    match last {
                        None => seen.first_tokens.push(micros(now - sent)),
                        Some(at) => seen.gaps.push(micros(now - at)),
                    }
                    // Events that came in one chunk came together.
                    seen.gaps.extend(std::iter::repeat_n(0, n - 1));
                }
                last = Some(now);
            }
            if ok && done {
                seen.streams += 1;
            } else {
                seen.errors += 1;
                break;
            }
        }
    }
    seen
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, conns, seconds, body, key] = &args[..] else {
        anyhow::bail!("usage: sse_clients URL CONNS SECONDS BODY KEY");
    };
    let uri: hyper::Uri = url.parse()?;
    let authority = uri
        .authority()
        .ok_or_else(|| anyhow::anyhow!("{url}: no host:port"))?;
    let target = std::sync::Arc::new(Target {
        addr: authority.to_string(),
        host: authority.to_string(),
        path: uri.path().to_owned(),
        body: Bytes::from(body.clone()),
        key: key.clone(),
    });
    let conns: u32 = conns.parse()?;
    let seconds: u64 = seconds.parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let seen = rt.block_on(async {
        let t0 = Instant::now();
        let counted_from = t0 + Duration::from_secs(2);
        let end = t0 + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..conns)
            .map(|i| {
                let target = target.clone();
                let start = t0 + Duration::from_secs(1) * i / conns.max(1);
                tokio::spawn(async move { client(&target, start, counted_from, end).await })
            })
            .collect();
        let mut all = Seen::default();
        for t in tasks {
            let s = t.await.unwrap_or_default();
            all.streams += s.streams;
            all.tokens += s.tokens;
            all.errors += s.errors;
            all.gaps.extend(s.gaps);
            all.first_tokens.extend(s.first_tokens);
        }
        all
    });
    let (mut gaps, mut first) = (seen.gaps, seen.first_tokens);
    gaps.sort_unstable();
    first.sort_unstable();
    println!(
        "RESULT {} {} {} {} {} {} {} {}",
        seen.streams,
        seen.tokens,
        seen.errors,
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.99),
        percentile(&gaps, 0.999),
        gaps.last().copied().unwrap_or(0),
        percentile(&first, 0.99),
    );
    Ok(())
}
