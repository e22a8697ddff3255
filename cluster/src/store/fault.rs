//! Store failures: what a failed flush was (recorded for the node's fatal
//! report), and a test-only fault that makes flushes fail or hang.
//!
//! The fault is the black-box tests' stand-in for a full disk where no
//! small filesystem can be mounted, and for a wedged store: set
//! `ZONEGATE_DEBUG_STORE_FAULT` to `enospc:PATH` (every flush fails with
//! ENOSPC while the file PATH exists) or `hang:PATH` (the `fsync` of a
//! flush started while PATH exists never returns, as on a disk that
//! stopped answering: its blocking-pool thread is stuck for good, and a
//! tokio runtime waits for such threads when it is dropped at exit). It
//! is honoured only by debug builds
//! (the tests' binary); a release build ignores it with a warning, so it
//! can never hurt a production node.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// The environment variable of the test-only store fault.
pub const FAULT_ENV: &str = "ZONEGATE_DEBUG_STORE_FAULT";

/// What the first failed flush of a store was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreFailure {
    /// The filesystem under the data directory is full (ENOSPC, EDQUOT).
    pub no_space: bool,
    pub message: String,
}

/// Whether an I/O error means "no space left".
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    // ENOSPC 28, EDQUOT 122 on Linux.
    e.kind() == io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(28 | 122))
}

/// The first failure of one store's flushes; shared by its handles.
#[derive(Clone, Debug, Default)]
pub(crate) struct Failures(Arc<OnceLock<StoreFailure>>);

impl Failures {
    /// Keeps the first failure only: later ones follow from it.
    pub(crate) fn record(&self, e: &io::Error) {
        let _ = self.0.set(StoreFailure {
            no_space: is_no_space(e),
            message: e.to_string(),
        });
    }

    pub(crate) fn first(&self) -> Option<StoreFailure> {
        self.0.get().cloned()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    NoSpace,
    Hang,
}

/// The test-only fault, when set (see the module).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fault(Option<(Kind, PathBuf)>);

impl Fault {
    /// From [`FAULT_ENV`]; honoured by debug builds only.
    pub(crate) fn from_env() -> Self {
        let Some(spec) = std::env::var_os(FAULT_ENV) else {
            return Self::default();
        };
        let spec = spec.to_string_lossy().into_owned();
        if !cfg!(debug_assertions) {
            tracing::warn!("{FAULT_ENV} is set but ignored: it is honoured by debug builds only");
            return Self::default();
        }
        match Self::parse(&spec) {
            Some(fault) => {
                tracing::warn!(fault = %spec, "test-only store fault armed ({FAULT_ENV})");
                fault
            }
            None => {
                tracing::warn!("{FAULT_ENV}={spec} ignored: expected enospc:PATH or hang:PATH");
                Self::default()
            }
        }
    }

    fn parse(spec: &str) -> Option<Self> {
        let (kind, path) = spec.split_once(':')?;
        let kind = match kind {
            "enospc" => Kind::NoSpace,
            "hang" => Kind::Hang,
            _ => return None,
        };
        (!path.is_empty()).then(|| Self(Some((kind, PathBuf::from(path)))))
    }

    fn armed(&self) -> Option<&Kind> {
        self.0
            .as_ref()
            .filter(|(_, path)| path.exists())
            .map(|(kind, _)| kind)
    }

    /// Before a flush (and the start-up probe): ENOSPC while the fault
    /// is on.
    pub(crate) fn before_flush(&self) -> io::Result<()> {
        match self.armed() {
            Some(Kind::NoSpace) => Err(io::Error::from_raw_os_error(28)),
            _ => Ok(()),
        }
    }

    /// On the blocking thread about to `fsync`: never returns while the
    /// hang is on.
    pub(crate) fn before_fsync(&self) {
        while self.armed() == Some(&Kind::Hang) {
            std::thread::park_timeout(std::time::Duration::from_secs(3600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_faults_arm() {
        assert_eq!(
            Fault::parse("enospc:/tmp/x"),
            Some(Fault(Some((Kind::NoSpace, "/tmp/x".into()))))
        );
        assert_eq!(
            Fault::parse("hang:/tmp/x"),
            Some(Fault(Some((Kind::Hang, "/tmp/x".into()))))
        );
        for bad in ["", "enospc", "enospc:", "full:/tmp/x"] {
            assert_eq!(Fault::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_fault_bites_only_while_its_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("full");
        let fault = Fault::parse(&format!("enospc:{}", flag.display())).unwrap();
        assert!(fault.before_flush().is_ok());
        std::fs::write(&flag, "").unwrap();
        let e = fault.before_flush().unwrap_err();
        assert!(is_no_space(&e), "{e}");
        std::fs::remove_file(&flag).unwrap();
        assert!(fault.before_flush().is_ok());
    }

    #[test]
    fn the_first_failure_is_kept() {
        let f = Failures::default();
        f.record(&io::Error::from_raw_os_error(28));
        f.record(&io::Error::other("later"));
        let first = f.first().unwrap();
        assert!(first.no_space);
        assert!(first.message.contains("os error 28"), "{}", first.message);
    }
}
