//! The listener's tests: budgets, timeouts, stops, hand-offs, over both servers.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::app::{NoPlain, Peer, Plain};
use crate::body::{read_body, BodyError};
use crate::budget::{PerIp, Stats};
use crate::listen::Handed;
use crate::settings::{Limits, ListenConfig};
use crate::tls::ServerTls;
use crate::watchdog::{ConnState, InFlight, Verdict};
use axum::body::{Body, Bytes};
use http::Request;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use axum::Router;

use super::*;

/// Serves `app` with `limits` on a port of its own: its address, its
/// counters, and the switch that stops it.
pub(crate) async fn serve_app(
    app: Router,
    limits: Limits,
) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
    serve_app_with(app, limits, true, None, None::<Arc<NoPlain>>).await
}

/// [`serve_app`], choosing whether requests carry the [`Peer`], over
/// TLS or not, and the [`Plain`] handler.
pub(crate) async fn serve_app_with<P: Plain>(
    app: Router,
    limits: Limits,
    peer: bool,
    tls: Option<Arc<ServerTls>>,
    plain: Option<Arc<P>>,
) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stats = Arc::new(Stats::default());
    let config = ListenConfig {
        name: "test",
        tls,
        limits,
        stats: Arc::clone(&stats),
        peer,
    };
    let (stop, rx) = watch::channel(false);
    tokio::spawn(serve_plain(listener, app, plain, config, None, rx));
    (addr, stats, stop)
}

/// Serves a one-route app with `limits`.
async fn server(limits: Limits) -> (SocketAddr, Arc<Stats>, watch::Sender<bool>) {
    serve_app(
        Router::new().route("/", axum::routing::get(|| async { "ok" })),
        limits,
    )
    .await
}

/// Reads until the server closes; how long that took.
async fn closed_after(s: &mut TcpStream) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut buf = [0u8; 512];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    started.elapsed()
}

#[tokio::test]
async fn a_stop_wakes_idle_connections_at_once_not_at_the_watchdogs_next_look() {
    use tokio::io::AsyncWriteExt;
    // The watchdog looks every 30 s: only the stop's own wake-up
    // closes these connections within the deadline below.
    let limits = Limits {
        header_read_timeout: Duration::from_secs(120),
        send_timeout: Duration::from_secs(120),
        idle_timeout: Duration::from_secs(600),
        ..Limits::with_max(64)
    };
    let (addr, stats, stop) = server(limits).await;
    let mut plain = TcpStream::connect(addr).await.expect("connect");
    // Served once: its task waits for a next head.
    plain
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.accepted.load(Ordering::Relaxed) < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.send(true).expect("stop");
    tokio::time::timeout(Duration::from_secs(10), closed_after(&mut plain))
        .await
        .expect("closed by the stop, not by the watchdog 30 s later");
}

#[tokio::test]
async fn a_head_begun_after_an_idle_pause_gets_the_header_timeout_not_the_idle_one() {
    use tokio::io::AsyncWriteExt;
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(20),
        ..Limits::with_max(16)
    };
    let (addr, stats, _stop) = server(limits).await;
    // Silent first, then a head that never ends.
    let mut s = TcpStream::connect(addr).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    assert!(closed_after(&mut s).await < Duration::from_secs(10));
    // After a complete request on a keep-alive connection, the next
    // head that never ends is timed out the same way.
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    use tokio::io::AsyncReadExt;
    let n = s.read(&mut buf).await.expect("answer");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    assert!(closed_after(&mut s).await < Duration::from_secs(10));
    assert_eq!(stats.closed_header_timeout.load(Ordering::Relaxed), 2);
    assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed_by_the_header_read_timeout() {
    // 11,000 silent connections once held a data port's whole budget
    // for the idle timeout each.
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(120),
        ..Limits::with_max(16)
    };
    let (addr, stats, _stop) = server(limits).await;
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    let took = tokio::time::timeout(Duration::from_secs(20), closed_after(&mut silent))
        .await
        .expect("closed by the header-read timeout, not the idle one");
    assert!(
        took >= Duration::from_millis(250),
        "not before it: {took:?}"
    );
    assert_eq!(stats.closed_header_timeout.load(Ordering::Relaxed), 1);
    assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_connection_over_its_addresss_cap_is_closed_at_accept() {
    let limits = Limits {
        max_connections_per_ip: Some(2),
        ..Limits::with_max(16)
    };
    let (addr, stats, _stop) = server(limits).await;
    let accepted = |n: u64| {
        let stats = Arc::clone(&stats);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while stats.accepted.load(Ordering::Relaxed) < n {
                assert!(Instant::now() < deadline, "never accepted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let first = TcpStream::connect(addr).await.expect("connect");
    let _second = TcpStream::connect(addr).await.expect("connect");
    accepted(2).await;
    let mut third = TcpStream::connect(addr).await.expect("connect");
    assert!(closed_after(&mut third).await < Duration::from_secs(10));
    assert_eq!(stats.refused_per_ip.load(Ordering::Relaxed), 1);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0, "not the budget");
    // A connection that closes gives its place back.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats.open.load(Ordering::Relaxed) > 1 {
        assert!(Instant::now() < deadline, "the closed one still counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _fourth = TcpStream::connect(addr).await.expect("connect");
    accepted(3).await;
    assert_eq!(stats.refused_per_ip.load(Ordering::Relaxed), 1);
}

#[test]
fn an_addresss_count_leaves_with_its_last_connection() {
    let per_ip = PerIp::default();
    let v4: IpAddr = "10.0.0.1".parse().expect("ip");
    let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
    assert_eq!(per_ip.enter(v4, 2), Some(v4));
    assert_eq!(
        per_ip.enter(mapped, 2),
        Some(v4),
        "one address, however written"
    );
    assert_eq!(per_ip.enter(v4, 2), None);
    per_ip.leave(v4);
    per_ip.leave(v4);
    assert!(per_ip.0.lock().is_empty());
    assert_eq!(per_ip.enter(v4, 1), Some(v4));
}

/// Every byte the server at `addr` answers `request` with, until it
/// closes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
        .await
        .expect("the answer ends")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn an_http11_request_without_exactly_one_host_is_a_400() {
    let (addr, _stats, _stop) = server(Limits::with_max(16)).await;
    let refused: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nHost: b\r\nconnection: close\r\n\r\n",
        // Chunked: hyper's path.
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n",
    ];
    for request in refused {
        let answer = exchange(addr, request).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 ") || answer.starts_with("HTTP/1.0 400 "),
            "{:?}: {answer}",
            String::from_utf8_lossy(request)
        );
        assert!(answer.contains("Host"), "says why: {answer}");
    }
    // HTTP/1.0 predates `Host`: served without it, as nginx does.
    let answer = exchange(addr, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(
        answer.contains(" 200 ") && answer.ends_with("ok"),
        "{answer}"
    );
    let answer = exchange(
        addr,
        b"GET / HTTP/1.1\r\nHOST: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}

#[tokio::test]
async fn an_early_answer_reaches_a_client_still_sending_a_large_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Answers at once, reading none of the body (a 401 before the
    // upload is read). Closed with the body unread, the socket would
    // reset the client's writes and the answer with them.
    let app = Router::new().route(
        "/",
        axum::routing::post(|| async { (http::StatusCode::UNAUTHORIZED, "no key") }),
    );
    let (addr, stats, _stop) = serve_app(app, Limits::with_max(4)).await;
    // More than loopback's socket buffers hold on both sides together.
    const BODY: usize = 32 * 1024 * 1024;
    const PIECE: usize = 0xfff8;
    // By length, the lean server's; chunked, hyper's.
    let framings = [
        ("content-length: 33554432", false),
        ("transfer-encoding: chunked", true),
    ];
    for (framing, chunked) in framings {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let head = format!("POST / HTTP/1.1\r\nhost: x\r\n{framing}\r\n\r\n");
        s.write_all(head.as_bytes()).await.expect("head");
        let mut piece = Vec::new();
        if chunked {
            piece.extend_from_slice(format!("{PIECE:x}\r\n").as_bytes());
        }
        piece.extend(std::iter::repeat_n(b'x', PIECE));
        if chunked {
            piece.extend_from_slice(b"\r\n");
        }
        let mut sent = 0;
        while sent < BODY {
            let n = PIECE.min(BODY - sent);
            let bytes = if chunked || n == PIECE {
                &piece[..]
            } else {
                &piece[..n]
            };
            s.write_all(bytes)
                .await
                .unwrap_or_else(|e| panic!("{framing}: reset after {sent} bytes: {e}"));
            sent += n;
        }
        if chunked {
            s.write_all(b"0\r\n\r\n").await.expect("last chunk");
        }
        s.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
            .await
            .expect("closed")
            .unwrap_or_else(|e| panic!("{framing}: the answer, not a reset: {e}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 401 "), "{framing}: {answer}");
        assert!(answer.contains("no key"), "{framing}: {answer}");
    }
    assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn over_the_budget_a_connection_is_closed_at_once() {
    let (addr, stats, _stop) = server(Limits::with_max(1)).await;
    let _held = TcpStream::connect(addr).await.expect("connect");
    // The first connection is accepted before the second arrives.
    while stats.accepted.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut refused = TcpStream::connect(addr).await.expect("connect");
    assert!(closed_after(&mut refused).await < Duration::from_secs(10));
    assert_eq!(stats.refused.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_long_answer_is_work_not_idleness() {
    // Header and idle timeouts far shorter than the answer takes: a
    // request in flight is never cut by them.
    let limits = Limits {
        header_read_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(200),
        ..Limits::with_max(4)
    };
    let app = Router::new().route(
        "/",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            "done"
        }),
    );
    let (addr, stats, _stop) = serve_app(app, limits).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !answer.ends_with(b"done") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "closed mid-answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
}

/// An app whose `/` answers an endless stream of 64 KiB chunks; `gone`
/// turns true when the answer is dropped (its connection closed).
fn endless(gone: &Arc<std::sync::atomic::AtomicBool>) -> Router {
    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let gone = Arc::clone(gone);
    Router::new().route(
        "/",
        axum::routing::get(move || {
            let flag = Flag(Arc::clone(&gone));
            async move {
                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                let chunks = futures_util::stream::repeat_with(move || {
                    let _held = &flag;
                    Ok::<_, Infallible>(chunk.clone())
                });
                Body::from_stream(chunks)
            }
        }),
    )
}

/// A server of [`endless`] answers with `send_timeout`: its address,
/// counters, stop switch, and the flag of the dropped answer.
async fn endless_server(
    send_timeout: Duration,
) -> (
    SocketAddr,
    Arc<Stats>,
    watch::Sender<bool>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let limits = Limits {
        send_timeout,
        ..Limits::with_max(4)
    };
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, stats, stop) = serve_app(endless(&gone), limits).await;
    (addr, stats, stop, gone)
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_send_timeout() {
    use tokio::io::AsyncWriteExt;
    let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(300)).await;
    // A plain request (the lean server) and an HTTP/1.0 one (hyper's).
    for (n, wire) in [
        &b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..],
        &b"GET / HTTP/1.0\r\nhost: x\r\n\r\n"[..],
    ]
    .into_iter()
    .enumerate()
    {
        gone.store(false, Ordering::SeqCst);
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(wire).await.expect("write");
        // Never read: the server's writes fill the socket and block.
        let deadline = Instant::now() + Duration::from_secs(30);
        while stats.closed_send_timeout.load(Ordering::Relaxed) < n as u64 + 1 {
            assert!(Instant::now() < deadline, "request {n}: not closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The answer (and with it the request and anything it held
        // upstream) is dropped, not left waiting for a reader.
        while !gone.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "request {n}: answer still held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(closed_after(&mut s).await < Duration::from_secs(30));
    }
    assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
    assert_eq!(stats.closed_idle.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_reader_that_pauses_shorter_than_the_send_timeout_is_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(1_500)).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    // Pauses of 400 ms, each long enough to fill the socket and block
    // the server's writes, with reads at full speed between them.
    let mut buf = vec![0u8; 256 * 1024];
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut got = 0;
        while got < 8 << 20 {
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed after a pause shorter than the send timeout");
            got += n;
        }
    }
    assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
    assert!(!gone.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_body_is_read_whole_within_its_limit_and_time() {
    let limit = 10;
    let time = Duration::from_secs(30);
    let frames = |parts: &'static [&'static str]| {
        Body::from_stream(futures_util::stream::iter(
            parts
                .iter()
                .map(|p| Ok::<_, Infallible>(Bytes::from_static(p.as_bytes()))),
        ))
    };
    // One frame: returned as it came, not copied.
    let one = Bytes::from_static(b"hello");
    let got = read_body(Body::from(one.clone()), limit, time).await;
    assert_eq!(got.expect("read").as_ptr(), one.as_ptr());
    // Several frames (and empty ones): gathered in order.
    let got = read_body(frames(&["", "ab", "", "cd", "e"]), limit, time).await;
    assert_eq!(&got.expect("read")[..], b"abcde");
    // Exactly the limit passes; one byte over fails, declared or not.
    let got = read_body(frames(&["01234", "56789"]), limit, time).await;
    assert_eq!(&got.expect("read")[..], b"0123456789");
    let over = read_body(frames(&["01234", "56789", "x"]), limit, time).await;
    assert!(matches!(over, Err(BodyError::TooLarge)), "{over:?}");
    let declared = read_body(Body::from("0123456789x"), limit, time).await;
    assert!(matches!(declared, Err(BodyError::TooLarge)), "{declared:?}");
    // A body that stops arriving is cut at the timeout.
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(1);
    tx.send(Ok(Bytes::from_static(b"ab"))).await.expect("send");
    let stalled = Body::from_stream(tokio_stream_of(rx));
    let got = read_body(stalled, limit, Duration::from_millis(100)).await;
    assert!(matches!(got, Err(BodyError::Timeout)), "{got:?}");
    drop(tx);
}

/// A receiver as a stream (no tokio-stream dependency for one test).
fn tokio_stream_of<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
}

#[tokio::test]
async fn an_http2_stream_its_client_stops_reading_is_closed_after_the_send_timeout() {
    let (addr, stats, _stop, gone) = endless_server(Duration::from_millis(300)).await;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut client, conn) = h2::client::Builder::new()
        .initial_window_size(16 * 1024)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let request = http::Request::get(format!("http://{addr}/"))
        .body(())
        .expect("request");
    let (answer, _) = client.send_request(request, true).expect("send");
    let answer = answer.await.expect("answer head");
    assert_eq!(answer.status(), 200);
    // The answer's data is never read and its window never released:
    // the stream stalls on flow control, the socket stays writable.
    let _unread = answer.into_body();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.closed_send_timeout.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the stalled stream was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while !gone.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the answer is still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    driver.abort();
}

/// `GET /` on a new connection through each HTTP/1 server: the lean
/// one's (HTTP/1.1) and hyper's (HTTP/1.0); each whole answer, read to
/// the close.
async fn get_by_both_servers(addr: SocketAddr) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut answers = Vec::new();
    for wire in [
        &b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"[..],
        &b"GET / HTTP/1.0\r\nhost: x\r\n\r\n"[..],
    ] {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(wire).await.expect("write");
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.expect("read");
        answers.push(String::from_utf8_lossy(&got).into_owned());
    }
    answers
}

#[tokio::test]
async fn a_slow_generation_read_by_its_client_is_not_a_stalled_client() {
    // Gaps between frames far longer than the send timeout: the body is
    // waiting (its backend), not the client.
    let limits = Limits {
        send_timeout: Duration::from_millis(200),
        ..Limits::with_max(4)
    };
    let app = Router::new().route(
        "/",
        axum::routing::get(|| async {
            let chunks = futures_util::stream::unfold(0, |n| async move {
                if n == 3 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(600)).await;
                Some((Ok::<_, Infallible>(Bytes::from(format!("part{n};"))), n + 1))
            });
            Body::from_stream(chunks)
        }),
    );
    let (addr, stats, _stop) = serve_app(app, limits).await;
    for got in get_by_both_servers(addr).await {
        assert!(got.contains("part0;") && got.contains("part2;"), "{got}");
    }
    // HTTP/2, the client reading (and so releasing its window) as data comes.
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(conn);
    let request = http::Request::get(format!("http://{addr}/"))
        .body(())
        .expect("request");
    let (answer, _) = client.send_request(request, true).expect("send");
    let mut body = answer.await.expect("answer head").into_body();
    let mut got = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.expect("data");
        let _ = body.flow_control().release_capacity(data.len());
        got.extend_from_slice(&data);
    }
    assert_eq!(got, b"part0;part1;part2;");
    driver.abort();
    assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn requests_carry_their_peer_only_where_the_listener_asks() {
    let app = Router::new().route(
        "/",
        axum::routing::get(|req: Request<Body>| async move {
            req.extensions()
                .get::<Peer>()
                .map_or("none".to_owned(), |p| p.addr.ip().to_string())
        }),
    );
    for (wanted, expect) in [(true, "127.0.0.1"), (false, "none")] {
        let (addr, _, _stop) = serve_app_with(
            app.clone(),
            Limits::with_max(4),
            wanted,
            None,
            None::<Arc<NoPlain>>,
        )
        .await;
        for got in get_by_both_servers(addr).await {
            assert!(got.ends_with(expect), "peer wanted: {wanted}: {got}");
        }
    }
}

#[tokio::test]
async fn over_tls_a_client_that_stops_reading_is_closed_after_the_send_timeout() {
    use tokio::io::AsyncWriteExt;
    // A self-signed certificate for localhost, and a client trusting it.
    let dir = tempfile::tempdir().expect("temp dir");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let files = crate::tls::TlsFiles {
        cert: dir.path().join("c.pem"),
        key: dir.path().join("k.pem"),
        client_ca: None,
    };
    std::fs::write(&files.cert, cert.pem()).expect("write");
    std::fs::write(&files.key, key.serialize_pem()).expect("write");
    let tls = ServerTls::load(files, &[b"http/1.1"]).expect("server TLS");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let client = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let limits = Limits {
        send_timeout: Duration::from_millis(300),
        ..Limits::with_max(4)
    };
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (addr, stats, _stop) = serve_app_with(
        endless(&gone),
        limits,
        false,
        Some(tls),
        None::<Arc<NoPlain>>,
    )
    .await;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
        .expect("handshake");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    // Never read: rustls's buffer, then the socket, fill up.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats.closed_send_timeout.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "not closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while !gone.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the answer is still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_on_hyper_is_not_a_stalled_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // hyper serves the connection (a chunked request is handed to it);
    // its answer is whole and read, then the client stays silent for
    // longer than the send timeout: that is idleness, not a stall.
    let limits = Limits {
        send_timeout: Duration::from_millis(200),
        ..Limits::with_max(4)
    };
    let (addr, stats, _stop) = server(limits).await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    while !got.ends_with(b"ok") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(stats.closed_send_timeout.load(Ordering::Relaxed), 0);
    // Still open: a second request is answered.
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let n = s.read(&mut buf).await.expect("read");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
}

#[test]
fn a_head_and_an_answers_end_are_timed_from_the_look_that_first_sees_them() {
    let limits = Limits::with_max(10);
    let (h, idle) = (limits.header_read_timeout, limits.idle_timeout);
    let state = Arc::new(ConnState::new());
    let t0 = state.epoch;
    let ms = Duration::from_millis(1);
    // Accepted: its first head is pending from then on, not begun.
    assert!(state.is_idle(), "a stop closes it at once");
    assert!(matches!(state.verdict(&limits, t0 + h - ms), Verdict::Keep));
    assert!(matches!(
        state.verdict(&limits, t0 + h),
        Verdict::HeaderTimeout
    ));
    // Its first request served: idle from the look after its end.
    state.on_read();
    drop(InFlight::begin(Arc::clone(&state)));
    assert!(matches!(state.verdict(&limits, t0), Verdict::Keep));
    assert!(matches!(state.verdict(&limits, t0 + idle), Verdict::Idle));

    // A head begins: no clock read, its time is the next look's.
    state.on_read();
    assert!(!state.is_idle());
    let look = t0 + idle + h;
    assert!(matches!(state.verdict(&limits, look), Verdict::Keep));
    assert_eq!(state.next_check(&limits, look), look + h / 4);
    assert!(matches!(
        state.verdict(&limits, look + h - ms),
        Verdict::Keep
    ));
    assert!(matches!(
        state.verdict(&limits, look + h),
        Verdict::HeaderTimeout
    ));

    // The head completes and its answer ends: idle from the look after.
    drop(InFlight::begin(Arc::clone(&state)));
    assert!(state.is_idle());
    let look = look + h / 4;
    assert!(matches!(state.verdict(&limits, look), Verdict::Keep));
    assert_eq!(state.next_check(&limits, look), look + h / 4);
    assert!(matches!(
        state.verdict(&limits, look + idle - ms),
        Verdict::Keep
    ));
    assert!(matches!(state.verdict(&limits, look + idle), Verdict::Idle));
}

#[test]
fn a_short_idle_timeout_is_stamped_within_a_quarter_of_itself() {
    // Longer header-read and send timeouts than the idle one: the
    // watchdog of a busy connection still looks often enough that an
    // answer's end is stamped within a quarter of the idle timeout.
    let limits = Limits {
        idle_timeout: Duration::from_secs(2),
        ..Limits::with_max(10)
    };
    let state = Arc::new(ConnState::new());
    let busy = InFlight::begin(Arc::clone(&state));
    let look = state.epoch + Duration::from_secs(5);
    let next = state.next_check(&limits, look);
    assert_eq!(next, look + limits.idle_timeout / 4);
    drop(busy);
    assert!(matches!(state.verdict(&limits, next), Verdict::Keep));
    assert!(matches!(
        state.verdict(&limits, next + limits.idle_timeout),
        Verdict::Idle
    ));
}

/// Stops the threads of [`spread_threads`] however a test ends.
struct Stopper(watch::Sender<bool>, Vec<std::thread::JoinHandle<()>>);

impl Drop for Stopper {
    fn drop(&mut self) {
        let _ = self.0.send(true);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// A thread named `served-by-<i>` with a runtime and a listener of its
/// own for each member, as the data plane has; `GET /` answers the
/// serving thread's name. Their ports, counters and stopper.
fn spread_threads(
    members: Vec<crate::spread::Member<Handed>>,
) -> (Vec<SocketAddr>, Arc<Stats>, Stopper) {
    let stats = Arc::new(Stats::default());
    let (stop, stop_rx) = watch::channel(false);
    let mut threads = Vec::new();
    let mut ports = Vec::new();
    for (i, member) in members.into_iter().enumerate() {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        ports.push(std_listener.local_addr().expect("addr"));
        let config = ListenConfig {
            name: "test",
            tls: None,
            limits: Limits::with_max(64),
            stats: Arc::clone(&stats),
            peer: false,
        };
        let stop_rx = stop_rx.clone();
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                std::thread::current().name().unwrap_or("?").to_owned()
            }),
        );
        threads.push(
            std::thread::Builder::new()
                .name(format!("served-by-{i}"))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(async move {
                        let listener = TcpListener::from_std(std_listener).expect("listener");
                        serve_plain::<NoPlain>(listener, app, None, config, Some(member), stop_rx)
                            .await
                    });
                })
                .expect("thread"),
        );
    }
    (ports, stats, Stopper(stop, threads))
}

/// A keep-alive connection to `addr` that asked `GET /`, and the name
/// of the thread that answered.
async fn served_by(addr: SocketAddr) -> (TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"served-by-0") && !got.ends_with(b"served-by-1") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let name = text.rsplit("\r\n").next().unwrap_or_default().to_owned();
    (s, name)
}

#[tokio::test]
async fn connections_the_kernel_sends_to_one_thread_are_served_by_both() {
    // Every connection goes to the first thread's port.
    let (spread, members) = crate::spread::Spread::<Handed>::new(2);
    let (ports, stats, stopper) = spread_threads(members);
    let mut conns = Vec::new();
    let mut by_thread = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..9 {
        let (s, name) = served_by(ports[0]).await;
        *by_thread.entry(name).or_default() += 1;
        // Kept open: each thread's count is what it carries.
        conns.push(s);
    }
    let (first, second) = (by_thread["served-by-0"], by_thread["served-by-1"]);
    assert_eq!(first + second, 9);
    assert!(first.abs_diff(second) <= 2, "{by_thread:?}");
    assert_eq!(spread.open(), vec![first, second]);
    assert_eq!(spread.handed(), second as u64);
    assert_eq!(stats.open.load(Ordering::Relaxed), 9);
    // Closing them frees both threads' places.
    drop(conns);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while spread.open() != vec![0, 0] && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(spread.open(), vec![0, 0]);
    drop(stopper);
}

#[tokio::test]
async fn a_connection_for_a_thread_that_stopped_is_served_where_it_was_accepted() {
    // The second thread is gone (its inbox with it): the socket taken
    // out of the first thread's runtime for it goes back in there.
    let (spread, mut members) = crate::spread::Spread::<Handed>::new(2);
    drop(members.pop());
    let (ports, stats, stopper) = spread_threads(members);
    let mut conns = Vec::new();
    for _ in 0..4 {
        let (s, name) = served_by(ports[0]).await;
        assert_eq!(name, "served-by-0");
        conns.push(s);
    }
    assert_eq!(spread.open(), vec![4, 0]);
    assert_eq!(spread.handed(), 0);
    assert_eq!(stats.open.load(Ordering::Relaxed), 4);
    drop((conns, stopper));
}
