//! The lease on a key: a guard that ends it on every path.

use crate::Key;
use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::AddError;
use crate::nodes::KeyRef;
use crate::ordering::{Ordering, Priorities};
use crate::shared::{Holder, Shared, refused};
use crate::state::{Effects, MAX_DELAY, When};
use crate::sync::Arc;

/// A key leased to one consumer.
///
/// While it lives, no other consumer is handed the same key; adds of the key
/// are remembered and it comes back once the lease ends. The lease ends when
/// the item is dropped, whatever the path: [`done`](Self::done), a `requeue`,
/// an early return or a panic. So a worker cannot forget to mark a key done.
///
/// Beware: a dropped item counts as a success. An early `?` return, a
/// cancelled future or a panic ends the lease without a retry, so a job that
/// must not be lost on those paths needs a requeue on them, or
/// [`WorkQueue::run`](crate::WorkQueue::run), which retries a panicked key.
/// Neither `done` nor a drop resets the key's backoff:
/// [`succeed`](Self::succeed) does.
///
/// The item reads its key where the queue keeps it: a hand-out copies no
/// key, and the key stays in place until the lease ends.
///
/// `O` is the queue's [`Ordering`], as in [`WorkQueue<K, O>`](crate::WorkQueue).
///
/// ```
/// use tokio_workqueue::WorkQueue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = WorkQueue::new();
/// queue.add("ns/a".to_string()).unwrap();
/// let item = queue.get().await.unwrap();
/// assert_eq!(item.key(), "ns/a");
/// queue.add("ns/a".to_string()).unwrap(); // leased: it comes back later
/// assert!(queue.is_empty());
/// item.done();
/// assert_eq!(queue.len(), 1);
/// # }
/// ```
// In declared order: the pointers first, the lease start (whose
// nanoseconds are the niche that `Option<WorkItem>` and `Poll` use) last.
// In the order Rust chose, the niche came third, and a consumer's copies
// of a handed-out item split the pointers across two stores, so reading
// the key could not take it from them and waited for every pending store
// to reach the cache: W1 and W1-100k ran 3-4 % faster in this order on an
// Intel VM.
#[repr(C)]
pub struct WorkItem<K, O: Ordering<K> = Priorities> {
    shared: Arc<Holder<K, O>>,
    /// The key where its shard keeps it, which the lease keeps in place.
    key: KeyRef<K>,
    /// The shard the key is in.
    shard: u32,
    slot: u32,
    /// The lease's entry in the queue's lease-time table.
    lease: u32,
    priority: i32,
    ended: bool,
    /// Lease start, when the queue tracks times.
    started: Option<Instant>,
}

impl<K: Key, O: Ordering<K>> WorkItem<K, O> {
    pub(crate) fn new(
        shared: Arc<Holder<K, O>>,
        key: KeyRef<K>,
        shard: u32,
        slot: u32,
        lease: u32,
        priority: i32,
        started: Option<Instant>,
    ) -> Self {
        WorkItem {
            shared,
            key,
            shard,
            slot,
            lease,
            priority,
            started,
            ended: false,
        }
    }

    /// The leased key.
    pub fn key(&self) -> &K {
        self.key_ref()
    }

    /// The priority the key was handed out with.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Makes this lease's requeues go in at `priority` instead of the
    /// priority the key was handed out with (a controller whose reconciler
    /// chooses how urgent its retry is). Dropping the item, or
    /// [`done`](Self::done), adds nothing, whatever the priority.
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue: WorkQueue<&str> = WorkQueue::new();
    /// queue.add("a").unwrap();
    /// let item = queue.get().await.unwrap();
    /// item.with_priority(-10).requeue().unwrap();
    /// assert_eq!(queue.get().await.unwrap().priority(), -10);
    /// # }
    /// ```
    #[must_use]
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Ends the lease. The same as dropping the item.
    ///
    /// The rate limiter still remembers the key's failures, so its next
    /// rate-limited requeue backs off further: call
    /// [`succeed`](Self::succeed) (or [`forget`](Self::forget)) on success.
    pub fn done(self) {}

    /// Adds the key again, ready now at the priority it was handed out with,
    /// then ends the lease. After a shutdown the add is refused (the lease
    /// still ends) and the error says so.
    pub fn requeue(mut self) -> Result<(), AddError> {
        self.end(Some(When::Now), false)
    }

    /// Adds the key again after `delay`, at the priority it was handed out
    /// with, then ends the lease. Zero means now; long delays are clamped to
    /// [`MAX_DELAY`].
    ///
    /// After a shutdown the requeue is refused ([`AddError::ShuttingDown`])
    /// and the key is dropped. On a runtime without a timer
    /// ([`AddError::NoRuntime`]) the key is not lost: it is ready again now,
    /// at its priority, and the error says its delay was not kept.
    pub fn requeue_after(mut self, delay: Duration) -> Result<(), AddError> {
        let when = self.when(delay);
        self.end(Some(when), false)
    }

    /// Adds the key again after the rate limiter's delay for it (counting a
    /// failure and a retry), then ends the lease.
    ///
    /// After a shutdown the requeue is refused ([`AddError::ShuttingDown`]),
    /// the key dropped and no failure counted. Without a tokio runtime with
    /// time ([`AddError::NoRuntime`]) no failure is counted either, and the
    /// key is ready again now, as with [`requeue_after`](Self::requeue_after).
    pub fn requeue_rate_limited(self) -> Result<(), AddError> {
        self.requeue_rate_limited_after(Duration::ZERO)
    }

    /// Adds the key again after the longer of `at_least` and the rate
    /// limiter's delay for it (counting a failure and a retry), then ends
    /// the lease: an error policy's delay that never undercuts the per-key
    /// backoff.
    ///
    /// Refused like [`requeue_rate_limited`](Self::requeue_rate_limited).
    pub fn requeue_rate_limited_after(mut self, at_least: Duration) -> Result<(), AddError> {
        // Refused before the limiter records a failure for nothing; the
        // lease still ends.
        if let Err(e) = self.shared.can_rate_limit() {
            let now = (e == AddError::NoRuntime).then_some(When::Now);
            return self.end(now, false).and(Err(e));
        }
        let delay = self.shared.limiter.when(self.key()).max(at_least);
        let when = self.when(delay);
        self.end(Some(when), true)
    }

    /// Forgets the rate limiter's failures for this key, as after a success.
    pub fn forget(&self) {
        self.shared.limiter.forget(self.key())
    }

    /// How many rate-limited requeues this key had since it was last
    /// forgotten.
    pub fn num_requeues(&self) -> u32 {
        self.shared.limiter.num_requeues(self.key())
    }

    fn when(&self, delay: Duration) -> When {
        let delay = delay.min(MAX_DELAY);
        if delay.is_zero() {
            When::Now
        } else {
            When::At(Instant::now() + delay)
        }
    }
}

impl<K, O: Ordering<K>> WorkItem<K, O> {
    /// The key, where its shard keeps it.
    ///
    /// Every path that ends the lease (`end`) takes the item by value or
    /// drops it, and reads no key after: the key is only read from a lease
    /// that has not ended.
    fn key_ref(&self) -> &K {
        debug_assert!(!self.ended, "a key read after its lease ended");
        // SAFETY: the lease has not ended (above).
        unsafe { self.key.get() }
    }

    fn end(&mut self, readd: Option<When>, retry: bool) -> Result<(), AddError> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        let shared: &Arc<Shared<K, O>> = &self.shared;
        let now = self.started.map(|_| Instant::now());
        let mut readd = readd.map(|w| (self.priority, w));
        let mut outcome = Ok(());
        if readd.is_some_and(|(_, w)| w != When::Now)
            && !shared.is_shutting_down()
            && let Err(e) = (shared.start_timer)(shared)
        {
            // No timer to be had: the key comes back now rather than never,
            // and the error tells the caller its delay was not kept.
            readd = readd.map(|(p, _)| (p, When::Now));
            outcome = Err(e);
        }
        let shard = self.shard as usize;
        let mut st = shared.shards[shard].state.lock();
        // A shutdown refuses requeues from the moment it begins, as adds.
        if readd.is_some() && shared.is_shutting_down() {
            readd = None;
            outcome = Err(AddError::ShuttingDown);
        }
        let mut fx = Effects::default();
        let (finished, forgotten) = st.finish(self.slot, self.lease, readd, now, &mut fx);
        let outcome = outcome.and(finished.map_err(refused));
        shared.release(shard, st, &mut fx);
        drop(forgotten);
        self.report_done(now);
        if retry
            && outcome.is_ok()
            && let Some(m) = &shared.metrics
        {
            m.retry();
        }
        outcome
    }

    fn report_done(&self, now: Option<Instant>) {
        if let (Some(m), Some(start), Some(now)) = (&self.shared.metrics, self.started, now) {
            m.done(now.saturating_duration_since(start));
        }
    }
}

impl<K, O: Ordering<K>> Deref for WorkItem<K, O> {
    type Target = K;

    fn deref(&self) -> &K {
        self.key_ref()
    }
}

impl<K, O: Ordering<K>> Drop for WorkItem<K, O> {
    fn drop(&mut self) {
        let _ = self.end(None, false);
    }
}

impl<K: fmt::Debug, O: Ordering<K>> fmt::Debug for WorkItem<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkItem")
            .field("key", self.key_ref())
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}
