//! What every handle, lease and timer task of one queue shares: the state
//! behind its lock, and the wake-ups.
//!
//! Every add, hand-out and lease end takes the lock once, briefly, through
//! [`Shared::lock`]: keys are hashed and clocks read before, and tasks are
//! woken, metrics told and forgotten keys dropped after it is released (the
//! [`Locked`] guard collects what the operations under it asked for).
//!
//! An earlier step of this branch let adds and lease ends that found the
//! lock taken push themselves to a lock-free intake for the holder to apply
//! (see the git history: `src/intake.rs`, `tests/loom_intake.rs`). It kept
//! every guarantee, but on a 2-vCPU EPYC VM it made W1 about 40% and W2
//! about half slower than waiting for the lock, and W1's futex calls went
//! from about 0.02 to about 10 per 1,000 items (consumers parked more
//! often, the producer barging in); so it was taken out again.

use crate::Key;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::AddError;
use crate::limiter::RateLimiter;
use crate::metrics::{MetricsHook, Snapshot, Source};
use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::state::{Effects, MAX_DELAY, Popped, Refused, State, When};
use crate::sync::{Arc, Mutex, MutexGuard, Notify};
use crate::throttle::Throttle;

/// The state of one queue and what its operations need beside it.
pub(crate) struct Shared<K, O: Ordering<K>> {
    /// Taken with [`Shared::lock`], never directly.
    state: Mutex<State<K, O>>,
    /// Consumers parked in `get` (in an `Arc` for streams' owned waits).
    pub(crate) consumers: std::sync::Arc<Notify>,
    /// `shutdown_with_drain` and `closed` waiters.
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
    /// bounds (the lease end in `Drop`) can requeue with a delay, and so
    /// that this module need not know the timer's.
    start_timer: StartTimer<K, O>,
}

pub(crate) type StartTimer<K, O> = fn(&Arc<Shared<K, O>>, &mut State<K, O>) -> Result<(), AddError>;

/// What one attempt to take a key found.
pub(crate) enum Take<K> {
    /// A key, and when its lease started if times are tracked.
    Item(Popped<K>, Option<Instant>),
    Empty,
    Closed,
    Throttled(Duration),
}

/// The state, locked. What the operations done under it asked for (wake-ups, metrics, keys to drop) is collected and
/// done when it is dropped, after the lock is released.
pub(crate) struct Locked<'a, K, O: Ordering<K>> {
    shared: &'a Shared<K, O>,
    /// `None` only inside `drop`.
    st: Option<MutexGuard<'a, State<K, O>>>,
    fx: Effects,
    /// The key of a finished lease, dropped outside the lock.
    forgotten: Option<K>,
}

impl<K: Key, O: Ordering<K>> Shared<K, O> {
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
            consumers: std::sync::Arc::new(Notify::new()),
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

impl<K, O: Ordering<K>> Shared<K, O> {
    /// Waits for the lock.
    pub(crate) fn lock(&self) -> Locked<'_, K, O> {
        Locked {
            shared: self,
            st: Some(self.state.lock()),
            fx: Effects::default(),
            forgotten: None,
        }
    }

    /// Starts the queue's timer task if it does not run (see `timer.rs`):
    /// what a delay that is kept needs.
    pub(crate) fn start_timer(self: &Arc<Self>, st: &mut State<K, O>) -> Result<(), AddError> {
        (self.start_timer)(self, st)
    }

    /// A consumer that was counted as parked stops waiting.
    pub(crate) fn unpark(&self) {
        self.lock().parked -= 1;
    }

    /// Whether the queue was shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.lock().is_shutdown()
    }

    /// Refuses further adds, drops delays, and wakes every waiter.
    pub(crate) fn shutdown(&self) {
        let mut st = self.lock();
        let fx = st.shutdown();
        st.merge(fx);
    }

    /// Does what a state change asked for, outside the lock.
    fn apply(&self, mut fx: Effects, wake: u32) {
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

    /// Ends the lease on `slot`, first re-adding the key if `readd` says so
    /// (at `priority`). The requeue is refused after a shutdown, or without
    /// a runtime for its delay; the lease ends whatever happens.
    pub(crate) fn finish(
        self: &Arc<Self>,
        slot: u32,
        lease: u32,
        priority: i32,
        readd: Option<When>,
        now: Option<Instant>,
    ) -> Result<(), AddError> {
        let mut st = self.lock();
        let mut readd = readd.map(|w| (priority, w));
        let mut outcome = Ok(());
        if readd.is_some() && st.is_shutdown() {
            readd = None;
            outcome = Err(AddError::ShuttingDown);
        } else if readd.is_some_and(|(_, w)| w != When::Now)
            && let Err(e) = (self.start_timer)(self, &mut st)
        {
            // No timer to be had: the key comes back now rather than never,
            // and the error tells the caller its delay was not kept.
            readd = readd.map(|(p, _)| (p, When::Now));
            outcome = Err(e);
        }
        st.finish(slot, lease, readd, now);
        outcome
    }
}

impl<K: Key, O: Ordering<K>> Shared<K, O> {
    /// Whether a rate-limited add could go ahead now: the queue is open, and
    /// a delay could be timed (a runtime with time is current, or the timer
    /// task of an earlier one still runs). Asked before the limiter, which counts a
    /// failure each time it is asked, so that a refused add counts none.
    pub(crate) fn can_rate_limit(&self) -> Result<(), AddError> {
        let st = self.lock();
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
        let stamp = now.filter(|_| self.track);
        // The lookup's cache misses start before the lock is taken.
        self.layout.load().prefetch(h);
        let mut st = self.lock();
        if st.is_shutdown() {
            return Err(AddError::ShuttingDown);
        }
        if when != When::Now {
            (self.start_timer)(self, &mut st)?;
        }
        let fx = st.add(key, h, priority, when, stamp).map_err(refused)?;
        st.merge(fx);
        drop(st);
        self.added(retry)
    }

    fn added(&self, retry: bool) -> Result<(), AddError> {
        if retry && let Some(m) = &self.metrics {
            m.retry();
        }
        Ok(())
    }

    /// Takes the next ready key, if any. `park` counts the caller as parked
    /// when there is none (it has registered for a wake-up).
    pub(crate) fn take(&self, park: bool) -> Take<K> {
        let now = self.track.then(Instant::now);
        let mut st = self.lock();
        if st.ready_len() == 0 {
            if st.is_closed() {
                return Take::Closed;
            }
            if park {
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
        st.merge(fx);
        drop(st);
        if let (Some(m), Some(now), Some(ready_at)) = (&self.metrics, now, popped.ready_at) {
            m.handed_out(now.saturating_duration_since(ready_at));
        }
        Take::Item(popped, now)
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.lock();
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

impl<K, O: Ordering<K>> Locked<'_, K, O> {
    /// Records what an operation done under the lock asked for.
    pub(crate) fn merge(&mut self, fx: Effects) {
        self.fx.merge(fx);
    }

    /// Ends the lease on `slot` (see [`State::finish`]), keeping what it
    /// asks for until the lock is released. The caller has already refused
    /// a requeue after a shutdown.
    fn finish(&mut self, slot: u32, lease: u32, readd: Option<(i32, When)>, now: Option<Instant>) {
        let st = self.st.as_mut().expect("locked");
        let (fx, _refused, forgotten) = st.finish(slot, lease, readd, now);
        self.fx.merge(fx);
        // One lease end per guard: a Vec here cost a heap allocation on
        // every lease end that forgets its key.
        debug_assert!(self.forgotten.is_none(), "one lease end per lock");
        self.forgotten = forgotten;
    }
}

impl<K, O: Ordering<K>> Deref for Locked<'_, K, O> {
    type Target = State<K, O>;

    fn deref(&self) -> &State<K, O> {
        self.st.as_ref().expect("locked")
    }
}

impl<K, O: Ordering<K>> DerefMut for Locked<'_, K, O> {
    fn deref_mut(&mut self) -> &mut State<K, O> {
        self.st.as_mut().expect("locked")
    }
}

impl<K, O: Ordering<K>> Drop for Locked<'_, K, O> {
    /// Releases the lock, then does the wake-ups the operations under it
    /// asked for and drops the keys they forgot.
    fn drop(&mut self) {
        let Some(st) = self.st.take() else {
            return;
        };
        let wake = self.fx.wake.min(st.parked as u32);
        let layout = st.layout();
        drop(st);
        self.shared.layout.publish(layout);
        self.shared.apply(std::mem::take(&mut self.fx), wake);
        drop(self.forgotten.take());
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

impl<K, O: Ordering<K>> std::fmt::Debug for Shared<K, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("WorkQueue")
            .field("name", &self.name)
            .field("state", &*st)
            .finish()
    }
}
