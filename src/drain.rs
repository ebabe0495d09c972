//! Draining a queue with a say over its delayed keys, and a report of what
//! did not run.
//!
//! [`WorkQueue::shutdown_with_drain`] drops every key waiting on a delay (a
//! delayed add, or a retry a worker asked for with `requeue_rate_limited`)
//! without telling anyone. [`WorkQueue::drain`] does the same shutdown, but
//! can keep the delays that fall due soon enough (and run them), gives back
//! the keys whose delays it dropped, and can give up after a timeout,
//! reporting what was left.

use crate::Key;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::ordering::{Ordering, Priorities};
use crate::shared::Shared;
use crate::state::MAX_DELAY;
use crate::sync::Arc;
use crate::{WorkItem, WorkQueue};

/// A shutdown that drains the queue, configured before it is awaited:
/// returned by [`WorkQueue::drain`].
///
/// Awaiting it shuts the queue down (adds and requeues are refused from then
/// on), drops the delayed keys it was not told to wait for, and resolves,
/// with a [`DrainReport`], once nothing is ready, leased or (kept) waiting,
/// or when its [`timeout`](Self::timeout) runs out.
///
/// ```
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tokio_workqueue::WorkQueue;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue = WorkQueue::new();
/// queue.add_after("soon", Duration::from_millis(200)).unwrap();
/// queue.add_after("later", Duration::from_secs(60)).unwrap();
/// let workers = tokio::spawn(queue.clone().for_each_concurrent(4, |item| async move {
///     println!("ran {}", item.key());
/// }));
///
/// let report = queue
///     .drain()
///     .wait_for_delayed_within(Duration::from_secs(1)) // "soon" runs
///     .await;
/// assert_eq!(report.dropped, ["later"]); // persist or log these
/// workers.await.unwrap();
/// # }
/// ```
#[must_use = "a drain does nothing until it is awaited"]
pub struct Drain<K, O: Ordering<K> = Priorities> {
    queue: WorkQueue<K, O>,
    keep: Keep,
    timeout: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
enum Keep {
    None,
    All,
    Within(Duration),
}

/// What a [`Drain`] did not run.
///
/// Keys appear in no particular order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DrainReport<K> {
    /// Keys whose delay the shutdown dropped: delayed adds and retries due
    /// later than the drain was told to wait. They will not run. A key
    /// leased at the shutdown with a retry pending is here too (its lease
    /// ends normally, its retry is dropped).
    pub dropped: Vec<K>,
    /// Whether the [`timeout`](Drain::timeout) ran out before the queue
    /// drained.
    pub timed_out: bool,
    /// On a timeout, the keys that were ready and never handed out: taken
    /// out of the queue, so they will not run after being reported either.
    pub not_handed_out: Vec<K>,
    /// On a timeout, leases still running, and kept delays still waiting
    /// (these keys are still in the queue and may yet run).
    pub in_flight: usize,
    /// See [`in_flight`](Self::in_flight).
    pub waiting: usize,
}

impl<K> DrainReport<K> {
    /// Whether every key the queue had accepted ran: nothing dropped,
    /// nothing left at a timeout.
    pub fn is_complete(&self) -> bool {
        self.dropped.is_empty() && !self.timed_out
    }
}

impl<K: Key, O: Ordering<K>> WorkQueue<K, O> {
    /// A drain to configure and await: shuts the queue down as
    /// [`shutdown_with_drain`](Self::shutdown_with_drain) does, and reports
    /// the keys it did not run.
    ///
    /// By default it drops every delayed key, as `shutdown_with_drain` does,
    /// but hands them back in [`DrainReport::dropped`].
    /// [`wait_for_delayed`](Drain::wait_for_delayed) runs them instead, and
    /// [`wait_for_delayed_within`](Drain::wait_for_delayed_within) runs
    /// those due soon enough. Either way new adds, and requeues of keys
    /// that run during the drain, are refused (the requeue returns
    /// [`AddError::ShuttingDown`](crate::AddError::ShuttingDown)), so the
    /// drain ends.
    ///
    /// Like `shutdown_with_drain`, it needs consumers taking keys until the
    /// end: with none left and keys ready it would wait forever, so give it
    /// a [`timeout`](Drain::timeout) when that can happen. If the queue was
    /// already shut down, the keys that shutdown dropped are not reported.
    pub fn drain(&self) -> Drain<K, O> {
        Drain {
            queue: self.clone(),
            keep: Keep::None,
            timeout: None,
        }
    }
}

impl<K: Key, O: Ordering<K>> Drain<K, O> {
    /// Keeps every delayed key and waits for it to fall due and run, however
    /// far off its delay ends (up to [`crate::MAX_DELAY`]).
    pub fn wait_for_delayed(mut self) -> Self {
        self.keep = Keep::All;
        self
    }

    /// Keeps the delayed keys due within `within` from the drain's start,
    /// and waits for them to run; drops and reports the others.
    pub fn wait_for_delayed_within(mut self, within: Duration) -> Self {
        self.keep = Keep::Within(within.min(MAX_DELAY));
        self
    }

    /// Stops waiting after `limit`: the keys still ready are taken out of
    /// the queue and reported in [`DrainReport::not_handed_out`], with
    /// counts of the leases still running and the delays still waiting.
    /// Needs a runtime with time.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    async fn run(self) -> DrainReport<K> {
        let Drain {
            queue,
            keep,
            timeout,
        } = self;
        let keep_until = match keep {
            Keep::None => None,
            Keep::All => Some(Instant::now() + MAX_DELAY),
            Keep::Within(within) => Some(Instant::now() + within),
        };
        let mut report = DrainReport {
            dropped: shut_down(&queue, keep_until),
            timed_out: false,
            not_handed_out: Vec::new(),
            in_flight: 0,
            waiting: 0,
        };
        let Some(limit) = timeout else {
            queue.shutdown_with_drain().await;
            return report;
        };
        if tokio::time::timeout(limit, queue.shutdown_with_drain())
            .await
            .is_ok()
        {
            return report;
        }
        report.timed_out = true;
        // What is ready now, and nothing that becomes ready later.
        while let Some(item) = queue.shared.take_ready() {
            report.not_handed_out.push(WorkItem::into_key(item));
        }
        let snapshot = queue.snapshot();
        report.in_flight = snapshot.in_flight;
        report.waiting = snapshot.waiting;
        report
    }
}

/// Shuts `queue` down, keeping the delays due by `keep_until`; returns the
/// keys of those dropped.
fn shut_down<K: Key, O: Ordering<K>>(
    queue: &WorkQueue<K, O>,
    keep_until: Option<Instant>,
) -> Vec<K> {
    let mut dropped = Vec::new();
    let shared: &Arc<Shared<K, O>> = &queue.shared;
    // Kept delays need a timer task: the one that timed them may have gone
    // with its runtime. Without a timer to be had here they could never
    // fire, so they are dropped and reported instead.
    let keep_until =
        keep_until.filter(|_| shared.is_shutting_down() || (shared.start_timer)(shared).is_ok());
    shared.shut_down(keep_until, &mut |k: &K| dropped.push(k.clone()));
    dropped
}

impl<K: Key, O: Ordering<K>> IntoFuture for Drain<K, O> {
    type Output = DrainReport<K>;
    type IntoFuture = Pin<Box<dyn Future<Output = DrainReport<K>> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

impl<K, O: Ordering<K>> fmt::Debug for Drain<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("keep", &self.keep)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}
