//! Request counts by verb and resource, and the backdoors: writes, reads,
//! removals and missed deletes without HTTP, and kinds registered by hand.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube_client::{Discovery, ResourceExt};
use kube_local_apiserver::{KindSpec, LocalApiServer, Verb};
use kube_runtime::{WatchStreamExt, watcher};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn requests_are_counted_by_verb_and_resource() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({ "metadata": { "name": "c" } })).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.get("c").await.unwrap();
    cms.get("missing").await.unwrap_err();
    cms.list(&ListParams::default()).await.unwrap();
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "a": "b" } })),
    )
    .await
    .unwrap();
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::erase::<Deployment>(&()),
    );
    deployments.get_status("nope").await.unwrap_err();
    // Discovery is not counted.
    client.apiserver_version().await.expect("/version");
    Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");

    let c = server.requests();
    assert_eq!(c.of(Verb::Create, "configmaps"), 1, "{c}");
    assert_eq!(c.of(Verb::Get, "configmaps"), 2, "{c}");
    assert_eq!(c.of(Verb::List, "configmaps"), 1, "{c}");
    assert_eq!(c.of(Verb::Patch, "configmaps"), 1, "{c}");
    assert_eq!(c.of(Verb::Delete, "configmaps"), 1, "{c}");
    assert_eq!(c.of(Verb::DeleteCollection, "configmaps"), 1, "{c}");
    assert_eq!(c.of(Verb::Get, "deployments/status"), 1, "{c}");
    assert_eq!(c.of(Verb::Get, "deployments"), 0, "{c}");
    assert_eq!(
        c.of_group(Verb::Get, "apps", "deployments/status"),
        1,
        "{c}"
    );
    assert_eq!(c.verb(Verb::Get), 3, "{c}");
    assert_eq!(c.resource("configmaps"), 7, "{c}");
    assert_eq!(c.total(), 8, "{c}");

    server.reset_requests();
    assert_eq!(server.requests().total(), 0);
    assert_eq!(server.main_endpoint().requests().total(), 0);
}

#[tokio::test]
async fn a_forgotten_object_is_a_missed_delete_that_a_relist_reveals() {
    let server = LocalApiServer::start().await;
    for name in ["keep", "lost"] {
        server
            .upsert(&json!({ "apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": { "name": name, "namespace": "default" } }))
            .unwrap();
    }
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .for_each(move |_| {
                let _ = tx.send(());
                async {}
            }),
    );
    for _ in 0..2 {
        tokio::time::timeout(LIMIT, rx.recv()).await.unwrap();
    }
    assert!(server.wait_for_watches(1, LIMIT).await);
    assert!(server.forget("v1", "ConfigMap", Some("default"), "lost"));
    assert!(!server.forget("v1", "ConfigMap", Some("default"), "lost"));
    assert_eq!(server.object_names("v1", "ConfigMap"), ["default/keep"]);
    // Nothing reaches the watch.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), rx.recv())
            .await
            .is_err()
    );
    task.abort();
}

#[tokio::test]
async fn backdoor_writes_follow_the_api_rules_and_remove_ignores_finalizers() {
    let server = LocalApiServer::start().await;
    let stored = server
        .upsert(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "b", "namespace": "fresh", "finalizers": ["example.com/f"] },
            "data": { "v": "1" },
        }))
        .expect("upsert creates, namespace included");
    assert!(stored["metadata"]["uid"].is_string());
    assert!(server.object("v1", "Namespace", None, "fresh").is_some());
    let again = server
        .upsert(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "b", "namespace": "fresh", "finalizers": ["example.com/f"] },
            "data": { "v": "2" },
        }))
        .unwrap();
    assert_eq!(again["metadata"]["uid"], stored["metadata"]["uid"]);
    assert_eq!(
        server
            .object("v1", "ConfigMap", Some("fresh"), "b")
            .unwrap()["data"]["v"],
        "2"
    );
    let bad = server.upsert(&json!({ "apiVersion": "v1", "kind": "ConfigMap",
                                     "metadata": { "name": "Bad_Name", "namespace": "fresh" } }));
    assert_eq!(bad.unwrap_err().code, 422);
    assert_eq!(
        server
            .upsert(&json!({ "kind": "ConfigMap" }))
            .unwrap_err()
            .code,
        400
    );

    // With the status subresource, upsert writes .status too.
    let d = server
        .upsert(&json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "d", "namespace": "default" },
            "spec": { "replicas": 1 },
            "status": { "replicas": 1 },
        }))
        .unwrap();
    assert_eq!(d["status"]["replicas"], 1);

    assert!(server.remove("v1", "ConfigMap", Some("fresh"), "b"));
    assert!(
        server
            .object("v1", "ConfigMap", Some("fresh"), "b")
            .is_none()
    );
    assert!(!server.remove("v1", "ConfigMap", Some("fresh"), "b"));
    assert!(!server.remove("v9", "Nothing", None, "x"));
}

#[tokio::test]
async fn a_registered_kind_is_served_and_discovered() {
    let server = LocalApiServer::start().await;
    server.register(
        KindSpec::cluster("example.com", "v1alpha1", "Gadget", "gadgets").with_status_subresource(),
    );
    let ar = ApiResource {
        group: "example.com".into(),
        version: "v1alpha1".into(),
        api_version: "example.com/v1alpha1".into(),
        kind: "Gadget".into(),
        plural: "gadgets".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(server.client(), &ar);
    let g = api
        .create(
            &PostParams::default(),
            &DynamicObject::new("g", &ar).data(json!({ "spec": { "x": 1 } })),
        )
        .await
        .expect("create a registered kind");
    assert_eq!(g.namespace(), None);
    let discovery = Discovery::new(server.client()).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "example.com")
        .expect("the group is discovered");
    let (found, caps) = group
        .recommended_resources()
        .into_iter()
        .find(|(r, _)| r.plural == "gadgets")
        .expect("the kind is discovered");
    assert_eq!(found.kind, "Gadget");
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "gadgets/status" || r.plural == "status")
    );
}
