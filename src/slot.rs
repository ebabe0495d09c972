//! What a queue keeps in each slot beside its key: the key's place in
//! its life (free, ready, waiting on a delay, leased, leased and added
//! again...), the bits of its hash the index is rebuilt from, and its
//! priority.
//!
//! The shard's state ([`crate::state`]) moves keys between places; an
//! [`Ordering`](crate::Ordering) reads and writes the entry a ready key
//! keeps in its place. Both stand on this module, which depends on
//! neither.

/// "No slot": the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// Where a slot's key is in its life: the states of [`crate::state`]'s
/// diagram, and a free slot's link to the next free one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<E> {
    Free {
        next_free: u32,
    },
    /// Ready, with the ordering's entry (which, in a queue of several
    /// shards, holds the number the key drew: see [`crate::shard`]).
    Ready(E),
    /// Waiting on the wheel entry with this order number and deadline (the
    /// fields of a [`TimerEntry`](crate::state::TimerEntry), inline so that
    /// the node stays 48 bytes).
    Waiting {
        seq: u32,
        at: u64,
    },
    Leased,
    LeasedDirty,
    LeasedWaiting {
        seq: u32,
        at: u64,
    },
}

/// A key's state; the key itself sits beside it ([`Nodes::key`](crate::nodes::Nodes::key)).
#[derive(Debug)]
pub(crate) struct Node<E> {
    pub(crate) place: Place<E>,
    /// Low 32 bits of the key's hash: enough to rebuild the index without
    /// reading keys, and to skip most key comparisons on lookup.
    pub(crate) hash: u32,
    /// Ready: its priority, as the ordering was told. Waiting or dirty: the
    /// priority it will become ready with.
    pub(crate) priority: i32,
}
