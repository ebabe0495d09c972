//! The order in which a split queue hands out its keys: one [`Lane`] per
//! priority, highest first.
//!
//! A queue of several shards (see [`crate::shard`]) keeps each key in the
//! shard its hash picks, and the order of its ready keys here, apart from
//! them. Every key made ready, or raised, pushes a ticket naming its shard
//! and slot to the lane of its priority, and remembers the ticket's
//! position in its node; a consumer pops the front ticket of the highest
//! lane that holds one, then takes that shard's lock and leases the key if
//! the node still names that ticket. A key raised to a higher lane, or
//! taken out of turn by the starvation bound, leaves its old ticket behind,
//! and the consumer that pops it skips it. So the queue hands out highest
//! priority first and FIFO within a priority, as one ordered list would,
//! while an add and a hand-out take the same shard's lock only when they
//! are about the same shard.
//!
//! A consumer takes the front of the lane it chose under that lane's
//! front lock, and before it pops it looks once more at the lanes above:
//! if one now holds a ticket (a producer that added a higher key and then
//! this one, say), it goes there instead. Between that look and the pop
//! no other consumer can take from the lane, so the ticket popped is the
//! first of the highest priority that had one at the look.
//!
//! Lanes are made as priorities come, in segments that never move (see
//! [`crate::segmented`]), and are never freed before the queue; once
//! [`KEEP_LANES`] exist, a new priority takes over an empty one instead
//! (with both of its locks held, so no ticket is pushed or popped
//! meanwhile). A queue therefore holds as many lanes as the most
//! priorities it held ready keys of at once, or [`KEEP_LANES`], whichever
//! is more. Finding a priority's lane, and a consumer's choice, look at
//! every lane: cheap for the few priorities controllers use, linear in
//! their number beyond.

use crate::lane::Lane;
use crate::segmented::Segmented;
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};

/// Lanes kept however many are empty (see the [module docs](self)).
pub(crate) const KEEP_LANES: usize = 16;

/// Segments of lanes: room for 4 * (2^26 - 1), more than a queue meets.
const SEGMENTS: usize = 26;

/// A lane and the priority of its tickets.
struct Level {
    /// The priority, as its bits: changed only with both of the lane's
    /// locks held and the lane empty.
    priority: AtomicU32,
    lane: Lane,
}

impl Level {
    fn priority(&self) -> i32 {
        self.priority.load(Acquire) as i32
    }
}

/// What a consumer popped: the key's shard and slot, the priority of its
/// lane, and the ticket's position in that lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) shard: usize,
    pub(crate) slot: u32,
    pub(crate) priority: i32,
    pub(crate) position: u32,
    /// The shard and slot of a key a few tickets behind it in its lane,
    /// whose node to prefetch (see
    /// [`FrontGuard::pop`](crate::lane::FrontGuard::pop)).
    pub(crate) behind: Option<(usize, u32)>,
}

/// A split queue's lanes (see the [module docs](self)).
pub(crate) struct Lanes {
    levels: Segmented<Level, SEGMENTS>,
    /// Lanes made so far: `0..made`.
    made: AtomicUsize,
    /// Held to make a lane or give one another priority.
    assign: Mutex<()>,
    /// Bits of a ticket that name the shard.
    shard_bits: u32,
}

impl Lanes {
    /// Lanes for a queue of `shards` shards (a power of two).
    pub(crate) fn new(shards: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let lanes = Lanes {
            levels: Segmented::new(),
            made: AtomicUsize::new(0),
            assign: Mutex::new(()),
            shard_bits: shards.trailing_zeros(),
        };
        // The default priority's lane, made before any add needs it.
        lanes.assign(0);
        lanes
    }

    /// The most slots a shard's tickets can name: `slot` must stay below.
    pub(crate) fn slots(&self) -> u32 {
        // A ticket is (slot << shard_bits | shard) + 1, never zero.
        (u32::MAX >> self.shard_bits) - 1
    }

    fn level(&self, i: usize) -> &Level {
        self.levels.get(i).expect("a lane made")
    }

    fn levels(&self) -> impl Iterator<Item = &Level> + '_ {
        (0..self.made.load(Acquire)).map(|i| self.level(i))
    }

    /// Pushes a ticket for `slot` of `shard` to the lane of `priority`,
    /// and gives its position there (its low 32 bits: enough to tell it
    /// from every other ticket of that lane a shard could still meet).
    ///
    /// `hint` is where the caller last found this priority's lane, and is
    /// set to where it is now.
    pub(crate) fn push(&self, priority: i32, shard: usize, slot: u32, hint: &mut usize) -> u32 {
        debug_assert!(slot < self.slots());
        let ticket = ((slot << self.shard_bits) | shard as u32) + 1;
        loop {
            let i = match self.find(priority, *hint) {
                Some(i) => i,
                None => self.assign(priority),
            };
            *hint = i;
            let level = self.level(i);
            let back = level.lane.back();
            // Taken over by another priority since it was found: it was
            // empty, so nothing of this priority is lost by looking again.
            if level.priority() != priority {
                continue;
            }
            return back.push(ticket) as u32;
        }
    }

    /// The lane of `priority`, looking at `hint` first.
    fn find(&self, priority: i32, hint: usize) -> Option<usize> {
        let made = self.made.load(Acquire);
        if hint < made && self.level(hint).priority() == priority {
            return Some(hint);
        }
        (0..made).find(|&i| self.level(i).priority() == priority)
    }

    /// Gives `priority` a lane: an empty one past [`KEEP_LANES`], else a
    /// new one.
    #[cold]
    fn assign(&self, priority: i32) -> usize {
        let _assign = self.assign.lock();
        let made = self.made.load(Acquire);
        if let Some(i) = (0..made).find(|&i| self.level(i).priority() == priority) {
            return i;
        }
        if made >= KEEP_LANES {
            for i in 0..made {
                let level = self.level(i);
                if !level.lane.is_empty() {
                    continue;
                }
                let (back, front) = level.lane.both();
                if level.lane.is_empty() {
                    level.priority.store(priority as u32, Release);
                    drop((back, front));
                    return i;
                }
            }
        }
        let level = self.levels.get_or_make(made, || Level {
            priority: AtomicU32::new(0),
            lane: Lane::new(),
        });
        level.priority.store(priority as u32, Release);
        self.made.store(made + 1, Release);
        made
    }

    /// Pops the front ticket of the highest lane that holds one.
    ///
    /// The lanes are tried highest first, each by a look at its front under
    /// its lock (the front's memory, which consumers keep, rather than the
    /// count of tickets pushed, which the producers write); once a ticket
    /// is in hand, every lane above it is looked at again (a lane found
    /// empty may have filled, and one may have been made) before that
    /// ticket is popped.
    pub(crate) fn pop(&self) -> Option<Ticket> {
        'look: loop {
            let made = self.made.load(Acquire);
            let mut few = [(0i32, 0usize); KEEP_LANES];
            let mut many = Vec::new();
            let by_priority: &mut [(i32, usize)] = if made <= KEEP_LANES {
                &mut few[..made]
            } else {
                many.resize(made, (0, 0));
                &mut many
            };
            for (i, at) in by_priority.iter_mut().enumerate() {
                *at = (self.level(i).priority(), i);
            }
            by_priority.sort_unstable_by_key(|&(p, _)| std::cmp::Reverse(p));
            for &(priority, i) in by_priority.iter() {
                let level = self.level(i);
                let mut front = level.lane.front();
                if level.priority() != priority {
                    // Given another priority since it was read.
                    continue 'look;
                }
                let Some((ticket, position)) = front.peek() else {
                    continue;
                };
                // A higher lane that filled since it was passed, or was
                // made since the lanes were counted, goes first (see the
                // module docs): the count is read again, after the look that
                // found this ticket, so it covers every lane made before the
                // ticket was pushed.
                if self
                    .levels()
                    .any(|l| l.priority() > priority && !l.lane.is_empty())
                {
                    continue 'look;
                }
                let behind = front.pop();
                let (shard, slot) = self.decode(ticket);
                return Some(Ticket {
                    shard,
                    slot,
                    priority,
                    position: position as u32,
                    behind: (behind != 0).then(|| self.decode(behind)),
                });
            }
            return None;
        }
    }

    /// The shard and slot a ticket names.
    fn decode(&self, ticket: u32) -> (usize, u32) {
        let t = ticket - 1;
        let mask = (1u32 << self.shard_bits) - 1;
        ((t & mask) as usize, t >> self.shard_bits)
    }

    /// Whether no lane holds a ticket (stale ones count: a consumer that
    /// wakes for one finds nothing and sleeps again).
    pub(crate) fn is_empty(&self) -> bool {
        self.levels().all(|l| l.lane.is_empty())
    }
}

#[cfg(all(test, not(tokio_workqueue_loom)))]
mod tests {
    use super::*;

    #[test]
    fn highest_priority_first_fifo_within_one() {
        let lanes = Lanes::new(8);
        let mut hint = 0;
        for (i, p) in [0, 10, -5, 10, 0].into_iter().enumerate() {
            lanes.push(p, i % 8, i as u32, &mut hint);
        }
        let order: Vec<(i32, u32)> = std::iter::from_fn(|| lanes.pop())
            .map(|p| (p.priority, p.slot))
            .collect();
        assert_eq!(order, [(10, 1), (10, 3), (0, 0), (0, 4), (-5, 2)]);
        assert!(lanes.is_empty());
    }

    #[test]
    fn a_ticket_names_the_key_four_behind_it() {
        let lanes = Lanes::new(8);
        let mut hint = 0;
        for i in 0..10u32 {
            lanes.push(0, (i % 8) as usize, 100 + i, &mut hint);
        }
        let got: Vec<Option<(usize, u32)>> = std::iter::from_fn(|| lanes.pop())
            .map(|t| t.behind)
            .collect();
        // The last four have none behind them.
        let expected: Vec<Option<(usize, u32)>> = (0..10u32)
            .map(|i| (i + 4 < 10).then(|| (((i + 4) % 8) as usize, 104 + i)))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn tickets_name_their_shard_and_slot_at_the_limits() {
        for shards in [2, 8, 64] {
            let lanes = Lanes::new(shards);
            let top = lanes.slots() - 1;
            let mut hint = 0;
            lanes.push(0, shards - 1, top, &mut hint);
            lanes.push(0, 0, 0, &mut hint);
            let a = lanes.pop().unwrap();
            assert_eq!((a.shard, a.slot), (shards - 1, top));
            let b = lanes.pop().unwrap();
            assert_eq!((b.shard, b.slot, b.position), (0, 0, 1));
        }
    }

    #[test]
    fn past_the_kept_lanes_an_empty_lane_takes_a_new_priority() {
        let lanes = Lanes::new(2);
        let mut hint = 0;
        for p in 0..KEEP_LANES as i32 {
            lanes.push(p, 0, 0, &mut hint);
            assert!(lanes.pop().is_some());
        }
        assert_eq!(lanes.made.load(Relaxed), KEEP_LANES);
        // All empty: every new priority reuses one.
        for p in 100..200 {
            lanes.push(p, 0, 1, &mut hint);
            assert_eq!(lanes.pop().map(|x| x.priority), Some(p));
        }
        assert_eq!(lanes.made.load(Relaxed), KEEP_LANES);
        // With every lane holding a ticket, a new priority makes a lane.
        for p in 0..KEEP_LANES as i32 + 3 {
            lanes.push(1000 + p, 0, 2, &mut hint);
        }
        assert_eq!(lanes.made.load(Relaxed), KEEP_LANES + 3);
        let got: Vec<i32> = std::iter::from_fn(|| lanes.pop())
            .map(|x| x.priority)
            .collect();
        assert_eq!(
            got,
            (1000..1000 + KEEP_LANES as i32 + 3)
                .rev()
                .collect::<Vec<_>>()
        );
    }
}
