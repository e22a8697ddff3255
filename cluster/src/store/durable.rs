//! Making a sled flush durable.
//!
//! sled 0.34's `flush_async` writes its log with `sync_file_range` on
//! Linux, which persists neither the file's metadata nor the device's write
//! cache, and writes values too large for a log segment as files under
//! `blobs/` with no sync at all. A flushed vote or entry then survives a
//! process crash but not a power loss or a kernel panic.
//!
//! So after each flush that guards a vote, an append, a truncate, a purge
//! or the applied state, [`Durable::sync`] runs `fdatasync` on sled's
//! `db` file (any descriptor of a file syncs the file), `fsync`s every
//! blob file it has not synced at its current length (sled writes a blob
//! once, front to back, so a length seen before means nothing new; one
//! still being written is synced again once it grew), and then the
//! `blobs/` directory when it saw a new one, so a new blob's name is
//! durable too. The data directory itself is `fsync`ed once at
//! open, after sled created its files. Writing our own fsync beside sled
//! rather than patching or forking sled keeps the design's store (sled)
//! and needs no unsafe code.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::fault::{Failures, Fault};
use crate::lock::lock;

/// Syncs one sled database's files. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Durable(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    db_file: File,
    blobs: PathBuf,
    /// Blob files synced, with the length they had when synced.
    synced_blobs: Mutex<HashSet<(OsString, u64)>>,
    /// The test-only fault (`store::fault`), if armed.
    fault: Fault,
    /// The first flush that failed.
    failures: Failures,
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Durable {
    /// For the sled database at `path` (already opened by sled).
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let db_file = File::open(path.join("db"))?;
        db_file.sync_all()?;
        sync_dir(path)?;
        if let Some(parent) = path.parent() {
            // The data directory now names `raft.sled`.
            sync_dir(parent)?;
        }
        let durable = Durable(Arc::new(Inner {
            db_file,
            blobs: path.join("blobs"),
            synced_blobs: Mutex::new(HashSet::new()),
            fault: Fault::from_env(),
            failures: Failures::default(),
        }));
        durable.sync_blocking()?;
        Ok(durable)
    }

    /// The test-only fault, consulted before every flush.
    pub(crate) fn fault(&self) -> &Fault {
        &self.0.fault
    }

    /// The first flush of this store that failed.
    pub(crate) fn failures(&self) -> &Failures {
        &self.0.failures
    }

    /// Under the simulation (feature `sim`), a slow disk: wait as long
    /// as the simulation says a flush of this store takes (the data
    /// directory is the parent of sled's directory).
    #[cfg(feature = "sim")]
    pub(crate) async fn sim_delay(&self) {
        let dir = self.0.blobs.parent().and_then(Path::parent);
        if let Some(delay) = dir.and_then(crate::sim::disk_delay) {
            tokio::time::sleep(delay).await;
        }
    }

    /// [`Durable::sync`] on this thread (the start-up probe).
    pub(crate) fn sync_now(&self) -> io::Result<()> {
        self.sync_blocking()
    }

    /// Make everything sled has flushed so far durable. Runs the syscalls
    /// on the blocking pool.
    pub(crate) async fn sync(&self) -> io::Result<()> {
        // The simulation runs every node on one thread: the sync runs
        // inline, so no thread's timing decides the order of events.
        #[cfg(feature = "sim")]
        if crate::sim::net().is_some() {
            self.0.fault.before_fsync();
            return self.sync_blocking();
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            this.0.fault.before_fsync();
            this.sync_blocking()
        })
        .await
        .map_err(io::Error::other)?
    }

    fn sync_blocking(&self) -> io::Result<()> {
        self.0.db_file.sync_data()?;
        let entries = match std::fs::read_dir(&self.0.blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut present = HashSet::new();
        let mut synced_now = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let len = match entry.metadata() {
                Ok(m) => m.len(),
                // sled removed it meanwhile (garbage collection).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let key = (name, len);
            if !lock(&self.0.synced_blobs).contains(&key) {
                match File::open(entry.path()) {
                    Ok(f) => f.sync_all()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                synced_now.push(key.clone());
            }
            present.insert(key);
        }
        if synced_now.is_empty() {
            return Ok(());
        }
        sync_dir(&self.0.blobs)?;
        let mut synced = lock(&self.0.synced_blobs);
        synced.extend(synced_now);
        // Forget blobs sled has deleted, so the set stays small.
        synced.retain(|key| present.contains(key));
        Ok(())
    }
}
