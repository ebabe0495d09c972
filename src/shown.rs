//! What a shard's mark shows, as plain values, and the time encoding the
//! marks and the timer share.
//!
//! A shard's state keeps what its mark shows ([`Shown`]), and the shards'
//! marks ([`crate::shard`]) publish it. Times in the marks and the timer's
//! wheel are nanoseconds from the queue's epoch ([`nanos_since`]); a key
//! made ready with a starvation bound draws a number from a wrapping
//! count, which breaks ties between keys ready at the same time
//! ([`earlier`]). The state, the shards, the shared state and the timer
//! stand on this module, which depends on none of them.

use std::time::Duration;

use tokio::time::Instant;

/// What a shard's mark shows, as its state keeps it (under the shard's
/// lock, the only place the mark is written from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shown {
    /// Whether a key is ready (shown by a queue's one shard only).
    pub(crate) ready: bool,
    /// The oldest ready key's time and number (with a starvation bound).
    pub(crate) oldest: (u64, u32),
    pub(crate) status: u8,
}

impl Default for Shown {
    /// What a new mark shows: no key ready, none oldest, open.
    fn default() -> Self {
        Shown {
            ready: false,
            oldest: (u64::MAX, 0),
            status: 0,
        }
    }
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
    fn numbers_wrap() {
        assert!(earlier(1, 2));
        assert!(!earlier(2, 1));
        // u32::MAX was drawn before 0.
        assert!(earlier(u32::MAX, 0));
        assert!(!earlier(7, 7));
    }
}
