//! The largest delay of several limiters.

use std::fmt;
use std::time::Duration;

use super::RateLimiter;

/// The largest delay of several limiters (client-go's `MaxOfRateLimiter`).
///
/// [`when`](RateLimiter::when) asks *every* inner limiter, so each one records
/// the failure, and returns the largest answer;
/// [`forget`](RateLimiter::forget) forgets the key in all of them;
/// [`num_requeues`](RateLimiter::num_requeues) is the largest count.
///
/// With no inner limiter (`MaxOf::new(vec![])` or [`MaxOf::default`]) it
/// never delays: `when` returns [`Duration::ZERO`] and `num_requeues` 0.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::{ExponentialBackoff, FastSlow, MaxOf, RateLimiter};
///
/// let ms = Duration::from_millis;
/// let limiter = MaxOf::default()
///     .with(ExponentialBackoff::new(ms(1), ms(1000))?)
///     .with(FastSlow::new(ms(0), ms(500), 3)?);
/// let delays: Vec<_> = (0..5).map(|_| limiter.when(&"pod-a")).collect();
/// assert_eq!(delays, [ms(1), ms(2), ms(4), ms(500), ms(500)]);
/// # Ok::<(), tokio_workqueue::limiter::InvalidLimiter>(())
/// ```
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> MaxOf<K> {
    /// The maximum of `limiters` (none: never delays).
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        Self { limiters }
    }

    /// Adds one more limiter.
    #[must_use]
    pub fn with(mut self, limiter: impl RateLimiter<K>) -> Self {
        self.limiters.push(Box::new(limiter));
        self
    }

    /// How many limiters are combined.
    pub fn len(&self) -> usize {
        self.limiters.len()
    }

    /// Whether no limiter is combined (then nothing is ever delayed).
    pub fn is_empty(&self) -> bool {
        self.limiters.is_empty()
    }
}

impl<K> Default for MaxOf<K> {
    /// No limiter yet: add some with [`with`](MaxOf::with).
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl<K: 'static> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        // Not `map(..).max()` on an iterator that could stop early: every
        // limiter must see the failure.
        let mut longest = Duration::ZERO;
        for limiter in &self.limiters {
            longest = longest.max(limiter.when(key));
        }
        longest
    }

    fn forget(&self, key: &K) {
        for limiter in &self.limiters {
            limiter.forget(key);
        }
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(key))
            .max()
            .unwrap_or(0)
    }
}

impl<K> fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The inner limiters are trait objects without `Debug`.
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{ExponentialBackoff, FastSlow, TokenBucket};
    use std::sync::Arc;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn empty_never_delays() {
        let l = MaxOf::<&str>::new(Vec::new());
        assert!(l.is_empty());
        assert_eq!(l.when(&"a"), Duration::ZERO);
        assert_eq!(l.num_requeues(&"a"), 0);
        l.forget(&"a");
        assert_eq!(MaxOf::<&str>::default().when(&"a"), Duration::ZERO);
    }

    #[test]
    fn takes_the_largest_and_every_limiter_records() {
        let exp = Arc::new(ExponentialBackoff::new(ms(1), ms(1000)).unwrap());
        let fs = Arc::new(FastSlow::new(ms(3), ms(100), 2).unwrap());
        let l = MaxOf::new(vec![Box::new(Arc::clone(&exp)), Box::new(Arc::clone(&fs))]);
        assert_eq!(l.len(), 2);
        let delays: Vec<_> = (0..9).map(|_| l.when(&"a")).collect();
        assert_eq!(
            delays,
            [
                ms(3),
                ms(3),
                ms(100),
                ms(100),
                ms(100),
                ms(100),
                ms(100),
                ms(128),
                ms(256)
            ]
        );
        assert_eq!(exp.num_requeues(&"a"), 9);
        assert_eq!(fs.num_requeues(&"a"), 9);
        assert_eq!(l.num_requeues(&"a"), 9);
    }

    #[test]
    fn num_requeues_is_the_largest() {
        let exp = Arc::new(ExponentialBackoff::new(ms(1), ms(8)).unwrap());
        let fs = Arc::new(FastSlow::new(ms(1), ms(8), 2).unwrap());
        let l = MaxOf::default()
            .with(Arc::clone(&exp))
            .with(Arc::clone(&fs));
        l.when(&"a");
        exp.when(&"a");
        exp.when(&"a");
        assert_eq!(l.num_requeues(&"a"), 3);
        fs.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 3);
    }

    #[test]
    fn forget_reaches_every_limiter() {
        let exp = Arc::new(ExponentialBackoff::new(ms(1), ms(1000)).unwrap());
        let fs = Arc::new(FastSlow::new(ms(1), ms(100), 1).unwrap());
        let l = MaxOf::default()
            .with(Arc::clone(&exp))
            .with(Arc::clone(&fs));
        for _ in 0..4 {
            l.when(&"a");
        }
        l.forget(&"a");
        assert_eq!(exp.num_requeues(&"a"), 0);
        assert_eq!(fs.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), ms(1));
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_and_backoff_combined() {
        let l = MaxOf::default()
            .with(ExponentialBackoff::new(ms(5), ms(1000)).unwrap())
            .with(TokenBucket::new(10.0, 2).unwrap());
        // Distinct keys: the backoff says 5 ms each, the bucket 0, 0, 100.
        assert_eq!(l.when(&1), ms(5));
        assert_eq!(l.when(&2), ms(5));
        assert_eq!(l.when(&3), ms(100));
        // One key failing again: its backoff grows past the bucket's debt.
        assert_eq!(l.when(&1), ms(200));
        assert_eq!(l.when(&1), ms(300));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(l.when(&1), ms(40));
    }

    #[test]
    fn debug_prints_the_count() {
        let l = MaxOf::<u8>::default().with(FastSlow::new(ms(1), ms(2), 1).unwrap());
        assert_eq!(format!("{l:?}"), "MaxOf { limiters: 1 }");
    }
}
