//! What every handle of one queue shares: its shards (each a [`State`]
//! behind a lock of its own, see [`crate::shard`]), the consumers waiting
//! for a key, and what is done around them.
//!
//! Every add and lease end takes the lock of its key's shard once, briefly,
//! and a hand-out the lock of the shard whose key it takes: with several
//! shards, the key of the front ticket of the highest lane
//! ([`crate::lanes`]). Keys are hashed and clocks read before a lock is
//! taken, and tasks are woken and metrics told after it is released
//! ([`Effects`] carries what to do, and [`release`](Shared::release) does
//! it).
//!
//! # Waiting consumers
//!
//! A consumer that finds no key in any shard registers in the waiting
//! consumers' table (its own small lock), and each key that becomes ready
//! wakes one registered consumer, never all of them. Registering and the
//! look that found nothing cannot be one critical section across all
//! shards, so the two sides order themselves through sequentially
//! consistent memory instead: a consumer counts itself in `sleepers`, then
//! (after a fence) looks again, at the lanes' counts of tickets pushed and
//! popped or, in a queue of one shard, at its mark; a producer publishes a
//! ticket with a sequentially consistent store (one shard: makes an empty
//! shard show a key with one), under that shard's lock, and every producer
//! reads `sleepers` after it has released the lock. One of the two sees the
//! other: either the consumer finds the key and takes it, or the producer
//! finds the consumer and wakes it. A producer with no one asleep touches
//! no lock but its shard's and its lane's back. What a consumer keeps between polls is a [`Wait`](crate::take::Wait), a waiter
//! number and nothing pinned, so a [`WorkQueue`](crate::WorkQueue) polled
//! as a stream keeps it inline ([`crate::take`] holds the consumer's side).
//! [`WorkQueue`](crate::WorkQueue), [`WorkItem`](crate::WorkItem) and the timer task are
//! handles to it.

use std::hash::BuildHasher;
use std::ops::Deref;
use std::time::Duration;

use tokio::time::Instant;

use crate::Key;
use crate::error::AddError;
use crate::lanes::Lanes;
use crate::limiter::RateLimiter;
use crate::metrics::{MetricsHook, Snapshot, Source};
use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::shard::{self, Marks, Shard};
use crate::shown;
use crate::state::{Counters, Effects, MAX_DELAY, Popped, Refused, State, When};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Acquire, Ordering::SeqCst};
use crate::sync::{Arc, Mutex, MutexGuard, Notify};
use crate::throttle::Throttle;
use crate::waiters::{Waiters, WakeList};

/// What a hand-out found.
pub(crate) enum Taken<K> {
    /// A key, from this shard.
    Key(usize, Popped<K>),
    /// No key ready.
    Empty,
    /// A key, behind a lock another thread holds.
    Busy,
}

/// How often a hand-out looks again at the marks when the lock of the
/// shard it chose is taken, before it waits for that lock or yields (in a
/// queue of one shard; with several, a hand-out takes from the lanes, see
/// [`Shared::pop_lanes`], and the figures below were measured before
/// them, with 8 shards merged by their marks).
///
/// A few looks are enough when the holder is another consumer taking its
/// key: it shows the next one as it unlocks. A holder still there after
/// them is doing something longer (an add, a lease end, growing the
/// shard), and the thread is better given to another task, a producer in
/// W2, than spent spinning. Four looks against 32, in 10 paired rounds on
/// an AMD EPYC VM: W2 1.143x (ahead in 8 of 8; processed/adds 0.94 to
/// 0.90), W1-100k 1.030x, W1 0.990x, W4 0.987x, W1 with metrics 1.039x,
/// W3 lateness p99 0.98x. Consumers in one task (`for_each_concurrent`)
/// ran W2 at 0.948x, behind in 8 of 8: their task yields to the producers
/// more often and merges fewer adds (processed/adds 0.20 to 0.23, against
/// client-go's 0.60-0.81 in full runs), and stays 2.05-2.24x client-go.
#[cfg(not(tokio_workqueue_loom))]
const TRIES: u32 = 4;
/// Once under loom: each look is a branch of the model.
#[cfg(tokio_workqueue_loom)]
const TRIES: u32 = 1;

/// Hashes keys: to find their shard, and in the shard's index.
#[cfg(not(tokio_workqueue_loom))]
type KeyHasher = hashbrown::DefaultHashBuilder;
/// A hasher without a random seed, so that every loom run puts each key in
/// the same shard.
#[cfg(tokio_workqueue_loom)]
type KeyHasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

pub(crate) struct Shared<K, O: Ordering<K>> {
    pub(crate) shards: Box<[Shard<K, O>]>,
    /// With more than one shard: the order of their ready keys.
    lanes: Option<Arc<Lanes>>,
    /// What each shard shows without its lock.
    marks: Marks,
    /// Shards minus one: their number is a power of two.
    mask: usize,
    /// The epoch and numbers every shard counts from.
    counters: Arc<Counters>,
    /// Serve keys ready this long first (the starvation bound), in
    /// nanoseconds.
    promote_after: Option<u64>,
    /// Consumers waiting for a key.
    waiters: Mutex<Waiters>,
    /// Consumers registered in `waiters` and not yet notified.
    sleepers: AtomicUsize,
    /// Set by the first shutdown, before it shuts the shards down; adds
    /// check it under their shard's lock.
    shutting_down: AtomicBool,
    /// Woken at shutdown and when the last key is done: drains and `closed`.
    pub(crate) drained: Notify,
    hasher: KeyHasher,
    pub(crate) limiter: Box<dyn RateLimiter<K>>,
    pub(crate) metrics: Option<Box<dyn MetricsHook>>,
    pub(crate) name: String,
    /// Whether ready and lease times are kept (metrics or starvation bound).
    pub(crate) track: bool,
    pub(crate) throttle: Option<Box<dyn Throttle>>,
    /// Starts the timer task; a function pointer so that code without `K`'s
    /// bounds (the lease end in `Drop`) can requeue with a delay.
    pub(crate) start_timer: StartTimer<K, O>,
    /// The timer task, once a delayed add started it.
    pub(crate) timer_task: Mutex<Option<tokio::task::AbortHandle>>,
    /// Whether a timer task runs: set as one starts, cleared as it ends.
    pub(crate) timer_alive: AtomicBool,
}

pub(crate) type StartTimer<K, O> = fn(&Arc<Shared<K, O>>) -> Result<(), AddError>;

/// One handle's hold on the queue, which the leases it hands out share.
///
/// Each lease keeps the queue alive. Were that a clone of the one
/// `Arc<Shared>`, every hand-out and every lease end would write the same
/// reference count, a cache line that then moves between the consumers'
/// cores on each (about 3 % of W2's time on two cores, in a profile). Each
/// [`WorkQueue`](crate::WorkQueue) holds a `Holder` of its own, and the
/// leases it hands out count on that: the count stays with the task that
/// polls the handle.
pub(crate) struct Holder<K, O: Ordering<K>>(Arc<Shared<K, O>>);

impl<K, O: Ordering<K>> Holder<K, O> {
    pub(crate) fn new(shared: Arc<Shared<K, O>>) -> Arc<Self> {
        Arc::new(Holder(shared))
    }
}

impl<K, O: Ordering<K>> Deref for Holder<K, O> {
    type Target = Arc<Shared<K, O>>;

    fn deref(&self) -> &Arc<Shared<K, O>> {
        &self.0
    }
}

impl<K, O: Ordering<K>> Shared<K, O> {
    /// A queue of the shards `states` (a power of two of them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        mut states: Vec<State<K, O>>,
        promote_after: Option<Duration>,
        limiter: Box<dyn RateLimiter<K>>,
        metrics: Option<Box<dyn MetricsHook>>,
        name: String,
        track: bool,
        throttle: Option<Box<dyn Throttle>>,
        start_timer: StartTimer<K, O>,
    ) -> Self {
        let shards = states.len();
        assert!(shards.is_power_of_two());
        let counters = Arc::new(Counters::new());
        let lanes = (shards > 1).then(|| Arc::new(Lanes::new(shards)));
        for (i, st) in states.iter_mut().enumerate() {
            st.join(i as u32, counters.clone(), lanes.clone());
        }
        Shared {
            shards: states
                .into_iter()
                .map(|st| Shard {
                    state: Mutex::new(st),
                    layout: SharedLayout::default(),
                })
                .collect(),
            lanes,
            marks: Marks::new(shards, promote_after.is_some()),
            mask: shards - 1,
            counters,
            promote_after: promote_after.map(shown::nanos),
            waiters: Mutex::new(Waiters::default()),
            sleepers: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            drained: Notify::new(),
            hasher: KeyHasher::default(),
            limiter,
            metrics,
            name,
            track,
            throttle,
            start_timer,
            timer_task: Mutex::new(None),
            timer_alive: AtomicBool::new(false),
        }
    }

    /// The shard of a key hashed to `h`: the top bits of `h` times an odd
    /// constant, which depend on all of `h`'s bits. `h`'s own bits 40-45,
    /// used until 2026-11-27, are poorly mixed for integer keys under some
    /// of the hasher's per-process seeds: in about 1 process in 50, 300
    /// consecutive `u32` keys fell in 5 of 8 shards (`tests/shards.rs`
    /// failed on it now and then); with the product, none in 400
    /// processes. The index of a shard uses `h`'s low bits.
    #[inline]
    fn shard_of(&self, h: u64) -> usize {
        ((h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize) & self.mask
    }

    /// The instant every shard's deadlines count from.
    pub(crate) fn epoch(&self) -> Instant {
        self.counters.epoch()
    }

    /// The shards that set delays since the timer task last asked (one bit
    /// each), cleared.
    pub(crate) fn take_timer_work(&self) -> u64 {
        self.counters.take_timer_work()
    }

    /// Whether a shard set delays since the timer task last asked.
    pub(crate) fn has_timer_work(&self) -> bool {
        self.counters.has_timer_work()
    }

    /// The shard `key` goes to.
    pub(crate) fn shard_of_key(&self, key: &K) -> usize
    where
        K: std::hash::Hash,
    {
        self.shard_of(self.hasher.hash_one(key))
    }

    /// Whether a timer task runs (see [`crate::timer::ensure_running`]).
    pub(crate) fn timer_running(&self) -> bool {
        self.timer_alive.load(Acquire)
    }

    /// Whether a shutdown has begun: every add from now on is refused.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(SeqCst)
    }

    /// Shut down, with nothing left to hand out now or later.
    pub(crate) fn is_closed(&self) -> bool {
        self.marks.all_closed()
    }

    /// Shut down, with nothing left to hand out and nothing leased.
    pub(crate) fn is_drained(&self) -> bool {
        self.marks.all_drained()
    }

    /// Whether any shard has a key ready.
    pub(crate) fn any_ready(&self) -> bool {
        if let Some(lanes) = &self.lanes {
            return !lanes.is_empty();
        }
        self.marks.any_ready()
    }

    /// Keys ready now, across the shards.
    pub(crate) fn ready_len(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().ready_len()).sum()
    }

    /// Shuts every shard down, keeping the delays due by `keep_until`;
    /// `dropped` hears of each key whose delay is dropped.
    ///
    /// The flag comes first, and an add or requeue checks it under its
    /// shard's lock: once it is set, every add is refused, whichever
    /// shards are shut down yet, so a shutdown refuses adds at one moment.
    pub(crate) fn shut_down(&self, keep_until: Option<Instant>, dropped: &mut dyn FnMut(&K)) {
        self.shutting_down.store(true, SeqCst);
        let mut freed = Vec::new();
        for i in 0..self.shards.len() {
            let mut st = self.shards[i].state.lock();
            let mut fx = st.shutdown_keeping(keep_until, dropped, &mut freed);
            self.release(i, st, &mut fx);
        }
        // Keys are dropped with no lock held (see `add`).
        drop(freed);
        // `closed` waiters that looked at the flag before it was set were
        // woken by the shards' shutdowns, or are woken here.
        self.drained.notify_waiters();
    }
}

impl<K: Key, O: Ordering<K>> Shared<K, O> {
    /// Whether a rate-limited add could go ahead now: the queue is open, and
    /// a delay could be timed (a runtime with time is current, or the timer
    /// task of an earlier one still runs). Asked before the limiter, which counts a
    /// failure each time it is asked, so that a refused add counts none.
    pub(crate) fn can_rate_limit(&self) -> Result<(), AddError> {
        if self.is_shutting_down() {
            return Err(AddError::ShuttingDown);
        }
        if self.timer_running() {
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
        if when != When::Now && !self.is_shutting_down() {
            (self.start_timer)(self)?;
        }
        let i = self.shard_of(h);
        let shard = &self.shards[i];
        // The lookup's cache misses start before the lock is taken.
        shard.layout.load().prefetch(h);
        let mut st = shard.state.lock();
        if self.is_shutting_down() {
            return Err(AddError::ShuttingDown);
        }
        let mut fx = Effects::default();
        let merged = st
            .add(key, h, priority, when, now.filter(|_| self.track), &mut fx)
            .map_err(refused)?;
        shard.layout.publish(st.layout());
        if st.has_lanes() {
            if let Some((c, at)) = st.new_chunk() {
                shard.layout.publish_chunk(c, at);
            }
            if let Some(at) = st.moved_times() {
                shard.layout.publish_times(at);
            }
        }
        self.release(i, st, &mut fx);
        // A key that merged into one the queue holds is freed here, not
        // under the lock, where it would lengthen every other thread's wait.
        drop(merged);
        if retry && let Some(m) = &self.metrics {
            m.retry();
        }
        Ok(())
    }

    /// Hands out the next key, if any is ready: the shard's number and the
    /// key. With several shards, that is [`pop_lanes`](Self::pop_lanes);
    /// with one, its ordering's next key, as follows.
    ///
    /// The shard's lock taken is usually another consumer taking a key,
    /// and once it has, the mark shows whether one is left; so a few looks
    /// come before anything else. After them, with `wait` false the
    /// answer is [`Taken::Busy`] (an async consumer then yields its task
    /// rather than park its thread: the holder may be growing the shard,
    /// which takes a while); with `wait` true it waits for the lock.
    ///
    /// A queue that keeps times reads the clock once it has a key in sight
    /// (a popped ticket, or a shard whose mark shows one), before it takes
    /// that shard's lock: a look that finds nothing reads no clock, and no
    /// lock is held across the read. Only the starvation bound reads it
    /// first, to know which keys are past it.
    pub(crate) fn pop(&self, wait: bool) -> Taken<K> {
        let mut now = self.promote_after.is_some().then(Instant::now);
        let promote = self
            .promote_after
            .zip(now)
            .map(|(after, now)| (after, shown::nanos_since(self.epoch(), now)));
        if let Some(lanes) = &self.lanes {
            return self.pop_lanes(lanes, promote, now);
        }
        let mut tries = 0;
        let mut busy = None;
        loop {
            let Some(pick) = shard::pick(&self.marks, promote) else {
                return Taken::Empty;
            };
            // The mark still shows what it showed when the lock was found
            // taken: most often its holder is taking a key, and publishes
            // what is left before it unlocks. Looking at the lock again
            // would only pull its line away from the holder, whose unlock
            // must then take it back; once the looks run out it is tried
            // all the same, since a holder that leaves the mark as it was
            // (a hand-out with keys left, a producer adding behind them, a
            // lease end) publishes no change.
            if busy == Some(pick) && tries < TRIES {
                tries += 1;
                crate::sync::spin();
                continue;
            }
            let i = pick.shard();
            if self.track {
                now.get_or_insert_with(Instant::now);
            }
            let mut st = match self.shards[i].state.try_lock() {
                Some(st) => st,
                None if tries < TRIES => {
                    tries += 1;
                    busy = Some(pick);
                    crate::sync::spin();
                    continue;
                }
                None if !wait => {
                    crate::sync::spin();
                    return Taken::Busy;
                }
                None => self.shards[i].state.lock(),
            };
            // Another consumer took what the marks showed: look again.
            if !pick.holds(&st) {
                continue;
            }
            let popped = st.pop(now).expect("a shard whose mark shows a key has one");
            return self.hand_out(i, st, popped);
        }
    }

    /// [`pop`](Self::pop) for a queue of several shards: the oldest key
    /// past the starvation bound if there is one, else the key of the
    /// front ticket of the highest lane (see [`crate::lanes`]).
    ///
    /// A popped ticket is the next key in the order, so the consumer waits
    /// for its shard's lock rather than give the ticket up: a shard's lock
    /// is held only briefly, but by an add that grows the shard's index,
    /// for longer.
    fn pop_lanes(
        &self,
        lanes: &Lanes,
        promote: Option<(u64, u64)>,
        mut now: Option<Instant>,
    ) -> Taken<K> {
        if let Some(promote) = promote
            && let Some(pick) = shard::oldest_past(&self.marks, promote)
        {
            let i = pick.shard();
            let mut st = self.shards[i].state.lock();
            if pick.holds(&st)
                && let Some(popped) = st.pop(now)
            {
                return self.hand_out(i, st, popped);
            }
        }
        loop {
            let Some(ticket) = lanes.pop() else {
                return Taken::Empty;
            };
            // The node of a key a few hand-outs ahead, fetched meanwhile.
            if let Some((shard, slot)) = ticket.behind {
                State::<K, O>::prefetch_node(&self.shards[shard].layout, slot);
            }
            if self.track {
                now.get_or_insert_with(Instant::now);
            }
            let i = ticket.shard;
            let mut st = self.shards[i].state.lock();
            // `None`: stale, its key was raised or taken out of turn.
            if let Some(popped) = st.take(ticket, now) {
                return self.hand_out(i, st, popped);
            }
        }
    }

    /// Releases shard `i`'s lock after a key was popped from it, telling
    /// everyone if that was the last key there will be.
    #[inline(always)]
    fn hand_out(&self, i: usize, st: MutexGuard<'_, State<K, O>>, popped: Popped<K>) -> Taken<K> {
        let mut fx = st.closed_effects();
        self.release(i, st, &mut fx);
        Taken::Key(i, popped)
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut ready_by_priority: Vec<(i32, usize)> = Vec::new();
        let (mut in_flight, mut waiting) = (0, 0);
        let mut starts = Vec::new();
        for shard in self.shards.iter() {
            let st = shard.state.lock();
            let counts = st.counts();
            starts.extend(st.lease_starts());
            drop(st);
            for (priority, n) in counts.ready_by_priority {
                match ready_by_priority.iter_mut().find(|(p, _)| *p == priority) {
                    Some((_, m)) => *m += n,
                    None => ready_by_priority.push((priority, n)),
                }
            }
            in_flight += counts.leased;
            waiting += counts.waiting;
        }
        ready_by_priority.sort_unstable_by_key(|&(p, _)| std::cmp::Reverse(p));
        let now = Instant::now();
        let ran = |at: &Instant| now.saturating_duration_since(*at);
        Snapshot {
            ready_by_priority,
            in_flight,
            waiting,
            unfinished_work: starts.iter().map(ran).sum(),
            longest_running: starts.iter().min().map(ran).unwrap_or_default(),
        }
    }
}

impl<K, O: Ordering<K>> Shared<K, O> {
    /// Publishes shard `i`'s mark, releases its lock and does what the
    /// state change asked for: a consumer to wake for each key made ready
    /// (if any is asleep), everyone at a close or drain, the timer task,
    /// metrics.
    ///
    /// `fx` is borrowed, not moved: moved, it was copied 16 bytes at a time
    /// out of the add's narrower stores, a load that waits for those stores
    /// (and every store before them) to reach the cache. Borrowed, W1 and
    /// W2 were 2.5-3.8 % faster in paired rounds on an AMD EPYC VM. (An
    /// earlier profile on an Intel VM found the unlock's locked write
    /// waiting for the same stores, so the gain there may be smaller.)
    pub(crate) fn release(&self, i: usize, mut st: MutexGuard<'_, State<K, O>>, fx: &mut Effects) {
        self.marks.publish(i, &mut st);
        drop(st);
        // Every consumer that saw this shard empty and went to sleep is
        // registered in `sleepers` as this load sees it: the store that
        // published the key (a ticket's count, or the one shard's mark) was
        // SeqCst and happens before this load, through the shard's lock (see
        // `BackGuard::push` and `Marks::publish`).
        if fx.wake_all || (fx.wake > 0 && self.sleepers.load(SeqCst) > 0) {
            self.wake(fx);
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

    /// Wakes the consumers `fx` asks for: one per key made ready, or all of
    /// them and the drain waiters at a close or drain. Kept out of
    /// [`release`](Self::release), whose callers mostly have nobody to
    /// wake: building and emptying a wake list on each cost 5-6 % of W1's
    /// throughput on an Intel VM.
    #[cold]
    #[inline(never)]
    fn wake(&self, fx: &Effects) {
        let mut wake = WakeList::default();
        if fx.wake_all {
            self.waiters().notify_all(&mut wake);
        } else {
            self.waiters().notify(fx.wake, &mut wake);
        }
        wake.wake();
        if fx.wake_all {
            self.drained.notify_waiters();
        }
    }

    /// The waiting consumers, locked: `sleepers` is set from them when the
    /// guard goes, so no change to them can leave the count behind.
    pub(crate) fn waiters(&self) -> Sleepers<'_> {
        Sleepers {
            waiters: self.waiters.lock(),
            count: &self.sleepers,
        }
    }
}

/// The waiting consumers under their lock, which on release sets the
/// count of those not yet notified (see [`Shared::waiters`]).
pub(crate) struct Sleepers<'a> {
    waiters: MutexGuard<'a, Waiters>,
    count: &'a AtomicUsize,
}

impl std::ops::Deref for Sleepers<'_> {
    type Target = Waiters;

    fn deref(&self) -> &Waiters {
        &self.waiters
    }
}

impl std::ops::DerefMut for Sleepers<'_> {
    fn deref_mut(&mut self) -> &mut Waiters {
        &mut self.waiters
    }
}

impl Drop for Sleepers<'_> {
    fn drop(&mut self) {
        self.count.store(self.waiters.waiting(), SeqCst);
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
        if let Some(task) = self.timer_task.get_mut().take() {
            task.abort();
        }
    }
}
