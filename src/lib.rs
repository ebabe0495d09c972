//! tokio-workqueue (work in progress).
#![warn(missing_docs)]

mod builder;
mod error;
mod item;
#[cfg(feature = "kube")]
pub mod kube;
pub mod limiter;
pub mod metrics;
mod options;
mod queue;
mod state;
mod throttle;
mod timer;

pub use builder::Builder;
pub use error::AddError;
pub use item::WorkItem;
pub use limiter::{
    ExponentialBackoff, FastSlow, InvalidLimiter, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
    default_controller_rate_limiter,
};
pub use options::{AddOpts, Lane};
pub use queue::WorkQueue;
pub use state::MAX_DELAY;
