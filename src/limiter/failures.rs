//! Per-key failure counts: what the per-key limiters keep.

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;

/// How many times each key has failed since it was last forgotten, one map
/// entry per failing key. The count saturates at `u32::MAX`.
pub(super) struct Failures<K>(Mutex<HashMap<K, u32>>);

impl<K> Failures<K> {
    pub(super) fn new() -> Self {
        Failures(Mutex::new(HashMap::new()))
    }

    /// Keys with a count.
    pub(super) fn len(&self) -> usize {
        self.0.lock().len()
    }
}

impl<K: Eq + Hash + Clone> Failures<K> {
    /// Counts a failure of `key`; returns how many it had before this one.
    pub(super) fn record(&self, key: &K) -> u32 {
        let mut counts = self.0.lock();
        match counts.get_mut(key) {
            Some(count) => {
                let before = *count;
                *count = count.saturating_add(1);
                before
            }
            None => {
                counts.insert(key.clone(), 1);
                0
            }
        }
    }

    /// Drops `key`'s count, and the limiter's copy of the key after the
    /// lock (see [`Key`](crate::Key)).
    pub(super) fn forget(&self, key: &K) {
        let forgotten = self.0.lock().remove_entry(key);
        drop(forgotten);
    }

    /// How many times `key` has failed since it was last forgotten.
    pub(super) fn count(&self, key: &K) -> u32 {
        self.0.lock().get(key).copied().unwrap_or(0)
    }

    /// Sets `key`'s count (tests start near saturation this way).
    #[cfg(test)]
    pub(super) fn set(&self, key: K, count: u32) {
        self.0.lock().insert(key, count);
    }
}
