//! tokio-workqueue (work in progress).
pub mod limiter;
pub use limiter::RateLimiter;
#[cfg(feature = "kube")]
pub mod kube;
