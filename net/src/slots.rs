//! Slots that outlive nothing: a list of weak references to per-item
//! state (a response body's progress, a stream's waker) that a watcher
//! walks now and then, while the items come and go on their own.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// Weak references to live items' slots. Adding locks once per item. The
/// slots of items that ended leave the list when it is full, and once as
/// many items ended as half the list held (at least [`SWEEP_AFTER`]):
/// a thousand short items pay for a sweep once, not once each, the list
/// stays within twice the live ones, and after a flood of connections its
/// room and the ended slots' memory go back to the allocator (an ended
/// slot's `Weak` keeps its allocation, a small block in the middle of the
/// flood's pages that would keep them from the system).
#[derive(Debug)]
pub struct Slots<T>(Arc<List<T>>);

#[derive(Debug)]
struct List<T> {
    slots: parking_lot::Mutex<Vec<Weak<T>>>,
    /// Items that ended since the last sweep.
    ended: AtomicUsize,
    /// The list's length when it last changed (read without the lock).
    listed: AtomicUsize,
}

/// Ended items a sweep waits for, however short the list.
pub const SWEEP_AFTER: usize = 256;

/// One item's slot: listed while it lives; its end counts toward a sweep.
#[derive(Debug)]
pub struct Slot<T> {
    item: Arc<T>,
    list: Arc<List<T>>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self(Arc::new(List {
            slots: parking_lot::Mutex::new(Vec::new()),
            ended: AtomicUsize::new(0),
            listed: AtomicUsize::new(0),
        }))
    }
}

impl<T> Slots<T> {
    /// Adds `slot`, listed while the returned [`Slot`] lives.
    pub fn add(&self, slot: T) -> Slot<T> {
        let item = Arc::new(slot);
        let mut slots = self.0.slots.lock();
        if slots.len() == slots.capacity() {
            slots.retain(|s| s.strong_count() > 0);
        }
        slots.push(Arc::downgrade(&item));
        self.0.listed.store(slots.len(), Ordering::Relaxed);
        Slot {
            item,
            list: Arc::clone(&self.0),
        }
    }

    /// Calls `f` on every slot still alive (under the list's lock: keep it
    /// short).
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        for slot in self.0.slots.lock().iter().filter_map(Weak::upgrade) {
            f(&slot);
        }
    }

    /// Entries in the list, live or not yet swept.
    pub fn listed(&self) -> usize {
        self.0.slots.lock().len()
    }
}

impl<T> List<T> {
    fn ended(&self) {
        let ended = self.ended.fetch_add(1, Ordering::Relaxed) + 1;
        let due = SWEEP_AFTER.max(self.listed.load(Ordering::Relaxed) / 2);
        if ended < due {
            return;
        }
        self.ended.store(0, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        slots.retain(|s| s.strong_count() > 0);
        let room = (2 * slots.len()).max(16);
        slots.shrink_to(room);
        self.listed.store(slots.len(), Ordering::Relaxed);
    }
}

impl<T> Deref for Slot<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        // This slot is still alive here: a later sweep takes it.
        self.list.ended();
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
        let len = slots.listed();
        assert!(len <= 2 * kept.len() + 1, "{len} entries for 4 live slots");
    }

    #[test]
    fn after_a_flood_ends_the_list_gives_back_its_room_and_its_ended_slots() {
        let slots = Slots::default();
        let kept: Vec<_> = (0..10).map(|i| slots.add(i)).collect();
        let flood: Vec<_> = (0..10_000).map(|i| slots.add(i)).collect();
        assert_eq!(slots.listed(), 10_010);
        drop(flood);
        // No item was added since: the endings alone swept the list.
        let len = slots.listed();
        assert!(
            len <= 2 * SWEEP_AFTER,
            "{len} entries left for 10 live slots"
        );
        let room = slots.0.slots.lock().capacity();
        assert!(room <= 4 * SWEEP_AFTER, "room for {room} kept");
        let mut seen = Vec::new();
        slots.for_each(|v| seen.push(*v));
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        drop(kept);
    }
}
