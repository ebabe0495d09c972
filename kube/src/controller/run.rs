//! The running controller: triggers in, reconciles out, one stream.
//!
//! [`Runner`] is the stream [`Controller::run`](super::Controller::run)
//! returns. Each poll moves everything along, in this order: shutdown
//! signals; triggers become queue adds; once the store's first list is
//! complete, free workers take keys from the queue; finished reconciles are
//! settled (requeued or forgotten) and reported. Keys wait in the queue, not
//! in a channel or a task, until a worker is free, so they come out by
//! priority, then FIFO, even when every worker is busy.
//!
//! Reconciles run on their own tokio tasks, as in kube-runtime, but the
//! key's lease stays with the runner: the key is settled before its lease
//! ends, so it can never be handed out twice at once. Dropping the stream
//! aborts the tasks in flight and ends their leases.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_workqueue::Key;

use futures_core::Stream;
use futures_util::future::{self, BoxFuture};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt, TryFuture, TryFutureExt};
use kube_client::Resource;
use kube_runtime::controller::{Action, Error, ReconcileReason};
use kube_runtime::reflector::{ObjectRef, Store};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{ControllerError, RunResult};
use super::reasons::Reasons;
use super::replication::{Check, Replication, Stop};
use super::settings::requeue_after;
use super::triggers::{Trigger, TriggerStream};
use crate::WatchPriorities;
use tokio_workqueue::ordering::Ordering;
use tokio_workqueue::partition::panic_message;
use tokio_workqueue::{AddError, AddOpts, Partitioned, WorkItem, WorkQueue};

/// How many trigger events one poll takes before it lets the rest of the
/// stream (and the runtime) have a turn.
const TRIGGER_BUDGET: usize = 256;

/// Picks a key's partition.
pub(crate) type PartitionFn<K> = Arc<dyn Fn(&K) -> usize + Send + Sync>;

/// What the controller hands keys out of: the queue's partitions (one
/// unless [`partition_by`](super::Controller::partition_by) asked for more).
pub(crate) struct Work<K, O: Ordering<K>> {
    pub(crate) queues: Partitioned<K, O>,
    /// One key at a time per partition, in queue order (`partition_by`).
    pub(crate) one_at_a_time: bool,
}

impl<K: Key, O: Ordering<K>> Work<K, O> {
    /// Each queue to take keys from, with how many may be in flight from it.
    fn sources(&self, concurrency: usize) -> Vec<Pull<K, O>> {
        let limit = if self.one_at_a_time { 1 } else { concurrency };
        (0..self.queues.partitions())
            .map(|i| Pull {
                queue: self.queues.queue(i).clone(),
                limit,
                in_flight: 0,
                ended: false,
            })
            .collect()
    }
}

/// One queue the runner takes keys from.
struct Pull<K, O: Ordering<K>> {
    queue: WorkQueue<K, O>,
    limit: usize,
    in_flight: usize,
    ended: bool,
}

/// Settings fixed when the controller starts.
pub(crate) struct Settings {
    pub(crate) priorities: WatchPriorities,
    pub(crate) concurrency: usize,
    pub(crate) debounce: Duration,
    pub(crate) reconcile_timeout: Option<Duration>,
    #[cfg(feature = "prometheus")]
    pub(crate) metrics: Option<super::metrics::Recorder>,
}

/// How a reconcile ended.
enum Outcome<E> {
    Done(Result<Action, E>),
    Panicked(String),
    TimedOut(Duration),
    /// The task was cancelled (its runtime is shutting down).
    Cancelled,
    /// Cancelled after the leadership it started under ended and the
    /// fencing grace ran out.
    Fenced,
}

/// A reconcile that ended, with the lease on its key.
struct Finished<K: Resource, O: Ordering<ObjectRef<K>>, E> {
    item: WorkItem<ObjectRef<K>, O>,
    object: Arc<K>,
    source: usize,
    outcome: Outcome<E>,
    took: Duration,
    /// The priority the reconcile chose for its requeue
    /// ([`set_requeue_priority`](crate::set_requeue_priority)).
    chosen: Option<i32>,
}

/// Aborts the reconcile task when the runner drops it.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking triggers and keys.
    Running,
    /// Graceful shutdown: no more triggers or delayed keys; the keys already
    /// ready are still reconciled.
    Draining,
    /// No new reconciles; those in flight finish.
    Stopping,
}

/// The stream returned by [`Controller::run`](super::Controller::run).
#[must_use = "streams do nothing unless polled"]
pub struct Runner<K, O, Ctx, Rec, Pol, Fut>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    O: Ordering<ObjectRef<K>>,
    Fut: TryFuture,
    Fut::Error: 'static,
{
    triggers: Option<TriggerStream<K>>,
    work: Work<ObjectRef<K>, O>,
    pulls: Vec<Pull<ObjectRef<K>, O>>,
    store: Store<K>,
    ready: Option<BoxFuture<'static, ()>>,
    in_flight: FuturesUnordered<BoxFuture<'static, Finished<K, O, Fut::Error>>>,
    out: VecDeque<RunResult<K, Fut::Error>>,
    /// Why each queued key was queued.
    reasons: Reasons,
    graceful: Option<BoxFuture<'static, ()>>,
    forceful: Option<BoxFuture<'static, ()>>,
    phase: Phase,
    /// Which keys this replica queues and reconciles, and when.
    replication: Replication<K>,
    settings: Settings,
    reconciler: Rec,
    error_policy: Pol,
    context: Arc<Ctx>,
}

impl<K, O, Ctx, Rec, Pol, Fut> fmt::Debug for Runner<K, O, Ctx, Rec, Pol, Fut>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    O: Ordering<ObjectRef<K>>,
    Fut: TryFuture,
    Fut::Error: 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("phase", &self.phase)
            .field("store_ready", &self.ready.is_none())
            .field("in_flight", &self.in_flight.len())
            .field("concurrency", &self.settings.concurrency)
            .finish_non_exhaustive()
    }
}

// Every future and stream inside is boxed.
impl<K, O, Ctx, Rec, Pol, Fut> Unpin for Runner<K, O, Ctx, Rec, Pol, Fut>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash,
    O: Ordering<ObjectRef<K>>,
    Fut: TryFuture,
    Fut::Error: 'static,
{
}

impl<K, O, Ctx, Rec, Pol, Fut> Runner<K, O, Ctx, Rec, Pol, Fut>
where
    K: Clone + Resource + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + fmt::Debug + Send + Sync + Unpin + 'static,
    O: Ordering<ObjectRef<K>>,
    Ctx: Send + Sync + 'static,
    Rec: FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    Pol: Fn(Arc<K>, &Fut::Error, Arc<Ctx>) -> Action,
    Fut: TryFuture<Ok = Action> + Send + 'static,
    Fut::Error: std::error::Error + Send + 'static,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        triggers: TriggerStream<K>,
        work: Work<ObjectRef<K>, O>,
        store: Store<K>,
        graceful: Option<BoxFuture<'static, ()>>,
        forceful: Option<BoxFuture<'static, ()>>,
        settings: Settings,
        reconciler: Rec,
        error_policy: Pol,
        context: Arc<Ctx>,
    ) -> Self {
        let pulls = work.sources(settings.concurrency);
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &settings.metrics {
            let slots = pulls.iter().map(|p| p.limit).sum();
            metrics.max_concurrent(slots);
        }
        let waiting = store.clone();
        Runner {
            triggers: Some(triggers),
            work,
            pulls,
            store,
            ready: Some(
                async move {
                    // A writer dropped before the first list completed (the
                    // main watcher ended, or a shutdown dropped it) leaves
                    // the store empty for good: its keys are not missing,
                    // they were never listed. Hand none out, so they are
                    // not reported as `ObjectNotFound`; a shutdown then ends
                    // the stream with them unreconciled.
                    if waiting.wait_until_ready().await.is_err() {
                        future::pending::<()>().await;
                    }
                }
                .boxed(),
            ),
            in_flight: FuturesUnordered::new(),
            out: VecDeque::new(),
            reasons: Reasons::default(),
            graceful,
            forceful,
            phase: Phase::Running,
            replication: Replication::Single,
            settings,
            reconciler,
            error_policy,
            context,
        }
    }

    /// Starts no reconcile before every one of `gates` resolved too (the
    /// caches of a manager, besides the main store).
    pub(crate) fn gated(mut self, gates: Vec<BoxFuture<'static, ()>>) -> Self {
        if !gates.is_empty() {
            let store = self.ready.take();
            self.ready = Some(
                async move {
                    future::join_all(gates).await;
                    if let Some(store) = store {
                        store.await;
                    }
                }
                .boxed(),
            );
        }
        self
    }

    /// Queues and reconciles only what `replication` lets this replica.
    pub(crate) fn replicated(mut self, replication: Replication<K>) -> Self {
        self.replication = replication;
        self
    }

    /// Reports `error` and ends: the controller could not start.
    pub(crate) fn failed(mut self, error: ControllerError) -> Self {
        self.out.push_back(Err(Error::QueueError(error)));
        self.shut_down(Phase::Stopping);
        self
    }

    /// Stops taking triggers; `stop` also stops taking keys.
    fn shut_down(&mut self, phase: Phase) {
        if self.phase == Phase::Running || phase == Phase::Stopping {
            self.phase = phase;
        }
        self.triggers = None;
        self.work.queues.shutdown();
        tracing::debug!(phase = ?self.phase, "controller shutting down");
    }

    fn poll_signals(&mut self, cx: &mut Context<'_>) {
        if let Some(forceful) = &mut self.forceful
            && forceful.as_mut().poll(cx).is_ready()
        {
            self.forceful = None;
            self.shut_down(Phase::Stopping);
        }
        if let Some(graceful) = &mut self.graceful
            && graceful.as_mut().poll(cx).is_ready()
        {
            self.graceful = None;
            self.shut_down(Phase::Draining);
        }
    }

    /// Follows the replication gate: keys gained in a shard hand-over and
    /// cleared are queued at the priority of re-listed objects, behind
    /// live changes.
    fn poll_replication(&mut self, cx: &mut Context<'_>) {
        let Some(resharded) = self.replication.poll(cx, &self.store) else {
            return;
        };
        for key in &resharded.lost {
            self.reasons.take(key);
        }
        let opts = AddOpts::default().priority(self.settings.priorities.unchanged);
        for key in resharded.cleared {
            if self.work.queues.add_with(key.clone(), opts).is_ok() {
                let reason = ReconcileReason::Custom {
                    reason: "gained in a shard hand-over".to_string(),
                };
                self.reasons.queued(&key, reason);
            }
        }
    }

    /// Turns pending triggers into adds; tells whether it stopped early
    /// with triggers left.
    fn poll_triggers(&mut self, cx: &mut Context<'_>) -> bool {
        for _ in 0..TRIGGER_BUDGET {
            let Some(triggers) = &mut self.triggers else {
                return false;
            };
            match triggers.poll_next_unpin(cx) {
                Poll::Pending => return false,
                // Like kube-runtime: when the triggers end, shut down
                // gracefully.
                Poll::Ready(None) => {
                    self.shut_down(Phase::Draining);
                    return false;
                }
                Poll::Ready(Some(Err(error))) => {
                    tracing::warn!(%error, "watcher error");
                    self.out
                        .push_back(Err(Error::QueueError(ControllerError::Watcher(error))));
                }
                Poll::Ready(Some(Ok(trigger))) => self.enqueue(trigger),
            }
        }
        true
    }

    fn enqueue(&mut self, trigger: Trigger<K>) {
        let Trigger {
            key,
            source,
            reason,
        } = trigger;
        // Another replica's key: its owner has the same trigger.
        if !self.replication.queues(&key) {
            return;
        }
        let opts = AddOpts::default()
            .priority(source.priority(&self.settings.priorities))
            .after(self.settings.debounce);
        // A refused add means the controller is shutting down: the trigger
        // has nowhere to go, as in kube-runtime.
        if self.work.queues.add_with(key.clone(), opts).is_ok() {
            self.reasons.triggered(&key, reason);
        }
    }

    /// Starts reconciles while workers are free.
    fn poll_work(&mut self, cx: &mut Context<'_>) {
        if self.phase == Phase::Stopping {
            return;
        }
        if let Some(ready) = &mut self.ready {
            if ready.as_mut().poll(cx).is_pending() {
                return;
            }
            tracing::debug!("store is ready, starting reconciles");
            self.ready = None;
        }
        // A follower, or a fenced replica, keeps its keys queued for when
        // it leads or renews.
        if !self.replication.may_reconcile() {
            return;
        }
        for source in 0..self.pulls.len() {
            loop {
                let pull = &mut self.pulls[source];
                if pull.ended || pull.in_flight >= pull.limit {
                    break;
                }
                match pull.queue.poll_next_unpin(cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => pull.ended = true,
                    Poll::Ready(Some(item)) => {
                        match self.replication.check(item.key()) {
                            Check::Start => {}
                            Check::NotOurs => {
                                // Its new owner reconciles it.
                                self.reasons.take(item.key());
                                item.forget();
                                continue;
                            }
                            // Queued again once cleared.
                            Check::Parked => continue,
                        }
                        if self.start(source, item) {
                            self.pulls[source].in_flight += 1;
                        }
                    }
                }
            }
        }
    }

    /// Starts a reconcile of `item`'s key; tells whether it did.
    fn start(&mut self, source: usize, item: WorkItem<ObjectRef<K>, O>) -> bool {
        let key = item.key();
        let reason = self.reasons.take(key).unwrap_or(ReconcileReason::Unknown);
        let Some(object) = self.store.get(key) else {
            // kube-runtime's rule: cleanup of a deleted object goes through
            // finalizers, so a key whose object has left the store is
            // reported, not reconciled.
            let missing = Box::new(key.clone().erase());
            item.forget();
            self.out.push_back(Err(Error::ObjectNotFound(missing)));
            return false;
        };
        let span = tracing::info_span!(
            "reconciling object",
            "object.ref" = %key,
            object.reason = %reason,
        );
        let made = {
            let _entered = span.enter();
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                (self.reconciler)(object.clone(), self.context.clone())
            }))
        };
        let timeout = self.settings.reconcile_timeout;
        let stop = self.replication.started(key);
        let finished: BoxFuture<'static, Finished<K, O, Fut::Error>> = match made {
            Ok(future) => {
                let mut task = AbortOnDrop(tokio::spawn(
                    super::requeue_priority::scoped(run_one(
                        TryFutureExt::into_future(future),
                        timeout,
                        stop,
                    ))
                    .instrument(span),
                ));
                async move {
                    let ((outcome, took), chosen) = match (&mut task.0).await {
                        Ok(ended) => ended,
                        Err(e) if e.is_panic() => (
                            (
                                Outcome::Panicked(panic_message(&*e.into_panic())),
                                Duration::ZERO,
                            ),
                            None,
                        ),
                        Err(_) => ((Outcome::Cancelled, Duration::ZERO), None),
                    };
                    Finished {
                        item,
                        object,
                        source,
                        outcome,
                        took,
                        chosen,
                    }
                }
                .boxed()
            }
            // Making the future ran user code too, and it panicked.
            Err(panic) => std::future::ready(Finished {
                item,
                object,
                source,
                outcome: Outcome::Panicked(panic_message(&*panic)),
                took: Duration::ZERO,
                chosen: None,
            })
            .boxed(),
        };
        self.in_flight.push(finished);
        true
    }

    /// Settles a finished reconcile: requeue or forget, then report.
    fn settle(&mut self, finished: Finished<K, O, Fut::Error>) {
        let Finished {
            item,
            object,
            source,
            outcome,
            took,
            chosen,
        } = finished;
        let item = match chosen {
            Some(priority) => item.with_priority(priority),
            None => item,
        };
        self.pulls[source].in_flight -= 1;
        let key = item.key().clone();
        self.replication.ended(&key);
        // A success's action, read once (reading it formats its `Debug`
        // text): for the metrics' result label and for the requeue.
        let delay = match &outcome {
            Outcome::Done(Ok(action)) => requeue_after(action),
            _ => Ok(None),
        };
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.settings.metrics {
            metrics.finished(outcome_label(&outcome, &delay), took);
        }
        #[cfg(not(feature = "prometheus"))]
        let _ = took;
        let report = match outcome {
            Outcome::Done(Ok(action)) => {
                // Success forgets the key's failures (kube-rs#1916).
                item.forget();
                match delay {
                    Ok(None) => Ok((key, action)),
                    Ok(Some(delay)) => {
                        match item.requeue_after(delay) {
                            Ok(()) => {
                                self.note_retry(&key, ReconcileReason::ReconcilerRequestedRetry);
                            }
                            // The reconcile still succeeded: kube-runtime
                            // reports it as such, so the refusal comes as a
                            // report of its own, as after an error.
                            Err(error) => self.out.push_back(refused(key.clone(), error)),
                        }
                        Ok((key, action))
                    }
                    Err(text) => self.unreadable(item, &key, text),
                }
            }
            Outcome::Done(Err(error)) => {
                let action = (self.error_policy)(object, &error, self.context.clone());
                match requeue_after(&action) {
                    // The error policy asked for nothing: wait for a change.
                    Ok(None) => {}
                    Ok(Some(delay)) => {
                        if let Err(e) = item.requeue_rate_limited_after(delay) {
                            self.out.push_back(refused(key.clone(), e));
                        } else {
                            self.note_retry(&key, ReconcileReason::ErrorPolicyRequestedRetry);
                        }
                    }
                    Err(text) => {
                        let report = self.unreadable(item, &key, text);
                        self.out.push_back(report);
                    }
                }
                Err(Error::ReconcilerFailed(error, Box::new(key.erase())))
            }
            Outcome::Panicked(message) => {
                tracing::error!(object.ref = %key, panic.message = %message, "reconcile panicked");
                self.retry_failed(item, &key);
                Err(Error::QueueError(ControllerError::ReconcilePanicked {
                    object: Box::new(key.erase()),
                    message,
                }))
            }
            Outcome::TimedOut(after) => {
                tracing::warn!(object.ref = %key, ?after, "reconcile timed out");
                self.retry_failed(item, &key);
                Err(Error::QueueError(ControllerError::ReconcileTimedOut {
                    object: Box::new(key.erase()),
                    after,
                }))
            }
            Outcome::Cancelled => {
                self.retry_failed(item, &key);
                return;
            }
            Outcome::Fenced => {
                tracing::warn!(object.ref = %key, "reconcile cancelled: no longer leading, or the key's shard moved");
                // Not the key's fault: back in the queue as it was, for
                // when this replica leads again (a key another replica
                // owns now is dropped when it comes out).
                if let Err(error) = item.requeue() {
                    self.out.push_back(refused(key.clone(), error));
                }
                Err(Error::QueueError(ControllerError::ReconcileFenced {
                    object: Box::new(key.erase()),
                }))
            }
        };
        self.out.push_back(report);
    }

    /// Requeues a key whose reconcile failed without an error value (panic,
    /// timeout): through the rate limiter, as an error.
    fn retry_failed(&mut self, item: WorkItem<ObjectRef<K>, O>, key: &ObjectRef<K>) {
        match item.requeue_rate_limited() {
            Ok(()) => self.note_retry(key, ReconcileReason::ErrorPolicyRequestedRetry),
            Err(error) => self.out.push_back(refused(key.clone(), error)),
        }
    }

    fn unreadable(
        &mut self,
        item: WorkItem<ObjectRef<K>, O>,
        key: &ObjectRef<K>,
        action: String,
    ) -> RunResult<K, Fut::Error> {
        tracing::error!(object.ref = %key, %action, "could not read the action; requeued with backoff");
        self.retry_failed(item, key);
        Err(Error::QueueError(ControllerError::UnreadableAction {
            object: Box::new(key.clone().erase()),
            action,
        }))
    }

    fn note_retry(&mut self, key: &ObjectRef<K>, reason: ReconcileReason) {
        self.reasons.retried(key, reason);
    }

    /// Whether the run is over: shut down, nothing in flight, and (when
    /// draining) every queue handed out all it had.
    fn finished(&self) -> bool {
        self.phase != Phase::Running
            && self.in_flight.is_empty()
            && (self.phase == Phase::Stopping
                || self.ready.is_some()
                || self.pulls.iter().all(|p| p.ended)
                // A follower's or a fenced replica's queued keys are the
                // others' to reconcile.
                || !self.replication.may_reconcile())
    }
}

fn refused<K: Resource, E>(key: ObjectRef<K>, error: AddError) -> RunResult<K, E> {
    Err(Error::QueueError(ControllerError::RequeueRefused {
        object: Box::new(key.erase()),
        error,
    }))
}

/// Runs one reconcile to its end, catching a panic and applying the
/// timeout and the [`Stop`], if any (then it ends as `Fenced`).
async fn run_one<F, E>(
    future: F,
    timeout: Option<Duration>,
    stop: Option<Stop>,
) -> (Outcome<E>, Duration)
where
    F: std::future::Future<Output = Result<Action, E>>,
{
    let Some(stop) = stop else {
        return run_timed(future, timeout).await;
    };
    if !stop.holds() {
        return (Outcome::Fenced, Duration::ZERO);
    }
    let stop = stop.ended();
    let started = Instant::now();
    let work = std::pin::pin!(run_timed(future, timeout));
    let stop = std::pin::pin!(stop);
    match future::select(work, stop).await {
        future::Either::Left((done, _)) => done,
        future::Either::Right(((), _)) => (Outcome::Fenced, started.elapsed()),
    }
}

/// Runs one reconcile to its end, catching a panic and applying the
/// timeout.
async fn run_timed<F, E>(future: F, timeout: Option<Duration>) -> (Outcome<E>, Duration)
where
    F: std::future::Future<Output = Result<Action, E>>,
{
    let started = Instant::now();
    let caught = AssertUnwindSafe(future).catch_unwind();
    let ended = match timeout {
        Some(limit) => match tokio::time::timeout(limit, caught).await {
            Ok(ended) => ended,
            Err(_) => return (Outcome::TimedOut(limit), started.elapsed()),
        },
        None => caught.await,
    };
    let outcome = match ended {
        Ok(result) => Outcome::Done(result),
        Err(panic) => Outcome::Panicked(panic_message(&*panic)),
    };
    (outcome, started.elapsed())
}

/// The result label of `outcome`; `delay` is its action's requeue, read.
#[cfg(feature = "prometheus")]
fn outcome_label<E>(
    outcome: &Outcome<E>,
    delay: &Result<Option<Duration>, String>,
) -> super::metrics::Result {
    use super::metrics::Result as R;
    match outcome {
        Outcome::Done(Ok(_)) => match delay {
            Ok(None) => R::Success,
            Ok(Some(_)) => R::RequeueAfter,
            Err(_) => R::Error,
        },
        Outcome::Done(Err(_)) | Outcome::Cancelled | Outcome::Fenced => R::Error,
        Outcome::TimedOut(_) => R::Timeout,
        Outcome::Panicked(_) => R::Panic,
    }
}

impl<K, O, Ctx, Rec, Pol, Fut> Stream for Runner<K, O, Ctx, Rec, Pol, Fut>
where
    K: Clone + Resource + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash + fmt::Debug + Send + Sync + Unpin + 'static,
    O: Ordering<ObjectRef<K>>,
    Ctx: Send + Sync + 'static,
    Rec: FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    Pol: Fn(Arc<K>, &Fut::Error, Arc<Ctx>) -> Action,
    Fut: TryFuture<Ok = Action> + Send + 'static,
    Fut::Error: std::error::Error + Send + 'static,
{
    type Item = RunResult<K, Fut::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        this.poll_replication(cx);
        this.poll_signals(cx);
        let triggers_left = this.poll_triggers(cx);
        if triggers_left {
            // Come back after the others had a turn.
            cx.waker().wake_by_ref();
        }
        loop {
            // Keys are handed out only once every trigger at hand is
            // queued, so a change that came right behind a long list is
            // not beaten by the list's first keys.
            if !triggers_left {
                this.poll_work(cx);
            }
            let mut settled = false;
            while let Poll::Ready(Some(finished)) = this.in_flight.poll_next_unpin(cx) {
                this.settle(finished);
                settled = true;
            }
            // Settling freed workers: take more keys before reporting.
            if !settled {
                break;
            }
        }
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &this.settings.metrics {
            metrics.active_workers(this.in_flight.len());
        }
        if let Some(item) = this.out.pop_front() {
            return Poll::Ready(Some(item));
        }
        if this.finished() {
            // Hand the Lease over before ending, so failover is immediate.
            return this.replication.poll_release(cx).map(|()| None);
        }
        Poll::Pending
    }
}
