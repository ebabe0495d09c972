//! Running a partitioned queue: one task per partition, one key at a time.

use crate::Key;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::task::{JoinError, JoinHandle};

use super::{Partitioned, panic_message};
use crate::ordering::{Ordering, Priorities};
use crate::{AddError, WorkItem, WorkQueue};

/// Where a caught panic happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PanicSource {
    /// The partition function, while routing a key. The key went to
    /// partition 0.
    PartitionFn,
    /// The reconcile function given to [`Partitioned::run`], while it
    /// processed a key. The key was added again, rate limited.
    Reconcile,
}

/// A panic the partitioned queue caught, as told to
/// [`PartitionedBuilder::on_panic`](super::PartitionedBuilder::on_panic).
///
/// Displays as `reconcile of "ns/pod" in partition 2 panicked: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionPanic<K> {
    /// Where it panicked.
    pub source: PanicSource,
    /// The partition the key went to, or was processed in.
    pub partition: usize,
    /// The key being routed or processed.
    pub key: K,
    /// The panic's message (`"Box<dyn Any>"` when the payload is not a
    /// string).
    pub message: String,
    /// For [`PanicSource::Reconcile`], whether adding the key again was
    /// accepted: refused once the queue is shutting down, like any add.
    /// `None` for [`PanicSource::PartitionFn`], where the add goes on.
    pub requeued: Option<Result<(), AddError>>,
}

impl<K: fmt::Debug> fmt::Display for PartitionPanic<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.source {
            PanicSource::PartitionFn => "partition function",
            PanicSource::Reconcile => "reconcile",
        };
        write!(
            f,
            "{what} of {:?} in partition {} panicked: {}",
            self.key, self.partition, self.message
        )?;
        if let Some(Err(e)) = &self.requeued {
            write!(f, " (not requeued: {e})")?;
        }
        Ok(())
    }
}

impl<K: Key, O: Ordering<K>> Partitioned<K, O> {
    /// Spawns one task per partition that hands the partition's keys to
    /// `reconcile` one at a time, and returns a handle to shut them down and
    /// wait for them.
    ///
    /// Each task takes its partition's next key only when `reconcile`'s
    /// future for the previous one has completed, so keys of a partition are
    /// processed in the order the queue hands them out and never at once,
    /// while partitions run in parallel. `reconcile` owns the lease: it ends
    /// the lease with [`WorkItem::done`], a `requeue` or by dropping the
    /// item. (An item kept past the future, in another task, keeps its key
    /// leased but no longer holds the partition back.)
    ///
    /// A panic in `reconcile` is caught: the lease ends, the key is added
    /// again with [`add_rate_limited`](Self::add_rate_limited) (so a key that
    /// always panics backs off instead of spinning), the panic is counted and
    /// reported to the [`on_panic`](super::PartitionedBuilder::on_panic) hook,
    /// and the task goes on with the partition's next key.
    ///
    /// The tasks end once the queue is shut down and their partitions are
    /// empty. Dropping the handle does not stop them.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime, or if this queue (or a clone of
    /// it) was already run: two tasks on one partition would break its
    /// ordering.
    pub fn run<F, Fut>(&self, reconcile: F) -> PartitionHandle<K, O>
    where
        F: Fn(WorkItem<K, O>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        assert!(
            self.start_running(),
            "Partitioned::run was already called on this queue"
        );
        let reconcile = Arc::new(reconcile);
        let tasks = (0..self.partitions())
            .map(|i| {
                let queue = self.clone();
                let reconcile = reconcile.clone();
                tokio::spawn(async move { run_partition(queue, i, reconcile).await })
            })
            .collect();
        PartitionHandle {
            queue: self.clone(),
            tasks,
        }
    }
}

/// Partition `i`'s task: its keys, one at a time.
async fn run_partition<K, O, F, Fut>(partitioned: Partitioned<K, O>, i: usize, reconcile: Arc<F>)
where
    K: Key,
    O: Ordering<K>,
    F: Fn(WorkItem<K, O>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let queue: WorkQueue<K, O> = partitioned.queue(i).clone();
    while let Some(item) = queue.get().await {
        let key = item.key().clone();
        // The call is inside the future, so a panic before the first await
        // is caught too. Unwinding drops the item, which ends the lease.
        let work = async { reconcile(item).await };
        if let Err(payload) = AssertUnwindSafe(work).catch_unwind().await {
            partitioned.count_reconcile_panic();
            let requeued = queue.add_rate_limited(key.clone());
            partitioned.report(PartitionPanic {
                source: PanicSource::Reconcile,
                partition: i,
                key,
                message: panic_message(&*payload),
                requeued: Some(requeued),
            });
        }
    }
}

/// The tasks started by [`Partitioned::run`]: shut them down, wait for them,
/// watch the partitions' depths.
///
/// Awaiting the handle is the same as [`join`](Self::join).
#[must_use = "dropping the handle leaves the tasks running; shut them down or await them"]
pub struct PartitionHandle<K, O: Ordering<K> = Priorities> {
    queue: Partitioned<K, O>,
    tasks: Vec<JoinHandle<()>>,
}

impl<K: Key, O: Ordering<K>> PartitionHandle<K, O> {
    /// The queue the tasks consume, to add keys to.
    pub fn queue(&self) -> &Partitioned<K, O> {
        &self.queue
    }

    /// Keys ready now in each partition: see [`Partitioned::depths`].
    pub fn depths(&self) -> Vec<usize> {
        self.queue.depths()
    }

    /// How many times the reconcile function panicked.
    pub fn reconcile_panics(&self) -> u64 {
        self.queue.reconcile_panics()
    }

    /// Shuts the queue down: adds are refused, the keys already ready are
    /// still processed, then the tasks end. Returns at once; await the handle
    /// to wait for them.
    pub fn shutdown(&self) {
        self.queue.shutdown()
    }

    /// Shuts the queue down and waits until every partition has processed
    /// its ready keys and every task has ended.
    pub async fn shutdown_with_drain(self) -> Result<(), JoinError> {
        self.shutdown();
        self.join().await
    }

    /// Whether every task has ended.
    pub fn is_finished(&self) -> bool {
        self.tasks.iter().all(JoinHandle::is_finished)
    }

    /// Waits for every task to end, which happens once the queue is shut
    /// down and drained. The error is the first task that did not end
    /// normally: cancelled (its runtime shut down) or panicked outside the
    /// reconcile function (in a key's `Drop`, say).
    pub async fn join(self) -> Result<(), JoinError> {
        let mut outcome = Ok(());
        for task in self.tasks {
            if let Err(e) = task.await
                && outcome.is_ok()
            {
                outcome = Err(e);
            }
        }
        outcome
    }
}

impl<K: Key, O: Ordering<K>> IntoFuture for PartitionHandle<K, O> {
    type Output = Result<(), JoinError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Result<(), JoinError>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.join())
    }
}

impl<K, O: Ordering<K>> fmt::Debug for PartitionHandle<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let running = self.tasks.iter().filter(|t| !t.is_finished()).count();
        f.debug_struct("PartitionHandle")
            .field("queue", &self.queue)
            .field("tasks_running", &running)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_display_where_and_what() {
        let r = PartitionPanic {
            source: PanicSource::Reconcile,
            partition: 2,
            key: "ns/pod",
            message: "boom".into(),
            requeued: Some(Err(AddError::ShuttingDown)),
        };
        assert_eq!(
            r.to_string(),
            "reconcile of \"ns/pod\" in partition 2 panicked: boom \
             (not requeued: the work queue is shutting down)"
        );
        let r = PartitionPanic {
            source: PanicSource::PartitionFn,
            requeued: None,
            ..r
        };
        assert_eq!(
            r.to_string(),
            "partition function of \"ns/pod\" in partition 2 panicked: boom"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "already called")]
    async fn running_twice_panics() {
        let q = Partitioned::new(2, |k: &usize| *k).unwrap();
        let _first = q.run(|_| async {});
        let _second = q.clone().run(|_| async {});
    }

    #[tokio::test]
    async fn the_handle_is_awaitable_and_ends_after_shutdown() {
        let q = Partitioned::new(2, |k: &usize| *k).unwrap();
        q.add(1).unwrap();
        let handle = q.run(|item| async move { item.done() });
        assert!(format!("{handle:?}").contains("tasks_running"));
        handle.shutdown();
        handle.await.unwrap();
        assert!(q.is_empty());
    }
}
