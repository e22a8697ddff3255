//! Slots that outlive nothing: a list of weak references to per-item
//! state (a response body's progress, a stream's waker) that a watcher
//! walks now and then, while the items come and go on their own.

use std::sync::{Arc, Weak};

/// Weak references to live items' slots. Adding locks once per item; the
/// slots of items that ended leave the list when it is full, not at every
/// addition, so a thousand short items pay for the sweep once per
/// doubling, not once each, and the list stays within twice the live ones.
#[derive(Debug)]
pub struct Slots<T>(parking_lot::Mutex<Vec<Weak<T>>>);

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self(parking_lot::Mutex::new(Vec::new()))
    }
}

impl<T> Slots<T> {
    /// Adds `slot`, held by the returned `Arc`: listed while it lives.
    pub fn add(&self, slot: T) -> Arc<T> {
        let slot = Arc::new(slot);
        let mut slots = self.0.lock();
        if slots.len() == slots.capacity() {
            slots.retain(|s| s.strong_count() > 0);
        }
        slots.push(Arc::downgrade(&slot));
        slot
    }

    /// Calls `f` on every slot still alive (under the list's lock: keep it
    /// short).
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        for slot in self.0.lock().iter().filter_map(Weak::upgrade) {
            f(&slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_slots_are_swept_when_the_list_is_full_and_never_listed() {
        let slots = Slots::default();
        let kept: Vec<_> = (0..4).map(|i| slots.add(i)).collect();
        for i in 100..1_100 {
            drop(slots.add(i));
        }
        let mut seen = Vec::new();
        slots.for_each(|v| seen.push(*v));
        assert_eq!(seen, [0, 1, 2, 3], "only the live ones, in order");
        let len = slots.0.lock().len();
        assert!(len <= 2 * kept.len() + 1, "{len} entries for 4 live slots");
    }
}
