//! An array that grows without moving what it holds, readable by any
//! thread while one grows it.
//!
//! Segment `c` holds `4 << c` entries and is made, whole, the first time an
//! entry in it is asked for; a segment once made never moves and lives as
//! long as the array. So a reference to an entry stays good while the
//! array grows past it, and finding entry `i` is one leading-zero count.
//! The queue keeps its lanes this way (a consumer reads the lanes while a
//! producer makes one, [`crate::lanes`]), and each shard the addresses of
//! its node chunks, which consumers read without the shard's lock to
//! prefetch a node ([`crate::prefetch::SharedLayout`]).

use std::sync::OnceLock;

/// Entries `0..4 * (2^N - 1)`, in `N` segments made as they are needed.
#[derive(Debug)]
pub(crate) struct Segmented<T, const N: usize> {
    segments: [OnceLock<Box<[T]>>; N],
}

/// Where entry `i` is: its segment and the place in it.
#[inline]
fn locate(i: usize) -> (usize, usize) {
    // Segment c starts at 4 * (2^c - 1).
    let j = i / 4 + 1;
    let c = (usize::BITS - 1 - j.leading_zeros()) as usize;
    (c, i - 4 * ((1 << c) - 1))
}

impl<T, const N: usize> Segmented<T, N> {
    pub(crate) fn new() -> Self {
        Segmented {
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Entry `i`, if its segment has been made.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        let (c, at) = locate(i);
        self.segments.get(c)?.get().map(|s| &s[at])
    }

    /// Entry `i`, making its segment with `make` (once per entry) if it
    /// has not been made.
    ///
    /// # Panics
    ///
    /// If `i` is past the `N` segments.
    pub(crate) fn get_or_make(&self, i: usize, mut make: impl FnMut() -> T) -> &T {
        let (c, at) = locate(i);
        let segment = self.segments.get(c).expect("an entry past the segments");
        &segment.get_or_init(|| (0..4usize << c).map(|_| make()).collect())[at]
    }
}

impl<T, const N: usize> Default for Segmented<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_located_in_doubling_segments() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            let (c, at) = locate(i);
            assert!(at < 4 << c, "entry {i}: segment {c} place {at}");
            assert!(seen.insert((c, at)));
        }
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(4), (1, 0));
        assert_eq!(locate(12), (2, 0));
    }

    #[test]
    fn entries_stay_where_they_are_as_segments_are_made() {
        let array: Segmented<u32, 4> = Segmented::new();
        assert!(array.get(0).is_none());
        let first: *const u32 = array.get_or_make(1, || 7);
        // Its segment holds entries 0..4, made together.
        assert_eq!(array.get(0), Some(&7));
        assert!(array.get(4).is_none());
        let mut n = 0;
        assert_eq!(
            *array.get_or_make(20, || {
                n += 1;
                n
            }),
            9
        );
        assert_eq!(n, 16, "segment 2 holds 16 entries, made once each");
        assert_eq!(first, array.get(1).unwrap() as *const u32);
        // Four segments hold 4 * (2^4 - 1) entries.
        assert!(array.get(59).is_none());
        assert!(array.get(60).is_none());
    }

    #[test]
    #[should_panic(expected = "an entry past the segments")]
    fn an_entry_past_the_segments_panics() {
        let array: Segmented<u32, 2> = Segmented::new();
        array.get_or_make(12, || 0);
    }
}
