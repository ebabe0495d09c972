//! Why an add was refused.

use std::fmt;

/// An add, requeue or build that the queue refused.
///
/// Every add returns `Result<(), AddError>`: a refused key is never dropped
/// silently, the caller can always tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddError {
    /// The queue is shutting down and takes no new keys.
    ShuttingDown,
    /// A delayed add was made outside a tokio runtime, so no timer could be
    /// started for it.
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
