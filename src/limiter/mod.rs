//! Rate limiters: how long a key waits before it is retried.
//!
//! A [`RateLimiter`] answers one question, "when may this key run again?",
//! and remembers failures per key until told to [`forget`](RateLimiter::forget)
//! them. [`WorkQueue::add_rate_limited`](crate::WorkQueue::add_rate_limited)
//! asks the queue's limiter and adds the key after the answer.
//!
//! The provided limiters mirror client-go's:
//!
//! | limiter | memory | delay of a failure |
//! | --- | --- | --- |
//! | [`ExponentialBackoff`] | per key | `base * 2^n`, capped at `max` |
//! | [`FastSlow`] | per key | `fast` for the first `n` failures, then `slow` |
//! | [`TokenBucket`] | shared by all keys | until the next token of an overall rate and burst |
//! | [`MaxOf`] | its parts | the largest of several limiters |
//! | [`WithMaxWait`] | its part | another limiter's delay, capped |
//! | [`default_controller_rate_limiter`] | both | max of backoff 5 ms .. 1000 s and bucket 10/s, burst 100 |
//!
//! Constructors check their parameters and return [`InvalidLimiter`] for
//! nonsense (a zero base, a cap below the base, a NaN rate, ...). No limiter
//! panics or overflows, however many failures it sees: delays saturate.
//!
//! [`TokenBucket`] also works on its own as an asynchronous throttle with
//! [`acquire`](TokenBucket::acquire) and [`try_acquire`](TokenBucket::try_acquire).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tokio_workqueue::limiter::{
//!     ExponentialBackoff, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
//! };
//!
//! # fn main() -> Result<(), tokio_workqueue::limiter::InvalidLimiter> {
//! let ms = Duration::from_millis;
//! // Per key: 10 ms, 20 ms, 40 ms, ... never more than a minute; overall: at
//! // most 50 retries per second after a burst of 20; and never wait more
//! // than 30 s, whatever the bucket's debt.
//! let limiter = WithMaxWait::new(
//!     MaxOf::default()
//!         .with(ExponentialBackoff::new(ms(10), Duration::from_secs(60))?)
//!         .with(TokenBucket::new(50.0, 20)?),
//!     Duration::from_secs(30),
//! );
//! assert_eq!(limiter.when(&"pod-a"), ms(10));
//! assert_eq!(limiter.when(&"pod-a"), ms(20));
//! assert_eq!(limiter.num_requeues(&"pod-a"), 2);
//! limiter.forget(&"pod-a"); // it succeeded: start over next time
//! assert_eq!(limiter.when(&"pod-a"), ms(10));
//!
//! // Nonsense is refused with an explanation.
//! let err = TokenBucket::new(f64::NAN, 1).unwrap_err();
//! assert_eq!(err.parameter(), "rate_per_sec");
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

mod defaults;
mod error;
mod exponential;
mod failures;
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

    #[test]
    fn smart_pointers_forward_to_the_limiter() {
        let ms = Duration::from_millis;
        let shared = Arc::new(FastSlow::new(ms(1), ms(2), 1).unwrap());
        let boxed: Box<dyn RateLimiter<&str>> = Box::new(Arc::clone(&shared));
        assert_eq!(boxed.when(&"a"), ms(1));
        assert_eq!(boxed.when(&"a"), ms(2));
        assert_eq!(shared.num_requeues(&"a"), 2);
        boxed.forget(&"a");
        assert_eq!(boxed.num_requeues(&"a"), 0);
    }

    #[test]
    fn every_nonsense_input_is_refused() {
        let ms = Duration::from_millis;
        // (limiter, parameter) named by each refusal.
        let cases: Vec<(Result<(), InvalidLimiter>, &str, &str)> = vec![
            (
                ExponentialBackoff::<u8>::new(Duration::ZERO, ms(5)).map(drop),
                "ExponentialBackoff",
                "base",
            ),
            (
                ExponentialBackoff::<u8>::new(Duration::ZERO, Duration::ZERO).map(drop),
                "ExponentialBackoff",
                "base",
            ),
            (
                ExponentialBackoff::<u8>::new(ms(5), ms(4)).map(drop),
                "ExponentialBackoff",
                "max",
            ),
            (
                ExponentialBackoff::<u8>::new(Duration::MAX, ms(1)).map(drop),
                "ExponentialBackoff",
                "max",
            ),
            (
                FastSlow::<u8>::new(ms(5), ms(4), 3).map(drop),
                "FastSlow",
                "slow",
            ),
            (
                FastSlow::<u8>::new(Duration::MAX, Duration::ZERO, 0).map(drop),
                "FastSlow",
                "slow",
            ),
            (
                TokenBucket::new(f64::NAN, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(f64::INFINITY, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(f64::NEG_INFINITY, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(0.0, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(-0.0, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(-5.0, 1).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (
                TokenBucket::new(f64::NAN, 0).map(drop),
                "TokenBucket",
                "rate_per_sec",
            ),
            (TokenBucket::new(10.0, 0).map(drop), "TokenBucket", "burst"),
        ];
        for (i, (result, limiter, parameter)) in cases.into_iter().enumerate() {
            let err = result.expect_err(&format!("case {i} was accepted"));
            assert_eq!(
                (err.limiter(), err.parameter()),
                (limiter, parameter),
                "case {i}"
            );
            assert!(err.to_string().contains(parameter), "case {i}: {err}");
        }
    }

    #[test]
    fn limiters_are_send_sync_and_debug() {
        fn check<T: Send + Sync + std::fmt::Debug + 'static>() {}
        check::<ExponentialBackoff<String>>();
        check::<FastSlow<String>>();
        check::<TokenBucket>();
        check::<MaxOf<String>>();
        check::<WithMaxWait<String, TokenBucket>>();
        check::<InvalidLimiter>();
    }
}
