//! The timer task: keeps the queue's timer wheel and moves delayed keys to
//! the ready set when they are due.
//!
//! One task per queue, spawned by the first delayed add, owns a
//! `DelayQueue` and works on it without the queue's lock: a delayed add only
//! appends a [`TimerEntry`] to a list under the lock, and the task takes that
//! whole list in one swap, inserts the entries after releasing the lock, and
//! takes the lock again only to make expired keys ready. So a producer of
//! delayed keys never waits on a wheel insert, and the wheel's work runs on
//! whichever thread the task is on.
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
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::time::DelayQueue;

use crate::error::AddError;
use crate::ordering::Ordering;
use crate::shared::Shared;
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

/// The wheel and the task's buffers, kept between polls.
struct Wheel {
    queue: DelayQueue<TimerEntry>,
    /// When `queue` was last polled.
    polled_at: Option<Instant>,
    /// Entries taken from the shards, to insert.
    incoming: Vec<TimerEntry>,
    /// A buffer to swap with a shard's list of new delays.
    spare: Vec<TimerEntry>,
    /// Entries expired, with the wheel's deadline: sorted, then fired
    /// under the lock next round.
    expired: Vec<(Instant, TimerEntry)>,
}

impl Wheel {
    fn new() -> Self {
        Wheel {
            queue: DelayQueue::new(),
            polled_at: None,
            incoming: Vec::new(),
            spare: Vec::new(),
            expired: Vec::new(),
        }
    }

    fn insert(&mut self, e: TimerEntry, deadline: Instant) {
        if self.queue.is_empty()
            && self
                .polled_at
                .is_some_and(|at| deadline.saturating_duration_since(at) > WHEEL_REFRESH)
        {
            // Polled right after the inserts, in this same round.
            self.reset();
        }
        self.queue.insert_at(e, deadline);
    }

    /// Drops every entry and starts an empty wheel.
    fn reset(&mut self) {
        self.queue = DelayQueue::new();
        self.polled_at = None;
    }

    /// Sorts the expired entries in (deadline, order set) order:
    /// the wheel hands out keys due in the same millisecond last-in first.
    /// A batch is never cut short, since cutting it inside a millisecond
    /// would break that order.
    fn sort_expired(&mut self) {
        let Some(&(_, first)) = self.expired.first() else {
            return;
        };
        // Order numbers wrap; in one batch they span far less than 2^31.
        self.expired.sort_unstable_by_key(|&(deadline, e)| {
            (deadline, e.seq.wrapping_sub(first.seq) as i32)
        });
    }
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
    let mut wheel = Wheel::new();
    let mut first_round = true;
    poll_fn(|cx| {
        loop {
            let Some(shared) = queue.upgrade() else {
                return Poll::Ready(());
            };
            let now = Instant::now();
            let mut expired = wheel.expired.drain(..).map(|(_, e)| e).peekable();
            while let Some(&first) = expired.peek() {
                let i = first.shard as usize;
                let mut st = shared.shards[i].state.lock();
                let run = std::iter::from_fn(|| expired.next_if(|e| e.shard == first.shard));
                let fx = st.fire_expired(run, now);
                shared.release(i, st, fx);
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
                wheel.insert(e, e.deadline(epoch));
            }
            // Kept for reuse, but not at the size of a burst long gone.
            taken.shrink_to(KEEP_CAPACITY);
            wheel.incoming = taken;
            wheel.polled_at = Some(now);
            while let Poll::Ready(Some(expired)) = wheel.queue.poll_expired(cx) {
                let deadline = expired.deadline();
                wheel.expired.push((deadline, expired.into_inner()));
            }
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
