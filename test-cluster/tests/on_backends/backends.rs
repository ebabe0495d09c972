//! The harness itself, on every selected backend: namespaces are created
//! through the API and keep tests apart, clients from the kubeconfig work,
//! CRDs install through apiextensions and their kinds are served at once,
//! and the real backend runs the pinned Kubernetes release.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube_client::{Api, Discovery};
use kube_test_cluster::{Backend, KUBERNETES_VERSION, backends, for_each_backend};
use serde_json::json;

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cm
}

#[tokio::test]
async fn each_test_gets_a_namespace_of_its_own() {
    for_each_backend("own-namespace", |ns| async move {
        let other = ns.another("own-namespace-other").await;
        assert_ne!(other, ns.name());
        ns.api::<ConfigMap>()
            .create(&PostParams::default(), &configmap("a"))
            .await
            .unwrap();
        let here = ns
            .api::<ConfigMap>()
            .list(&ListParams::default())
            .await
            .unwrap();
        let names: Vec<_> = here
            .items
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a"]);
        let there: Api<ConfigMap> = Api::namespaced(ns.client(), &other);
        assert!(
            there
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    })
    .await;
}

#[tokio::test]
async fn a_crd_is_installed_through_apiextensions_and_served_at_once() {
    for_each_backend("crd", |ns| async move {
        let crd = kube_local_apiserver::conformance::widget_crd("harness.example.com");
        let installed = ns.install_crd(&crd).await;
        let conditions = installed.status.unwrap().conditions.unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{conditions:?}"
        );
        // Installing again (another test of the binary) is fine.
        ns.install_crd(&crd).await;

        let gvk = GroupVersionKind::gvk("harness.example.com", "v1", "Widget");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
        let widgets: Api<DynamicObject> = Api::namespaced_with(ns.client(), ns.name(), &resource);
        let widget: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "harness.example.com/v1",
            "kind": "Widget",
            "metadata": { "name": "w" },
            "spec": { "size": 3 },
        }))
        .unwrap();
        widgets
            .create(&PostParams::default(), &widget)
            .await
            .unwrap();
        let got = widgets.get("w").await.unwrap();
        assert_eq!(got.data["spec"]["size"], 3);

        // Discovery lists the new kind too.
        let discovery = Discovery::new(ns.client())
            .filter(&["harness.example.com"])
            .run()
            .await
            .unwrap();
        assert!(discovery.has_group("harness.example.com"));
    })
    .await;
}

#[tokio::test]
async fn the_real_backend_runs_the_pinned_release() {
    if !backends().contains(&Backend::Real) {
        eprintln!("TEST_CLUSTER selects no real backend");
        return;
    }
    let client = kube_test_cluster::client(Backend::Real).await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, KUBERNETES_VERSION);
    let minor = KUBERNETES_VERSION.split('.').nth(1).unwrap();
    assert_eq!(version.minor, minor);
}
