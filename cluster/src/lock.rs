//! The one way this crate takes a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock `m`, reading through poisoning. Every value this crate keeps under a
/// mutex is changed by plain assignments, inserts or removes, so a panic
/// while holding the lock cannot leave a half-made value worth refusing to
/// read; refusing would turn one panic into a stuck control plane.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
