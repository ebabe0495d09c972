//! What every handle of one queue shares: the [`State`] behind one mutex,
//! and what is done around it.
//!
//! Every add, hand-out and lease end takes that lock once, briefly: keys
//! are hashed and clocks read before it is taken, and tasks are woken and
//! metrics told after it is released ([`Effects`] carries what to do). A
//! consumer that finds nothing ready parks on a `Notify`, and each key that
//! becomes ready wakes one parked consumer, never all of them: the state
//! counts parked consumers, and a consumer is counted from the look that
//! parks it to the look after its wake-up, so a park costs two lock rounds.
//! [`WorkQueue`](crate::WorkQueue), [`WorkItem`] and the timer task are
//! handles to it.

use std::hash::BuildHasher;
use std::pin::pin;
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
use crate::sync::{Arc, Mutex, Notify};
use crate::throttle::Throttle;

pub(crate) struct Shared<K, O: Ordering<K>> {
    pub(crate) state: Mutex<State<K, O>>,
    consumers: Notify,
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

/// What one attempt to take a key found.
pub(crate) enum Take<K: Key, O: Ordering<K>> {
    Item(WorkItem<K, O>),
    Empty,
    Closed,
    Throttled(Duration),
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
            consumers: Notify::new(),
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
        let wake = fx.wake.min(st.parked as u32);
        let layout = st.layout();
        drop(st);
        self.layout.publish(layout);
        self.apply(fx, wake);
        if retry && let Some(m) = &self.metrics {
            m.retry();
        }
        Ok(())
    }

    /// Waits for the next ready key and leases it (the body of `get`):
    /// `Look::First` looks before registering for a wake-up, `Look::Park`
    /// registers first (the caller has just looked).
    ///
    /// A consumer that parks costs two lock rounds, not four: the look that
    /// parks it is the one made after registering for a wake-up (a stream
    /// that just found nothing skips the look before it), and the look
    /// after the wake-up also counts it as no longer parked.
    pub(crate) async fn wait(self: &Arc<Self>, mut look: Look) -> Option<WorkItem<K, O>> {
        loop {
            if look == Look::First {
                match self.take(Look::First) {
                    Take::Item(item) => return Some(item),
                    Take::Closed => return None,
                    Take::Throttled(wait) => {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    Take::Empty => {}
                }
            }
            // Register for a wake-up before looking again, so a key added
            // between the two looks cannot be missed.
            let mut notified = pin!(self.consumers.notified());
            notified.as_mut().enable();
            let mut parked = Parked(Some(&**self));
            match self.take(Look::Park) {
                Take::Empty => {}
                other => {
                    // Not parked after all: the look did not count it.
                    parked.0 = None;
                    look = Look::First;
                    match other {
                        Take::Item(item) => return Some(item),
                        Take::Closed => return None,
                        Take::Throttled(wait) => {
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                        Take::Empty => unreachable!("matched above"),
                    }
                }
            }
            notified.await;
            // The look after the wake-up unparks in the same critical
            // section; if it is cancelled first, `parked` does it.
            parked.0 = None;
            look = Look::First;
            match self.take(Look::Woken) {
                Take::Item(item) => return Some(item),
                Take::Closed => return None,
                Take::Throttled(wait) => tokio::time::sleep(wait).await,
                Take::Empty => {}
            }
        }
    }

    pub(crate) fn take(self: &Arc<Self>, look: Look) -> Take<K, O> {
        let now = self.track.then(Instant::now);
        let mut st = self.state.lock();
        if look == Look::Woken {
            st.parked -= 1;
        }
        if st.ready_len() == 0 {
            if st.is_closed() {
                return Take::Closed;
            }
            if look == Look::Park {
                st.parked += 1;
            }
            return Take::Empty;
        }
        if let Some(throttle) = &self.throttle
            && let Err(wait) = throttle.try_acquire()
        {
            return Take::Throttled(wait);
        }
        let popped = st.pop(now).expect("a ready key");
        let fx = st.closed_effects();
        drop(st);
        self.apply(fx, 0);
        if let (Some(m), Some(now), Some(ready_at)) = (&self.metrics, now, popped.ready_at) {
            m.handed_out(now.saturating_duration_since(ready_at));
        }
        Take::Item(WorkItem::new(
            self.clone(),
            popped.key,
            popped.slot,
            popped.lease,
            popped.priority,
            now,
        ))
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
    /// Does what a state change asked for, outside the lock.
    pub(crate) fn apply(&self, mut fx: Effects, wake: u32) {
        if fx.wake_all {
            self.consumers.notify_waiters();
            self.drained.notify_waiters();
        } else {
            for _ in 0..wake {
                self.consumers.notify_one();
            }
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

/// Which look at the ready keys a consumer makes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Before registering for a wake-up: finding nothing changes nothing.
    First,
    /// Registered: finding nothing counts the consumer as parked, so adds
    /// know whom to wake.
    Park,
    /// Woken (or the wake-up passed on): no longer parked, whatever it finds.
    Woken,
}

/// Uncounts a parked consumer whose wait is dropped before its next look
/// (a cancelled `get`, a dropped stream); `None` once that look is made.
struct Parked<'a, K, O: Ordering<K>>(Option<&'a Shared<K, O>>);

impl<K, O: Ordering<K>> Drop for Parked<'_, K, O> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            shared.state.lock().parked -= 1;
        }
    }
}
