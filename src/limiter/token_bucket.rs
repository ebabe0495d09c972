//! An overall rate limit shared by all keys.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{InvalidLimiter, RateLimiter, duration_from_nanos};

/// Fixed-point scale: time is counted in 2^-32 ns units.
const FRAC_BITS: u32 = 32;
const ONE_NS: u128 = 1 << FRAC_BITS;
/// Longest time between two tokens: 2^62 ns (about 146 years). Keeps
/// `burst * interval` far below `u128::MAX`, so the tolerance never saturates.
const MAX_INTERVAL: u128 = 1 << (62 + FRAC_BITS);

/// A token bucket: an overall rate and burst shared by every key, like the
/// `golang.org/x/time/rate` limiter behind client-go's `BucketRateLimiter`.
///
/// The bucket holds at most `burst` tokens, starts full and refills at
/// `rate_per_sec` tokens per second. It is used in two ways:
///
/// * As a [`RateLimiter`] (for every key type): [`when`](RateLimiter::when)
///   reserves one token now and returns how long until that token exists, like
///   Go's `Reserve().Delay()`. Reservations go into debt, so successive calls
///   return growing delays (with 10/s and burst 1: 0, 100 ms, 200 ms, ...).
///   [`forget`](RateLimiter::forget) does nothing and
///   [`num_requeues`](RateLimiter::num_requeues) is always 0.
/// * As a throttle: [`try_acquire`](Self::try_acquire) takes a token if one is
///   there and never blocks; [`acquire`](Self::acquire) waits for one and is
///   cancel safe.
///
/// Clones share one bucket.
///
/// # Time and arithmetic
///
/// Time comes from [`tokio::time::Instant::now`], so tests on paused time are
/// exact. Internally the bucket is a GCRA ("generic cell rate algorithm"):
/// instead of a token count it stores the *theoretical arrival time*, the
/// instant at which the bucket will be full again, as fixed-point nanoseconds
/// (32 fractional bits, in a `u128`) since the bucket was created. The time
/// between two tokens is `1 / rate_per_sec` seconds, rounded to the nearest
/// 2^-32 ns and clamped to between 2^-32 ns and 2^62 ns (about 146 years), so
/// rates above about 4.3 * 10^18 per second or below one token per 146 years
/// behave as those bounds. All arithmetic saturates and never panics; delays
/// are rounded *up* to whole nanoseconds, so after waiting the returned delay
/// the token is there, and a delay too large for a [`Duration`] is
/// [`Duration::MAX`].
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::TokenBucket;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tokio_workqueue::limiter::InvalidLimiter> {
/// let bucket = TokenBucket::new(10.0, 2)?; // 10 per second, burst 2
/// assert_eq!(bucket.try_acquire(), Ok(()));
/// assert_eq!(bucket.try_acquire(), Ok(()));
/// assert_eq!(bucket.try_acquire(), Err(Duration::from_millis(100)));
///
/// let start = tokio::time::Instant::now();
/// bucket.acquire().await; // waits for the next token
/// assert_eq!(start.elapsed(), Duration::from_millis(100));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TokenBucket {
    inner: Arc<Inner>,
}

struct Inner {
    rate_per_sec: f64,
    burst: u32,
    /// The zero of the fixed-point clock.
    origin: Instant,
    /// Time between two tokens, in 2^-32 ns.
    interval: u128,
    /// `(burst - 1) * interval`: how far ahead of now the arrival time may be
    /// for a token to still be available.
    tolerance: u128,
    /// Theoretical arrival time, in 2^-32 ns since `origin`. The bucket holds
    /// `burst - (tat - now) / interval` tokens (at most `burst` once `tat` is
    /// in the past); below zero is debt left by reservations.
    tat: Mutex<u128>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilling at `rate_per_sec` tokens per
    /// second.
    ///
    /// # Errors
    ///
    /// [`InvalidLimiter`] if `rate_per_sec` is NaN, infinite, zero or negative
    /// (a bucket that never refills, or never limits, is not a rate), or if
    /// `burst` is 0 (the bucket could never hold the one token a caller
    /// needs).
    pub fn new(rate_per_sec: f64, burst: u32) -> Result<Self, InvalidLimiter> {
        const NAME: &str = "TokenBucket";
        if !rate_per_sec.is_finite() || rate_per_sec <= 0.0 {
            return Err(InvalidLimiter::new(
                NAME,
                "rate_per_sec",
                format!("must be finite and greater than zero, got {rate_per_sec}"),
            ));
        }
        if burst == 0 {
            return Err(InvalidLimiter::new(
                NAME,
                "burst",
                "must be at least 1, got 0",
            ));
        }
        Ok(Self::new_unchecked(rate_per_sec, burst))
    }

    /// Builds without checking; callers guarantee a finite `rate_per_sec > 0`
    /// and `burst >= 1`.
    pub(crate) fn new_unchecked(rate_per_sec: f64, burst: u32) -> Self {
        debug_assert!(rate_per_sec.is_finite() && rate_per_sec > 0.0 && burst >= 1);
        // Finite and > 0, so the quotient is > 0 (maybe +inf for tiny rates,
        // which the saturating float-to-int cast turns into u128::MAX).
        let interval = ((1e9 * ONE_NS as f64) / rate_per_sec).round() as u128;
        let interval = interval.clamp(1, MAX_INTERVAL);
        Self {
            inner: Arc::new(Inner {
                rate_per_sec,
                burst,
                origin: Instant::now(),
                interval,
                // At most (2^32 - 1) * 2^94 < 2^126: no overflow.
                tolerance: u128::from(burst.saturating_sub(1)) * interval,
                tat: Mutex::new(0),
            }),
        }
    }

    /// The refill rate, in tokens per second, as given to [`new`](Self::new).
    pub fn rate_per_sec(&self) -> f64 {
        self.inner.rate_per_sec
    }

    /// The most tokens the bucket holds.
    pub fn burst(&self) -> u32 {
        self.inner.burst
    }

    /// Takes one token if one is available now; otherwise takes nothing and
    /// returns how long until one will be (always more than zero).
    ///
    /// Never blocks or sleeps, so it may be called under a lock.
    pub fn try_acquire(&self) -> Result<(), Duration> {
        let inner = &*self.inner;
        let mut tat = inner.tat.lock();
        // Read the clock under the lock: readings are ordered like updates.
        let now = inner.now();
        let start = (*tat).max(now);
        let ahead = start - now;
        if ahead <= inner.tolerance {
            *tat = start.saturating_add(inner.interval);
            Ok(())
        } else {
            Err(ceil_duration(ahead - inner.tolerance))
        }
    }

    /// Waits until a token is available and takes it.
    ///
    /// Cancel safe: the token is taken only when the future completes, so
    /// dropping it before then takes nothing. Waiters are not queued: when
    /// several wait, whichever polls first after a refill gets the token.
    /// The wait uses [`tokio::time::sleep`], whose timer has millisecond
    /// ticks, so it may end up to a millisecond after the token arrived.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire() {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Reserves one token, going into debt if needed, and returns how long
    /// until it is available.
    fn reserve(&self) -> Duration {
        let inner = &*self.inner;
        let mut tat = inner.tat.lock();
        // Read the clock under the lock: readings are ordered like updates.
        let now = inner.now();
        let start = (*tat).max(now);
        *tat = start.saturating_add(inner.interval);
        ceil_duration((start - now).saturating_sub(inner.tolerance))
    }
}

impl Inner {
    /// Now, in 2^-32 ns since `origin` (an earlier instant counts as origin).
    fn now(&self) -> u128 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos()
            .saturating_mul(ONE_NS)
    }
}

/// Fixed-point nanoseconds to a `Duration`, rounding up to a whole nanosecond.
fn ceil_duration(fixed: u128) -> Duration {
    duration_from_nanos(fixed.div_ceil(ONE_NS))
}

impl<K> RateLimiter<K> for TokenBucket {
    fn when(&self, _key: &K) -> Duration {
        self.reserve()
    }

    fn forget(&self, _key: &K) {}

    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("rate_per_sec", &self.inner.rate_per_sec)
            .field("burst", &self.inner.burst)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use tokio::time::advance;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn when(b: &TokenBucket) -> Duration {
        RateLimiter::<u32>::when(b, &0)
    }

    #[tokio::test(start_paused = true)]
    async fn starts_full_with_burst_tokens() {
        let b = TokenBucket::new(10.0, 3).unwrap();
        for _ in 0..3 {
            assert_eq!(b.try_acquire(), Ok(()));
        }
        assert_eq!(b.try_acquire(), Err(ms(100)));
        assert_eq!(b.try_acquire(), Err(ms(100)), "a refusal takes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn refills_at_the_rate_and_caps_at_burst() {
        let b = TokenBucket::new(10.0, 2).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        assert_eq!(b.try_acquire(), Ok(()));
        advance(ms(40)).await;
        assert_eq!(b.try_acquire(), Err(ms(60)));
        advance(ms(60)).await;
        assert_eq!(b.try_acquire(), Ok(()));
        assert_eq!(b.try_acquire(), Err(ms(100)));
        // A long idle time refills only up to the burst.
        advance(Duration::from_secs(3600)).await;
        assert_eq!(b.try_acquire(), Ok(()));
        assert_eq!(b.try_acquire(), Ok(()));
        assert_eq!(b.try_acquire(), Err(ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_intervals_round_the_wait_up() {
        // 3 per second: a token every 333_333_333.33 ns.
        let b = TokenBucket::new(3.0, 1).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        let wait = b.try_acquire().unwrap_err();
        assert_eq!(wait, Duration::from_nanos(333_333_334));
        advance(wait - Duration::from_nanos(1)).await;
        assert_eq!(b.try_acquire(), Err(Duration::from_nanos(1)));
        advance(Duration::from_nanos(1)).await;
        assert_eq!(b.try_acquire(), Ok(()));
        // A taker that waits each returned delay gets a token every
        // 333_333_334 ns: with burst 1 the bucket cannot bank the rounding
        // (as in Go), a relative error of 2e-9.
        let start = Instant::now();
        for _ in 0..3000 {
            while let Err(wait) = b.try_acquire() {
                advance(wait).await;
            }
        }
        assert_eq!(start.elapsed(), Duration::from_nanos(3000 * 333_333_334));
        // With a burst to bank it, no rounding is lost: 3000 tokens (after
        // the 2 of the full bucket) take 1000 s to within a nanosecond.
        let b = TokenBucket::new(3.0, 2).unwrap();
        let start = Instant::now();
        for _ in 0..3002 {
            while let Err(wait) = b.try_acquire() {
                advance(wait).await;
            }
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed.abs_diff(Duration::from_secs(1000)) <= Duration::from_nanos(1),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn when_reserves_into_debt() {
        let b = TokenBucket::new(10.0, 1).unwrap();
        let delays: Vec<_> = (0..4).map(|_| when(&b)).collect();
        assert_eq!(delays, [ms(0), ms(100), ms(200), ms(300)]);
        // The debt also holds back try_acquire: the next token is at 400 ms.
        assert_eq!(b.try_acquire(), Err(ms(400)));
        advance(ms(150)).await;
        assert_eq!(when(&b), ms(250));
        // Once the debt is paid and the bucket refilled, no delay again.
        advance(Duration::from_secs(10)).await;
        assert_eq!(when(&b), ms(0));
        assert_eq!(when(&b), ms(100));
    }

    #[tokio::test(start_paused = true)]
    async fn when_uses_the_burst_first() {
        let b = TokenBucket::new(10.0, 100).unwrap();
        for _ in 0..100 {
            assert_eq!(when(&b), Duration::ZERO);
        }
        assert_eq!(when(&b), ms(100));
        assert_eq!(when(&b), ms(200));
    }

    #[tokio::test(start_paused = true)]
    async fn forget_and_num_requeues_are_inert() {
        let b = TokenBucket::new(1.0, 1).unwrap();
        RateLimiter::<&str>::when(&b, &"a");
        assert_eq!(RateLimiter::<&str>::num_requeues(&b, &"a"), 0);
        RateLimiter::<&str>::forget(&b, &"a");
        assert_eq!(RateLimiter::<&str>::when(&b, &"a"), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_bucket() {
        let a = TokenBucket::new(10.0, 1).unwrap();
        let b = a.clone();
        assert_eq!(a.try_acquire(), Ok(()));
        assert_eq!(b.try_acquire(), Err(ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_exactly_until_the_next_token() {
        let b = TokenBucket::new(10.0, 1).unwrap();
        let start = Instant::now();
        b.acquire().await;
        assert_eq!(Instant::now(), start, "a full bucket does not wait");
        b.acquire().await;
        assert_eq!(Instant::now() - start, ms(100));
        advance(ms(30)).await;
        b.acquire().await;
        assert_eq!(Instant::now() - start, ms(200));
        assert_eq!(b.try_acquire(), Err(ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_with_a_sub_millisecond_wait() {
        // tokio's timer has millisecond ticks: the wait may end up to 1 ms
        // late, never early.
        let b = TokenBucket::new(3.0, 1).unwrap();
        b.acquire().await;
        let start = Instant::now();
        b.acquire().await;
        let waited = start.elapsed();
        assert!(waited >= Duration::from_nanos(333_333_334), "{waited:?}");
        assert!(waited <= ms(335), "{waited:?}");
        assert!(b.try_acquire().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_acquire_takes_no_token() {
        let b = TokenBucket::new(10.0, 1).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        {
            let mut fut = tokio_test::task::spawn(b.acquire());
            assert!(fut.poll().is_pending());
            advance(ms(50)).await;
            assert!(fut.poll().is_pending());
        }
        advance(ms(50)).await;
        assert_eq!(b.try_acquire(), Ok(()), "the dropped future took the token");

        // Same with a timeout cutting the wait short.
        let cut = tokio::time::timeout(ms(99), b.acquire()).await;
        assert!(cut.is_err());
        advance(ms(1)).await;
        assert_eq!(b.try_acquire(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_completed_acquire_took_its_token() {
        let b = TokenBucket::new(10.0, 1).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        let mut fut = tokio_test::task::spawn(b.acquire());
        assert!(fut.poll().is_pending());
        advance(ms(100)).await;
        assert!(fut.is_woken());
        assert!(fut.poll().is_ready());
        assert_eq!(b.try_acquire(), Err(ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_acquirers_get_the_overall_rate() {
        // 4 tasks x 25 tokens at 10 per second with a burst of 5: the first
        // 5 are free, the other 95 come every 100 ms.
        let b = TokenBucket::new(10.0, 5).unwrap();
        let start = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                let times = Arc::clone(&times);
                tokio::spawn(async move {
                    for _ in 0..25 {
                        b.acquire().await;
                        times.lock().push(Instant::now() - start);
                    }
                })
            })
            .collect();
        // Virtual time: a broken bucket fails here instead of hanging.
        tokio::time::timeout(Duration::from_secs(60), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("the acquirers should be done in 9.5 s");
        let mut times = std::mem::take(&mut *times.lock());
        times.sort();
        assert_eq!(times.len(), 100);
        let expected: Vec<_> = (0..100u64).map(|i| ms(i.saturating_sub(4) * 100)).collect();
        assert_eq!(times, expected);
        assert_eq!(start.elapsed(), ms(9500));
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_rates_never_panic() {
        // One token per ~31.7 years.
        let slow = TokenBucket::new(1e-9, 1).unwrap();
        assert_eq!(slow.try_acquire(), Ok(()));
        let wait = slow.try_acquire().unwrap_err();
        let expected = Duration::from_secs(1_000_000_000);
        assert!(
            wait.abs_diff(expected) < Duration::from_micros(1),
            "{wait:?}"
        );
        let mut last = Duration::ZERO;
        for _ in 0..1000 {
            let d = when(&slow);
            assert!(d > last);
            last = d;
        }

        // A million tokens per microsecond.
        let fast = TokenBucket::new(1e12, 1_000).unwrap();
        for _ in 0..1000 {
            assert_eq!(fast.try_acquire(), Ok(()));
        }
        assert_eq!(fast.try_acquire(), Err(Duration::from_nanos(1)));
        advance(Duration::from_nanos(1)).await;
        assert_eq!(fast.try_acquire(), Ok(()));

        // Rates beyond the clamps.
        for rate in [f64::MIN_POSITIVE, 5e-324, 1e-300, 1e300, f64::MAX] {
            let b = TokenBucket::new(rate, u32::MAX).unwrap();
            for _ in 0..10 {
                assert_eq!(b.try_acquire(), Ok(()), "rate {rate}");
                when(&b);
            }
        }
        let b = TokenBucket::new(5e-324, 1).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        // 2^62 ns, the clamp.
        assert_eq!(b.try_acquire(), Err(Duration::from_nanos(1 << 62)));
    }

    #[tokio::test(start_paused = true)]
    async fn huge_debt_saturates() {
        let b = TokenBucket::new(1e-300, u32::MAX).unwrap();
        *b.inner.tat.lock() = u128::MAX - 5;
        assert_eq!(when(&b), Duration::MAX);
        assert_eq!(when(&b), Duration::MAX);
        assert_eq!(*b.inner.tat.lock(), u128::MAX);
        assert_eq!(b.try_acquire(), Err(Duration::MAX));
        // acquire on a hopeless bucket just waits (and can be dropped).
        let mut fut = tokio_test::task::spawn(b.acquire());
        assert!(fut.poll().is_pending());
    }

    #[test]
    fn threads_racing_never_take_more_than_the_burst() {
        // Refill is negligible (one token per ~31.7 years), so exactly the
        // burst is handed out however the threads interleave.
        let b = TokenBucket::new(1e-9, 1000).unwrap();
        let taken: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let b = b.clone();
                    s.spawn(move || (0..1000).filter(|_| b.try_acquire().is_ok()).count())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(taken, 1000);
    }

    #[test]
    fn works_outside_a_runtime() {
        let b = TokenBucket::new(1.0, 1).unwrap();
        assert_eq!(b.try_acquire(), Ok(()));
        assert!(b.try_acquire().is_err());
    }

    #[test]
    fn nonsense_parameters_are_refused() {
        for rate in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, -1.0] {
            let err = TokenBucket::new(rate, 1).unwrap_err();
            assert_eq!(
                (err.limiter(), err.parameter()),
                ("TokenBucket", "rate_per_sec"),
                "rate {rate}"
            );
        }
        assert_eq!(
            TokenBucket::new(f64::NAN, 1).unwrap_err().to_string(),
            "invalid TokenBucket parameter `rate_per_sec`: must be finite and greater than zero, got NaN"
        );
        let err = TokenBucket::new(10.0, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid TokenBucket parameter `burst`: must be at least 1, got 0"
        );
    }

    #[test]
    fn debug_prints_config_and_futures_are_send() {
        let b = TokenBucket::new(2.5, 7).unwrap();
        assert_eq!(
            format!("{b:?}"),
            "TokenBucket { rate_per_sec: 2.5, burst: 7 }"
        );
        fn assert_send<F: Future + Send>(_: F) {}
        assert_send(b.acquire());
    }
}
