//! TCP relays for partitions in local drills. Every member's Raft address
//! in the cluster config is its relay; the relay forwards to the port the
//! member really listens on (`node.raft_listen`). The Raft address is
//! replicated with membership, so it is the same for every sender: a relay
//! tells senders apart by the `x-zonegate-node-id` header of the first
//! request on each connection (each node's Raft client keeps its own
//! connections, so every later request on one comes from the same node).
//!
//! A cut `from → to` closes `from`'s open connections to `to`'s relay and
//! refuses its new ones after reading their first request: Raft RPCs and
//! zone reports from `from` to `to` fail at once, as on a network that
//! resets them. Answers to `to`'s own requests to `from` still flow unless
//! the cut is both ways.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Directed links that are cut: `(from, to)`.
pub type Cuts = BTreeSet<(u64, u64)>;

/// One relay per member, all sharing one set of cuts.
pub struct Relays {
    cuts: watch::Sender<Cuts>,
    /// Member id → the relay's address (what the cluster config names).
    pub addrs: BTreeMap<u64, SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Relays {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Relays {
    /// Binds a relay on 127.0.0.1 (port 0) for every member: id → the
    /// address the member's Raft listener will have.
    pub async fn start(targets: &BTreeMap<u64, SocketAddr>) -> std::io::Result<Relays> {
        let (cuts, _) = watch::channel(Cuts::new());
        let mut addrs = BTreeMap::new();
        let mut tasks = Vec::new();
        for (&id, &target) in targets {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.insert(id, listener.local_addr()?);
            let rx = cuts.subscribe();
            tasks.push(tokio::spawn(accept_loop(listener, id, target, rx)));
        }
        Ok(Relays { cuts, addrs, tasks })
    }

    /// Replaces the set of cut links.
    pub fn set(&self, cuts: Cuts) {
        self.cuts.send_replace(cuts);
    }

    /// Adds cut links.
    pub fn cut(&self, links: impl IntoIterator<Item = (u64, u64)>) {
        self.cuts.send_modify(|c| c.extend(links));
    }

    /// Heals every link.
    pub fn heal(&self) {
        self.set(Cuts::new());
    }

    pub fn cuts(&self) -> Cuts {
        self.cuts.borrow().clone()
    }
}

async fn accept_loop(
    listener: TcpListener,
    to: u64,
    target: SocketAddr,
    cuts: watch::Receiver<Cuts>,
) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let cuts = cuts.clone();
        tokio::spawn(async move {
            let _ = relay(conn, to, target, cuts).await;
        });
    }
}

/// The sending node's id, from the first request's head.
pub fn sender_of(head: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("x-zonegate-node-id")
            .then(|| value.trim().parse().ok())?
    })
}

async fn relay(
    mut inbound: TcpStream,
    to: u64,
    target: SocketAddr,
    mut cuts: watch::Receiver<Cuts>,
) -> std::io::Result<()> {
    // Read the first request's head (bounded) to learn who sends.
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let from = loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.read(&mut buf))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break sender_of(&head[..end]);
        }
        if head.len() > 64 * 1024 {
            break None;
        }
    };
    let is_cut = |c: &Cuts| from.is_some_and(|f| c.contains(&(f, to)));
    if is_cut(&cuts.borrow_and_update()) {
        return Ok(());
    }
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    inbound.set_nodelay(true)?;
    upstream.write_all(&head).await?;
    let cut = async {
        loop {
            if cuts.changed().await.is_err() {
                // The relays are gone: the drill is over.
                return;
            }
            if is_cut(&cuts.borrow_and_update()) {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut upstream) => {}
        () = cut => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sender_is_read_from_the_node_header() {
        let head = b"POST /raft/v1/append HTTP/1.1\r\nhost: x\r\nX-Zonegate-Node-Id: 3\r\ncontent-length: 0";
        assert_eq!(sender_of(head), Some(3));
        assert_eq!(sender_of(b"GET / HTTP/1.1\r\nhost: x"), None);
    }

    /// An echo server behind a relay: requests from node 1 pass until the
    /// link 1 → 2 is cut, then the open connection closes and new ones are
    /// refused; node 3's still pass; healing lets node 1 through again.
    #[tokio::test]
    async fn a_cut_closes_and_refuses_only_the_cut_sender() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 || c.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let relays = Relays::start(&BTreeMap::from([(2, echo_addr)]))
            .await
            .unwrap();
        let addr = relays.addrs[&2];
        let req = |from: u64| {
            format!("POST /raft/v1/vote HTTP/1.1\r\nx-zonegate-node-id: {from}\r\n\r\n")
        };
        async fn roundtrip(c: &mut TcpStream, msg: &str) -> bool {
            if c.write_all(msg.as_bytes()).await.is_err() {
                return false;
            }
            let mut buf = vec![0u8; msg.len()];
            matches!(
                tokio::time::timeout(std::time::Duration::from_secs(5), c.read_exact(&mut buf))
                    .await,
                Ok(Ok(_))
            )
        }
        let mut one = TcpStream::connect(addr).await.unwrap();
        assert!(roundtrip(&mut one, &req(1)).await);
        relays.cut([(1, 2)]);
        // The open connection is closed...
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), one.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);
        // ...a new one is refused, and node 3 still passes.
        let mut again = TcpStream::connect(addr).await.unwrap();
        assert!(!roundtrip(&mut again, &req(1)).await);
        let mut three = TcpStream::connect(addr).await.unwrap();
        assert!(roundtrip(&mut three, &req(3)).await);
        relays.heal();
        let mut healed = TcpStream::connect(addr).await.unwrap();
        assert!(roundtrip(&mut healed, &req(1)).await);
    }
}
