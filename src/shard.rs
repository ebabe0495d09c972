//! A queue's shards, and what each shows without its lock.
//!
//! A queue splits its keys by hash across shards, each a [`State`] behind a
//! lock of its own: an add, a hand-out and a lease end take only the lock of
//! the key's shard. With one lock, a producer and the consumers collided on
//! most operations, and under contention the lock parks threads: on a
//! 2-core machine about 30 futex calls per 1,000 keys, each a wake through
//! the kernel (expensive on VMs).
//!
//! The shards still hand out one order, which the queue's lanes hold apart
//! from them ([`crate::lanes`]): every key made ready in any shard pushes a
//! ticket to the lane of its priority, and a consumer pops the highest
//! lane's front ticket and takes that shard's lock to lease its key. So the
//! queue hands out the highest priority first and FIFO within a priority,
//! as one ordered list would. (Until 2026-12, each shard published the rank
//! of its next key here, and every hand-out read the ranks of all shards,
//! which the other core's hand-outs and adds kept changing; see
//! `PERFORMANCE.md`.)
//!
//! Only an ordering that hands out highest priority first and FIFO within a
//! priority can be kept in lanes, so only such orderings split (they say
//! so with [`Ordering::split`]: the default
//! [`Priorities`](crate::Priorities) does); any other runs as one shard,
//! which its ordering orders under the shard's lock, and whose mark says
//! whether it holds a ready key. The starvation bound works across
//! shards: each mark also shows when its shard's oldest ready key became
//! ready, and a key past the bound is taken first from whichever shard
//! holds it.
//!
//! A shard's mark also says whether it has closed (shut down, nothing more
//! to hand out) or drained (nothing leased either): the queue is closed or
//! drained when every shard is.

use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::shown::earlier;
use crate::state::State;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::*};

/// Shards a queue has unless told otherwise: the most it takes
/// ([`Builder::shards`](crate::Builder::shards) says what they cost and
/// save).
#[cfg(not(tokio_workqueue_loom))]
pub(crate) const DEFAULT_SHARDS: usize = MAX_SHARDS;
/// Two under loom: enough to explore a hand-out across shards.
#[cfg(tokio_workqueue_loom)]
pub(crate) const DEFAULT_SHARDS: usize = 2;

/// Shards a partition's queue has unless told otherwise: a partitioned
/// queue builds `n` queues at once, each with one consumer task, so the
/// memory of 64 shards apiece (about 110 KB before the first key) would
/// count `n` times, for collisions that one consumer does not make. Eight,
/// the default of every queue before 2026-12-03.
pub(crate) const PARTITION_SHARDS: usize = if DEFAULT_SHARDS < 8 {
    DEFAULT_SHARDS
} else {
    8
};

/// The most shards a queue takes.
pub(crate) const MAX_SHARDS: usize = 64;

/// One shard: its state and lock, on cache lines of its own.
#[repr(align(128))]
pub(crate) struct Shard<K, O: Ordering<K>> {
    pub(crate) state: Mutex<State<K, O>>,
    /// Where the shard's key index is, for prefetching outside the lock.
    pub(crate) layout: SharedLayout,
}

/// What the shards show without their locks, written under them.
///
/// Whether a key is ready shows only for the one shard of a queue that
/// does not split: a split queue's lanes say that, and hold its order. It
/// sits on a line of its own, apart from the lock, which every add writes.
/// The rest of a shard's mark sits on lines of its own: its status, which
/// changes twice in a queue's life, and (with a starvation bound) when its
/// oldest ready key became ready, which changes with every hand-out of that
/// key and every add to an empty shard, so only queues with a bound pay for
/// it.
pub(crate) struct Marks {
    ready: Ready,
    rest: Box<[Mark]>,
    /// Whether the oldest ready keys are shown (with a starvation bound).
    promote: bool,
    /// With a starvation bound: before this time (nanoseconds from the
    /// epoch) no key will be past it, as the last look at every mark that
    /// found none past it worked out ([`oldest_past`]).
    quiet_until: QuietUntil,
}

/// [`Marks::quiet_until`], on a line of its own: every hand-out of a
/// queue with a bound reads it, and only a look at the marks writes it.
#[repr(align(128))]
struct QuietUntil(AtomicU64);

/// Whether a queue's one shard holds a ready key.
#[repr(align(128))]
struct Ready(AtomicBool);

/// The rest of a shard's mark.
#[repr(align(128))]
struct Mark {
    /// Nanoseconds from the queue's epoch at which the shard's oldest ready
    /// key became ready (`u64::MAX`: none); kept with a starvation bound.
    oldest: AtomicU64,
    /// The number that key drew: breaks ties between keys ready at once.
    oldest_seq: AtomicU32,
    status: AtomicU8,
}

const CLOSED: u8 = 1;
const DRAINED: u8 = 2;

impl Marks {
    pub(crate) fn new(shards: usize, promote: bool) -> Self {
        Marks {
            ready: Ready(AtomicBool::new(false)),
            rest: (0..shards)
                .map(|_| Mark {
                    oldest: AtomicU64::new(u64::MAX),
                    oldest_seq: AtomicU32::new(0),
                    status: AtomicU8::new(0),
                })
                .collect(),
            promote,
            quiet_until: QuietUntil(AtomicU64::new(0)),
        }
    }

    /// Publishes whether shard `i` has a key ready (a queue's one shard
    /// only), its oldest ready time (with a starvation bound) and its
    /// status, from `st` under its lock.
    ///
    /// Unchanged values are not written: a write takes the line from every
    /// core that reads it. Nor are they read: only the holder of the
    /// shard's lock writes its mark, so the state keeps what the mark shows
    /// ([`Shown`](crate::shown::Shown)), and a producer adding behind a ready key touches no
    /// line of the marks at all.
    #[inline]
    pub(crate) fn publish<K, O: Ordering<K>>(&self, i: usize, st: &mut State<K, O>) {
        // With lanes, they say whether a key is ready.
        if !st.has_lanes() {
            debug_assert_eq!(i, 0, "a queue that does not split has one shard");
            let ready = st.has_ready();
            if st.shown.ready != ready {
                st.shown.ready = ready;
                // A shard that had no key ready and now has one is the one
                // change a sleeping consumer can have missed, and that
                // store is SeqCst. A consumer going to sleep counts itself
                // in `sleepers`, makes a SeqCst fence and reads this flag
                // (see `Holder::poll_take`, in `take.rs`); every producer
                // from now on reads `sleepers` (SeqCst) after this store,
                // through the lock. If such a load missed the consumer, it
                // would precede the consumer's count and so its fence in
                // the one SeqCst order, and this store, which happens
                // before the load, would too: then the consumer's look sees
                // the key. So either the look sees the key or every later
                // producer sees the consumer, whether it made the shard
                // non-empty or added behind that key, with no fence of its
                // own. The flag going down (a hand-out took the last key)
                // is a release store (on x86 a plain `mov`; a SeqCst store
                // is an `xchg`, a full barrier).
                //
                // loom models SeqCst stores as release stores only, so
                // under loom a fence stands in for what the SeqCst order
                // gives here (`two_producers_of_one_shard_wake_two_consumers`
                // fails without it).
                let order = if ready { SeqCst } else { Release };
                self.ready.0.store(ready, order);
                #[cfg(tokio_workqueue_loom)]
                if ready {
                    crate::sync::atomic::fence(SeqCst);
                }
            }
        }
        let m = &self.rest[i];
        if self.promote {
            let oldest = st.oldest_ready().unwrap_or((u64::MAX, 0));
            if st.shown.oldest != oldest {
                st.shown.oldest = oldest;
                // Release, not SeqCst (on x86 a plain `mov`, not an `xchg`
                // that waits for every store before it): the oldest ready
                // time takes no part in waking consumers (a key past the
                // bound has a ticket in a lane too), and a pick made from
                // it is checked under the shard's lock. Its holder's unlock
                // makes it visible before the next holder can change it.
                // With a 60 s bound, W1 ran 1.056x / 1.022x by the best
                // runs (7 of 10 ahead) on the Zen 3 VM of 2026-12-04.
                m.oldest.store(oldest.0, Release);
                m.oldest_seq.store(oldest.1, Release);
            }
        }
        let status = (u8::from(st.is_closed()) * CLOSED) | (u8::from(st.is_drained()) * DRAINED);
        if st.shown.status != status {
            st.shown.status = status;
            m.status.store(status, SeqCst);
        }
    }

    /// Whether a queue's one shard has a key ready (a split queue's lanes
    /// say that of theirs).
    pub(crate) fn any_ready(&self) -> bool {
        self.ready.0.load(Acquire)
    }

    /// Whether every shard is closed (shut down, nothing more to hand out).
    pub(crate) fn all_closed(&self) -> bool {
        self.rest
            .iter()
            .all(|m| m.status.load(SeqCst) & CLOSED != 0)
    }

    /// Whether every shard is drained (closed, and nothing leased).
    pub(crate) fn all_drained(&self) -> bool {
        self.rest
            .iter()
            .all(|m| m.status.load(SeqCst) & DRAINED != 0)
    }
}

/// What a hand-out found in the marks: the shard to take from and what it
/// must still show once its lock is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// A queue's one shard, which has a key ready.
    Ready,
    /// The shard whose oldest ready key is the oldest past the starvation
    /// bound, and that key's ready time and number.
    Oldest(usize, u64, u32),
}

impl Pick {
    pub(crate) fn shard(self) -> usize {
        match self {
            Pick::Ready => 0,
            Pick::Oldest(i, _, _) => i,
        }
    }

    /// Whether `st`, the picked shard's state under its lock, still hands
    /// out what the marks showed: if not, another consumer took it, and
    /// the marks are read again.
    pub(crate) fn holds<K, O: Ordering<K>>(self, st: &State<K, O>) -> bool {
        match self {
            Pick::Ready => st.has_ready(),
            Pick::Oldest(_, at, seq) => st.oldest_ready() == Some((at, seq)),
        }
    }
}

/// The shard to take from (`None` if no key is ready): with a starvation
/// bound (`promote`: the age past which keys go first, and the
/// epoch-relative `now`), the one whose oldest key is the oldest past it;
/// else, in a queue of one shard, that shard if it has a key ready. (A
/// split queue asks only for the oldest key: its lanes hold the rest.)
///
/// The oldest ready times are read once, not until two reads agree: the
/// starvation bound is a bound on waiting, not an order.
#[inline]
pub(crate) fn pick(marks: &Marks, promote: Option<(u64, u64)>) -> Option<Pick> {
    if let Some(promote) = promote
        && let Some(oldest) = oldest_past(marks, promote)
    {
        return Some(oldest);
    }
    marks.any_ready().then_some(Pick::Ready)
}

/// The shard whose oldest ready key is the oldest past the bound (`after`,
/// at the epoch-relative `now`), if any, as a [`Pick::Oldest`]: what a
/// split queue asks before it looks at its lanes. Kept out of line, so
/// that a queue without a bound does not run its prologue on every
/// hand-out.
///
/// A look reads every shard's mark, 64 lines with 64 shards, which the
/// other cores' hand-outs keep rewriting. So a look that finds no key past
/// the bound notes when the earliest could be: the oldest ready time it
/// saw (or `now`, if that is earlier or it saw none) plus the bound. Until
/// then a hand-out reads that one note and looks no further. A key made
/// ready later has a later ready time, or one taken before its add took
/// effect (the add reads the clock before it takes its shard's lock), and
/// then no earlier than the look's `now` if its add took effect after the
/// look had passed its shard. So every key is promoted by the bound after
/// its ready time, or after its add took effect if that was later, which
/// it is by the add's own duration. A note more than a bound ahead of
/// `now` means the clock went back (a queue moved from a paused clock that
/// ran ahead to the real one): the hand-out looks.
///
/// On the Zen 3 VM of 2026-12-04, W1 with a bound that promoted nothing
/// ran 0.49x as fast as without one, and skipping the look 1.18-1.24x as
/// fast as with it (`PERFORMANCE.md`).
#[inline(never)]
pub(crate) fn oldest_past(marks: &Marks, (after, now): (u64, u64)) -> Option<Pick> {
    let quiet = marks.quiet_until.0.load(Relaxed);
    if now < quiet && quiet - now <= after {
        return None;
    }
    let mut oldest: Option<(usize, u64, u32)> = None;
    let mut earliest = now;
    for (i, m) in marks.rest.iter().enumerate() {
        let (at, seq) = (m.oldest.load(SeqCst), m.oldest_seq.load(SeqCst));
        earliest = earliest.min(at);
        if at == u64::MAX || now.saturating_sub(at) < after {
            continue;
        }
        // Ready at the same time: the one that drew the earlier number.
        let older = oldest.is_none_or(|(_, best_at, best_seq)| {
            at < best_at || (at == best_at && earlier(seq, best_seq))
        });
        if older {
            oldest = Some((i, at, seq));
        }
    }
    if oldest.is_none() {
        marks
            .quiet_until
            .0
            .store(earliest.saturating_add(after), Relaxed);
    }
    oldest.map(|(i, at, seq)| Pick::Oldest(i, at, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shows shard `i`'s oldest ready key as ready at `at`, number `seq`,
    /// as its lock's holder would.
    fn show_oldest(marks: &Marks, i: usize, at: u64, seq: u32) {
        marks.rest[i].oldest.store(at, SeqCst);
        marks.rest[i].oldest_seq.store(seq, SeqCst);
    }

    /// With a starvation bound, `pick` names the shard whose oldest key is
    /// the oldest past the bound, with that key's time and number exactly,
    /// and with no key past the bound, the one shard if it has a key.
    #[test]
    fn pick_finds_the_oldest_key_past_the_bound() {
        for shards in [1, 2, 8, 64] {
            let marks = Marks::new(shards, true);
            // Before the keys below became ready: nothing.
            assert_eq!(pick(&marks, Some((500, 30))), None, "{shards} shards");
            let last = shards - 1;
            // Shard `last` holds the oldest key; its number has the top bit
            // set, and ties on time go to the earlier number.
            for (i, at, seq) in [(0, 100, 3), (last, 40, u32::MAX - 1)] {
                show_oldest(&marks, i, at, seq);
            }
            let now = 1_000;
            assert_eq!(
                pick(&marks, Some((500, now))),
                Some(Pick::Oldest(last, 40, u32::MAX - 1)),
                "{shards} shards"
            );
            // Nothing past a longer bound: nothing, or the ready shard.
            assert_eq!(pick(&marks, Some((5_000, now))), None, "{shards} shards");
            marks.ready.0.store(true, SeqCst);
            assert_eq!(
                pick(&marks, Some((5_000, now))),
                Some(Pick::Ready),
                "{shards} shards"
            );
            assert_eq!(pick(&marks, None), Some(Pick::Ready), "{shards} shards");
        }
    }

    /// A look that finds no key past the bound is not made again until
    /// one could be: the oldest ready time it saw plus the bound, or its
    /// own time plus the bound for a key that shows up later with an
    /// earlier ready time (an add that read the clock before the look and
    /// took effect after it). A note more than a bound ahead of the clock
    /// is not trusted.
    #[test]
    fn a_look_that_finds_none_past_the_bound_waits_until_one_could_be() {
        let marks = Marks::new(8, true);
        let set = |i, at| show_oldest(&marks, i, at, 0);
        // A bound of 500: what a look at `now` picks.
        let look = |now| oldest_past(&marks, (500, now));
        set(3, 100);
        assert_eq!(look(400), None);
        // The earliest a key can be past the bound is 100 + 500.
        set(5, 50);
        assert_eq!(look(599), None);
        assert_eq!(look(600), Some(Pick::Oldest(5, 50, 0)));
        // Past the bound no note is left: each hand-out looks.
        assert_eq!(look(601), Some(Pick::Oldest(5, 50, 0)));
        // Both taken, a look at 1_000 with nothing ready notes 1_500: a key
        // that then shows up ready since 900 waits for that.
        set(5, u64::MAX);
        set(3, u64::MAX);
        assert_eq!(look(1_000), None);
        set(1, 900);
        assert_eq!(look(1_499), None);
        assert_eq!(look(1_500), Some(Pick::Oldest(1, 900, 0)));
        // The clock went back by more than the bound: the note is not
        // trusted and the marks are read.
        set(1, u64::MAX);
        assert_eq!(look(10_000), None);
        set(2, 0);
        assert_eq!(look(9_000), Some(Pick::Oldest(2, 0, 0)));
    }

    /// Two shards' oldest keys ready at the same time: the one that drew
    /// the earlier number goes first, numbers wrapping.
    #[test]
    fn pick_breaks_ties_on_time_by_the_earlier_number() {
        let marks = Marks::new(2, true);
        for (i, seq) in [(0, 5), (1, u32::MAX)] {
            show_oldest(&marks, i, 40, seq);
        }
        assert_eq!(
            pick(&marks, Some((10, 100))),
            Some(Pick::Oldest(1, 40, u32::MAX))
        );
    }
}
