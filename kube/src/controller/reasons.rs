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
//!
//! A reason is kept in two words: the three a controller gives nearly every
//! key (an object changed, the reconciler's requeue, the error policy's)
//! inline, any other behind a box. A `ReconcileReason` is four words wide
//! (its `Custom` variant holds a `String`), and a controller's queue holds
//! every listed key at once after its initial list, so this is 24 bytes an
//! entry instead of 40, 400 KiB against 670 KiB for 10,000 queued keys.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasher, Hash, RandomState};

use kube_runtime::controller::ReconcileReason;

/// The reasons of the keys queued and not yet handed out.
#[derive(Default)]
pub(crate) struct Reasons {
    /// By key hash.
    by_key: HashMap<u64, Kept>,
    hasher: RandomState,
}

/// A reason as kept, and whether a retry gave it.
enum Kept {
    ObjectUpdated,
    ReconcilerRetry,
    ErrorPolicyRetry,
    Other {
        reason: Box<ReconcileReason>,
        retry: bool,
    },
}

impl Kept {
    fn new(reason: ReconcileReason, retry: bool) -> Self {
        match (reason, retry) {
            (ReconcileReason::ObjectUpdated, false) => Kept::ObjectUpdated,
            (ReconcileReason::ReconcilerRequestedRetry, true) => Kept::ReconcilerRetry,
            (ReconcileReason::ErrorPolicyRequestedRetry, true) => Kept::ErrorPolicyRetry,
            (reason, retry) => Kept::Other {
                reason: Box::new(reason),
                retry,
            },
        }
    }

    fn is_retry(&self) -> bool {
        match self {
            Kept::ObjectUpdated => false,
            Kept::ReconcilerRetry | Kept::ErrorPolicyRetry => true,
            Kept::Other { retry, .. } => *retry,
        }
    }

    fn reason(self) -> ReconcileReason {
        match self {
            Kept::ObjectUpdated => ReconcileReason::ObjectUpdated,
            Kept::ReconcilerRetry => ReconcileReason::ReconcilerRequestedRetry,
            Kept::ErrorPolicyRetry => ReconcileReason::ErrorPolicyRequestedRetry,
            Kept::Other { reason, .. } => *reason,
        }
    }
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
                if queued.get().is_retry() {
                    queued.insert(Kept::new(reason, false));
                }
            }
            Entry::Vacant(none) => {
                none.insert(Kept::new(reason, false));
            }
        }
    }

    /// `key` was queued again after its reconcile, for `reason`; a reason
    /// already there wins.
    pub(crate) fn retried<T: Hash>(&mut self, key: &T, reason: ReconcileReason) {
        let hash = self.hash(key);
        self.by_key
            .entry(hash)
            .or_insert_with(|| Kept::new(reason, true));
    }

    /// `key` was queued for `reason`, unless it was queued already.
    pub(crate) fn queued<T: Hash>(&mut self, key: &T, reason: ReconcileReason) {
        let hash = self.hash(key);
        self.by_key
            .entry(hash)
            .or_insert_with(|| Kept::new(reason, false));
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
        taken.map(Kept::reason)
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
    fn every_reason_comes_back_as_it_was_given() {
        let given = [
            (ReconcileReason::ObjectUpdated, false),
            (ReconcileReason::ObjectUpdated, true),
            (ReconcileReason::ReconcilerRequestedRetry, true),
            (ReconcileReason::ReconcilerRequestedRetry, false),
            (ReconcileReason::ErrorPolicyRequestedRetry, true),
            (ReconcileReason::ErrorPolicyRequestedRetry, false),
            (ReconcileReason::Unknown, false),
            (ReconcileReason::BulkReconcile, false),
            (custom("gained"), true),
        ];
        for (reason, retry) in given {
            let text = reason.to_string();
            let kept = Kept::new(reason, retry);
            assert_eq!(kept.is_retry(), retry, "{text}");
            assert_eq!(kept.reason().to_string(), text);
        }
        assert_eq!(std::mem::size_of::<Kept>(), 16);
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
