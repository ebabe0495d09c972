//! What a queue's keys must be.

use std::hash::Hash;

/// A type usable as a queue key: cloned into the queue's index, compared and
/// hashed for de-duplication, and shared between tasks.
///
/// Implemented for every type with those properties, so it is never
/// implemented by hand: `String`, integers, tuples of them and kube-runtime's
/// `ObjectRef` are all keys.
///
/// ```
/// fn takes_keys<K: tokio_workqueue::Key>(_: K) {}
/// takes_keys("default/web".to_string());
/// takes_keys((3_u32, 'x'));
/// ```
pub trait Key: Clone + Eq + Hash + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Key for T {}
