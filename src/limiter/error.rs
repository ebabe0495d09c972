//! The error returned when a rate limiter is built with nonsense parameters.

use std::error::Error;
use std::fmt;

/// A rate limiter was configured with a parameter that makes no sense.
///
/// Returned by the fallible constructors ([`ExponentialBackoff::new`],
/// [`FastSlow::new`], [`TokenBucket::new`]). It names the limiter, the
/// parameter that was wrong and why, so the message is enough to fix the call:
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::limiter::ExponentialBackoff;
///
/// let err = ExponentialBackoff::<u32>::new(Duration::ZERO, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.limiter(), "ExponentialBackoff");
/// assert_eq!(err.parameter(), "base");
/// assert_eq!(
///     err.to_string(),
///     "invalid ExponentialBackoff parameter `base`: must be greater than zero, got 0ns",
/// );
/// ```
///
/// [`ExponentialBackoff::new`]: super::ExponentialBackoff::new
/// [`FastSlow::new`]: super::FastSlow::new
/// [`TokenBucket::new`]: super::TokenBucket::new
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLimiter {
    limiter: &'static str,
    parameter: &'static str,
    reason: String,
}

impl InvalidLimiter {
    pub(crate) fn new(
        limiter: &'static str,
        parameter: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            limiter,
            parameter,
            reason: reason.into(),
        }
    }

    /// The limiter that refused its parameters, e.g. `"TokenBucket"`.
    pub fn limiter(&self) -> &'static str {
        self.limiter
    }

    /// The name of the parameter that was wrong, as spelled in the
    /// constructor's signature, e.g. `"rate_per_sec"`.
    pub fn parameter(&self) -> &'static str {
        self.parameter
    }

    /// Why the parameter was refused, including the value that was given.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for InvalidLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} parameter `{}`: {}",
            self.limiter, self.parameter, self.reason
        )
    }
}

impl Error for InvalidLimiter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_limiter_parameter_and_reason() {
        let err = InvalidLimiter::new("TokenBucket", "burst", "must be at least 1, got 0");
        assert_eq!(
            err.to_string(),
            "invalid TokenBucket parameter `burst`: must be at least 1, got 0"
        );
        assert_eq!(err.limiter(), "TokenBucket");
        assert_eq!(err.parameter(), "burst");
        assert_eq!(err.reason(), "must be at least 1, got 0");
    }

    #[test]
    fn is_a_std_error_clone_and_comparable() {
        let err = InvalidLimiter::new("FastSlow", "slow", "why");
        let boxed: Box<dyn Error + Send + Sync> = Box::new(err.clone());
        assert!(boxed.source().is_none());
        assert_eq!(boxed.to_string(), err.to_string());
        assert_eq!(err.clone(), err);
        assert_ne!(err, InvalidLimiter::new("FastSlow", "fast", "why"));
    }
}
