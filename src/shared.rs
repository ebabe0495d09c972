//! What every handle, lease and timer task of one queue shares: the state
//! behind its lock, the intake beside it, and the wake-ups.
//!
//! # The lock and the intake
//!
//! The [`State`] is behind one mutex, but only hand-outs and readers (`len`,
//! snapshots, drains, the timer task) ever wait for it. An immediate add, a
//! lease end and an immediate requeue first *try* the lock: if it is free
//! they apply themselves at once; if not they push themselves to the
//! [`Intake`] and return, and whoever holds the lock applies them. Every
//! holder applies the intake when it takes the lock (so it acts on every
//! operation that completed before it started) and again before it lets go
//! (see [`Locked`]'s `Drop`), so the producer never sleeps on the lock, and
//! under contention the holder applies a batch while the state's cache lines
//! are on its core.
//!
//! No pushed operation is stranded, by the classic combining handshake: a
//! pusher pushes, issues a `SeqCst` fence, then tries the lock; a holder
//! releases the lock, issues a `SeqCst` fence, then looks at the intake, and
//! takes the lock again if it finds something (and can). Of the two fences
//! one comes first: if the pusher's, the holder's look sees the push; if the
//! holder's, the pusher's try sees the lock released (or held by a newer
//! holder, who has the same duty). So either the pusher or some holder
//! applies the operation.
//!
//! Readers stay exact because they apply the intake before they read: an add
//! or lease end that returned before a `len()` began is counted by it.
//!
//! Shutdown is the intake's closed bit (see [`crate::intake`]): set with an
//! atomic read-modify-write of the same word a refusable push
//! compare-and-swaps, so an add pushed before it is applied by the shutdown's
//! own drain (before the state learns of the shutdown), one after it is
//! refused. An add applied directly reads the bit under the lock: the
//! shutdown's drain waits for that lock, so such an add, having seen the bit
//! clear, is also applied before the state shuts down.

use crate::Key;
use std::hash::BuildHasher;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::AddError;
use crate::intake::{IfClosed, Intake};
use crate::limiter::RateLimiter;
use crate::metrics::{MetricsHook, Snapshot, Source};
use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::state::{Effects, MAX_DELAY, Popped, Refused, State, When};
use crate::sync::atomic::{Ordering::SeqCst, fence};
use crate::sync::{Arc, Mutex, MutexGuard, Notify};
use crate::throttle::Throttle;

/// The state of one queue and what its operations need beside it.
pub(crate) struct Shared<K, O: Ordering<K>> {
    /// Take it with [`Shared::lock`] or [`Shared::try_lock`], which apply
    /// the intake, never directly.
    state: Mutex<State<K, O>>,
    /// Operations that found the lock taken, for its holder to apply.
    intake: Intake<Op<K>>,
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
    /// Applies a pushed add: a function pointer for the same reason (the
    /// lock holder that applies it may be a lease end).
    add_now: AddNow<K, O>,
}

pub(crate) type StartTimer<K, O> = fn(&Arc<Shared<K, O>>, &mut State<K, O>) -> Result<(), AddError>;

type AddNow<K, O> = fn(&mut State<K, O>, K, u64, i32, Option<Instant>) -> Result<Effects, Refused>;

/// Rounds of [`Shared::try_lock_spin`]: 2^0 + .. + 2^4 = 31 spin hints,
/// about one critical section. In W1 on a 2-vCPU EPYC VM (noisy runs, see
/// the handout report) 5 rounds did better than 0, 3 and 7: without a spin
/// the consumer holding the lock ends up applying the producer's adds; with
/// a long one both threads burn their time waiting.
#[cfg(not(tokio_workqueue_loom))]
const SPIN_ROUNDS: u32 = 5;

/// An operation that found the lock taken.
enum Op<K> {
    /// An immediate add.
    Add {
        key: K,
        h: u64,
        priority: i32,
        now: Option<Instant>,
    },
    /// A lease end, with the priority of an immediate requeue if any.
    Finish {
        slot: u32,
        lease: u32,
        requeue: Option<i32>,
        now: Option<Instant>,
    },
}

/// What one attempt to take a key found.
pub(crate) enum Take<K> {
    /// A key, and when its lease started if times are tracked.
    Item(Popped<K>, Option<Instant>),
    Empty,
    Closed,
    Throttled(Duration),
}

/// The state, locked, with the intake applied. What the operations done
/// under it asked for (wake-ups, metrics, keys to drop) is collected and
/// done when it is dropped, after the lock is released.
pub(crate) struct Locked<'a, K, O: Ordering<K>> {
    shared: &'a Shared<K, O>,
    /// `None` only inside `drop`.
    st: Option<MutexGuard<'a, State<K, O>>>,
    fx: Effects,
    /// Keys of finished leases, dropped outside the lock.
    forgotten: Vec<K>,
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
            intake: Intake::new(),
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
            add_now: |st, key, h, priority, now| st.add(key, h, priority, When::Now, now),
        }
    }
}

impl<K, O: Ordering<K>> Shared<K, O> {
    /// Waits for the lock, then applies the intake.
    pub(crate) fn lock(&self) -> Locked<'_, K, O> {
        self.locked(self.state.lock())
    }

    /// Takes the lock if it is free, then applies the intake.
    pub(crate) fn try_lock(&self) -> Option<Locked<'_, K, O>> {
        self.state.try_lock().map(|st| self.locked(st))
    }

    /// Takes the lock if it is free or freed within a short spin (a few
    /// critical sections' time), then applies the intake.
    ///
    /// An operation that could push itself to the intake first spins
    /// briefly: pushing at the first sight of a holder hands the holder its
    /// work, and under steady contention the holder (a consumer) then spends
    /// its time applying a producer's adds instead of handing out keys, the
    /// two threads no longer working side by side. The spin never sleeps,
    /// so it makes no system call.
    fn try_lock_spin(&self) -> Option<Locked<'_, K, O>> {
        #[cfg(not(tokio_workqueue_loom))]
        for round in 0..SPIN_ROUNDS {
            if let Some(st) = self.state.try_lock() {
                return Some(self.locked(st));
            }
            for _ in 0..1 << round {
                std::hint::spin_loop();
            }
        }
        self.try_lock()
    }

    fn locked<'a>(&'a self, st: MutexGuard<'a, State<K, O>>) -> Locked<'a, K, O> {
        let mut locked = Locked {
            shared: self,
            st: Some(st),
            fx: Effects::default(),
            forgotten: Vec::new(),
        };
        locked.apply_intake();
        locked
    }

    /// Pushes `op` to the intake, then makes sure it is applied: by this
    /// thread if the lock is free, else by its holder (the handshake in the
    /// module docs). Hands `op` back if it was refused for a shutdown.
    fn push(&self, op: Op<K>, if_closed: IfClosed) -> Result<(), Op<K>> {
        self.intake.push(op, if_closed)?;
        fence(SeqCst);
        drop(self.try_lock());
        Ok(())
    }

    /// A consumer that was counted as parked stops waiting.
    pub(crate) fn unpark(&self) {
        self.lock().parked -= 1;
    }

    /// Whether the queue was shut down (its linearization point passed).
    pub(crate) fn is_shut_down(&self) -> bool {
        self.intake.is_closed()
    }

    /// Refuses further adds and tells the state, once every add pushed
    /// before it is applied.
    pub(crate) fn shutdown(&self) {
        self.intake.close();
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
        if readd.is_some_and(|w| w != When::Now) {
            // A delay needs the timer task, started from this thread's
            // runtime: only done under the lock.
            let mut st = self.lock();
            let mut readd = readd.map(|w| (priority, w));
            let mut outcome = Ok(());
            if self.is_shut_down() {
                readd = None;
                outcome = Err(AddError::ShuttingDown);
            } else if let Err(e) = (self.start_timer)(self, &mut st) {
                readd = None;
                outcome = Err(e);
            }
            st.finish(slot, lease, readd, now);
            return outcome;
        }
        let requeue = readd.map(|_| priority);
        if let Some(mut st) = self.try_lock_spin() {
            let (readd, outcome) = match requeue {
                Some(_) if self.is_shut_down() => (None, Err(AddError::ShuttingDown)),
                Some(p) => (Some((p, When::Now)), Ok(())),
                None => (None, Ok(())),
            };
            st.finish(slot, lease, readd, now);
            return outcome;
        }
        let op = Op::Finish {
            slot,
            lease,
            requeue,
            now,
        };
        let if_closed = if requeue.is_some() {
            IfClosed::Refuse
        } else {
            IfClosed::Push
        };
        match self.push(op, if_closed) {
            Ok(()) => Ok(()),
            Err(op) => {
                let Op::Finish { requeue, .. } = op else {
                    unreachable!("a lease end comes back as one")
                };
                debug_assert!(requeue.is_some(), "only requeues are refused");
                let op = Op::Finish {
                    slot,
                    lease,
                    requeue: None,
                    now,
                };
                let pushed = self.push(op, IfClosed::Push);
                debug_assert!(pushed.is_ok(), "a lease end is never refused");
                Err(AddError::ShuttingDown)
            }
        }
    }
}

impl<K: Key, O: Ordering<K>> Shared<K, O> {
    /// Whether a rate-limited add could go ahead now: the queue is open, and
    /// a delay could be timed (a runtime is current, or the timer task of an
    /// earlier one still runs). Asked before the limiter, which counts a
    /// failure each time it is asked, so that a refused add counts none.
    pub(crate) fn can_rate_limit(&self) -> Result<(), AddError> {
        if self.is_shut_down() {
            return Err(AddError::ShuttingDown);
        }
        let timer_alive = self.lock().timer_running();
        if timer_alive || tokio::runtime::Handle::try_current().is_ok() {
            Ok(())
        } else {
            Err(AddError::NoRuntime)
        }
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
        let mut st = match when {
            When::Now => match self.try_lock_spin() {
                Some(st) => st,
                None => {
                    let op = Op::Add {
                        key,
                        h,
                        priority,
                        now: stamp,
                    };
                    self.push(op, IfClosed::Refuse)
                        .map_err(|_| AddError::ShuttingDown)?;
                    return self.added(retry);
                }
            },
            // Starting the timer needs this thread's runtime: under the lock.
            When::At(_) => self.lock(),
        };
        if self.is_shut_down() {
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
    /// asks for until the lock is released. Returns whether the requeue, if
    /// any, was refused.
    fn finish(&mut self, slot: u32, lease: u32, readd: Option<(i32, When)>, now: Option<Instant>) {
        let st = self.st.as_mut().expect("locked");
        let (fx, _refused, forgotten) = st.finish(slot, lease, readd, now);
        self.fx.merge(fx);
        self.forgotten.extend(forgotten);
    }

    /// Applies every operation pushed so far, in the order pushed.
    fn apply_intake(&mut self) {
        for op in self.shared.intake.take() {
            match op {
                Op::Add {
                    key,
                    h,
                    priority,
                    now,
                } => {
                    let st = self.st.as_mut().expect("locked");
                    // Never refused: adds pushed before the shutdown are
                    // applied by its drain, before the state shuts down.
                    if let Ok(fx) = (self.shared.add_now)(st, key, h, priority, now) {
                        self.fx.merge(fx);
                    }
                }
                Op::Finish {
                    slot,
                    lease,
                    requeue,
                    now,
                } => self.finish(slot, lease, requeue.map(|p| (p, When::Now)), now),
            }
        }
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
    /// Releases the lock with the handshake of the module docs: applies the
    /// intake, lets go, and looks again; then does the wake-ups the applied
    /// operations asked for.
    fn drop(&mut self) {
        let shared = self.shared;
        while let Some(mut st) = self.st.take() {
            self.st = Some(st);
            self.apply_intake();
            st = self.st.take().expect("put back above");
            let wake = self.fx.wake.min(st.parked as u32);
            let layout = st.layout();
            drop(st);
            shared.layout.publish(layout);
            fence(SeqCst);
            shared.apply(std::mem::take(&mut self.fx), wake);
            drop(std::mem::take(&mut self.forgotten));
            if !shared.intake.is_empty() {
                self.st = shared.state.try_lock();
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

impl<K, O: Ordering<K>> std::fmt::Debug for Shared<K, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("WorkQueue")
            .field("name", &self.name)
            .field("state", &*st)
            .finish()
    }
}
