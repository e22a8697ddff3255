//! Raft RPC over HTTP: the client side openraft calls ([`Network`]), the
//! axum server side ([`server`]) and the test fault hook ([`FaultTable`]).
//!
//! Wire contract: `POST` with a bincode body (see [`crate::codec`]) to one
//! path per RPC; every request carries the sender's node id and an HMAC
//! signature (never the secret; see [`zonegate_net::sign`]), and every
//! answer after authentication is signed back, bound to the request's
//! nonce. A `200` body is the bincode of `Result<Response, RaftError<E>>`:
//! a Raft-level refusal is a valid answer, not a transport failure. `401`
//! means a missing, bad, stale or replayed signature, `403` a sender that
//! is not a member (but a leader with a committed vote that appends or
//! sends a snapshot), does not match the RPC's vote, or (mutual TLS) whose
//! certificate does not name it.

pub mod fault;
pub mod server;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use serde::Serialize;

pub use fault::FaultTable;
pub use server::refusals;
pub use wire::{
    NODE_HEADER, PATH_APPEND, PATH_ELECT, PATH_HELLO, PATH_PREVOTE, PATH_REJOIN, PATH_REPORT,
    PATH_SNAPSHOT, PATH_VOTE,
};
pub use zonegate_net::sign::SIGNATURE_HEADER;

use zonegate_net::sign::{self, Call, KeyRing, SignError};
use zonegate_net::tls::MemberTls;

/// An answer's refusal status (the peer's "no", never retried as a
/// transport fault), else the cluster id, joined stamp and signature
/// headers every answer carries (empty when missing: checked later).
fn answer_head(
    to: NodeId,
    status: u16,
    headers: &reqwest::header::HeaderMap,
) -> Result<(String, String, String), TransportError> {
    if matches!(status, 400 | 401 | 403 | 404 | 413) {
        return Err(TransportError::Refused { to, status });
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    Ok((
        header(CLUSTER_HEADER),
        header(JOINED_HEADER),
        header(SIGNATURE_HEADER),
    ))
}

#[cfg(test)]
use crate::clock::unix_ms;
use crate::clock::unix_ms_on;
use crate::codec::{self, Bounded};
use crate::detect::Report;
use crate::failover::{ReportAck, SendReport};
use crate::identity::{Identity, Mismatch, CLUSTER_HEADER, JOINED_HEADER};
use crate::types::alias::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use crate::types::{Member, TypeConfig};
use crate::view::NodeId;

/// The failure of one RPC before a Raft answer came back.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("link {from} -> {to} is cut by the fault table")]
    Cut { from: NodeId, to: NodeId },
    #[error("request to node {to} at {addr}: {source}")]
    Http {
        to: NodeId,
        addr: String,
        source: reqwest::Error,
    },
    #[error(
        "node {to} refused the call with HTTP {status} (check the cluster secret and member ids)"
    )]
    Refused { to: NodeId, status: u16 },
    #[error("node {to} is not a configured member")]
    UnknownPeer { to: NodeId },
    #[error("body from node {to}: {source}")]
    Body {
        to: NodeId,
        source: codec::CodecError,
    },
    #[error("answer from node {to}: {source}")]
    Identity { to: NodeId, source: Mismatch },
    #[error("answer from node {to} refused: {source} (check the cluster secret)")]
    Unsigned { to: NodeId, source: SignError },
    #[error("TLS towards node {to}: {reason}")]
    Tls { to: NodeId, reason: String },
    /// The simulation's network (feature `sim`) did not deliver it.
    #[cfg(feature = "sim")]
    #[error("simulated network towards node {to}: {reason}")]
    Simulated { to: NodeId, reason: String },
}

/// openraft's network factory. Every call is signed with this node's Raft
/// key ([`zonegate_net::sign`]); with mutual TLS each peer gets its own
/// client, which presents this member's certificate and accepts only the
/// peer's (see [`zonegate_net::tls::MemberTls`]).
#[derive(Clone)]
pub struct Network {
    node_id: NodeId,
    keys: Arc<KeyRing>,
    transport: Transport,
    faults: Option<Arc<FaultTable>>,
    identity: Option<Arc<Identity>>,
}

/// Plain HTTP over one shared client, or HTTPS with a client per peer
/// (rebuilt when the certificate files change).
#[derive(Clone)]
enum Transport {
    Plain(reqwest::Client),
    Tls {
        tls: MemberTls,
        connect_timeout: Duration,
        clients: Arc<parking_lot::Mutex<HashMap<NodeId, (Stamp, reqwest::Client)>>>,
    },
}

type Stamp = Vec<Option<(std::time::SystemTime, u64)>>;

fn client_builder(connect_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        // Raft peers are addressed directly; an HTTP proxy from the
        // environment must never sit between them.
        .no_proxy()
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(30))
}

impl Transport {
    /// The client for calls to `peer`, and the URL scheme.
    fn client(&self, peer: NodeId) -> Result<(reqwest::Client, &'static str), String> {
        match self {
            Transport::Plain(c) => Ok((c.clone(), "http")),
            Transport::Tls {
                tls,
                connect_timeout,
                clients,
            } => {
                let stamp = tls.stamp();
                let mut clients = clients.lock();
                if let Some((s, c)) = clients.get(&peer) {
                    if *s == stamp {
                        return Ok((c.clone(), "https"));
                    }
                }
                let config = tls.client_for(peer).map_err(|e| e.to_string())?;
                let client = client_builder(*connect_timeout)
                    .use_preconfigured_tls(config)
                    .build()
                    .map_err(|e| e.to_string())?;
                clients.insert(peer, (stamp, client.clone()));
                Ok((client, "https"))
            }
        }
    }
}

impl Network {
    /// Carry this node's cluster identity in every RPC and check answers
    /// against it.
    pub(crate) fn with_identity(mut self, identity: Arc<Identity>) -> Self {
        self.identity = Some(identity);
        self
    }

    /// POST an empty, signed request to member `to` at `addr` + `path`
    /// (hello, rejoin); returns the status and the answer's cluster id and
    /// joined headers, once the answer's signature checks out.
    pub(crate) async fn post_empty(
        &self,
        to: NodeId,
        addr: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String, String), TransportError> {
        let peer = PeerClient {
            net: self.clone(),
            target: to,
            addr: addr.to_owned(),
        };
        let (status, id, joined, _) = peer.exchange(path, Vec::new(), timeout, 0, false).await?;
        Ok((status, id, joined))
    }

    /// [`Network::post_empty`], returning the status and the answer's body
    /// (the pre-vote's answer names the voter's last log entry).
    pub(crate) async fn post_empty_for_body(
        &self,
        to: NodeId,
        addr: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), TransportError> {
        let peer = PeerClient {
            net: self.clone(),
            target: to,
            addr: addr.to_owned(),
        };
        let (status, _, _, body) = peer.exchange(path, Vec::new(), timeout, 0, false).await?;
        Ok((status, body))
    }

    /// A network for node `node_id` signing with `keys`, over mutual TLS
    /// when `tls` is given; `faults`, when given, is consulted before
    /// every RPC.
    pub fn new(
        node_id: NodeId,
        keys: Arc<KeyRing>,
        tls: Option<MemberTls>,
        connect_timeout: Duration,
        faults: Option<Arc<FaultTable>>,
    ) -> Result<Self, reqwest::Error> {
        let transport = match tls {
            None => Transport::Plain(client_builder(connect_timeout).build()?),
            Some(tls) => Transport::Tls {
                tls,
                connect_timeout,
                clients: Arc::default(),
            },
        };
        Ok(Self {
            node_id,
            keys,
            transport,
            faults,
            identity: None,
        })
    }
}

/// Sends zone reports to the leader's Raft address, through the same
/// client and fault table as every Raft RPC.
#[derive(Clone)]
pub(crate) struct ReportClient {
    pub net: Network,
    pub members: crate::roster::Roster,
}

impl SendReport for ReportClient {
    type Error = TransportError;

    async fn send_report(
        &self,
        to: NodeId,
        report: &Report,
        ttl: Duration,
    ) -> Result<ReportAck, TransportError> {
        let addr = self
            .members
            .get(to)
            .map(|m| m.raft_addr.clone())
            .ok_or(TransportError::UnknownPeer { to })?;
        let peer = PeerClient {
            net: self.net.clone(),
            target: to,
            addr,
        };
        peer.send(PATH_REPORT, report, ttl).await
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            net: self.clone(),
            target,
            addr: node.raft_addr.clone(),
        }
    }
}

/// The RPC client for one peer.
pub struct PeerClient {
    net: Network,
    target: NodeId,
    addr: String,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Result<Resp, RaftError<NodeId, E>>: Bounded,
        E: std::error::Error,
    {
        let answer: Result<Resp, RaftError<NodeId, E>> = self
            .send(path, req, option.hard_ttl())
            .await
            .map_err(|e| match e {
                // Transport and refusal failures make openraft back off
                // (see `backoff`) instead of retrying in a tight loop.
                TransportError::Body { .. } => RPCError::Network(NetworkError::new(&e)),
                _ => RPCError::Unreachable(Unreachable::new(&e)),
            })?;
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    async fn send<Req: Serialize, T: Bounded>(
        &self,
        path: &str,
        req: &Req,
        ttl: Duration,
    ) -> Result<T, TransportError> {
        let to = self.target;
        let body = codec::encode(req).map_err(|source| TransportError::Body { to, source })?;
        let (status, _, _, bytes) = self.exchange(path, body, ttl, T::LIMIT, true).await?;
        if !(200..300).contains(&status) {
            return Err(TransportError::Refused { to, status });
        }
        codec::decode(&bytes).map_err(|source| TransportError::Body { to, source })
    }

    /// One signed call (`adopt_identity`: check the answer's cluster id
    /// against this node's, as Raft RPCs do; the start-up hello does not):
    /// its status, the answer's identity headers and
    /// body (at most `cap` bytes). A refusal before authentication
    /// (400/401/403) comes back as [`TransportError::Refused`]; any other
    /// answer must carry a valid signature bound to this call.
    async fn exchange(
        &self,
        path: &str,
        body: Vec<u8>,
        ttl: Duration,
        cap: usize,
        adopt_identity: bool,
    ) -> Result<(u16, String, String, Vec<u8>), TransportError> {
        let (from, to) = (self.net.node_id, self.target);
        if let Some(faults) = &self.net.faults {
            if faults.is_blocked(from, to) {
                return Err(TransportError::Cut { from, to });
            }
        }
        let call = Call {
            method: "POST",
            path,
            node: from,
        };
        let signature = sign::sign_call(&self.net.keys, call, &body, unix_ms_on(from));
        #[cfg(feature = "sim")]
        if let Some(net) = crate::sim::net() {
            let answer = self.post_sim(net, path, body, &signature, ttl, cap).await?;
            return self.accept(path, &signature, answer, adopt_identity).await;
        }
        let answer = self.post_http(path, body, &signature, ttl, cap).await?;
        self.accept(path, &signature, answer, adopt_identity).await
    }

    /// The request's headers: who sends it, its signature, and this
    /// node's cluster identity.
    fn headers(&self, signature: &sign::Signature) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            (SIGNATURE_HEADER, signature.header()),
            (NODE_HEADER, self.net.node_id.to_string()),
        ];
        if let Some(identity) = &self.net.identity {
            let (id, joined) = identity.headers();
            headers.push((CLUSTER_HEADER, id));
            headers.push((JOINED_HEADER, joined));
        }
        headers
    }

    /// POST the signed call over HTTP(S); its answer, read up to `cap`.
    async fn post_http(
        &self,
        path: &str,
        body: Vec<u8>,
        signature: &sign::Signature,
        ttl: Duration,
        cap: usize,
    ) -> Result<RawAnswer, TransportError> {
        let to = self.target;
        let http = |source| TransportError::Http {
            to,
            addr: self.addr.clone(),
            source,
        };
        let (client, scheme) = self
            .net
            .transport
            .client(to)
            .map_err(|reason| TransportError::Tls { to, reason })?;
        let mut req = client
            .post(format!("{scheme}://{}{path}", self.addr))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .timeout(ttl)
            .body(body);
        for (name, value) in self.headers(signature) {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(http)?;
        let status = resp.status().as_u16();
        let (id, joined, signed) = answer_head(to, status, resp.headers())?;
        // The answer is bounded like a request: a peer (or whatever now
        // listens on its port) that answers garbage or a length bomb fails
        // this RPC, never the process.
        let bytes = read_capped(resp, cap.max(ANSWER_HEAD))
            .await
            .map_err(|e| match e {
                Capped::Http(source) => http(source),
                Capped::TooLarge(len) => TransportError::Body {
                    to,
                    source: codec::CodecError::TooLarge { len, limit: cap },
                },
            })?;
        Ok(RawAnswer {
            status,
            id,
            joined,
            signed,
            bytes,
        })
    }

    /// The same call through the simulation's network (feature `sim`):
    /// the same headers and bytes, to the peer's router in-process.
    #[cfg(feature = "sim")]
    async fn post_sim(
        &self,
        net: Arc<dyn crate::sim::Net>,
        path: &str,
        body: Vec<u8>,
        signature: &sign::Signature,
        ttl: Duration,
        cap: usize,
    ) -> Result<RawAnswer, TransportError> {
        let to = self.target;
        let unreachable = |reason: String| TransportError::Simulated { to, reason };
        let mut req = axum::http::Request::post(path)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream");
        for (name, value) in self.headers(signature) {
            req = req.header(name, value);
        }
        let req = req
            .body(axum::body::Body::from(body))
            .map_err(|e| unreachable(e.to_string()))?;
        let (parts, body) = net
            .exchange(self.net.node_id, to, req, ttl)
            .await
            .map_err(unreachable)?
            .into_parts();
        let status = parts.status.as_u16();
        let (id, joined, signed) = answer_head(to, status, &parts.headers)?;
        let limit = cap.max(ANSWER_HEAD);
        let bytes = axum::body::to_bytes(body, limit)
            .await
            .map_err(|_| TransportError::Body {
                to,
                source: codec::CodecError::TooLarge {
                    len: limit.saturating_add(1),
                    limit: cap,
                },
            })?
            .to_vec();
        Ok(RawAnswer {
            status,
            id,
            joined,
            signed,
            bytes,
        })
    }

    /// Check an answer's signature (bound to this call's nonce) and, for
    /// Raft RPCs, its cluster identity.
    async fn accept(
        &self,
        path: &str,
        signature: &sign::Signature,
        answer: RawAnswer,
        adopt_identity: bool,
    ) -> Result<(u16, String, String, Vec<u8>), TransportError> {
        let (from, to) = (self.net.node_id, self.target);
        let RawAnswer {
            status,
            id,
            joined,
            signed,
            bytes,
        } = answer;
        let answering = Call {
            method: "POST",
            path,
            node: to,
        };
        sign::verify_answer(
            &self.net.keys,
            Some(signed.as_str()).filter(|s| !s.is_empty()),
            status,
            answering,
            &signature.nonce,
            &answer_digest_input(&bytes, &id, &joined),
            unix_ms_on(from),
        )
        .map_err(|source| TransportError::Unsigned { to, source })?;
        if let Some(identity) = self.net.identity.as_ref().filter(|_| adopt_identity) {
            if (200..300).contains(&status) {
                identity
                    .on_answer(to, Some(id.as_str()).filter(|s| !s.is_empty()))
                    .await
                    .map_err(|source| TransportError::Identity { to, source })?;
            }
        }
        Ok((status, id, joined, bytes))
    }
}

/// An answer as it came back, before its signature is checked.
struct RawAnswer {
    status: u16,
    id: String,
    joined: String,
    signed: String,
    bytes: Vec<u8>,
}

/// Room for a refusal's text when the answer type itself is empty.
const ANSWER_HEAD: usize = 4096;

/// What an answer's signature covers: its body and its identity headers
/// (the cluster id and joined set are the whole answer to a hello).
pub(crate) fn answer_digest_input(body: &[u8], cluster_id: &str, joined: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + cluster_id.len() + joined.len() + 2);
    v.extend_from_slice(body);
    v.push(0);
    v.extend_from_slice(cluster_id.as_bytes());
    v.push(0);
    v.extend_from_slice(joined.as_bytes());
    v
}

enum Capped {
    Http(reqwest::Error),
    /// The body grew past the cap after this many bytes.
    TooLarge(usize),
}

/// Read a response body, refusing it once it exceeds `cap` bytes (checked
/// against `Content-Length` first, then while reading).
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, Capped> {
    if let Some(len) = resp.content_length() {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > cap {
            return Err(Capped::TooLarge(len));
        }
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Capped::Http)? {
        if body.len() + chunk.len() > cap {
            return Err(Capped::TooLarge(body.len() + chunk.len()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(PATH_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse,
        RPCError<NodeId, Member, RaftError<NodeId, openraft::error::InstallSnapshotError>>,
    > {
        self.call(PATH_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(PATH_VOTE, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use openraft::network::RPCOption;
    use openraft::Vote;

    use super::*;
    use crate::samples::{append_error_answer, append_requests, bomb_string};

    const SECRET: &str = "test-secret-0123456789";

    fn keys() -> KeyRing {
        KeyRing::derive(SECRET, sign::Purpose::Raft).unwrap()
    }

    /// A "peer" (member 2) that answers every POST with `body` (HTTP 200),
    /// signed as a member would: the garbage is past authentication.
    async fn peer_answering(body: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let body = body.clone();
            async move {
                let header = req.headers()[SIGNATURE_HEADER].to_str().unwrap();
                let nonce = sign::Signature::parse(header).unwrap().nonce;
                let me = Call {
                    method: "POST",
                    path: req.uri().path(),
                    node: 2,
                };
                let signed = answer_digest_input(&body, "", "");
                let sig = sign::sign_answer(keys().signer(), 200, me, &nonce, &signed, unix_ms());
                ([(SIGNATURE_HEADER, sig.header())], body)
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    async fn client_for(addr: String) -> PeerClient {
        let mut net =
            Network::new(1, Arc::new(keys()), None, Duration::from_secs(5), None).unwrap();
        let member = Member {
            id: 2,
            raft_addr: addr,
            ..Member::default()
        };
        net.new_client(2, &member).await
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(5))
    }

    #[tokio::test]
    async fn a_peer_answering_garbage_or_a_length_bomb_fails_the_rpc_not_the_process() {
        let error = codec::encode(&append_error_answer("MARKER")).unwrap();
        let bombs: Vec<Vec<u8>> = vec![
            Vec::new(),
            vec![7, 7, 7],
            // An error answer whose text claims 2^50 bytes.
            bomb_string(&error, "MARKER"),
            // Truncated.
            error[..error.len() / 2].to_vec(),
        ];
        for bomb in bombs {
            let mut client = client_for(peer_answering(bomb.clone()).await).await;
            let rpc = append_requests().remove(1);
            let answer = client.append_entries(rpc, option()).await;
            assert!(
                matches!(answer, Err(RPCError::Network(_))),
                "{bomb:?}: {answer:?}"
            );
            let vote = VoteRequest {
                vote: Vote::new(1, 1),
                last_log_id: None,
            };
            let answer = client.vote(vote, option()).await;
            assert!(matches!(answer, Err(RPCError::Network(_))), "{bomb:?}");
        }
    }

    #[tokio::test]
    async fn an_answer_larger_than_its_limit_is_refused_unread() {
        let huge = vec![0u8; codec::limits::ANSWER + 1];
        let mut client = client_for(peer_answering(huge).await).await;
        let vote = VoteRequest {
            vote: Vote::new(1, 1),
            last_log_id: None,
        };
        match client.vote(vote, option()).await {
            Err(RPCError::Network(e)) => assert!(e.to_string().contains("limit"), "{e}"),
            other => panic!("expected a network error, got {other:?}"),
        }
    }
}
