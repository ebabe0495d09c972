//! Per-key exponential backoff.

use crate::Key;
use std::fmt;
use std::time::Duration;

use super::failures::Failures;
use super::{InvalidLimiter, RateLimiter, duration_from_nanos};

/// Per-key exponential backoff: the delay doubles with every failure of a key,
/// up to a maximum (client-go's `ItemExponentialFailureRateLimiter`).
///
/// The `n`-th call of [`when`](RateLimiter::when) for a key (counting from 0
/// since the key was last forgotten) returns `base * 2^n`, capped at `max`.
/// The computation saturates: it never overflows or panics, however many
/// failures a key has (the failure count itself saturates at `u32::MAX`).
///
/// Each key that failed since it was last forgotten costs one map entry;
/// [`forget`](RateLimiter::forget) removes the entry, so memory does not grow
/// with keys that succeeded.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::{ExponentialBackoff, RateLimiter};
///
/// let backoff = ExponentialBackoff::new(Duration::from_millis(5), Duration::from_millis(30))?;
/// let delays: Vec<_> = (0..5).map(|_| backoff.when(&"pod-a")).collect();
/// let ms = Duration::from_millis;
/// assert_eq!(delays, [ms(5), ms(10), ms(20), ms(30), ms(30)]);
/// assert_eq!(backoff.num_requeues(&"pod-a"), 5);
/// backoff.forget(&"pod-a");
/// assert_eq!(backoff.when(&"pod-a"), ms(5));
/// # Ok::<(), tokio_workqueue::limiter::InvalidLimiter>(())
/// ```
pub struct ExponentialBackoff<K> {
    base: Duration,
    max: Duration,
    failures: Failures<K>,
}

impl<K> ExponentialBackoff<K> {
    /// A backoff starting at `base` and doubling up to `max`.
    ///
    /// # Errors
    ///
    /// [`InvalidLimiter`] if `base` is zero (the delay would never grow: use
    /// [`FastSlow`](super::FastSlow) or no limiter for a constant delay) or if
    /// `max` is smaller than `base` (the cap would undercut the first delay).
    /// `max == base` is allowed and gives a constant delay.
    pub fn new(base: Duration, max: Duration) -> Result<Self, InvalidLimiter> {
        const NAME: &str = "ExponentialBackoff";
        if base.is_zero() {
            return Err(InvalidLimiter::new(
                NAME,
                "base",
                format!("must be greater than zero, got {base:?}"),
            ));
        }
        if max < base {
            return Err(InvalidLimiter::new(
                NAME,
                "max",
                format!("must be at least `base` ({base:?}), got {max:?}"),
            ));
        }
        Ok(Self::new_unchecked(base, max))
    }

    /// Builds without checking; callers guarantee `0 < base <= max`.
    pub(crate) fn new_unchecked(base: Duration, max: Duration) -> Self {
        debug_assert!(!base.is_zero() && base <= max);
        Self {
            base,
            max,
            failures: Failures::new(),
        }
    }

    /// The first delay of a key.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay ever returned.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// `base * 2^exp`, capped at `max`, without overflow.
    fn delay(&self, exp: u32) -> Duration {
        // A Duration holds fewer than 2^94 nanoseconds, so both fit in a u128.
        let base = self.base.as_nanos();
        let max = self.max.as_nanos();
        // base << exp <= max  <=>  base <= max >> exp (for integers); a shift
        // of 128 or more would be an error, but then max >> exp is 0 < base.
        let fits = exp < u128::BITS && base <= max >> exp;
        if !fits {
            return self.max;
        }
        duration_from_nanos(base << exp)
    }
}

impl<K> RateLimiter<K> for ExponentialBackoff<K>
where
    K: Key,
{
    fn when(&self, key: &K) -> Duration {
        self.delay(self.failures.record(key))
    }

    fn forget(&self, key: &K) {
        self.failures.forget(key)
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.count(key)
    }
}

impl<K> fmt::Debug for ExponentialBackoff<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialBackoff")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("failing_keys", &self.failures.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn backoff(base: Duration, max: Duration) -> ExponentialBackoff<&'static str> {
        ExponentialBackoff::new(base, max).unwrap()
    }

    #[test]
    fn doubles_from_base_and_caps_at_max() {
        let b = backoff(ms(5), Duration::from_secs(1));
        let delays: Vec<_> = (0..10).map(|_| b.when(&"a")).collect();
        assert_eq!(
            delays,
            [
                ms(5),
                ms(10),
                ms(20),
                ms(40),
                ms(80),
                ms(160),
                ms(320),
                ms(640),
                ms(1000),
                ms(1000)
            ]
        );
    }

    #[test]
    fn keys_are_independent() {
        let b = backoff(ms(1), ms(100));
        assert_eq!(b.when(&"a"), ms(1));
        assert_eq!(b.when(&"a"), ms(2));
        assert_eq!(b.when(&"b"), ms(1));
        assert_eq!(b.when(&"a"), ms(4));
        assert_eq!(b.num_requeues(&"a"), 3);
        assert_eq!(b.num_requeues(&"b"), 1);
        assert_eq!(b.num_requeues(&"c"), 0);
    }

    #[test]
    fn forget_resets_and_frees_the_entry() {
        let b = backoff(ms(5), ms(1000));
        for _ in 0..4 {
            b.when(&"a");
        }
        b.when(&"b");
        assert_eq!(b.failures.len(), 2);
        b.forget(&"a");
        assert_eq!(b.num_requeues(&"a"), 0);
        assert_eq!(b.failures.len(), 1, "forget must remove the entry");
        assert_eq!(b.when(&"a"), ms(5));
        assert_eq!(b.num_requeues(&"a"), 1);
        // Forgetting an unknown key is harmless.
        b.forget(&"never-seen");
        assert_eq!(b.num_requeues(&"b"), 1);
    }

    #[test]
    fn ten_thousand_failures_stay_at_max() {
        let max = Duration::from_secs(1000);
        let b = backoff(ms(5), max);
        let mut last = Duration::ZERO;
        for _ in 0..10_000 {
            let d = b.when(&"a");
            assert!(d >= last && d <= max);
            last = d;
        }
        assert_eq!(last, max);
        assert_eq!(b.num_requeues(&"a"), 10_000);
    }

    #[test]
    fn huge_base_and_max_never_overflow() {
        let b = backoff(Duration::MAX, Duration::MAX);
        for _ in 0..200 {
            assert_eq!(b.when(&"a"), Duration::MAX);
        }
        let b = backoff(Duration::from_nanos(1), Duration::MAX);
        let mut last = Duration::ZERO;
        for n in 0..200u32 {
            let d = b.when(&"a");
            assert!(d >= last);
            if n < 64 {
                assert_eq!(d, Duration::from_nanos(1 << n));
            }
            last = d;
        }
        assert_eq!(last, Duration::MAX);
    }

    #[test]
    fn failure_count_saturates() {
        let b = backoff(ms(1), ms(8));
        b.failures.set("a", u32::MAX - 1);
        assert_eq!(b.when(&"a"), ms(8));
        assert_eq!(b.when(&"a"), ms(8));
        assert_eq!(b.num_requeues(&"a"), u32::MAX);
    }

    #[test]
    fn base_equal_to_max_is_constant() {
        let b = backoff(ms(7), ms(7));
        for _ in 0..5 {
            assert_eq!(b.when(&"a"), ms(7));
        }
    }

    #[test]
    fn nonsense_parameters_are_refused() {
        let err = ExponentialBackoff::<u8>::new(Duration::ZERO, ms(5)).unwrap_err();
        assert_eq!(
            (err.limiter(), err.parameter()),
            ("ExponentialBackoff", "base")
        );
        let err = ExponentialBackoff::<u8>::new(ms(10), ms(5)).unwrap_err();
        assert_eq!(err.parameter(), "max");
        assert_eq!(
            err.to_string(),
            "invalid ExponentialBackoff parameter `max`: must be at least `base` (10ms), got 5ms"
        );
    }

    #[test]
    fn debug_prints_config() {
        let b = backoff(ms(5), ms(1000));
        b.when(&"secret-key");
        let s = format!("{b:?}");
        assert_eq!(
            s,
            "ExponentialBackoff { base: 5ms, max: 1s, failing_keys: 1 }"
        );
    }

    proptest! {
        #[test]
        fn delays_are_monotone_capped_and_exact(
            base_ns in 1u64..=u64::MAX,
            extra_ns in prop_oneof![0u64..1_000, 0u64..=u64::MAX],
            calls in 1usize..150,
        ) {
            let base = Duration::from_nanos(base_ns);
            let max = base.saturating_add(Duration::from_nanos(extra_ns));
            let b = ExponentialBackoff::new(base, max).unwrap();
            let mut last = Duration::ZERO;
            for n in 0..calls {
                let d = b.when(&0u32);
                prop_assert!(d >= last, "not monotone: {:?} after {:?}", d, last);
                prop_assert!(d <= max);
                // Reference: base * 2^n in u128, capped.
                let want = if n < 64 {
                    (u128::from(base_ns) << n).min(max.as_nanos())
                } else {
                    max.as_nanos()
                };
                prop_assert_eq!(d.as_nanos(), want);
                last = d;
            }
            prop_assert_eq!(b.num_requeues(&0u32) as usize, calls);
        }
    }
}
