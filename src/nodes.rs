//! A shard's nodes, at addresses that never move.
//!
//! A lease hands its consumer a reference to its key where the shard keeps
//! it, rather than a copy: copying a `String` key is an allocation on every
//! hand-out and a free on every lease end, about a tenth of a hand-out's
//! cost (W1's shape with `&'static str` keys, which hash and compare as
//! `String`s do, ran 10-15 % faster). A `Vec` moves its elements when it
//! grows, so the nodes live in chunks instead: chunk `c` holds
//! `FIRST << c` nodes and is never reallocated, and a new chunk is added
//! when the last is full. Chunks double until one would pass 32 KiB, and
//! stay at that size from then on: a doubling `Vec` leaves up to half its
//! room unused, which on a shard of a controller's queue after an initial
//! list (8 shards, 120-byte nodes for an `ObjectRef` key) was 40 % of the
//! queue's memory at its peak; capped chunks leave at most one chunk
//! unused. Node `i` is found with one leading-zero count, or one shift
//! past the doubling chunks.
//!
//! The lock holder changes nodes while leases on other threads read their
//! keys, so each key sits beside its node in a cell of its own, and no
//! `&mut` ever covers a key: a node is lent out as `&mut` on its own
//! (through a raw pointer to its slot, never a `&mut` to the slot), and a
//! key is written only when no lease on it is alive.

use std::cell::UnsafeCell;
use std::ops::{Index, IndexMut};
use std::ptr::NonNull;

/// Nodes in the first chunk (a power of two).
const FIRST_BITS: u32 = 4;
const FIRST: usize = 1 << FIRST_BITS;
/// The most room a chunk takes, past the first.
const CHUNK_BYTES: usize = 32 << 10;

/// Nodes in chunks that never move, each with its key beside it.
///
/// A node is reached as `&T` or `&mut T`, and its key only through
/// [`key`](Self::key) and [`replace_key`](Self::replace_key): no `&mut`
/// ever covers a key, since a lease on another thread may be reading it
/// through a [`KeyRef`] while the lock holder changes the node.
pub(crate) struct Nodes<K, T> {
    chunks: Vec<Vec<Slot<K, T>>>,
    len: usize,
    /// Chunks given out by [`new_chunk`](Self::new_chunk) so far.
    reported: usize,
}

// SAFETY: a key is written only through `replace_key`, which takes
// `&mut self`; through `&Nodes` keys and nodes are only read, so sharing
// one between threads is sharing `&K` and `&T`. (The cell would otherwise
// take `Sync` from `Nodes`, and from the orderings' `Queued` view.)
unsafe impl<K: Sync, T: Sync> Sync for Nodes<K, T> {}

/// A key and its node, side by side: a lookup that reads the node finds
/// the key next to it.
struct Slot<K, T> {
    /// Written only by [`Nodes::replace_key`], with no lease on the key.
    key: UnsafeCell<Option<K>>,
    node: T,
}

impl<K, T> Default for Nodes<K, T> {
    fn default() -> Self {
        Nodes {
            chunks: Vec::new(),
            len: 0,
            reported: 0,
        }
    }
}

/// The chunk and the place in it of node `i`, when chunks double up to
/// `2^last_bits` nodes and hold that many from then on.
#[inline]
fn locate(i: usize, last_bits: u32) -> (usize, usize) {
    // The doubling chunks are 0..=d; chunk c starts at FIRST * (2^c - 1).
    let d = (last_bits - FIRST_BITS) as usize;
    let doubled = FIRST * ((2 << d) - 1);
    if i < doubled {
        // With j = i + FIRST, the chunk is j's highest bit less
        // FIRST_BITS, and the place is j less that bit.
        let j = i + FIRST;
        let high = usize::BITS - 1 - j.leading_zeros();
        ((high - FIRST_BITS) as usize, j - (1 << high))
    } else {
        let j = i - doubled;
        (d + 1 + (j >> last_bits), j & ((1 << last_bits) - 1))
    }
}

/// `log2` of the nodes a chunk holds once chunks stop doubling: the most
/// that fit in [`CHUNK_BYTES`], rounded down to a power of two, and never
/// fewer than the first chunk's.
const fn last_bits(slot_size: usize) -> u32 {
    let fit = CHUNK_BYTES / if slot_size == 0 { 1 } else { slot_size };
    let bits = if fit == 0 { 0 } else { fit.ilog2() };
    if bits < FIRST_BITS { FIRST_BITS } else { bits }
}

impl<K, T> Nodes<K, T> {
    const LAST_BITS: u32 = last_bits(std::mem::size_of::<Slot<K, T>>());

    #[inline]
    fn locate(i: usize) -> (usize, usize) {
        locate(i, Self::LAST_BITS)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Room for nodes without a new chunk.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }

    /// Adds a node and its key at the end; no node already there moves.
    pub(crate) fn push(&mut self, key: K, node: T) {
        let (c, _) = Self::locate(self.len);
        if c == self.chunks.len() {
            let doubled = (Self::LAST_BITS - FIRST_BITS) as usize;
            self.chunks
                .push(Vec::with_capacity(FIRST << c.min(doubled)));
        }
        let chunk = &mut self.chunks[c];
        debug_assert!(chunk.len() < chunk.capacity(), "a chunk never grows");
        // `Vec::push` writes the new slot through the buffer's pointer: it
        // makes no reference to the slots already there.
        chunk.push(Slot {
            key: UnsafeCell::new(Some(key)),
            node,
        });
        self.len += 1;
    }

    /// Node `i` and its key, found once: the key is read only if asked
    /// for (a lookup that compares hashes first mostly never reads it).
    #[inline]
    pub(crate) fn slot(&self, i: usize) -> Option<SlotRef<'_, K, T>> {
        if i >= self.len {
            return None;
        }
        let (c, at) = Self::locate(i);
        Some(SlotRef(&self.chunks[c][at]))
    }

    /// Hints that slot `i` (its node and its key) is needed soon: both
    /// cache lines it may lie across.
    ///
    /// A slot is rarely a divisor of the line: with `String` keys it is 48
    /// bytes, and every other slot spans two lines. Fetching only the
    /// line of the node's start left the rest to a miss under the lock
    /// (the next key's hash, read to fetch its index group, held a sixth
    /// of a hand-out's samples in a one-thread drain of a million keys) or at
    /// the lease end (the key). Both lines: W1 1.039x (ahead in 6 of 7
    /// paired rounds), W4 1.030x, a one-thread drain 1.061x (6 of 6), on
    /// an AMD EPYC VM.
    #[inline]
    pub(crate) fn prefetch(&self, i: usize) {
        if let Some(at) = self.address(i) {
            Self::prefetch_at(at);
        }
    }

    /// Where slot `i` is, as a number: a hint for a thread that does not
    /// hold the shard's lock to [`prefetch_at`](Self::prefetch_at), which
    /// is all it may do with it. Slots never move, so it stays right for
    /// as long as these nodes live (a shard that gives its room back makes
    /// new ones), and a prefetch of a stale one is harmless all the same.
    #[inline]
    pub(crate) fn address(&self, i: usize) -> Option<usize> {
        self.slot(i).map(|s| std::ptr::from_ref(s.0).addr())
    }

    /// Which chunk slot `i` lies in, and how many bytes into it: with the
    /// chunk's address (see [`new_chunk`](Self::new_chunk)), where the
    /// slot is, found without `self`.
    #[inline]
    pub(crate) fn place(i: usize) -> (usize, usize) {
        let (c, at) = Self::locate(i);
        (c, at * size_of::<Slot<K, T>>())
    }

    /// The newest chunk: its number and its address.
    #[cfg(test)]
    pub(crate) fn last_chunk(&self) -> Option<(usize, usize)> {
        let last = self.chunks.last()?;
        Some((self.chunks.len() - 1, last.as_ptr().addr()))
    }

    /// The first chunk not given out before, with its address: a chunk
    /// made since the last call, oldest first. So a caller that asks after
    /// every push learns of each chunk once, and one that missed a call
    /// catches up one chunk a call; a new `Nodes` starts from its chunk 0.
    #[inline]
    pub(crate) fn new_chunk(&mut self) -> Option<(usize, usize)> {
        let chunk = self.chunks.get(self.reported)?;
        self.reported += 1;
        Some((self.reported - 1, chunk.as_ptr().addr()))
    }

    /// Hints that the slot at `at` (an [`address`](Self::address)) is
    /// needed soon: both cache lines it may lie across. Any number is
    /// fine: a prefetch never faults, and nothing is read through it.
    #[inline]
    pub(crate) fn prefetch_at(at: usize) {
        crate::prefetch::prefetch(at);
        crate::prefetch::prefetch(at.wrapping_add(size_of::<Slot<K, T>>() - 1));
    }

    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slot(i).map(|s| s.node())
    }

    /// Slot `i`, without a reference to it or to any other slot.
    #[inline]
    fn slot_ptr(&mut self, i: usize) -> Option<*mut Slot<K, T>> {
        if i >= self.len {
            return None;
        }
        let (c, at) = Self::locate(i);
        // `as_mut_ptr` makes no reference to the slots.
        Some(self.chunks[c].as_mut_ptr().wrapping_add(at))
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let slot = self.slot_ptr(i)?;
        // SAFETY: the slot is initialised (`i < len`, and slots are pushed
        // in order); the `&mut` covers the node only, not the key beside
        // it, which a lease may be reading, and `&mut self` makes it the
        // only reference to the node.
        Some(unsafe { &mut *std::ptr::addr_of_mut!((*slot).node) })
    }

    /// Node `i` to change, and its key, found once.
    #[inline]
    pub(crate) fn get_mut_with_key(&mut self, i: usize) -> Option<(&mut T, Option<&K>)> {
        let slot = self.slot_ptr(i)?;
        // SAFETY: the node as in `get_mut`; the key as `SlotRef::key`
        // reads it, beside the node and never under its `&mut`.
        unsafe {
            let node = &mut *std::ptr::addr_of_mut!((*slot).node);
            Some((node, (*(*slot).key.get()).as_ref()))
        }
    }

    /// The key of node `i`, if it holds one.
    #[inline]
    pub(crate) fn key(&self, i: usize) -> Option<&K> {
        self.slot(i)?.key()
    }

    /// Puts `key` in node `i` and returns what was there.
    ///
    /// # Safety
    ///
    /// No lease on node `i`'s key is alive: no [`KeyRef`] to it is read
    /// from now on.
    // Inlined, so that the caller's `key` is written straight into the
    // cell. As a call, the key came through the caller's stack, and a lease
    // end's `None` (one 8-byte store of `String`'s niche) was read back here
    // by a 16-byte load, which no store can forward: it waited for every
    // store before it to reach the cache (5 % of a W1 profile with metrics).
    #[inline]
    pub(crate) unsafe fn replace_key(&mut self, i: usize, key: Option<K>) -> Option<K> {
        let SlotRef(slot) = self.slot(i).expect("a node in range");
        // SAFETY: `&mut self` excludes every reference made by `key`, and
        // the caller excludes every lease's; the write goes through the
        // cell.
        unsafe { std::mem::replace(&mut *slot.key.get(), key) }
    }

    /// The nodes in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten().map(|s| &s.node)
    }
}

/// A node and its key, as [`Nodes::slot`] found them.
pub(crate) struct SlotRef<'a, K, T>(&'a Slot<K, T>);

impl<'a, K, T> SlotRef<'a, K, T> {
    #[inline]
    pub(crate) fn node(&self) -> &'a T {
        &self.0.node
    }

    /// The key, if the node holds one.
    #[inline]
    pub(crate) fn key(&self) -> Option<&'a K> {
        // SAFETY: the key is written only by `replace_key`, which needs
        // `&mut Nodes` (so no reference made here is alive) and no lease on
        // this key (so no `KeyRef` to it is read).
        unsafe { (*self.0.key.get()).as_ref() }
    }
}

impl<K, T> Index<usize> for Nodes<K, T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(n) => n,
            None => out_of_range(i, self.len),
        }
    }
}

impl<K, T> IndexMut<usize> for Nodes<K, T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        let len = self.len;
        match self.get_mut(i) {
            Some(n) => n,
            None => out_of_range(i, len),
        }
    }
}

#[cold]
#[inline(never)]
fn out_of_range(i: usize, len: usize) -> ! {
    panic!("node {i} of {len}")
}

/// A leased key where its shard keeps it: a shared reference in all but
/// its lifetime, which is the lease's.
///
/// The key stays in its node, unchanged, from the hand-out until the lease
/// ends: only the lease's end frees a leased node (`State::finish`), an add
/// of a leased key keeps the key there and drops its own, a shutdown frees
/// only keys that are not leased, and a shard gives its room back only
/// when it holds no key. The node does not move ([`Nodes`]), and the shard
/// outlives the lease, which holds the queue.
pub(crate) struct KeyRef<K>(NonNull<K>);

// SAFETY: a `KeyRef` is used as a `&K` is, so it may go to and be shared
// with another thread when a `&K` may: when `K` is `Sync`.
unsafe impl<K: Sync> Send for KeyRef<K> {}
// SAFETY: as above.
unsafe impl<K: Sync> Sync for KeyRef<K> {}

impl<K> std::fmt::Debug for KeyRef<K> {
    /// The address only: reading the key needs the lease's word for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeyRef").field(&self.0).finish()
    }
}

impl<K> KeyRef<K> {
    /// A reference to `key`, in a node of a shard, as it is leased.
    pub(crate) fn new(key: &K) -> Self {
        KeyRef(NonNull::from(key))
    }

    /// The key.
    ///
    /// # Safety
    ///
    /// The lease this reference was made for has not ended.
    pub(crate) unsafe fn get(&self) -> &K {
        // SAFETY: the caller's lease keeps the key in place (see the type).
        unsafe { self.0.as_ref() }
    }
}

/// The room a node and its key take in a chunk.
#[cfg(test)]
pub(crate) const fn slot_size<K, T>() -> usize {
    std::mem::size_of::<Slot<K, T>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_keep_their_addresses_as_the_chunks_grow() {
        let mut nodes = Nodes::default();
        let mut addrs: Vec<(*const usize, *const String)> = Vec::new();
        for i in 0..10_000 {
            nodes.push(i.to_string(), i);
            addrs.push((&nodes[i], nodes.key(i).unwrap()));
        }
        for (i, &(node, key)) in addrs.iter().enumerate() {
            assert_eq!(node, &nodes[i] as *const usize, "node {i} moved");
            assert_eq!(key, nodes.key(i).unwrap() as *const String, "key {i} moved");
            assert_eq!(nodes[i], i);
            assert_eq!(nodes.key(i).unwrap(), &i.to_string());
        }
        nodes[7] += 1;
        assert_eq!(nodes[7], 8);
        // SAFETY: no lease exists in this test.
        assert_eq!(unsafe { nodes.replace_key(7, None) }, Some("7".to_string()));
        assert_eq!(nodes.key(7), None);
        assert_eq!(nodes.len(), 10_000);
        let mut expected: Vec<usize> = (0..10_000).collect();
        expected[7] = 8;
        assert_eq!(nodes.iter().copied().collect::<Vec<_>>(), expected);
        assert!(nodes.get(10_000).is_none());
        assert!(nodes.key(10_000).is_none());
        // Chunks double up to 32 KiB (1,024 slots of 32 bytes) and stay
        // there: the room left is less than one such chunk.
        assert_eq!(Nodes::<String, usize>::LAST_BITS, 10);
        assert!(nodes.capacity() < 10_000 + 1024, "{}", nodes.capacity());
    }

    #[test]
    fn an_address_is_where_its_slot_is_and_stays() {
        let mut nodes = Nodes::default();
        let mut at = Vec::new();
        for i in 0..3000usize {
            nodes.push(i.to_string(), i);
            at.push(nodes.address(i).unwrap());
            // The newest chunk's address and the slot's place in it find
            // it too, in the doubling chunks and the full-sized ones.
            let (last, base) = nodes.last_chunk().unwrap();
            let (c, offset) = Nodes::<String, usize>::place(i);
            assert_eq!((c, base + offset), (last, at[i]), "slot {i}");
            // A slot that begins a chunk is the one push that made it.
            let new = nodes.new_chunk();
            assert_eq!(new, (offset == 0).then_some((last, base)), "slot {i}");
        }
        for (i, &a) in at.iter().enumerate() {
            let slot = std::ptr::from_ref(nodes.slot(i).unwrap().0).addr();
            assert_eq!(a, slot, "slot {i}");
            // The node and the key lie within the slot the address starts.
            let node = std::ptr::from_ref(&nodes[i]).addr();
            let key = std::ptr::from_ref(nodes.key(i).unwrap()).addr();
            let size = size_of::<Slot<String, usize>>();
            assert!((a..a + size).contains(&node) && (a..a + size).contains(&key));
        }
        assert_eq!(nodes.address(3000), None);
        // Any number may be prefetched, a slot's or not.
        Nodes::<String, usize>::prefetch_at(at[5]);
        Nodes::<String, usize>::prefetch_at(0);
        Nodes::<String, usize>::prefetch_at(usize::MAX);
    }

    #[test]
    fn locate_walks_the_chunks_in_order() {
        for last in [FIRST_BITS, FIRST_BITS + 2, 9] {
            let mut expected = Vec::new();
            for c in 0..12 {
                let size = FIRST << c.min((last - FIRST_BITS) as usize);
                expected.extend((0..size).map(|at| (c, at)));
            }
            let got: Vec<_> = (0..expected.len()).map(|i| locate(i, last)).collect();
            assert_eq!(got, expected, "chunks up to 2^{last}");
        }
    }

    #[test]
    fn a_chunk_takes_at_most_32_kib_past_the_first() {
        assert_eq!(last_bits(48), 9);
        assert_eq!(last_bits(120), 8);
        assert_eq!(last_bits(0), 15);
        // Slots too large for 16 in 32 KiB keep the first chunk's size.
        assert_eq!(last_bits(4096), FIRST_BITS);
        assert_eq!(last_bits(1 << 20), FIRST_BITS);
    }
}
