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
//! and the first new delay since its last round wakes it.

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
use crate::state::{State, TimerEntry};

/// How long an empty wheel may sit unpolled before an insert starts a fresh
/// one: `DelayQueue` measures deadlines from its last poll and panics on one
/// about two years past it. A wheel with entries is polled at least once a
/// [`MAX_DELAY`](crate::MAX_DELAY), since its earliest entry fires by then.
const WHEEL_REFRESH: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Starts the timer task if there is none, or if the runtime that ran the
/// last one has gone (its wheel went with it, so every pending delay is sent
/// to the new task).
pub(crate) fn ensure_running<K: Key, O: Ordering<K>>(
    shared: &Arc<Shared<K, O>>,
    st: &mut State<K, O>,
) -> Result<(), AddError> {
    if st.timer_running() {
        return Ok(());
    }
    let handle = crate::clock::timed_handle()?;
    if st.timer_task.is_some() {
        st.restart_timers();
    }
    // Unconstrained: tokio's co-operative budget would otherwise cut a burst
    // of keys due in one millisecond into pieces, and the wheel hands those
    // out last-in first, so only a whole burst can be put back in order.
    let task = handle.spawn(tokio::task::unconstrained(run(
        Arc::downgrade(shared),
        st.epoch(),
    )));
    st.timer_task = Some(task.abort_handle());
    Ok(())
}

/// Entries a buffer keeps room for between rounds.
const KEEP_CAPACITY: usize = 1024;

/// The wheel and the task's buffers, kept between polls.
struct Wheel {
    queue: DelayQueue<TimerEntry>,
    /// When `queue` was last polled.
    polled_at: Option<Instant>,
    /// Entries taken from the queue, to insert.
    incoming: Vec<TimerEntry>,
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

/// `epoch` is the state's, which entries' deadlines count from.
async fn run<K: Key, O: Ordering<K>>(queue: Weak<Shared<K, O>>, epoch: Instant) {
    let mut wheel = Wheel::new();
    poll_fn(|cx| {
        loop {
            let Some(shared) = queue.upgrade() else {
                return Poll::Ready(());
            };
            let now = Instant::now();
            let mut st = shared.state.lock();
            if st.timers_done() {
                return Poll::Ready(());
            }
            let expired = wheel.expired.drain(..).map(|(_, e)| e);
            let (fx, fresh) = st.timer_round(cx.waker(), expired, &mut wheel.incoming, now);
            shared.release(st, fx);
            drop(shared);
            if fresh {
                wheel.reset();
            }
            let mut incoming = std::mem::take(&mut wheel.incoming);
            for e in incoming.drain(..) {
                wheel.insert(e, e.deadline(epoch));
            }
            // Swapped with the queue's list next round: kept for reuse, but
            // not at the size of a burst long gone.
            incoming.shrink_to(KEEP_CAPACITY);
            wheel.incoming = incoming;
            wheel.polled_at = Some(now);
            while let Poll::Ready(Some(expired)) = wheel.queue.poll_expired(cx) {
                let deadline = expired.deadline();
                wheel.expired.push((deadline, expired.into_inner()));
            }
            if wheel.expired.is_empty() {
                // A burst's worth of room is not kept.
                wheel.expired.shrink_to(KEEP_CAPACITY);
                return Poll::Pending;
            }
            wheel.sort_expired();
        }
    })
    .await
}
