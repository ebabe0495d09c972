//! Why an add was refused.

use std::fmt;

/// An add or requeue that the queue refused.
///
/// Every add returns `Result<(), AddError>`: a refused key is never dropped
/// silently, the caller can always tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddError {
    /// The queue is shutting down and takes no new keys.
    ShuttingDown,
    /// A delayed or rate-limited add was made where no timer could be
    /// started for it: outside a tokio runtime, or in one built without
    /// `enable_time`.
    ///
    /// A plain `std::thread` has no runtime: enter one's handle there first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokio_workqueue::{AddError, WorkQueue};
    ///
    /// let rt = tokio::runtime::Runtime::new().unwrap();
    /// let queue = WorkQueue::new();
    /// let delay = Duration::from_millis(1);
    /// assert_eq!(queue.add_after("a", delay), Err(AddError::NoRuntime));
    /// let _guard = rt.handle().enter(); // this thread now has a runtime
    /// queue.add_after("a", delay).unwrap();
    /// ```
    ///
    /// A requeue of a [`WorkItem`](crate::WorkItem) refused this way does
    /// not lose its key: the key is ready again now.
    NoRuntime,
}

impl fmt::Display for AddError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::ShuttingDown => f.write_str("the work queue is shutting down"),
            AddError::NoRuntime => {
                f.write_str("a delayed add needs a tokio runtime with time enabled")
            }
        }
    }
}

impl std::error::Error for AddError {}
