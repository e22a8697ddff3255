//! Cluster identity: the id fixed at formation, which members are known to
//! hold it, and the checks that keep a member that lost its store from
//! rejoining silently (amnesia).
//!
//! A member that acknowledged Raft entries or votes and then lost its store
//! would, if taken back as a voter with an empty log, let a leader without
//! those entries be elected and lose acknowledged decisions. So:
//!
//! - the lowest-id voter generates a random cluster id when it forms the
//!   cluster; it is stored (durably, with the Raft state and in the
//!   `CLUSTER_ID` marker beside the store) and carried in every Raft RPC
//!   and answer ([`CLUSTER_HEADER`]);
//! - every node records which members hold the id ("joined": a request or
//!   an answer carrying it came from them), and every RPC carries the
//!   sender's joined set ([`JOINED_HEADER`]), so each member soon knows
//!   every member that ever held the id;
//! - a node without an id adopts the id of the first RPC that carries it,
//!   before that RPC reaches Raft, unless the sender's joined set names it:
//!   then it held the id before and lost its store. It refuses, and stops
//!   with a message naming the fix (`zonegate serve --rejoin`);
//! - a different id is refused both ways (409);
//! - stores written before cluster ids hold none: the lowest-id voter
//!   gives its cluster one at start, and the others adopt it.
//!
//! The window left open: a member that acknowledged its first entries and
//! whose leader crashed before telling anyone (one heartbeat) is not
//! recognised if it loses its store in that window.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};

use tokio::sync::watch;

use crate::lock::lock;
use crate::store::{IdentityStore, StoreError, StoredIdentity};
use crate::view::NodeId;

/// The sender's (or answerer's) cluster id; empty while it has none.
pub const CLUSTER_HEADER: &str = "x-zonegate-cluster-id";
/// The members the sender knows to hold the id, comma-separated.
pub const JOINED_HEADER: &str = "x-zonegate-cluster-joined";

/// Why a peer's RPC or answer was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("cluster id mismatch: this node is in cluster {ours}, the peer in {theirs}")]
    WrongCluster { ours: String, theirs: String },
    #[error("{0}")]
    Amnesia(String),
}

/// One node's identity, shared by the RPC server and client.
pub(crate) struct Identity {
    me: NodeId,
    /// `None` once the node shut down, so the store can close.
    store: std::sync::Mutex<Option<IdentityStore>>,
    state: std::sync::Mutex<StoredIdentity>,
    /// Serializes writes, so each is durable before the next decision.
    write: tokio::sync::Mutex<()>,
    /// Set once this node learned it lost its store: the node stops.
    amnesia: watch::Sender<Option<String>>,
    /// While rejoining: the vote `(term, node)` of the leader that
    /// answered that this node is a learner in its committed membership.
    /// Until then this node takes no append (see [`Identity::admits`]).
    /// Not persisted: a restarted rejoiner asks again.
    rejoin_floor: std::sync::Mutex<Option<(u64, NodeId)>>,
}

/// A random 128-bit id, hex. std's `RandomState` is seeded from the OS's
/// random source per instance; two of them give 128 bits without another
/// dependency.
fn random_id() -> String {
    #[cfg(feature = "sim")]
    if let (Some(a), Some(b)) = (crate::sim::random(), crate::sim::random()) {
        return format!("{a:016x}{b:016x}");
    }
    let half = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

fn parse_joined(text: &str) -> BTreeSet<NodeId> {
    text.split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

impl Identity {
    pub fn new(me: NodeId, store: IdentityStore) -> Result<Self, StoreError> {
        let state = store.load()?;
        Ok(Self {
            me,
            store: std::sync::Mutex::new(Some(store)),
            state: std::sync::Mutex::new(state),
            write: tokio::sync::Mutex::new(()),
            amnesia: watch::channel(None).0,
            rejoin_floor: std::sync::Mutex::new(None),
        })
    }

    /// A leader with vote `(term, node)` answered that this rejoining
    /// node is a learner in its committed membership.
    pub fn admitted_by(&self, term: u64, node: NodeId) {
        let mut floor = lock(&self.rejoin_floor);
        *floor = (*floor).max(Some((term, node)));
    }

    /// Whether this node takes an append or snapshot sent under vote
    /// `(term, node)`. A rejoining node lost the vote it had granted and
    /// the entries it had acknowledged: as long as a membership lists it
    /// as a voter its acknowledgement counts toward a commit, even for a
    /// leader whose term has passed (which a node with its store would
    /// refuse). So it takes appends only once a leader answered that it
    /// is a learner in that leader's committed membership, and only under
    /// that leader's vote or a later one (openraft's order: term, then
    /// node id). The simulation's seed 2000013 found this: a stale leader
    /// committed with a wiped voter's acknowledgement over entries a later
    /// leader had committed.
    pub fn admits(&self, term: u64, node: NodeId) -> bool {
        if !self.rejoining() {
            return true;
        }
        lock(&self.rejoin_floor).is_some_and(|floor| (term, node) >= floor)
    }

    pub fn current(&self) -> StoredIdentity {
        lock(&self.state).clone()
    }

    pub fn cluster_id(&self) -> Option<String> {
        lock(&self.state).cluster_id.clone()
    }

    pub fn rejoining(&self) -> bool {
        lock(&self.state).rejoining
    }

    /// The header values this node sends: its id and joined set.
    pub fn headers(&self) -> (String, String) {
        let s = lock(&self.state);
        let joined: Vec<String> = s.joined.iter().map(u64::to_string).collect();
        (s.cluster_id.clone().unwrap_or_default(), joined.join(","))
    }

    /// Let go of the store (the node is shutting down).
    pub fn close(&self) {
        lock(&self.store).take();
    }

    /// Fires when this node found out it lost its store.
    pub fn amnesia(&self) -> watch::Receiver<Option<String>> {
        self.amnesia.subscribe()
    }

    /// Apply `change` to the identity and persist it (if it changed)
    /// before returning.
    async fn update(
        &self,
        change: impl FnOnce(&mut StoredIdentity) -> Result<(), Mismatch>,
    ) -> Result<(), Mismatch> {
        let _w = self.write.lock().await;
        let mut next = self.current();
        change(&mut next)?;
        if next == self.current() {
            return Ok(());
        }
        let Some(store) = lock(&self.store).clone() else {
            return Err(Mismatch::WrongCluster {
                ours: "closed".into(),
                theirs: next.cluster_id.unwrap_or_default(),
            });
        };
        if let Err(e) = store.save(&next).await {
            // Not durable: do not let the RPC through.
            tracing::error!(error = %e, "cannot persist the cluster identity");
            return Err(Mismatch::WrongCluster {
                ours: "unpersisted".into(),
                theirs: next.cluster_id.unwrap_or_default(),
            });
        }
        *lock(&self.state) = next;
        Ok(())
    }

    /// A new cluster: a fresh id, held by this node.
    pub async fn form(&self) -> Result<String, Mismatch> {
        let id = random_id();
        let me = self.me;
        self.update(|s| {
            s.cluster_id.get_or_insert_with(|| id.clone());
            s.joined.insert(me);
            Ok(())
        })
        .await?;
        Ok(self.cluster_id().unwrap_or(id))
    }

    /// Start (or keep) rejoining: a learner until promoted.
    pub async fn set_rejoining(&self, on: bool) -> Result<(), Mismatch> {
        self.update(|s| {
            s.rejoining = on;
            Ok(())
        })
        .await
    }

    /// A Raft RPC from `sender` carrying `id` and `joined`: adopt, merge
    /// or refuse, durably, before the RPC reaches Raft.
    pub async fn on_request(
        &self,
        sender: NodeId,
        id: Option<&str>,
        joined: Option<&str>,
    ) -> Result<(), Mismatch> {
        let theirs = id.filter(|s| !s.is_empty()).map(str::to_owned);
        let their_joined = joined.map(parse_joined).unwrap_or_default();
        let me = self.me;
        let result = self
            .update(|s| match (&s.cluster_id, theirs) {
                (Some(ours), Some(t)) if *ours != t => Err(Mismatch::WrongCluster {
                    ours: ours.clone(),
                    theirs: t,
                }),
                (Some(_), Some(_)) => {
                    s.joined.extend(their_joined);
                    s.joined.insert(sender);
                    Ok(())
                }
                // A sender without an id: a store from before cluster ids
                // (it adopts ours from our RPCs), or a cluster still
                // forming. Nothing to record.
                (_, None) => Ok(()),
                (None, Some(t)) if their_joined.contains(&me) && !s.rejoining => {
                    Err(Mismatch::Amnesia(format!(
                        "node {me} lost its Raft state: its data_dir holds none, but member {sender} knows it as a member of cluster {t} that held Raft state before. Refusing to rejoin with an empty store (acknowledged decisions could be lost). Fix: if its data_dir can be restored, restore it; otherwise start it with `zonegate serve --rejoin` (it catches up as a learner and is then promoted to its configured role)"
                    )))
                }
                (None, Some(t)) => {
                    tracing::info!(cluster_id = %t, from = sender, "joined the cluster");
                    s.cluster_id = Some(t);
                    s.joined.extend(their_joined);
                    s.joined.insert(sender);
                    s.joined.insert(me);
                    Ok(())
                }
            })
            .await;
        if let Err(Mismatch::Amnesia(msg)) = &result {
            self.amnesia.send_if_modified(|a| {
                if a.is_none() {
                    tracing::error!("{msg}");
                    *a = Some(msg.clone());
                    true
                } else {
                    false
                }
            });
        }
        result
    }

    /// A Raft answer from `peer` carrying `id`: it holds our id (record
    /// it), or another one (refuse the answer).
    pub async fn on_answer(&self, peer: NodeId, id: Option<&str>) -> Result<(), Mismatch> {
        let theirs = id.filter(|s| !s.is_empty());
        self.update(|s| match (&s.cluster_id, theirs) {
            (Some(ours), Some(t)) if ours != t => Err(Mismatch::WrongCluster {
                ours: ours.clone(),
                theirs: t.to_owned(),
            }),
            (Some(_), Some(_)) => {
                s.joined.insert(peer);
                Ok(())
            }
            _ => Ok(()),
        })
        .await
    }

    /// Only check for a different id (zone reports: never adopt from one).
    pub fn check(&self, id: Option<&str>) -> Result<(), Mismatch> {
        let theirs = id.filter(|s| !s.is_empty());
        match (self.cluster_id(), theirs) {
            (Some(ours), Some(t)) if ours != t => Err(Mismatch::WrongCluster {
                ours,
                theirs: t.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_differ() {
        assert_ne!(random_id(), random_id());
        assert_eq!(random_id().len(), 32);
    }

    #[test]
    fn joined_sets_parse_leniently() {
        assert_eq!(parse_joined("1,2, 3,,x"), BTreeSet::from([1, 2, 3]));
        assert!(parse_joined("").is_empty());
    }

    #[tokio::test]
    async fn a_pristine_node_adopts_an_id_unless_it_is_known_to_have_held_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_l, _s, _live, store) = crate::store::open_with_identity(dir.path()).unwrap();
        let id = Identity::new(2, store).unwrap();
        let err = id.on_request(1, Some("abc"), Some("1,2,3")).await;
        assert!(matches!(err, Err(Mismatch::Amnesia(_))), "{err:?}");
        assert!(id.amnesia().borrow().is_some());
        assert_eq!(id.cluster_id(), None);

        id.on_request(1, Some("abc"), Some("1,3")).await.unwrap();
        assert_eq!(id.cluster_id().as_deref(), Some("abc"));
        assert_eq!(id.current().joined, BTreeSet::from([1, 2, 3]));
        let wrong = id.on_request(1, Some("xyz"), Some("1")).await;
        assert!(matches!(wrong, Err(Mismatch::WrongCluster { .. })));
        assert!(id.on_answer(3, Some("xyz")).await.is_err());
    }

    #[tokio::test]
    async fn a_rejoining_node_adopts_although_it_held_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let (_l, _s, _live, store) = crate::store::open_with_identity(dir.path()).unwrap();
        let id = Identity::new(2, store).unwrap();
        id.set_rejoining(true).await.unwrap();
        id.on_request(1, Some("abc"), Some("1,2,3")).await.unwrap();
        assert_eq!(id.cluster_id().as_deref(), Some("abc"));
        assert!(id.rejoining());
    }
}
