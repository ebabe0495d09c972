//! A cap on another limiter's delay.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use super::RateLimiter;

/// Caps another limiter's delay at `max_wait` (client-go's
/// `WithMaxWaitRateLimiter`).
///
/// [`when`](RateLimiter::when) still asks the inner limiter (so it records the
/// failure) and returns the smaller of its answer and `max_wait`;
/// [`forget`](RateLimiter::forget) and
/// [`num_requeues`](RateLimiter::num_requeues) go straight to the inner
/// limiter. Any `max_wait` is valid; [`Duration::ZERO`] turns every delay into
/// "now" while the inner limiter keeps counting.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::{ExponentialBackoff, RateLimiter, WithMaxWait};
///
/// let ms = Duration::from_millis;
/// let limiter = WithMaxWait::new(ExponentialBackoff::new(ms(100), ms(10_000))?, ms(300));
/// let delays: Vec<_> = (0..4).map(|_| limiter.when(&"pod-a")).collect();
/// assert_eq!(delays, [ms(100), ms(200), ms(300), ms(300)]);
/// # Ok::<(), tokio_workqueue::limiter::InvalidLimiter>(())
/// ```
pub struct WithMaxWait<K, R> {
    inner: R,
    max_wait: Duration,
    _key: PhantomData<fn(&K)>,
}

impl<K, R> WithMaxWait<K, R> {
    /// Caps the delays of `inner` at `max_wait`.
    pub fn new(inner: R, max_wait: Duration) -> Self {
        Self {
            inner,
            max_wait,
            _key: PhantomData,
        }
    }

    /// The cap.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The capped limiter.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Unwraps the capped limiter.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<K: 'static, R: RateLimiter<K>> RateLimiter<K> for WithMaxWait<K, R> {
    fn when(&self, key: &K) -> Duration {
        self.inner.when(key).min(self.max_wait)
    }

    fn forget(&self, key: &K) {
        self.inner.forget(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.inner.num_requeues(key)
    }
}

impl<K, R: fmt::Debug> fmt::Debug for WithMaxWait<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithMaxWait")
            .field("inner", &self.inner)
            .field("max_wait", &self.max_wait)
            .finish()
    }
}

impl<K, R: Clone> Clone for WithMaxWait<K, R> {
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), self.max_wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{ExponentialBackoff, FastSlow, MaxOf, TokenBucket};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn caps_the_delay_and_passes_the_rest_through() {
        let l = WithMaxWait::new(ExponentialBackoff::new(ms(10), ms(10_000)).unwrap(), ms(50));
        let delays: Vec<_> = (0..5).map(|_| l.when(&"a")).collect();
        assert_eq!(delays, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        assert_eq!(l.num_requeues(&"a"), 5);
        assert_eq!(l.inner().num_requeues(&"a"), 5);
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), ms(10));
    }

    #[test]
    fn zero_cap_means_now_but_still_counts() {
        let l = WithMaxWait::new(FastSlow::new(ms(1), ms(9), 1).unwrap(), Duration::ZERO);
        assert_eq!(l.when(&"a"), Duration::ZERO);
        assert_eq!(l.when(&"a"), Duration::ZERO);
        assert_eq!(l.num_requeues(&"a"), 2);
        assert_eq!(l.into_inner().when(&"a"), ms(9));
    }

    #[test]
    fn huge_cap_changes_nothing() {
        let l = WithMaxWait::new(
            ExponentialBackoff::new(Duration::MAX, Duration::MAX).unwrap(),
            Duration::MAX,
        );
        assert_eq!(l.when(&"a"), Duration::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn caps_a_token_bucket_debt_and_a_max_of() {
        let bucket = WithMaxWait::new(TokenBucket::new(10.0, 1).unwrap(), ms(250));
        let delays: Vec<_> = (0..5).map(|_| bucket.when(&0u8)).collect();
        assert_eq!(delays, [ms(0), ms(100), ms(200), ms(250), ms(250)]);

        let l = WithMaxWait::new(
            MaxOf::default()
                .with(ExponentialBackoff::new(ms(5), ms(1000)).unwrap())
                .with(FastSlow::new(ms(0), ms(400), 2).unwrap()),
            ms(300),
        );
        let delays: Vec<_> = (0..8).map(|_| l.when(&"a")).collect();
        assert_eq!(
            delays,
            [
                ms(5),
                ms(10),
                ms(300),
                ms(300),
                ms(300),
                ms(300),
                ms(300),
                ms(300)
            ]
        );
        assert_eq!(l.num_requeues(&"a"), 8);
    }

    #[test]
    fn debug_shows_inner_and_cap() {
        let l: WithMaxWait<u8, _> =
            WithMaxWait::new(FastSlow::<u8>::new(ms(1), ms(2), 3).unwrap(), ms(7));
        assert_eq!(l.max_wait(), ms(7));
        assert_eq!(
            format!("{l:?}"),
            "WithMaxWait { inner: FastSlow { fast: 1ms, slow: 2ms, max_fast_attempts: 3, \
             failing_keys: 0 }, max_wait: 7ms }"
        );
    }
}
