//! Partitions: keys grouped by a function, each group processed in order by
//! its own task.
//!
//! A [`Partitioned`] queue is `n` [`WorkQueue`]s behind one handle. Every add
//! goes to the partition that the partition function picks for the key (for
//! example the node a pod runs on). [`Partitioned::run`] spawns one tokio task
//! per partition, and each task hands its partition's keys to the reconcile
//! function one at a time, in the order the queue hands them out. So the keys
//! of one partition never run concurrently and keep their order, while
//! partitions run in parallel, and a hot partition slows only itself.
//!
//! Inside a partition every guarantee of [`WorkQueue`] holds: de-duplication,
//! stingy leases, delays, priorities and lanes, the starvation bound and rate
//! limits. Since a key always goes to the same partition, a key is also
//! de-duplicated across the whole partitioned queue. Partitions use the
//! default [ordering](crate::ordering) ([`Priorities`](crate::Priorities)).
//!
//! # Edge cases
//!
//! | case | behaviour |
//! | --- | --- |
//! | `n == 0` | [`ZeroPartitions`] error from the constructors, never a panic |
//! | a large `n` | not capped: `n` queues are built at once (each of 8 shards unless [`Builder::shards`](crate::Builder::shards) says otherwise: about 31 KB before its first key) and [`Partitioned::run`] spawns `n` tasks, so choose `n` for the parallelism you want (the cores, or the nodes), not one per key |
//! | the partition function returns `i >= n` | the key goes to partition `i % n` |
//! | the partition function panics | the key goes to partition 0, the panic is counted ([`Partitioned::partition_fn_panics`]) and reported to [`on_panic`](PartitionedBuilder::on_panic); the add goes ahead |
//! | the reconcile function panics | the panic is caught, the partition's task goes on with its next key, and the key is added again rate limited; counted ([`Partitioned::reconcile_panics`]) and reported |
//!
//! The partition function must give the same answer for a key while the key
//! is queued or in flight: it is asked on every add, and a key that it sends
//! to two partitions is in both, so it could be processed twice at once.
//! (A pod's node does not change once it is scheduled.) A panic is only
//! caught when the crate is built with `panic = "unwind"`, Rust's default.
//!
//! # Rate limits
//!
//! By default all partitions share one rate limiter, so the overall retry
//! rate is that of one queue; per-key backoff is unchanged, since a key lives
//! in one partition. [`PartitionedBuilder::configure`] gives each partition
//! its own limiter, metrics, throttle or starvation bound instead.
//!
//! # Example
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use tokio_workqueue::Partitioned;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Keys are "node/pod"; the partition is the node's number.
//! let queue = Partitioned::new(2, |key: &String| {
//!     if key.starts_with("node-0/") { 0 } else { 1 }
//! })
//! .unwrap();
//! for key in ["node-0/a", "node-1/x", "node-0/b", "node-0/c", "node-1/y"] {
//!     queue.add(key.to_string()).unwrap();
//! }
//! assert_eq!(queue.depths(), [3, 2]);
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! let handle = queue.run(move |item| {
//!     let log = log.clone();
//!     async move {
//!         log.lock().unwrap().push(item.key().clone());
//!         item.forget(); // success: reset its rate-limit history
//!     }
//! });
//! handle.shutdown_with_drain().await.unwrap();
//!
//! // Each node's pods were processed in the order they were added.
//! let seen = seen.lock().unwrap();
//! let node0: Vec<_> = seen.iter().filter(|k| k.starts_with("node-0/")).collect();
//! assert_eq!(node0, ["node-0/a", "node-0/b", "node-0/c"]);
//! # }
//! ```

use crate::Key;
use std::fmt;
use std::hash::Hash;

use crate::WorkQueue;

mod builder;
mod queue;
mod run;

pub use crate::catch::panic_message;
pub use builder::PartitionedBuilder;
pub use queue::Partitioned;
pub use run::{PanicSource, PartitionHandle, PartitionPanic};

/// A partitioned queue was asked for zero partitions.
///
/// Returned by [`Partitioned::new`], [`PartitionedBuilder::build`] and
/// [`WorkQueue::partitioned`]: with no partition there is nowhere to put a
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ZeroPartitions;

impl fmt::Display for ZeroPartitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a partitioned work queue needs at least one partition")
    }
}

impl std::error::Error for ZeroPartitions {}

impl<K: Key> WorkQueue<K> {
    /// `n` queues behind one handle, each key going to partition
    /// `partition_fn(&key)`: the same as [`Partitioned::new`].
    ///
    /// See the [`partition`](crate::partition) module for the semantics.
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// let queue = WorkQueue::partitioned(4, |key: &u32| *key as usize).unwrap();
    /// assert_eq!(queue.partition_of(&6), 2); // 6 % 4
    /// assert!(WorkQueue::partitioned(0, |_: &u32| 0).is_err());
    /// ```
    pub fn partitioned(
        n: usize,
        partition_fn: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> Result<Partitioned<K>, ZeroPartitions> {
        Partitioned::new(n, partition_fn)
    }
}

/// `route(key) % n`, or, if `route` panicked, the panic's message (the
/// key then goes to partition 0; what else happens is the caller's).
pub(crate) fn route_index<K>(
    route: &(dyn Fn(&K) -> usize + Send + Sync),
    key: &K,
    n: usize,
) -> Result<usize, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| route(key)))
        .map(|i| i % n)
        .map_err(|payload| panic_message(&*payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_partitions_is_an_error_with_a_message() {
        let err = WorkQueue::partitioned(0, |_: &u8| 0).unwrap_err();
        assert_eq!(err, ZeroPartitions);
        assert!(err.to_string().contains("at least one partition"));
    }

    #[test]
    fn public_types_are_send_sync_and_debug() {
        fn check<T: Send + Sync + fmt::Debug>() {}
        check::<Partitioned<String>>();
        check::<PartitionedBuilder<String>>();
        check::<PartitionHandle<String>>();
        check::<PartitionPanic<String>>();
        check::<PanicSource>();
        check::<ZeroPartitions>();
    }
}
