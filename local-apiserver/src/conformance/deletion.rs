//! Deletion: finalizers, preconditions, kube-runtime's `finalizer` helper
//! and namespaces.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube_client::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube_client::{Client, ResourceExt};
use kube_runtime::controller::Action;
use kube_runtime::finalizer::{Event, finalizer};
use serde_json::json;

use super::{LIMIT, api_error, configmap, eventually, fresh_namespace};

/// DELETE of an object with a finalizer sets `deletionTimestamp` (a
/// `MODIFIED` event) and keeps it; new finalizers are then refused (422),
/// other changes are not; removing the last finalizer deletes it (a
/// `DELETED` event).
pub async fn deletion_waits_for_finalizers(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let mut cm = configmap("held", &[("v", "1")]);
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = api
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = api
        .watch(
            &WatchParams::default()
                .fields("metadata.name=held")
                .timeout(60),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();

    let deleted = api
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let deleting = deleted.left().expect("the object, still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let got = api.get("held").await.expect("still there");
    assert!(got.metadata.deletion_timestamp.is_some());
    assert_eq!(got.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(got.finalizers(), ["example.com/hold"]);

    let (code, reason) = api_error(
        "a new finalizer on a deleting object",
        api.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "finalizers": ["example.com/hold", "example.com/late"] } }),
            ),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .expect("other changes are allowed while deleting");
    // A second delete changes nothing.
    let again = api
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete again");
    assert_eq!(
        again
            .left()
            .expect("still there")
            .metadata
            .deletion_timestamp,
        got.metadata.deletion_timestamp
    );

    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .expect("remove the finalizer");
    assert!(api.get_opt("held").await.expect("get_opt").is_none());

    let mut seen = Vec::new();
    let read = async {
        while seen.len() < 3 {
            match events.try_next().await.expect("watch").expect("open") {
                WatchEvent::Modified(cm) => seen.push(("MODIFIED", cm)),
                WatchEvent::Deleted(cm) => seen.push(("DELETED", cm)),
                WatchEvent::Bookmark(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    tokio::time::timeout(LIMIT, read)
        .await
        .expect("events in time");
    assert_eq!(seen[0].0, "MODIFIED");
    assert!(seen[0].1.metadata.deletion_timestamp.is_some());
    assert_eq!(seen[1].0, "MODIFIED");
    assert_eq!(seen[2].0, "DELETED");
}

/// DELETE with a stale resourceVersion or a wrong uid precondition is 409.
pub async fn deletion_preconditions_conflict(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let created = api
        .create(&PostParams::default(), &configmap("preconditioned", &[]))
        .await
        .expect("create");
    api.patch(
        "preconditioned",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: created.metadata.resource_version.clone(),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let (code, reason) = api_error(
        "stale precondition",
        api.delete("preconditioned", &stale).await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: None,
            uid: Some("00000000-0000-4000-8000-000000000000".into()),
        }),
        ..DeleteParams::default()
    };
    let (code, _) = api_error(
        "wrong uid precondition",
        api.delete("preconditioned", &wrong_uid).await,
    );
    assert_eq!(code, 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: None,
            uid: created.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    api.delete("preconditioned", &right)
        .await
        .expect("matching precondition");
    assert!(api.get_opt("preconditioned").await.unwrap().is_none());
}

/// kube-runtime's `finalizer` helper: the first call adds the finalizer
/// (a JSON patch whose `test` of a missing path against `null` must pass),
/// the next runs `Apply`, and after DELETE it runs `Cleanup` and removes
/// the finalizer, which deletes the object.
pub async fn finalizer_helper_flow(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    const NAME: &str = "conformance.example.com/cleanup";
    api.create(&PostParams::default(), &configmap("finalized", &[]))
        .await
        .expect("create");
    let applies = Arc::new(AtomicUsize::new(0));
    let cleanups = Arc::new(AtomicUsize::new(0));
    let run = async |api: &Api<ConfigMap>| {
        let obj = Arc::new(api.get("finalized").await.expect("get"));
        let (applies, cleanups) = (applies.clone(), cleanups.clone());
        finalizer(api, NAME, obj, |event| async move {
            match event {
                Event::Apply(_) => applies.fetch_add(1, Ordering::SeqCst),
                Event::Cleanup(_) => cleanups.fetch_add(1, Ordering::SeqCst),
            };
            Ok::<_, kube_client::Error>(Action::await_change())
        })
        .await
        .expect("the finalizer helper succeeds")
    };
    run(&api).await;
    assert_eq!(api.get("finalized").await.unwrap().finalizers(), [NAME]);
    assert_eq!(applies.load(Ordering::SeqCst), 0);
    run(&api).await;
    assert_eq!(applies.load(Ordering::SeqCst), 1);

    // With another finalizer first, the helper's index-based `test` must
    // match the right entry.
    api.patch(
        "finalized",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": ["example.com/other", NAME] } })),
    )
    .await
    .unwrap();
    api.delete("finalized", &DeleteParams::default())
        .await
        .expect("delete");
    run(&api).await;
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    let left = api
        .get("finalized")
        .await
        .expect("held by the other finalizer");
    assert_eq!(left.finalizers(), ["example.com/other"]);
    api.patch(
        "finalized",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": [] } })),
    )
    .await
    .unwrap();
    assert!(api.get_opt("finalized").await.unwrap().is_none());
}

/// Deleting a namespace deletes what is in it, then the namespace; then
/// creating in it is 404.
///
/// On a real cluster this is the work of kube-controller-manager's
/// namespace controller: a bare kube-apiserver leaves the namespace
/// `Terminating`, and this check fails there (it is not part of
/// [`all`](super::all)).
pub async fn namespace_deletion_removes_its_objects(client: Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let doomed = fresh_namespace(&client, &format!("{ns}-gone")).await;
    let got = namespaces.get(&doomed).await.expect("the new namespace");
    assert_eq!(got.status.and_then(|s| s.phase).as_deref(), Some("Active"));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &doomed);
    api.create(&PostParams::default(), &configmap("inside", &[]))
        .await
        .expect("create inside");
    namespaces
        .delete(&doomed, &DeleteParams::default())
        .await
        .expect("delete the namespace");
    eventually("the namespace to go", || {
        let namespaces = namespaces.clone();
        let doomed = doomed.clone();
        async move {
            namespaces
                .get_opt(&doomed)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        }
    })
    .await;
    let listed = api.list(&ListParams::default()).await.expect("list");
    assert!(listed.items.is_empty(), "{:?}", listed.items);
    let (code, _) = api_error(
        "create in a deleted namespace",
        api.create(&PostParams::default(), &configmap("late", &[]))
            .await,
    );
    assert_eq!(code, 404);
}
