//! Priority levels, FIFO within each: the default order, and two lanes as
//! the case of two levels.

use super::list::{Linked, Links, List, linked_through_field};
use super::{Handle, MAX_IDLE_LEVELS, Ordering, Queued};
use crate::Lane;

/// A ready key's place in [`Priorities`]: its links in its level's list,
/// or, in a queue of several shards (whose lanes keep the order), the
/// position of its live ticket in its lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PriorityEntry {
    links: Links,
    ticket: u32,
}

linked_through_field!(PriorityEntry);

/// Highest priority first, FIFO within a priority: the default ordering.
///
/// A ready key added again with a higher priority moves to the back of its
/// new level; a lower priority never lowers it (the queue keeps the higher
/// one). Each level is a list linked through the keys' slots, so a push, a
/// pop, a raise and a removal are O(1) apart from finding the level (a
/// short scan: levels are few, and the common single-level queue finds its
/// level at once).
///
/// ```
/// use tokio_workqueue::{AddOpts, Priorities, WorkQueue};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // The same as `WorkQueue::new()`.
/// let queue = WorkQueue::builder().ordering(Priorities::new()).build();
/// queue.add_with("low", AddOpts::default().priority(-1)).unwrap();
/// queue.add("normal").unwrap();
/// assert_eq!(*queue.get().await.unwrap(), "normal");
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Priorities {
    /// Highest priority first.
    levels: Vec<Level>,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    priority: i32,
    keys: List,
}

impl Priorities {
    /// An empty set of levels.
    pub const fn new() -> Self {
        Priorities { levels: Vec::new() }
    }

    /// The index of the level for `priority`, made if needed.
    #[inline(always)]
    fn level_index(&mut self, priority: i32) -> usize {
        // Levels are few; the common single-level queue finds it at once.
        match self.levels.iter().position(|l| l.priority <= priority) {
            Some(i) if self.levels[i].priority == priority => i,
            found => self.new_level(priority, found),
        }
    }

    /// Makes a level for `priority` at `found` (the first lower level), or
    /// at the end.
    #[cold]
    #[inline(never)]
    fn new_level(&mut self, priority: i32, found: Option<usize>) -> usize {
        if self.levels.len() >= MAX_IDLE_LEVELS && self.levels.iter().any(|l| l.keys.len == 0) {
            self.levels.retain(|l| l.keys.len > 0);
            return self.level_index(priority);
        }
        let i = found.unwrap_or(self.levels.len());
        self.levels.insert(
            i,
            Level {
                priority,
                keys: List::default(),
            },
        );
        i
    }

    /// Appends `h` to the back of `level`.
    #[inline(always)]
    fn push_at<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>, h: Handle, level: i32) {
        let li = self.level_index(level);
        self.levels[li].keys.push_back(q, h);
    }

    /// Takes `h` out of `level`.
    #[inline]
    fn unlink_at<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>, h: Handle, level: i32) {
        let li = self
            .levels
            .iter()
            .position(|l| l.priority == level)
            .expect("a queued key without its level");
        self.levels[li].keys.unlink(q, h);
    }

    #[inline]
    fn pop_front<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>) -> Option<Handle> {
        let level = self.levels.iter_mut().find(|l| l.keys.len > 0)?;
        level.keys.pop_front(q)
    }

    #[inline]
    fn peek<K, E: Linked>(&self, q: &Queued<'_, K, E>) -> Option<Handle> {
        let level = self.levels.iter().find(|l| l.keys.len > 0)?;
        level.keys.peek_and_prefetch(q)
    }

    /// Levels kept, empty or not.
    #[cfg(test)]
    pub(crate) fn level_count(&self) -> usize {
        self.levels.len()
    }

    fn count(&self) -> usize {
        self.levels.iter().map(|l| l.keys.len).sum()
    }

    fn counts(&self) -> Vec<(i32, usize)> {
        self.levels
            .iter()
            .filter(|l| l.keys.len > 0)
            .map(|l| (l.priority, l.keys.len))
            .collect()
    }
}

impl<K> Ordering<K> for Priorities {
    type Entry = PriorityEntry;

    #[inline(always)]
    fn push(&mut self, q: &mut Queued<'_, K, PriorityEntry>, key: Handle, priority: i32) {
        self.push_at(q, key, priority);
    }

    #[inline]
    fn pop(&mut self, q: &mut Queued<'_, K, PriorityEntry>) -> Option<Handle> {
        self.pop_front(q)
    }

    #[inline]
    fn touch(&mut self, q: &mut Queued<'_, K, PriorityEntry>, key: Handle, was: i32, now: i32) {
        if now > was {
            self.unlink_at(q, key, was);
            self.push_at(q, key, now);
        }
    }

    #[inline]
    fn remove(&mut self, q: &mut Queued<'_, K, PriorityEntry>, key: Handle) {
        let level = q.priority(key);
        self.unlink_at(q, key, level);
    }

    fn len(&self) -> usize {
        self.count()
    }

    fn ready_by_priority(&self) -> Option<Vec<(i32, usize)>> {
        Some(self.counts())
    }

    #[inline]
    fn prefetch_next(&self, q: &Queued<'_, K, PriorityEntry>) -> Option<Handle> {
        self.peek(q)
    }

    /// Priorities hands out the order a queue of several shards keeps in
    /// its lanes.
    fn split(&self) -> Option<Self> {
        Some(Priorities::new())
    }

    fn ticket(entry: &PriorityEntry) -> u32 {
        entry.ticket
    }

    fn ticket_mut(entry: &mut PriorityEntry) -> Option<&mut u32> {
        Some(&mut entry.ticket)
    }
}

/// Two lanes: keys of priority 0 and up (the [fast lane](Lane::Fast)) before
/// keys below 0 (the [slow lane](Lane::Slow)), FIFO within each lane.
///
/// [`Priorities`] with two levels: within a lane, priorities do not reorder
/// keys, and a key moves only when an add raises it from the slow lane to
/// the fast one (to the back of the fast lane). The knative and "two lane
/// queue" pattern: fresh changes in the fast lane, resyncs and the initial
/// list in the slow one. [`WorkItem::priority`](crate::WorkItem::priority)
/// still tells the priority a key was added with.
///
/// ```
/// use tokio_workqueue::{AddOpts, Lane, WorkQueue};
/// use tokio_workqueue::ordering::TwoLanes;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = WorkQueue::builder().ordering(TwoLanes::new()).build();
/// queue.add_to_lane("resync", Lane::Slow).unwrap();
/// queue.add("change").unwrap();
/// queue.add_with("urgent", AddOpts::default().priority(10)).unwrap();
/// // Same lane: FIFO, whatever the priorities.
/// assert_eq!(*queue.get().await.unwrap(), "change");
/// assert_eq!(*queue.get().await.unwrap(), "urgent");
/// assert_eq!(*queue.get().await.unwrap(), "resync");
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct TwoLanes {
    lanes: Priorities,
}

impl TwoLanes {
    /// Two empty lanes.
    pub const fn new() -> Self {
        TwoLanes {
            lanes: Priorities::new(),
        }
    }
}

/// The level a priority's lane is kept at.
#[inline]
fn lane(priority: i32) -> i32 {
    Lane::from_priority(priority).priority()
}

impl<K> Ordering<K> for TwoLanes {
    type Entry = Links;

    #[inline]
    fn push(&mut self, q: &mut Queued<'_, K, Links>, key: Handle, priority: i32) {
        self.lanes.push_at(q, key, lane(priority));
    }

    #[inline]
    fn pop(&mut self, q: &mut Queued<'_, K, Links>) -> Option<Handle> {
        self.lanes.pop_front(q)
    }

    #[inline]
    fn touch(&mut self, q: &mut Queued<'_, K, Links>, key: Handle, was: i32, now: i32) {
        let (from, to) = (lane(was), lane(now));
        if to > from {
            self.lanes.unlink_at(q, key, from);
            self.lanes.push_at(q, key, to);
        }
    }

    #[inline]
    fn remove(&mut self, q: &mut Queued<'_, K, Links>, key: Handle) {
        let level = lane(q.priority(key));
        self.lanes.unlink_at(q, key, level);
    }

    fn len(&self) -> usize {
        self.lanes.count()
    }

    #[inline]
    fn prefetch_next(&self, q: &Queued<'_, K, Links>) -> Option<Handle> {
        self.lanes.peek(q)
    }
}
