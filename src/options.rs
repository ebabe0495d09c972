//! How a key is added: priority, delay, rate limit, lane.

use std::time::Duration;

/// Options for [`WorkQueue::add_with`](crate::WorkQueue::add_with).
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::{AddOpts, Lane};
///
/// let opts = AddOpts::default().priority(10).after(Duration::from_secs(1));
/// assert_eq!(opts.get_priority(), 10);
/// assert_eq!(AddOpts::default().lane(Lane::Slow).get_priority(), -100);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AddOpts {
    pub(crate) priority: i32,
    pub(crate) after: Duration,
    pub(crate) rate_limited: bool,
}

impl AddOpts {
    /// Ready now, at priority 0, not rate limited.
    pub fn new() -> Self {
        Self::default()
    }

    /// Higher priorities are handed out first. The default is 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The priority of `lane`.
    pub fn lane(self, lane: Lane) -> Self {
        self.priority(lane.priority())
    }

    /// Ready only after `delay`. Zero means now; delays beyond
    /// [`MAX_DELAY`](crate::MAX_DELAY) are clamped to it.
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Also wait the queue rate limiter's delay for this key (and count a
    /// retry). With [`after`](Self::after) as well, the longer of the two wins.
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self
    }

    /// The priority these options add with.
    pub fn get_priority(&self) -> i32 {
        self.priority
    }
}

/// Two named priorities: a fast lane for fresh changes and a slow lane for
/// bulk work such as an initial list or a periodic resync.
///
/// Lanes are plain priorities ([`Lane::Fast`] is 0, [`Lane::Slow`] is -100),
/// so a key in the slow lane moves to the fast lane when it is added there,
/// and the queue's starvation bound applies to the slow lane too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Lane {
    /// Priority 0, the default for every add.
    #[default]
    Fast,
    /// Priority -100, the value controller-runtime gives initial-list events.
    Slow,
}

impl Lane {
    /// The priority of this lane.
    pub const fn priority(self) -> i32 {
        match self {
            Lane::Fast => 0,
            Lane::Slow => -100,
        }
    }

    /// The lane a priority falls in: [`Lane::Fast`] for 0 and above.
    pub const fn from_priority(priority: i32) -> Lane {
        if priority >= 0 {
            Lane::Fast
        } else {
            Lane::Slow
        }
    }
}
