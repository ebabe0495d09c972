//! Leases, as leader election uses them: optimistic concurrency only.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube_client::api::{Api, ListParams, ObjectMeta, PostParams};
use kube_client::{Client, ResourceExt};

use super::api_error;

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("group".into(), "conformance".into())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(Timestamp::now())),
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// Two replicas that read the same Lease and both try to take it: the
/// first replace wins, the second is 409 Conflict; a replace without a
/// resourceVersion is 422 (Leases allow no unconditional update).
pub async fn leases_conflict_on_a_stale_resource_version(client: Client, ns: &str) {
    let api: Api<Lease> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let created = api
        .create(&pp, &lease("leader", "replica-a"))
        .await
        .expect("create");
    let spec = created.spec.as_ref().expect("a spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-a"));
    assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());
    let (code, reason) = api_error(
        "a second create",
        api.create(&pp, &lease("leader", "replica-b")).await,
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let seen_by_b = api.get("leader").await.unwrap();
    let seen_by_c = seen_by_b.clone();
    let take = |mut l: Lease, holder: &str| {
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(holder.into());
        spec.acquire_time = Some(MicroTime(Timestamp::now()));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        l
    };
    let b = api
        .replace("leader", &pp, &take(seen_by_b, "replica-b"))
        .await
        .expect("the first taker wins");
    assert_eq!(
        b.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("replica-b")
    );
    let (code, reason) = api_error(
        "the second taker",
        api.replace("leader", &pp, &take(seen_by_c, "replica-c"))
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    let mut blind = take(b.clone(), "replica-d");
    blind.metadata.resource_version = None;
    let (code, reason) = api_error(
        "a replace without resourceVersion",
        api.replace("leader", &pp, &blind).await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));

    // Renewals by the holder go through, each with a new version.
    let mut renewed = b.clone();
    renewed.spec.as_mut().unwrap().renew_time = Some(MicroTime(Timestamp::now()));
    let renewed = api.replace("leader", &pp, &renewed).await.expect("renew");
    assert_ne!(renewed.resource_version(), b.resource_version());
    assert_eq!(
        api.get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("replica-b")
    );

    api.create(&pp, &lease("member-1", "replica-b"))
        .await
        .unwrap();
    let group = api
        .list(&ListParams::default().labels("group=conformance"))
        .await
        .expect("list the group");
    assert_eq!(group.items.len(), 2);
}

/// What shard membership relies on: a merge patch carrying a
/// resourceVersion is a precondition (409 when stale) and never creates a
/// missing Lease (404), and it clears a field set to `null`; while an
/// update (`PUT`) of a missing Lease without a uid creates it, even with a
/// stale resourceVersion (Leases allow create on update; with the old
/// uid it is a 409): which is why a renewal that may land late is a
/// patch.
pub async fn lease_patches_never_create_but_updates_do(client: Client, ns: &str) {
    use kube_client::api::{Patch, PatchParams};
    use serde_json::json;

    let api: Api<Lease> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let created = api
        .create(&pp, &lease("member", "replica-a"))
        .await
        .unwrap();
    let version = created.resource_version();
    let patch = |rv: Option<String>, holder: serde_json::Value| {
        Patch::Merge(json!({
            "metadata": { "resourceVersion": rv },
            "spec": { "holderIdentity": holder },
        }))
    };
    let released = api
        .patch(
            "member",
            &PatchParams::default(),
            &patch(version.clone(), json!(null)),
        )
        .await
        .expect("a patch at the version read");
    assert_eq!(released.spec.unwrap().holder_identity, None);
    let (code, reason) = api_error(
        "a patch at a stale version",
        api.patch(
            "member",
            &PatchParams::default(),
            &patch(version.clone(), json!("replica-b")),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    api.delete("member", &Default::default()).await.unwrap();
    let (code, reason) = api_error(
        "a patch of a deleted Lease",
        api.patch(
            "member",
            &PatchParams::default(),
            &patch(version.clone(), json!("replica-a")),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert!(api.get_opt("member").await.unwrap().is_none());

    // An update carrying the deleted Lease's uid is refused (the uid is a
    // precondition)...
    let mut late = created.clone();
    late.metadata.resource_version.clone_from(&version);
    let (code, reason) = api_error(
        "an update of a deleted Lease with its uid",
        api.replace("member", &pp, &late).await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(api.get_opt("member").await.unwrap().is_none());
    // ... one without a uid creates it, stale resourceVersion and all.
    late.metadata.uid = None;
    let back = api
        .replace("member", &pp, &late)
        .await
        .expect("an update of a missing Lease creates it");
    assert_eq!(
        back.spec.unwrap().holder_identity.as_deref(),
        Some("replica-a")
    );
    assert!(api.get_opt("member").await.unwrap().is_some());
}
