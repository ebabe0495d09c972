//! A duration histogram that workers observe without taking a lock.
//!
//! `prometheus-client`'s `Histogram` keeps its buckets behind a mutex, so
//! every hand-out and every lease end of a busy queue took that mutex, and
//! workers on different threads queued up on it. Here each bucket is an
//! atomic counter: an observation is a search of the (few) bounds and two
//! relaxed atomic adds, one of them a compare-and-swap loop for the sum.
//!
//! A scrape reads the buckets one by one while workers go on observing, so it
//! may see an observation in its bucket but not yet in the sum, or the
//! reverse; the count is the sum of the buckets as read, so `_count` always
//! equals the `+Inf` bucket, as Prometheus requires. Each series is still
//! monotonic from one scrape to the next.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

pub(super) struct AtomicHistogram {
    /// Finite upper bounds in seconds, sorted; `+Inf` is implicit.
    bounds: Box<[f64]>,
    /// Observations per bucket (not cumulative): one per bound, then `+Inf`.
    counts: Box<[AtomicU64]>,
    /// The sum of the observations in seconds, as `f64` bits.
    sum: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with `bounds`, which must be finite and sorted.
    pub(super) fn new(bounds: &[f64]) -> Self {
        debug_assert!(bounds.iter().all(|b| b.is_finite()));
        debug_assert!(bounds.is_sorted());
        AtomicHistogram {
            bounds: bounds.into(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub(super) fn observe(&self, d: Duration) {
        let v = d.as_secs_f64();
        // The first bucket whose bound is >= v (Prometheus' `le`).
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i].fetch_add(1, Relaxed);
        let mut old = self.sum.load(Relaxed);
        loop {
            let new = (f64::from_bits(old) + v).to_bits();
            match self.sum.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => old = now,
            }
        }
    }

    /// The buckets (upper bound, non-cumulative count, `+Inf` last), the
    /// count and the sum, as read now.
    fn read(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().map(|c| c.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        (buckets, count, f64::from_bits(self.sum.load(Relaxed)))
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
