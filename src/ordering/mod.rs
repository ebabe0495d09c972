//! What comes out next: the order in which a queue hands out its ready keys.
//!
//! A queue keeps everything that makes it a work queue: one entry per key
//! (de-duplication), one lease per key, delays, the rate limiter, shutdown
//! and drain, the metrics and the starvation bound. What it hands out next,
//! among the keys that are ready, is decided by its [`Ordering`], chosen
//! with [`Builder::ordering`](crate::Builder::ordering). The queue tells the
//! ordering four things, the four operations of the "two lane queue" idea,
//! and one more for the starvation bound:
//!
//! | call | when |
//! | --- | --- |
//! | [`push`](Ordering::push) | a key became ready (a new add, a delay ran out, a key added during its lease came back when the lease ended) |
//! | [`pop`](Ordering::pop) | a consumer takes a key: the ordering says which |
//! | [`touch`](Ordering::touch) | a ready key was added again (maybe with a higher priority): the ordering may move it |
//! | [`remove`](Ordering::remove) | the queue takes a ready key out itself: the starvation bound hands out the oldest key first |
//! | [`len`](Ordering::len) | how many keys the ordering holds |
//!
//! The ordering sees keys through [`Handle`]s and the [`Queued`] view: each
//! ready key's value, priority and a small [`Entry`](Ordering::Entry) the
//! queue keeps for the ordering inside the key's own slot, so an ordering
//! can link its keys into lists without a table of its own. It sees no
//! leased or waiting key and cannot change a key's state: a faulty ordering
//! can hand keys out in a strange order, but never lease a key twice or
//! hand out one that is not ready. (If `pop` answers `None` while keys are
//! ready, or a handle that is not ready, the queue panics with a message
//! saying so rather than lose the keys silently.)
//!
//! # Built-in orderings
//!
//! | ordering | order |
//! | --- | --- |
//! | [`Priorities`] (the default) | highest priority first, FIFO within a priority; a raise moves a key to the back of its new level |
//! | [`TwoLanes`] | [`Priorities`] with two levels: the fast lane (priority 0 and up) before the slow lane (below 0) |
//! | [`Fifo`] | the order keys became ready in, whatever their priority |
//! | [`FairShare`] | within a priority, round-robin across tenants (say, namespaces), FIFO within a tenant; optional weights and sub-groups |
//!
//! The default costs nothing: a queue's type carries its ordering
//! (`WorkQueue<K, O = Priorities>`, like a `HashMap`'s hasher), so every
//! call into it is a direct, inlinable one, and the built-ins keep their
//! links inside the slot every key has anyway.
//!
//! # Writing an ordering
//!
//! An ordering that hands out the most recently readied key first (LIFO),
//! ignoring priorities. It keeps its keys in a `Vec`; since a key may be
//! taken out of the middle by the starvation bound, it also remembers where
//! each key is, in the [`Entry`](Ordering::Entry) the queue keeps for it.
//!
//! ```
//! use tokio_workqueue::WorkQueue;
//! use tokio_workqueue::ordering::{Handle, Ordering, Queued};
//!
//! #[derive(Debug, Default)]
//! struct Lifo {
//!     stack: Vec<Handle>,
//! }
//!
//! impl<K> Ordering<K> for Lifo {
//!     /// Where the key is in `stack`.
//!     type Entry = usize;
//!
//!     fn push(&mut self, queued: &mut Queued<'_, K, usize>, key: Handle, _priority: i32) {
//!         *queued.entry_mut(key) = self.stack.len();
//!         self.stack.push(key);
//!     }
//!
//!     fn pop(&mut self, _queued: &mut Queued<'_, K, usize>) -> Option<Handle> {
//!         self.stack.pop()
//!     }
//!
//!     fn touch(&mut self, _: &mut Queued<'_, K, usize>, _: Handle, _was: i32, _now: i32) {
//!         // A key added again keeps its place.
//!     }
//!
//!     fn remove(&mut self, queued: &mut Queued<'_, K, usize>, key: Handle) {
//!         let at = *queued.entry(key);
//!         self.stack.swap_remove(at);
//!         if let Some(&moved) = self.stack.get(at) {
//!             *queued.entry_mut(moved) = at;
//!         }
//!     }
//!
//!     fn len(&self) -> usize {
//!         self.stack.len()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue = WorkQueue::builder().ordering(Lifo::default()).build();
//! for key in ["a", "b", "c", "b"] {
//!     queue.add(key).unwrap(); // "b" again: de-duplicated by the queue
//! }
//! let first = queue.get().await.unwrap();
//! assert_eq!(*first, "c");
//! queue.add("c").unwrap(); // leased: comes back once its lease ends
//! assert_eq!(*queue.get().await.unwrap(), "b");
//! drop(first);
//! assert_eq!(*queue.get().await.unwrap(), "c");
//! assert_eq!(*queue.get().await.unwrap(), "a");
//! # }
//! ```

mod fair_share;
mod fifo;
mod list;
mod priorities;

use std::fmt;

pub use fair_share::{FairShare, FairShareEntry};
pub use fifo::Fifo;
pub use list::Links;
pub use priorities::{Priorities, PriorityEntry, TwoLanes};

use crate::nodes::Nodes;
use crate::slot::{Node, Place};

/// Priority levels are kept when they empty, so a steady mix of priorities
/// does not allocate; past this many, empty ones are pruned.
pub(crate) const MAX_IDLE_LEVELS: usize = 16;

/// Decides which ready key a queue hands out next.
///
/// The queue calls these methods under its lock, with the keys the ordering
/// holds (the ready ones) in `queued`. They should be quick and must not
/// panic: a panic in an ordering leaves the queue's ready keys in an
/// unspecified (but memory-safe) state. See the [module docs](self) for an
/// example.
///
/// The contract, which the queue keeps on its side:
/// - `push` is called once for each key that becomes ready, `pop` or
///   `remove` once for each key that stops being ready (with a handle the
///   ordering was pushed), and `touch` for a ready key added again. `len`
///   counts the keys pushed and not yet popped or removed.
/// - `pop` is called only when the ordering holds keys, and must then
///   return one of them (and forget it).
/// - A handle is only meaningful while its key is ready: once popped or
///   removed, the same handle may come back for another key.
pub trait Ordering<K>: Send + 'static {
    /// What the ordering keeps with each ready key, stored inside the key's
    /// slot in the queue (for example list links). The queue sets it to
    /// `Default::default()` before [`push`](Self::push).
    ///
    /// Up to 12 bytes with an alignment of up to 4 fit in the room a slot
    /// already has; a larger entry makes every slot larger.
    type Entry: Copy + Default + Send + 'static;

    /// `key` became ready with `priority`.
    fn push(&mut self, queued: &mut Queued<'_, K, Self::Entry>, key: Handle, priority: i32);

    /// The key to hand out next, no longer held by the ordering. Only called
    /// when [`len`](Self::len) is not zero.
    fn pop(&mut self, queued: &mut Queued<'_, K, Self::Entry>) -> Option<Handle>;

    /// A ready key was added again. Its priority was `was` and is now `now`
    /// (the higher of the two: a re-add never lowers a key). The ordering
    /// may move the key, for example to the back of its new level.
    fn touch(&mut self, queued: &mut Queued<'_, K, Self::Entry>, key: Handle, was: i32, now: i32);

    /// The queue takes `key` out of turn (the starvation bound hands out the
    /// oldest ready key first): forget it.
    fn remove(&mut self, queued: &mut Queued<'_, K, Self::Entry>, key: Handle);

    /// How many keys the ordering holds.
    fn len(&self) -> usize;

    /// Whether the ordering holds no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Optional, for the depth gauge only: the keys held per priority,
    /// highest priority first, priorities without keys left out, if the
    /// ordering counts them anyway (the built-in levelled ones do). `None`,
    /// the default, makes the queue count by walking its ready keys when
    /// the gauge is read.
    fn ready_by_priority(&self) -> Option<Vec<(i32, usize)>> {
        None
    }

    /// Optional, for speed only: the key the next [`pop`](Self::pop) will
    /// return, if known without work. On a large queue the queue then starts
    /// fetching that key's memory one hand-out early; the ordering may also
    /// [`prefetch`](Queued::prefetch) what its next pop will read. The
    /// answer never changes what is handed out.
    fn prefetch_next(&self, queued: &Queued<'_, K, Self::Entry>) -> Option<Handle> {
        let _ = queued;
        None
    }

    /// An empty ordering like this one, for another shard of the queue
    /// (see [`Builder::shards`](crate::Builder::shards)), or `None` (the
    /// default) if this ordering cannot be split: the queue then has one
    /// shard.
    ///
    /// A queue of several shards keeps the order of their ready keys
    /// itself, in one first-in, first-out lane per priority, and then calls
    /// none of the ordering's other methods: an ordering may answer `Some`
    /// only if it hands out exactly that order, highest priority first,
    /// FIFO within a priority, a key raised going to the back of its new
    /// level. [`Priorities`] does; [`TwoLanes`] (whose levels are lanes,
    /// not priorities), [`Fifo`] and [`FairShare`] do not.
    fn split(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// In a queue of several shards, the position of a ready key's ticket
    /// in its lane (its low 32 bits), kept in its entry by an ordering that
    /// [splits](Self::split) (see [`ticket_mut`](Self::ticket_mut)).
    #[doc(hidden)]
    fn ticket(entry: &Self::Entry) -> u32
    where
        Self: Sized,
    {
        let _ = entry;
        0
    }

    /// Where an ordering that [splits](Self::split) keeps the position of
    /// a ready key's ticket, in its entry (the queue sets it as the key
    /// becomes ready or is raised, and reads it to tell the key's live
    /// ticket from stale ones); `None` for one that does not split.
    #[doc(hidden)]
    fn ticket_mut(entry: &mut Self::Entry) -> Option<&mut u32>
    where
        Self: Sized,
    {
        let _ = entry;
        None
    }
}

/// A ready key, as an [`Ordering`] knows it.
///
/// Only the queue makes handles. A handle stays valid while its key is
/// ready; after a pop or a removal the same handle may later name another
/// key. [`index`](Self::index) is small and dense (the key's slot), so an
/// ordering may also keep a table of its own indexed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(u32);

impl Handle {
    #[inline]
    pub(crate) fn new(slot: u32) -> Self {
        Handle(slot)
    }

    #[inline]
    pub(crate) fn slot(self) -> u32 {
        self.0
    }

    /// The key's slot number: below the number of keys the queue has held at
    /// once.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The ready keys, as an [`Ordering`] sees them: each one's key, priority
/// and [`Entry`](Ordering::Entry).
///
/// Every method panics if given the handle of a key that is not ready.
pub struct Queued<'a, K, E> {
    nodes: &'a mut Nodes<K, Node<E>>,
}

impl<'a, K, E> Queued<'a, K, E> {
    #[inline]
    pub(crate) fn new(nodes: &'a mut Nodes<K, Node<E>>) -> Self {
        Queued { nodes }
    }

    #[inline]
    fn node(&self, h: Handle) -> &Node<E> {
        let node = &self.nodes[h.index()];
        if !matches!(node.place, Place::Ready(_)) {
            not_ready(h)
        }
        node
    }

    /// The key.
    #[inline]
    pub fn key(&self, h: Handle) -> &K {
        self.nodes
            .slot(h.index())
            .filter(|s| matches!(s.node().place, Place::Ready(_)))
            .and_then(|s| s.key())
            .unwrap_or_else(|| not_ready(h))
    }

    /// The key's priority: the highest it was added with since it last
    /// became ready.
    #[inline]
    pub fn priority(&self, h: Handle) -> i32 {
        self.node(h).priority
    }

    /// The ordering's entry for the key.
    #[inline]
    pub fn entry(&self, h: Handle) -> &E {
        match &self.nodes[h.index()].place {
            Place::Ready(e) => e,
            _ => not_ready(h),
        }
    }

    /// The ordering's entry for the key, to change.
    #[inline]
    pub fn entry_mut(&mut self, h: Handle) -> &mut E {
        match &mut self.nodes[h.index()].place {
            Place::Ready(e) => e,
            _ => not_ready(h),
        }
    }

    /// Hints that the key's slot will be read soon (a cache prefetch; it
    /// never fails and changes nothing).
    #[inline]
    pub fn prefetch(&self, h: Handle) {
        self.nodes.prefetch(h.index());
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn not_ready(h: Handle) -> ! {
    panic!("ordering: {h:?} does not name a ready key")
}

impl<K, E> fmt::Debug for Queued<'_, K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("slots", &self.nodes.len())
            .finish_non_exhaustive()
    }
}
