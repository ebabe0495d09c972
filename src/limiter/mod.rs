//! Rate limiters: how long a key waits before it is retried.
//!
//! A [`RateLimiter`] answers one question, "when may this key run again?",
//! and remembers failures per key until told to [`forget`](RateLimiter::forget)
//! them. [`WorkQueue::add_rate_limited`](crate::WorkQueue::add_rate_limited)
//! asks the queue's limiter and adds the key after the answer.

use std::sync::Arc;
use std::time::Duration;

/// Decides how long a key waits before it is handed out again.
///
/// Implementations are shared by every clone of a queue, so they take `&self`
/// and keep their memory behind their own synchronisation.
pub trait RateLimiter<K>: Send + Sync + 'static {
    /// Records one more failure of `key` and returns how long it should wait.
    fn when(&self, key: &K) -> Duration;
    /// Forgets the failures of `key`, as after a successful reconcile.
    fn forget(&self, key: &K);
    /// How many times `when` was asked about `key` since it was last forgotten.
    fn num_requeues(&self, key: &K) -> u32;
}

impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for Arc<R> {
    fn when(&self, key: &K) -> Duration {
        (**self).when(key)
    }
    fn forget(&self, key: &K) {
        (**self).forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        (**self).num_requeues(key)
    }
}

impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for Box<R> {
    fn when(&self, key: &K) -> Duration {
        (**self).when(key)
    }
    fn forget(&self, key: &K) {
        (**self).forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        (**self).num_requeues(key)
    }
}
