//! The status subresource, on Deployments.
//!
//! Deployments are handled as JSON (`DynamicObject`): whether
//! `Deployment::spec` is an `Option` depends on the Kubernetes version
//! k8s-openapi is built for.

use k8s_openapi::api::apps::v1::Deployment;
use kube_client::Client;
use kube_client::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::api_error;

fn deployment(name: &str, ar: &ApiResource) -> DynamicObject {
    DynamicObject::new(name, ar).data(json!({
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "main", "image": "registry.example/app:1" }] },
            },
        },
        "status": { "replicas": 7 },
    }))
}

fn status_replicas(d: &DynamicObject) -> Option<i64> {
    d.data.pointer("/status/replicas").and_then(Value::as_i64)
}

fn spec_replicas(d: &DynamicObject) -> Option<i64> {
    d.data.pointer("/spec/replicas").and_then(Value::as_i64)
}

/// Create drops `.status`; `/status` writes change only `.status` (not the
/// spec, not labels, not `generation`); writes to the object keep the old
/// `.status` and bump `generation` when the spec (or, for a Deployment, its
/// annotations) changes, not when only labels do; `/status` writes conflict
/// on a stale resourceVersion.
pub async fn status_subresource_on_deployments(client: Client, ns: &str) {
    let ar = ApiResource::erase::<Deployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    let pp = PatchParams::default();
    let created = api
        .create(&PostParams::default(), &deployment("statusful", &ar))
        .await
        .expect("create");
    assert_eq!(status_replicas(&created), None, "create drops .status");
    assert_eq!(created.metadata.generation, Some(1));

    let with_status = api
        .patch_status(
            "statusful",
            &pp,
            &Patch::Merge(json!({
                "metadata": { "labels": { "from-status": "yes" } },
                "spec": { "replicas": 5 },
                "status": { "replicas": 3, "observedGeneration": 1 },
            })),
        )
        .await
        .expect("patch status");
    assert_eq!(status_replicas(&with_status), Some(3));
    assert_eq!(
        spec_replicas(&with_status),
        Some(1),
        "status writes keep the spec"
    );
    assert!(
        with_status
            .metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key("from-status")),
        "status writes keep the labels"
    );
    assert_eq!(with_status.metadata.generation, Some(1));

    let mut main = with_status.clone();
    main.data["spec"]["replicas"] = json!(2);
    main.data["status"]["replicas"] = json!(9);
    let replaced = api
        .replace("statusful", &PostParams::default(), &main)
        .await
        .expect("replace");
    assert_eq!(spec_replicas(&replaced), Some(2));
    assert_eq!(
        status_replicas(&replaced),
        Some(3),
        "object writes keep .status"
    );
    assert_eq!(replaced.metadata.generation, Some(2));

    let labelled = api
        .patch(
            "statusful",
            &pp,
            &Patch::Merge(json!({ "metadata": { "labels": { "extra": "label" } } })),
        )
        .await
        .expect("patch labels");
    assert_eq!(labelled.metadata.generation, Some(2), "labels are not spec");
    let annotated = api
        .patch(
            "statusful",
            &pp,
            &Patch::Merge(
                json!({ "metadata": { "annotations": { "note": "copied to replica sets" } } }),
            ),
        )
        .await
        .expect("patch annotations");
    assert_eq!(
        annotated.metadata.generation,
        Some(3),
        "a Deployment's annotations count as spec"
    );

    let mut stale = with_status;
    stale.data["status"]["replicas"] = json!(4);
    let (code, reason) = api_error(
        "stale status replace",
        api.replace_status("statusful", &PostParams::default(), &stale)
            .await,
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let status = api.get_status("statusful").await.expect("get status");
    assert_eq!(status_replicas(&status), Some(3));
}
