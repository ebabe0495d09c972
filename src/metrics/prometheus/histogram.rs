//! A duration histogram that workers observe without taking a lock, and
//! mostly without sharing a cache line.
//!
//! `prometheus-client`'s `Histogram` keeps its buckets behind a mutex, so
//! every hand-out and every lease end of a busy queue took that mutex, and
//! workers on different threads queued up on it. Here each bucket is an
//! atomic counter, and the counters are kept in shards, each on cache lines
//! of its own: a thread observes into the shard its thread number picks, so
//! two workers observing at once do not pull one line back and forth. An
//! observation is a count of the (few) bounds below it, done on whole
//! nanoseconds, and two relaxed atomic adds to its shard, one of them a
//! compare-and-swap loop for the sum.
//!
//! A scrape adds the shards up while workers go on observing, so it may see
//! an observation in its bucket but not yet in the sum, or the reverse; the
//! count is the sum of the buckets as read, so `_count` always equals the
//! `+Inf` bucket, as Prometheus requires. Each series is still monotonic
//! from one scrape to the next.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// `u64`s in a cache line pair (the unit adjacent-line prefetchers pull).
const LINE_WORDS: usize = 128 / 8;

pub(super) struct AtomicHistogram {
    /// Finite upper bounds in seconds, sorted; `+Inf` is implicit.
    bounds: Box<[f64]>,
    /// For each bound, how many whole nanosecond counts lie at or below it
    /// ([`ns_limit`]): an observation of `n` ns belongs to the first bound
    /// whose limit exceeds `n`. Searching integers keeps the search off the
    /// conversion to seconds, which only the sum needs.
    limits: Box<[u64]>,
    /// The shards, `stride` words each, starting on a 128-byte boundary:
    /// observations per bucket (not cumulative; one per bound, then `+Inf`),
    /// then the sum of the observations in seconds as `f64` bits.
    words: Box<[Line]>,
    /// Words per shard: the buckets and the sum, rounded up to whole lines.
    stride: usize,
    /// Shards - 1 (a power of two minus one).
    mask: usize,
}

#[repr(align(128))]
struct Line([AtomicU64; LINE_WORDS]);

/// Numbers threads in the order they first observe into any histogram.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: Cell<Option<usize>> = const { Cell::new(None) };
}

fn thread_number() -> usize {
    THREAD.with(|t| match t.get() {
        Some(n) => n,
        None => {
            let n = NEXT_THREAD.fetch_add(1, Relaxed);
            t.set(Some(n));
            n
        }
    })
}

impl AtomicHistogram {
    /// A histogram with `bounds`, which must be finite and sorted, and
    /// enough shards that the threads of a runtime the size of this machine
    /// seldom share one.
    pub(super) fn new(bounds: &[f64]) -> Self {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self::with_shards(bounds, threads * 4)
    }

    /// `shards` is rounded up to a power of two and kept within 1..=256.
    fn with_shards(bounds: &[f64], shards: usize) -> Self {
        debug_assert!(bounds.iter().all(|b| b.is_finite()));
        debug_assert!(bounds.is_sorted());
        let shards = shards.clamp(1, 256).next_power_of_two();
        // All words start at zero, and 0.0's bits are zero: sums start at 0.0.
        let stride = (bounds.len() + 2).div_ceil(LINE_WORDS) * LINE_WORDS;
        AtomicHistogram {
            bounds: bounds.into(),
            limits: bounds.iter().map(|&b| ns_limit(b)).collect(),
            words: (0..shards * stride / LINE_WORDS)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            stride,
            mask: shards - 1,
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words[i / LINE_WORDS].0[i % LINE_WORDS]
    }

    /// Where a shard keeps its sum: after one count per bound and `+Inf`.
    fn sum_offset(&self) -> usize {
        self.bounds.len() + 1
    }

    fn shards(&self) -> impl Iterator<Item = usize> + '_ {
        (0..=self.mask).map(|s| s * self.stride)
    }

    pub(super) fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let base = (thread_number() & self.mask) * self.stride;
        // The first bucket whose bound is >= the observation (Prometheus'
        // `le`): past every limit at or below `ns`, the limits being sorted.
        // Counted, not searched: a binary search is a chain of dependent
        // loads, and counting a dozen limits is a few vector compares (on
        // W1 with metrics, this and the sum below took 3.7-4.1 % more items
        // per second).
        let i: usize = self.limits.iter().map(|&l| usize::from(l <= ns)).sum();
        self.word(base + i).fetch_add(1, Relaxed);
        // One conversion and a multiply; `as_secs_f64` divides. A saturated
        // `ns` takes the exact route, to keep absurd durations absurd.
        let v = if ns < u64::MAX {
            ns as f64 * 1e-9
        } else {
            d.as_secs_f64()
        };
        let sum = self.word(base + self.sum_offset());
        let mut old = sum.load(Relaxed);
        loop {
            let new = (f64::from_bits(old) + v).to_bits();
            match sum.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => old = now,
            }
        }
    }

    /// The buckets (upper bound, non-cumulative count, `+Inf` last), the
    /// count and the sum, as read now.
    fn read(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let n = self.bounds.len() + 1;
        let mut counts = vec![0u64; n];
        let mut sum = 0.0;
        for base in self.shards() {
            for (i, c) in counts.iter_mut().enumerate() {
                *c += self.word(base + i).load(Relaxed);
            }
            sum += f64::from_bits(self.word(base + self.sum_offset()).load(Relaxed));
        }
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts)
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        (buckets, count, sum)
    }
}

/// How many of the nanosecond counts 0, 1, 2, ... are at most `bound`
/// seconds: none for a negative bound, `floor(bound * 1e9) + 1` otherwise
/// (saturating). So `n` ns is `<= bound` exactly when `n < ns_limit(bound)`,
/// up to the rounding of `bound * 1e9` for bounds with more than
/// nanosecond precision.
fn ns_limit(bound: f64) -> u64 {
    if bound < 0.0 {
        0
    } else {
        // `as` saturates, and +1 past u64::MAX stays at u64::MAX: a bound of
        // about 585 years or more holds every observation but Duration::MAX.
        ((bound * 1e9).floor() as u64).saturating_add(1)
    }
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (buckets, count, sum) = self.read();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        let h = AtomicHistogram::new(&[0.001, 0.01, 0.1]);
        h.observe(Duration::ZERO);
        h.observe(MS); // exactly on a bound: `le` includes it
        h.observe(2 * MS);
        h.observe(Duration::from_secs(5)); // past every bound: +Inf
        h.observe(Duration::MAX);
        let (buckets, count, sum) = h.read();
        assert_eq!(
            buckets,
            vec![(0.001, 2), (0.01, 1), (0.1, 0), (f64::INFINITY, 2)]
        );
        assert_eq!(count, 5);
        assert!(sum > 5.003, "{sum}");
    }

    #[test]
    fn every_shard_is_read_and_shards_sit_on_lines_of_their_own() {
        let h = std::sync::Arc::new(AtomicHistogram::with_shards(&[0.001, 1.0], 5));
        assert_eq!(h.mask + 1, 8, "rounded up to a power of two");
        assert_eq!(h.stride % LINE_WORDS, 0);
        assert_eq!(std::mem::align_of::<Line>(), 128);
        // More threads than shards, each new thread a new thread number.
        let threads: Vec<_> = (0..12)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for _ in 0..=t {
                        h.observe(2 * MS);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let used = h
            .shards()
            .filter(|&base| h.word(base + 1).load(Relaxed) > 0)
            .count();
        assert!(used > 1, "observations spread over shards");
        let (buckets, count, sum) = h.read();
        assert_eq!(count, (1..=12).sum::<u64>());
        assert_eq!(buckets[1], (1.0, 78));
        assert!((sum - 0.156).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn nanosecond_limits_agree_with_comparing_seconds() {
        assert_eq!(ns_limit(-1.0), 0, "no duration is below a negative bound");
        assert_eq!(ns_limit(0.0), 1, "only zero is at or below 0 s");
        assert_eq!(ns_limit(1e-8), 11);
        assert_eq!(ns_limit(1.5e-9), 2);
        assert_eq!(ns_limit(1e30), u64::MAX);
        let bounds = [-1.0, 0.0, 1e-8, 1.5e-9, 1e-3, 0.3, 2.5, 1e3];
        for b in bounds {
            for ns in [0u64, 1, 2, 9, 10, 11, 999_999, 1_000_000, 1_000_001] {
                for ns in [ns, ns.saturating_mul(300), ns.saturating_mul(2500)] {
                    let by_seconds = Duration::from_nanos(ns).as_secs_f64() <= b;
                    assert_eq!(ns < ns_limit(b), by_seconds, "{ns} ns against {b} s");
                }
            }
        }
    }

    proptest::proptest! {
        /// Against a model that compares seconds: every observation is
        /// counted once, in the first bucket whose bound is at or above it,
        /// and the sum is the sum of the observations.
        #[test]
        fn observations_land_where_comparing_seconds_puts_them(
            // Multiples of 1/1024 s: exact in seconds and in nanoseconds,
            // so the model's comparison has no rounding of its own.
            ks in proptest::collection::vec(0u32..20_480, 0..14),
            mut ns in proptest::collection::vec(0u64..25_000_000_000, 1..40),
            // Observations on a bound, and a nanosecond either side of it.
            near in proptest::collection::vec((0usize..14, -1i64..=1), 0..20),
        ) {
            let mut bounds: Vec<f64> = ks.iter().map(|&k| f64::from(k) / 1024.0).collect();
            bounds.sort_by(f64::total_cmp);
            for (i, delta) in near {
                if let Some(&b) = bounds.get(i) {
                    ns.push(((b * 1e9) as u64).saturating_add_signed(delta));
                }
            }
            let h = AtomicHistogram::new(&bounds);
            let mut want = vec![0u64; bounds.len() + 1];
            let mut want_sum = 0.0;
            for &n in &ns {
                let d = Duration::from_nanos(n);
                h.observe(d);
                let secs = d.as_secs_f64();
                want[bounds.iter().position(|&b| secs <= b).unwrap_or(bounds.len())] += 1;
                want_sum += secs;
            }
            let (buckets, count, sum) = h.read();
            let got: Vec<u64> = buckets.iter().map(|&(_, c)| c).collect();
            proptest::prop_assert_eq!(got, want);
            proptest::prop_assert_eq!(count, ns.len() as u64);
            proptest::prop_assert!((sum - want_sum).abs() <= 1e-9 * want_sum.max(1.0));
        }
    }

    #[test]
    fn no_bounds_means_one_inf_bucket() {
        let h = AtomicHistogram::new(&[]);
        h.observe(MS);
        assert_eq!(h.read().0, vec![(f64::INFINITY, 1)]);
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = std::sync::Arc::new(AtomicHistogram::new(&[0.001, 1.0]));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        h.observe(MS);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (buckets, count, sum) = h.read();
        assert_eq!(count, 40_000);
        assert_eq!(buckets[0].1, 40_000);
        // 40,000 adds of 1 ms: exact up to f64 rounding, none lost to a race.
        assert!((sum - 40.0).abs() < 1e-6, "{sum}");
    }
}
