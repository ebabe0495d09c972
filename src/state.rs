//! The queue's state machine: one entry per key, kept under a lock (one
//! per shard of the queue, see [`crate::shard`]).
//!
//! Every key the queue knows has one [`Node`] in a slab whose nodes never
//! move ([`Nodes`]): a lease reads its key in its node, and no node holding
//! a leased key is freed before the lease ends. A node is in exactly one
//! [`Place`]:
//!
//! ```text
//!            add                    timer fires / add now
//!   (new) ───────► Ready ◄─────────────────────────── Waiting ◄── add_after (new)
//!                    │ pop                                ▲
//!                    ▼                                    │ lease ends
//!                 Leased ──add now──► LeasedDirty      LeasedWaiting
//!                    │  └──add_after──────────────────────▲
//!                    ▼ lease ends             │ lease ends: pushed again
//!                  (free)                     ▼
//!                                           Ready
//! ```
//!
//! Which ready node is handed out next is the business of the queue's
//! [`Ordering`]: the state tells it when a key becomes ready (`push`), is
//! added again while ready (`touch`), or is taken out of turn by the
//! starvation bound (`remove`), and asks it which key to hand out (`pop`).
//! The ordering keeps what it needs in the ready node itself
//! (`Place::Ready`'s entry: the default's level links), so it stores no
//! second copy of the key and, being a type parameter, costs no dispatch.
//! Everything else stays here: the ordering never sees a key that is not
//! ready, and a handle it returns is checked before anything is leased.
//! In a queue of several shards the order is not any one shard's: a key
//! made ready or raised pushes a ticket to the queue's lanes instead
//! ([`crate::lanes`]), its entry keeps that ticket's position, and
//! [`take`](State::take) leases the key a popped ticket names if it is
//! still the key's live one; the ordering then holds nothing, and the state
//! counts the ready keys per priority itself. The
//! index is a `hashbrown::HashTable` of slot numbers: it holds four bytes
//! per key and compares keys only on a 32-bit hash match.
//!
//! When ready times are tracked (metrics or a starvation bound), a side table
//! keeps each slot's ready time; with a starvation bound a second one links
//! ready slots by age, so the oldest ready key is found in O(1), whatever
//! the ordering. Lease start times sit in a small table of their own, one
//! entry per lease in flight, which a scrape reads whole. The depth gauge
//! asks the ordering for its counts per priority (the built-in ones keep
//! them), and walks the ready keys only for an ordering that does not.
//!
//! The timer wheel is not here: it belongs to the timer task
//! ([`crate::timer`]), which works on it outside the lock. A delayed add
//! stamps its node `Waiting` with a [`TimerEntry`] (an order number and the
//! deadline) and appends the entry to `deferred`; the timer task takes the
//! whole list under the lock in one swap, and puts the entries in its wheel
//! after releasing it. When entries expire it hands them back, and an entry
//! makes its key ready only if the key still waits on that very entry.
//! Cancelling a delay (an immediate add, an earlier deadline) therefore
//! touches no wheel: the old entry goes stale and is ignored when it fires.
//! Stale entries are counted, and when they outnumber the live ones by more
//! than the slab's size, every live delay is sent again to a fresh wheel, so
//! a key whose delays keep being cancelled cannot make the wheel grow without
//! bound.
//!
//! Nothing here blocks, sleeps or wakes tasks: the caller does that after the
//! lock is released, guided by the [`Effects`] each call returns.

use std::hash::Hash;
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::lanes::{Lanes, Ticket};
use crate::nodes::{KeyRef, Nodes};
use crate::ordering::{Handle, Ordering, Queued};
use crate::prefetch::{self, IndexLayout, SharedLayout};
use crate::shown::{self, Shown};
use crate::slot::{NIL, Node, Place};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering as AtomicOrdering};
use tokio::time::Instant;

/// The longest delay the queue accepts; longer ones are clamped to it.
///
/// tokio-util's `DelayQueue` covers about two years and panics beyond that;
/// one year keeps every deadline well inside its range.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The smallest index [`State::rebuild_index`] builds.
const MIN_INDEX: usize = 16;

/// Slots a queue keeps however empty it gets (see [`State::give_back_room`]):
/// below this, giving room back and growing it again is not worth it.
const KEEP_SLOTS: usize = 1024;

/// Stale wheel entries (cancelled delays) tolerated beyond the slab's size
/// before the live delays are sent to a fresh wheel.
const STALE_SLACK: usize = 1024;

/// One delay, as the timer task keeps it in its wheel.
///
/// `seq` numbers delays in the order they were set (wrapping), so keys due in
/// the same millisecond come out in that order; `at` is the deadline in
/// nanoseconds from the state's epoch. A node waits on exactly one entry;
/// any other entry for its slot is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerEntry {
    /// The shard of the queue whose slot this is.
    pub(crate) shard: u32,
    pub(crate) slot: u32,
    pub(crate) seq: u32,
    pub(crate) at: u64,
}

#[cfg(test)]
impl TimerEntry {
    /// The deadline, given the epoch of the state that made the entry.
    pub(crate) fn deadline(&self, epoch: Instant) -> Instant {
        epoch + Duration::from_nanos(self.at)
    }
}

/// The priorities of a split shard's ready keys, for the depth gauge.
///
/// Counting keys per priority on every add and hand-out kept a list that
/// both cores wrote, on a line of its own: W1 ran 1.12x, W2 1.09x and W4
/// 1.05x without it in paired rounds on an Intel VM. The shard counts its
/// ready keys anyway, so while they share one priority that count is the
/// gauge; once they do not, a scrape walks the shard's slots, as for an
/// ordering that does not count its keys, until the shard has no key
/// ready again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Levels {
    /// No key ready.
    None,
    /// Every ready key has this priority.
    One(i32),
    /// Ready keys of more than one priority, at some point since the shard
    /// last had none.
    Many,
}

impl Levels {
    /// A key of `priority` made ready, or raised to it.
    #[inline]
    fn add(&mut self, priority: i32) {
        match *self {
            Levels::None => *self = Levels::One(priority),
            Levels::One(p) if p != priority => *self = Levels::Many,
            _ => {}
        }
    }
}

/// What every shard of one queue counts from: one epoch for deadlines and
/// ready times, one numbering of delays (so that keys of different shards
/// due in the same millisecond come out in the order they were set) and,
/// with a starvation bound, one of ready keys (to break ties between the
/// shards' oldest keys). A state on its own (in its tests) has counters
/// of its own.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Deadlines and ready times are kept as nanoseconds from this instant.
    /// Read on every hand-out with a starvation bound, so it stays off the
    /// line of the numbers, which every add in any shard writes.
    epoch: Instant,
    numbers: Numbers,
    /// The shards with delays the timer task has not taken yet, one bit
    /// each (there are at most 64): a round of the task locks those shards
    /// only, and only the shard that finds no bit set wakes it. Before
    /// this, each round locked every shard, pulling each shard's lock line
    /// away from the producers setting delays, and a round ran for every
    /// few delayed adds (in W3, 3,000 to 7,500 rounds of 8 locks for
    /// 100,000 delays).
    timer_work: TimerWork,
}

/// Shard `shard`'s bit in [`Counters::timer_work`] (a queue has at most 64
/// shards).
#[inline]
pub(crate) fn timer_bit(shard: usize) -> u64 {
    1 << (shard % 64)
}

/// [`Counters::timer_work`], on a line of its own: delayed adds write it,
/// and every add writes the numbers.
#[derive(Debug)]
#[repr(align(64))]
struct TimerWork(AtomicU64);

/// The numbers the shards draw, on a cache line of their own.
#[derive(Debug)]
#[repr(align(64))]
struct Numbers {
    /// Numbers keys made ready.
    ready: AtomicU32,
    /// Numbers delays in the order they were set.
    timers: AtomicU32,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            epoch: Instant::now(),
            numbers: Numbers {
                ready: AtomicU32::new(0),
                timers: AtomicU32::new(0),
            },
            timer_work: TimerWork(AtomicU64::new(0)),
        }
    }

    /// Marks `shard` as having delays for the timer task: whether no shard
    /// was marked before, in which case the caller wakes the task.
    fn mark_timer_work(&self, shard: u32) -> bool {
        let bit = timer_bit(shard as usize);
        // Already marked: the task will take this shard's delays, and the
        // word's line is only read. (A `fetch_or` whose result is used is a
        // compare-and-swap loop on x86.)
        if self.timer_work.0.load(AtomicOrdering::Acquire) & bit != 0 {
            return false;
        }
        self.timer_work.0.fetch_or(bit, AtomicOrdering::AcqRel) == 0
    }

    /// The timer task takes the marks, one bit per shard to visit.
    pub(crate) fn take_timer_work(&self) -> u64 {
        self.timer_work.0.swap(0, AtomicOrdering::AcqRel)
    }

    /// Whether a shard was marked since the last [`take_timer_work`](Self::take_timer_work).
    pub(crate) fn has_timer_work(&self) -> bool {
        self.timer_work.0.load(AtomicOrdering::Acquire) != 0
    }

    /// The instant deadlines count from.
    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The next number of a key made ready (or raised), in any shard.
    #[inline]
    fn draw(&self) -> u32 {
        self.numbers.ready.fetch_add(1, AtomicOrdering::Relaxed)
    }
}

/// A slot's links in the age list of ready keys.
#[derive(Debug, Clone, Copy)]
struct AgeLinks {
    prev: u32,
    next: u32,
    /// In a queue of several shards, the number the key drew when it
    /// became ready (a raise keeps its age, and so its number): breaks ties
    /// between the shards' oldest keys ready at the same time. Zero with
    /// one shard, which has no other to break ties with.
    number: u32,
}

#[derive(Debug, Default)]
struct AgeList {
    head: u32,
    tail: u32,
}

#[derive(Debug)]
struct Times {
    /// A placeholder time for slots not yet ready.
    epoch: Instant,
    /// When each slot's key last became ready.
    ready_at: Vec<Instant>,
    /// Whether `ready_at` moved (grew, or was given back) since
    /// [`State::moved_times`] last said so.
    moved: bool,
    /// Whether ready keys are linked by age: only the starvation bound
    /// needs the oldest one; metrics need each key's ready time alone.
    age_list: bool,
    /// Each slot's age links (when `age_list`; empty otherwise).
    age: Vec<AgeLinks>,
    /// Ready keys, oldest ready time first (when `age_list`).
    ready: AgeList,
    leases: Leases,
}

/// Start times of the leases in flight, one entry per lease, reused through
/// a free list. A lease is found by the number its hand-out returned, so
/// starting or ending one writes no per-slot entry: neighbouring keys'
/// entries share cache lines, and consecutive keys are usually leased by
/// different threads. (An earlier list linked through per-slot entries
/// wrote the previous lease's at every hand-out and both neighbours' at
/// every lease end.)
#[derive(Debug, Default)]
struct Leases {
    starts: Vec<Option<Instant>>,
    free: Vec<u32>,
}

impl Leases {
    fn start(&mut self, at: Instant) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.starts[i as usize] = Some(at);
                i
            }
            None => {
                self.starts.push(Some(at));
                // No more leases than slots, and slots fit in a u32.
                (self.starts.len() - 1) as u32
            }
        }
    }

    fn end(&mut self, lease: u32) {
        if let Some(start) = self.starts.get_mut(lease as usize)
            && start.take().is_some()
        {
            self.free.push(lease);
        }
    }
}

/// When an add wants its key to be ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    Now,
    At(Instant),
}

/// What the caller must do once the lock is released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[must_use]
pub(crate) struct Effects {
    /// Keys that became ready and may have a parked consumer to wake.
    pub(crate) wake: u32,
    /// Keys that joined the ready set or the dirty set (client-go's "adds").
    pub(crate) added: u32,
    /// Wake every consumer and drain waiter: the queue just closed or drained.
    pub(crate) wake_all: bool,
    /// A fresh timer wheel was installed: its task must poll it.
    pub(crate) timer_waker: Option<WakeTimer>,
}

/// A waker for the timer task, carried out of the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WakeTimer(WakerEq);

#[derive(Debug, Clone)]
struct WakerEq(Waker);
impl PartialEq for WakerEq {
    fn eq(&self, other: &Self) -> bool {
        self.0.will_wake(&other.0)
    }
}
impl Eq for WakerEq {}

impl WakeTimer {
    pub(crate) fn wake(self) {
        self.0.0.wake()
    }
}

/// A key handed out by [`State::pop`].
#[derive(Debug)]
pub(crate) struct Popped<K> {
    pub(crate) slot: u32,
    /// The key, where the node keeps it until the lease ends.
    pub(crate) key: KeyRef<K>,
    pub(crate) priority: i32,
    /// When it became ready, if times are tracked.
    pub(crate) ready_at: Option<Instant>,
    /// When it was taken (the lease's start), if times are tracked: the
    /// clock read of the hand-out, given back so that it is read once.
    pub(crate) taken_at: Option<Instant>,
    /// The lease's number in the lease-time table, for [`State::finish`]
    /// (`NIL` when times are not tracked).
    pub(crate) lease: u32,
}

/// Why an add was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    ShuttingDown,
}

/// Counts for metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) ready_by_priority: Vec<(i32, usize)>,
    pub(crate) leased: usize,
    pub(crate) waiting: usize,
    pub(crate) dirty: usize,
}

pub(crate) struct State<K, O: Ordering<K>> {
    nodes: Nodes<K, Node<O::Entry>>,
    free_head: u32,
    index: HashTable<u32>,
    /// Where `index` keeps its groups, for prefetch hints.
    layout: IndexLayout,
    /// Decides which ready key goes next.
    order: O,
    /// Keys ready: counted here too, so that `len`, closing and draining
    /// never depend on the ordering.
    ready_len: usize,
    leased: usize,
    dirty: usize,
    waiting: usize,
    /// The epoch and numbers this state shares with the queue's others.
    counters: Arc<Counters>,
    /// Delays set since the timer task last took them, for its wheel.
    deferred: Vec<TimerEntry>,
    /// Entries sent to the timer task and not yet handed back: live ones
    /// (`waiting`) and stale ones.
    wheel_entries: usize,
    /// `deferred` holds every live delay: the task must drop its wheel first.
    fresh_wheel: bool,
    timer_waker: Option<Waker>,
    times: Option<Times>,
    /// Serve keys older than this first, oldest first.
    promote_after: Option<Duration>,
    shutdown: bool,
    /// This state's place among its queue's shards.
    shard: u32,
    /// What the queue's marks show of this state, which only its lock's
    /// holder writes (see [`Marks::publish`](crate::shard::Marks::publish)).
    pub(crate) shown: Shown,
    /// With other shards: the queue's lanes, which hold the order of every
    /// shard's ready keys (see [`crate::lanes`]); this state's ordering
    /// then holds none.
    lanes: Option<Arc<Lanes>>,
    /// Where this state last found a priority's lane.
    lane_hint: usize,
    /// With lanes: the priorities of this shard's ready keys, as far as
    /// the depth gauge needs them (the ordering, which counts them in a
    /// queue of one shard, holds none here).
    levels: Levels,
}

impl<K, O: Ordering<K>> std::fmt::Debug for State<K, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("ready", &self.ready_len)
            .field("leased", &self.leased)
            .field("dirty", &self.dirty)
            .field("waiting", &self.waiting)
            .field("ordering", &std::any::type_name::<O>())
            .field("shutdown", &self.shutdown)
            .finish_non_exhaustive()
    }
}

/// Widens a stored 32-bit hash to the 64 bits the index wants. hashbrown
/// takes its bucket from the low bits and its tag from the top seven, so both
/// halves carry the stored bits.
#[inline]
fn wide(h: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(h)
}

/// The ordering handed out a key that is not ready.
#[cold]
#[inline(never)]
fn not_ready(slot: u32) -> ! {
    panic!(
        "the queue's ordering handed out slot {slot}, which holds no ready key: a bug in the ordering"
    )
}

/// Takes a slot for a new node: the head of the free list, else a new one
/// at the end. The caller indexes it.
fn alloc<K, E>(
    nodes: &mut Nodes<K, Node<E>>,
    free_head: &mut u32,
    times: Option<&mut Times>,
    key: K,
    node: Node<E>,
) -> u32 {
    if *free_head != NIL {
        let slot = *free_head;
        let old = &mut nodes[slot as usize];
        let Place::Free { next_free } = old.place else {
            unreachable!("free list holds a live node")
        };
        *free_head = next_free;
        *old = node;
        // SAFETY: the slot was free, so no lease on its key is alive.
        let stale = unsafe { nodes.replace_key(slot as usize, Some(key)) };
        debug_assert!(stale.is_none(), "a free slot kept its key");
        return slot;
    }
    // Slot numbers are u32 and NIL is reserved: 4 billion live keys is far
    // past any memory this queue could be given.
    let slot = u32::try_from(nodes.len())
        .ok()
        .filter(|&s| s != NIL)
        .expect("more than u32::MAX - 1 keys in one queue");
    nodes.push(key, node);
    if let Some(t) = times {
        // Overwritten whenever the slot's key becomes ready, before it is
        // read: no clock read needed here.
        let room = t.ready_at.capacity();
        t.ready_at.push(t.epoch);
        t.moved |= t.ready_at.capacity() != room;
        if t.age_list {
            t.age.push(AgeLinks {
                prev: NIL,
                next: NIL,
                number: 0,
            });
        }
    }
    slot
}

impl<K: Eq + Hash, O: Ordering<K>> State<K, O> {
    /// Adds `key` (hashed to `h`) with `priority`, ready `when`; gives
    /// `key` back when it merged into a key the queue holds, for the caller
    /// to drop after releasing the lock.
    ///
    /// `now` is the caller's clock reading when times are tracked. What the
    /// caller must do once the lock is released goes to `fx`, which the
    /// caller keeps in place: returned inside a `Result`, the effects were
    /// copied in odd-sized pieces, and reading those back stalled the
    /// thread until every store of the add had reached its cache (a
    /// failed store-to-load forward, 4 % of W1's samples on an Intel VM).
    #[inline(always)]
    pub(crate) fn add(
        &mut self,
        key: K,
        h: u64,
        priority: i32,
        when: When,
        now: Option<Instant>,
        fx: &mut Effects,
    ) -> Result<Option<K>, Refused> {
        if self.shutdown {
            // Not reached through `Shared::add`, which checks the queue's
            // flag (set before any shard's) under this lock first, so no
            // key is dropped here under the lock.
            return Err(Refused::ShuttingDown);
        }
        let h = h as u32;
        if self.index.len() == self.index.capacity() {
            self.rebuild_index();
        }
        // One probe finds the key or the place its entry goes: on a large
        // queue each probe of the index is a cache miss.
        let nodes = &self.nodes;
        let entry = self.index.entry(
            wide(h),
            |&i| {
                nodes
                    .slot(i as usize)
                    .is_some_and(|s| s.node().hash == h && s.key() == Some(&key))
            },
            |&i| wide(nodes[i as usize].hash),
        );
        let vacant = match entry {
            Entry::Occupied(e) => {
                let slot = *e.get();
                self.merge(slot, priority, when, now, fx);
                return Ok(Some(key));
            }
            Entry::Vacant(v) => v,
        };
        let node = Node {
            place: Place::Leased,
            hash: h,
            priority,
        };
        let slot = alloc(
            &mut self.nodes,
            &mut self.free_head,
            self.times.as_mut(),
            key,
            node,
        );
        if let Some(lanes) = &self.lanes {
            // A ticket names the slot in the bits the shard leaves.
            assert!(
                slot < lanes.slots(),
                "more than {} keys in one shard of a queue",
                lanes.slots()
            );
        }
        // An insert is the only thing that can move the table.
        let inserted = vacant.insert(slot);
        let bucket = inserted.bucket_index();
        let slot_addr = std::ptr::from_ref(inserted.get()).addr();
        self.layout = IndexLayout::new(slot_addr, bucket, self.index.num_buckets());
        match when {
            When::Now => {
                self.make_ready(slot, priority, now);
                fx.wake = 1;
                fx.added = 1;
            }
            When::At(deadline) => {
                self.wait(slot, deadline, None, false, fx);
                self.waiting += 1;
            }
        }
        Ok(None)
    }
}

impl<K, O: Ordering<K>> State<K, O> {
    /// Builds the index anew with room for twice its keys, in slot order.
    ///
    /// hashbrown grows a full table by walking its buckets and asking each
    /// entry's hash, which here means reading the node of a slot in random
    /// order: on a queue of a million keys that is a cache miss per key, one
    /// after the other, and it was most of the cost of a growth. Walking the
    /// slab instead reads the nodes in memory order. Also called when
    /// removals' tombstones have used up the table's room, where it rebuilds
    /// at about the same size, as hashbrown's own in-place rehash would.
    fn rebuild_index(&mut self) {
        // How many nodes ahead the new table's groups are fetched, so that
        // the inserts' misses overlap instead of coming one after another.
        const AHEAD: usize = 16;
        let nodes = &self.nodes;
        let mut index = HashTable::with_capacity((self.index.len() * 2).max(MIN_INDEX));
        let mut layout = IndexLayout::default();
        for (slot, node) in nodes.iter().enumerate() {
            if let Some(ahead) = nodes.get(slot + AHEAD) {
                layout.prefetch(wide(ahead.hash));
            }
            if matches!(node.place, Place::Free { .. }) {
                continue;
            }
            let inserted = index.insert_unique(wide(node.hash), slot as u32, |&i| {
                wide(nodes[i as usize].hash)
            });
            // The table has room for every key, so it never moves: its
            // layout is known from the first insert on.
            if layout.is_unset() {
                let addr = std::ptr::from_ref(inserted.get()).addr();
                layout = IndexLayout::new(addr, inserted.bucket_index(), index.num_buckets());
            }
        }
        debug_assert_eq!(index.len(), self.index.len());
        self.index = index;
    }

    /// Where the index keeps its groups now.
    pub(crate) fn layout(&self) -> IndexLayout {
        self.layout
    }

    /// `track_times` keeps ready and lease times (for metrics and the
    /// starvation bound); `promote_after` serves keys that have been ready
    /// that long before any others; `order` orders the rest.
    pub(crate) fn new(track_times: bool, promote_after: Option<Duration>, order: O) -> Self {
        State {
            nodes: Nodes::default(),
            free_head: NIL,
            index: HashTable::new(),
            layout: IndexLayout::default(),
            order,
            ready_len: 0,
            leased: 0,
            dirty: 0,
            waiting: 0,
            counters: Arc::new(Counters::new()),
            deferred: Vec::new(),
            wheel_entries: 0,
            fresh_wheel: false,
            timer_waker: None,
            times: (track_times || promote_after.is_some()).then(|| Times {
                epoch: Instant::now(),
                ready_at: Vec::new(),
                moved: false,
                age_list: promote_after.is_some(),
                age: Vec::new(),
                ready: AgeList {
                    head: NIL,
                    tail: NIL,
                },
                leases: Leases::default(),
            }),
            promote_after,
            shutdown: false,
            shard: 0,
            shown: Shown::default(),
            lanes: None,
            lane_hint: 0,
            levels: Levels::None,
        }
    }

    /// Shut down with no delay left to fire: the timer task may end.
    pub(crate) fn timers_done(&self) -> bool {
        self.shutdown && self.waiting == 0
    }

    /// Keys ready to be handed out.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready_len
    }

    /// Nothing left to hand out, now or later: consumers may stop.
    pub(crate) fn is_closed(&self) -> bool {
        self.shutdown && self.ready_len == 0 && self.dirty == 0 && self.waiting == 0
    }

    /// Shut down with nothing ready and nothing leased.
    pub(crate) fn is_drained(&self) -> bool {
        self.shutdown && self.ready_len == 0 && self.leased == 0 && self.waiting == 0
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            ready_by_priority: self.ready_by_priority(),
            leased: self.leased,
            waiting: self.waiting,
            dirty: self.dirty,
        }
    }

    /// Ready keys per priority, highest first: from the ordering if it
    /// counts them, else by walking the slots (at scrape time only).
    fn ready_by_priority(&self) -> Vec<(i32, usize)> {
        if self.lanes.is_some() {
            return match self.levels {
                Levels::One(p) if self.ready_len > 0 => vec![(p, self.ready_len)],
                Levels::None | Levels::One(_) => Vec::new(),
                Levels::Many => self.walk_ready_by_priority(),
            };
        }
        if let Some(counts) = self.order.ready_by_priority() {
            return counts;
        }
        self.walk_ready_by_priority()
    }

    /// Ready keys per priority, highest first, found by walking the slots.
    fn walk_ready_by_priority(&self) -> Vec<(i32, usize)> {
        let mut counts: Vec<(i32, usize)> = Vec::new();
        for node in self.nodes.iter() {
            if let Place::Ready(_) = node.place {
                match counts.iter_mut().find(|(p, _)| *p == node.priority) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((node.priority, 1)),
                }
            }
        }
        counts.sort_unstable_by_key(|&(p, _)| std::cmp::Reverse(p));
        counts
    }

    /// Lease start times of the keys in flight, earliest first.
    pub(crate) fn lease_starts(&self) -> Vec<Instant> {
        let mut out = Vec::with_capacity(self.leased);
        if let Some(t) = &self.times {
            out.extend(t.leases.starts.iter().flatten().copied());
            out.sort_unstable();
        }
        out
    }

    /// Frees `slot` and returns its key, for the caller to drop once the
    /// lock is released. The last key of a large queue gives its room back
    /// ([`State::give_back_room`]).
    fn free(&mut self, slot: u32) -> Option<K> {
        let key = self.unlink_slot(slot);
        if self.index.is_empty()
            && self.nodes.len() > KEEP_SLOTS
            && self.wheel_entries == 0
            && self.deferred.is_empty()
        {
            self.give_back_room();
        }
        key
    }

    /// Gives back the slab, index and time tables of a queue that holds no
    /// key: a controller's queue held every object once, after its initial
    /// list, and would otherwise keep that room (about 120 bytes per object
    /// for `ObjectRef` keys) for as long as it runs. Only when no timer
    /// entry is out: a stale one still names its slot.
    #[cold]
    fn give_back_room(&mut self) {
        self.nodes = Nodes::default();
        self.free_head = NIL;
        self.index = HashTable::new();
        self.layout = IndexLayout::default();
        if let Some(t) = &mut self.times {
            t.ready_at = Vec::new();
            t.moved = true;
            t.age = Vec::new();
        }
    }

    fn unlink_slot(&mut self, slot: u32) -> Option<K> {
        let h = self.nodes[slot as usize].hash;
        match self.index.find_entry(wide(h), |&i| i == slot) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => unreachable!("live node missing from the index"),
        }
        let node = &mut self.nodes[slot as usize];
        node.place = Place::Free {
            next_free: self.free_head,
        };
        self.free_head = slot;
        // SAFETY: a key is unlinked when it is not leased, or as its lease
        // ends (`finish`): no lease on it is alive.
        unsafe { self.nodes.replace_key(slot as usize, None) }
    }

    /// A key joins the ready set at `now`: the ordering, or with other
    /// shards the lanes, are told.
    fn make_ready(&mut self, slot: u32, priority: i32, now: Option<Instant>) {
        let node = &mut self.nodes[slot as usize];
        node.priority = priority;
        node.place = Place::Ready(O::Entry::default());
        if self.lanes.is_some() {
            self.push_ticket(slot, priority);
            self.levels.add(priority);
        } else {
            self.order.push(
                &mut Queued::new(&mut self.nodes),
                Handle::new(slot),
                priority,
            );
        }
        self.ready_len += 1;
        if let Some(t) = &mut self.times {
            t.ready_at[slot as usize] = now.unwrap_or_else(Instant::now);
            if t.age_list {
                // A number from every shard's one count (see `AgeLinks`).
                let number = match self.lanes {
                    Some(_) => self.counters.draw(),
                    None => 0,
                };
                t.push_back(slot, number);
            }
        }
    }

    /// Merges another add into the live node at `slot`: the earliest ready
    /// time and the highest priority win.
    fn merge(
        &mut self,
        slot: u32,
        priority: i32,
        when: When,
        now: Option<Instant>,
        fx: &mut Effects,
    ) {
        let node = &self.nodes[slot as usize];
        let (place, old) = (node.place, node.priority);
        let merged = old.max(priority);
        match (place, when) {
            (Place::Free { .. }, _) => unreachable!("index points at a free slot"),
            (Place::Ready(_), _) => {
                // The ordering decides whether an add of a ready key moves
                // it; its ready time, and so its place in the age list, is
                // kept.
                if self.lanes.is_some() {
                    if priority > old {
                        // To the back of its new lane; the old ticket is
                        // left behind, stale.
                        self.nodes[slot as usize].priority = priority;
                        self.push_ticket(slot, priority);
                        self.levels.add(priority);
                    }
                    return;
                }
                if priority > old {
                    self.nodes[slot as usize].priority = priority;
                }
                self.order.touch(
                    &mut Queued::new(&mut self.nodes),
                    Handle::new(slot),
                    old,
                    merged,
                );
            }
            // The old wheel entry goes stale in each of the cancelling arms.
            (Place::Waiting { .. }, When::Now) => {
                self.waiting -= 1;
                self.make_ready(slot, merged, now);
                fx.wake += 1;
                fx.added += 1;
            }
            (Place::Waiting { seq, at } | Place::LeasedWaiting { seq, at }, When::At(deadline)) => {
                self.nodes[slot as usize].priority = merged;
                if self.nanos(deadline) < at {
                    // Keeps its order among keys due in the same millisecond.
                    let leased = matches!(place, Place::LeasedWaiting { .. });
                    self.wait(slot, deadline, Some(seq), leased, fx);
                }
            }
            (Place::Leased, When::Now) => {
                self.set(slot, Place::LeasedDirty, priority);
                self.dirty += 1;
                fx.added += 1;
            }
            (Place::Leased, When::At(deadline)) => {
                self.nodes[slot as usize].priority = priority;
                self.wait(slot, deadline, None, true, fx);
                self.waiting += 1;
            }
            (Place::LeasedDirty, _) => self.nodes[slot as usize].priority = merged,
            (Place::LeasedWaiting { .. }, When::Now) => {
                self.set(slot, Place::LeasedDirty, merged);
                self.waiting -= 1;
                self.dirty += 1;
                fx.added += 1;
            }
        }
    }

    /// `t` as nanoseconds from the epoch. Saturates at zero for an instant
    /// before it (a queue moved from a paused clock that ran ahead to a
    /// real one), which can only make such a delay end later, never early.
    fn nanos(&self, t: Instant) -> u64 {
        shown::nanos_since(self.counters.epoch, t)
    }

    /// The instant a [`TimerEntry`]'s deadline counts from.
    #[cfg(test)]
    pub(crate) fn epoch(&self) -> Instant {
        self.counters.epoch
    }

    /// Makes `slot` wait until `deadline` on a new wheel entry, which the
    /// timer task is woken for if it is the first since the task last ran.
    /// The entry takes the next order number unless given one (a key moved
    /// to an earlier deadline keeps its own). Any entry the node waited on
    /// before goes stale: the deadline differs.
    fn wait(
        &mut self,
        slot: u32,
        deadline: Instant,
        seq: Option<u32>,
        leased: bool,
        fx: &mut Effects,
    ) {
        if self.deferred.is_empty() {
            self.ask_timer(fx);
        }
        let seq = seq.unwrap_or_else(|| {
            self.counters
                .numbers
                .timers
                .fetch_add(1, AtomicOrdering::Relaxed)
        });
        let at = self.nanos(deadline);
        self.nodes[slot as usize].place = if leased {
            Place::LeasedWaiting { seq, at }
        } else {
            Place::Waiting { seq, at }
        };
        self.deferred.push(TimerEntry {
            shard: self.shard,
            slot,
            seq,
            at,
        });
        self.wheel_entries += 1;
        let stale = self.wheel_entries.saturating_sub(self.waiting);
        if stale > self.nodes.len().max(STALE_SLACK) {
            self.resend_timers();
            self.ask_timer(fx);
        }
    }

    /// Tells the timer task this shard has delays for it: marks the shard,
    /// and wakes the task if no shard was marked (a marked shard's delays
    /// are taken by the round that the first mark's wake-up, or the task's
    /// own look at the marks before it sleeps, brings about).
    fn ask_timer(&self, fx: &mut Effects) {
        if self.counters.mark_timer_work(self.shard) && fx.timer_waker.is_none() {
            fx.timer_waker = self.wake_timer();
        }
    }

    /// A waker for the timer task, if one is running and has polled.
    fn wake_timer(&self) -> Option<WakeTimer> {
        self.timer_waker.clone().map(|w| WakeTimer(WakerEq(w)))
    }

    /// Replaces everything sent to the timer task with one entry per live
    /// delay, and tells the task to drop its wheel before taking them: the
    /// cure for stale entries, and the way a new task (after the runtime
    /// that ran the last one has gone) learns the delays. The caller wakes
    /// the task.
    pub(crate) fn resend_timers(&mut self) {
        self.deferred.clear();
        for (slot, node) in self.nodes.iter().enumerate() {
            if let Place::Waiting { seq, at } | Place::LeasedWaiting { seq, at } = node.place {
                self.deferred.push(TimerEntry {
                    shard: self.shard,
                    slot: slot as u32,
                    seq,
                    at,
                });
            }
        }
        self.wheel_entries = self.deferred.len();
        self.fresh_wheel = true;
    }

    /// For a new timer task, after the last one's runtime has gone (with
    /// its wheel): forgets the old task's waker, so no add wakes it, and
    /// sends every live delay again.
    pub(crate) fn restart_timers(&mut self) {
        self.timer_waker = None;
        self.resend_timers();
    }

    /// The timer task fires `expired` entries of this shard (in the order
    /// given).
    pub(crate) fn fire_expired(
        &mut self,
        expired: impl IntoIterator<Item = TimerEntry>,
        now: Instant,
    ) -> Effects {
        let mut fx = Effects::default();
        let stamp = self.times.is_some().then_some(now);
        for e in expired {
            self.wheel_entries = self.wheel_entries.saturating_sub(1);
            self.fire(e, stamp, &mut fx);
        }
        fx
    }

    /// The timer task takes the delays set since its last round: registers
    /// `waker` to be woken by the next one, and swaps them into `incoming`
    /// (which must be empty). Returns whether the task must drop its wheel
    /// before inserting them (they are then every live delay of this
    /// shard).
    pub(crate) fn take_delays(&mut self, waker: &Waker, incoming: &mut Vec<TimerEntry>) -> bool {
        if !self
            .timer_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
        {
            self.timer_waker = Some(waker.clone());
        }
        debug_assert!(incoming.is_empty());
        std::mem::swap(incoming, &mut self.deferred);
        std::mem::take(&mut self.fresh_wheel)
    }

    /// [`fire_expired`](Self::fire_expired), then
    /// [`take_delays`](Self::take_delays).
    #[cfg(test)]
    pub(crate) fn timer_round(
        &mut self,
        waker: &Waker,
        expired: impl IntoIterator<Item = TimerEntry>,
        incoming: &mut Vec<TimerEntry>,
        now: Instant,
    ) -> (Effects, bool) {
        let fx = self.fire_expired(expired, now);
        (fx, self.take_delays(waker, incoming))
    }

    fn set(&mut self, slot: u32, place: Place<O::Entry>, priority: i32) {
        let node = &mut self.nodes[slot as usize];
        node.place = place;
        node.priority = priority;
    }

    /// An expired wheel entry: makes its key ready (or dirty, if leased)
    /// if the key still waits on it; a stale entry does nothing.
    fn fire(&mut self, e: TimerEntry, now: Option<Instant>, fx: &mut Effects) {
        // A shut-down shard may have given its room back while the wheel,
        // which serves the other shards too, still held its stale entries.
        let Some(&Node {
            place, priority, ..
        }) = self.nodes.get(e.slot as usize)
        else {
            return;
        };
        let slot = e.slot;
        match place {
            Place::Waiting { seq, at } if (seq, at) == (e.seq, e.at) => {
                self.waiting -= 1;
                self.make_ready(slot, priority, now);
                fx.wake += 1;
                fx.added += 1;
            }
            Place::LeasedWaiting { seq, at } if (seq, at) == (e.seq, e.at) => {
                self.set(slot, Place::LeasedDirty, priority);
                self.waiting -= 1;
                self.dirty += 1;
                fx.added += 1;
            }
            _ => {}
        }
    }

    /// Takes the next key: the oldest one past the promotion age if there is
    /// one, else the one the ordering hands out.
    ///
    /// Always inlined: called, it returned the key through memory, and the
    /// caller read fields of it back wider than they were written, which
    /// waited for every store of the hand-out to reach its cache (W1's
    /// drain on two threads ran 4-6 % faster inlined, on an Intel VM).
    #[inline(always)]
    pub(crate) fn pop(&mut self, now: Option<Instant>) -> Option<Popped<K>>
    where
        K: Clone,
    {
        if self.ready_len == 0 {
            return None;
        }
        let mut promoted = NIL;
        if let (Some(age), Some(t), Some(now)) = (self.promote_after, &self.times, now) {
            let oldest = t.ready.head;
            if oldest != NIL && now.saturating_duration_since(t.ready_at[oldest as usize]) >= age {
                promoted = oldest;
            }
        }
        let mut queued = Queued::new(&mut self.nodes);
        let slot = if promoted != NIL {
            if self.lanes.is_none() {
                self.order.remove(&mut queued, Handle::new(promoted));
            }
            promoted
        } else if self.lanes.is_some() {
            // The lanes hold the order: here only the starvation bound
            // takes a key (its ticket is left behind, stale).
            return None;
        } else {
            match self.order.pop(&mut queued) {
                Some(h) => h.slot(),
                None => self.lost_keys(),
            }
        };
        Some(self.lease(slot, now))
    }

    /// Takes the key a ticket popped from the lanes names, if the ticket is
    /// still its key's live one (it is stale once the key was raised to
    /// another lane, or taken out of turn).
    #[inline(always)]
    pub(crate) fn take(&mut self, ticket: Ticket, now: Option<Instant>) -> Option<Popped<K>> {
        match self.nodes.get(ticket.slot as usize) {
            Some(Node {
                place: Place::Ready(entry),
                priority,
                ..
            }) if *priority == ticket.priority && O::ticket(entry) == ticket.position => {}
            _ => return None,
        }
        Some(self.lease(ticket.slot, now))
    }

    /// Leases the ready key at `slot`.
    #[inline(always)]
    fn lease(&mut self, slot: u32, now: Option<Instant>) -> Popped<K> {
        // Whatever the ordering answered, only a ready key is leased.
        if !matches!(
            self.nodes.get(slot as usize),
            Some(Node {
                place: Place::Ready(_),
                ..
            })
        ) {
            not_ready(slot);
        }
        self.ready_len -= 1;
        if self.lanes.is_some() {
            if self.ready_len == 0 {
                self.levels = Levels::None;
            }
        } else {
            self.prefetch_head();
        }
        let mut ready_at = None;
        let mut taken_at = None;
        let mut lease = NIL;
        if let Some(t) = &mut self.times {
            ready_at = Some(t.ready_at[slot as usize]);
            if t.age_list {
                t.unlink(slot);
            }
            let at = now.unwrap_or_else(Instant::now);
            taken_at = Some(at);
            lease = t.leases.start(at);
        }
        self.leased += 1;
        let (node, key) = self
            .nodes
            .get_mut_with_key(slot as usize)
            .expect("a popped slot in range");
        node.place = Place::Leased;
        // The lease end will look the key up to free it: start fetching its
        // index group now, while the worker runs outside the lock.
        self.layout.prefetch(wide(node.hash));
        Popped {
            slot,
            key: KeyRef::new(key.expect("live node without a key")),
            priority: node.priority,
            ready_at,
            taken_at,
            lease,
        }
    }

    /// Pushes a ticket for the ready key at `slot` to the lane of
    /// `priority`, and keeps its position in the key's entry.
    fn push_ticket(&mut self, slot: u32, priority: i32) {
        let Some(lanes) = &self.lanes else {
            return;
        };
        let position = lanes.push(priority, self.shard as usize, slot, &mut self.lane_hint);
        if let Place::Ready(entry) = &mut self.nodes[slot as usize].place
            && let Some(kept) = O::ticket_mut(entry)
        {
            *kept = position;
        }
    }

    /// Hints that the node of `slot` is needed soon, from where `layout`
    /// says its chunk is: without the shard's lock, since nothing is read
    /// through the address (see [`Nodes::prefetch_at`]).
    ///
    /// With times kept, the key's ready time too, which the hand-out reads
    /// to observe how long the key waited: on W1 with metrics (an Intel
    /// VM) that read was a fifth of the hand-out's samples, a miss on a
    /// line its producer wrote long before.
    #[inline]
    pub(crate) fn prefetch_node(layout: &SharedLayout, slot: u32) {
        let (c, offset) = Nodes::<K, Node<O::Entry>>::place(slot as usize);
        if let Some(at) = layout.chunk(c) {
            Nodes::<K, Node<O::Entry>>::prefetch_at(at.wrapping_add(offset));
        }
        if let Some(times) = layout.times() {
            prefetch::prefetch(times.wrapping_add(slot as usize * size_of::<Instant>()));
        }
    }

    /// Where the ready times start, if they moved since the last call,
    /// for [`SharedLayout::publish_times`]: as [`new_chunk`](Self::new_chunk)
    /// does for nodes, so an add that moved nothing touches nothing of the
    /// layout.
    #[inline]
    pub(crate) fn moved_times(&mut self) -> Option<usize> {
        let moved = self
            .times
            .as_mut()
            .is_some_and(|t| std::mem::take(&mut t.moved));
        moved.then(|| self.times_at())
    }

    /// Where the ready times start (0: none kept).
    #[inline]
    fn times_at(&self) -> usize {
        self.times
            .as_ref()
            .filter(|t| t.ready_at.capacity() > 0)
            .map_or(0, |t| t.ready_at.as_ptr().addr())
    }

    /// A node chunk made since the last call, for
    /// [`SharedLayout::publish_chunk`] (see [`Nodes::new_chunk`]).
    #[inline]
    pub(crate) fn new_chunk(&mut self) -> Option<(usize, usize)> {
        self.nodes.new_chunk()
    }

    /// The ordering answered no key while keys are ready.
    #[cold]
    #[inline(never)]
    fn lost_keys(&self) -> ! {
        panic!(
            "the queue's ordering ({}) handed out nothing with {} keys ready (it says it holds {}): \
             a bug in the ordering",
            std::any::type_name::<O>(),
            self.ready_len,
            self.order.len()
        )
    }

    /// Hints what the next hand-out will read, so that a consumer working
    /// through a long queue overlaps those cache misses with the current
    /// item instead of stalling on each in turn. The ordering names the next
    /// key (and hints its own next links: for the default, the node after
    /// it); the next key's node was read by the hand-out just done (and
    /// fetched early by the one before), so it is in cache: from it come the
    /// next key's index group (read at its lease end) and its ready time.
    /// Each hint runs one hand-out ahead of its use.
    ///
    /// Only on a slab too large to stay in cache: on a small one the lines
    /// are already there, and the hints would only add work and pull lines
    /// that another consumer thread may be about to write.
    #[inline]
    fn prefetch_head(&mut self) {
        /// Slots from which the nodes, ready times and index outgrow a core's
        /// L2 cache (about 60 bytes a slot).
        const LARGE: usize = 1 << 15;
        // Only a queue of one shard comes here: a split queue's next key is
        // in its lanes, and its consumers fetch nodes from the tickets
        // ([`prefetch_node`](Self::prefetch_node)).
        debug_assert!(self.lanes.is_none());
        if self.nodes.len() < LARGE {
            return;
        }
        let queued = Queued::new(&mut self.nodes);
        let Some(next) = self.order.prefetch_next(&queued) else {
            return;
        };
        let Some(node) = self.nodes.get(next.index()) else {
            return;
        };
        self.layout.prefetch(wide(node.hash));
        if let Some(t) = &self.times
            && let Some(at) = t.ready_at.get(next.index())
        {
            prefetch::prefetch(std::ptr::from_ref(at).addr());
        }
    }

    /// Ends the lease on `slot`, first merging `readd` into it if given
    /// (a requeue). A dirty key becomes ready (pushed to the ordering); a key
    /// with a pending delay goes back to waiting; any other key is forgotten,
    /// and returned so that it is dropped outside the lock. What the caller
    /// must do once the lock is released goes to `fx` (see
    /// [`add`](Self::add) for why it is not returned).
    #[inline(always)]
    pub(crate) fn finish(
        &mut self,
        slot: u32,
        lease: u32,
        readd: Option<(i32, When)>,
        now: Option<Instant>,
        fx: &mut Effects,
    ) -> (Result<(), Refused>, Option<K>) {
        let mut refused = Ok(());
        if let Some((priority, when)) = readd {
            if self.shutdown {
                refused = Err(Refused::ShuttingDown);
            } else {
                self.merge(slot, priority, when, now, fx);
            }
        }
        self.leased -= 1;
        if let Some(t) = &mut self.times {
            t.leases.end(lease);
        }
        let Node {
            place, priority, ..
        } = self.nodes[slot as usize];
        let mut forgotten = None;
        match place {
            Place::Leased => forgotten = self.free(slot),
            Place::LeasedDirty => {
                self.dirty -= 1;
                self.make_ready(slot, priority, now);
                fx.wake += 1;
            }
            Place::LeasedWaiting { seq, at } => {
                self.set(slot, Place::Waiting { seq, at }, priority)
            }
            _ => unreachable!("finishing a lease that is not leased"),
        }
        fx.wake_all |= self.is_drained();
        (refused, forgotten)
    }

    /// Refuses further adds and drops every pending delay.
    #[cfg(test)]
    pub(crate) fn shutdown(&mut self) -> Effects {
        self.shutdown_keeping(None, &mut |_| {}, &mut Vec::new())
    }

    /// Refuses further adds and drops the pending delays due after
    /// `keep_until` (all of them if `None`), telling `dropped` each key
    /// whose delay it drops. The kept ones still fire: until they have,
    /// the queue is neither closed nor drained. The keys the queue lets go
    /// of (those not leased) go to `freed`, for the caller to drop once it
    /// has released the lock.
    pub(crate) fn shutdown_keeping(
        &mut self,
        keep_until: Option<Instant>,
        dropped: &mut dyn FnMut(&K),
        freed: &mut Vec<K>,
    ) -> Effects {
        let mut fx = Effects::default();
        if self.shutdown {
            return fx;
        }
        self.shutdown = true;
        let keep = keep_until.map(|t| self.nanos(t));
        let mut waiting = Vec::with_capacity(self.waiting);
        for (i, n) in self.nodes.iter().enumerate() {
            match n.place {
                Place::Waiting { at, .. } | Place::LeasedWaiting { at, .. }
                    if keep.is_none_or(|k| at > k) =>
                {
                    waiting.push(i as u32)
                }
                _ => {}
            }
        }
        for &slot in &waiting {
            if let Some(key) = self.nodes.key(slot as usize) {
                dropped(key);
            }
            let node = &mut self.nodes[slot as usize];
            match node.place {
                Place::Waiting { .. } => freed.extend(self.unlink_slot(slot)),
                _ => node.place = Place::Leased,
            }
        }
        self.waiting -= waiting.len();
        if self.waiting > 0 {
            // Their entries fire as usual; those of the dropped ones are stale.
            fx.wake_all = true;
            return fx;
        }
        // The timer task ends once every shard is shut down with nothing
        // left to fire, dropping its wheel; until then, this shard's stale
        // entries in it are ignored when they fire.
        self.deferred = Vec::new();
        self.wheel_entries = 0;
        if let Some(w) = self.timer_waker.take() {
            fx.timer_waker = Some(WakeTimer(WakerEq(w)));
        }
        fx.wake_all = true;
        fx
    }

    /// Whether a key is ready (a queue's one shard shows it in its mark;
    /// see [`Marks::publish`](crate::shard::Marks::publish)).
    pub(crate) fn has_ready(&self) -> bool {
        self.ready_len > 0
    }

    /// When the oldest ready key became ready, in nanoseconds from the
    /// epoch (with a starvation bound; `None` without one, or if no key is
    /// ready).
    /// The number it drew breaks ties between keys ready at the same time.
    pub(crate) fn oldest_ready(&self) -> Option<(u64, u32)> {
        let t = self.times.as_ref().filter(|t| t.age_list)?;
        let head = t.ready.head;
        (head != NIL).then(|| {
            (
                self.nanos(t.ready_at[head as usize]),
                t.age[head as usize].number,
            )
        })
    }

    /// Makes this state shard `index` of a queue (`index` goes into its
    /// delays' entries), counting from the queue's `counters`; `lanes`:
    /// the queue has other shards, whose order the lanes keep.
    pub(crate) fn join(&mut self, index: u32, counters: Arc<Counters>, lanes: Option<Arc<Lanes>>) {
        self.shard = index;
        self.counters = counters;
        self.lanes = lanes;
    }

    /// Whether the queue's lanes hold the order (it has other shards).
    pub(crate) fn has_lanes(&self) -> bool {
        self.lanes.is_some()
    }

    /// After a pop: tell everyone if that was the last key there will be.
    pub(crate) fn closed_effects(&self) -> Effects {
        Effects {
            wake_all: self.is_closed(),
            ..Effects::default()
        }
    }
}

impl Times {
    /// Links `slot`, just made ready, at the young end of the age list.
    fn push_back(&mut self, slot: u32, number: u32) {
        let tail = self.ready.tail;
        self.age[slot as usize] = AgeLinks {
            prev: tail,
            next: NIL,
            number,
        };
        if tail != NIL {
            self.age[tail as usize].next = slot;
        } else {
            self.ready.head = slot;
        }
        self.ready.tail = slot;
    }

    fn unlink(&mut self, slot: u32) {
        let AgeLinks { prev, next, .. } = self.age[slot as usize];
        if prev != NIL {
            self.age[prev as usize].next = next;
        } else {
            self.ready.head = next;
        }
        if next != NIL {
            self.age[next as usize].prev = prev;
        } else {
            self.ready.tail = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ordering::Priorities;
    use std::hash::BuildHasher;

    fn h(k: &str) -> u64 {
        // One seeded hasher for the whole test run, as a queue keeps one.
        static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> =
            std::sync::OnceLock::new();
        HASHER.get_or_init(Default::default).hash_one(k)
    }

    type St = State<String, Priorities>;

    fn add(st: &mut St, k: &str, p: i32) -> Effects {
        let mut fx = Effects::default();
        st.add(k.to_string(), h(k), p, When::Now, None, &mut fx)
            .unwrap();
        fx
    }

    /// Ends the lease on `slot` (of lease `lease`) with no requeue.
    fn finish(st: &mut St, slot: u32, lease: u32) -> Effects {
        let mut fx = Effects::default();
        let _ = st.finish(slot, lease, None, None, &mut fx);
        fx
    }

    fn pop(st: &mut St) -> Option<(u32, String, i32)> {
        // SAFETY: the lease has not ended (the state lives, and `finish`
        // was not called for it).
        st.pop(None)
            .map(|p| (p.slot, unsafe { p.key.get() }.clone(), p.priority))
    }

    #[test]
    fn node_is_48_bytes_for_string_keys_with_each_built_in_ordering() {
        use crate::nodes::slot_size;
        use crate::ordering::{FairShareEntry, Links, PriorityEntry};
        assert_eq!(slot_size::<String, Node<PriorityEntry>>(), 48);
        assert_eq!(slot_size::<String, Node<Links>>(), 48);
        assert_eq!(slot_size::<String, Node<FairShareEntry>>(), 48);
        assert_eq!(slot_size::<String, Node<()>>(), 48);
    }

    /// The address a consumer prefetches a key's ready time from is where
    /// the state keeps it, and a state that keeps no times gives none.
    #[test]
    fn times_at_is_where_the_ready_times_are() {
        let mut plain = State::new(false, None, Priorities::new());
        let _ = add(&mut plain, "a", 0);
        assert_eq!(plain.times_at(), 0);
        let mut timed = State::new(true, None, Priorities::new());
        assert_eq!(timed.times_at(), 0, "no room yet");
        for k in ["a", "b", "c"] {
            let _ = add(&mut timed, k, 0);
        }
        let t = timed.times.as_ref().unwrap();
        let third = std::ptr::from_ref(&t.ready_at[2]).addr();
        assert_eq!(timed.times_at() + 2 * size_of::<Instant>(), third);
        // Said once per move: the array grew at the first add and again
        // past its first room, and not since.
        assert_eq!(timed.moved_times(), Some(timed.times_at()));
        assert_eq!(timed.moved_times(), None);
        assert_eq!(plain.moved_times(), None);
    }

    #[test]
    fn fifo_and_dedup() {
        let mut st = State::new(false, None, Priorities::new());
        assert_eq!(add(&mut st, "a", 0).added, 1);
        assert_eq!(add(&mut st, "b", 0).added, 1);
        assert_eq!(add(&mut st, "a", 0), Effects::default());
        assert_eq!(st.ready_len(), 2);
        assert_eq!(pop(&mut st).unwrap().1, "a");
        assert_eq!(pop(&mut st).unwrap().1, "b");
        assert!(pop(&mut st).is_none());
    }

    #[test]
    fn dirty_key_returns_once_after_lease() {
        let mut st = State::new(false, None, Priorities::new());
        let _ = add(&mut st, "a", 0);
        let (slot, _, _) = pop(&mut st).unwrap();
        assert_eq!(add(&mut st, "a", 0).added, 1);
        assert_eq!(add(&mut st, "a", 0).added, 0);
        assert!(pop(&mut st).is_none(), "stingy: not while leased");
        let fx = finish(&mut st, slot, NIL);
        assert_eq!(fx.wake, 1);
        let (slot, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        let _ = finish(&mut st, slot, NIL);
        assert!(pop(&mut st).is_none());
        assert_eq!(st.index.len(), 0);
    }

    #[test]
    fn priorities_raise_and_never_lower() {
        let mut st = State::new(false, None, Priorities::new());
        let _ = add(&mut st, "low", -1);
        let _ = add(&mut st, "mid", 0);
        let _ = add(&mut st, "mid2", 0);
        let _ = add(&mut st, "mid", -5); // never lowers
        let _ = add(&mut st, "low", 0); // raised to the back of level 0
        let order: Vec<_> = std::iter::from_fn(|| pop(&mut st).map(|p| (p.1, p.2))).collect();
        assert_eq!(
            order,
            [("mid".into(), 0), ("mid2".into(), 0), ("low".into(), 0)]
        );
    }

    #[test]
    fn lease_starts_come_earliest_first_and_ended_entries_are_reused() {
        let mut st = State::new(true, None, Priorities::new());
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        for k in ["a", "b", "c", "d"] {
            let _ = add(&mut st, k, 0);
        }
        let a = st.pop(Some(at(1))).unwrap();
        let b = st.pop(Some(at(2))).unwrap();
        let c = st.pop(Some(at(3))).unwrap();
        assert_eq!(st.lease_starts(), [at(1), at(2), at(3)]);
        // Ending the middle lease frees its entry; the next lease takes it,
        // and the starts still come out earliest first.
        let _ = finish(&mut st, b.slot, b.lease);
        assert_eq!(st.lease_starts(), [at(1), at(3)]);
        let d = st.pop(Some(at(4))).unwrap();
        assert_eq!(d.lease, b.lease, "the freed entry is reused");
        assert_eq!(st.lease_starts(), [at(1), at(3), at(4)]);
        for p in [a, c, d] {
            let _ = finish(&mut st, p.slot, p.lease);
        }
        assert!(st.lease_starts().is_empty());
        assert_eq!(st.times.as_ref().unwrap().leases.starts.len(), 3);
    }

    #[test]
    fn freed_slots_are_reused() {
        let mut st = State::new(false, None, Priorities::new());
        for round in 0..3 {
            for i in 0..100 {
                let _ = add(&mut st, &format!("k{i}"), 0);
            }
            while let Some((slot, _, _)) = pop(&mut st) {
                let _ = finish(&mut st, slot, NIL);
            }
            assert_eq!(st.nodes.len(), 100, "round {round}");
        }
    }

    /// Adds `n` keys, then hands each out and ends its lease.
    fn fill_and_empty(st: &mut St, n: usize, round: usize) {
        for i in 0..n {
            let _ = add(st, &format!("r{round}-k{i}"), 0);
        }
        while let Some((slot, _, _)) = pop(st) {
            let _ = finish(st, slot, NIL);
        }
    }

    #[test]
    fn an_emptied_large_queue_gives_its_room_back_and_works_on() {
        for times in [false, true] {
            let mut st = State::new(times, None, Priorities::new());
            fill_and_empty(&mut st, KEEP_SLOTS + 1, 0);
            assert_eq!(st.nodes.capacity(), 0);
            assert_eq!(st.index.capacity(), 0);
            // It keeps working, from slot 0 again, de-duplicating as before.
            let _ = add(&mut st, "a", 0);
            let _ = add(&mut st, "a", 0);
            let _ = add(&mut st, "b", 0);
            assert_eq!(pop(&mut st).map(|p| (p.0, p.1)), Some((0, "a".into())));
            assert_eq!(pop(&mut st).map(|p| p.1), Some("b".into()));
            assert_eq!(pop(&mut st), None);
        }
    }

    #[test]
    fn a_small_queue_or_a_pending_timer_entry_keeps_the_room() {
        let mut st = State::new(false, None, Priorities::new());
        fill_and_empty(&mut st, KEEP_SLOTS, 0);
        assert_eq!(st.nodes.len(), KEEP_SLOTS);
        // A delay cancelled by an add leaves its entry out with the timer
        // task, naming a slot: the room stays until it comes back.
        let mut st = State::new(false, None, Priorities::new());
        let _ = add_at(&mut st, "late", Instant::now() + Duration::from_secs(60));
        let _ = add(&mut st, "late", 0);
        fill_and_empty(&mut st, KEEP_SLOTS + 1, 1);
        assert_eq!(st.nodes.len(), KEEP_SLOTS + 2);
    }

    #[test]
    fn shutdown_refuses_and_closes_after_ready_and_dirty_keys() {
        let mut st = State::new(false, None, Priorities::new());
        let _ = add(&mut st, "a", 0);
        let _ = add(&mut st, "b", 0);
        let (slot, _, _) = pop(&mut st).unwrap();
        let _ = add(&mut st, "a", 0); // dirty
        assert!(st.shutdown().wake_all);
        assert!(
            st.add(
                "c".into(),
                h("c"),
                0,
                When::Now,
                None,
                &mut Effects::default()
            )
            .is_err()
        );
        assert!(!st.is_closed());
        let (b, _, _) = pop(&mut st).unwrap();
        assert!(!st.is_closed(), "a dirty key is still owed");
        let _ = finish(&mut st, slot, NIL);
        let (a, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        assert!(st.is_closed());
        assert!(!st.is_drained());
        let _ = finish(&mut st, a, NIL);
        let fx = finish(&mut st, b, NIL);
        assert!(fx.wake_all && st.is_drained());
    }

    fn add_at(st: &mut St, k: &str, at: Instant) -> Effects {
        let mut fx = Effects::default();
        st.add(k.to_string(), h(k), 0, When::At(at), None, &mut fx)
            .unwrap();
        fx
    }

    /// Plays the timer task: takes the entries sent, as it would.
    fn take_sent(st: &mut St) -> (Vec<TimerEntry>, bool) {
        let mut incoming = Vec::new();
        let (_, fresh) =
            st.timer_round(std::task::Waker::noop(), [], &mut incoming, Instant::now());
        (incoming, fresh)
    }

    fn fire(st: &mut St, entries: &[TimerEntry]) -> Effects {
        let (fx, _) = st.timer_round(
            std::task::Waker::noop(),
            entries.iter().copied(),
            &mut Vec::new(),
            Instant::now(),
        );
        fx
    }

    #[test]
    fn delays_merge_and_cancel_without_the_wheel() {
        let mut st = State::new(false, None, Priorities::new());
        let now = Instant::now();
        let secs = |s| now + Duration::from_secs(s);
        assert_eq!(add_at(&mut st, "a", secs(10)).added, 0, "added when due");
        assert_eq!(st.counts().waiting, 1);
        // The earlier ready time wins with a new entry; a later one is
        // ignored.
        let _ = add_at(&mut st, "a", secs(5));
        let _ = add_at(&mut st, "a", secs(20));
        let (sent, fresh) = take_sent(&mut st);
        assert!(!fresh);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[1].deadline(st.epoch()), secs(5));
        // The superseded entry is stale: firing it does nothing.
        assert_eq!(fire(&mut st, &sent[..1]), Effects::default());
        assert_eq!(st.counts().waiting, 1);
        // An immediate add makes it ready; its live entry is then stale too.
        assert_eq!(add(&mut st, "a", 0).added, 1);
        assert_eq!(st.counts().waiting, 0);
        assert_eq!(fire(&mut st, &sent[1..]), Effects::default());
        let (slot, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        // Delayed while leased: waits once the lease ends; shutdown drops it.
        let _ = add_at(&mut st, "a", secs(5));
        assert!(matches!(
            st.nodes[slot as usize].place,
            Place::LeasedWaiting { .. }
        ));
        let _ = finish(&mut st, slot, NIL);
        assert!(matches!(
            st.nodes[slot as usize].place,
            Place::Waiting { .. }
        ));
        let _ = st.shutdown();
        assert!(st.deferred.is_empty());
        assert_eq!(st.index.len(), 0);
    }

    #[test]
    fn a_live_entry_fires_its_key_once() {
        let mut st = State::new(false, None, Priorities::new());
        let at = Instant::now() + Duration::from_millis(1);
        let _ = add_at(&mut st, "a", at);
        let (sent, _) = take_sent(&mut st);
        let fx = fire(&mut st, &sent);
        assert_eq!((fx.wake, fx.added), (1, 1));
        assert_eq!(st.ready_len(), 1);
        // The same entry again (it cannot happen, but must be harmless).
        assert_eq!(fire(&mut st, &sent), Effects::default());
        // A slot reused by another key with a delay ignores the old entry.
        let (slot, _, _) = pop(&mut st).unwrap();
        let _ = finish(&mut st, slot, NIL);
        let _ = add_at(&mut st, "b", at);
        assert_eq!(fire(&mut st, &sent), Effects::default());
        assert_eq!(st.counts().waiting, 1);
    }

    /// The wheel serves every shard of a queue, so it can still hold stale
    /// entries of a shard that shut down and gave its room back while
    /// another shard's kept delays keep the timer task running.
    #[test]
    fn an_entry_for_a_slot_given_back_is_ignored() {
        let mut st = State::new(false, None, Priorities::new());
        let at = Instant::now() + Duration::from_millis(1);
        fill_and_empty(&mut st, 2 * KEEP_SLOTS, 0);
        let _ = add_at(&mut st, "late", at);
        let (sent, _) = take_sent(&mut st);
        let _ = st.shutdown();
        let stale = TimerEntry {
            slot: 2 * KEEP_SLOTS as u32,
            ..sent[0]
        };
        assert_eq!(fire(&mut st, &[stale]), Effects::default());
        assert_eq!(fire(&mut st, &sent), Effects::default());
        assert!(st.is_closed());
    }

    #[test]
    fn stale_entries_are_bounded_by_a_fresh_wheel() {
        let mut st = State::new(false, None, Priorities::new());
        let later = Instant::now() + Duration::from_secs(3600);
        let _ = add_at(&mut st, "keeps waiting", later);
        // One key whose delay is cancelled over and over, the entries never
        // firing: each cycle leaves one stale entry behind.
        let mut sent = 0;
        let mut fresh_rounds = 0;
        for _ in 0..10 * STALE_SLACK {
            let _ = add_at(&mut st, "flaps", later);
            let _ = add(&mut st, "flaps", 0);
            let (slot, _, _) = pop(&mut st).unwrap();
            let _ = finish(&mut st, slot, NIL);
            let (entries, fresh) = take_sent(&mut st);
            if fresh {
                fresh_rounds += 1;
                sent = 0;
            }
            sent += entries.len();
            assert!(sent <= STALE_SLACK + 2, "{sent} entries in the wheel");
        }
        assert!(fresh_rounds >= 9, "{fresh_rounds}");
        // The fresh wheel holds exactly the live delay, with its deadline.
        let _ = add_at(&mut st, "flaps", later);
        let _ = add(&mut st, "flaps", 0);
        st.resend_timers();
        let (entries, fresh) = take_sent(&mut st);
        assert!(fresh);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].deadline(st.epoch()), later);
        assert_eq!(fire(&mut st, &entries).added, 1);
    }

    #[test]
    fn the_index_grows_by_rebuilding_and_keeps_every_key() {
        let mut st = State::new(false, None, Priorities::new());
        let keys: Vec<String> = (0..5000).map(|i| format!("ns/k{i}")).collect();
        let mut rebuilds = 0;
        for k in &keys {
            let buckets = st.index.num_buckets();
            assert_eq!(add(&mut st, k, 0).added, 1);
            rebuilds += usize::from(st.index.num_buckets() != buckets);
        }
        assert!(rebuilds >= 8, "{rebuilds} growths");
        // Every key is found again: re-adds merge.
        for k in &keys {
            assert_eq!(add(&mut st, k, 0), Effects::default(), "{k}");
        }
        assert_eq!(st.index.len(), keys.len());
        let order: Vec<String> = std::iter::from_fn(|| pop(&mut st).map(|p| p.1)).collect();
        assert_eq!(order, keys);
    }

    #[test]
    fn churn_through_tombstones_neither_loses_keys_nor_grows_the_index() {
        let mut st = State::new(false, None, Priorities::new());
        // 100 keys stay ready while 20,000 others come and go: removals
        // leave tombstones that use up the table's room, and the rebuild
        // must then clean them rather than double the table each time.
        for i in 0..100 {
            let _ = add(&mut st, &format!("stay{i}"), 0);
        }
        let stay: Vec<(u32, String, i32)> = (0..100).map(|_| pop(&mut st).unwrap()).collect();
        for i in 0..20_000 {
            let k = format!("churn{i}");
            assert_eq!(add(&mut st, &k, 0).added, 1);
            let (slot, got, _) = pop(&mut st).unwrap();
            assert_eq!(got, k);
            let _ = finish(&mut st, slot, NIL);
        }
        assert_eq!(st.index.len(), 100);
        assert!(st.index.num_buckets() <= 512, "{}", st.index.num_buckets());
        for (_, k, _) in &stay {
            assert_eq!(add(&mut st, k, 0).added, 1, "{k} is leased: dirty");
            assert_eq!(add(&mut st, k, 0).added, 0, "{k} found again");
        }
    }

    #[test]
    fn levels_say_one_priority_until_a_second_comes() {
        let mut l = Levels::None;
        l.add(3);
        assert_eq!(l, Levels::One(3));
        l.add(3);
        assert_eq!(l, Levels::One(3));
        l.add(-1);
        assert_eq!(l, Levels::Many);
        l.add(3);
        assert_eq!(l, Levels::Many, "only an empty shard starts again");
    }

    #[test]
    fn many_levels_are_pruned_when_idle() {
        let mut st = State::new(true, None, Priorities::new());
        for p in 0..100 {
            let _ = add(&mut st, &format!("k{p}"), p);
            let (slot, _, prio) = pop(&mut st).unwrap();
            assert_eq!(prio, p);
            let _ = finish(&mut st, slot, NIL);
        }
        assert!(st.order.level_count() <= crate::ordering::MAX_IDLE_LEVELS);
        assert!(st.counts().ready_by_priority.is_empty());
    }
}
