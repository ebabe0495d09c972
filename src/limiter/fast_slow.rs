//! Per-key fast-then-slow retries.

use crate::Key;
use std::fmt;
use std::time::Duration;

use super::failures::Failures;
use super::{InvalidLimiter, RateLimiter};

/// Per-key fast-then-slow retries: the first `max_fast_attempts` failures of a
/// key wait `fast`, every later one waits `slow` (client-go's
/// `ItemFastSlowRateLimiter`).
///
/// Useful when a failure is usually transient (retry quickly a few times) but
/// sometimes lasting (then stop hammering).
///
/// Each key that failed since it was last forgotten costs one map entry;
/// [`forget`](RateLimiter::forget) removes it. The failure count saturates at
/// `u32::MAX`.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::{FastSlow, RateLimiter};
///
/// let ms = Duration::from_millis;
/// let limiter = FastSlow::new(ms(5), ms(10_000), 2)?;
/// let delays: Vec<_> = (0..4).map(|_| limiter.when(&"pod-a")).collect();
/// assert_eq!(delays, [ms(5), ms(5), ms(10_000), ms(10_000)]);
/// # Ok::<(), tokio_workqueue::limiter::InvalidLimiter>(())
/// ```
pub struct FastSlow<K> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    failures: Failures<K>,
}

impl<K> FastSlow<K> {
    /// Waits `fast` for the first `max_fast_attempts` failures of a key, then
    /// `slow`.
    ///
    /// `max_fast_attempts == 0` is allowed and means every failure waits
    /// `slow`. A zero `fast` is allowed (retry at once); `fast == slow` is
    /// allowed and gives a constant delay.
    ///
    /// # Errors
    ///
    /// [`InvalidLimiter`] if `slow` is shorter than `fast`: the "slow" phase
    /// would retry faster than the "fast" one, which is almost certainly a
    /// swapped argument.
    pub fn new(
        fast: Duration,
        slow: Duration,
        max_fast_attempts: u32,
    ) -> Result<Self, InvalidLimiter> {
        if slow < fast {
            return Err(InvalidLimiter::new(
                "FastSlow",
                "slow",
                format!("must be at least `fast` ({fast:?}), got {slow:?}"),
            ));
        }
        Ok(Self {
            fast,
            slow,
            max_fast_attempts,
            failures: Failures::new(),
        })
    }

    /// The delay of the first `max_fast_attempts` failures.
    pub fn fast(&self) -> Duration {
        self.fast
    }

    /// The delay of every later failure.
    pub fn slow(&self) -> Duration {
        self.slow
    }

    /// How many failures of a key wait `fast`.
    pub fn max_fast_attempts(&self) -> u32 {
        self.max_fast_attempts
    }
}

impl<K> RateLimiter<K> for FastSlow<K>
where
    K: Key,
{
    fn when(&self, key: &K) -> Duration {
        // This failure's number, counting from 1.
        let attempt = self.failures.record(key).saturating_add(1);
        if attempt <= self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, key: &K) {
        self.failures.forget(key)
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.count(key)
    }
}

impl<K> fmt::Debug for FastSlow<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlow")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("failing_keys", &self.failures.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fast_then_slow_per_key() {
        let l = FastSlow::new(ms(5), ms(3000), 3).unwrap();
        let a: Vec<_> = (0..5).map(|_| l.when(&"a")).collect();
        assert_eq!(a, [ms(5), ms(5), ms(5), ms(3000), ms(3000)]);
        assert_eq!(l.when(&"b"), ms(5), "another key starts fast");
        assert_eq!(l.num_requeues(&"a"), 5);
        assert_eq!(l.num_requeues(&"b"), 1);
        assert_eq!(l.num_requeues(&"c"), 0);
    }

    #[test]
    fn forget_resets_and_frees_the_entry() {
        let l = FastSlow::new(ms(1), ms(2), 1).unwrap();
        assert_eq!(l.when(&"a"), ms(1));
        assert_eq!(l.when(&"a"), ms(2));
        l.forget(&"a");
        assert_eq!(l.failures.len(), 0);
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), ms(1));
    }

    #[test]
    fn zero_fast_attempts_is_always_slow() {
        let l = FastSlow::new(ms(1), ms(2), 0).unwrap();
        assert_eq!(l.when(&"a"), ms(2));
        assert_eq!(l.when(&"a"), ms(2));
    }

    #[test]
    fn count_saturates_and_stays_slow() {
        let l = FastSlow::new(ms(1), ms(2), u32::MAX).unwrap();
        l.failures.set("a", u32::MAX - 1);
        assert_eq!(l.when(&"a"), ms(1), "the u32::MAX-th attempt is fast");
        assert_eq!(l.when(&"a"), ms(1), "saturated count never wraps to 0");
        assert_eq!(l.num_requeues(&"a"), u32::MAX);
    }

    #[test]
    fn edge_values_are_accepted() {
        assert!(FastSlow::<u8>::new(Duration::ZERO, Duration::ZERO, 5).is_ok());
        assert!(FastSlow::<u8>::new(ms(3), ms(3), 5).is_ok());
        assert!(FastSlow::<u8>::new(Duration::ZERO, Duration::MAX, u32::MAX).is_ok());
    }

    #[test]
    fn slow_shorter_than_fast_is_refused() {
        let err = FastSlow::<u8>::new(ms(10), ms(5), 3).unwrap_err();
        assert_eq!((err.limiter(), err.parameter()), ("FastSlow", "slow"));
        assert_eq!(
            err.to_string(),
            "invalid FastSlow parameter `slow`: must be at least `fast` (10ms), got 5ms"
        );
    }

    #[test]
    fn debug_prints_config() {
        let l = FastSlow::<u8>::new(ms(5), ms(10), 3).unwrap();
        assert_eq!(
            format!("{l:?}"),
            "FastSlow { fast: 5ms, slow: 10ms, max_fast_attempts: 3, failing_keys: 0 }"
        );
    }
}
