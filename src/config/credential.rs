//! A backend's credential (`[[backends]] api_key = { env = "…" }` or
//! `{ file = "…" }`): the reference is what the config (and the replicated
//! config, `/admin/v1/config`, `ctl config show`) holds; the value is read
//! by each node from its own environment or file, and never printed.
//!
//! A file is read again when it changes (its length, modification time or
//! inode: a Kubernetes secret swaps a symlink), checked at most every
//! [`RECHECK_MS`] by the requests that use it, and on SIGHUP ([`Credential::reload`]):
//! a rotated key is used by the next request, without a restart. A file
//! that cannot be read any more keeps the last good key (and says so once).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

/// Where a credential comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Env(String),
    File(PathBuf),
}

/// How often (ms) the requests that use a file's key look at the file.
pub const RECHECK_MS: u64 = 250;

/// A credential: its source and its current value. `Debug` shows the
/// source only.
pub struct Credential {
    source: Source,
    value: ArcSwap<String>,
    /// The file's identity when last read.
    stamp: Mutex<Option<Stamp>>,
    /// When (ms, `clock::now_ms`) the file was last looked at.
    checked_ms: AtomicU64,
    /// A failed re-read was logged (until one succeeds).
    warned: std::sync::atomic::AtomicBool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(Stamp {
        len: m.len(),
        modified: m.modified().ok(),
        inode: m.ino(),
    })
}

/// The largest key file read (a key is a few hundred bytes).
const MAX_FILE: u64 = 64 * 1024;

fn read_file(path: &Path) -> Result<(String, Stamp), String> {
    let before = stamp(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if before.len > MAX_FILE {
        return Err(format!(
            "`{}` is {} bytes: a key file holds at most {MAX_FILE}",
            path.display(),
            before.len
        ));
    }
    // Only a regular file (or a link to one, as Kubernetes mounts secrets):
    // a FIFO would block the reader until a writer came, a device could be
    // endless.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Err(format!("`{}` is not a regular file", path.display()));
    }
    // Read at most one byte past the limit: a file that grew since its
    // length was read is refused, not read whole.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_FILE + 1), &mut text)
        })
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!(
            "`{}` is over {MAX_FILE} bytes: a key file holds at most that",
            path.display()
        ));
    }
    Ok((text, before))
}

/// The key as it goes into a header: trimmed of the newline files end
/// with, non-empty, one line of visible text.
fn checked(text: &str, what: &str) -> Result<String, String> {
    let key = text.trim();
    if key.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if !key.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(format!(
            "{what} holds characters a header cannot carry (spaces, line breaks or non-ASCII)"
        ));
    }
    Ok(key.to_owned())
}

impl Credential {
    /// Reads the credential now; the error is the reason, for a
    /// `ConfigError` naming the key.
    pub fn load(source: Source) -> Result<Self, String> {
        let (value, stamp) = match &source {
            Source::Env(name) => {
                let v = std::env::var(name).map_err(|e| match e {
                    std::env::VarError::NotPresent => {
                        format!("the environment variable `{name}` is not set")
                    }
                    std::env::VarError::NotUnicode(_) => {
                        format!("the environment variable `{name}` is not UTF-8")
                    }
                })?;
                (
                    checked(&v, &format!("the environment variable `{name}`"))?,
                    None,
                )
            }
            Source::File(path) => {
                let (text, stamp) = read_file(path)?;
                (
                    checked(&text, &format!("`{}`", path.display()))?,
                    Some(stamp),
                )
            }
        };
        Ok(Self {
            source,
            value: ArcSwap::from_pointee(value),
            stamp: Mutex::new(stamp),
            checked_ms: AtomicU64::new(crate::clock::now_ms()),
            warned: false.into(),
        })
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The key for a request at `now_ms` (read only for a file): a file's
    /// is looked at again when [`RECHECK_MS`] passed since the last look.
    pub fn value(&self, now_ms: impl FnOnce() -> u64) -> Arc<String> {
        if let Source::File(_) = self.source {
            // The clock is read only for a file (a variable never changes).
            let now_ms = now_ms();
            let last = self.checked_ms.load(Ordering::Relaxed);
            if now_ms.saturating_sub(last) >= RECHECK_MS
                && self
                    .checked_ms
                    .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.reload(false);
            }
        }
        self.value.load_full()
    }

    /// Reads the file again if it changed (or always, when `forced`:
    /// SIGHUP); `true` when a new key is in place. An environment
    /// variable is read once, at load.
    pub fn reload(&self, forced: bool) -> bool {
        let Source::File(path) = &self.source else {
            return false;
        };
        let result = (|| {
            let now = stamp(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
            if !forced && *self.stamp.lock() == Some(now) {
                return Ok(false);
            }
            let (text, stamp) = read_file(path)?;
            let key = checked(&text, &format!("`{}`", path.display()))?;
            *self.stamp.lock() = Some(stamp);
            let changed = *self.value.load_full() != key;
            self.value.store(Arc::new(key));
            Ok::<bool, String>(changed)
        })();
        match result {
            Ok(changed) => {
                self.warned.store(false, Ordering::Relaxed);
                if changed {
                    tracing::info!(file = %path.display(), "backend key file changed: the new key is in use");
                }
                changed
            }
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!("backend key not reloaded, keeping the last one read: {e}");
                }
                false
            }
        }
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::Env(name) => write!(f, "{{ env = {name:?} }}"),
            Source::File(path) => write!(f, "{{ file = {:?} }}", path.display().to_string()),
        }
    }
}

/// Two credentials are the same when they come from the same place.
impl PartialEq for Credential {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_or_a_directory_is_refused_without_being_read() {
        for path in ["/dev/zero", "/tmp"] {
            let e = read_file(Path::new(path)).expect_err(path);
            assert!(e.contains("is not a regular file"), "{path}: {e}");
        }
    }

    #[test]
    fn a_missing_variable_or_unreadable_file_says_which_and_why() {
        let e = Credential::load(Source::Env("ZONEGATE_TEST_NO_SUCH_VARIABLE".into()))
            .expect_err("unset");
        assert!(
            e.contains("`ZONEGATE_TEST_NO_SUCH_VARIABLE` is not set"),
            "{e}"
        );
        let e = Credential::load(Source::File("/nonexistent/zonegate-key".into()))
            .expect_err("missing");
        assert!(e.contains("cannot read `/nonexistent/zonegate-key`"), "{e}");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("key");
        std::fs::write(&path, "\n").expect("write");
        let e = Credential::load(Source::File(path.clone())).expect_err("empty");
        assert!(e.ends_with("is empty"), "{e}");
        std::fs::write(&path, "two words").expect("write");
        let e = Credential::load(Source::File(path)).expect_err("space");
        assert!(e.contains("cannot carry"), "{e}");
    }

    #[test]
    fn a_rotated_key_file_is_read_by_the_next_use_and_a_broken_one_keeps_the_last_key() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("key");
        std::fs::write(&path, "sk-first\n").expect("write");
        let c = Credential::load(Source::File(path.clone())).expect("load");
        assert_eq!(*c.value(|| 0), "sk-first");
        std::fs::write(&path, "sk-second-and-longer\n").expect("write");
        // Within the recheck time the old key stays; after it, the new one.
        let t = c.checked_ms.load(Ordering::Relaxed);
        assert_eq!(*c.value(|| t + 1), "sk-first");
        assert_eq!(*c.value(|| t + RECHECK_MS), "sk-second-and-longer");
        std::fs::remove_file(&path).expect("rm");
        assert!(!c.reload(true));
        assert_eq!(*c.value(|| t + 10 * RECHECK_MS), "sk-second-and-longer");
        assert_eq!(
            format!("{c:?}"),
            format!("{{ file = {:?} }}", path.display().to_string())
        );
    }
}
