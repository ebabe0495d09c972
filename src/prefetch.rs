//! Prefetch hints for the key index and the nodes, so their cache misses
//! overlap with work done outside the queue's lock instead of lengthening
//! the time it is held.
//!
//! On a queue of a million keys the index (`hashbrown::HashTable<u32>`) is
//! several megabytes, and each lookup or removal misses the cache twice:
//! once for the control bytes of the probed group, once for the slot numbers
//! beside them. Both are taken under the lock, so every other producer and
//! consumer waits for them. The queue therefore remembers where the table's
//! control bytes are ([`IndexLayout`], refreshed after every insert, the
//! only operation that can move the table) and asks the CPU to fetch a key's
//! group early: when a key is handed out, for the removal at its lease end,
//! and before an add takes the lock, for the add's own lookup. Likewise
//! each shard publishes where its node chunks are, which never move, so
//! that a consumer of a split queue can fetch the node of a key a few
//! tickets behind its own before the hand-out that reads it (see
//! [`FrontGuard::pop`](crate::lane::FrontGuard::pop)).
//!
//! The address is computed from hashbrown's memory layout (slots stored
//! downwards from the control bytes), which hashbrown does not promise to
//! keep. That is acceptable only because a prefetch is a hint: a wrong or
//! stale address (the table moved, or was freed) costs a wasted fetch and
//! never a fault or a wrong answer; nothing is ever read through it.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::segmented::Segmented;

/// Where the index's control bytes start, and its bucket mask.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IndexLayout {
    ctrl: usize,
    mask: usize,
}

impl IndexLayout {
    /// The layout of a table in which the slot number at `slot_addr` sits in
    /// bucket `bucket`, of `buckets` buckets.
    pub(crate) fn new(slot_addr: usize, bucket: usize, buckets: usize) -> Self {
        IndexLayout {
            ctrl: slot_addr.wrapping_add((bucket + 1) * size_of::<u32>()),
            mask: buckets.wrapping_sub(1),
        }
    }

    /// Whether no table is known yet.
    pub(crate) fn is_unset(&self) -> bool {
        self.ctrl == 0
    }

    /// Hints that the index group probed first for `hash` is needed soon.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if self.is_unset() {
            return;
        }
        let pos = (hash as usize) & self.mask;
        prefetch(self.ctrl.wrapping_add(pos));
        prefetch(self.ctrl.wrapping_sub((pos + 1) * size_of::<u32>()));
    }
}

/// Hints that the cache line holding `addr` is needed soon. Any address is
/// fine: a prefetch never faults.
#[inline(always)]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: `_mm_prefetch` is unsafe only for its target feature, SSE,
        // which every x86_64 CPU has. A prefetch never faults and reads
        // nothing the program can see, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// The last [`IndexLayout`] seen under the lock, readable without it, so a
/// producer can prefetch before it takes the lock, and where the shard's
/// node chunks are, so a consumer can prefetch the node of a key it will
/// soon take (see [`FrontGuard::pop`](crate::lane::FrontGuard::pop)).
/// Torn or stale reads are harmless for the same reason as above: a shard
/// that gives its room back makes new chunks, elsewhere, and until each is
/// published a hint names the old one.
///
/// It sits on cache lines of its own. Beside its shard's lock, the read
/// before an add fetched the lock's line shared, and the lock then had to
/// fetch it again to own it: two transfers from the core that last held
/// the lock instead of one (the read was 3.5 % of W2's samples on an AMD
/// EPYC VM). Alone, the layout changes only when the table moves, so every
/// core keeps a copy.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct SharedLayout {
    ctrl: AtomicUsize,
    mask: AtomicUsize,
    /// Where the shard's ready times start (0: it keeps none), so that a
    /// hand-out's read of its key's ready time is fetched with its node.
    /// The times are one array that moves as it grows: a hint names the
    /// old one until the next add publishes the new one.
    times: AtomicUsize,
    /// Each node chunk's address (0: not known). `std`'s atomics even
    /// under loom: nothing is read through them, so nothing needs a model.
    chunks: Segmented<AtomicUsize, CHUNK_SEGMENTS>,
}

/// Room for 4 * (2^27 - 1) chunks: past the 2^32 slots a shard can number,
/// at 16 slots a chunk (the fewest one holds).
const CHUNK_SEGMENTS: usize = 27;

impl SharedLayout {
    pub(crate) fn load(&self) -> IndexLayout {
        IndexLayout {
            ctrl: self.ctrl.load(Relaxed),
            mask: self.mask.load(Relaxed),
        }
    }

    /// Publishes that node chunk `c` is at `at`. An add of a split queue
    /// calls it with the chunk it made, if any (the state hands out each
    /// new chunk once, see [`Nodes::new_chunk`](crate::nodes::Nodes::new_chunk)),
    /// so an add that made none touches nothing here, and a line that
    /// consumers read is written once per chunk.
    pub(crate) fn publish_chunk(&self, c: usize, at: usize) {
        self.chunks
            .get_or_make(c, || AtomicUsize::new(0))
            .store(at, Relaxed);
    }

    /// Publishes that the shard's ready times start at `at` (0: none). An
    /// add calls it only when they moved
    /// ([`State::moved_times`](crate::state::State::moved_times)).
    #[inline]
    pub(crate) fn publish_times(&self, at: usize) {
        self.times.store(at, Relaxed);
    }

    /// Where the shard's ready times start, if it keeps any.
    #[inline]
    pub(crate) fn times(&self) -> Option<usize> {
        let at = self.times.load(Relaxed);
        (at != 0).then_some(at)
    }

    /// Where node chunk `c` is, if published.
    #[inline]
    pub(crate) fn chunk(&self, c: usize) -> Option<usize> {
        let at = self.chunks.get(c)?.load(Relaxed);
        (at != 0).then_some(at)
    }

    /// Publishes `layout`; writes only when it changed (the table moved), so
    /// producers do not keep dirtying a shared cache line.
    pub(crate) fn publish(&self, layout: IndexLayout) {
        if self.ctrl.load(Relaxed) != layout.ctrl {
            self.ctrl.store(layout.ctrl, Relaxed);
            self.mask.store(layout.mask, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hashbrown::HashTable;

    fn hash(i: u32) -> u64 {
        u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// If hashbrown ever lays its table out differently, the hints become
    /// useless (never wrong): this test says so.
    #[test]
    fn the_layout_finds_every_slot_where_hashbrown_keeps_it() {
        let mut table = HashTable::new();
        let mut layout = IndexLayout::default();
        for i in 0..5000u32 {
            let entry = table.insert_unique(hash(i), i, |&x| hash(x));
            let (bucket, addr) = (entry.bucket_index(), std::ptr::from_ref(entry.get()).addr());
            layout = IndexLayout::new(addr, bucket, table.num_buckets());
        }
        assert_eq!(layout.mask, table.num_buckets() - 1);
        for i in 0..5000u32 {
            let bucket = table.find_bucket_index(hash(i), |&x| x == i).unwrap();
            let addr = std::ptr::from_ref(table.get_bucket(bucket).unwrap()).addr();
            assert_eq!(addr, layout.ctrl - (bucket + 1) * size_of::<u32>());
        }
        layout.prefetch(hash(1));
        IndexLayout::default().prefetch(hash(1)); // no table yet: no hint
    }

    #[test]
    fn shared_layout_publishes_changes() {
        let shared = SharedLayout::default();
        let layout = IndexLayout::new(0x1000, 3, 16);
        shared.publish(layout);
        let read = shared.load();
        assert_eq!((read.ctrl, read.mask), (0x1010, 15));
        assert_eq!(shared.chunk(3), None);
        shared.publish_chunk(3, 0x4000);
        assert_eq!((shared.chunk(3), shared.chunk(2)), (Some(0x4000), None));
        shared.publish_chunk(3, 0x8000);
        assert_eq!(shared.chunk(3), Some(0x8000));
        assert_eq!(shared.times(), None);
        shared.publish_times(0x9000);
        assert_eq!(shared.times(), Some(0x9000));
        shared.publish_times(0);
        assert_eq!(shared.times(), None);
    }
}
