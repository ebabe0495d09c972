//! The default limiter of a controller's queue.

use crate::Key;
use std::time::Duration;

use super::{ExponentialBackoff, MaxOf, TokenBucket};

/// client-go's `DefaultControllerRateLimiter`: the larger of a per-key
/// [`ExponentialBackoff`] from 5 ms to 1000 s and an overall [`TokenBucket`]
/// of 10 per second with a burst of 100.
///
/// A key that keeps failing backs off 5 ms, 10 ms, 20 ms, ... up to about 17
/// minutes; and however many keys fail at once, after the first 100 they are
/// retried at no more than 10 per second overall.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::{RateLimiter, default_controller_rate_limiter};
///
/// let limiter = default_controller_rate_limiter();
/// assert_eq!(limiter.when(&"pod-a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"pod-a"), Duration::from_millis(10));
/// limiter.forget(&"pod-a");
/// assert_eq!(limiter.num_requeues(&"pod-a"), 0);
/// ```
pub fn default_controller_rate_limiter<K>() -> MaxOf<K>
where
    K: Key,
{
    MaxOf::default()
        .with(ExponentialBackoff::new_unchecked(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        ))
        .with(TokenBucket::new_unchecked(10.0, 100))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::RateLimiter;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_constants_are_valid() {
        // `default_controller_rate_limiter` skips the checks; prove they pass.
        let exp = ExponentialBackoff::<u8>::new(ms(5), Duration::from_secs(1000)).unwrap();
        assert_eq!((exp.base(), exp.max()), (ms(5), Duration::from_secs(1000)));
        let bucket = TokenBucket::new(10.0, 100).unwrap();
        assert_eq!((bucket.rate_per_sec(), bucket.burst()), (10.0, 100));
        assert_eq!(default_controller_rate_limiter::<u8>().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_of_100_distinct_keys_then_10_per_second() {
        let l = default_controller_rate_limiter::<u32>();
        for key in 0..100 {
            assert_eq!(l.when(&key), ms(5), "key {key}: only the backoff's 5 ms");
        }
        for (i, key) in (100..110).enumerate() {
            assert_eq!(l.when(&key), ms(100 * (i as u64 + 1)), "key {key}");
        }
        // The bucket's debt is paid after 1 s and it refills in 10 s more.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(l.when(&1000), ms(5));
    }

    #[tokio::test(start_paused = true)]
    async fn one_key_backs_off_to_1000_s() {
        let l = default_controller_rate_limiter::<&str>();
        let mut delays = Vec::new();
        for _ in 0..20 {
            delays.push(l.when(&"a"));
        }
        assert_eq!(&delays[..4], [ms(5), ms(10), ms(20), ms(40)]);
        assert_eq!(delays[17], ms(5 << 17)); // 655.36 s
        assert_eq!(delays[18], Duration::from_secs(1000));
        assert_eq!(delays[19], Duration::from_secs(1000));
        assert_eq!(l.num_requeues(&"a"), 20);
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), ms(5));
    }
}
