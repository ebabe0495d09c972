//! Single-object verbs: create, get, replace, patch, and what the server
//! owns in metadata.

use std::collections::BTreeMap;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube_client::{Client, Error, ResourceExt};
use serde_json::json;

use super::{LIMIT, api_error, configmap};

/// Create sets uid, creationTimestamp and resourceVersion (no generation on
/// a ConfigMap); a second create is 409 AlreadyExists; `generateName` makes
/// a name; get of a missing object is 404 NotFound; replace and delete
/// work; the deleted object is gone.
pub async fn create_get_replace_delete(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let created = api
        .create(&pp, &configmap("crud", &[("a", "1")]))
        .await
        .expect("create");
    let meta = &created.metadata;
    assert!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "{meta:?}"
    );
    assert!(meta.creation_timestamp.is_some(), "{meta:?}");
    assert!(meta.resource_version.is_some(), "{meta:?}");
    assert_eq!(meta.namespace.as_deref(), Some(ns));
    assert_eq!(meta.generation, None, "ConfigMaps keep no generation");

    let (code, reason) = api_error(
        "second create",
        api.create(&pp, &configmap("crud", &[])).await,
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let generated = api
        .create(
            &pp,
            &ConfigMap {
                metadata: ObjectMeta {
                    generate_name: Some("gen-".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("create with generateName");
    let name = generated.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let got = api.get("crud").await.expect("get");
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let (code, reason) = api_error("get missing", api.get("no-such-object").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert!(
        api.get_opt("no-such-object")
            .await
            .expect("get_opt")
            .is_none()
    );

    let mut changed = got.clone();
    changed.data = Some(BTreeMap::from([("a".into(), "2".into())]));
    let replaced = api.replace("crud", &pp, &changed).await.expect("replace");
    assert_eq!(replaced.data.as_ref().unwrap()["a"], "2");
    assert_ne!(
        replaced.metadata.resource_version,
        got.metadata.resource_version
    );
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    assert_eq!(
        replaced.metadata.creation_timestamp,
        created.metadata.creation_timestamp
    );

    // The body's name must be the URL's.
    let mut renamed = replaced.clone();
    renamed.metadata.name = Some("other".into());
    let (code, _) = api_error("replace renamed", api.replace("crud", &pp, &renamed).await);
    assert_eq!(code, 400);

    api.delete("crud", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(api.get_opt("crud").await.expect("get_opt").is_none());
    let (code, _) = api_error(
        "delete missing",
        api.delete("crud", &DeleteParams::default()).await,
    );
    assert_eq!(code, 404);

    // A body with a resourceVersion cannot be created: a real kube-apiserver
    // answers 500 with no reason (its etcd3 store's error is not mapped to
    // a 4xx), so a client that retries 5xx would retry this forever.
    let mut with_rv = configmap("with-rv", &[]);
    with_rv.metadata.resource_version = Some("1".into());
    match api.create(&pp, &with_rv).await {
        Err(Error::Api(status)) => assert_eq!(
            (status.code, status.reason.as_str(), status.message.as_str()),
            (
                500,
                "",
                "resourceVersion should not be set on objects to be created"
            ),
            "create with a resourceVersion"
        ),
        other => panic!("create with a resourceVersion: expected an API error, got {other:?}"),
    }

    // Names are validated.
    let (code, reason) = api_error(
        "invalid name",
        api.create(&pp, &configmap("Not_A_Name", &[])).await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
}

/// Replace with a stale `metadata.resourceVersion` is 409 Conflict; without
/// one (a ConfigMap allows it) it is unconditional.
pub async fn replace_with_a_stale_resource_version_conflicts(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let first = api
        .create(&pp, &configmap("stale", &[("v", "1")]))
        .await
        .expect("create");
    let mut a = first.clone();
    a.data = Some(BTreeMap::from([("v".into(), "a".into())]));
    api.replace("stale", &pp, &a).await.expect("first writer");
    let mut b = first.clone();
    b.data = Some(BTreeMap::from([("v".into(), "b".into())]));
    let (code, reason) = api_error("stale replace", api.replace("stale", &pp, &b).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(api.get("stale").await.unwrap().data.unwrap()["v"], "a");

    b.metadata.resource_version = None;
    let forced = api
        .replace("stale", &pp, &b)
        .await
        .expect("unconditional replace");
    assert_eq!(forced.data.unwrap()["v"], "b");
}

/// A replace or patch that changes nothing makes no new resourceVersion.
pub async fn no_op_writes_make_no_new_version(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let created = api
        .create(&pp, &configmap("noop", &[("v", "1")]))
        .await
        .expect("create");
    let same = api
        .replace("noop", &pp, &created)
        .await
        .expect("replace unchanged");
    assert_eq!(
        same.metadata.resource_version,
        created.metadata.resource_version
    );
    let patched = api
        .patch(
            "noop",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "1" } })),
        )
        .await
        .expect("patch unchanged");
    assert_eq!(
        patched.metadata.resource_version,
        created.metadata.resource_version
    );
}

/// Merge, JSON (a failed `test` is 422), strategic merge and server-side
/// apply patches; a resourceVersion in a patch is a precondition (409); a
/// patch of a missing object is 404, an apply of one creates it.
pub async fn patches_of_every_type(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PatchParams::default();
    let created = api
        .create(
            &PostParams::default(),
            &configmap("patched", &[("a", "1"), ("b", "2")]),
        )
        .await
        .expect("create");

    let merged = api
        .patch(
            "patched",
            &pp,
            &Patch::Merge(json!({ "data": { "a": "10", "b": null, "c": "3" } })),
        )
        .await
        .expect("merge patch");
    let data = merged.data.clone().unwrap();
    assert_eq!(data.get("a").map(String::as_str), Some("10"));
    assert_eq!(data.get("b"), None);
    assert_eq!(data.get("c").map(String::as_str), Some("3"));

    let ops: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/data/a", "value": "10" },
        { "op": "replace", "path": "/data/a", "value": "11" },
        { "op": "add", "path": "/metadata/labels", "value": { "patched": "yes" } },
    ]))
    .unwrap();
    let jsoned = api
        .patch("patched", &pp, &Patch::Json::<()>(ops))
        .await
        .expect("JSON patch");
    assert_eq!(jsoned.data.as_ref().unwrap()["a"], "11");
    assert_eq!(jsoned.labels()["patched"], "yes");

    let failing: json_patch::Patch = serde_json::from_value(json!([
        { "op": "test", "path": "/data/a", "value": "wrong" },
        { "op": "replace", "path": "/data/a", "value": "12" },
    ]))
    .unwrap();
    let (code, reason) = api_error(
        "failed JSON patch test",
        api.patch("patched", &pp, &Patch::Json::<()>(failing)).await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(api.get("patched").await.unwrap().data.unwrap()["a"], "11");

    let strategic = api
        .patch(
            "patched",
            &pp,
            &Patch::Strategic(
                json!({ "metadata": { "finalizers": ["example.com/x"] }, "data": { "d": "4" } }),
            ),
        )
        .await
        .expect("strategic merge patch");
    assert_eq!(strategic.data.as_ref().unwrap()["d"], "4");
    assert_eq!(strategic.finalizers(), ["example.com/x"]);
    let strategic = api
        .patch(
            "patched",
            &pp,
            &Patch::Strategic(json!({ "metadata": { "finalizers": ["example.com/y"] } })),
        )
        .await
        .expect("strategic merge patch of finalizers");
    // A set, ordered as apimachinery's strategic merge orders it: the
    // patch's new item first where no shared item anchors it.
    assert_eq!(
        strategic.finalizers(),
        ["example.com/y", "example.com/x"],
        "finalizers merge as a set"
    );
    let strategic = api
        .patch(
            "patched",
            &pp,
            &Patch::Strategic(
                json!({ "metadata": { "finalizers": ["example.com/x", "example.com/w"] } }),
            ),
        )
        .await
        .expect("strategic merge patch of finalizers");
    assert_eq!(
        strategic.finalizers(),
        ["example.com/y", "example.com/x", "example.com/w"],
        "a shared finalizer anchors the order"
    );
    api.patch(
        "patched",
        &pp,
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .expect("clear finalizers");

    let stale = json!({ "metadata": { "resourceVersion": created.metadata.resource_version }, "data": { "a": "0" } });
    let (code, reason) = api_error(
        "patch with a stale resourceVersion",
        api.patch("patched", &pp, &Patch::Merge(stale)).await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    let (code, _) = api_error(
        "patch of a missing object",
        api.patch("no-such-cm", &pp, &Patch::Merge(json!({ "data": {} })))
            .await,
    );
    assert_eq!(code, 404);

    let apply = PatchParams::apply("conformance");
    let applied = api
        .patch(
            "applied",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "applied" },
                "data": { "x": "1" },
            })),
        )
        .await
        .expect("apply creates");
    assert_eq!(applied.data.as_ref().unwrap()["x"], "1");
    let first_uid = applied.metadata.uid.clone();
    assert!(first_uid.is_some());
    let applied = api
        .patch(
            "applied",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "applied", "labels": { "l": "v" } },
                "data": { "x": "2" },
            })),
        )
        .await
        .expect("apply updates");
    assert_eq!(applied.data.as_ref().unwrap()["x"], "2");
    assert_eq!(applied.labels()["l"], "v");
    assert_eq!(applied.metadata.uid, first_uid, "the same object");
}

/// ownerReferences are stored and returned; two controllers are 422.
pub async fn owner_references_are_kept_and_validated(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let parent = api
        .create(&pp, &configmap("owner", &[]))
        .await
        .expect("create owner");
    let reference = |name: &str, uid: &str, controller: bool| OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    };
    let uid = parent.metadata.uid.clone().unwrap();
    let mut child = configmap("owned", &[]);
    child.metadata.owner_references = Some(vec![reference("owner", &uid, true)]);
    let created = api.create(&pp, &child).await.expect("create child");
    let got = api.get("owned").await.unwrap();
    assert_eq!(
        got.metadata.owner_references,
        created.metadata.owner_references
    );
    assert_eq!(
        got.owner_references()[0].uid,
        uid,
        "{:?}",
        got.metadata.owner_references
    );

    let mut twice = configmap("owned-twice", &[]);
    twice.metadata.owner_references = Some(vec![
        reference("owner", &uid, true),
        reference("owned", got.metadata.uid.as_deref().unwrap(), true),
    ]);
    let (code, reason) = api_error("two controllers", api.create(&pp, &twice).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
}

/// `PartialObjectMetadata` gets, lists and watches return metadata only.
pub async fn metadata_only_requests(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let mut cm = configmap("meta-only", &[("big", "data")]);
    cm.metadata.labels = Some(BTreeMap::from([("meta".into(), "only".into())]));
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let meta = api.get_metadata("meta-only").await.expect("get_metadata");
    assert_eq!(meta.metadata.labels.as_ref().unwrap()["meta"], "only");
    let list = api
        .list_metadata(&ListParams::default().labels("meta=only"))
        .await
        .expect("list_metadata");
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("meta-only"));
    let rv = list.metadata.resource_version.expect("a list version");

    let mut events = api
        .watch_metadata(&WatchParams::default().labels("meta=only").timeout(60), &rv)
        .await
        .expect("watch_metadata")
        .boxed();
    let mut second = configmap("meta-only-2", &[("big", "data")]);
    second.metadata.labels = cm.metadata.labels.clone();
    api.create(&PostParams::default(), &second)
        .await
        .expect("create");
    let event = tokio::time::timeout(LIMIT, async {
        loop {
            match events.try_next().await.expect("watch").expect("open") {
                WatchEvent::Bookmark(_) => {}
                other => return other,
            }
        }
    })
    .await
    .expect("an event in time");
    match event {
        WatchEvent::Added(meta) => {
            assert_eq!(meta.metadata.name.as_deref(), Some("meta-only-2"));
            assert_eq!(
                meta.types.map(|t| t.kind).as_deref(),
                Some("PartialObjectMetadata")
            );
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}

/// ConfigMaps marked `immutable` refuse changes to their data (422) but
/// may still be relabelled or deleted.
pub async fn immutable_configmaps_refuse_changes(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let mut cm = configmap("frozen", &[("v", "1")]);
    cm.immutable = Some(true);
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let (code, reason) = api_error(
        "changing immutable data",
        api.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    api.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "still": "labellable" } } })),
    )
    .await
    .expect("metadata may change");
    api.delete("frozen", &DeleteParams::default())
        .await
        .expect("delete");
}

/// A Secret's `stringData` is stored base64-encoded in `data`.
pub async fn secrets_string_data(client: Client, ns: &str) {
    let api: Api<Secret> = Api::namespaced(client, ns);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("string-data".into()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("password".into(), "hunter2".into())])),
        ..Secret::default()
    };
    let created = api
        .create(&PostParams::default(), &secret)
        .await
        .expect("create");
    assert_eq!(created.string_data, None);
    assert_eq!(
        created.data.unwrap()["password"],
        ByteString(b"hunter2".to_vec())
    );
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
}
