//! The timer task: keeps the queue's timer wheel and moves delayed keys to
//! the ready set when they are due.
//!
//! One task per queue, spawned by the first delayed add, owns a
//! `DelayQueue` and works on it without the queue's lock: a delayed add only
//! appends a [`TimerEntry`] to a list under the lock, and the task takes that
//! whole list in one swap, inserts the entries after releasing the lock, and
//! takes the lock again only to make expired keys ready. So a producer of
//! delayed keys never waits on a wheel insert, and the wheel's work runs on
//! whichever thread the task is on. The wheel keeps one `DelayQueue`
//! entry per millisecond with delays due in it, and each millisecond's
//! delays in a list beside it (see [`Wheel`]): the task's time goes to the
//! keys it fires, not to the wheel.
//!
//! The task holds the queue weakly and is aborted when the queue is dropped,
//! so it never outlives it; it also ends at shutdown, dropping every timer,
//! or after the delays a drain kept have fired.
//! An idle wheel costs nothing: the task sleeps until the earliest deadline,
//! and the first shard to get new delays since the task's last round wakes
//! it; the round then locks only the shards that got some, so a producer
//! setting many delays shares its shards' locks with the task as little as
//! it can.

use crate::Key;
use std::future::poll_fn;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use hashbrown::HashMap;
use tokio::time::Instant;
use tokio_util::time::DelayQueue;

use crate::error::AddError;
use crate::ordering::Ordering;
use crate::shared::Shared;
use crate::shown;
use crate::state::{TimerEntry, timer_bit};
use crate::sync::atomic::Ordering::Release;

/// How long an empty wheel may sit unpolled before an insert starts a fresh
/// one: `DelayQueue` measures deadlines from its last poll and panics on one
/// about two years past it. A wheel with entries is polled at least once a
/// [`MAX_DELAY`](crate::MAX_DELAY), since its earliest entry fires by then.
const WHEEL_REFRESH: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Starts the timer task if there is none, or if the runtime that ran the
/// last one has gone (its wheel went with it, so every pending delay is sent
/// to the new task). Called before the caller takes a shard's lock: this
/// takes each shard's lock to resend its delays.
pub(crate) fn ensure_running<K: Key, O: Ordering<K>>(
    shared: &Arc<Shared<K, O>>,
) -> Result<(), AddError> {
    // Every delayed add asks this. The flag, written only as a task starts
    // and ends, answers without the lock (which every producer of delays
    // would take) and without the task's own state (whose line the task
    // writes whenever it runs). The lock only keeps two starts apart.
    if shared.timer_running() {
        return Ok(());
    }
    let mut task = shared.timer_task.lock();
    if shared.timer_running() {
        return Ok(());
    }
    let handle = crate::clock::timed_handle()?;
    if task.is_some() {
        for shard in shared.shards.iter() {
            shard.state.lock().restart_timers();
        }
    }
    let epoch = shared.epoch();
    // Set before the spawn: the task clears it when it ends, or when it is
    // dropped unpolled (its runtime shut down), which may come first. A
    // task whose flag is clear has made its last round, so a start then
    // (`task` still names it) is safe: the delays go to the new task.
    shared.timer_alive.store(true, Release);
    let alive = Alive(Arc::downgrade(shared));
    // Unconstrained: tokio's co-operative budget would otherwise cut a burst
    // of keys due in one millisecond into pieces, and the wheel hands those
    // out last-in first, so only a whole burst can be put back in order.
    let spawned = handle.spawn(tokio::task::unconstrained(async move {
        run(&alive.0, epoch).await;
        drop(alive);
    }));
    *task = Some(spawned.abort_handle());
    Ok(())
}

/// Held by the timer task: clears the queue's flag that a task runs when
/// the task ends, is aborted, or goes with its runtime (a task dropped
/// before its first poll drops this too).
struct Alive<K, O: Ordering<K>>(Weak<Shared<K, O>>);

impl<K, O: Ordering<K>> Drop for Alive<K, O> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.timer_alive.store(false, Release);
        }
    }
}

/// Entries a buffer keeps room for between rounds.
const KEEP_CAPACITY: usize = 1024;

/// The wheel's slot: `DelayQueue` counts in milliseconds from its start,
/// so the delays due in one of its milliseconds share one of its entries.
const SLOT_NANOS: u64 = 1_000_000;

/// Emptied slots kept for reuse.
const KEEP_SLOTS: usize = 64;

/// The wheel and the task's buffers, kept between polls.
///
/// The `DelayQueue` holds one entry per millisecond that has delays due in
/// it, and each millisecond's delays wait in a list of their own: an
/// insert into the `DelayQueue` and its expiry cost about half a
/// microsecond each on the Intel VM, which was most of the timer task's
/// time on W3 (100,000 delays over 100 ms) and kept keys due while it
/// worked waiting, where a push on a millisecond's list costs a few
/// nanoseconds. The milliseconds are the `DelayQueue`'s own: it rounds a
/// deadline up to the next millisecond from its start, and a
/// millisecond's entry is set at its end, so a key fires when it would
/// have fired alone and never before its deadline. (Its start is read
/// just before it is made, a few nanoseconds early: a deadline within
/// those nanoseconds past a millisecond's start waits one millisecond
/// more than it would have; under paused time there are none.)
struct Wheel {
    /// One entry per millisecond with delays due in it: the millisecond,
    /// counted from `start`.
    queue: DelayQueue<u64>,
    /// When `queue` was made, as nanoseconds from the epoch (see above).
    start: u64,
    /// The delays due in each millisecond `queue` holds.
    slots: HashMap<u64, Vec<TimerEntry>>,
    /// Emptied lists, kept for reuse.
    free: Vec<Vec<TimerEntry>>,
    /// What entries' deadlines count from.
    epoch: Instant,
    /// When `queue` was last polled.
    polled_at: Option<Instant>,
    /// Entries taken from the shards, to insert.
    incoming: Vec<TimerEntry>,
    /// A buffer to swap with a shard's list of new delays.
    spare: Vec<TimerEntry>,
    /// Entries expired: sorted, then fired under the lock next round.
    expired: Vec<TimerEntry>,
}

impl Wheel {
    fn new(epoch: Instant) -> Self {
        let (start, queue) = fresh_queue(epoch);
        Wheel {
            queue,
            start,
            slots: HashMap::default(),
            free: Vec::new(),
            epoch,
            polled_at: None,
            incoming: Vec::new(),
            spare: Vec::new(),
            expired: Vec::new(),
        }
    }

    /// The millisecond of the `DelayQueue` that `e` is due in.
    fn ms_of(&self, e: &TimerEntry) -> u64 {
        e.at.saturating_sub(self.start).div_ceil(SLOT_NANOS)
    }

    /// The end of millisecond `ms` of the `DelayQueue`.
    fn end_of(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_nanos(self.start + ms * SLOT_NANOS)
    }

    fn insert(&mut self, e: TimerEntry) {
        let mut ms = self.ms_of(&e);
        // The common case: a millisecond that has delays already.
        if let Some(slot) = self.slots.get_mut(&ms) {
            slot.push(e);
            return;
        }
        if self.queue.is_empty()
            && self
                .polled_at
                .is_some_and(|at| self.end_of(ms).saturating_duration_since(at) > WHEEL_REFRESH)
        {
            // Polled right after the inserts, in this same round.
            self.reset();
            ms = self.ms_of(&e);
        }
        self.queue.insert_at(ms, self.end_of(ms));
        let mut slot = self.free.pop().unwrap_or_default();
        slot.push(e);
        self.slots.insert(ms, slot);
    }

    /// Moves the delays of every millisecond past to `expired`.
    fn poll_expired(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(expired)) = self.queue.poll_expired(cx) {
            let ms = expired.into_inner();
            let mut slot = self.slots.remove(&ms).expect("a list for each entry");
            self.expired.append(&mut slot);
            if self.free.len() < KEEP_SLOTS && slot.capacity() <= KEEP_CAPACITY {
                self.free.push(slot);
            }
        }
    }

    /// Drops every entry and starts an empty wheel.
    fn reset(&mut self) {
        (self.start, self.queue) = fresh_queue(self.epoch);
        self.slots.clear();
        self.polled_at = None;
    }

    /// Sorts the expired entries in (deadline, order set) order: the
    /// entries of one millisecond are listed in the order the task took
    /// them, shard by shard, and the `DelayQueue` hands out milliseconds
    /// due together last-in first. A batch is never cut short, since
    /// cutting it inside a millisecond would break that order.
    fn sort_expired(&mut self) {
        let Some(&first) = self.expired.first() else {
            return;
        };
        // Order numbers wrap; in one batch they span far less than 2^31.
        self.expired
            .sort_unstable_by_key(|e| (e.at, e.seq.wrapping_sub(first.seq) as i32));
    }
}

/// An empty `DelayQueue`, and its start as nanoseconds from `epoch`, read
/// just before it is made (see [`Wheel`]).
fn fresh_queue(epoch: Instant) -> (u64, DelayQueue<u64>) {
    let start = shown::nanos_since(epoch, Instant::now());
    (start, DelayQueue::new())
}

/// `epoch` is the shards', which entries' deadlines count from.
///
/// A round fires the expired entries in their order, taking each entry's
/// shard's lock as the entries go from shard to shard (so keys due in one
/// millisecond are made ready, and numbered, in the order their delays were
/// set, whatever their shards), then takes the new delays of the shards
/// that marked themselves as having some (every shard in the first round,
/// which leaves the task's waker with each, and while shutting down, when
/// each shard says whether it is done). If a shard asks for a fresh wheel,
/// every shard sends all its live delays again, since dropping the wheel
/// drops them all. After taking the delays the task looks at the marks
/// once more: a shard marked during the first round before that round
/// reached it had no waker to wake the task with, and its bit, left set,
/// would keep every later mark (of any shard) from waking the task until
/// the wheel's next deadline, which may be far off.
async fn run<K: Key, O: Ordering<K>>(queue: &Weak<Shared<K, O>>, epoch: Instant) {
    let mut wheel = Wheel::new(epoch);
    let mut first_round = true;
    poll_fn(|cx| {
        loop {
            let Some(shared) = queue.upgrade() else {
                return Poll::Ready(());
            };
            let now = Instant::now();
            let mut expired = wheel.expired.drain(..).peekable();
            while let Some(&first) = expired.peek() {
                let i = first.shard as usize;
                let mut st = shared.shards[i].state.lock();
                let run = std::iter::from_fn(|| expired.next_if(|e| e.shard == first.shard));
                let mut fx = st.fire_expired(run, now);
                shared.release(i, st, &mut fx);
            }
            drop(expired);
            let mut fresh = false;
            let marked = shared.take_timer_work();
            let every = std::mem::take(&mut first_round) || shared.is_shutting_down();
            // Done only when every shard says so.
            let mut done = every;
            let mut taken = std::mem::take(&mut wheel.incoming);
            for (i, shard) in shared.shards.iter().enumerate() {
                if !every && marked & timer_bit(i) == 0 {
                    continue;
                }
                let mut st = shard.state.lock();
                fresh |= st.take_delays(cx.waker(), &mut wheel.spare);
                done &= st.timers_done();
                drop(st);
                taken.append(&mut wheel.spare);
            }
            if fresh {
                // Dropping the wheel drops every shard's delays: all of them
                // are sent again.
                taken.clear();
                for shard in shared.shards.iter() {
                    let mut st = shard.state.lock();
                    st.resend_timers();
                    _ = st.take_delays(cx.waker(), &mut wheel.spare);
                    drop(st);
                    taken.append(&mut wheel.spare);
                }
            }
            // Marks set since the swap: one set in the first round before
            // the round reached its shard had no waker to wake the task
            // with, so another round takes them.
            let again = shared.has_timer_work();
            drop(shared);
            if done {
                return Poll::Ready(());
            }
            if fresh {
                wheel.reset();
            }
            for e in taken.drain(..) {
                wheel.insert(e);
            }
            // Kept for reuse, but not at the size of a burst long gone.
            taken.shrink_to(KEEP_CAPACITY);
            wheel.incoming = taken;
            wheel.polled_at = Some(now);
            wheel.poll_expired(cx);
            if wheel.expired.is_empty() {
                if again {
                    // Another round, after the thread's other tasks: a
                    // producer marking shards all along would otherwise
                    // keep this loop from ever yielding.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // A burst's worth of room is not kept.
                wheel.expired.shrink_to(KEEP_CAPACITY);
                return Poll::Pending;
            }
            wheel.sort_expired();
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const US: u64 = 1_000;

    fn entry(seq: u32, at: u64) -> TimerEntry {
        TimerEntry {
            shard: 0,
            slot: seq,
            seq,
            at,
        }
    }

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// What expired in `wheel` by now, in (deadline, order set) order.
    async fn expired(wheel: &mut Wheel) -> Vec<TimerEntry> {
        poll_fn(|cx| {
            wheel.poll_expired(cx);
            Poll::Ready(())
        })
        .await;
        wheel.sort_expired();
        std::mem::take(&mut wheel.expired)
    }

    #[test]
    fn delays_due_in_one_millisecond_share_one_entry() {
        paused().block_on(async {
            let epoch = Instant::now();
            let mut wheel = Wheel::new(epoch);
            for (i, at) in (1..=1000).map(|us| us * US).enumerate() {
                wheel.insert(entry(i as u32, at));
            }
            assert_eq!(wheel.queue.len(), 1, "(0, 1 ms] is one millisecond");
            wheel.insert(entry(1000, 1000 * US + 1));
            wheel.insert(entry(1001, 0));
            assert_eq!(wheel.queue.len(), 3);
            tokio::time::advance(Duration::from_micros(999)).await;
            assert_eq!(expired(&mut wheel).await, [entry(1001, 0)]);
            tokio::time::advance(Duration::from_micros(1)).await;
            let first: Vec<u64> = expired(&mut wheel).await.iter().map(|e| e.at).collect();
            assert_eq!(first, (1..=1000).map(|us| us * US).collect::<Vec<_>>());
            tokio::time::advance(Duration::from_millis(1)).await;
            assert_eq!(expired(&mut wheel).await, [entry(1000, 1000 * US + 1)]);
            assert!(wheel.slots.is_empty() && wheel.queue.is_empty());
        });
    }

    /// A step of the model: set delays (in microseconds from now), or let
    /// time pass.
    #[derive(Debug, Clone)]
    enum Step {
        Set(Vec<u64>),
        Wait(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            prop::collection::vec(0..5_000u64, 1..20).prop_map(Step::Set),
            (0..3_000u64).prop_map(Step::Wait),
        ]
    }

    proptest! {
        /// Against a `DelayQueue` holding each delay on its own (the
        /// wheel before it kept milliseconds): at every moment the same
        /// delays have fired, and none before its deadline.
        #[test]
        fn fires_what_a_delay_queue_of_single_delays_fires(
            steps in prop::collection::vec(step(), 1..40),
            // The wheel starts this long after the epoch.
            late in 0..2_000u64,
        ) {
            paused().block_on(async {
                let epoch = Instant::now();
                tokio::time::advance(Duration::from_micros(late)).await;
                let mut wheel = Wheel::new(epoch);
                let mut single: DelayQueue<TimerEntry> = DelayQueue::new();
                let mut seq = 0;
                let mut fired_single = Vec::new();
                let mut fired = Vec::new();
                for step in steps.iter().chain([&Step::Wait(10_000)]) {
                    match step {
                        Step::Set(delays) => {
                            let now = shown::nanos_since(epoch, Instant::now());
                            for d in delays {
                                let e = entry(seq, now + d * US + u64::from(seq % 7));
                                seq += 1;
                                wheel.insert(e);
                                single.insert_at(e, epoch + Duration::from_nanos(e.at));
                            }
                        }
                        Step::Wait(us) => {
                            tokio::time::advance(Duration::from_micros(*us)).await;
                        }
                    }
                    let now = shown::nanos_since(epoch, Instant::now());
                    // A `DelayQueue` hands out one of its milliseconds per
                    // turn of the runtime's timer: both get the turns to
                    // hand out all they have by now.
                    let mut out = Vec::new();
                    let mut out_single = Vec::new();
                    for _ in 0..64 {
                        out.extend(expired(&mut wheel).await);
                        poll_fn(|cx| {
                            while let Poll::Ready(Some(e)) = single.poll_expired(cx) {
                                out_single.push(e.into_inner());
                            }
                            Poll::Ready(())
                        })
                        .await;
                        tokio::task::yield_now().await;
                    }
                    for e in &out {
                        assert!(e.at <= now, "{e:?} fired at {now}, before its deadline");
                    }
                    out.sort_unstable_by_key(|e| e.seq);
                    out_single.sort_unstable_by_key(|e| e.seq);
                    assert_eq!(&out, &out_single, "after {step:?}");
                    fired.extend(out);
                    fired_single.extend(out_single);
                }
                assert_eq!(fired.len(), seq as usize, "every delay fired");
                assert_eq!(fired, fired_single);
            });
        }
    }
}
