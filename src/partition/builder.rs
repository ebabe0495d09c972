//! Configuring a partitioned queue before it is built.

use crate::Key;
use std::fmt;
use std::time::Duration;

use super::queue::{PanicHook, PartitionFn};
use super::{PartitionPanic, Partitioned, ZeroPartitions};
use crate::Builder;
use crate::limiter::RateLimiter;
use crate::ordering::{Ordering, Priorities};

type Configure<K, O> = Box<dyn Fn(usize, Builder<K, O>) -> Builder<K, O> + Send + Sync>;

/// Configures a [`Partitioned`] queue: the queue every partition is built
/// from, the partitions' names, anything else per partition, and a hook
/// told about caught panics.
///
/// Made by [`Partitioned::builder`] (default ordering) or by
/// [`Builder::partitioned`], which starts from a configured queue:
/// every partition is then built from that [`Builder`], shares its rate
/// limiter, metrics hook and throttle, keeps its starvation bound and name,
/// and gets a clone of its ordering.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::{ExponentialBackoff, Partitioned, TokenBucket};
///
/// let queue = Partitioned::builder(3, |key: &String| key.len())
///     .name("pods")
///     .rate_limiter(ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(60)).unwrap())
///     .starvation_bound(Duration::from_secs(30))
///     // Partition 0 is also throttled to 5 keys a second.
///     .configure(|i, queue| {
///         if i == 0 { queue.throttle(TokenBucket::new(5.0, 1).unwrap()) } else { queue }
///     })
///     .on_panic(|report| eprintln!("{report}"))
///     .build()
///     .unwrap();
/// assert_eq!(queue.name(), "pods");
/// assert_eq!(queue.partitions(), 3);
/// ```
pub struct PartitionedBuilder<K, O = Priorities> {
    n: usize,
    partition_fn: PartitionFn<K>,
    base: Builder<K, O>,
    /// Set by [`name`](Self::name): partition `i` is named `{name}-{i}`.
    suffixed_name: Option<String>,
    configure: Option<Configure<K, O>>,
    on_panic: Option<PanicHook<K>>,
}

// Kept beside the partitioned builder it makes: the builder module then
// never names partitions, which are built from it.
impl<K: Key, O: Ordering<K> + Clone> Builder<K, O> {
    /// Partitions built from this queue: `n` queues, each key going to
    /// partition `partition_fn(&key)` (reduced modulo `n`), every partition
    /// built from this builder. See [`crate::partition`].
    ///
    /// The partitions share this builder's rate limiter (one per-key backoff,
    /// one token bucket for all), metrics hook and throttle, keep its name
    /// and starvation bound, and each gets a clone of its ordering. One name,
    /// not one per partition: with one metrics hook their series add up as
    /// one queue's would (use [`PartitionedBuilder::name`] for a name per
    /// partition).
    ///
    /// ```
    /// use tokio_workqueue::{Fifo, WorkQueue};
    ///
    /// let queue = WorkQueue::builder()
    ///     .name("pods")
    ///     .ordering(Fifo::new())
    ///     .partitioned(2, |key: &u32| *key as usize)
    ///     .build()
    ///     .unwrap();
    /// queue.add(3).unwrap();
    /// assert_eq!(queue.depths(), [0, 1]);
    /// assert_eq!(queue.queue(1).name(), "pods");
    /// ```
    pub fn partitioned(
        self,
        n: usize,
        partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> PartitionedBuilder<K, O> {
        PartitionedBuilder::from_base(self, n, partition_fn)
    }
}

impl<K: Key> PartitionedBuilder<K> {
    /// `n` partitions, each key going to partition `partition_fn(&key)`
    /// (reduced modulo `n`). Nothing else is set: the partitions are unnamed,
    /// use the default ordering and share one
    /// [`default_controller_rate_limiter`](crate::default_controller_rate_limiter).
    pub fn new(n: usize, partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        Builder::new().partitioned(n, partition_fn)
    }
}

impl<K: Key, O: Ordering<K> + Clone> PartitionedBuilder<K, O> {
    pub(crate) fn from_base(
        base: Builder<K, O>,
        n: usize,
        partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> Self {
        PartitionedBuilder {
            n,
            partition_fn: Box::new(partition_fn),
            base,
            suffixed_name: None,
            configure: None,
            on_panic: None,
        }
    }

    /// The queue's name. Partition `i` is named `"{name}-{i}"`, the `name`
    /// label of its metrics, so each partition has series of its own; a
    /// metrics hook that serves one name only (such as `PrometheusMetrics`)
    /// is then given per partition with [`configure`](Self::configure).
    ///
    /// Without this call the partitions keep the name of the [`Builder`]
    /// they are built from (unnamed by default) and their series add up as
    /// one queue's would.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.suffixed_name = Some(name.into());
        self
    }

    /// The limiter behind rate-limited adds and requeues, shared by all
    /// partitions: a token bucket in it caps the retries of the whole queue,
    /// and per-key backoff works as in one queue. The default is one shared
    /// [`default_controller_rate_limiter`](crate::default_controller_rate_limiter).
    ///
    /// For one limiter per partition, use [`configure`](Self::configure).
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K>) -> Self {
        self.base = self.base.rate_limiter(limiter);
        self
    }

    /// The starvation bound of every partition: see
    /// [`Builder::starvation_bound`]. Off by default.
    pub fn starvation_bound(mut self, bound: Duration) -> Self {
        self.base = self.base.starvation_bound(bound);
        self
    }

    /// Finishes configuring partition `i`'s queue: `configure` gets its
    /// index and a [`Builder`] that already has the name, shared rate limiter
    /// and starvation bound set above, and returns the builder to build it
    /// with. Use it for per-partition metrics, throttles or limiters.
    pub fn configure(
        mut self,
        configure: impl Fn(usize, Builder<K, O>) -> Builder<K, O> + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Box::new(configure));
        self
    }

    /// Called for every panic the queue catches: in the partition function,
    /// or in the reconcile function given to [`Partitioned::run`]. It runs on
    /// the task that caught the panic, so it should be quick; a panic inside
    /// it is caught and ignored.
    ///
    /// Each panic is also counted (see [`Partitioned::partition_fn_panics`]
    /// and [`Partitioned::reconcile_panics`]) and, like any panic, printed by
    /// the panic hook.
    pub fn on_panic(mut self, hook: impl Fn(&PartitionPanic<K>) + Send + Sync + 'static) -> Self {
        self.on_panic = Some(Box::new(hook));
        self
    }

    /// Builds the `n` partition queues, or refuses `n == 0`. Needs no
    /// runtime until the first delayed add or [`Partitioned::run`].
    pub fn build(self) -> Result<Partitioned<K, O>, ZeroPartitions> {
        if self.n == 0 {
            return Err(ZeroPartitions);
        }
        let name = match &self.suffixed_name {
            Some(name) => name.clone(),
            None => self.base.queue_name().to_owned(),
        };
        let queues = self
            .base
            .split(self.n)
            .into_iter()
            .enumerate()
            .map(|(i, mut builder)| {
                if let Some(name) = self.suffixed_name.as_deref().filter(|n| !n.is_empty()) {
                    builder = builder.name(format!("{name}-{i}"));
                }
                if let Some(configure) = &self.configure {
                    builder = configure(i, builder);
                }
                builder.build()
            })
            .collect();
        Ok(Partitioned::from_parts(
            name,
            queues,
            self.partition_fn,
            self.on_panic,
        ))
    }
}

impl<K, O> fmt::Debug for PartitionedBuilder<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionedBuilder")
            .field("partitions", &self.n)
            .field("name", &self.suffixed_name)
            .field("queue", &self.base)
            .field("configure", &self.configure.is_some())
            .field("on_panic", &self.on_panic.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::FastSlow;

    #[test]
    fn zero_partitions_are_refused_at_build() {
        let built = PartitionedBuilder::new(0, |_: &u8| 0).name("x").build();
        assert_eq!(built.unwrap_err(), ZeroPartitions);
    }

    #[test]
    fn partitions_are_named_after_the_queue() {
        let q = PartitionedBuilder::new(3, |k: &u8| *k as usize)
            .name("pods")
            .build()
            .unwrap();
        let names: Vec<_> = (0..3).map(|i| q.queue(i).name().to_owned()).collect();
        assert_eq!(names, ["pods-0", "pods-1", "pods-2"]);
        let unnamed = PartitionedBuilder::new(2, |k: &u8| *k as usize)
            .build()
            .unwrap();
        assert_eq!(unnamed.queue(1).name(), "");
    }

    #[test]
    fn the_rate_limiter_is_shared_unless_configured_per_partition() {
        let ms = Duration::from_millis;
        let shared = PartitionedBuilder::new(2, |k: &u8| *k as usize)
            .rate_limiter(FastSlow::new(ms(1), ms(2), 1).unwrap())
            .build()
            .unwrap();
        // Both partitions see the same limiter's memory.
        shared.queue(0).shared.limiter.when(&7);
        assert_eq!(shared.queue(1).num_requeues(&7), 1);

        let own = PartitionedBuilder::new(2, |k: &u8| *k as usize)
            .configure(move |_, b| b.rate_limiter(FastSlow::new(ms(1), ms(2), 1).unwrap()))
            .build()
            .unwrap();
        own.queue(0).shared.limiter.when(&7);
        assert_eq!(own.queue(1).num_requeues(&7), 0);
        assert_eq!(own.queue(0).num_requeues(&7), 1);
    }

    #[test]
    fn configure_sees_each_partition_index_once() {
        let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = seen.clone();
        let q = PartitionedBuilder::new(3, |k: &u8| *k as usize)
            .name("n")
            .configure(move |i, b| {
                log.lock().push(i);
                b.name(format!("custom-{i}"))
            })
            .build()
            .unwrap();
        assert_eq!(*seen.lock(), [0, 1, 2]);
        assert_eq!(q.queue(2).name(), "custom-2");
    }

    #[test]
    fn debug_tells_what_is_configured() {
        let b = PartitionedBuilder::new(4, |k: &u8| *k as usize).name("pods");
        let s = format!("{b:?}");
        assert!(s.contains("partitions: 4") && s.contains("\"pods\""), "{s}");
    }
}
