//! Custom resources: a CRD created through the API, then its objects.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube_client::{Client, ResourceExt};
use serde_json::json;

use super::{api_error, eventually};

/// The CRD of kind `Widget` in `group`: namespaced, `v1`, with the status
/// subresource and a schema that keeps whatever `spec` and `status` hold.
pub fn widget_crd(group: &str) -> CustomResourceDefinition {
    let open = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{group}") },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": open, "status": open },
                } },
                "subresources": { "status": {} },
            }],
        },
    }))
    .expect("a valid CRD")
}

fn widgets(group: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// A CRD created through the API is established and serves its kind:
/// custom resources get generation 1, grow it on spec changes only, keep
/// `.status` for the status subresource, refuse updates without a
/// resourceVersion (422) and strategic merge patches (415). Deleting the
/// CRD deletes its custom resources and stops serving the kind.
pub async fn custom_resources_through_a_crd(client: Client, ns: &str) {
    let group = format!("{ns}.conformance.example.com");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd_name = format!("widgets.{group}");
    let created = crds
        .create(&PostParams::default(), &widget_crd(&group))
        .await
        .expect("create the CRD");
    assert_eq!(created.metadata.generation, Some(1));
    eventually("the CRD to be established", || {
        let crds = crds.clone();
        let name = crd_name.clone();
        async move { crds.get(&name).await.ok().filter(established) }
    })
    .await;
    let ar = widgets(&group);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    // A real server may answer 404 for a moment after Established.
    eventually("the custom resource API", || {
        let api = api.clone();
        async move { api.list(&ListParams::default()).await.ok() }
    })
    .await;

    let w = DynamicObject::new("w1", &ar).data(json!({
        "spec": { "size": 1 },
        "status": { "ready": true },
    }));
    let created = api
        .create(&PostParams::default(), &w)
        .await
        .expect("create a widget");
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.data.get("status"), None, "create drops .status");
    assert_eq!(created.data["spec"]["size"], 1);

    let mut bigger = created.clone();
    bigger.data["spec"]["size"] = json!(2);
    let replaced = api
        .replace("w1", &PostParams::default(), &bigger)
        .await
        .expect("replace");
    assert_eq!(replaced.metadata.generation, Some(2));

    let mut blind = replaced.clone();
    blind.metadata.resource_version = None;
    let (code, reason) = api_error(
        "custom resource replace without a resourceVersion",
        api.replace("w1", &PostParams::default(), &blind).await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));

    let pp = PatchParams::default();
    let with_status = api
        .patch_status(
            "w1",
            &pp,
            &Patch::Merge(json!({ "status": { "ready": true } })),
        )
        .await
        .expect("patch status");
    assert_eq!(with_status.data["status"]["ready"], true);
    assert_eq!(with_status.metadata.generation, Some(2));

    let ignored = api
        .patch(
            "w1",
            &pp,
            &Patch::Merge(
                json!({ "status": { "ready": false }, "metadata": { "labels": { "l": "1" } } }),
            ),
        )
        .await
        .expect("patch the object");
    assert_eq!(
        ignored.data["status"]["ready"], true,
        "object writes keep .status"
    );
    assert_eq!(ignored.labels()["l"], "1");
    assert_eq!(ignored.metadata.generation, Some(2));

    let (code, _) = api_error(
        "strategic merge on a custom resource",
        api.patch(
            "w1",
            &pp,
            &Patch::Strategic(json!({ "spec": { "size": 3 } })),
        )
        .await,
    );
    assert_eq!(code, 415);

    let by_name = api
        .list(&ListParams::default().fields("metadata.name=w1"))
        .await
        .expect("field selector on a custom resource");
    assert_eq!(by_name.items.len(), 1);
    let everywhere: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    assert_eq!(
        everywhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    api.create(
        &PostParams::default(),
        &DynamicObject::new("w2", &ar).data(json!({ "spec": {} })),
    )
    .await
    .expect("a second widget");
    api.delete("w1", &DeleteParams::default())
        .await
        .expect("delete a widget");
    assert!(api.get_opt("w1").await.unwrap().is_none());

    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .expect("delete the CRD");
    eventually("the CRD to go", || {
        let crds = crds.clone();
        let name = crd_name.clone();
        async move { crds.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await;
    eventually("the kind to stop being served", || {
        let api = api.clone();
        async move {
            match api.list(&ListParams::default()).await {
                Err(kube_client::Error::Api(s)) if s.code == 404 => Some(()),
                _ => None,
            }
        }
    })
    .await;
}
