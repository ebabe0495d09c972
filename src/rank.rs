//! The rank that orders ready keys across a queue's shards, and what a
//! shard's mark shows, as plain values.
//!
//! A key made ready draws a number; its rank is its priority and that
//! number in one word, so that a shard publishes its next key with one
//! atomic store and a hand-out reads it with one load ([`before`] orders
//! two ranks, the numbers compared by their wrapping distance; see
//! [`crate::shard`] for how the hand-out merges the shards by it). A
//! shard's state keeps what its mark shows ([`Shown`]), and the shards'
//! marks publish it. Times in the marks and the timer's wheel are
//! nanoseconds from the queue's epoch ([`nanos_since`]). The state, the
//! shards, the shared state and the timer stand on this module, which
//! depends on none of them.

use std::time::Duration;

use tokio::time::Instant;

/// The rank of a shard with no key ready: after every other.
pub(crate) const EMPTY: u64 = u64::MAX;

/// What a shard's mark shows, as its state keeps it (under the shard's
/// lock, the only place the mark is written from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shown {
    pub(crate) rank: u64,
    /// The oldest ready key's time and number (with a starvation bound).
    pub(crate) oldest: (u64, u32),
    pub(crate) status: u8,
}

impl Default for Shown {
    /// What a new mark shows: no key ready, none oldest, open.
    fn default() -> Self {
        Shown {
            rank: EMPTY,
            oldest: (u64::MAX, 0),
            status: 0,
        }
    }
}

/// The rank of a key of `priority` that drew `seq`: smaller goes first.
#[inline]
pub(crate) fn rank(priority: i32, seq: u32) -> u64 {
    // Higher priorities first: flip the sign bit to order as unsigned, then
    // invert.
    let hi = u64::from(!((priority as u32) ^ 0x8000_0000));
    ((hi << 32) | u64::from(seq)).min(EMPTY - 1)
}

/// Whether rank `a` goes before rank `b` (both not [`EMPTY`]). Numbers wrap;
/// the ready keys of one priority span far fewer than 2^31 of them.
#[inline]
pub(crate) fn before(a: u64, b: u64) -> bool {
    let (ha, hb) = (a >> 32, b >> 32);
    if ha != hb {
        return ha < hb;
    }
    earlier(a as u32, b as u32)
}

/// Whether number `a` was drawn before `b` (numbers wrap).
#[inline]
pub(crate) fn earlier(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Nanoseconds from `epoch` to `t` (zero before it).
pub(crate) fn nanos_since(epoch: Instant, t: Instant) -> u64 {
    nanos(t.saturating_duration_since(epoch))
}

/// `d` in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_put_higher_priorities_first_then_earlier_numbers() {
        assert!(before(rank(5, 10), rank(0, 1)));
        assert!(before(rank(0, 1), rank(0, 2)));
        assert!(before(rank(-3, 0), rank(i32::MIN, 0)));
        assert!(before(rank(i32::MAX, 7), rank(i32::MAX - 1, 0)));
        // Numbers wrap: u32::MAX was drawn before 0.
        assert!(before(rank(0, u32::MAX), rank(0, 0)));
        assert!(rank(i32::MIN, u32::MAX) < EMPTY);
    }
}
