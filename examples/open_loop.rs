//! The client of `benches/overload.sh`: an open-loop load, each tenant
//! sending its requests at a fixed rate whatever the answers take (users
//! do not wait for each other), and what each tenant got.
//!
//! ```text
//! open_loop URL SECONDS BODY NAME:KEY:RATE [NAME:KEY:RATE ...]
//! RESULT name sent ok refused errors goodput/s p50_us p99_us p999_us
//! ```
//!
//! `refused`: answered 429 or 503 (shed or over a limit, at once);
//! `errors`: anything else that is not a 200, or no answer within 10 s.
//! Latencies are those of the 200s, from the moment each request was due
//! (not sent: a late send is the client's delay, counted, not hidden).
//! The first second is a warm-up, not counted.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[derive(Default)]
struct Got {
    sent: u64,
    ok: u64,
    refused: u64,
    errors: u64,
    /// Microseconds from due to answered, of the 200s.
    latencies: Vec<u32>,
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(seconds), Some(body)) = (args.get(1), args.get(2), args.get(3)) else {
        anyhow::bail!("usage: open_loop URL SECONDS BODY NAME:KEY:RATE [NAME:KEY:RATE ...]");
    };
    let uri: hyper::Uri = url.parse()?;
    let seconds: u64 = seconds.parse()?;
    let body = Bytes::from(body.clone());
    let mut tenants = Vec::new();
    for spec in &args[4..] {
        let mut parts = spec.splitn(3, ':');
        let (Some(name), Some(key), Some(rate)) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("{spec}: not NAME:KEY:RATE");
        };
        let rate: f64 = rate.parse()?;
        anyhow::ensure!(rate > 0.0, "{spec}: the rate must be above 0");
        tenants.push((name.to_owned(), format!("Bearer {key}"), rate));
    }
    anyhow::ensure!(!tenants.is_empty(), "no tenant");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let got = local.block_on(&rt, async move {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build_http();
        let t0 = Instant::now();
        let counted_from = t0 + Duration::from_secs(1);
        let end = t0 + Duration::from_secs(seconds);
        let mut senders = Vec::new();
        for (name, auth, rate) in tenants {
            let got = Rc::new(RefCell::new(Got::default()));
            let (client, uri, body, got2) =
                (client.clone(), uri.clone(), body.clone(), got.clone());
            senders.push((
                name,
                got,
                tokio::task::spawn_local(async move {
                    let period = Duration::from_secs_f64(1.0 / rate);
                    let mut due = t0;
                    let mut in_flight = Vec::new();
                    while due < end {
                        tokio::time::sleep_until(due.into()).await;
                        let now = Instant::now();
                        while due <= now && due < end {
                            let req = Request::post(uri.clone())
                                .header(header::CONTENT_TYPE, "application/json")
                                .header(header::AUTHORIZATION, auth.as_str())
                                .body(Full::new(body.clone()))
                                .expect("a valid request");
                            let (client, got, at) = (client.clone(), got2.clone(), due);
                            in_flight.push(tokio::task::spawn_local(async move {
                                let answer = tokio::time::timeout(Duration::from_secs(10), async {
                                    let resp = client.request(req).await.ok()?;
                                    let status = resp.status();
                                    resp.into_body().collect().await.ok()?;
                                    Some(status)
                                })
                                .await
                                .ok()
                                .flatten();
                                if at < counted_from {
                                    return;
                                }
                                let mut g = got.borrow_mut();
                                g.sent += 1;
                                match answer {
                                    Some(StatusCode::OK) => {
                                        g.ok += 1;
                                        let us = at.elapsed().as_micros();
                                        g.latencies.push(u32::try_from(us).unwrap_or(u32::MAX));
                                    }
                                    Some(StatusCode::TOO_MANY_REQUESTS)
                                    | Some(StatusCode::SERVICE_UNAVAILABLE) => g.refused += 1,
                                    _ => g.errors += 1,
                                }
                            }));
                            due += period;
                        }
                        in_flight.retain(|t| !t.is_finished());
                    }
                    for t in in_flight {
                        let _ = t.await;
                    }
                }),
            ));
        }
        let mut out = Vec::new();
        for (name, got, task) in senders {
            let _ = task.await;
            out.push((name, got.take()));
        }
        out
    });
    let counted = seconds.saturating_sub(1).max(1) as f64;
    for (name, mut g) in got {
        g.latencies.sort_unstable();
        println!(
            "RESULT {name} {} {} {} {} {:.0} {} {} {}",
            g.sent,
            g.ok,
            g.refused,
            g.errors,
            g.ok as f64 / counted,
            percentile(&g.latencies, 0.5),
            percentile(&g.latencies, 0.99),
            percentile(&g.latencies, 0.999),
        );
    }
    Ok(())
}
