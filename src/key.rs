//! What a queue's keys must be.

use std::hash::Hash;

/// A type usable as a queue key: hashed and compared for de-duplication,
/// and shared between tasks.
///
/// Implemented for every type with those properties, so it is never
/// implemented by hand: `String`, integers, tuples of them and kube-runtime's
/// `ObjectRef` are all keys.
///
/// A queue keeps one copy of each key it holds, the one an add moved in,
/// and drops its copies with no lock held: the copy an add brings of a key
/// already held, the key of an ended lease, a delayed key a shutdown drops,
/// and a rate limiter's copy once it forgets the key. So a key's `Drop` may
/// take as long as it needs, and may use the queue.
///
/// Keys are cloned where a second copy must live apart from the queue's: a
/// rate limiter's per-key failure count, the key
/// [`run`](crate::WorkQueue::run) keeps of each job to retry it after a
/// panic, [`WorkItem::into_key`](crate::WorkItem::into_key), the keys a
/// drain reports it dropped, and a partitioned queue's panic reports. A key
/// is hashed before its shard's lock is taken, but compared (`Eq`) under it
/// and under a rate limiter's lock, a drain's clones are made under the
/// shard's lock, and an ordering's own functions (a
/// [`FairShare`](crate::FairShare)'s tenant of a key) run under it. So
/// `Hash`, `Eq` and `Clone` should be quick and must not call into the
/// queue.
///
/// ```
/// fn takes_keys<K: tokio_workqueue::Key>(_: K) {}
/// takes_keys("default/web".to_string());
/// takes_keys((3_u32, 'x'));
/// ```
pub trait Key: Clone + Eq + Hash + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Key for T {}
