//! Differential: the same bytes to the lean HTTP/1.1 server's request-head
//! decision (`net/src/server.rs`) and to hyper's server (what takes every
//! request the lean server hands over). Every request the lean server
//! would serve, hyper must read the same way: the same method and target,
//! and its body the same length (so both agree where each request ends,
//! and so where the next begins). What the lean server hands over is
//! hyper's anyway, byte for byte.
//!
//! Input: one control byte (bit 0: a listener with plain paths), then the
//! bytes a client sends on one connection (pipelined requests welcome).
#![no_main]

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zonegate_net::fuzzing::{request_head, Head};

/// One request as a server read it: method, target, body length (`None`:
/// the body broke off).
type Read = (String, Uri, Option<usize>);

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
}

/// The requests the lean server serves from `bytes`, in order, until it
/// hands the connection over, closes it, or the bytes end.
fn lean(bytes: &[u8], plain: bool) -> Vec<(String, Vec<u8>, usize)> {
    let mut at = 0;
    let mut served = Vec::new();
    while let Head::Ours {
        method,
        target,
        head_len,
        body_len,
        close,
    } = request_head(&bytes[at..], plain)
    {
        let Some(end) = at
            .checked_add(head_len)
            .and_then(|n| n.checked_add(body_len))
            .filter(|&end| end <= bytes.len())
        else {
            break; // The body is cut: not served whole.
        };
        served.push((method, target, body_len));
        at = end;
        if close {
            break;
        }
    }
    served
}

/// The requests hyper's HTTP/1 server reads from `bytes` (the client then
/// closes its sending side).
fn hyper_reads(bytes: &[u8]) -> Vec<Read> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = Rc::clone(&seen);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let log = Rc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            let len = body.collect().await.ok().map(|b| b.to_bytes().len());
            log.borrow_mut()
                .push((parts.method.to_string(), parts.uri, len));
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    RT.with(|rt| {
        rt.block_on(async {
            let (client, server) = tokio::io::duplex(1 << 20);
            let conn = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(TokioIo::new(server), service);
            let talk = async move {
                let (mut rx, mut tx) = tokio::io::split(client);
                let _ = tx.write_all(bytes).await;
                let _ = tx.shutdown().await;
                let mut answers = Vec::new();
                let _ = rx.read_to_end(&mut answers).await;
            };
            let _ = tokio::join!(conn, talk);
        })
    });
    let reads = seen.borrow().clone();
    reads
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, bytes)) = data.split_first() else {
        return;
    };
    let served = lean(bytes, ctl & 1 == 1);
    if served.is_empty() {
        return; // All of it hyper's.
    }
    let read = hyper_reads(bytes);
    let shown = String::from_utf8_lossy(bytes);
    assert!(
        read.len() >= served.len(),
        "the lean server serves {} request(s), hyper reads {}: {served:?} vs {read:?}\n{shown:?}",
        served.len(),
        read.len()
    );
    for ((method, target, body_len), (h_method, h_uri, h_len)) in served.iter().zip(&read) {
        assert_eq!(method, h_method, "method\n{shown:?}");
        assert_eq!(Some(*body_len), *h_len, "body length\n{shown:?}");
        if let Ok(uri) = Uri::try_from(target.as_slice()) {
            assert_eq!(&uri, h_uri, "target\n{shown:?}");
        }
    }
});
