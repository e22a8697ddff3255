//! The sled-backed Raft storage of one node: the log, vote, committed and
//! last-purged pointers ([`LogStore`]), and the applied state machine with
//! its snapshots ([`StateMachineStore`]), all under one data directory.
//!
//! Architecture Invariant: nothing is acknowledged before it is on disk,
//! power loss included. A saved vote is durable before `save_vote`
//! returns; appended entries are durable before the append callback fires;
//! truncate and purge are durable before they return; applied state is
//! durable before `apply` returns, so a restarted node never re-applies a
//! decision against an older state. Durable means sled's `flush_async`
//! and then `durable::Durable::sync` (`fdatasync`/`fsync` of sled's
//! files: sled alone only `sync_file_range`s).
//!
//! sled's reads and in-memory inserts are quick synchronous calls and are
//! made inline; flushes go through `flush_async` (sled's thread pool) and
//! the syncs through tokio's blocking pool, keeping the runtime free.

// openraft's trait signatures fix the (large) `StorageError`; the helpers
// return it too rather than boxing and unboxing at every call.
#![allow(clippy::result_large_err)]

mod durable;
pub mod fault;

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, StorageIOError,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use self::durable::Durable;
pub use self::fault::{StoreFailure, FAULT_ENV};
use crate::codec::{self, Bounded};
use crate::command::{Outcome, Response};
use crate::state::ClusterState;
use crate::types::alias::{Entry, LogId, SnapshotMeta, StorageError, StoredMembership, Vote};
use crate::types::TypeConfig;
use crate::view::ClusterView;

const TREE_LOG: &str = "raft_log";
const TREE_META: &str = "raft_meta";
const TREE_SM: &str = "state_machine";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";
const KEY_APPLIED: &[u8] = b"applied";
const KEY_SNAPSHOT: &[u8] = b"snapshot";
/// The cluster identity (plain text, see [`StoredIdentity`]).
const KEY_IDENTITY: &[u8] = b"cluster_identity";

/// Beside `raft.sled` in the data directory: the cluster id in plain text,
/// so a store that was wiped or replaced is noticed, never opened as empty.
pub const MARKER_FILE: &str = "CLUSTER_ID";

/// The start-up probe's key: a small durable write, so a full disk is
/// found before the node joins, not at its first append.
const KEY_PROBE: &[u8] = b"write_probe";

/// A store refuses to open with less free space than this under its data
/// directory: sled writes its log in 512 KiB segments and a snapshot of
/// the whole state at a time, so a nearly full disk fails at the next
/// write anyway (and Raft stops for good on a failed write).
pub const MIN_FREE_BYTES: u64 = 16 * 1024 * 1024;

/// Bytes available to this process under `dir` (for
/// `zonegate_data_dir_free_bytes`).
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    fs2::available_space(dir)
}

/// sled's default page cache is 1 GiB; the control plane's state is small
/// and shares the machine with the data plane.
const CACHE_BYTES: u64 = 32 * 1024 * 1024;

/// Opening the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the raft store at {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error("cannot sync the raft store at {path} to disk: {source}")]
    Sync {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("raft store at {path} holds unreadable {what}: {source}")]
    Corrupt {
        path: PathBuf,
        what: &'static str,
        source: codec::CodecError,
    },
    /// The store is empty or was replaced, but the marker says this node
    /// belonged to a cluster; or the two name different clusters.
    #[error("raft store at {path} is corrupted or was replaced: {reason}")]
    Lost { path: PathBuf, reason: String },
    /// The filesystem under the data directory is full (or nearly).
    #[error("the filesystem under {path} is full ({detail}): the Raft store cannot write. Free space (or grow the disk) under it and start the node again: it rejoins and catches up from the other members")]
    NoSpace { path: PathBuf, detail: String },
    #[error("cannot read or write {path}: {source}")]
    Marker {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a node knows about the cluster it belongs to, persisted with its
/// Raft state: the cluster id fixed at formation, the members known to
/// hold it (so a member that lost its store is recognised), and whether
/// this node is rejoining (a learner that must not vote until promoted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredIdentity {
    pub cluster_id: Option<String>,
    pub joined: std::collections::BTreeSet<u64>,
    pub rejoining: bool,
}

impl StoredIdentity {
    /// `id;1,2,3;rejoining` (plain text, no codec: tiny and readable).
    fn encode(&self) -> String {
        let joined: Vec<String> = self.joined.iter().map(u64::to_string).collect();
        format!(
            "{};{};{}",
            self.cluster_id.as_deref().unwrap_or_default(),
            joined.join(","),
            if self.rejoining { "rejoining" } else { "" }
        )
    }

    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split(';');
        let id = parts.next()?;
        let joined = parts
            .next()?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        let rejoining = parts.next()? == "rejoining";
        Some(Self {
            cluster_id: (!id.is_empty()).then(|| id.to_owned()),
            joined,
            rejoining,
        })
    }
}

/// Reads and durably writes the [`StoredIdentity`] of one store.
#[derive(Clone)]
pub struct IdentityStore {
    db: sled::Db,
    durable: Durable,
    meta: sled::Tree,
    marker: PathBuf,
    _open: Arc<()>,
}

impl IdentityStore {
    /// The identity as opened (checked against the marker by [`open`]).
    pub fn load(&self) -> Result<StoredIdentity, StoreError> {
        let path = self.marker.with_file_name("raft.sled");
        let bytes = self
            .meta
            .get(KEY_IDENTITY)
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source,
            })?;
        match bytes {
            None => Ok(StoredIdentity::default()),
            Some(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(StoredIdentity::decode)
                .ok_or_else(|| StoreError::Lost {
                    path,
                    reason: "its cluster identity record is unreadable".into(),
                }),
        }
    }

    /// Write `identity` and make it durable, then the marker file.
    pub async fn save(&self, identity: &StoredIdentity) -> std::io::Result<()> {
        self.meta
            .insert(KEY_IDENTITY, identity.encode().into_bytes())
            .map_err(std::io::Error::other)?;
        flush(&self.db, &self.durable).await?;
        if let Some(id) = &identity.cluster_id {
            write_marker(&self.marker, id)?;
        }
        Ok(())
    }
}

/// Write the marker atomically and durably (temp file, fsync, rename,
/// fsync of the directory).
fn write_marker(marker: &Path, id: &str) -> std::io::Result<()> {
    use std::io::Write;
    if std::fs::read_to_string(marker).is_ok_and(|t| t.trim() == id) {
        return Ok(());
    }
    let tmp = marker.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{id}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, marker)?;
    if let Some(dir) = marker.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Check the stored identity against the marker beside the store: a store
/// without the id the marker names was wiped, replaced or corrupted.
fn check_marker(identities: &IdentityStore) -> Result<(), StoreError> {
    let marker = &identities.marker;
    let store = marker.with_file_name("raft.sled");
    let marked = match std::fs::read_to_string(marker) {
        Ok(t) => Some(t.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(StoreError::Marker {
                path: marker.clone(),
                source,
            })
        }
    };
    let stored = identities.load()?.cluster_id;
    match (marked, stored) {
        (None, None) => Ok(()),
        (None, Some(id)) => write_marker(marker, &id).map_err(|source| StoreError::Marker {
            path: marker.clone(),
            source,
        }),
        (Some(m), None) => Err(StoreError::Lost {
            path: store,
            reason: format!(
                "it holds no cluster identity, but {} says this node belonged to cluster {m}: its Raft state is lost. Move the data directory away and start the node with `zonegate serve --rejoin`",
                marker.display()
            ),
        }),
        (Some(m), Some(id)) if m != id => Err(StoreError::Lost {
            path: store,
            reason: format!(
                "it belongs to cluster {id} but {} names cluster {m}",
                marker.display()
            ),
        }),
        _ => Ok(()),
    }
}

/// Tells whether any handle of an opened store is still alive. sled locks
/// its directory until the last handle drops, so a node restarted in the
/// same process waits for this before reopening.
#[derive(Clone, Debug)]
pub struct StoreLiveness(Weak<()>, fault::Failures);

impl StoreLiveness {
    /// The first write of this store that failed (after which openraft
    /// stops for good), if any.
    pub fn failure(&self) -> Option<StoreFailure> {
        self.1.first()
    }

    /// Whether some part of the store (log, reader, state machine,
    /// snapshot builder) still holds the database open.
    pub fn is_open(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Open (or create) the store under `dir`. Returns the log store and the
/// state machine, which openraft then owns, and a liveness probe.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore, StoreLiveness), StoreError> {
    let (log, sm, liveness, _) = open_with_identity(dir)?;
    Ok((log, sm, liveness))
}

/// [`open`], plus the store's cluster identity, checked against the
/// marker file beside it.
pub fn open_with_identity(
    dir: &Path,
) -> Result<(LogStore, StateMachineStore, StoreLiveness, IdentityStore), StoreError> {
    let path = dir.join("raft.sled");
    check_room(dir)?;
    let open_err = |source: sled::Error| match source {
        sled::Error::Io(e) if fault::is_no_space(&e) => StoreError::NoSpace {
            path: dir.to_path_buf(),
            detail: e.to_string(),
        },
        source => StoreError::Open {
            path: path.clone(),
            source,
        },
    };
    let db = sled::Config::new()
        .path(&path)
        .cache_capacity(CACHE_BYTES)
        .open()
        .map_err(open_err)?;
    let log = db.open_tree(TREE_LOG).map_err(open_err)?;
    let meta = db.open_tree(TREE_META).map_err(open_err)?;
    let sm = db.open_tree(TREE_SM).map_err(open_err)?;
    let durable = Durable::open(&path).map_err(|source| StoreError::Sync {
        path: path.clone(),
        source,
    })?;
    probe(dir, &db, &meta, &durable)?;

    let identities = IdentityStore {
        db: db.clone(),
        durable: durable.clone(),
        meta: meta.clone(),
        marker: dir.join(MARKER_FILE),
        _open: Arc::new(()),
    };
    check_marker(&identities)?;

    let data: Applied = match sm.get(KEY_APPLIED).map_err(open_err)? {
        Some(bytes) => codec::decode(&bytes).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            what: "applied state",
            source,
        })?,
        None => Applied::default(),
    };
    let (view_tx, _) = watch::channel(Arc::new(data.state.view()));
    let (state_tx, _) = watch::channel(Arc::new(data.state.clone()));
    let open_token = identities._open.clone();
    let liveness = StoreLiveness(Arc::downgrade(&open_token), durable.failures().clone());
    let log_store = LogStore {
        db: db.clone(),
        durable: durable.clone(),
        log,
        meta,
        _open: open_token.clone(),
    };
    let sm_store = StateMachineStore {
        db,
        durable,
        tree: sm,
        data,
        view_tx,
        state_tx,
        _open: open_token,
    };
    Ok((log_store, sm_store, liveness, identities))
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read(AnyError::new(&e)).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write(AnyError::new(&e)).into()
}

fn get<T: Bounded>(tree: &sled::Tree, key: &[u8]) -> Result<Option<T>, StorageError> {
    match tree.get(key).map_err(read_err)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes).map_err(read_err)?)),
        None => Ok(None),
    }
}

fn put<T: Serialize>(tree: &sled::Tree, key: &[u8], value: &T) -> Result<(), StorageError> {
    let bytes = codec::encode(value).map_err(write_err)?;
    tree.insert(key, bytes).map_err(write_err)?;
    Ok(())
}

/// Log keys are big-endian indexes so sled's byte order is log order.
fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The Raft log, vote and log pointers. Cloning is cheap (sled trees are
/// shared handles); a clone is the log reader the replication tasks use.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    durable: Durable,
    log: sled::Tree,
    meta: sled::Tree,
    _open: Arc<()>,
}

/// Flush sled and make what it flushed durable. The first failure is
/// recorded (`StoreLiveness::failure`): openraft stops on it for good.
async fn flush(db: &sled::Db, durable: &Durable) -> std::io::Result<()> {
    let result = async {
        durable.fault().before_flush()?;
        // The simulation's slow disk: the flush waits first.
        #[cfg(feature = "sim")]
        durable.sim_delay().await;
        flush_sled(db).await.map_err(sled_io)?;
        durable.sync().await
    }
    .await;
    if let Err(e) = &result {
        durable.failures().record(e);
    }
    result
}

/// sled's flush. Its async form waits for sled's own thread pool; the
/// simulation (feature `sim`), whose clock jumps whenever every task waits,
/// flushes on the calling thread instead, so a flush takes no simulated
/// time and no thread's timing orders events.
async fn flush_sled(db: &sled::Db) -> sled::Result<usize> {
    #[cfg(feature = "sim")]
    if crate::sim::net().is_some() {
        return db.flush();
    }
    db.flush_async().await
}

/// sled's error as the I/O error it wraps, when it wraps one (so ENOSPC
/// stays recognisable).
fn sled_io(e: sled::Error) -> std::io::Error {
    match e {
        sled::Error::Io(io) => io,
        other => std::io::Error::other(other),
    }
}

/// Before opening: refuse a data directory without room to write, so a
/// full disk stops the node before it joins (with the reason) rather than
/// at its first append (when openraft stops for good).
fn check_room(dir: &Path) -> Result<(), StoreError> {
    match free_bytes(dir) {
        Ok(free) if free < MIN_FREE_BYTES => Err(StoreError::NoSpace {
            path: dir.to_path_buf(),
            detail: format!("{free} bytes free, under the {MIN_FREE_BYTES} a node needs"),
        }),
        Ok(_) => Ok(()),
        // Not knowing is no reason to refuse: the probe write tells.
        Err(e) => {
            tracing::debug!(error = %e, "free space under the data directory unknown");
            Ok(())
        }
    }
}

/// After opening: a small durable write, so a disk that cannot take one
/// (or the test-only fault) stops the node at start, with the reason.
fn probe(
    dir: &Path,
    db: &sled::Db,
    meta: &sled::Tree,
    durable: &Durable,
) -> Result<(), StoreError> {
    let no_space = |detail: String| StoreError::NoSpace {
        path: dir.to_path_buf(),
        detail,
    };
    let written = (|| -> std::io::Result<()> {
        durable.fault().before_flush()?;
        let stamp = crate::clock::unix_ms().to_be_bytes();
        meta.insert(KEY_PROBE, &stamp).map_err(sled_io)?;
        db.flush().map_err(sled_io)?;
        durable.sync_now()
    })();
    match written {
        Ok(()) => Ok(()),
        Err(e) if fault::is_no_space(&e) => Err(no_space(e.to_string())),
        Err(source) => Err(StoreError::Sync {
            path: dir.join("raft.sled"),
            source,
        }),
    }
}

impl LogStore {
    async fn flush(&self) -> std::io::Result<()> {
        flush(&self.db, &self.durable).await
    }

    /// Write `entries` and make them durable: what [`RaftLogStorage::append`]
    /// does before it acknowledges. Public for the crash test and the
    /// append benchmark, which cannot build openraft's callback.
    #[doc(hidden)]
    pub async fn append_durably(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<(), StorageError> {
        self.write_entries(entries)?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_logs(AnyError::new(&e)).into())
    }

    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = codec::encode(&entry).map_err(write_err)?;
            batch.insert(&log_key(entry.log_id.index), bytes);
        }
        self.log.apply_batch(batch).map_err(write_err)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self.log.last().map_err(read_err)? {
            Some((_, bytes)) => {
                let entry: Entry = codec::decode(&bytes).map_err(read_err)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }

    /// Remove every entry whose index is in `range`.
    fn remove_range(&self, range: impl RangeBounds<[u8; 8]>) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(range) {
            let (key, _) = item.map_err(write_err)?;
            batch.remove(key);
        }
        self.log.apply_batch(batch).map_err(write_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&n) => Bound::Included(log_key(n)),
            Bound::Excluded(&n) => Bound::Excluded(log_key(n)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => Bound::Included(log_key(n)),
            Bound::Excluded(&n) => Bound::Excluded(log_key(n)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for item in self.log.range((start, end)) {
            let (_, bytes) = item.map_err(read_err)?;
            out.push(codec::decode(&bytes).map_err(read_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = get(&self.meta, KEY_PURGED)?;
        let last_log_id = self.last_log_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        put(&self.meta, KEY_VOTE, vote)?;
        self.flush()
            .await
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        get(&self.meta, KEY_VOTE)
    }

    /// Saved without its own flush: the committed pointer only lets a
    /// restarted node re-apply sooner, and the next flush (any append or
    /// vote) persists it.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        put(&self.meta, KEY_COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(get::<Option<LogId>>(&self.meta, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.write_entries(entries)?;
        // The callback is the acknowledgement: it fires only once the
        // entries are durable, whatever the outcome.
        match self.flush().await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(AnyError::new(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.remove_range(log_key(log_id.index)..)?;
        self.flush().await.map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // The pointer goes first so that a crash between the two writes
        // leaves stale entries behind the pointer, never a hole before it.
        put(&self.meta, KEY_PURGED, &log_id)?;
        self.remove_range(..=log_key(log_id.index))?;
        self.flush().await.map_err(write_err)
    }
}

/// Everything the state machine persists: the applied pointer, the last
/// applied membership and the replicated cluster state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub(crate) last_applied: Option<LogId>,
    pub(crate) last_membership: StoredMembership,
    pub(crate) state: ClusterState,
}

/// A snapshot as persisted: its metadata and the encoded [`ClusterState`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

/// [`Applied`] as format versions 0 and 1 laid it out (its state before
/// quota weights).
#[derive(Deserialize)]
pub(crate) struct AppliedV1 {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    state: crate::state::ClusterStateV1,
}

impl From<AppliedV1> for Applied {
    fn from(v: AppliedV1) -> Self {
        Self {
            last_applied: v.last_applied,
            last_membership: v.last_membership,
            state: v.state.into(),
        }
    }
}

codec::bounded! {
    StoredSnapshot => codec::limits::STATE,
}

codec::bounded_since! {
    Applied => codec::limits::STATE, before 2 as AppliedV1,
}

/// The applied state machine. After each applied batch it publishes a new
/// [`ClusterView`] (for the data plane) and [`ClusterState`] (for queries).
pub struct StateMachineStore {
    db: sled::Db,
    durable: Durable,
    tree: sled::Tree,
    data: Applied,
    view_tx: watch::Sender<Arc<ClusterView>>,
    state_tx: watch::Sender<Arc<ClusterState>>,
    _open: Arc<()>,
}

impl StateMachineStore {
    /// The view channel; receivers see every view published from now on.
    pub fn subscribe_view(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view_tx.subscribe()
    }

    /// The full-state channel (history included) for status queries.
    pub fn subscribe_state(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.state_tx.subscribe()
    }

    async fn persist(&self) -> Result<(), StorageError> {
        put(&self.tree, KEY_APPLIED, &self.data)
            .map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)))?;
        flush(&self.db, &self.durable)
            .await
            .map_err(|e| StorageIOError::write_state_machine(AnyError::new(&e)))?;
        Ok(())
    }

    /// State first, view second: whoever sees a view has the state (and
    /// history) at least as new, e.g. a test that waits on the view and
    /// then reads `decisions()`.
    fn publish(&self) {
        self.state_tx
            .send_replace(Arc::new(self.data.state.clone()));
        self.view_tx.send_replace(Arc::new(self.data.state.view()));
    }
}

/// Builds a snapshot from a copy of the state taken when openraft asked, so
/// applying may go on while the snapshot is written.
pub struct SnapshotBuilder {
    db: sled::Db,
    durable: Durable,
    tree: sled::Tree,
    data: Applied,
    _open: Arc<()>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = codec::encode(&self.data.state)
            .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
        let seq = self
            .db
            .generate_id()
            .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
        let snapshot_id = match &self.data.last_applied {
            Some(id) => format!("{}-{}-{seq}", id.leader_id.term, id.index),
            None => format!("none-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: self.data.last_applied,
            last_membership: self.data.last_membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        put(&self.tree, KEY_SNAPSHOT, &stored)?;
        flush(&self.db, &self.durable).await.map_err(|e| {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.data.last_applied, self.data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        for entry in entries {
            self.data.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::default()),
                EntryPayload::Normal(cmd) => {
                    let outcome = self.data.state.apply(&cmd);
                    // The simulation notes what moved the dwell clock, in
                    // log order (its stamp-order check).
                    #[cfg(feature = "sim")]
                    if matches!(outcome, Outcome::Applied { .. }) {
                        crate::sim::applied(entry.log_id.index, &cmd);
                    }
                    match &outcome {
                        Outcome::Applied { version } => tracing::info!(
                            version,
                            kind = cmd.kind(),
                            log_index = entry.log_id.index,
                            "decision applied"
                        ),
                        Outcome::Rejected { rule, message } => tracing::info!(
                            kind = cmd.kind(),
                            rule = rule.name(),
                            message,
                            log_index = entry.log_id.index,
                            "decision refused"
                        ),
                    }
                    responses.push(Response {
                        outcome: Some(outcome),
                    });
                }
                EntryPayload::Membership(membership) => {
                    // Zones are learned from the replicated membership, so
                    // every node knows the same zones at the same log index.
                    let zones: Vec<_> = membership
                        .nodes()
                        .filter(|(_, m)| m.role.serves())
                        .map(|(_, m)| m.zone.clone())
                        .collect();
                    self.data.state.register_zones(zones);
                    self.data.last_membership =
                        StoredMembership::new(Some(entry.log_id), membership);
                    responses.push(Response::default());
                }
            }
        }
        self.persist().await?;
        self.publish();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            durable: self.durable.clone(),
            tree: self.tree.clone(),
            data: self.data.clone(),
            _open: self._open.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let state: ClusterState = codec::decode(&bytes).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        self.data = Applied {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
            state,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: bytes,
        };
        put(&self.tree, KEY_SNAPSHOT, &stored)?;
        self.persist().await?;
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let stored: Option<StoredSnapshot> = get(&self.tree, KEY_SNAPSHOT)?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};

    struct SledBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
            let dir = tempfile::tempdir().map_err(write_err)?;
            let (log, sm, _) = open(dir.path()).map_err(write_err)?;
            Ok((dir, log, sm))
        }
    }

    #[test]
    fn sled_store_passes_the_openraft_storage_suite() {
        Suite::test_all(SledBuilder).unwrap();
    }

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    fn decide(decision: crate::command::Decision) -> crate::command::Command {
        crate::command::Command::decide(decision, "test", "store test")
    }

    #[tokio::test]
    async fn vote_and_applied_state_survive_reopen() {
        use crate::command::Decision;
        use crate::types::{Member, Role};
        use crate::view::{ZoneId, ZoneStatus};

        let dir = tempfile::tempdir().unwrap();
        let member = |id: u64, zone: &str| Member {
            id,
            zone: ZoneId::new(zone),
            raft_addr: format!("127.0.0.1:{}", 7000 + id),
            admin_addr: format!("127.0.0.1:{}", 9000 + id),
            role: Role::Voter,
        };
        {
            let (mut log, mut sm, _) = open(dir.path()).unwrap();
            let mut view_rx = sm.subscribe_view();
            log.save_vote(&openraft::Vote::new(3, 2)).await.unwrap();
            let membership = openraft::Membership::new(
                vec![[1, 2].into_iter().collect()],
                [(1, member(1, "az-a")), (2, member(2, "az-b"))]
                    .into_iter()
                    .collect::<std::collections::BTreeMap<_, _>>(),
            );
            let entries = vec![
                Entry {
                    log_id: log_id(1, 1),
                    payload: EntryPayload::Membership(membership),
                },
                Entry {
                    log_id: log_id(1, 2),
                    payload: EntryPayload::Normal(decide(Decision::Failover {
                        from: ZoneId::new("az-a"),
                        to: ZoneId::new("az-b"),
                    })),
                },
                Entry {
                    log_id: log_id(1, 3),
                    payload: EntryPayload::Normal(decide(Decision::Failback {
                        zone: ZoneId::new("az-b"),
                    })),
                },
            ];
            let responses = sm.apply(entries).await.unwrap();
            assert_eq!(responses[0].outcome, None);
            assert_eq!(responses[1].outcome, Some(Outcome::Applied { version: 1 }));
            assert!(matches!(
                responses[2].outcome,
                Some(Outcome::Rejected {
                    rule: crate::command::RejectRule::NotFailedOver,
                    ..
                })
            ));
            assert!(view_rx.has_changed().unwrap());
            let view = view_rx.borrow_and_update().clone();
            assert_eq!(view.decision_version, 1);
            assert_eq!(
                view.zones[&ZoneId::new("az-a")],
                ZoneStatus::FailedOver {
                    target: ZoneId::new("az-b")
                }
            );
        }
        let (mut log, mut sm, liveness) = open(dir.path()).unwrap();
        assert!(liveness.is_open());
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(openraft::Vote::new(3, 2))
        );
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(1, 3)));
        assert_eq!(membership.voter_ids().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(sm.subscribe_view().borrow().decision_version, 1);
        assert_eq!(sm.subscribe_state().borrow().decisions(10).len(), 1);
        drop((log, sm));
        assert!(!liveness.is_open());
        drop(open(dir.path()).unwrap());
    }
}
