//! The lean HTTP/1 server's tests: what it serves itself, what it hands
//! to hyper, and that both answer alike.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::listen::tests::{serve_app, serve_app_with};
use crate::listen::{Limits, Stats};

struct Server {
    addr: SocketAddr,
    stats: Arc<Stats>,
    stop: tokio::sync::watch::Sender<bool>,
}

async fn server(app: Router) -> Server {
    let (addr, stats, stop) = serve_app(app, Limits::with_max(64)).await;
    Server { addr, stats, stop }
}

fn echo() -> Router {
    Router::new()
        .route("/echo", post(|body: Bytes| async move { body }))
        .route("/", get(|| async { "ok" }))
}

/// Sends `wire` on a new connection and reads until the server closes.
async fn exchange(addr: SocketAddr, wire: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(wire).await.expect("write");
    read_to_close(&mut s).await
}

async fn read_to_close(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut got));
    let _ = read.await.expect("the server closes the connection");
    String::from_utf8_lossy(&got).into_owned()
}

fn handed(s: &Server) -> u64 {
    s.stats.handed_to_hyper.load(Ordering::Relaxed)
}

#[test]
fn head_lines_follow_the_map_and_a_date_is_added_only_when_neither_has_one() {
    let head = |lines: &HeadLines| {
        let mut map = HeaderMap::new();
        map.insert("x-map", http::HeaderValue::from_static("1"));
        let mut out = Vec::new();
        write_head(
            &mut out,
            StatusCode::OK,
            &map,
            lines,
            Framing::Length(2),
            false,
        );
        String::from_utf8(out).unwrap()
    };
    let dated = HeadLines {
        lines: Bytes::from_static(b"Server: b\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n"),
        dated: true,
        event_stream: false,
    };
    assert_eq!(
        head(&dated),
        "HTTP/1.1 200 OK\r\nx-map: 1\r\nServer: b\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\
         content-length: 2\r\n\r\n"
    );
    let undated = HeadLines {
        lines: Bytes::from_static(b"Server: b\r\n"),
        ..HeadLines::default()
    };
    for text in [head(&undated), head(&HeadLines::default())] {
        assert_eq!(text.matches("date: ").count(), 1, "{text}");
        assert!(text.ends_with("content-length: 2\r\n\r\n"), "{text}");
    }
}

/// A [`Plain`] handler of `/v1/x` that answers with what it was
/// handed: the target and header fields in the body, a map header and
/// a line.
struct Fields(Vec<PathAndQuery>);

fn fields() -> Fields {
    Fields(vec![PathAndQuery::from_static("/v1/x")])
}

impl Plain for Fields {
    fn paths(&self) -> &[PathAndQuery] {
        &self.0
    }

    fn call(&self, req: PlainRequest) -> impl Future<Output = Answer> + Send {
        let mut text = format!("{} {}", req.target.path(), req.target);
        for (n, v) in req.fields.iter() {
            text += &format!(
                " {}={}",
                String::from_utf8_lossy(n),
                String::from_utf8_lossy(v)
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-map", http::HeaderValue::from_static("1"));
        async move {
            Answer {
                status: StatusCode::ACCEPTED,
                headers,
                lines: HeadLines {
                    lines: Bytes::from_static(b"x-line: 2\r\n"),
                    ..HeadLines::default()
                },
                body: Body::from(text),
            }
        }
    }
}

#[test]
fn a_post_to_a_plain_path_carries_its_header_fields_and_target_and_no_map() {
    let plain_handler = fields();
    let read = |wire: &'static [u8]| {
        let mut spans = Vec::new();
        let Parse::Complete(parsed) = parse(wire, &mut spans) else {
            panic!("a complete head: {}", String::from_utf8_lossy(wire));
        };
        let head = Bytes::from_static(wire).slice(..parsed.head_len);
        call(&parsed, &head, &spans, Some(&plain_handler), Body::empty()).expect("a call")
    };
    let plain = |call: Call<'_, Fields>| match call {
        Call::Plain(_, req) => {
            let fields: Vec<String> = req
                .fields
                .iter()
                .map(|(n, v)| {
                    format!(
                        "{}={}",
                        String::from_utf8_lossy(n),
                        String::from_utf8_lossy(v)
                    )
                })
                .collect();
            (req.target.path().to_owned(), req.target.to_string(), fields)
        }
        Call::App(req) => panic!("the app's: {req:?}"),
    };
    let (path, target, fields) = plain(read(
        b"POST /v1/x?y=1 HTTP/1.1\r\nHost: a\r\nX-Two:  b \r\ncontent-length: 2\r\n\r\n{}",
    ));
    assert_eq!((&*path, &*target), ("/v1/x", "/v1/x?y=1"));
    assert_eq!(fields, ["Host=a", "X-Two=b", "content-length=2"]);
    let (_, target, fields) = plain(read(b"POST /v1/x HTTP/1.1\nHost: a\nX: 1\n\n"));
    assert_eq!(target, "/v1/x");
    assert_eq!(fields, ["Host=a", "X=1"], "bare line feeds");
    assert_eq!(
        plain(read(b"POST /v1/x HTTP/1.1\r\nhost: x\r\n\r\n")).2,
        ["host=x"]
    );
    // Without exactly one `Host`: hyper's, which refuses it.
    for wire in [
        &b"POST /v1/x HTTP/1.1\r\n\r\n"[..],
        b"POST /v1/x HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n",
    ] {
        assert!(matches!(parse(wire, &mut Vec::new()), Parse::NotOurs));
    }

    // Another path (a prefix, a longer one), or another method: the
    // app's, with the map.
    for wire in [
        &b"POST /v1/other HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"POST /v1/xy HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /v1 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /v1/x HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        match read(wire) {
            Call::App(req) => assert_eq!(req.headers()[header::HOST], "a"),
            Call::Plain(..) => panic!("not plain: {}", String::from_utf8_lossy(wire)),
        }
    }
}

#[test]
fn any_target_goes_to_the_plain_handler_only_by_its_path_and_whole() {
    let plain_handler = fields();
    const PIECES: [&str; 14] = [
        "/v1/x", "/v1", "/x", "?", "?q=1", "&", "%2F", "#", "\"", "{}", "\u{e9}", "/", "x", "..",
    ];
    let mut rng = fastrand::Rng::with_seed(0x2545_f491_4f6c_dd1d);
    let mut next = |below: usize| rng.usize(..below);
    let (mut plain, mut app, mut handed) = (0, 0, 0);
    for _ in 0..20_000 {
        let target: String = (0..1 + next(4))
            .map(|_| PIECES[next(PIECES.len())])
            .collect();
        // Origin-form only (an absolute or authority form is another
        // matter, hyper's or the app's).
        if !target.starts_with('/') {
            continue;
        }
        let method = ["POST", "GET"][next(2)];
        let wire = format!("{method} {target} HTTP/1.1\r\nHost: a\r\n\r\n");
        let mut spans = Vec::new();
        let Parse::Complete(parsed) = parse(wire.as_bytes(), &mut spans) else {
            continue;
        };
        let head = Bytes::from(wire.clone()).slice(..parsed.head_len);
        let ours = method == "POST" && target.split('?').next() == Some("/v1/x");
        // Both keep what precedes a fragment (a fragment has no place
        // in a request target; `http` drops it).
        let kept = target.split('#').next().unwrap_or_default();
        match call(&parsed, &head, &spans, Some(&plain_handler), Body::empty()) {
            Some(Call::Plain(_, req)) => {
                assert!(ours, "{wire:?}");
                assert_eq!(
                    req.target.as_str(),
                    kept,
                    "the whole target, query included"
                );
                plain += 1;
            }
            Some(Call::App(req)) => {
                assert!(!ours, "{wire:?}");
                let got = req.uri().path_and_query().map(|p| p.as_str());
                assert_eq!(got, Some(kept), "{wire:?}");
                app += 1;
            }
            // A target `http` refuses: hyper's, whoever would take it.
            None => handed += 1,
        }
    }
    assert!(
        plain > 100 && app > 100 && handed > 0,
        "{plain} {app} {handed}"
    );
}

#[tokio::test]
async fn a_plain_handler_answers_its_posts_and_the_app_the_rest() {
    let plain = Arc::new(fields());
    let app = echo().route("/v1/x", post(|| async { "the app" }));
    let (addr, stats, _stop) =
        serve_app_with(app, Limits::with_max(8), false, None, Some(plain)).await;
    let got = exchange(
        addr,
        b"POST /v1/x?q=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\n\r\n{}\
          POST /echo HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
    )
    .await;
    let (first, second) = got.split_once("HTTP/1.1 200").expect("two answers");
    assert!(
        first.starts_with("HTTP/1.1 202 Accepted\r\nx-map: 1\r\nx-line: 2\r\n"),
        "{first}"
    );
    assert!(first.contains("content-length: 39\r\n"), "{first}");
    assert!(
        first.ends_with("\r\n\r\n/v1/x /v1/x?q=1 Host=a content-length=2"),
        "{first}"
    );
    assert!(second.ends_with("\r\n\r\nhi"), "{second}");
    // A chunked POST to the same path is hyper's, and so the app's.
    let got = exchange(
        addr,
        b"POST /v1/x HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n0\r\n\r\n",
    )
    .await;
    assert!(got.ends_with("the app"), "{got}");
    assert_eq!(stats.handed_to_hyper.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn plain_requests_are_answered_in_order_on_one_connection_without_hyper() {
    let s = server(echo()).await;
    // Pipelined: both in one write, the second asks to close.
    let got = exchange(
        s.addr,
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nfirst\
          POST /echo HTTP/1.1\r\nhost: x\r\nContent-Length: 6\r\nconnection: close\r\n\r\nsecond",
    )
    .await;
    let answers: Vec<&str> = got.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(answers.len(), 2, "{got}");
    assert!(answers[0].contains("content-length: 5\r\n"), "{got}");
    assert!(answers[0].ends_with("\r\n\r\nfirst"), "{got}");
    assert!(answers[0].contains("date: "), "{got}");
    assert!(!answers[0].contains("connection: close"), "{got}");
    assert!(answers[1].contains("connection: close\r\n"), "{got}");
    assert!(answers[1].ends_with("\r\n\r\nsecond"), "{got}");
    assert_eq!(handed(&s), 0);
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_answered_by_the_lean_server() {
    let s = server(echo()).await;
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let wire =
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
    for byte in wire {
        c.write_all(&[*byte]).await.expect("write");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let got = read_to_close(&mut c).await;
    assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
    assert!(got.ends_with("\r\n\r\nok"), "{got:?}");
    assert_eq!(handed(&s), 0);
}

#[test]
fn only_an_empty_line_after_the_checked_bytes_may_end_a_head() {
    let head = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    for split in 1..head.len() {
        // Bytes up to `split` were parsed; the rest came in one read.
        assert!(may_end_head(head, split), "an end after {split}");
    }
    assert!(!may_end_head(b"GET / HTTP/1.1\r\nhost: x\r\n", 5));
    assert!(may_end_head(b"GET / HTTP/1.1\nhost: x\n\n", 20), "bare LF");
    assert!(
        may_end_head(&vec![b'a'; MAX_HEAD], MAX_HEAD - 1),
        "at the limit"
    );
}

#[tokio::test]
async fn a_streamed_answer_is_chunked_and_ends_with_the_last_chunk() {
    let app = Router::new().route(
        "/",
        get(|| async {
            let parts = ["data: a\n\n", "data: bb\n\n", ""].map(Ok::<_, io::Error>);
            Body::from_stream(futures_util::stream::iter(parts))
        }),
    );
    let s = server(app).await;
    let got = exchange(
        s.addr,
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(got.contains("transfer-encoding: chunked\r\n"), "{got}");
    assert!(
        got.ends_with("\r\n\r\n9\r\ndata: a\n\n\r\na\r\ndata: bb\n\n\r\n0\r\n\r\n"),
        "{got:?}"
    );
    assert_eq!(handed(&s), 0);
}

#[tokio::test]
async fn large_frames_are_framed_like_small_ones() {
    let big = "y".repeat(100_000);
    let sent = big.clone();
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let parts = [Ok::<_, io::Error>(sent.clone()), Ok("end".to_owned())];
                async move { Body::from_stream(futures_util::stream::iter(parts)) }
            }),
        )
        .route("/whole", get(|| async { "z".repeat(100_000) }));
    let s = server(app).await;
    let got = exchange(
        s.addr,
        b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nGET /whole HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let (first, second) = got
        .split_once("HTTP/1.1 200 OK\r\n")
        .map_or(("", ""), |(_, rest)| {
            rest.split_once("HTTP/1.1 200 OK\r\n").unwrap_or((rest, ""))
        });
    let chunked = format!("\r\n\r\n186a0\r\n{big}\r\n3\r\nend\r\n0\r\n\r\n");
    assert!(
        first.ends_with(&chunked),
        "{}",
        &first[..200.min(first.len())]
    );
    assert!(second.contains("content-length: 100000\r\n"));
    assert!(second.ends_with(&format!("\r\n\r\n{}", "z".repeat(100_000))));
}

/// A body that waits between frames is asked again only when woken: after
/// a write that went out at once (its registration stands) and after one
/// that waited for a slow client (a wake-up may have been taken meanwhile),
/// every frame still arrives, in order.
#[tokio::test]
async fn a_body_that_waits_between_frames_is_woken_for_each_behind_a_slow_client() {
    let frames: Vec<String> = (0..6)
        .map(|i| format!("small {i};"))
        // Each under the size written at once, with nothing else ready
        // behind it: written when the body is pending, into a socket the
        // client leaves full.
        .chain((0..1000).map(|i| format!("{}", i % 10).repeat(8 << 10)))
        .chain((6..12).map(|i| format!("small {i};")))
        .collect();
    let expected = frames.concat();
    let app = Router::new().route(
        "/",
        get(move || {
            let frames = frames.clone();
            async move {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<String, io::Error>>(1);
                tokio::spawn(async move {
                    for frame in frames {
                        // Small frames come apart: the body is pending between them.
                        let pause = frame.len() < 64;
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                        if pause {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                });
                Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
            }
        }),
    );
    let s = server(app).await;
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    // The client reads late: the 8 MB fill the socket, and the server's
    // writes wait for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = read_to_close(&mut c).await;
    let (_, mut rest) = got.split_once("\r\n\r\n").expect("a head");
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size, 16).expect("hex");
        if size == 0 {
            assert_eq!(after, "\r\n", "the last chunk ends the answer");
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").expect("a chunk's CRLF");
    }
    assert!(
        body == expected,
        "{} bytes of {}",
        body.len(),
        expected.len()
    );
}

/// The case the skipped poll must not get wrong: the body's next frame
/// comes (and its wake-up is spent) while a write waits for a full socket.
/// The write that waited asks the body again; were its first poll skipped
/// as after a write that went out at once, the frame would wait for a
/// wake-up that never comes.
#[tokio::test]
async fn a_frame_that_comes_while_a_write_waits_is_not_missed() {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(1);
    let mut body = Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    // Room for 16 bytes: the first frame's write waits for the reader.
    let (mut client, mut server_io) = tokio::io::duplex(16);
    tx.send(Ok(Bytes::from("a".repeat(100))))
        .await
        .expect("send");
    let writer = tokio::spawn(async move {
        let (mut out, mut buf) = (Vec::new(), BytesMut::new());
        write_body(
            &mut server_io,
            &mut out,
            &mut body,
            Framing::Chunked,
            &mut buf,
        )
        .await
    });
    // The writer took the first frame, found the body pending and waits
    // for the reader; the second frame comes now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(Ok(Bytes::from("second"))).await.expect("send");
    // Read until the second frame is through; the sender stays open (its
    // close would wake the body by itself).
    let mut got = Vec::new();
    let mut chunk = [0u8; 64];
    let through = tokio::time::timeout(Duration::from_secs(30), async {
        while !got.windows(6).any(|w| w == b"second") {
            let n = client.read(&mut chunk).await.expect("read");
            assert!(n > 0, "closed early");
            got.extend_from_slice(&chunk[..n]);
        }
    });
    through.await.expect("the second frame is written");
    drop(tx);
    client.read_to_end(&mut got).await.expect("read");
    assert!(writer.await.expect("writer"), "the body ended whole");
    let want = format!("64\r\n{}\r\n6\r\nsecond\r\n0\r\n\r\n", "a".repeat(100));
    assert_eq!(String::from_utf8_lossy(&got), want);
}

#[tokio::test]
async fn a_body_that_fails_midway_closes_without_the_last_chunk() {
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                let parts = [Ok("data: a\n\n"), Err(io::Error::other("backend gone"))];
                Body::from_stream(futures_util::stream::iter(parts))
            }),
        )
        .route(
            "/short",
            get(|| async { ([(header::CONTENT_LENGTH, "10")], "abc") }),
        );
    let s = server(app).await;
    // Keep-alive asked for: the close is the failure's.
    let got = exchange(s.addr, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(got.ends_with("\r\n\r\n9\r\ndata: a\n\n\r\n"), "{got:?}");
    let got = exchange(s.addr, b"GET /short HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(got.contains("content-length: 10\r\n"), "{got}");
    assert!(got.ends_with("\r\n\r\nabc"), "{got:?}");
}

#[tokio::test]
async fn requests_it_does_not_take_are_answered_by_hyper_from_their_first_byte() {
    let s = server(echo()).await;
    let cases: [(&[u8], &str); 7] = [
        (
            b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "abc",
        ),
        (
            b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
            "hi",
        ),
        (b"POST /echo HTTP/1.0\r\ncontent-length: 3\r\n\r\nold", "old"),
        (b"HEAD / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", "HTTP/1.1 200 OK"),
        // Smuggling shapes: hyper refuses two lengths, and reads a
        // chunked body that also has a length as chunked, then closes.
        (
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
            "HTTP/1.1 400",
        ),
        (
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "connection: close",
        ),
        (b"GET / HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n", "HTTP/1.1 400"),
    ];
    for (i, (wire, expect)) in cases.iter().enumerate() {
        let got = exchange(s.addr, wire).await;
        assert!(got.contains(expect), "case {i}: {got:?}");
        assert_eq!(handed(&s), i as u64 + 1, "case {i}");
    }
}

#[tokio::test]
async fn a_body_behind_its_head_is_streamed_to_the_handler() {
    let s = server(echo()).await;
    // A little, a pause, the rest; and a large one in many reads.
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nha")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write_all(b"lf").await.expect("write");
    let large = "x".repeat(300_000);
    let head = format!(
        "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        large.len()
    );
    let (mut rd, mut wr) = c.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await.expect("write");
        wr.write_all(large.as_bytes()).await.expect("write");
        wr
    });
    let mut got = Vec::new();
    rd.read_to_end(&mut got).await.expect("read");
    drop(writer.await);
    let got = String::from_utf8_lossy(&got);
    let answers: Vec<&str> = got.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(answers.len(), 2, "{got}");
    assert!(answers[0].ends_with("\r\n\r\nhalf"), "{}", answers[0]);
    assert!(answers[1].contains("content-length: 300000\r\n"));
    assert!(answers[1].ends_with(&"x".repeat(1000)));
    assert_eq!(handed(&s), 0);
}

#[tokio::test]
async fn an_answer_before_the_body_was_read_closes_the_connection() {
    let app = Router::new().route("/", post(|| async { (StatusCode::UNAUTHORIZED, "no key") }));
    let s = server(app).await;
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nsome")
        .await
        .expect("write");
    let got = read_to_close(&mut c).await;
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    assert!(got.contains("connection: close\r\n"), "{got}");
    assert!(got.ends_with("no key"), "{got:?}");
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_its_request() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&dropped);
    let app = Router::new().route(
        "/",
        get(move || {
            let flag = Flag(Arc::clone(&seen));
            async move {
                tokio::time::sleep(Duration::from_secs(600)).await;
                drop(flag);
                "late"
            }
        }),
    );
    let s = server(app).await;
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(c);
    wait_for(&dropped).await;
    // And one that hangs up before its body ended.
    dropped.store(false, Ordering::SeqCst);
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(c);
    wait_for(&dropped).await;
    assert_eq!(handed(&s), 0);
}

async fn wait_for(flag: &AtomicBool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !flag.load(Ordering::SeqCst) {
        assert!(tokio::time::Instant::now() < deadline, "still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stop_closes_idle_connections_and_finishes_the_request_in_flight() {
    let app = Router::new().route(
        "/",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "done"
        }),
    );
    let s = server(app).await;
    let mut idle = TcpStream::connect(s.addr).await.expect("connect");
    let mut busy = TcpStream::connect(s.addr).await.expect("connect");
    busy.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.stop.send(true).expect("stop");
    assert_eq!(read_to_close(&mut idle).await, "");
    let got = read_to_close(&mut busy).await;
    assert!(got.contains("connection: close\r\n"), "{got}");
    assert!(got.ends_with("\r\n\r\ndone"), "{got:?}");
}
