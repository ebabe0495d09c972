//! The queue's state machine: one entry per key, kept under one lock.
//!
//! Every key the queue knows has one [`Node`] in a slab. A node is in exactly
//! one [`Place`]:
//!
//! ```text
//!            add                    timer fires / add now
//!   (new) ───────► Ready ◄─────────────────────────── Waiting ◄── add_after (new)
//!                    │ pop                                ▲
//!                    ▼                                    │ lease ends
//!                 Leased ──add now──► LeasedDirty      LeasedWaiting
//!                    │  └──add_after──────────────────────▲
//!                    ▼ lease ends             │ lease ends: back of its level
//!                  (free)                     ▼
//!                                           Ready
//! ```
//!
//! Ready nodes sit in intrusive FIFO lists, one per priority level, so a
//! hand-out, a raise and a removal are O(1) and store no second copy of the
//! key. The index is a `hashbrown::HashTable` of slot numbers: it holds four
//! bytes per key and compares keys only on a 32-bit hash match.
//!
//! When ready times are tracked (metrics or a starvation bound), a side table
//! keeps one time and a second pair of links per slot: leased nodes are
//! linked by lease start, and with a starvation bound ready nodes are also
//! linked by age, so the longest lease and the oldest ready key are both
//! found in O(1).
//!
//! A delayed add does not touch the timer wheel: it records the deadline in
//! `deferred` (the node is `Deferred`), and the timer task, which runs beside
//! the adding task, moves such records into the wheel when it next runs (the
//! node becomes `Waiting`). The wheel insert is the costly part of a delayed
//! add, so a producer of delayed keys pays little more than for an immediate
//! add.
//!
//! Nothing here blocks, sleeps or wakes tasks: the caller does that after the
//! lock is released, guided by the [`Effects`] each call returns.

use std::hash::Hash;
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::prefetch::IndexLayout;
use tokio::time::Instant;
use tokio_util::time::DelayQueue;
use tokio_util::time::delay_queue::Key as TimerKey;

/// "No slot": the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// The longest delay the queue accepts; longer ones are clamped to it.
///
/// tokio-util's `DelayQueue` covers about two years and panics beyond that;
/// one year keeps every deadline well inside its range.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Levels are kept when they empty, so a steady mix of priorities does not
/// allocate; past this many, empty ones are pruned.
const MAX_IDLE_LEVELS: usize = 16;

/// How stale the timer wheel may get before an insert into an empty
/// `DelayQueue` starts a fresh one (see [`State::insert_timer`]).
const WHEEL_REFRESH: Duration = Duration::from_secs(30 * 24 * 60 * 60);

#[derive(Debug, Clone, Copy)]
enum Place {
    Free {
        next_free: u32,
    },
    Ready {
        prev: u32,
        next: u32,
    },
    Waiting {
        timer: TimerKey,
    },
    /// Waiting, its timer not yet in the wheel: `at` indexes
    /// [`State::deferred`].
    Deferred {
        at: u32,
    },
    Leased,
    LeasedDirty,
    LeasedWaiting {
        timer: TimerKey,
    },
    LeasedDeferred {
        at: u32,
    },
}

/// A delay the timer task has yet to put in the wheel. The wheel insert is
/// the costly part of a delayed add, so the adding task only records it and
/// the timer task, which runs beside it, does the insert.
#[derive(Debug, Clone, Copy)]
struct DeferredTimer {
    /// NIL once cancelled (the key became ready or was dropped).
    slot: u32,
    /// The order the delay was set in, for keys due in the same millisecond.
    seq: u64,
    deadline: Instant,
}

#[derive(Debug)]
struct Node<K> {
    key: Option<K>,
    place: Place,
    /// Low 32 bits of the key's hash: enough to rebuild the index without
    /// reading keys, and to skip most key comparisons on lookup.
    hash: u32,
    /// Ready: the level it sits in. Waiting or dirty: the priority it will
    /// become ready with.
    priority: i32,
}

#[derive(Debug)]
struct Level {
    priority: i32,
    head: u32,
    tail: u32,
    len: usize,
}

/// Per-slot time and age links, kept only when times are tracked.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    at: Instant,
    prev: u32,
    next: u32,
}

#[derive(Debug, Default)]
struct StampList {
    head: u32,
    tail: u32,
}

#[derive(Debug)]
struct Times {
    /// A placeholder time for stamps not yet in a list.
    epoch: Instant,
    stamps: Vec<Stamp>,
    /// Whether ready keys are linked in `ready`: only the starvation bound
    /// needs the oldest one; metrics need each key's ready time alone.
    age_list: bool,
    /// Ready keys, oldest ready time first (when `age_list`).
    ready: StampList,
    /// Leased keys, earliest lease first.
    leased: StampList,
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
    pub(crate) key: K,
    pub(crate) priority: i32,
    /// When it became ready, if times are tracked.
    pub(crate) ready_at: Option<Instant>,
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

pub(crate) struct State<K> {
    nodes: Vec<Node<K>>,
    free_head: u32,
    index: HashTable<u32>,
    /// Where `index` keeps its groups, for prefetch hints.
    layout: IndexLayout,
    /// Highest priority first.
    levels: Vec<Level>,
    ready_len: usize,
    leased: usize,
    dirty: usize,
    waiting: usize,
    /// Each entry is a slot and the order its delay was set in, so keys
    /// due in the same millisecond come out in the order they were added.
    timers: DelayQueue<(u32, u64)>,
    /// Delays set since the timer task last ran, for it to put in `timers`.
    deferred: Vec<DeferredTimer>,
    timer_seq: u64,
    /// When the timer task last polled the wheel.
    timers_polled_at: Option<Instant>,
    timer_waker: Option<Waker>,
    times: Option<Times>,
    /// Serve keys older than this first, oldest first.
    promote_after: Option<Duration>,
    shutdown: bool,
    /// Consumers parked in `get`.
    pub(crate) parked: usize,
    /// The task that drives `timers`, once a delayed add started it.
    pub(crate) timer_task: Option<tokio::task::AbortHandle>,
}

impl<K> std::fmt::Debug for State<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("ready", &self.ready_len)
            .field("leased", &self.leased)
            .field("dirty", &self.dirty)
            .field("waiting", &self.waiting)
            .field("levels", &self.levels.len())
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

/// Takes a slot for a new node: the head of the free list, else a new one
/// at the end. The caller indexes it.
fn alloc<K>(
    nodes: &mut Vec<Node<K>>,
    free_head: &mut u32,
    times: Option<&mut Times>,
    node: Node<K>,
) -> u32 {
    if *free_head != NIL {
        let slot = *free_head;
        let old = &mut nodes[slot as usize];
        let Place::Free { next_free } = old.place else {
            unreachable!("free list holds a live node")
        };
        *free_head = next_free;
        *old = node;
        return slot;
    }
    // Slot numbers are u32 and NIL is reserved: 4 billion live keys is far
    // past any memory this queue could be given.
    let slot = u32::try_from(nodes.len())
        .ok()
        .filter(|&s| s != NIL)
        .expect("more than u32::MAX - 1 keys in one queue");
    nodes.push(node);
    if let Some(t) = times {
        // Overwritten whenever the slot joins a list, before it is read: no
        // clock read needed here.
        t.stamps.push(Stamp {
            at: t.epoch,
            prev: NIL,
            next: NIL,
        });
    }
    slot
}

impl<K: Eq + Hash> State<K> {
    /// Adds `key` (hashed to `h`) with `priority`, ready `when`.
    ///
    /// `now` is the caller's clock reading when times are tracked.
    pub(crate) fn add(
        &mut self,
        key: K,
        h: u64,
        priority: i32,
        when: When,
        now: Option<Instant>,
    ) -> Result<Effects, Refused> {
        if self.shutdown {
            return Err(Refused::ShuttingDown);
        }
        let h = h as u32;
        let mut fx = Effects::default();
        // One probe finds the key or the place its entry goes: on a large
        // queue each probe of the index is a cache miss.
        let nodes = &self.nodes;
        let entry = self.index.entry(
            wide(h),
            |&i| {
                let n = &nodes[i as usize];
                n.hash == h && n.key.as_ref() == Some(&key)
            },
            |&i| wide(nodes[i as usize].hash),
        );
        let vacant = match entry {
            Entry::Occupied(e) => {
                let slot = *e.get();
                self.merge(slot, priority, when, now, &mut fx);
                return Ok(fx);
            }
            Entry::Vacant(v) => v,
        };
        let node = Node {
            key: Some(key),
            place: Place::Leased,
            hash: h,
            priority,
        };
        let slot = alloc(
            &mut self.nodes,
            &mut self.free_head,
            self.times.as_mut(),
            node,
        );
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
                let at = self.defer(slot, deadline, &mut fx);
                self.nodes[slot as usize].place = Place::Deferred { at };
                self.waiting += 1;
            }
        }
        Ok(fx)
    }
}

impl<K> State<K> {
    /// Whether a timer task is running for this queue.
    pub(crate) fn timer_running(&self) -> bool {
        self.timer_task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Where the index keeps its groups now.
    pub(crate) fn layout(&self) -> IndexLayout {
        self.layout
    }

    /// `track_times` keeps ready and lease times (for metrics and the
    /// starvation bound); `promote_after` serves keys that have been ready
    /// that long before any others.
    pub(crate) fn new(track_times: bool, promote_after: Option<Duration>) -> Self {
        State {
            nodes: Vec::new(),
            free_head: NIL,
            index: HashTable::new(),
            layout: IndexLayout::default(),
            levels: Vec::new(),
            ready_len: 0,
            leased: 0,
            dirty: 0,
            waiting: 0,
            timers: DelayQueue::new(),
            deferred: Vec::new(),
            timer_seq: 0,
            timers_polled_at: None,
            timer_waker: None,
            times: (track_times || promote_after.is_some()).then(|| Times {
                epoch: Instant::now(),
                stamps: Vec::new(),
                age_list: promote_after.is_some(),
                ready: StampList {
                    head: NIL,
                    tail: NIL,
                },
                leased: StampList {
                    head: NIL,
                    tail: NIL,
                },
            }),
            promote_after,
            shutdown: false,
            parked: 0,
            timer_task: None,
        }
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown
    }

    /// Keys ready to be handed out.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready_len
    }

    /// Nothing left to hand out, now or later: consumers may stop.
    pub(crate) fn is_closed(&self) -> bool {
        self.shutdown && self.ready_len == 0 && self.dirty == 0
    }

    /// Shut down with nothing ready and nothing leased.
    pub(crate) fn is_drained(&self) -> bool {
        self.shutdown && self.ready_len == 0 && self.leased == 0
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            ready_by_priority: self
                .levels
                .iter()
                .filter(|l| l.len > 0)
                .map(|l| (l.priority, l.len))
                .collect(),
            leased: self.leased,
            waiting: self.waiting,
            dirty: self.dirty,
        }
    }

    /// Lease start times of the keys in flight, earliest first.
    pub(crate) fn lease_starts(&self) -> Vec<Instant> {
        let mut out = Vec::with_capacity(self.leased);
        if let Some(t) = &self.times {
            let mut i = t.leased.head;
            while i != NIL {
                out.push(t.stamps[i as usize].at);
                i = t.stamps[i as usize].next;
            }
        }
        out
    }

    /// Frees `slot` and returns its key, for the caller to drop once the
    /// lock is released.
    fn free(&mut self, slot: u32) -> Option<K> {
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
        node.key.take()
    }

    fn level_index(&mut self, priority: i32) -> usize {
        // Levels are few; the common single-level queue finds it at once.
        match self.levels.iter().position(|l| l.priority <= priority) {
            Some(i) if self.levels[i].priority == priority => i,
            found => {
                if self.levels.len() >= MAX_IDLE_LEVELS && self.levels.iter().any(|l| l.len == 0) {
                    self.levels.retain(|l| l.len > 0);
                    return self.level_index(priority);
                }
                let i = found.unwrap_or(self.levels.len());
                self.levels.insert(
                    i,
                    Level {
                        priority,
                        head: NIL,
                        tail: NIL,
                        len: 0,
                    },
                );
                i
            }
        }
    }

    /// Appends `slot` to the back of its priority level.
    fn link_ready(&mut self, slot: u32, priority: i32) {
        let li = self.level_index(priority);
        let level = &mut self.levels[li];
        let tail = level.tail;
        level.tail = slot;
        if tail == NIL {
            level.head = slot;
        }
        level.len += 1;
        if tail != NIL {
            match &mut self.nodes[tail as usize].place {
                Place::Ready { next, .. } => *next = slot,
                _ => unreachable!("level tail is not ready"),
            }
        }
        let node = &mut self.nodes[slot as usize];
        node.priority = priority;
        node.place = Place::Ready {
            prev: tail,
            next: NIL,
        };
        self.ready_len += 1;
    }

    fn unlink_ready(&mut self, slot: u32) {
        let node = &self.nodes[slot as usize];
        let Place::Ready { prev, next } = node.place else {
            unreachable!("unlinking a node that is not ready")
        };
        let priority = node.priority;
        let li = self
            .levels
            .iter()
            .position(|l| l.priority == priority)
            .expect("ready node without its level");
        if prev != NIL {
            if let Place::Ready { next: n, .. } = &mut self.nodes[prev as usize].place {
                *n = next;
            }
        } else {
            self.levels[li].head = next;
        }
        if next != NIL {
            if let Place::Ready { prev: p, .. } = &mut self.nodes[next as usize].place {
                *p = prev;
            }
        } else {
            self.levels[li].tail = prev;
        }
        self.levels[li].len -= 1;
        self.ready_len -= 1;
    }

    /// A key joins the ready set (at the back of its level) at `now`.
    fn make_ready(&mut self, slot: u32, priority: i32, now: Option<Instant>) {
        self.link_ready(slot, priority);
        if let Some(t) = &mut self.times {
            let at = now.unwrap_or_else(Instant::now);
            if t.age_list {
                t.push_back(Which::Ready, slot, at);
            } else {
                t.stamps[slot as usize].at = at;
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
            (Place::Ready { .. }, _) => {
                if priority > old {
                    // A raise goes to the back of its new level; its ready
                    // time, and so its place in the age list, is kept.
                    self.unlink_ready(slot);
                    self.link_ready(slot, priority);
                }
            }
            (Place::Waiting { timer }, When::Now) => {
                self.timers.try_remove(&timer);
                self.waiting -= 1;
                self.make_ready(slot, merged, now);
                fx.wake += 1;
                fx.added += 1;
            }
            (Place::Waiting { timer } | Place::LeasedWaiting { timer }, When::At(deadline)) => {
                self.nodes[slot as usize].priority = merged;
                if deadline < self.timers.deadline(&timer) {
                    self.timers.reset_at(&timer, deadline);
                }
            }
            (Place::Deferred { at }, When::Now) => {
                self.deferred[at as usize].slot = NIL;
                self.waiting -= 1;
                self.make_ready(slot, merged, now);
                fx.wake += 1;
                fx.added += 1;
            }
            (Place::Deferred { at } | Place::LeasedDeferred { at }, When::At(deadline)) => {
                self.nodes[slot as usize].priority = merged;
                let pending = &mut self.deferred[at as usize];
                pending.deadline = pending.deadline.min(deadline);
            }
            (Place::Leased, When::Now) => {
                self.set(slot, Place::LeasedDirty, priority);
                self.dirty += 1;
                fx.added += 1;
            }
            (Place::Leased, When::At(deadline)) => {
                let at = self.defer(slot, deadline, fx);
                self.set(slot, Place::LeasedDeferred { at }, priority);
                self.waiting += 1;
            }
            (Place::LeasedDirty, _) => self.nodes[slot as usize].priority = merged,
            (Place::LeasedWaiting { timer }, When::Now) => {
                self.timers.try_remove(&timer);
                self.set(slot, Place::LeasedDirty, merged);
                self.waiting -= 1;
                self.dirty += 1;
                fx.added += 1;
            }
            (Place::LeasedDeferred { at }, When::Now) => {
                self.deferred[at as usize].slot = NIL;
                self.set(slot, Place::LeasedDirty, merged);
                self.waiting -= 1;
                self.dirty += 1;
                fx.added += 1;
            }
        }
    }

    /// Records a delay for the timer task to put in the wheel, and wakes the
    /// task when it is the first since it last ran.
    fn defer(&mut self, slot: u32, deadline: Instant, fx: &mut Effects) -> u32 {
        if self.deferred.is_empty()
            && let Some(w) = &self.timer_waker
        {
            fx.timer_waker = Some(WakeTimer(WakerEq(w.clone())));
        }
        self.timer_seq += 1;
        let at = u32::try_from(self.deferred.len()).expect("fewer delays than slots");
        self.deferred.push(DeferredTimer {
            slot,
            seq: self.timer_seq,
            deadline,
        });
        at
    }

    /// Puts the deferred delays in the wheel (in the timer task).
    fn insert_deferred(&mut self) {
        for d in std::mem::take(&mut self.deferred) {
            if d.slot == NIL {
                continue;
            }
            // A stale wheel replaced here is polled right after, by this task.
            let (timer, _) = self.insert_timer(d.slot, d.seq, d.deadline);
            let node = &mut self.nodes[d.slot as usize];
            node.place = match node.place {
                Place::Deferred { .. } => Place::Waiting { timer },
                Place::LeasedDeferred { .. } => Place::LeasedWaiting { timer },
                _ => unreachable!("a deferred delay for a key that is not waiting"),
            };
        }
    }

    fn set(&mut self, slot: u32, place: Place, priority: i32) {
        let node = &mut self.nodes[slot as usize];
        node.place = place;
        node.priority = priority;
    }

    fn insert_timer(
        &mut self,
        slot: u32,
        seq: u64,
        deadline: Instant,
    ) -> (TimerKey, Option<WakeTimer>) {
        // The wheel measures deadlines from its last poll and panics on one
        // more than about two years past it. A wheel with entries is polled at
        // least once a MAX_DELAY; an empty one may sit idle for ever, so a
        // stale empty wheel is replaced, and its task told to poll the new one.
        let mut wake = None;
        if self.timers.is_empty()
            && self
                .timers_polled_at
                .is_some_and(|at| deadline.saturating_duration_since(at) > WHEEL_REFRESH)
        {
            self.timers = DelayQueue::new();
            self.timers_polled_at = None;
            wake = self.timer_waker.take().map(|w| WakeTimer(WakerEq(w)));
        }
        (self.timers.insert_at((slot, seq), deadline), wake)
    }

    /// Moves every pending timer to a fresh wheel. The old wheel's sleep may
    /// belong to a runtime that has shut down, and polling it would panic.
    pub(crate) fn rebuild_timers(&mut self) {
        let mut old = std::mem::take(&mut self.timers);
        self.timers_polled_at = None;
        self.timer_waker = None;
        for slot in 0..self.nodes.len() {
            let place = self.nodes[slot].place;
            if let Place::Waiting { timer } | Place::LeasedWaiting { timer } = place {
                let expired = old.remove(&timer);
                let deadline = expired.deadline();
                let timer = self.timers.insert_at(expired.into_inner(), deadline);
                self.nodes[slot].place = match place {
                    Place::Waiting { .. } => Place::Waiting { timer },
                    _ => Place::LeasedWaiting { timer },
                };
            }
        }
    }

    /// Drives the timer wheel: makes every expired key ready, and registers
    /// `cx` for the next deadline.
    pub(crate) fn poll_timers(&mut self, cx: &mut std::task::Context<'_>, now: Instant) -> Effects {
        use std::task::Poll;
        let mut fx = Effects::default();
        self.timers_polled_at = Some(now);
        if !self
            .timer_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            self.timer_waker = Some(cx.waker().clone());
        }
        self.insert_deferred();
        let stamp = self.times.is_some().then_some(now);
        // The wheel hands out keys due in the same millisecond last-in first,
        // so every key due now is collected and fired in (deadline, order
        // added) order. A batch is not cut short: cutting it inside a
        // millisecond would break that order, and the lock is held for about
        // as long as the keys take to move (tens of nanoseconds each).
        let mut batch: Vec<(Instant, u64, u32)> = Vec::new();
        while let Poll::Ready(Some(expired)) = self.timers.poll_expired(cx) {
            let deadline = expired.deadline();
            let (slot, seq) = expired.into_inner();
            batch.push((deadline, seq, slot));
        }
        batch.sort_unstable();
        for (_, _, slot) in batch {
            self.fire(slot, stamp, &mut fx);
        }
        fx
    }

    fn fire(&mut self, slot: u32, now: Option<Instant>, fx: &mut Effects) {
        let Node {
            place, priority, ..
        } = self.nodes[slot as usize];
        match place {
            Place::Waiting { .. } => {
                self.waiting -= 1;
                self.make_ready(slot, priority, now);
                fx.wake += 1;
                fx.added += 1;
            }
            Place::LeasedWaiting { .. } => {
                self.set(slot, Place::LeasedDirty, priority);
                self.waiting -= 1;
                self.dirty += 1;
                fx.added += 1;
            }
            _ => unreachable!("a timer fired for a key that was not waiting"),
        }
    }

    /// Takes the next key: the oldest one past the promotion age if there is
    /// one, else the front of the highest non-empty level.
    pub(crate) fn pop(&mut self, now: Option<Instant>) -> Option<Popped<K>>
    where
        K: Clone,
    {
        if self.ready_len == 0 {
            return None;
        }
        let mut slot = NIL;
        if let (Some(age), Some(t), Some(now)) = (self.promote_after, &self.times, now) {
            let oldest = t.ready.head;
            if oldest != NIL && now.saturating_duration_since(t.stamps[oldest as usize].at) >= age {
                slot = oldest;
            }
        }
        if slot == NIL {
            slot = self
                .levels
                .iter()
                .find(|l| l.len > 0)
                .map(|l| l.head)
                .expect("ready_len > 0 with every level empty");
        }
        self.unlink_ready(slot);
        let mut ready_at = None;
        if let Some(t) = &mut self.times {
            ready_at = Some(t.stamps[slot as usize].at);
            if t.age_list {
                t.unlink(Which::Ready, slot);
            }
            t.push_back(Which::Leased, slot, now.unwrap_or_else(Instant::now));
        }
        self.leased += 1;
        let node = &mut self.nodes[slot as usize];
        node.place = Place::Leased;
        // The lease end will look the key up to free it: start fetching its
        // index group now, while the worker runs outside the lock.
        self.layout.prefetch(wide(node.hash));
        Some(Popped {
            slot,
            key: node.key.clone().expect("live node without a key"),
            priority: node.priority,
            ready_at,
        })
    }

    /// Ends the lease on `slot`, first merging `readd` into it if given
    /// (a requeue). A dirty key becomes ready at the back of its level; a key
    /// with a pending delay goes back to waiting; any other key is forgotten,
    /// and returned so that it is dropped outside the lock.
    pub(crate) fn finish(
        &mut self,
        slot: u32,
        readd: Option<(i32, When)>,
        now: Option<Instant>,
    ) -> (Effects, Result<(), Refused>, Option<K>) {
        let mut fx = Effects::default();
        let mut refused = Ok(());
        if let Some((priority, when)) = readd {
            if self.shutdown {
                refused = Err(Refused::ShuttingDown);
            } else {
                self.merge(slot, priority, when, now, &mut fx);
            }
        }
        self.leased -= 1;
        if let Some(t) = &mut self.times {
            t.unlink(Which::Leased, slot);
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
            Place::LeasedWaiting { timer } => self.set(slot, Place::Waiting { timer }, priority),
            Place::LeasedDeferred { at } => self.set(slot, Place::Deferred { at }, priority),
            _ => unreachable!("finishing a lease that is not leased"),
        }
        fx.wake_all |= self.is_drained();
        (fx, refused, forgotten)
    }

    /// Refuses further adds and drops every pending delay.
    pub(crate) fn shutdown(&mut self) -> Effects {
        let mut fx = Effects::default();
        if self.shutdown {
            return fx;
        }
        self.shutdown = true;
        let mut waiting = Vec::with_capacity(self.waiting);
        for (i, n) in self.nodes.iter().enumerate() {
            match n.place {
                Place::Waiting { .. }
                | Place::LeasedWaiting { .. }
                | Place::Deferred { .. }
                | Place::LeasedDeferred { .. } => waiting.push(i as u32),
                _ => {}
            }
        }
        for slot in waiting {
            match self.nodes[slot as usize].place {
                Place::Waiting { .. } | Place::Deferred { .. } => drop(self.free(slot)),
                _ => self.nodes[slot as usize].place = Place::Leased,
            }
        }
        self.waiting = 0;
        // Dropping the wheel releases every timer at once.
        self.deferred = Vec::new();
        self.timers = DelayQueue::new();
        self.timers_polled_at = None;
        if let Some(w) = self.timer_waker.take() {
            fx.timer_waker = Some(WakeTimer(WakerEq(w)));
        }
        fx.wake_all = true;
        fx
    }

    /// After a pop: tell everyone if that was the last key there will be.
    pub(crate) fn closed_effects(&self) -> Effects {
        Effects {
            wake_all: self.is_closed(),
            ..Effects::default()
        }
    }
}

#[derive(Clone, Copy)]
enum Which {
    Ready,
    Leased,
}

impl Times {
    fn list(&mut self, which: Which) -> &mut StampList {
        match which {
            Which::Ready => &mut self.ready,
            Which::Leased => &mut self.leased,
        }
    }

    fn push_back(&mut self, which: Which, slot: u32, at: Instant) {
        let tail = self.list(which).tail;
        self.stamps[slot as usize] = Stamp {
            at,
            prev: tail,
            next: NIL,
        };
        if tail != NIL {
            self.stamps[tail as usize].next = slot;
        }
        let list = self.list(which);
        if list.head == NIL {
            list.head = slot;
        }
        list.tail = slot;
    }

    fn unlink(&mut self, which: Which, slot: u32) {
        let Stamp { prev, next, .. } = self.stamps[slot as usize];
        if prev != NIL {
            self.stamps[prev as usize].next = next;
        } else {
            self.list(which).head = next;
        }
        if next != NIL {
            self.stamps[next as usize].prev = prev;
        } else {
            self.list(which).tail = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn h(k: &str) -> u64 {
        // One seeded hasher for the whole test run, as a queue keeps one.
        static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> =
            std::sync::OnceLock::new();
        HASHER.get_or_init(Default::default).hash_one(k)
    }

    fn add(st: &mut State<String>, k: &str, p: i32) -> Effects {
        st.add(k.to_string(), h(k), p, When::Now, None).unwrap()
    }

    fn pop(st: &mut State<String>) -> Option<(u32, String, i32)> {
        st.pop(None).map(|p| (p.slot, p.key, p.priority))
    }

    #[test]
    fn node_is_48_bytes_for_string_keys() {
        assert_eq!(std::mem::size_of::<Node<String>>(), 48);
    }

    #[test]
    fn fifo_and_dedup() {
        let mut st = State::new(false, None);
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
        let mut st = State::new(false, None);
        let _ = add(&mut st, "a", 0);
        let (slot, _, _) = pop(&mut st).unwrap();
        assert_eq!(add(&mut st, "a", 0).added, 1);
        assert_eq!(add(&mut st, "a", 0).added, 0);
        assert!(pop(&mut st).is_none(), "stingy: not while leased");
        let fx = st.finish(slot, None, None).0;
        assert_eq!(fx.wake, 1);
        let (slot, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        let _ = st.finish(slot, None, None).0;
        assert!(pop(&mut st).is_none());
        assert_eq!(st.index.len(), 0);
    }

    #[test]
    fn priorities_raise_and_never_lower() {
        let mut st = State::new(false, None);
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
    fn freed_slots_are_reused() {
        let mut st = State::new(false, None);
        for round in 0..3 {
            for i in 0..100 {
                let _ = add(&mut st, &format!("k{i}"), 0);
            }
            while let Some((slot, _, _)) = pop(&mut st) {
                let _ = st.finish(slot, None, None).0;
            }
            assert_eq!(st.nodes.len(), 100, "round {round}");
        }
    }

    #[test]
    fn shutdown_refuses_and_closes_after_ready_and_dirty_keys() {
        let mut st = State::new(false, None);
        let _ = add(&mut st, "a", 0);
        let _ = add(&mut st, "b", 0);
        let (slot, _, _) = pop(&mut st).unwrap();
        let _ = add(&mut st, "a", 0); // dirty
        assert!(st.shutdown().wake_all);
        assert!(st.add("c".into(), h("c"), 0, When::Now, None).is_err());
        assert!(!st.is_closed());
        let (b, _, _) = pop(&mut st).unwrap();
        assert!(!st.is_closed(), "a dirty key is still owed");
        let _ = st.finish(slot, None, None).0;
        let (a, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        assert!(st.is_closed());
        assert!(!st.is_drained());
        let _ = st.finish(a, None, None).0;
        let fx = st.finish(b, None, None).0;
        assert!(fx.wake_all && st.is_drained());
    }

    #[test]
    fn deferred_delays_merge_and_cancel() {
        let mut st = State::new(false, None);
        let now = Instant::now();
        let at = |secs| When::At(now + Duration::from_secs(secs));
        let fx = st.add("a".into(), h("a"), 0, at(10), None).unwrap();
        assert_eq!(fx.added, 0, "a delayed key is added when due");
        assert_eq!(st.counts().waiting, 1);
        // The earlier ready time wins; no second record.
        let _ = st.add("a".into(), h("a"), 0, at(5), None).unwrap();
        let _ = st.add("a".into(), h("a"), 0, at(20), None).unwrap();
        assert_eq!(st.deferred.len(), 1);
        assert_eq!(st.deferred[0].deadline, now + Duration::from_secs(5));
        // An immediate add makes it ready and cancels the record.
        assert_eq!(add(&mut st, "a", 0).added, 1);
        assert_eq!(st.deferred[0].slot, NIL);
        assert_eq!(st.counts().waiting, 0);
        let (slot, k, _) = pop(&mut st).unwrap();
        assert_eq!(k, "a");
        // Delayed while leased: waits once the lease ends; shutdown drops it.
        let _ = st.add("a".into(), h("a"), 0, at(5), None).unwrap();
        assert!(matches!(
            st.nodes[slot as usize].place,
            Place::LeasedDeferred { .. }
        ));
        let _ = st.finish(slot, None, None);
        assert!(matches!(
            st.nodes[slot as usize].place,
            Place::Deferred { .. }
        ));
        let _ = st.shutdown();
        assert!(st.deferred.is_empty());
        assert_eq!(st.index.len(), 0);
    }

    #[test]
    fn many_levels_are_pruned_when_idle() {
        let mut st = State::new(false, None);
        for p in 0..100 {
            let _ = add(&mut st, &format!("k{p}"), p);
            let (slot, _, prio) = pop(&mut st).unwrap();
            assert_eq!(prio, p);
            let _ = st.finish(slot, None, None).0;
        }
        assert!(st.levels.len() <= MAX_IDLE_LEVELS);
    }
}
