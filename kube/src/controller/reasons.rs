//! Why each queued key was queued, for the reconcile's span and its
//! `ReconcileReason`.
//!
//! A controller queues every object of its initial list, so this map holds
//! an entry per object until each is handed out. It is keyed by a hash of
//! the key rather than the key itself: an `ObjectRef` owns four strings
//! (name, namespace, resourceVersion, uid), about 230 bytes per object
//! beside the queue's own copy, while a hash is 8. Two keys whose hashes
//! collide (about one pair in 10^12 at 10,000 queued keys) would share a
//! reason: a label on a span, never a decision.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hash, RandomState};

use kube_runtime::controller::ReconcileReason;

/// The reasons of the keys queued and not yet handed out.
#[derive(Default)]
pub(crate) struct Reasons {
    /// By key hash: the reason, and whether it was a retry's.
    by_key: HashMap<u64, (ReconcileReason, bool)>,
    hasher: RandomState,
}

impl Reasons {
    fn hash<T: Hash>(&self, key: &T) -> u64 {
        self.hasher.hash_one(key)
    }

    /// `key` was queued by a trigger: the first reason wins, except that a
    /// retry's gives way to a fresh trigger's.
    pub(crate) fn triggered<T: Hash>(&mut self, key: &T, reason: ReconcileReason) {
        match self.by_key.entry(self.hash(key)) {
            Entry::Occupied(mut queued) => {
                if queued.get().1 {
                    queued.insert((reason, false));
                }
            }
            Entry::Vacant(none) => {
                none.insert((reason, false));
            }
        }
    }

    /// `key` was queued again after its reconcile, for `reason`; a reason
    /// already there wins.
    pub(crate) fn retried<T: Hash>(&mut self, key: &T, reason: ReconcileReason) {
        let hash = self.hash(key);
        self.by_key.entry(hash).or_insert((reason, true));
    }

    /// `key` was queued for `reason`, unless it was queued already.
    pub(crate) fn queued<T: Hash>(&mut self, key: &T, reason: ReconcileReason) {
        let hash = self.hash(key);
        self.by_key.entry(hash).or_insert((reason, false));
    }

    /// Forgets why `key` was queued, and returns it. The map gives back its
    /// room once it is mostly empty: after an initial list it held a reason
    /// per object, which a controller then keeps for nothing.
    pub(crate) fn take<T: Hash>(&mut self, key: &T) -> Option<ReconcileReason> {
        let taken = self.by_key.remove(&self.hash(key));
        let (len, room) = (self.by_key.len(), self.by_key.capacity());
        if room > 64 && len < room / 8 {
            self.by_key.shrink_to(len * 2);
        }
        taken.map(|(reason, _)| reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(reason: Option<ReconcileReason>) -> Option<String> {
        reason.map(|r| r.to_string())
    }

    fn custom(reason: &str) -> ReconcileReason {
        ReconcileReason::Custom {
            reason: reason.into(),
        }
    }

    #[test]
    fn the_first_trigger_wins_and_a_retry_gives_way_to_a_trigger() {
        let mut reasons = Reasons::default();
        reasons.triggered(&"a", ReconcileReason::ObjectUpdated);
        reasons.triggered(&"a", custom("later"));
        assert_eq!(
            text(reasons.take(&"a")),
            Some(ReconcileReason::ObjectUpdated.to_string())
        );
        assert!(reasons.take(&"a").is_none());

        reasons.retried(&"b", ReconcileReason::ReconcilerRequestedRetry);
        reasons.triggered(&"b", ReconcileReason::ObjectUpdated);
        assert_eq!(
            text(reasons.take(&"b")),
            Some(ReconcileReason::ObjectUpdated.to_string())
        );

        reasons.triggered(&"c", ReconcileReason::ObjectUpdated);
        reasons.retried(&"c", ReconcileReason::ReconcilerRequestedRetry);
        reasons.queued(&"c", custom("gained"));
        assert_eq!(
            text(reasons.take(&"c")),
            Some(ReconcileReason::ObjectUpdated.to_string())
        );
    }

    #[test]
    fn an_emptied_map_gives_its_room_back() {
        let mut reasons = Reasons::default();
        for i in 0..10_000 {
            reasons.triggered(&i, ReconcileReason::ObjectUpdated);
        }
        let full = reasons.by_key.capacity();
        for i in 0..10_000 {
            assert!(reasons.take(&i).is_some());
        }
        assert!(
            reasons.by_key.capacity() < full / 8,
            "{}",
            reasons.by_key.capacity()
        );
    }
}
