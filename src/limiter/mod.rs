//! Rate limiters: how long a key waits before it is retried.
//!
//! A [`RateLimiter`] answers one question, "when may this key run again?",
//! and remembers failures per key until told to [`forget`](RateLimiter::forget)
//! them. [`WorkQueue::add_rate_limited`](crate::WorkQueue::add_rate_limited)
//! asks the queue's limiter and adds the key after the answer.

use std::sync::Arc;
use std::time::Duration;

mod defaults;
mod error;
mod exponential;
mod fast_slow;
mod max_of;
mod max_wait;
mod token_bucket;

pub use defaults::default_controller_rate_limiter;
pub use error::InvalidLimiter;
pub use exponential::ExponentialBackoff;
pub use fast_slow::FastSlow;
pub use max_of::MaxOf;
pub use max_wait::WithMaxWait;
pub use token_bucket::TokenBucket;

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

/// Nanoseconds to a `Duration`, saturating at [`Duration::MAX`].
pub(crate) fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    match u64::try_from(nanos / NANOS_PER_SEC) {
        // The remainder is below 10^9, so it fits in a u32.
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_from_nanos_is_exact_then_saturates() {
        assert_eq!(duration_from_nanos(0), Duration::ZERO);
        assert_eq!(
            duration_from_nanos(1_500_000_001),
            Duration::new(1, 500_000_001)
        );
        let max = Duration::MAX.as_nanos();
        assert_eq!(duration_from_nanos(max), Duration::MAX);
        assert_eq!(duration_from_nanos(max + 1), Duration::MAX);
        assert_eq!(duration_from_nanos(u128::MAX), Duration::MAX);
    }
}
