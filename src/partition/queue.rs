//! The partitioned queue handle: routing adds to partitions.

use crate::Key;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{PanicSource, PartitionPanic, PartitionedBuilder, ZeroPartitions, route_index};
use crate::ordering::{Ordering as QueueOrdering, Priorities};
use crate::{AddError, AddOpts, Lane, WorkQueue};

pub(crate) type PartitionFn<K> = Box<dyn Fn(&K) -> usize + Send + Sync>;
pub(crate) type PanicHook<K> = Box<dyn Fn(&PartitionPanic<K>) + Send + Sync>;

/// `n` [`WorkQueue`]s behind one handle, each key going to the partition its
/// partition function picks.
///
/// Adds, [`forget`](Self::forget) and [`num_requeues`](Self::num_requeues)
/// take the same arguments as [`WorkQueue`]'s and act on the key's partition,
/// where every queue guarantee holds. [`run`](Self::run) processes each
/// partition on its own task, one key at a time. See the
/// [`partition`](crate::partition) module for the semantics and edge cases.
///
/// Cloning is cheap: clones share the partitions, so producers can each keep
/// one.
///
/// ```
/// use tokio_workqueue::Partitioned;
///
/// let queue = Partitioned::new(3, |key: &u32| *key as usize).unwrap();
/// queue.add(1).unwrap();
/// queue.add(4).unwrap(); // 4 % 3 == 1
/// queue.add(4).unwrap(); // de-duplicated
/// queue.add(2).unwrap();
/// assert_eq!(queue.depths(), [0, 2, 1]);
/// assert_eq!(queue.len(), 3);
/// ```
pub struct Partitioned<K, O: QueueOrdering<K> = Priorities> {
    inner: Arc<Inner<K, O>>,
}

struct Inner<K, O: QueueOrdering<K>> {
    name: String,
    queues: Box<[WorkQueue<K, O>]>,
    partition_fn: PartitionFn<K>,
    on_panic: Option<PanicHook<K>>,
    partition_fn_panics: AtomicU64,
    reconcile_panics: AtomicU64,
    /// Set by the first `run`: a second would put two tasks on a partition.
    running: AtomicBool,
}

impl<K: Key> Partitioned<K> {
    /// `n` partitions, each key going to partition `partition_fn(&key)`, with
    /// the defaults of [`PartitionedBuilder`]. Refuses `n == 0`.
    ///
    /// An index `i >= n` means partition `i % n`. A panic in `partition_fn`
    /// sends the key to partition 0 (see the [module docs](crate::partition)).
    pub fn new(
        n: usize,
        partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> Result<Self, ZeroPartitions> {
        PartitionedBuilder::new(n, partition_fn).build()
    }

    /// Starts configuring a partitioned queue: name, rate limiter,
    /// starvation bound, per-partition settings, panic hook.
    pub fn builder(
        n: usize,
        partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> PartitionedBuilder<K> {
        PartitionedBuilder::new(n, partition_fn)
    }
}

impl<K: Key, O: QueueOrdering<K>> Partitioned<K, O> {
    pub(crate) fn from_parts(
        name: String,
        queues: Vec<WorkQueue<K, O>>,
        partition_fn: PartitionFn<K>,
        on_panic: Option<PanicHook<K>>,
    ) -> Self {
        debug_assert!(!queues.is_empty());
        Partitioned {
            inner: Arc::new(Inner {
                name,
                queues: queues.into_boxed_slice(),
                partition_fn,
                on_panic,
                partition_fn_panics: AtomicU64::new(0),
                reconcile_panics: AtomicU64::new(0),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// The name given to [`PartitionedBuilder::name`] (empty by default).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of partitions, `n`.
    pub fn partitions(&self) -> usize {
        self.inner.queues.len()
    }

    /// The partition `key` goes to: `partition_fn(&key) % n`, or 0 if
    /// `partition_fn` panics (which is counted and reported as on an add).
    /// With one partition the function is not called.
    pub fn partition_of(&self, key: &K) -> usize {
        let n = self.inner.queues.len();
        if n == 1 {
            // Nothing to choose: the function is not asked.
            return 0;
        }
        match route_index(&*self.inner.partition_fn, key, n) {
            Ok(i) => i,
            Err(message) => {
                self.inner
                    .partition_fn_panics
                    .fetch_add(1, Ordering::Relaxed);
                self.report(PartitionPanic {
                    source: PanicSource::PartitionFn,
                    partition: 0,
                    key: key.clone(),
                    message,
                    requeued: None,
                });
                0
            }
        }
    }

    /// The queue of `key`'s partition.
    fn route(&self, key: &K) -> &WorkQueue<K, O> {
        &self.inner.queues[self.partition_of(key)]
    }

    /// Makes `key` ready now in its partition: see [`WorkQueue::add`].
    pub fn add(&self, key: K) -> Result<(), AddError> {
        self.route(&key).add(key)
    }

    /// Makes `key` ready after `delay` in its partition: see
    /// [`WorkQueue::add_after`].
    pub fn add_after(&self, key: K, delay: Duration) -> Result<(), AddError> {
        self.route(&key).add_after(key, delay)
    }

    /// Makes `key` ready after the rate limiter's delay for it: see
    /// [`WorkQueue::add_rate_limited`].
    pub fn add_rate_limited(&self, key: K) -> Result<(), AddError> {
        self.route(&key).add_rate_limited(key)
    }

    /// Adds `key` in `lane` of its partition: see [`WorkQueue::add_to_lane`].
    pub fn add_to_lane(&self, key: K, lane: Lane) -> Result<(), AddError> {
        self.route(&key).add_to_lane(key, lane)
    }

    /// Adds `key` with a priority, a delay and a rate limit in one call: see
    /// [`WorkQueue::add_with`].
    pub fn add_with(&self, key: K, opts: AddOpts) -> Result<(), AddError> {
        self.route(&key).add_with(key, opts)
    }

    /// Forgets the rate limiter's failures for `key`.
    pub fn forget(&self, key: &K) {
        self.route(key).forget(key)
    }

    /// How many rate-limited adds `key` had since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.route(key).num_requeues(key)
    }

    /// Keys ready to be handed out now, in all partitions.
    pub fn len(&self) -> usize {
        self.inner.queues.iter().map(WorkQueue::len).sum()
    }

    /// Whether no key is ready now in any partition.
    pub fn is_empty(&self) -> bool {
        self.inner.queues.iter().all(WorkQueue::is_empty)
    }

    /// Keys ready now in each partition, by partition index: a hot partition
    /// shows up as a large depth.
    pub fn depths(&self) -> Vec<usize> {
        self.inner.queues.iter().map(WorkQueue::len).collect()
    }

    /// Shuts every partition down: see [`WorkQueue::shutdown`]. The tasks of
    /// [`run`](Self::run) still process the keys already ready, then end.
    pub fn shutdown(&self) {
        for queue in self.inner.queues.iter() {
            queue.shutdown();
        }
    }

    /// Shuts every partition down, then waits until nothing is ready and
    /// nothing is in flight in any of them: see
    /// [`WorkQueue::shutdown_with_drain`]. It needs the partitions to be
    /// consumed, by [`run`](Self::run).
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        for queue in self.inner.queues.iter() {
            queue.shutdown_with_drain().await;
        }
    }

    /// Whether the queue was shut down.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.queues[0].is_shutting_down()
    }

    /// How many times the partition function panicked.
    pub fn partition_fn_panics(&self) -> u64 {
        self.inner.partition_fn_panics.load(Ordering::Relaxed)
    }

    /// How many times the reconcile function given to [`run`](Self::run)
    /// panicked.
    pub fn reconcile_panics(&self) -> u64 {
        self.inner.reconcile_panics.load(Ordering::Relaxed)
    }

    /// Partition `i`'s queue, for callers that consume the partitions
    /// themselves instead of through [`run`](Self::run) (a controller's
    /// runner does): give each partition one consumer at a time to keep
    /// its keys in order.
    ///
    /// # Panics
    ///
    /// If `i >= n`.
    pub fn queue(&self, i: usize) -> &WorkQueue<K, O> {
        &self.inner.queues[i]
    }

    /// Counts a caught reconcile panic.
    pub(crate) fn count_reconcile_panic(&self) {
        self.inner.reconcile_panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks the queue as run; false if it already was.
    pub(crate) fn start_running(&self) -> bool {
        !self.inner.running.swap(true, Ordering::AcqRel)
    }

    /// Tells the panic hook, if any; a panic in the hook is swallowed.
    pub(crate) fn report(&self, report: PartitionPanic<K>) {
        if let Some(hook) = &self.inner.on_panic {
            let _ = catch_unwind(AssertUnwindSafe(|| hook(&report)));
        }
    }
}

impl<K, O: QueueOrdering<K>> Clone for Partitioned<K, O> {
    fn clone(&self) -> Self {
        Partitioned {
            inner: self.inner.clone(),
        }
    }
}

impl<K, O: QueueOrdering<K>> fmt::Debug for Partitioned<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("Partitioned")
            .field("name", &inner.name)
            .field("partitions", &inner.queues)
            .field(
                "partition_fn_panics",
                &inner.partition_fn_panics.load(Ordering::Relaxed),
            )
            .field(
                "reconcile_panics",
                &inner.reconcile_panics.load(Ordering::Relaxed),
            )
            .field("running", &inner.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn by_value(n: usize) -> Partitioned<usize> {
        Partitioned::new(n, |k: &usize| *k).unwrap()
    }

    #[test]
    fn out_of_range_indexes_are_reduced_modulo_n() {
        let q = by_value(3);
        assert_eq!(q.partition_of(&2), 2);
        assert_eq!(q.partition_of(&3), 0);
        assert_eq!(q.partition_of(&7), 1);
        assert_eq!(q.partition_of(&usize::MAX), usize::MAX % 3);
        q.add(7).unwrap();
        assert_eq!(q.depths(), [0, 1, 0]);
    }

    #[test]
    fn a_panicking_partition_fn_routes_to_partition_zero_and_is_reported() {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let log = reports.clone();
        let q = Partitioned::builder(3, |k: &usize| {
            if *k == 13 {
                panic!("no node for {k}");
            }
            *k
        })
        .on_panic(move |r| log.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
        q.add(13).unwrap();
        q.add(2).unwrap();
        assert_eq!(q.depths(), [1, 0, 1]);
        assert_eq!(q.partition_fn_panics(), 1);
        let reports = reports.lock().unwrap();
        assert_eq!(reports.len(), 1);
        let r = &reports[0];
        assert_eq!(
            (r.source, r.partition, r.key, r.message.as_str(), r.requeued),
            (PanicSource::PartitionFn, 0, 13, "no node for 13", None)
        );
    }

    #[test]
    fn a_panicking_hook_is_swallowed() {
        let q = Partitioned::builder(2, |_: &usize| -> usize { panic!("routing") })
            .on_panic(|_| panic!("hook"))
            .build()
            .unwrap();
        q.add(1).unwrap();
        assert_eq!(q.depths(), [1, 0]);
    }

    #[test]
    fn every_add_goes_to_the_keys_partition() {
        let q = by_value(2);
        q.add(0).unwrap();
        q.add_after(1, Duration::ZERO).unwrap();
        q.add_to_lane(3, Lane::Slow).unwrap();
        q.add_with(4, AddOpts::default().priority(3)).unwrap();
        assert_eq!(q.depths(), [2, 2]);
        assert_eq!(q.len(), 4);
        assert!(!q.is_empty());
    }

    #[test]
    fn shutdown_reaches_every_partition() {
        let q = by_value(3);
        assert!(!q.is_shutting_down());
        q.clone().shutdown();
        assert!(q.is_shutting_down());
        for k in 0..3 {
            assert_eq!(q.add(k), Err(AddError::ShuttingDown));
        }
        assert!(q.is_empty());
    }

    #[test]
    fn debug_shows_the_partitions() {
        let q = Partitioned::builder(2, |k: &usize| *k)
            .name("pods")
            .build()
            .unwrap();
        q.add(1).unwrap();
        let s = format!("{q:?}");
        assert!(s.contains("\"pods\"") && s.contains("pods-1"), "{s}");
    }
}
