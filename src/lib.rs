//! tokio-workqueue (work in progress).
pub mod limiter;
pub use limiter::RateLimiter;
pub use limiter::{
    ExponentialBackoff, FastSlow, InvalidLimiter, MaxOf, TokenBucket, WithMaxWait,
    default_controller_rate_limiter,
};
