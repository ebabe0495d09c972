//! The hand-out throttle: caps how fast a queue hands keys out.

use std::time::Duration;

/// A source of hand-out permits, asked under the queue's lock.
///
/// It must answer at once: `Err(wait)` says no permit was taken and when one
/// may be had. The queue asks only when a key is there to take, so permits are
/// never spent on an empty queue.
pub(crate) trait Throttle: Send + Sync + 'static {
    fn try_acquire(&self) -> Result<(), Duration>;
}

impl Throttle for crate::limiter::TokenBucket {
    fn try_acquire(&self) -> Result<(), Duration> {
        crate::limiter::TokenBucket::try_acquire(self)
    }
}

// Partitions built from one builder share one throttle.
impl<T: Throttle + ?Sized> Throttle for std::sync::Arc<T> {
    fn try_acquire(&self) -> Result<(), Duration> {
        (**self).try_acquire()
    }
}
