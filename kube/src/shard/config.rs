//! [`ShardConfig`]: which shard group a replica joins, as whom, and the
//! Lease timings it renews its membership with.

use std::time::Duration;

use tokio_workqueue::TokenBucket;

use crate::leader::{LeaseConfig, LeaseConfigError};

/// Which shard group a replica joins, under which identity, in which
/// namespace its Lease lives, and the timings of that Lease: the same
/// three as a leader's, with client-go's defaults and rules
/// ([`LeaseConfig`]).
///
/// Every member of a group must use the same timings: each judges the
/// others' Leases expired by its own lease duration.
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue_kube::shard::ShardConfig;
///
/// let config = ShardConfig::new("configmaps", "default", "pod-a");
/// assert_eq!(config.lease_name(), "configmaps-pod-a");
/// assert!(config.validate().is_ok());
/// // An identity with a comma cannot be written in an acknowledgement.
/// assert!(ShardConfig::new("configmaps", "default", "a,b").validate().is_err());
/// // client-go's timing rules hold here too.
/// let bad = config.with_renew_deadline(Duration::from_secs(20));
/// assert!(bad.validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardConfig {
    /// The group is the lease config's name.
    lease: LeaseConfig,
    /// `None`: four lease durations.
    forget_after: Option<Duration>,
    /// Set by [`split_cache`](ShardConfig::split_cache).
    split: Option<LabelRate>,
}

/// How fast a group's coordinator may write shard labels: a token bucket
/// of `per_second` patches with bursts of `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelRate {
    /// Patches per second, on average.
    pub per_second: f64,
    /// Patches that may go at once after a quiet spell.
    pub burst: u32,
}

impl LabelRate {
    /// The default: 200 patches a second, in bursts of up to 200. Adding a
    /// fourth replica to three moves about a quarter of the objects: at
    /// 30,000 objects, 7,500 patches, about 37 s of relabelling, during
    /// which the moving objects are in neither replica's cache (they are
    /// reconciled once relabelled; see [`crate::shard`]).
    pub const DEFAULT: LabelRate = LabelRate {
        per_second: 200.0,
        burst: 200,
    };
}

impl Eq for LabelRate {}

impl Default for LabelRate {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ShardConfig {
    /// The group `group` (a label value: at most 63 characters, letters,
    /// digits, `-`, `_`, `.`, starting and ending with a letter or digit),
    /// with this replica's Lease in `namespace` held as `identity` (unique
    /// per replica; the Pod's name is the usual choice), with client-go's
    /// default timings (15 s, 10 s, 2 s).
    pub fn new(
        group: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        ShardConfig {
            lease: LeaseConfig::new(group, namespace, identity),
            forget_after: None,
            split: None,
        }
    }

    /// The shard group.
    #[must_use]
    pub fn group(&self) -> &str {
        self.lease.name()
    }

    /// The namespace of the group's Leases.
    #[must_use]
    pub fn namespace(&self) -> &str {
        self.lease.namespace()
    }

    /// This replica's identity: its Lease's `holderIdentity`.
    #[must_use]
    pub fn identity(&self) -> &str {
        self.lease.identity()
    }

    /// The name of this replica's Lease: `{group}-{identity}`.
    #[must_use]
    pub fn lease_name(&self) -> String {
        format!("{}-{}", self.group(), self.identity())
    }

    /// How long a member's Lease lasts after its record last changed, as
    /// each other member measures it on its own clock (default 15 s).
    #[must_use]
    pub fn lease_duration(&self) -> Duration {
        self.lease.lease_duration()
    }

    /// How long a member keeps trying to renew before it fences itself
    /// (default 10 s).
    #[must_use]
    pub fn renew_deadline(&self) -> Duration {
        self.lease.renew_deadline()
    }

    /// How often a member renews its Lease and reads the group's (default
    /// 2 s).
    #[must_use]
    pub fn retry_period(&self) -> Duration {
        self.lease.retry_period()
    }

    /// How long reconciles of keys this replica lost, or of all keys once
    /// it fenced itself, may go on before they are cancelled: half of lease
    /// duration minus renew deadline, as for a leader
    /// ([`LeaseConfig::fencing_grace`]).
    #[must_use]
    pub fn fencing_grace(&self) -> Duration {
        self.lease.fencing_grace()
    }

    /// How long a member's Lease must have stayed unchanged, as this
    /// replica saw it, before this replica deletes it (default four lease
    /// durations: 60 s with the default timings). A crashed replica's
    /// Lease is ignored once it expired; deleting it later only keeps the
    /// group's Leases from piling up when replicas get new names (a
    /// Deployment's Pods). A replica whose Lease was deleted while it was
    /// away makes a new one when it is back.
    #[must_use]
    pub fn forget_after(&self) -> Duration {
        self.forget_after
            .unwrap_or_else(|| self.lease_duration().saturating_mul(4))
    }

    /// Sets [`forget_after`](Self::forget_after); it must be longer than
    /// the lease duration.
    #[must_use]
    pub fn with_forget_after(mut self, d: Duration) -> Self {
        self.forget_after = Some(d);
        self
    }

    pub(crate) fn lease(&self) -> &LeaseConfig {
        &self.lease
    }

    /// Splits the cache as well as the keys (see [`crate::shard`], "Split
    /// caches"): each replica watches only the objects labelled
    /// [`label_key`](super::label_key)`(group)={identity}`, and the member
    /// the group elects as coordinator writes that label on every object,
    /// at most as fast as `rate` allows (objects without a label first).
    /// The identity must then be a label value too (at most 63
    /// characters). The stored objects lack the coordinator's
    /// `managedFields` entry ([`LABEL_MANAGER`](super::LABEL_MANAGER)).
    #[must_use]
    pub fn split_cache(mut self, rate: LabelRate) -> Self {
        self.split = Some(rate);
        self
    }

    /// The label rate if the cache is split ([`split_cache`](Self::split_cache)).
    #[must_use]
    pub fn splits_cache(&self) -> Option<LabelRate> {
        self.split
    }

    /// The Lease the group's members elect their coordinator with, when
    /// the cache is split: `{group}.coordinator` in the group's namespace,
    /// with the group's timings. (Member Leases are `{group}-{identity}`, so
    /// the two cannot meet.)
    #[must_use]
    pub fn coordinator_lease(&self) -> LeaseConfig {
        LeaseConfig::new(
            format!("{}.coordinator", self.group()),
            self.namespace(),
            self.identity(),
        )
        .with_lease_duration(self.lease_duration())
        .with_renew_deadline(self.renew_deadline())
        .with_retry_period(self.retry_period())
    }

    /// Sets the lease duration.
    #[must_use]
    pub fn with_lease_duration(mut self, d: Duration) -> Self {
        self.lease = self.lease.with_lease_duration(d);
        self
    }

    /// Sets the renew deadline.
    #[must_use]
    pub fn with_renew_deadline(mut self, d: Duration) -> Self {
        self.lease = self.lease.with_renew_deadline(d);
        self
    }

    /// Sets the retry period.
    #[must_use]
    pub fn with_retry_period(mut self, d: Duration) -> Self {
        self.lease = self.lease.with_retry_period(d);
        self
    }

    /// Checks client-go's rules ([`LeaseConfig::validate`]), that the group
    /// is a label value, that the forget-after time is longer than the
    /// lease duration, that the identity has no comma (acknowledgements
    /// list identities comma-separated) and that the Lease name fits in
    /// 253 characters.
    ///
    /// # Errors
    ///
    /// The first rule the config breaks.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        self.lease.validate()?;
        if !is_label_value(self.group()) {
            return Err(LeaseConfigError::Invalid {
                field: "group",
                why: "must be a label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            });
        }
        if self.forget_after() <= self.lease_duration() {
            return Err(LeaseConfigError::Invalid {
                field: "forget-after time",
                why: "must be longer than the lease duration",
            });
        }
        if self.identity().contains(',') {
            return Err(LeaseConfigError::Invalid {
                field: "identity",
                why: "must not contain ','",
            });
        }
        if self.lease_name().len() > 253 {
            return Err(LeaseConfigError::Invalid {
                field: "identity",
                why: "makes the Lease name `{group}-{identity}` longer than 253 characters",
            });
        }
        if let Some(rate) = self.split {
            if !is_label_value(self.identity()) {
                return Err(LeaseConfigError::Invalid {
                    field: "identity",
                    why: "must be a label value with a split cache (it is written in each object's shard label): at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                });
            }
            // The bucket the coordinator is throttled by decides.
            if TokenBucket::new(rate.per_second, rate.burst).is_err() {
                return Err(LeaseConfigError::Invalid {
                    field: "label rate",
                    why: "must be a positive, finite number of patches a second with a burst of at least 1",
                });
            }
        }
        Ok(())
    }
}

/// Whether `s` is a (non-empty) label value: at most 63 letters, digits,
/// `-`, `_` or `.`, starting and ending with a letter or digit.
fn is_label_value(s: &str) -> bool {
    let label_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && s.chars().all(label_char)
        && ends_ok(s.chars().next())
        && ends_ok(s.chars().last())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_must_be_label_values() {
        for group in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            let err = ShardConfig::new(group, "ns", "me").validate().unwrap_err();
            assert!(
                matches!(
                    err,
                    LeaseConfigError::Empty("name")
                        | LeaseConfigError::Invalid { field: "group", .. }
                ),
                "{group:?}: {err:?}"
            );
        }
        for group in ["a", "my.group_1-x", &"x".repeat(63)] {
            assert_eq!(ShardConfig::new(group, "ns", "me").validate(), Ok(()));
        }
    }

    #[test]
    fn identities_must_fit_an_acknowledgement_and_a_name() {
        let err = ShardConfig::new("g", "ns", "a,b").validate().unwrap_err();
        assert!(err.to_string().contains("identity"), "{err}");
        let long = "x".repeat(252);
        assert!(ShardConfig::new("g", "ns", long).validate().is_err());
        assert!(ShardConfig::new("g", "ns", "").validate().is_err());
    }

    #[test]
    fn a_split_cache_needs_an_identity_that_is_a_label_value_and_a_real_rate() {
        let split = |id: &str, rate| ShardConfig::new("g", "ns", id).split_cache(rate);
        assert_eq!(split("pod-a", LabelRate::DEFAULT).validate(), Ok(()));
        let long = "x".repeat(64);
        assert_eq!(ShardConfig::new("g", "ns", &*long).validate(), Ok(()));
        for id in [&*long, "pod:a", "-a"] {
            let err = split(id, LabelRate::DEFAULT).validate().unwrap_err();
            assert!(err.to_string().contains("label value"), "{id}: {err}");
        }
        for (per_second, burst) in [
            (0.0, 1),
            (-1.0, 1),
            (f64::NAN, 1),
            (f64::INFINITY, 1),
            (1.0, 0),
        ] {
            let err = split("a", LabelRate { per_second, burst })
                .validate()
                .unwrap_err();
            assert!(
                err.to_string().contains("label rate"),
                "{per_second} {burst}: {err}"
            );
        }
        let c = split("a", LabelRate::DEFAULT);
        assert_eq!(c.coordinator_lease().name(), "g.coordinator");
        assert_eq!(c.coordinator_lease().identity(), "a");
        assert_eq!(c.coordinator_lease().validate(), Ok(()));
    }

    #[test]
    fn timings_follow_client_go_s_rules() {
        let c = ShardConfig::new("g", "ns", "me")
            .with_lease_duration(Duration::from_millis(600))
            .with_renew_deadline(Duration::from_millis(400))
            .with_retry_period(Duration::from_millis(100));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.fencing_grace(), Duration::from_millis(100));
        assert_eq!(c.forget_after(), Duration::from_millis(2_400));
        let bad = c.clone().with_forget_after(Duration::from_millis(600));
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("forget-after")
        );
        let c = c.with_forget_after(Duration::from_millis(601));
        assert_eq!(c.validate(), Ok(()));
        let c = c.with_retry_period(Duration::from_millis(400));
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::RetryPeriodTooLong { .. })
        ));
    }
}
