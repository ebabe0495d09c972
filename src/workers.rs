//! A worker loop that survives panics: [`WorkQueue::run`].
//!
//! `queue.for_each_concurrent(n, f)` is a plain stream combinator: a panic
//! in one job unwinds through it and ends the whole loop, dropping the other
//! jobs in flight (their leases end as if they had succeeded) and stranding
//! the queued keys, and a later drain then waits forever. `run` catches each
//! job's panic instead, as a failed attempt of that key alone.

use crate::Key;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use futures_util::StreamExt;

use crate::catch::{finish, start};
use crate::ordering::{Ordering, Priorities};
use crate::{AddError, WorkItem, WorkQueue};

type PanicHook<K> = Arc<dyn Fn(&WorkerPanic<K>) + Send + Sync>;

/// A worker loop to configure, then start with [`run`](Self::run): returned
/// by [`WorkQueue::workers`].
#[must_use = "workers do nothing until `run` is called and its future awaited"]
pub struct Workers<K, O: Ordering<K> = Priorities> {
    queue: WorkQueue<K, O>,
    concurrency: usize,
    on_panic: Option<PanicHook<K>>,
}

/// A panic [`WorkQueue::run`] caught in a job, as told to
/// [`Workers::on_panic`].
///
/// Displays as `job "ns/a" panicked: message`, with ` (not requeued: ...)`
/// when the retry was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerPanic<K> {
    /// The key whose job panicked.
    pub key: K,
    /// The priority it was handed out with, and requeued at.
    pub priority: i32,
    /// The panic's message (`"Box<dyn Any>"` when the payload is not a
    /// string).
    pub message: String,
    /// Whether the retry (rate limited, at `priority`) was accepted: refused
    /// once the queue is shutting down, like any add.
    pub requeued: Result<(), AddError>,
}

impl<K: fmt::Debug> fmt::Display for WorkerPanic<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job {:?} panicked: {}", self.key, self.message)?;
        if let Err(e) = &self.requeued {
            write!(f, " (not requeued: {e})")?;
        }
        Ok(())
    }
}

/// What a [`WorkQueue::run`] did, once the queue was shut down and drained.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport<K> {
    /// Jobs run: keys handed to the function.
    pub jobs: u64,
    /// Jobs that panicked. (The queue's metrics count their retries as
    /// retries; the hook has no event for panics, so they are counted here.)
    pub panics: u64,
    /// Keys whose job panicked and whose retry was refused (the queue was
    /// shutting down): they did not complete and will not run again.
    pub not_requeued: Vec<K>,
}

impl<K: Key, O: Ordering<K>> WorkQueue<K, O> {
    /// Runs `job` on up to `concurrency` keys at once until the queue is
    /// shut down and drained, surviving panics: the loop to use in place of
    /// `queue.for_each_concurrent(n, job)`.
    ///
    /// `job` owns each [`WorkItem`] as it would there, and ends its lease
    /// the same ways: [`succeed`](WorkItem::succeed) on success, a
    /// `requeue*` on an error, or a drop (which counts as success). A panic
    /// in `job`, or in the future it returns, is caught as a failed attempt
    /// of that key alone: its lease ends, the key is added again rate
    /// limited at the priority it was handed out with (so a key that always
    /// panics backs off instead of spinning), and the panic is counted in
    /// the [`RunReport`] and told to [`Workers::on_panic`]'s hook. The other
    /// jobs go on.
    ///
    /// The future resolves once the queue is shut down and nothing is left
    /// to hand out (see [`shutdown_with_drain`](Self::shutdown_with_drain)
    /// and [`drain`](Self::drain)), after every job has ended. A
    /// `concurrency` of 0 is taken as 1. Each job costs one clone of its
    /// key, kept to requeue it after a panic. A panic is only caught when
    /// built with `panic = "unwind"`, Rust's default.
    ///
    /// Like `for_each_concurrent`, the loop polls every job from the one
    /// task that awaits it, so the jobs share one thread at a time. For
    /// jobs that wait (on an API server, say) that is what you want: the
    /// queue's hand-outs then stay on one core, which, with many quick
    /// keys, beat consumers spread over cores whenever moving a cache line
    /// between cores was slow (measured with `for_each_concurrent`, the
    /// same shape: `PERFORMANCE.md` in the crate's sources). Jobs that
    /// compute for long should `tokio::spawn` their work, or several loops
    /// run on spawned tasks.
    ///
    /// A producer that adds many keys in one poll (a loop over a listed
    /// page, a periodic resync of every key) should yield now and then,
    /// `tokio::task::yield_now().await` every few hundred adds. Its first
    /// add wakes the loop, and tokio runs a task woken from a worker
    /// thread next on that same thread (its "LIFO slot", which the other
    /// workers do not take tasks from), so the loop waits until the
    /// producer yields while the other cores may idle. In the crate's W1
    /// benchmark (a million adds in one loop, the keys worked by
    /// `for_each_concurrent(4, ..)`, two worker threads) a yield every 256
    /// adds made the whole run 1.32x faster.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use tokio_workqueue::WorkQueue;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// for job in 0..10_u32 {
    ///     queue.add(job).unwrap();
    /// }
    /// let done = Arc::new(AtomicU32::new(0));
    /// let workers = tokio::spawn(queue.run(4, {
    ///     let done = done.clone();
    ///     move |item| {
    ///         let done = done.clone();
    ///         async move {
    ///             if *item == 3 && item.num_requeues() == 0 {
    ///                 panic!("job 3 fails on its first attempt");
    ///             }
    ///             done.fetch_add(1, Ordering::Relaxed);
    ///             item.succeed();
    ///         }
    ///     }
    /// }));
    /// while done.load(Ordering::Relaxed) < 10 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    /// }
    /// queue.shutdown_with_drain().await;
    /// let report = workers.await.unwrap();
    /// assert_eq!((report.jobs, report.panics), (11, 1)); // job 3 ran twice
    /// # }
    /// ```
    pub fn run<F, Fut>(
        &self,
        concurrency: usize,
        job: F,
    ) -> impl Future<Output = RunReport<K>> + use<K, O, F, Fut>
    where
        F: FnMut(WorkItem<K, O>) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.workers(concurrency).run(job)
    }

    /// A worker loop to configure (a panic hook) before it is run: see
    /// [`run`](Self::run).
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// queue.add("ns/a").unwrap();
    /// let workers = queue
    ///     .workers(8)
    ///     .on_panic(|p| eprintln!("{p}")) // job "ns/a" panicked: boom
    ///     .run(|_item| async { panic!("boom") });
    /// let workers = tokio::spawn(workers);
    /// queue.shutdown_with_drain().await;
    /// let report = workers.await.unwrap();
    /// assert_eq!(report.panics, 1);
    /// # }
    /// ```
    pub fn workers(&self, concurrency: usize) -> Workers<K, O> {
        Workers {
            queue: self.clone(),
            concurrency: concurrency.max(1),
            on_panic: None,
        }
    }
}

impl<K: Key, O: Ordering<K>> Workers<K, O> {
    /// Calls `hook` with each panic caught, from the task running the loop.
    /// A panic in the hook itself is swallowed.
    pub fn on_panic(mut self, hook: impl Fn(&WorkerPanic<K>) + Send + Sync + 'static) -> Self {
        self.on_panic = Some(Arc::new(hook));
        self
    }

    /// Starts the loop: see [`WorkQueue::run`].
    pub fn run<F, Fut>(self, mut job: F) -> impl Future<Output = RunReport<K>> + use<K, O, F, Fut>
    where
        F: FnMut(WorkItem<K, O>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let Workers {
            queue,
            concurrency,
            on_panic,
        } = self;
        async move {
            let mut report = RunReport {
                jobs: 0,
                panics: 0,
                not_requeued: Vec::new(),
            };
            let handle = queue.clone();
            // buffer_unordered takes a key only while fewer than
            // `concurrency` jobs run, as for_each_concurrent does.
            let mut outcomes = queue
                .map(|item| finish(&handle, start(item, &mut job)))
                .buffer_unordered(concurrency);
            while let Some(outcome) = outcomes.next().await {
                report.jobs += 1;
                let Some(caught) = outcome else { continue };
                report.panics += 1;
                let panic = WorkerPanic {
                    key: caught.key,
                    priority: caught.priority,
                    message: caught.message,
                    requeued: caught.requeued,
                };
                if let Some(hook) = &on_panic {
                    let _ = catch_unwind(AssertUnwindSafe(|| hook(&panic)));
                }
                if panic.requeued.is_err() {
                    report.not_requeued.push(panic.key);
                }
            }
            report
        }
    }
}

impl<K, O: Ordering<K>> fmt::Debug for Workers<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workers")
            .field("concurrency", &self.concurrency)
            .field("on_panic", &self.on_panic.is_some())
            .finish_non_exhaustive()
    }
}
