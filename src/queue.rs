//! The queue handle: adds, hand-outs and shutdown.
//!
//! A [`WorkQueue`] is a cheap handle to the queue's [`Shared`] state (see
//! `shared.rs` for the shards and the wake-ups, `take.rs` for a consumer's
//! side of them); as a [`Stream`] it keeps the wait of a consumer that
//! found nothing ready, inline: a waiter number, nothing boxed.

use crate::Key;
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;

use crate::error::AddError;
use crate::item::WorkItem;
use crate::limiter::RateLimiter;
use crate::metrics::{MetricsHook, Probe, Snapshot, Source};
use crate::options::{AddOpts, Lane};
use crate::ordering::{Ordering, Priorities};
use crate::shard::MAX_SHARDS;
use crate::shared::{Holder, Shared};
use crate::state::State;
use crate::sync::Arc;
use crate::take::Wait;
use crate::throttle::Throttle;
use crate::timer;

/// A de-duplicating, stingy, fair work queue of keys.
///
/// Producers [`add`](Self::add) keys; consumers take leased [`WorkItem`]s with
/// [`get`](Self::get) or by using the queue as a [`Stream`]. A key added many
/// times before it is taken is handed out once; a key is never leased to two
/// consumers at once, and one added while leased comes back after its lease
/// ends. See the [crate docs](crate) for the full semantics.
///
/// Cloning is cheap, and every clone is a handle to the same queue:
/// consumers on clones compete for keys, each key going to one of them
/// (they do not each get every key).
///
/// The second type parameter is the queue's [`Ordering`]: which ready key is
/// handed out next. The default, [`Priorities`], hands out the highest
/// priority first, FIFO within a priority; [`Builder::ordering`](crate::Builder::ordering) picks
/// another (for example [`FairShare`](crate::FairShare) across tenants).
///
/// ```
/// use futures::StreamExt;
/// use tokio_workqueue::WorkQueue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = WorkQueue::new();
/// queue.add("default/web").unwrap();
/// queue.add("default/web").unwrap(); // de-duplicated
/// queue.add("default/db").unwrap();
/// queue.shutdown(); // the stream ends once the ready keys are handed out
///
/// let seen: Vec<String> = queue
///     .map(|item| item.key().to_string()) // dropping the item ends its lease
///     .collect()
///     .await;
/// assert_eq!(seen, ["default/web", "default/db"]);
/// # }
/// ```
pub struct WorkQueue<K, O: Ordering<K> = Priorities> {
    pub(crate) shared: Arc<Holder<K, O>>,
    /// The wait this handle is in when polled as a stream.
    wait: Wait,
}

impl<K: Key, O: Ordering<K>> WorkQueue<K, O> {
    pub(crate) fn from_builder(
        name: String,
        limiter: Box<dyn RateLimiter<K>>,
        metrics: Option<Box<dyn MetricsHook>>,
        starvation_bound: Option<Duration>,
        throttle: Option<Box<dyn Throttle>>,
        ordering: O,
        shards: usize,
    ) -> Self {
        let track = metrics.is_some() || starvation_bound.is_some();
        // Keys older than half the bound are served first, oldest first: the
        // other half is headroom for a backlog of such keys to drain.
        let promote_after = starvation_bound.map(|b| b / 2);
        // Only an ordering whose order the lanes can keep is split (see
        // `shard`).
        let shards = shards.clamp(1, MAX_SHARDS).next_power_of_two();
        let others: Option<Vec<O>> = (1..shards).map(|_| ordering.split()).collect();
        let states = std::iter::once(ordering)
            .chain(others.unwrap_or_default())
            .map(|order| State::new(track, promote_after, order))
            .collect();
        let shared = Arc::new(Shared::new(
            states,
            promote_after,
            limiter,
            metrics,
            name,
            track,
            throttle,
            timer::ensure_running::<K, O>,
        ));
        if let Some(m) = &shared.metrics {
            let weak: std::sync::Weak<Shared<K, O>> = Arc::downgrade(&shared);
            let source: std::sync::Weak<dyn Source> = weak;
            m.bind(&shared.name, Probe { source });
        }
        WorkQueue {
            shared: Holder::new(shared),
            wait: Wait::default(),
        }
    }

    /// The name given to [`Builder::name`](crate::Builder::name) (empty by default).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Makes `key` ready now, at priority 0.
    ///
    /// A key that is already ready stays where it is; one waiting on a delay
    /// becomes ready now; one that is leased comes back once its lease ends.
    /// Refused with [`AddError::ShuttingDown`] after a shutdown.
    pub fn add(&self, key: K) -> Result<(), AddError> {
        self.shared.add(key, 0, Duration::ZERO, false)
    }

    /// Makes `key` ready after `delay` on tokio's clock (so paused-time tests
    /// are exact, to the millisecond the timer wheel works in).
    ///
    /// If the key is already waiting, the earlier ready time wins. A zero
    /// delay means now; delays beyond [`MAX_DELAY`](crate::MAX_DELAY) are clamped to it. Needs
    /// a tokio runtime with time enabled, else [`AddError::NoRuntime`] (from
    /// a plain thread, enter a runtime's handle first: see there).
    pub fn add_after(&self, key: K, delay: Duration) -> Result<(), AddError> {
        self.shared.add(key, 0, delay, false)
    }

    /// Makes `key` ready after the rate limiter's delay for it, and counts a
    /// retry.
    ///
    /// Needs a tokio runtime, like every delayed add, even when the limiter
    /// would answer "now": without one it returns [`AddError::NoRuntime`], and
    /// a refused add (also after shutdown) counts no failure in the limiter.
    pub fn add_rate_limited(&self, key: K) -> Result<(), AddError> {
        self.add_with(key, AddOpts::default().rate_limited())
    }

    /// Adds `key` in `lane`: a convenience for [`Lane::priority`].
    pub fn add_to_lane(&self, key: K, lane: Lane) -> Result<(), AddError> {
        self.shared.add(key, lane.priority(), Duration::ZERO, false)
    }

    /// Adds `key` with a priority, a delay and a rate limit in one call.
    ///
    /// When the key is already pending, the higher priority and the earlier
    /// ready time win; a ready key raised to a higher priority moves to the
    /// back of its new level.
    pub fn add_with(&self, key: K, opts: AddOpts) -> Result<(), AddError> {
        let mut delay = opts.after;
        if opts.rate_limited {
            // Refused before the limiter records a failure for nothing.
            self.shared.can_rate_limit()?;
            delay = delay.max(self.shared.limiter.when(&key));
        }
        self.shared
            .add(key, opts.priority, delay, opts.rate_limited)
    }

    /// Forgets the rate limiter's failures for `key`.
    pub fn forget(&self, key: &K) {
        self.shared.limiter.forget(key)
    }

    /// How many rate-limited adds `key` had since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.shared.limiter.num_requeues(key)
    }

    /// How many shards the queue splits its keys into: what
    /// [`Builder::shards`](crate::Builder::shards) asked for, rounded up to
    /// a power of two and at most 64, or 1 if the queue's ordering cannot be
    /// split.
    pub fn shards(&self) -> usize {
        self.shared.shards.len()
    }

    /// The shard `key` goes to (below [`shards`](Self::shards)): for tests
    /// that need keys in different shards. Which shard a key goes to is
    /// not part of the API, and differs from one process to the next.
    #[doc(hidden)]
    pub fn shard_of(&self, key: &K) -> usize {
        self.shared.shard_of_key(key)
    }

    /// Keys ready to be handed out now: not delayed, not leased.
    pub fn len(&self) -> usize {
        self.shared.ready_len()
    }

    /// Whether no key is ready now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue's gauges now: depth by priority, keys in flight and waiting.
    ///
    /// Lease times are only kept when the queue has metrics or a starvation
    /// bound; otherwise the two durations are zero. The depth by priority is
    /// then also not kept as keys come and go, but counted by walking every
    /// key's slot: O(keys) under the shards' locks, one shard at a time.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Waits for the next ready key and leases it.
    ///
    /// Returns `None` once the queue is shut down and has nothing more to
    /// hand out. Cancel safe: dropping the future at any point loses no key,
    /// and a wake-up it had received passes to another consumer.
    ///
    /// A `get` polled once (say with `now_or_never`) may be pending while a
    /// key is ready, if another thread holds the lock of that key's shard
    /// right then: rather than park its thread on the lock, it wakes its
    /// own task and takes the key at its next poll.
    ///
    /// Taking a key spends one unit of tokio's
    /// [co-operative budget](tokio::task::coop), as receiving from a tokio
    /// channel does (the stream's `poll_next` too). So a consumer that
    /// always finds a key, say one whose reconcile requeues its key at once,
    /// still yields to the other tasks of its thread every so often (128
    /// keys in tokio 1.x) instead of holding the thread until the queue is
    /// empty; a `get` whose task has spent its budget is pending, and the
    /// task is polled again once the thread's other tasks had their turn.
    /// [`tokio::task::coop::unconstrained`] opts a consumer out. Outside a
    /// tokio runtime (say under `futures::executor::block_on`) the budget
    /// is not counted.
    pub async fn get(&self) -> Option<WorkItem<K, O>> {
        Get {
            shared: &self.shared,
            wait: Wait::default(),
        }
        .await
    }

    /// Refuses new adds and drops keys waiting on delays (and their timers).
    /// Keys already ready, and keys re-added while leased, are still handed
    /// out; then `get` returns `None` and streams end.
    pub fn shutdown(&self) {
        self.shared.shut_down(None, &mut |_| {});
    }

    /// Shuts down as [`shutdown`](Self::shutdown) does, then waits until
    /// nothing is ready and nothing is leased.
    ///
    /// Unlike client-go's, this waits for queued keys too, not only for those
    /// in flight, so it needs consumers to keep taking keys: with none left
    /// and keys ready, it waits forever.
    ///
    /// Keys waiting on a delay, retries from `requeue_rate_limited`
    /// included, are dropped without a word. [`drain`](Self::drain) runs
    /// them or hands them back, and can time out with a report of what was
    /// left: prefer it where a lost key matters.
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        loop {
            let mut drained = pin!(self.shared.drained.notified());
            drained.as_mut().enable();
            if self.shared.is_drained() {
                return;
            }
            drained.await;
        }
    }

    /// Resolves once [`shutdown`](Self::shutdown) (or
    /// [`shutdown_with_drain`](Self::shutdown_with_drain)) has been called,
    /// at once if it already was. Lets a task that feeds the queue stop when
    /// the queue stops taking keys.
    pub async fn closed(&self) {
        loop {
            // Shutdown wakes every drain waiter, so this shares their Notify.
            let mut woken = pin!(self.shared.drained.notified());
            woken.as_mut().enable();
            if self.is_shutting_down() {
                return;
            }
            woken.await;
        }
    }

    /// Whether [`shutdown`](Self::shutdown) or
    /// [`shutdown_with_drain`](Self::shutdown_with_drain) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.is_shutting_down()
    }
}

impl<K, O: Ordering<K>> Clone for WorkQueue<K, O> {
    fn clone(&self) -> Self {
        // A holder of its own: its leases count on it (see `Holder`).
        WorkQueue {
            shared: Holder::new(Arc::clone(&**self.shared)),
            wait: Wait::default(),
        }
    }
}

impl<K, O: Ordering<K>> fmt::Debug for WorkQueue<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("WorkQueue");
        f.field("name", &self.shared.name);
        for shard in self.shared.shards.iter() {
            f.field("shard", &*shard.state.lock());
        }
        f.finish()
    }
}

impl<K: Key, O: Ordering<K>> Stream for WorkQueue<K, O> {
    type Item = WorkItem<K, O>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WorkItem<K, O>>> {
        let this = self.get_mut();
        this.shared.poll_take(cx, &mut this.wait)
    }
}

impl<K, O: Ordering<K>> Drop for WorkQueue<K, O> {
    fn drop(&mut self) {
        // A stream dropped while it waits passes on a wake-up it received.
        self.shared.cancel(&mut self.wait);
    }
}

/// The future of [`WorkQueue::get`]: a [`Wait`] and the queue it waits on.
struct Get<'a, K, O: Ordering<K>> {
    shared: &'a Arc<Holder<K, O>>,
    wait: Wait,
}

impl<K: Key, O: Ordering<K>> Future for Get<'_, K, O> {
    type Output = Option<WorkItem<K, O>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.shared.poll_take(cx, &mut this.wait)
    }
}

impl<K, O: Ordering<K>> Drop for Get<'_, K, O> {
    fn drop(&mut self) {
        self.shared.cancel(&mut self.wait);
    }
}
