//! What a queue's keys must be.

use std::hash::Hash;

/// A type usable as a queue key: hashed and compared for de-duplication,
/// and shared between tasks.
///
/// Implemented for every type with those properties, so it is never
/// implemented by hand: `String`, integers, tuples of them and kube-runtime's
/// `ObjectRef` are all keys.
///
/// A queue keeps one copy of each key it holds, the one an add moved in.
/// Keys are cloned only where a second copy must outlive the queue's: the
/// rate limiters' per-key failure counts, [`run`](crate::WorkQueue::run)'s
/// retry after a panic, and the keys a drain reports dropped. A key is
/// hashed before its shard's lock is taken, and compared (`Eq`) under it, so
/// both should be quick and must not call into the queue. It is dropped
/// with no lock held (the copy an add brings of a key already held, the key
/// of an ended lease, a delayed key a shutdown drops), so a key's `Drop` may
/// take as long as it needs, and may use the queue.
///
/// ```
/// fn takes_keys<K: tokio_workqueue::Key>(_: K) {}
/// takes_keys("default/web".to_string());
/// takes_keys((3_u32, 'x'));
/// ```
pub trait Key: Clone + Eq + Hash + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Key for T {}
