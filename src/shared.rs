//! What every handle of one queue shares: the [`State`] behind one mutex,
//! and what is done around it.
//!
//! Every add, hand-out and lease end takes that lock once, briefly: keys
//! are hashed and clocks read before it is taken, and tasks are woken and
//! metrics told after it is released ([`Effects`] carries what to do, and
//! [`release`](Shared::release) does it). A consumer that finds nothing
//! ready registers in the state's [`Waiters`](crate::waiters) in that same
//! critical section, and each key that becomes ready wakes one registered
//! consumer, never all of them: a wait costs one lock round to register and
//! one to look again once woken. What a consumer keeps between polls is a
//! [`Wait`], a waiter number and nothing pinned, so a [`WorkQueue`] polled
//! as a stream keeps it inline.
//! [`WorkQueue`](crate::WorkQueue), [`WorkItem`] and the timer task are
//! handles to it.

use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::Instant;

use crate::Key;
use crate::error::AddError;
use crate::item::WorkItem;
use crate::limiter::RateLimiter;
use crate::metrics::{MetricsHook, Snapshot, Source};
use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::state::{Effects, MAX_DELAY, Refused, State, When};
use crate::sync::{Arc, Mutex, MutexGuard, Notify};
use crate::throttle::Throttle;
use crate::waiters::{Found, WaiterId, WakeList};

pub(crate) struct Shared<K, O: Ordering<K>> {
    pub(crate) state: Mutex<State<K, O>>,
    /// Woken at shutdown and when the last key is done: drains and `closed`.
    pub(crate) drained: Notify,
    hasher: hashbrown::DefaultHashBuilder,
    /// Where the key index is, for prefetching outside the lock.
    layout: SharedLayout,
    pub(crate) limiter: Box<dyn RateLimiter<K>>,
    pub(crate) metrics: Option<Box<dyn MetricsHook>>,
    pub(crate) name: String,
    /// Whether ready and lease times are kept (metrics or starvation bound).
    pub(crate) track: bool,
    throttle: Option<Box<dyn Throttle>>,
    /// Starts the timer task; a function pointer so that code without `K`'s
    /// bounds (the lease end in `Drop`) can requeue with a delay.
    pub(crate) start_timer: StartTimer<K, O>,
}

pub(crate) type StartTimer<K, O> = fn(&Arc<Shared<K, O>>, &mut State<K, O>) -> Result<(), AddError>;

/// A consumer's wait for a key, kept between polls (by a `get` future, or
/// by a [`WorkQueue`](crate::WorkQueue) polled as a stream): its place among
/// the waiting consumers, if it has one, and the sleep of a throttled
/// consumer. It holds nothing pinned, so it is kept inline; only a throttle's
/// sleep is boxed (throttles are opt-in, and that sleep is rare).
///
/// A dropped wait must be given to [`Shared::cancel`], which passes on a
/// wake-up it had received (and takes no lock if it was not registered).
#[derive(Debug, Default)]
pub(crate) struct Wait {
    waiter: Option<WaiterId>,
    throttled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<K, O: Ordering<K>> Shared<K, O> {
    pub(crate) fn new(
        state: State<K, O>,
        limiter: Box<dyn RateLimiter<K>>,
        metrics: Option<Box<dyn MetricsHook>>,
        name: String,
        track: bool,
        throttle: Option<Box<dyn Throttle>>,
        start_timer: StartTimer<K, O>,
    ) -> Self {
        Shared {
            state: Mutex::new(state),
            drained: Notify::new(),
            hasher: hashbrown::DefaultHashBuilder::default(),
            layout: SharedLayout::default(),
            limiter,
            metrics,
            name,
            track,
            throttle,
            start_timer,
        }
    }
}

impl<K: Key, O: Ordering<K>> Shared<K, O> {
    /// Whether a rate-limited add could go ahead now: the queue is open, and
    /// a delay could be timed (a runtime with time is current, or the timer
    /// task of an earlier one still runs). Asked before the limiter, which counts a
    /// failure each time it is asked, so that a refused add counts none.
    pub(crate) fn can_rate_limit(&self) -> Result<(), AddError> {
        let st = self.state.lock();
        if st.is_shutdown() {
            return Err(AddError::ShuttingDown);
        }
        let timer_alive = st.timer_running();
        drop(st);
        if timer_alive {
            return Ok(());
        }
        crate::clock::timed_handle().map(drop)
    }

    pub(crate) fn add(
        self: &Arc<Self>,
        key: K,
        priority: i32,
        delay: Duration,
        retry: bool,
    ) -> Result<(), AddError> {
        let h = self.hasher.hash_one(&key);
        let delay = delay.min(MAX_DELAY);
        let now = (self.track || !delay.is_zero()).then(Instant::now);
        let when = match now {
            Some(now) if !delay.is_zero() => When::At(now + delay),
            _ => When::Now,
        };
        // The lookup's cache misses start before the lock is taken.
        self.layout.load().prefetch(h);
        let mut st = self.state.lock();
        if when != When::Now && !st.is_shutdown() {
            (self.start_timer)(self, &mut st)?;
        }
        let fx = st
            .add(key, h, priority, when, now.filter(|_| self.track))
            .map_err(refused)?;
        self.layout.publish(st.layout());
        self.release(st, fx);
        if retry && let Some(m) = &self.metrics {
            m.retry();
        }
        Ok(())
    }

    /// Takes the next ready key, or registers `wait` to be woken when
    /// there may be one (the body of `get` and of the stream).
    ///
    /// Finding nothing and registering are one critical section, so a key
    /// added in between cannot be missed; a registered consumer that is
    /// polled again looks again only if it was notified or keys are ready.
    pub(crate) fn poll_take(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        wait: &mut Wait,
    ) -> Poll<Option<WorkItem<K, O>>> {
        // A consumer that finds nothing looks once more before it
        // registers: releasing and retaking the lock gives a producer on
        // another thread a moment to add, which is much cheaper than a
        // wake-up through the scheduler.
        let mut second_look = wait.waiter.is_none();
        loop {
            if let Some(sleep) = &mut wait.throttled {
                ready!(sleep.as_mut().poll(cx));
                wait.throttled = None;
            }
            let now = self.track.then(Instant::now);
            let mut st = self.state.lock();
            if let Some(id) = wait.waiter {
                match st.waiters.poll(id, cx.waker()) {
                    Found::Waiting if st.ready_len() == 0 => return Poll::Pending,
                    // Keys are ready, though not for this one: it takes one.
                    Found::Waiting => _ = st.waiters.cancel(id),
                    Found::Notified => {}
                }
                wait.waiter = None;
            }
            if st.ready_len() == 0 {
                if st.is_closed() {
                    return Poll::Ready(None);
                }
                if std::mem::take(&mut second_look) {
                    drop(st);
                    continue;
                }
                wait.waiter = Some(st.waiters.register(cx.waker()));
                return Poll::Pending;
            }
            if let Some(throttle) = &self.throttle
                && let Err(pause) = throttle.try_acquire()
            {
                drop(st);
                wait.throttled = Some(Box::pin(tokio::time::sleep(pause)));
                continue;
            }
            let popped = st.pop(now).expect("a ready key");
            let fx = st.closed_effects();
            self.release(st, fx);
            if let (Some(m), Some(now), Some(ready_at)) = (&self.metrics, now, popped.ready_at) {
                m.handed_out(now.saturating_duration_since(ready_at));
            }
            return Poll::Ready(Some(WorkItem::new(
                self.clone(),
                popped.key,
                popped.slot,
                popped.lease,
                popped.priority,
                now,
            )));
        }
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.state.lock();
        let counts = st.counts();
        let starts = st.lease_starts();
        drop(st);
        let now = Instant::now();
        let ran = |at: &Instant| now.saturating_duration_since(*at);
        Snapshot {
            ready_by_priority: counts.ready_by_priority,
            in_flight: counts.leased,
            waiting: counts.waiting,
            unfinished_work: starts.iter().map(ran).sum(),
            longest_running: starts.first().map(ran).unwrap_or_default(),
        }
    }
}

impl<K, O: Ordering<K>> Shared<K, O> {
    /// Releases the lock and does what a state change asked for: consumers
    /// to wake are picked under the lock and woken after it, with the
    /// rest (drain waiters, the timer task, metrics).
    pub(crate) fn release(&self, mut st: MutexGuard<'_, State<K, O>>, mut fx: Effects) {
        let mut wake = WakeList::default();
        if fx.wake_all {
            st.waiters.notify_all(&mut wake);
        } else {
            st.waiters.notify(fx.wake, &mut wake);
        }
        drop(st);
        wake.wake();
        if fx.wake_all {
            self.drained.notify_waiters();
        }
        if let Some(w) = fx.timer_waker.take() {
            w.wake();
        }
        if let Some(m) = &self.metrics {
            for _ in 0..fx.added {
                m.add();
            }
        }
    }

    /// Ends a wait that stops before it got a key (a dropped `get` or
    /// stream): unregisters it, and passes a wake-up it had received, but
    /// not used, to the next waiting consumer.
    pub(crate) fn cancel(&self, wait: &mut Wait) {
        wait.throttled = None;
        let Some(id) = wait.waiter.take() else {
            return;
        };
        let mut st = self.state.lock();
        let pass_on = st.waiters.cancel(id) && st.ready_len() > 0;
        let fx = Effects {
            wake: u32::from(pass_on),
            ..Effects::default()
        };
        self.release(st, fx);
    }
}

pub(crate) fn refused(r: Refused) -> AddError {
    match r {
        Refused::ShuttingDown => AddError::ShuttingDown,
    }
}

impl<K: Key, O: Ordering<K>> Source for Shared<K, O> {
    fn snapshot(&self) -> Snapshot {
        Shared::snapshot(self)
    }
}

impl<K, O: Ordering<K>> Drop for Shared<K, O> {
    fn drop(&mut self) {
        if let Some(task) = self.state.get_mut().timer_task.take() {
            task.abort();
        }
    }
}
