//! The floor: the least a tokio proxy does per request on this machine.
//!
//! Laid out as zonegate's data plane is (one current-thread runtime per
//! thread, a listener per thread on one port with `SO_REUSEPORT`, a
//! keep-alive pool of backend connections per thread, a request and its
//! backend connection never leave their thread) and making the same
//! syscalls per request (a read and a write each way), but doing none of
//! a gateway's work: no authentication, JSON, routing, health, quotas,
//! metrics, timeouts or header rewriting. The request's head and body go
//! to the backend as they came; the answer's head and body come back as
//! they came. Only `Content-Length` framing is understood.
//!
//! `benches/load.sh` runs it beside nginx and zonegate (`FLOOR=1`): what
//! it reaches is what a tokio proxy can reach here, so the distance from
//! it to zonegate is the gateway's own cost, and the distance from it to
//! nginx is the runtime's. A benchmark tool, never part of the product.
//!
//! `WORK` (default 0) adds that many rounds of dependent arithmetic to
//! each request, a stand-in for a gateway's own work that touches no
//! memory beyond one value: with it, the floor shows what a given user-space time per
//! request costs in throughput and in kernel time on this machine
//! (`FLOOR_WORK=… benches/split.sh`).
//!
//! ```text
//! cargo run --release --example floor_proxy -- LISTEN BACKEND [THREADS [WORK]]
//! ```

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Backend connections at rest, per thread.
type Pool = Rc<RefCell<Vec<TcpStream>>>;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: floor_proxy LISTEN BACKEND [THREADS [WORK]]";
    let listen: SocketAddr = parse(args.next(), usage)?;
    let backend: SocketAddr = parse(args.next(), usage)?;
    let threads: usize = match args.next() {
        Some(t) => parse(Some(t), usage)?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let work: u64 = match args.next() {
        Some(w) => parse(Some(w), usage)?,
        None => 0,
    };
    let workers: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || serve(listen, backend, work)))
        .collect();
    for w in workers {
        w.join().map_err(|_| "a thread panicked".to_string())??;
    }
    Ok(())
}

fn parse<T: std::str::FromStr>(arg: Option<String>, usage: &str) -> Result<T, String> {
    arg.and_then(|a| a.parse().ok())
        .ok_or_else(|| usage.to_string())
}

/// One thread: its runtime, its listener, its pool.
fn serve(listen: SocketAddr, backend: SocketAddr, work: u64) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
        socket.set_reuseport(true).map_err(|e| e.to_string())?;
        socket.bind(listen).map_err(|e| format!("{listen}: {e}"))?;
        let listener = socket.listen(1024).map_err(|e| e.to_string())?;
        let pool: Pool = Rc::default();
        loop {
            let (client, _) = listener.accept().await.map_err(|e| e.to_string())?;
            let _ = client.set_nodelay(true);
            tokio::task::spawn_local(connection(client, backend, pool.clone(), work));
        }
    })
}

/// Requests of one client connection, in turn, until it closes or sends
/// something this floor does not read.
async fn connection(mut client: TcpStream, backend: SocketAddr, pool: Pool, work: u64) {
    let mut from_client = BytesMut::with_capacity(8 * 1024);
    let mut from_backend = BytesMut::with_capacity(8 * 1024);
    loop {
        let Some(request) = message(&mut client, &mut from_client, Kind::Request).await else {
            return;
        };
        spin(work);
        // A pooled connection the backend closed while it idled (its
        // keep-alive timeout) fails before any answer: once more on a new
        // one, as any pooling proxy does.
        let mut pooled = pool.borrow_mut().pop();
        let (upstream, answer) = loop {
            let fresh = pooled.is_none();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => match TcpStream::connect(backend).await {
                    Ok(c) => {
                        let _ = c.set_nodelay(true);
                        c
                    }
                    Err(_) => return,
                },
            };
            from_backend.clear();
            let answer = match conn.write_all(&request).await {
                Ok(()) => message(&mut conn, &mut from_backend, Kind::Response).await,
                Err(_) => None,
            };
            match answer {
                Some(answer) => break (conn, answer),
                None if fresh => return,
                None => continue,
            }
        };
        pool.borrow_mut().push(upstream);
        if client.write_all(&answer).await.is_err() {
            return;
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Request,
    Response,
}

/// One whole message (head and `Content-Length` body) read from `io`,
/// as its bytes; `None` at the end, or past 1 MiB without one.
async fn message(io: &mut TcpStream, buf: &mut BytesMut, kind: Kind) -> Option<BytesMut> {
    loop {
        if let Some(len) = whole(buf, kind) {
            return Some(buf.split_to(len));
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(8 * 1024);
        }
        if io.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// The length of the whole message at the front of `buf`, once it is there.
fn whole(buf: &BytesMut, kind: Kind) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let head = match kind {
        Kind::Request => httparse::Request::new(&mut headers).parse(buf.chunk()),
        Kind::Response => httparse::Response::new(&mut headers).parse(buf.chunk()),
    };
    let head = match head {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let body: usize = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .unwrap_or(0);
    (buf.len() >= head + body).then_some(head + body)
}

/// `rounds` of arithmetic, each depending on the one before and passed
/// through `black_box` (so neither folded into a formula nor run in
/// parallel), on one value.
fn spin(rounds: u64) {
    let mut x = 1u64;
    for i in 0..rounds {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
    }
}
