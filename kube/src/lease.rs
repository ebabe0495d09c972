//! What the leader elector and the shard membership both do with a
//! coordination.k8s.io Lease: write a holder's record on it, note when its
//! record last changed by the reader's own clock, tell a lost race (409)
//! from a failure, and hand it back.
//!
//! Neither side ever compares the times written on a Lease with a clock:
//! they are for people and other tools. What counts is when a reader saw
//! the record change, on its monotonic clock (see [`Seen`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube_client::Api;
use kube_client::api::ObjectMeta;
use tokio::time::Instant;

/// Where a replica reads the wall-clock time it writes as its Lease's
/// `acquireTime` and `renewTime`. These times are for people and other
/// tools: no replica ever compares them with any clock.
pub type WallClock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// A Lease not written yet, named `name` in `namespace`, with no record.
pub(crate) fn blank(name: String, namespace: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

/// The non-empty holder of `lease`.
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether `identity` holds `lease`.
fn held_by(lease: &Lease, identity: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(identity)
}

/// Writes `identity`'s record on `spec`, read `now` from `clock`: holder,
/// acquire time (when it was another's, or nobody's), renew time and
/// duration. Tells whether `identity` acquired it rather than renewed.
pub(crate) fn hold(
    spec: &mut LeaseSpec,
    identity: &str,
    clock: &WallClock,
    duration_seconds: i32,
) -> bool {
    let now = MicroTime(clock());
    let acquired = spec.holder_identity.as_deref() != Some(identity);
    if acquired {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(now.clone());
    }
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(duration_seconds);
    acquired
}

/// Whether `error` says the Lease changed since it was read: a write or
/// delete carrying the resourceVersion read lost to another writer.
pub(crate) fn is_conflict(error: &kube_client::Error) -> bool {
    matches!(error, kube_client::Error::Api(s) if s.code == 409)
}

/// A Lease's record as a reader last saw it: its version, and when the
/// reader first saw that version, on its own monotonic clock.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// The record's resourceVersion.
    pub(crate) version: Option<String>,
    /// When this version was first seen.
    pub(crate) at: Instant,
}

impl Seen {
    /// `lease`'s record, first seen at `at`.
    pub(crate) fn new(lease: &Lease, at: Instant) -> Seen {
        Seen {
            version: lease.metadata.resource_version.clone(),
            at,
        }
    }

    /// `lease` seen at `now`, or `before` if its record is unchanged: the
    /// clock starts again only when the record changed.
    pub(crate) fn again(before: Option<Seen>, lease: &Lease, now: Instant) -> Seen {
        match before {
            Some(seen) if seen.is(lease) => seen,
            _ => Seen::new(lease, now),
        }
    }

    /// Whether `lease`'s record is the one seen.
    pub(crate) fn is(&self, lease: &Lease) -> bool {
        self.version == lease.metadata.resource_version
    }

    /// How long the record had been unchanged at `now`.
    pub(crate) fn unchanged_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.at)
    }
}

/// Releases the Lease `name` if `identity` holds it, through `write`,
/// which is given the Lease as read and writes it with its
/// resourceVersion. Tried again on a conflict (up to three tries): a
/// renewal the holder had on the wire when it stopped may have landed
/// after the read. Tells whether it released it.
pub(crate) async fn release<W, F>(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    mut write: W,
) -> Result<bool, kube_client::Error>
where
    W: FnMut(Lease) -> F,
    F: Future<Output = Result<Lease, kube_client::Error>>,
{
    for _ in 0..3 {
        let Some(lease) = api.get_opt(name).await? else {
            return Ok(false);
        };
        if !held_by(&lease, identity) {
            return Ok(false);
        }
        match write(lease).await {
            Ok(_) => return Ok(true),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}
