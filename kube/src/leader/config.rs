//! [`LeaseConfig`]: which Lease to hold, as whom, and client-go's three
//! timings, with the rules that keep two replicas from leading at once.

use std::fmt;
use std::time::Duration;

/// Which Lease a replica competes for, under which identity, and how long
/// a lease lasts, how long a leader keeps trying to renew it and how often
/// it tries.
///
/// The defaults are client-go's: lease duration 15 s, renew deadline 10 s,
/// retry period 2 s. [`validate`](Self::validate) checks client-go's rules
/// (lease duration > renew deadline > 1.2 x retry period, everything
/// positive, non-empty names); the elector and the controller refuse a
/// config that breaks them with a [`LeaseConfigError`], never a panic.
///
/// Every replica must use the same timings: a follower judges the lease
/// expired by its **own** lease duration, counted from when it last saw the
/// Lease's record change (the `leaseDurationSeconds` written on the Lease
/// is for people and other tools; it is rounded up to whole seconds).
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue_kube::leader::LeaseConfig;
///
/// let config = LeaseConfig::new("my-controller", "default", "pod-a");
/// assert_eq!(config.lease_duration(), Duration::from_secs(15));
/// assert!(config.validate().is_ok());
///
/// // A renew deadline as long as the lease could let two replicas lead.
/// let bad = config.with_renew_deadline(Duration::from_secs(15));
/// assert!(bad.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    name: String,
    namespace: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

impl LeaseConfig {
    /// The Lease `name` in `namespace`, competed for as `identity` (unique
    /// per replica: the Pod's name is the usual choice), with client-go's
    /// default timings.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// How long a lease lasts after its record last changed, as each
    /// follower measures it on its own clock (default 15 s).
    #[must_use]
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// How long a leader keeps trying to renew before it steps down
    /// (default 10 s).
    #[must_use]
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// How often a leader renews and a follower tries to acquire (default
    /// 2 s).
    #[must_use]
    pub fn retry_period(&self) -> Duration {
        self.retry_period
    }

    /// The Lease's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Lease's namespace.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// This replica's identity, written as the Lease's `holderIdentity`.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Sets the lease duration.
    #[must_use]
    pub fn with_lease_duration(mut self, d: Duration) -> Self {
        self.lease_duration = d;
        self
    }

    /// Sets the renew deadline.
    #[must_use]
    pub fn with_renew_deadline(mut self, d: Duration) -> Self {
        self.renew_deadline = d;
        self
    }

    /// Sets the retry period.
    #[must_use]
    pub fn with_retry_period(mut self, d: Duration) -> Self {
        self.retry_period = d;
        self
    }

    /// The lease duration as written on a Lease's `leaseDurationSeconds`:
    /// whole seconds, rounded up (only for people and other tools).
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_millis().div_ceil(1000)).unwrap_or(i32::MAX)
    }

    /// How long in-flight reconciles may go on after their controller lost
    /// the lease before they are cancelled: half of lease duration minus
    /// renew deadline, so that they have ended, with the other half to
    /// spare for scheduling, before any other replica can see the lease
    /// expire.
    #[must_use]
    pub fn fencing_grace(&self) -> Duration {
        self.lease_duration.saturating_sub(self.renew_deadline) / 2
    }

    /// Checks client-go's rules: non-empty name, namespace and identity,
    /// positive timings, lease duration > renew deadline > 1.2 x retry
    /// period.
    ///
    /// # Errors
    ///
    /// The first rule the config breaks.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        for (field, value) in [
            ("name", &self.name),
            ("namespace", &self.namespace),
            ("identity", &self.identity),
        ] {
            if value.is_empty() {
                return Err(LeaseConfigError::Empty(field));
            }
        }
        for (field, value) in [
            ("lease duration", self.lease_duration),
            ("renew deadline", self.renew_deadline),
            ("retry period", self.retry_period),
        ] {
            if value.is_zero() {
                return Err(LeaseConfigError::NotPositive(field));
            }
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(LeaseConfigError::RenewDeadlineNotShorterThanLease {
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
            });
        }
        // 1.2 x retry period, exactly: 6/5 in nanoseconds.
        let min_deadline = self.retry_period.saturating_mul(6) / 5;
        if self.renew_deadline <= min_deadline {
            return Err(LeaseConfigError::RetryPeriodTooLong {
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        Ok(())
    }
}

/// A [`LeaseConfig`] that breaks one of client-go's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseConfigError {
    /// The name, namespace or identity (named here) is empty.
    Empty(&'static str),
    /// The timing named here is zero.
    NotPositive(&'static str),
    /// The renew deadline is not shorter than the lease duration, so a
    /// leader could still be acting when others see its lease expire.
    RenewDeadlineNotShorterThanLease {
        /// The configured lease duration.
        lease_duration: Duration,
        /// The configured renew deadline.
        renew_deadline: Duration,
    },
    /// The renew deadline is not longer than 1.2 x the retry period, so a
    /// leader would not get one retry in before it steps down.
    RetryPeriodTooLong {
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The configured retry period.
        retry_period: Duration,
    },
    /// A name (named here) is not one Kubernetes accepts where it is used.
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl fmt::Display for LeaseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseConfigError::Empty(field) => write!(f, "lease config: the {field} is empty"),
            LeaseConfigError::NotPositive(field) => {
                write!(f, "lease config: the {field} must be positive")
            }
            LeaseConfigError::RenewDeadlineNotShorterThanLease {
                lease_duration,
                renew_deadline,
            } => write!(
                f,
                "lease config: the lease duration ({lease_duration:?}) must be longer than the renew deadline ({renew_deadline:?})"
            ),
            LeaseConfigError::RetryPeriodTooLong {
                renew_deadline,
                retry_period,
            } => write!(
                f,
                "lease config: the renew deadline ({renew_deadline:?}) must be longer than 1.2 x the retry period ({retry_period:?})"
            ),
            LeaseConfigError::Invalid { field, why } => {
                write!(f, "lease config: the {field} {why}")
            }
        }
    }
}

impl std::error::Error for LeaseConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn config() -> LeaseConfig {
        LeaseConfig::new("lease", "default", "me")
    }

    #[test]
    fn defaults_are_client_go_s_and_valid() {
        let c = config();
        assert_eq!(
            (c.lease_duration(), c.renew_deadline(), c.retry_period()),
            (ms(15_000), ms(10_000), ms(2_000))
        );
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.fencing_grace(), ms(2_500));
    }

    #[test]
    fn empty_names_are_refused() {
        for (c, field) in [
            (LeaseConfig::new("", "ns", "me"), "name"),
            (LeaseConfig::new("l", "", "me"), "namespace"),
            (LeaseConfig::new("l", "ns", ""), "identity"),
        ] {
            assert_eq!(c.validate(), Err(LeaseConfigError::Empty(field)));
        }
    }

    #[test]
    fn zero_timings_are_refused() {
        let c = config().with_retry_period(Duration::ZERO);
        assert_eq!(
            c.validate(),
            Err(LeaseConfigError::NotPositive("retry period"))
        );
        let c = config().with_lease_duration(Duration::ZERO);
        assert_eq!(
            c.validate(),
            Err(LeaseConfigError::NotPositive("lease duration"))
        );
        let c = config().with_renew_deadline(Duration::ZERO);
        assert_eq!(
            c.validate(),
            Err(LeaseConfigError::NotPositive("renew deadline"))
        );
    }

    #[test]
    fn lease_duration_must_exceed_renew_deadline() {
        for lease in [ms(10_000), ms(9_999)] {
            let err = config().with_lease_duration(lease).validate().unwrap_err();
            assert!(matches!(
                err,
                LeaseConfigError::RenewDeadlineNotShorterThanLease { .. }
            ));
            assert!(err.to_string().contains("longer than the renew deadline"));
        }
        assert!(config().with_lease_duration(ms(10_001)).validate().is_ok());
    }

    #[test]
    fn renew_deadline_must_exceed_1_2_retry_periods() {
        // 1.2 x 2 s = 2.4 s: exactly that is refused, a nanosecond more is fine.
        let c = config().with_renew_deadline(ms(2_400));
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::RetryPeriodTooLong { .. })
        ));
        let c = config().with_renew_deadline(ms(2_400) + Duration::from_nanos(1));
        assert_eq!(c.validate(), Ok(()));
        // The short timings the replica tests use.
        let c = config()
            .with_lease_duration(ms(600))
            .with_renew_deadline(ms(400))
            .with_retry_period(ms(100));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.fencing_grace(), ms(100));
    }
}
