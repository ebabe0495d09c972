//! The `Manager` end to end against every backend `TEST_CLUSTER` selects
//! (the local API server and a real kube-apiserver, through
//! `kube-test-cluster`): three controllers on shared caches under one
//! leader election reconcile their objects and a change, the probes answer,
//! and a shutdown drains them, releases the Lease and closes the endpoint.
//! (One watch per source is counted on a local server of its own, in
//! `tests/manager/manager.rs`, whose request counts see every request.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::api::{Patch, PatchParams};
use kube_client::{Api, Client, ResourceExt};
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;
use kube_test_cluster::for_each_backend;
use serde_json::json;
use tokio::time::Instant;
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
use tokio_workqueue_kube::{Action, Manager};

use crate::manager_common::{Running, configmaps_owning_secrets, get};

const LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct TestError;

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("test error")
    }
}

impl std::error::Error for TestError {}

/// Every reconcile: controller, name and the `data.v` it saw (ConfigMaps).
#[derive(Default)]
struct Seen(Mutex<Vec<(&'static str, String, Option<String>)>>);

impl Seen {
    fn has(&self, controller: &str, name: &str, v: Option<&str>) -> bool {
        self.0.lock().unwrap().iter().any(|(c, n, seen)| {
            *c == controller && n == name && (v.is_none() || seen.as_deref() == v)
        })
    }
}

fn policy<K>(_: Arc<K>, _: &TestError, _: Arc<Seen>) -> Action {
    Action::await_change()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn manager_case(client: Client, ns: &str) {
    configmaps_owning_secrets(&client, ns, 3).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);

    let seen = Arc::new(Seen::default());
    let mut manager = Manager::new(client.clone());
    manager
        .leader_election(LeaderElection::new(
            client.clone(),
            LeaseConfig::new("manager-test", ns, "only"),
        ))
        .unwrap();
    let wc = watcher::Config::default;
    let configmaps = manager
        .controller(cms.clone(), wc())
        .owns(secrets.clone(), wc())
        .run(
            |cm: Arc<ConfigMap>, seen: Arc<Seen>| async move {
                let v = cm.data.as_ref().and_then(|d| d.get("v").cloned());
                seen.0
                    .lock()
                    .unwrap()
                    .push(("configmaps", cm.name_any(), v));
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            seen.clone(),
        );
    let plain = manager.controller(secrets.clone(), wc()).run(
        |s: Arc<Secret>, seen: Arc<Seen>| async move {
            seen.0.lock().unwrap().push(("secrets", s.name_any(), None));
            Ok::<_, TestError>(Action::await_change())
        },
        policy,
        seen.clone(),
    );
    let mapped = manager
        .controller(secrets.clone(), wc())
        .watches(cms.clone(), wc(), |cm: ConfigMap| {
            let ns = cm.namespace().unwrap_or_default();
            Some(ObjectRef::new(&cm.name_any().replace("cm-", "secret-")).within(&ns))
        })
        .run(
            |s: Arc<Secret>, seen: Arc<Seen>| async move {
                seen.0.lock().unwrap().push(("mapped", s.name_any(), None));
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            seen.clone(),
        );
    manager
        .add("configmaps", configmaps)
        .unwrap()
        .add("secrets", plain)
        .unwrap()
        .add("mapped", mapped)
        .unwrap()
        .serve("127.0.0.1:0")
        .unwrap();
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);

    until("every controller reconciled every object", || {
        (0..3).all(|i| {
            seen.has("configmaps", &format!("cm-{i}"), None)
                && seen.has("secrets", &format!("secret-{i}"), None)
                && seen.has("mapped", &format!("secret-{i}"), None)
        })
    })
    .await;
    assert_eq!(get(addr, "/readyz").await.0, 200);
    assert_eq!(get(addr, "/healthz").await.0, 200);

    cms.patch(
        "cm-1",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    until("the change reconciled", || {
        seen.has("configmaps", "cm-1", Some("2"))
    })
    .await;

    run.stop(LIMIT).await;
    assert_eq!(get(addr, "/healthz").await.0, 0, "the endpoint is closed");
    let lease = Api::<Lease>::namespaced(client, ns)
        .get("manager-test")
        .await
        .unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert!(
        holder.as_deref().is_none_or(str::is_empty),
        "the Lease was released: {holder:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_runs_three_controllers_under_one_election_and_drains() {
    for_each_backend("manager", |ns| async move {
        manager_case(ns.client(), ns.name()).await
    })
    .await;
}
