//! One lane: a first-in, first-out queue of tickets, with a lock for the
//! producers' end and another for the consumers'.
//!
//! A queue split into shards keeps the order in which its keys go out
//! apart from the shards: every key made ready in any shard pushes a
//! ticket (its shard and slot, four bytes) to the lane of its priority
//! ([`crate::lanes`]), and a consumer pops the ticket at the front of the
//! highest lane and then takes that one shard's lock to lease the key. An
//! add and a hand-out then meet on a shard's lock only when they are about
//! the same shard, and the cores exchange the front and the back of a
//! lane, not the shards' state (see `PERFORMANCE.md`, "The ready order
//! apart from the keys").
//!
//! The tickets sit in blocks of [`BLOCK`] slots, linked front to back. The
//! holder of the back's lock writes a slot (a ticket is never zero); the
//! holder of the front's lock reads the slot at the front, and finds a
//! ticket there or the zero of one not written yet, so the two ends touch
//! the same memory only where the lane is short (the count of tickets
//! pushed, which the back keeps, is read only by a consumer about to
//! sleep). This is the two-lock queue of Michael and Scott, in blocks: the
//! locks are held for a few instructions, never across a hash lookup or an
//! allocation but a new block's (and a block emptied at the front is kept
//! for the back's next, so a steady lane allocates nothing).
//!
//! A consumer that pops a ticket also reads, as a hint, the ticket a few
//! places behind it, if written, and fetches that key's node early
//! ([`FrontGuard::pop`]); on a short lane that ticket is not there yet.
//!
//! Every ticket ever pushed has a position (0, 1, 2...): a shard keeps the
//! position of its key's live ticket, so that one popped out of turn (a
//! key raised to another lane, or taken by the starvation bound, has left
//! a ticket behind) is known as stale and skipped.

use std::ptr;

use crate::sync::Mutex;
use crate::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};

/// Tickets per block: 4 KiB of them. Two under loom, so that the models
/// cross blocks.
#[cfg(not(tokio_workqueue_loom))]
pub(crate) const BLOCK: usize = 1024;
#[cfg(tokio_workqueue_loom)]
pub(crate) const BLOCK: usize = 2;

/// How many tickets behind the one popped lies the one whose node a
/// consumer prefetches (see [`FrontGuard::pop`]).
///
/// On a long lane any distance is in time; on a short one the tickets
/// right behind the front were pushed moments ago, their nodes are still
/// in the producer's cache, and fetching one early only pulls a line the
/// producer may write again. Four behind, a ticket exists only where the
/// lane is at least that long. In paired rounds on an AMD EPYC (Zen 4)
/// VM, against no prefetch, with an earlier form of the hint (an address
/// stored beside each ticket): one behind gave W1 1.11x, four 1.16x (ahead
/// in 10 of 12 rounds) and eight 1.20x. Under loom, where a block holds
/// two tickets, no ticket is ever four behind in the same block, so the
/// models meet none of this.
const AHEAD: usize = 4;

struct Block {
    /// Tickets, zero until written (by the back's lock holder, with a
    /// release store; the front's reads them with acquire loads, and the
    /// one [`AHEAD`] behind the front with a relaxed load, as a hint).
    slots: [AtomicU32; BLOCK],
    /// The next block, set (release) when the back first needs it.
    next: AtomicPtr<Block>,
}

impl Block {
    fn new() -> *mut Block {
        Box::into_raw(Box::new(Block {
            slots: std::array::from_fn(|_| AtomicU32::new(0)),
            next: AtomicPtr::new(ptr::null_mut()),
        }))
    }
}

/// One end of the lane: the block it is in and the place in it.
struct End {
    block: *mut Block,
    at: usize,
}

/// The back, on cache lines of its own: producers write them.
#[repr(align(128))]
struct Back {
    end: Mutex<End>,
    /// Tickets pushed so far: the position of the next one.
    pushed: AtomicU64,
}

/// The front, on cache lines of its own: consumers write them.
#[repr(align(128))]
struct Front {
    end: Mutex<End>,
    /// Tickets popped so far: the position of the next one.
    popped: AtomicU64,
    /// A block the front has left, kept for the back's next.
    spare: Mutex<*mut Block>,
}

/// A FIFO of `u32` tickets (see the [module docs](self)).
pub(crate) struct Lane {
    back: Back,
    front: Front,
}

// SAFETY: the blocks are reached only through the two ends, each under its
// lock, and everything in a block is atomic. A block is freed or reused
// only once the front has passed it (its `next` was set, so the back had
// left it), when neither end can reach it.
unsafe impl Send for Lane {}
unsafe impl Sync for Lane {}

impl Lane {
    pub(crate) fn new() -> Self {
        let first = Block::new();
        Lane {
            back: Back {
                end: Mutex::new(End {
                    block: first,
                    at: 0,
                }),
                pushed: AtomicU64::new(0),
            },
            front: Front {
                end: Mutex::new(End {
                    block: first,
                    at: 0,
                }),
                popped: AtomicU64::new(0),
                spare: Mutex::new(ptr::null_mut()),
            },
        }
    }

    #[cfg(all(test, not(tokio_workqueue_loom)))]
    pub(crate) fn push(&self, ticket: u32) -> u64 {
        self.back().push(ticket)
    }

    /// The back, locked, for a producer to push to.
    pub(crate) fn back(&self) -> BackGuard<'_> {
        BackGuard {
            lane: self,
            end: self.back.end.lock(),
        }
    }

    /// Both ends, locked (back first, as every holder of both takes them):
    /// nothing is pushed or popped while they are held.
    pub(crate) fn both(&self) -> (BackGuard<'_>, FrontGuard<'_>) {
        let back = self.back();
        (back, self.front())
    }

    /// A block for the back: the front's spare, or a new one.
    fn block(&self) -> *mut Block {
        let spare = std::mem::replace(&mut *self.front.spare.lock(), ptr::null_mut());
        if spare.is_null() {
            return Block::new();
        }
        // SAFETY: the front has passed the spare block, so nothing else
        // reaches it. Its slots are zeroed: a zero is a ticket not written
        // yet.
        let block = unsafe { &*spare };
        for slot in &block.slots {
            slot.store(0, Relaxed);
        }
        block.next.store(ptr::null_mut(), Relaxed);
        spare
    }

    /// The front, locked, for a consumer to look at its ticket and take it.
    pub(crate) fn front(&self) -> FrontGuard<'_> {
        FrontGuard {
            lane: self,
            end: self.front.end.lock(),
        }
    }

    /// Whether no ticket is left (stale ones included). Racy by nature:
    /// for a consumer deciding whether to sleep (see [`push`](BackGuard::push)).
    ///
    /// A consumer can take a ticket between its write and its count, so
    /// the tickets popped may run one ahead of those counted: that too is
    /// empty (the ticket is gone already).
    pub(crate) fn is_empty(&self) -> bool {
        let popped = self.front.popped.load(SeqCst);
        self.back.pushed.load(SeqCst) <= popped
    }

    /// Tickets in the lane, stale ones included.
    #[cfg(all(test, not(tokio_workqueue_loom)))]
    pub(crate) fn len(&self) -> u64 {
        let popped = self.front.popped.load(SeqCst);
        self.back.pushed.load(SeqCst).saturating_sub(popped)
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let mut block = self.front.end.get_mut().block;
        while !block.is_null() {
            // SAFETY: the lane is gone, and each block is on the list once.
            let next = unsafe { (*block).next.load(Relaxed) };
            drop(unsafe { Box::from_raw(block) });
            block = next;
        }
        let spare = *self.front.spare.get_mut();
        if !spare.is_null() {
            // SAFETY: the spare is off the list.
            drop(unsafe { Box::from_raw(spare) });
        }
    }
}

/// A lane's back, locked: no other producer pushes while it is held.
pub(crate) struct BackGuard<'a> {
    lane: &'a Lane,
    end: crate::sync::MutexGuard<'a, End>,
}

impl BackGuard<'_> {
    /// Appends `ticket` and gives its position.
    ///
    /// The count that publishes it is a sequentially consistent store: a
    /// consumer that goes to sleep counts itself among the sleepers, makes
    /// a sequentially consistent fence and then looks at the lanes
    /// ([`is_empty`](Lane::is_empty)), while a producer looks at the
    /// sleepers after this store, so one of the two sees the other.
    pub(crate) fn push(mut self, ticket: u32) -> u64 {
        debug_assert_ne!(ticket, 0, "a ticket is never zero");
        let back = &mut *self.end;
        if back.at == BLOCK {
            let next = self.lane.block();
            // SAFETY: the back's block lives until the front has passed
            // it, which needs this `next`.
            unsafe { (*back.block).next.store(next, Release) };
            back.block = next;
            back.at = 0;
        }
        // SAFETY: as above.
        unsafe { (*back.block).slots[back.at].store(ticket, Release) };
        back.at += 1;
        let at = self.lane.back.pushed.load(Relaxed);
        self.lane.back.pushed.store(at + 1, SeqCst);
        // loom models SeqCst stores as release stores: the fence stands
        // in for the order the store has in the real build.
        #[cfg(tokio_workqueue_loom)]
        crate::sync::atomic::fence(SeqCst);
        at
    }
}

/// A lane's front, locked: no other consumer pops while it is held.
pub(crate) struct FrontGuard<'a> {
    lane: &'a Lane,
    end: crate::sync::MutexGuard<'a, End>,
}

impl FrontGuard<'_> {
    /// The front ticket and its position, if any.
    pub(crate) fn peek(&mut self) -> Option<(u32, u64)> {
        if self.end.at == BLOCK {
            let old = self.end.block;
            // SAFETY: the front's block lives until the front leaves it.
            let next = unsafe { (*old).next.load(Acquire) };
            if next.is_null() {
                return None;
            }
            self.end.block = next;
            self.end.at = 0;
            // Neither end reaches `old` now: it becomes the spare, or goes.
            let mut spare = self.lane.front.spare.lock();
            if spare.is_null() {
                *spare = old;
            } else {
                drop(spare);
                // SAFETY: as above.
                drop(unsafe { Box::from_raw(old) });
            }
        }
        // SAFETY: as above.
        let ticket = unsafe { (*self.end.block).slots[self.end.at].load(Acquire) };
        (ticket != 0).then(|| (ticket, self.lane.front.popped.load(Relaxed)))
    }

    /// Takes the front ticket, which [`peek`](Self::peek) just gave, and
    /// gives the ticket [`AHEAD`] behind it, if that one is written and in
    /// the same block (0 otherwise): the key whose node to prefetch.
    ///
    /// A hand-out reads its ticket's node under the shard's lock, and on a
    /// long lane its producer wrote that node long ago: it has left the
    /// caches close to the consumers (a profile of W1 on an AMD EPYC VM
    /// put a third of the hand-out's samples on that read). Prefetched a
    /// few hand-outs ahead, the fetch overlaps with the hand-outs and work
    /// in between instead. The ticket is read with a relaxed load: it is
    /// only a hint, and a ticket not yet seen reads as none.
    pub(crate) fn pop(mut self) -> u32 {
        debug_assert!(self.end.at < BLOCK);
        self.end.at += 1;
        let at = self.lane.front.popped.load(Relaxed);
        self.lane.front.popped.store(at + 1, Release);
        let ahead = self.end.at + AHEAD - 1;
        if ahead >= BLOCK {
            return 0;
        }
        // SAFETY: the front's block lives until the front leaves it.
        let block = unsafe { &*self.end.block };
        block.slots[ahead].load(Relaxed)
    }
}

#[cfg(all(test, not(tokio_workqueue_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn pop(lane: &Lane) -> Option<(u32, u64)> {
        let mut f = lane.front();
        let got = f.peek();
        if got.is_some() {
            let _ = f.pop();
        }
        got
    }

    #[test]
    fn tickets_come_out_in_order_across_blocks_and_reuse_the_spare() {
        let lane = Lane::new();
        for round in 0..3u64 {
            for i in 0..(3 * BLOCK as u32) {
                assert_eq!(lane.push(i + 1), round * 3 * BLOCK as u64 + u64::from(i));
            }
            assert_eq!(lane.len(), 3 * BLOCK as u64);
            for i in 0..(3 * BLOCK as u32) {
                let (t, _) = pop(&lane).unwrap();
                assert_eq!(t, i + 1);
            }
            assert!(lane.is_empty());
            assert_eq!(pop(&lane), None);
        }
    }

    #[test]
    fn a_pop_gives_the_ticket_four_behind_in_its_block() {
        let lane = Lane::new();
        let n = BLOCK as u32 + 10;
        for t in 1..=n {
            lane.push(t);
        }
        let mut behind = Vec::new();
        for t in 1..=n {
            let mut f = lane.front();
            assert_eq!(f.peek().map(|(x, _)| x), Some(t));
            behind.push((t, f.pop()));
        }
        let ahead = AHEAD as u32;
        for (t, got) in behind {
            // The first block holds tickets 1..=BLOCK.
            let b = t + ahead;
            let same_block = (t <= BLOCK as u32) == (b <= BLOCK as u32);
            let expected = if b <= n && same_block { b } else { 0 };
            assert_eq!(got, expected, "ticket {t}");
        }
        // A short lane gives none: the ticket four behind is not written.
        lane.push(1);
        lane.push(2);
        let mut f = lane.front();
        assert!(f.peek().is_some());
        assert_eq!(f.pop(), 0);
    }

    #[test]
    fn a_peek_without_a_pop_leaves_the_ticket() {
        let lane = Lane::new();
        lane.push(7);
        assert_eq!(lane.front().peek(), Some((7, 0)));
        assert_eq!(pop(&lane), Some((7, 0)));
        assert_eq!(lane.front().peek(), None);
    }

    #[test]
    fn threads_pushing_and_popping_lose_and_repeat_nothing() {
        let lane = std::sync::Arc::new(Lane::new());
        const PER: u32 = 20_000;
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let lane = lane.clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        lane.push(p * PER + i + 1);
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let lane = lane.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while got.len() < PER as usize {
                        if let Some((t, _)) = pop(&lane) {
                            got.push(t);
                        } else {
                            std::thread::yield_now();
                        }
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all: Vec<u32> = Vec::new();
        for c in consumers {
            let got = c.join().unwrap();
            // Each producer's tickets come out in the order it pushed them.
            for p in 0..2u32 {
                let mine: Vec<u32> = got.iter().copied().filter(|t| (t - 1) / PER == p).collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]));
            }
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(all, (1..=2 * PER).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn behaves_as_a_vecdeque(ops in proptest::collection::vec(any::<Option<u16>>(), 0..3000)) {
            let lane = Lane::new();
            let mut model = VecDeque::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Some(t) => {
                        prop_assert_eq!(lane.push(u32::from(t) + 1), next);
                        model.push_back((u32::from(t) + 1, next));
                        next += 1;
                    }
                    None => prop_assert_eq!(pop(&lane), model.pop_front()),
                }
                prop_assert_eq!(lane.len(), model.len() as u64);
            }
        }
    }
}
