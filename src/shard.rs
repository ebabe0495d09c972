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
//! which its ordering orders under the shard's lock, and whose mark's rank
//! says whether it holds a ready key. The starvation bound works across
//! shards: each mark also shows when its shard's oldest ready key became
//! ready, and a key past the bound is taken first from whichever shard
//! holds it.
//!
//! A shard's mark also says whether it has closed (shut down, nothing more
//! to hand out) or drained (nothing leased either): the queue is closed or
//! drained when every shard is.

use crate::ordering::Ordering;
use crate::prefetch::SharedLayout;
use crate::rank::{EMPTY, before, earlier};
use crate::state::State;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::*};

/// Shards a queue has unless told otherwise (see
/// [`Builder::shards`](crate::Builder::shards)).
#[cfg(not(tokio_workqueue_loom))]
pub(crate) const DEFAULT_SHARDS: usize = 8;
/// Two under loom: enough to explore a hand-out across shards.
#[cfg(tokio_workqueue_loom)]
pub(crate) const DEFAULT_SHARDS: usize = 2;

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
/// A rank says whether a shard holds a ready key, and only the one shard of
/// a queue that does not split shows one (the lanes hold a split queue's
/// order, and its ranks stay [`EMPTY`]); the ranks sit eight to a cache
/// line, apart from the locks, which every add writes. The rest of a
/// shard's mark (its oldest ready key, with a starvation bound, and its
/// status) changes rarely, and sits on lines of its own.
pub(crate) struct Marks {
    ranks: Box<[RankLine]>,
    rest: Box<[Mark]>,
    /// Whether the oldest ready keys are shown (with a starvation bound).
    promote: bool,
}

/// Eight shards' ranks, on one cache line.
#[repr(align(64))]
struct RankLine([AtomicU64; 8]);

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
        let line = || RankLine(std::array::from_fn(|_| AtomicU64::new(EMPTY)));
        Marks {
            ranks: (0..shards.div_ceil(8)).map(|_| line()).collect(),
            rest: (0..shards)
                .map(|_| Mark {
                    oldest: AtomicU64::new(u64::MAX),
                    oldest_seq: AtomicU32::new(0),
                    status: AtomicU8::new(0),
                })
                .collect(),
            promote,
        }
    }

    fn len(&self) -> usize {
        self.rest.len()
    }

    fn rank_of(&self, i: usize) -> &AtomicU64 {
        &self.ranks[i / 8].0[i % 8]
    }

    /// Publishes shard `i`'s next rank, oldest ready time (with a
    /// starvation bound) and status, from `st` under its lock.
    ///
    /// Unchanged values are not written: a write takes the line from every
    /// core that reads it. Nor are they read: only the holder of the
    /// shard's lock writes its mark, so the state keeps what the mark shows
    /// ([`Shown`](crate::rank::Shown)), and a producer adding behind the shard's next key
    /// touches no line of the marks at all (the consumers write the rank
    /// line on every hand-out, so reading it would miss).
    #[inline]
    pub(crate) fn publish<K, O: Ordering<K>>(&self, i: usize, st: &mut State<K, O>) {
        // With lanes, they hold the order, and the ranks stay empty.
        let rank = if st.has_lanes() {
            EMPTY
        } else {
            st.head_rank()
        };
        let changed = st.shown.rank != rank;
        if changed {
            // A hand-out showing the next key (or none), or a key put in
            // front, is a release store (on x86 a plain `mov`; a SeqCst
            // store is an `xchg`, a full barrier), and consumers read ranks
            // with acquire loads, which is all `pick` needs: a rank seen
            // brings every rank stored before it.
            //
            // A shard that was empty and now shows a key is the one change
            // a sleeping consumer can have missed, and that store is SeqCst.
            // A consumer going to sleep counts itself in `sleepers`, makes a
            // SeqCst fence and reads the ranks (see `Holder::poll_take`, in
            // `take.rs`);
            // every producer of this shard from now on reads `sleepers`
            // (SeqCst) after this store, through the lock. If such a load
            // missed the consumer, it would precede the consumer's count and
            // so its fence in the one SeqCst order, and this store, which
            // happens before the load, would too: then the consumer's look
            // sees the key. So either the look sees the key or every later
            // producer sees the consumer, whether it made the shard
            // non-empty or added behind that key, with no fence of its own.
            //
            // loom models SeqCst stores as release stores only, so under
            // loom a fence stands in for what the SeqCst order gives here
            // (`two_producers_of_one_shard_wake_two_consumers` fails
            // without it). A release store followed by this fence, in the
            // real build, measured 1-2 % slower than the `xchg` alone.
            let was_empty = st.shown.rank == EMPTY;
            st.shown.rank = rank;
            let order = if was_empty { SeqCst } else { Release };
            self.rank_of(i).store(rank, order);
            #[cfg(tokio_workqueue_loom)]
            if was_empty {
                crate::sync::atomic::fence(SeqCst);
            }
        }
        let m = &self.rest[i];
        if self.promote {
            let oldest = st.oldest_ready().unwrap_or((u64::MAX, 0));
            if st.shown.oldest != oldest {
                st.shown.oldest = oldest;
                m.oldest.store(oldest.0, SeqCst);
                m.oldest_seq.store(oldest.1, SeqCst);
            }
        }
        let status = (u8::from(st.is_closed()) * CLOSED) | (u8::from(st.is_drained()) * DRAINED);
        if st.shown.status != status {
            st.shown.status = status;
            m.status.store(status, SeqCst);
        }
    }

    /// Whether any shard has a key ready.
    pub(crate) fn any_ready(&self) -> bool {
        (0..self.len()).any(|i| self.rank_of(i).load(Acquire) != EMPTY)
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
    /// The shard whose next key ranks first, and that rank.
    First(usize, u64),
    /// The shard whose oldest ready key is the oldest past the starvation
    /// bound, and that key's ready time and number.
    Oldest(usize, u64, u32),
}

impl Pick {
    pub(crate) fn shard(self) -> usize {
        match self {
            Pick::First(i, _) | Pick::Oldest(i, _, _) => i,
        }
    }

    /// Whether `st`, the picked shard's state under its lock, still hands
    /// out the key the marks showed: if not, another consumer took it, and
    /// the marks are read again.
    pub(crate) fn holds<K, O: Ordering<K>>(self, st: &mut State<K, O>) -> bool {
        match self {
            Pick::First(_, rank) => st.head_rank() == rank,
            Pick::Oldest(_, at, seq) => st.oldest_ready() == Some((at, seq)),
        }
    }
}

/// The shard to take from (`None` if no shard has a key ready): the one
/// whose next key ranks first, or with a starvation bound (`promote`: the
/// age past which keys go first, and the epoch-relative `now`), the one
/// whose oldest key is the oldest past it.
///
/// The ranks are read until two reads in a row agree, so the answer holds
/// for one moment across all shards: read once, a shard read early could
/// have been empty and one read late could show a key added after the
/// first shard's, which would then go first. (The oldest ready times are
/// read once: the starvation bound is a bound on waiting, not an order.)
///
/// This is only the unpacking of [`pick_packed`]'s answer, in the caller.
#[inline(always)]
pub(crate) fn pick(marks: &Marks, promote: Option<(u64, u64)>) -> Option<Pick> {
    pick_packed(marks, promote).unpack()
}

/// [`pick`]'s answer in two words, so that it comes back in registers.
///
/// As an `Option<Pick>` (24 bytes) it came back through memory, written
/// in pieces and read back 16 bytes at a time by the caller's copy, a
/// load no store can forward: it waited for the stores to reach the
/// cache (about 7 % of a hand-out's samples in W2 on an AMD EPYC VM).
/// Packed, in two sets of 8 paired rounds on that VM: W1 1.024x and
/// 1.014x, W1-100k 1.045x and 1.043x (ahead in 10 of 10), W2 0.995x and
/// 1.041x, W4 1.081x and 1.061x.
#[derive(Debug, Clone, Copy)]
struct Packed {
    /// The rank, or the oldest key's ready time.
    word: u64,
    /// The shard in bits 32-39, the oldest key's number in bits 0-31,
    /// [`OLDEST`] for an oldest key; [`Packed::NONE`] for no key.
    tag: u64,
}

const OLDEST: u64 = 1 << 63;

impl Packed {
    const NONE: Packed = Packed {
        word: 0,
        tag: u64::MAX,
    };

    #[inline(always)]
    fn first(found: Option<(usize, u64)>) -> Packed {
        match found {
            Some((i, rank)) => Packed {
                word: rank,
                tag: (i as u64) << 32,
            },
            None => Packed::NONE,
        }
    }

    #[inline(always)]
    fn oldest(i: usize, at: u64, seq: u32) -> Packed {
        Packed {
            word: at,
            tag: OLDEST | (i as u64) << 32 | u64::from(seq),
        }
    }

    #[inline(always)]
    fn unpack(self) -> Option<Pick> {
        if self.tag == u64::MAX {
            return None;
        }
        let i = ((self.tag >> 32) & 0xff) as usize;
        Some(if self.tag & OLDEST != 0 {
            Pick::Oldest(i, self.word, self.tag as u32)
        } else {
            Pick::First(i, self.word)
        })
    }
}

/// The body of [`pick`].
///
/// The common case, one line of ranks and no starvation bound, is all this
/// function holds; the rest is [`pick_any`], kept out of line. With both in
/// one function, every hand-out ran the prologue of the rare case (a frame
/// sized for the 64 ranks of a many-line queue, 616 bytes against 168 now).
/// Split, the hand-out paths were 6-13 % faster in paired rounds on an AMD
/// EPYC VM (W1, W1-100k, W2, W4), more than the smaller prologue explains
/// on its own, so code placement may have a part in it; forcing this
/// function into its caller (`inline(always)`) was 5-9 % slower than
/// leaving it a call.
#[inline]
fn pick_packed(marks: &Marks, promote: Option<(u64, u64)>) -> Packed {
    if promote.is_none()
        && let [line] = &*marks.ranks
    {
        return Packed::first(pick_in_line(line, marks.len()));
    }
    pick_any(marks, promote)
}

/// [`pick`] with a starvation bound, or with ranks on more than one line.
#[inline(never)]
fn pick_any(marks: &Marks, promote: Option<(u64, u64)>) -> Packed {
    if let Some((after, now)) = promote {
        let mut oldest: Option<(usize, u64, u32)> = None;
        for (i, m) in marks.rest.iter().enumerate() {
            let (at, seq) = (m.oldest.load(SeqCst), m.oldest_seq.load(SeqCst));
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
        if let Some((i, at, seq)) = oldest {
            return Packed::oldest(i, at, seq);
        }
    }
    // A bound with no key past it: the one-line path again. `pick` taking
    // it itself after an out-of-line look at the bound, so that it is
    // written once, made every hand-out about 5 % slower (W1, W1-100k, W2
    // and W4 in paired rounds on an AMD EPYC VM): this code is sensitive
    // to where its branches and calls fall.
    if let [line] = &*marks.ranks {
        return Packed::first(pick_in_line(line, marks.len()));
    }
    let mut seen = [EMPTY; MAX_SHARDS];
    let seen = &mut seen[..marks.len()];
    // The first read only fills `seen` (or, finding every shard empty,
    // agrees with "all empty" at once); the second follows it without a
    // pause, which costs tens to hundreds of cycles and is for marks that
    // are changing, not for every hand-out.
    let (mut changed, mut best) = read(marks, seen);
    if changed {
        (changed, best) = read(marks, seen);
    }
    while changed {
        crate::sync::spin();
        (changed, best) = read(marks, seen);
    }
    Packed::first(best)
}

/// [`pick`]'s reads for a queue of at most eight shards, whose ranks are
/// one line: the line is copied whole, and the first shard found only in
/// the copy the next copy agrees with. (Each copy is eight loads of one
/// line, with no bounds to check; the ranks of shards a queue does not
/// have stay [`EMPTY`].) This is the path of every queue of the default
/// eight shards, and of one shard; it kept about a third of `pick`'s
/// samples in a single-thread profile.
///
/// The copies are compared by folding their words, not with `==`: on
/// arrays `==` became a call to `memcmp`, whose vector loads read back
/// the copy's eight 8-byte stores 32 bytes at a time, a load no store can
/// forward, so it waited for the stores to reach the cache (10 % of W2's
/// samples on an AMD EPYC VM, all of them under `pick`).
#[inline]
fn pick_in_line(line: &RankLine, shards: usize) -> Option<(usize, u64)> {
    let mut seen = copy(line, shards);
    // Every rank is EMPTY (all ones) exactly when their AND is.
    if seen.iter().fold(EMPTY, |all, &r| all & r) == EMPTY {
        return None;
    }
    let mut now = copy(line, shards);
    while now.iter().zip(&seen).fold(0, |diff, (a, b)| diff | (a ^ b)) != 0 {
        crate::sync::spin();
        seen = now;
        now = copy(line, shards);
    }
    first(&now)
}

/// The ranks of one line. Under loom only those of the queue's shards
/// (each load is a branch of the model); otherwise all eight, the rest
/// being [`EMPTY`] for good.
#[inline]
fn copy(line: &RankLine, shards: usize) -> [u64; 8] {
    let n = if cfg!(tokio_workqueue_loom) {
        shards
    } else {
        8
    };
    let mut out = [EMPTY; 8];
    for (o, r) in out.iter_mut().zip(&line.0).take(n) {
        *o = r.load(Acquire);
    }
    out
}

/// The shard whose rank goes first among `ranks`, with that rank.
#[inline]
fn first(ranks: &[u64; 8]) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for (i, &r) in ranks.iter().enumerate() {
        if r != EMPTY && best.is_none_or(|(_, b)| before(r, b)) {
            best = Some((i, r));
        }
    }
    best
}

/// Reads every mark's rank into `seen`: whether any differs from what
/// `seen` held, and the shard whose rank goes first, with that rank.
#[inline]
fn read(marks: &Marks, seen: &mut [u64]) -> (bool, Option<(usize, u64)>) {
    let mut best: Option<(usize, u64)> = None;
    let mut changed = false;
    for (i, s) in seen.iter_mut().enumerate() {
        let r = marks.rank_of(i).load(Acquire);
        changed |= r != *s;
        *s = r;
        if r != EMPTY && best.is_none_or(|(_, b)| before(r, b)) {
            best = Some((i, r));
        }
    }
    (changed, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::rank;

    /// With a starvation bound, `pick` names the shard whose oldest key is
    /// the oldest past the bound, with that key's time and number exactly
    /// (they come back packed in two words), and the first rank when no
    /// key is past the bound.
    #[test]
    fn pick_finds_the_oldest_key_past_the_bound() {
        for shards in [2, 8, 64] {
            let marks = Marks::new(shards, true);
            let last = shards - 1;
            marks.rank_of(0).store(rank(0, 5), Release);
            marks.rank_of(last).store(rank(0, 9), Release);
            // Shard `last` holds the oldest key; its number has the top bit
            // set, and ties on time go to the earlier number.
            for (i, at, seq) in [(0, 100, 3), (last, 40, u32::MAX - 1)] {
                marks.rest[i].oldest.store(at, SeqCst);
                marks.rest[i].oldest_seq.store(seq, SeqCst);
            }
            let now = 1_000;
            assert_eq!(
                pick(&marks, Some((500, now))),
                Some(Pick::Oldest(last, 40, u32::MAX - 1)),
                "{shards} shards"
            );
            // Nothing past a longer bound: the first rank.
            assert_eq!(
                pick(&marks, Some((5_000, now))),
                Some(Pick::First(0, rank(0, 5))),
                "{shards} shards"
            );
        }
    }

    /// `pick` reads a queue of up to eight shards as one line, and more
    /// line by line: both find the shard whose rank goes first, and none
    /// when every shard is empty.
    #[test]
    fn pick_finds_the_first_rank_whatever_the_number_of_shards() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for shards in [1, 2, 4, 8, 16, 64] {
            let marks = Marks::new(shards, false);
            assert_eq!(pick(&marks, None), None, "{shards} empty shards");
            for round in 0..200u32 {
                let mut expected: Option<(usize, u64)> = None;
                for i in 0..shards {
                    let r = match next() % 4 {
                        0 => EMPTY,
                        // Distinct numbers, some wrapped past u32::MAX.
                        k => rank(k as i32 - 2, (round * 64 + i as u32).wrapping_sub(1000)),
                    };
                    marks.rank_of(i).store(r, Release);
                    if r != EMPTY && expected.is_none_or(|(_, b)| before(r, b)) {
                        expected = Some((i, r));
                    }
                }
                let found = pick(&marks, None);
                assert_eq!(
                    found,
                    expected.map(|(i, r)| Pick::First(i, r)),
                    "{shards} shards, round {round}"
                );
            }
        }
    }
}
