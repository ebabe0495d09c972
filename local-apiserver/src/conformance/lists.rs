//! Lists: pagination and selectors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube_client::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube_client::{Client, ResourceExt};
use serde_json::json;

use super::{api_error, configmap};

fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = configmap(name, &[]);
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm
}

/// `limit` and `continue` page through a list in name order, every page
/// carries the first page's resourceVersion, and an object created between
/// pages is not in them (the list is one consistent snapshot).
pub async fn pagination_is_consistent(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    for i in 0..25 {
        api.create(&pp, &labelled(&format!("page-{i:02}"), &[("pages", "yes")]))
            .await
            .expect("create");
    }
    let mut lp = ListParams::default().labels("pages=yes").limit(10);
    let first = api.list(&lp).await.expect("first page");
    assert_eq!(first.items.len(), 10);
    let rv = first.metadata.resource_version.clone();
    let mut token = first.metadata.continue_.clone().expect("a continue token");
    let mut names: Vec<String> = first.items.iter().map(ResourceExt::name_any).collect();

    // Created after the first page, named into a later page: not part of
    // this list.
    api.create(&pp, &labelled("page-15a", &[("pages", "yes")]))
        .await
        .expect("create between pages");

    let mut pages = 1;
    loop {
        lp = lp.continue_token(&token);
        let page = api.list(&lp).await.expect("next page");
        pages += 1;
        assert_eq!(page.metadata.resource_version, rv, "pages share a version");
        names.extend(page.items.iter().map(ResourceExt::name_any));
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = t,
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("page-{i:02}")).collect();
    assert_eq!(names, expected);

    let all = api
        .list(&ListParams::default().labels("pages=yes"))
        .await
        .expect("unpaged");
    assert_eq!(all.items.len(), 26);
    assert!(all.metadata.continue_.as_deref().unwrap_or("").is_empty());

    let (code, _) = api_error(
        "bad continue token",
        api.list(&ListParams::default().continue_token("not a token"))
            .await,
    );
    assert_eq!(code, 400);
}

/// Label selectors (`=`, `!=`, `in`, `notin`, exists, `!key`) and field
/// selectors (`metadata.name`, `metadata.namespace`); an unsupported field
/// is 400.
pub async fn label_and_field_selectors(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    api.create(
        &pp,
        &labelled(
            "sel-web",
            &[("sel", "y"), ("app", "web"), ("tier", "front")],
        ),
    )
    .await
    .unwrap();
    api.create(&pp, &labelled("sel-db", &[("sel", "y"), ("app", "db")]))
        .await
        .unwrap();
    api.create(&pp, &labelled("sel-none", &[("sel", "y")]))
        .await
        .unwrap();
    let names = |selector: &'static str| {
        let api = api.clone();
        async move {
            let mut n: Vec<String> = api
                .list(&ListParams::default().labels(&format!("sel=y,{selector}")))
                .await
                .unwrap_or_else(|e| panic!("{selector}: {e}"))
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            n.sort();
            n
        }
    };
    assert_eq!(names("app=web").await, ["sel-web"]);
    assert_eq!(names("app==web").await, ["sel-web"]);
    assert_eq!(names("app!=web").await, ["sel-db", "sel-none"]);
    assert_eq!(names("app in (web,db)").await, ["sel-db", "sel-web"]);
    assert_eq!(names("app notin (web)").await, ["sel-db", "sel-none"]);
    assert_eq!(names("app").await, ["sel-db", "sel-web"]);
    assert_eq!(names("!app").await, ["sel-none"]);
    assert_eq!(names("app=web,tier=front").await, ["sel-web"]);
    assert_eq!(names("app=web,tier=back").await, Vec::<String>::new());

    let by_name = api
        .list(&ListParams::default().fields("metadata.name=sel-db"))
        .await
        .expect("field selector");
    assert_eq!(by_name.items.len(), 1);
    assert_eq!(by_name.items[0].name_any(), "sel-db");
    let not_name = api
        .list(
            &ListParams::default()
                .labels("sel=y")
                .fields("metadata.name!=sel-db"),
        )
        .await
        .expect("field selector !=");
    assert_eq!(not_name.items.len(), 2);

    // Across namespaces, by namespace.
    let everywhere: Api<ConfigMap> = Api::all(client);
    let in_ns = everywhere
        .list(
            &ListParams::default()
                .labels("sel=y")
                .fields(&format!("metadata.namespace={ns}")),
        )
        .await
        .expect("all namespaces with a namespace field selector");
    assert_eq!(in_ns.items.len(), 3);
    assert!(
        in_ns
            .items
            .iter()
            .all(|c| c.namespace().as_deref() == Some(ns))
    );

    let (code, _) = api_error(
        "unsupported field",
        api.list(&ListParams::default().fields("data.x=1")).await,
    );
    assert_eq!(code, 400);
    let (code, _) = api_error(
        "bad label selector",
        api.list(&ListParams::default().labels("app in (web")).await,
    );
    assert_eq!(code, 400);

    let labels: BTreeMap<String, String> = api.get("sel-web").await.unwrap().labels().clone();
    assert_eq!(labels.len(), 3);
}

/// Pods are created `Pending` and can be selected by the fields Pods
/// declare (`spec.nodeName`, `status.phase`): an unscheduled Pod has an
/// empty `spec.nodeName`.
pub async fn pods_by_their_own_field_selectors(client: Client, ns: &str) {
    // JSON, not k8s-openapi's Pod: whether its spec is an Option depends
    // on the Kubernetes version k8s-openapi is built for.
    let ar = ApiResource::erase::<Pod>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    // A bare kube-apiserver (no controller-manager) has no `default`
    // ServiceAccount in a new namespace, and its ServiceAccount admission
    // refuses Pods without one.
    let accounts: Api<ServiceAccount> = Api::namespaced(client, ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": "default" } })).unwrap();
    match accounts.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create the default ServiceAccount: {e}"),
    }
    let pod = DynamicObject::new("unscheduled", &ar).data(json!({
        "spec": { "containers": [{ "name": "main", "image": "registry.example/app:1" }] },
    }));
    let created = api
        .create(&PostParams::default(), &pod)
        .await
        .expect("create a pod");
    assert_eq!(created.data["status"]["phase"], "Pending");
    let names = |fields: &'static str| {
        let api = api.clone();
        async move {
            api.list(&ListParams::default().fields(fields))
                .await
                .unwrap_or_else(|e| panic!("{fields}: {e}"))
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names("spec.nodeName=").await, ["unscheduled"]);
    assert!(names("spec.nodeName=node-1").await.is_empty());
    assert_eq!(names("status.phase=Pending").await, ["unscheduled"]);
    assert!(names("status.phase=Running").await.is_empty());
    api.delete("unscheduled", &Default::default())
        .await
        .expect("delete an unscheduled pod");
    assert!(api.get_opt("unscheduled").await.unwrap().is_none());
}
