//! `/metrics` behind the API server's own authentication and authorization
//! (`Manager::secure_metrics`), on the real kube-apiserver of
//! `kube-test-cluster` (the local API server does not serve TokenReview and
//! SubjectAccessReview): no token or a bad one 401, a ServiceAccount without
//! the right 403, one bound to a ClusterRole that grants `get` on
//! `/metrics` 200; the probes stay open.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kube_test_cluster::{Backend, TestNamespace, backends};
use tokio_workqueue_kube::Manager;

use crate::manager_common::{Running, http};

async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> u16 {
    http(addr, "GET", path, token).await.0
}

async fn service_account_token(client: &Client, ns: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let mut account = ServiceAccount::default();
    account.metadata.name = Some(name.into());
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let requested = accounts
        .create_token_request(name, &PostParams::default(), &TokenRequest::default())
        .await
        .unwrap();
    requested.status.unwrap().token.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_metrics_asks_the_api_server_who_may_read_them() {
    if !backends().contains(&Backend::Real) {
        eprintln!("TEST_CLUSTER excludes the real cluster: TokenReview needs it");
        return;
    }
    let ns = TestNamespace::new(Backend::Real, "metrics-auth").await;
    let client = ns.client();
    let reader = service_account_token(&client, ns.name(), "reader").await;
    let stranger = service_account_token(&client, ns.name(), "stranger").await;
    let role = format!("{}-metrics-reader", ns.name());
    let mut cluster_role = ClusterRole::default();
    cluster_role.metadata.name = Some(role.clone());
    cluster_role.rules = Some(vec![PolicyRule {
        non_resource_urls: Some(vec!["/metrics".into()]),
        verbs: vec!["get".into()],
        ..PolicyRule::default()
    }]);
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &cluster_role)
        .await
        .unwrap();
    let mut binding = ClusterRoleBinding::default();
    binding.metadata.name = Some(role.clone());
    binding.role_ref = RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "ClusterRole".into(),
        name: role.clone(),
    };
    binding.subjects = Some(vec![Subject {
        kind: "ServiceAccount".into(),
        name: "reader".into(),
        namespace: Some(ns.name().into()),
        ..Subject::default()
    }]);
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let mut manager = Manager::new(client.clone());
    manager.secure_metrics().serve("127.0.0.1:0").unwrap();
    #[cfg(feature = "prometheus")]
    manager.metrics(prometheus_client::registry::Registry::default());
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);

    assert_eq!(get(addr, "/metrics", None).await, 401);
    assert_eq!(get(addr, "/metrics", Some("not-a-token")).await, 401);
    assert_eq!(get(addr, "/metrics", Some(&stranger)).await, 403);
    let allowed = get(addr, "/metrics", Some(&reader)).await;
    // 200 with a registry; 404 (no registry) without the feature: either way
    // past authentication and authorization.
    assert!(allowed == 200 || allowed == 404, "{allowed}");
    // Cached: the same answers again.
    assert_eq!(get(addr, "/metrics", Some(&stranger)).await, 403);
    assert_eq!(get(addr, "/healthz", None).await, 200, "probes stay open");

    run.stop(Duration::from_secs(20)).await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(&role, &Default::default())
        .await;
    let _ = Api::<ClusterRole>::all(client)
        .delete(&role, &Default::default())
        .await;
}
