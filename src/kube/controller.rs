//! A controller loop: reconcile keys from a queue with bounded concurrency.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use futures_util::{FutureExt, StreamExt};

use crate::ordering::{Ordering, Priorities};
use crate::{AddError, WorkItem, WorkQueue};

/// What a reconcile asks for when it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Action {
    /// Nothing more to do until the key is added again (by a watch event).
    #[default]
    Done,
    /// Reconcile the key again after this delay, at the priority it had.
    RequeueAfter(Duration),
}

impl Action {
    /// [`Action::RequeueAfter`], named as in kube-runtime.
    pub const fn requeue(after: Duration) -> Self {
        Action::RequeueAfter(after)
    }

    /// [`Action::Done`], named as in kube-runtime.
    pub const fn await_change() -> Self {
        Action::Done
    }
}

/// Why a reconcile did not succeed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReconcileError<E> {
    /// The reconcile function returned this error.
    Failed(E),
    /// The reconcile function panicked, with this message.
    Panicked(String),
    /// The reconcile task was cancelled (its runtime is shutting down).
    Cancelled,
}

impl<E: fmt::Display> fmt::Display for ReconcileError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileError::Failed(e) => write!(f, "reconcile failed: {e}"),
            ReconcileError::Panicked(msg) => write!(f, "reconcile panicked: {msg}"),
            ReconcileError::Cancelled => f.write_str("reconcile task was cancelled"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ReconcileError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReconcileError::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// What happened to a key after its reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Requeued {
    /// Not requeued ([`Action::Done`]); its failures were forgotten.
    No,
    /// Requeued after this delay ([`Action::RequeueAfter`]) at its priority;
    /// its failures were forgotten.
    After(Duration),
    /// Requeued after the queue rate limiter's delay, at its priority,
    /// because the reconcile failed or panicked.
    RateLimited,
    /// A requeue was due but the queue refused it (it is shutting down), so
    /// the key is dropped.
    Refused(AddError),
    /// The reconcile task was cancelled; the key's lease ended without a
    /// requeue.
    Lost,
}

/// One reconcile, as reported by [`run_controller`]'s stream.
#[derive(Debug)]
pub struct Reconciled<K, E> {
    /// The key reconciled.
    pub key: K,
    /// The priority the key was handed out with (and requeued with).
    pub priority: i32,
    /// What the reconcile answered.
    pub result: Result<Action, ReconcileError<E>>,
    /// What was done with the key afterwards.
    pub requeued: Requeued,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = T> + Send>>;
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `reconcile` over the keys of `queue`, at most `concurrency` at a
/// time (0 counts as 1), and reports each reconcile as a [`Reconciled`].
///
/// For every key handed out by the queue, `reconcile(key)` runs on its own
/// tokio task, which holds the key's lease until it is finished: the queue
/// never hands the same key out twice at once, and a key added meanwhile
/// comes back once the reconcile is over. Then:
///
/// * `Ok(Action::Done)` forgets the key's failures
///   ([`WorkItem::forget`]);
/// * `Ok(Action::RequeueAfter(d))` forgets them and adds the key again after
///   `d` at the priority it was handed out with;
/// * `Err(e)`, or a panic, adds it again after the queue's rate-limiter delay
///   (counting one more failure), at the same priority. A panic is caught
///   and reported as [`ReconcileError::Panicked`]: the key is not lost.
///
/// The stream ends when the queue is shut down and every key it had was
/// reconciled: after [`WorkQueue::shutdown`] or
/// [`WorkQueue::shutdown_with_drain`] on any clone of the queue, or when the
/// future given to [`ControllerStream::shutdown_on`] completes. It must be
/// polled for reconciles to start. Dropping it starts no more reconciles;
/// those already running finish on their tasks and requeue as usual.
///
/// Must be polled inside a tokio runtime.
///
/// ```
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tokio_workqueue::WorkQueue;
/// use tokio_workqueue::kube::{Action, run_controller};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = WorkQueue::new();
/// for key in ["a", "b", "c"] {
///     queue.add(key.to_string()).unwrap();
/// }
/// let controller = run_controller(queue.clone(), 2, |key: String| async move {
///     println!("reconciling {key}");
///     Ok::<_, std::convert::Infallible>(Action::Done)
/// })
/// // Stop taking new work once everything has been handed out.
/// .shutdown_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
/// let done: Vec<String> = controller.map(|r| r.key).collect().await;
/// assert_eq!(done.len(), 3);
/// # }
/// ```
pub fn run_controller<K, F, Fut, E, O>(
    queue: WorkQueue<K, O>,
    concurrency: usize,
    mut reconcile: F,
) -> ControllerStream<K, E, O>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    F: FnMut(K) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Send + 'static,
    O: Ordering<K>,
{
    let concurrency = concurrency.max(1);
    let results = queue
        .clone()
        .map(move |item: WorkItem<K, O>| {
            let key = item.key().clone();
            let priority = item.priority();
            // Creating the future runs user code too: catch a panic there.
            let future = std::panic::catch_unwind(AssertUnwindSafe(|| reconcile(key.clone())));
            let task = tokio::spawn(reconcile_one(item, future));
            async move {
                match task.await {
                    Ok(reconciled) => reconciled,
                    // reconcile_one catches the reconcile's panics, so this
                    // is a cancelled task (or a panic of the queue itself).
                    Err(join_error) => Reconciled {
                        key,
                        priority,
                        result: Err(if join_error.is_panic() {
                            ReconcileError::Panicked(panic_message(&*join_error.into_panic()))
                        } else {
                            ReconcileError::Cancelled
                        }),
                        requeued: Requeued::Lost,
                    },
                }
            }
        })
        .buffer_unordered(concurrency);
    ControllerStream {
        queue,
        concurrency,
        results: Box::pin(results),
        shutdown_signal: None,
        drain: None,
        results_done: false,
    }
}

async fn reconcile_one<K, O, Fut, E>(
    item: WorkItem<K, O>,
    future: std::thread::Result<Fut>,
) -> Reconciled<K, E>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    O: Ordering<K>,
    Fut: Future<Output = Result<Action, E>>,
{
    let key = item.key().clone();
    let priority = item.priority();
    let result = match future {
        Ok(future) => match AssertUnwindSafe(future).catch_unwind().await {
            Ok(Ok(action)) => Ok(action),
            Ok(Err(error)) => Err(ReconcileError::Failed(error)),
            Err(panic) => Err(ReconcileError::Panicked(panic_message(&*panic))),
        },
        Err(panic) => Err(ReconcileError::Panicked(panic_message(&*panic))),
    };
    let requeued = match &result {
        Ok(Action::Done) => {
            item.forget();
            item.done();
            Requeued::No
        }
        Ok(Action::RequeueAfter(delay)) => {
            item.forget();
            match item.requeue_after(*delay) {
                Ok(()) => Requeued::After(*delay),
                Err(e) => Requeued::Refused(e),
            }
        }
        Err(_) => match item.requeue_rate_limited() {
            Ok(()) => Requeued::RateLimited,
            Err(e) => Requeued::Refused(e),
        },
    };
    Reconciled {
        key,
        priority,
        result,
        requeued,
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// The stream of [`Reconciled`] keys returned by [`run_controller`].
#[must_use = "streams do nothing unless polled"]
pub struct ControllerStream<K, E, O: Ordering<K> = Priorities> {
    queue: WorkQueue<K, O>,
    concurrency: usize,
    results: BoxStream<Reconciled<K, E>>,
    shutdown_signal: Option<BoxFuture>,
    drain: Option<BoxFuture>,
    results_done: bool,
}

impl<K, E, O: Ordering<K>> fmt::Debug for ControllerStream<K, E, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerStream")
            .field("concurrency", &self.concurrency)
            .field("shutdown_signal", &self.shutdown_signal.is_some())
            .field("draining", &self.drain.is_some())
            .field("results_done", &self.results_done)
            .finish_non_exhaustive()
    }
}

impl<K, E, O> ControllerStream<K, E, O>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    O: Ordering<K>,
{
    /// Shuts the queue down gracefully when `signal` completes (for example
    /// `tokio::signal::ctrl_c()`): new adds are refused and delayed keys
    /// dropped, the keys already ready are still reconciled, and the stream
    /// ends once the queue is drained
    /// ([`WorkQueue::shutdown_with_drain`]) and every reconcile finished.
    pub fn shutdown_on<S>(mut self, signal: S) -> Self
    where
        S: Future + Send + 'static,
    {
        self.shutdown_signal = Some(Box::pin(signal.map(|_| ())));
        self
    }

    /// The queue this controller takes keys from.
    pub fn queue(&self) -> &WorkQueue<K, O> {
        &self.queue
    }
}

// Nothing in the stream is pinned in place (its futures are boxed).
impl<K, E, O: Ordering<K>> Unpin for ControllerStream<K, E, O> {}

impl<K, E, O> Stream for ControllerStream<K, E, O>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    O: Ordering<K>,
{
    type Item = Reconciled<K, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let signalled = match &mut this.shutdown_signal {
            Some(signal) => signal.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if signalled {
            this.shutdown_signal = None;
            let queue = this.queue.clone();
            this.drain = Some(Box::pin(async move { queue.shutdown_with_drain().await }));
        }
        let drained = match &mut this.drain {
            Some(drain) => drain.as_mut().poll(cx).is_ready(),
            None => false,
        };
        if drained {
            this.drain = None;
        }
        if !this.results_done {
            match this.results.as_mut().poll_next(cx) {
                Poll::Ready(Some(reconciled)) => return Poll::Ready(Some(reconciled)),
                Poll::Ready(None) => this.results_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        if this.drain.is_some() {
            // Other consumers of the queue still hold keys.
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    }
}
