//! The `Controller` end to end against an API server: owned children, a
//! mapper, kube-runtime's finalizer helper, a change overtaking a
//! 1,000-object backlog, against every backend `TEST_CLUSTER` selects (the
//! local API server and a real kube-apiserver, through `kube-test-cluster`);
//! and, on a local API server of their own (they need its fault injection
//! and request counts, which act on the whole server), a 410 re-list and
//! zero GETs while reconciling.
//!
//! Each case is a function of a `Client` and a namespace and changes objects
//! only through the API.

use crate::eventually;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_client::{Api, Client, ResourceExt};
use kube_local_apiserver::{LocalApiServer, Verb};
use kube_runtime::finalizer::{Event as Finalizer, finalizer};
use kube_runtime::watcher;
use kube_test_cluster::for_each_backend;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_workqueue_kube::{Action, Controller};

const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct TestError(String);

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TestError {}

/// One reconcile: name, start, end, and the value of `data.v` it saw.
type Run = (String, Instant, Option<Instant>, Option<String>);

/// Every reconcile's start and end, written by the reconcile itself.
#[derive(Default)]
struct Record {
    runs: Mutex<Vec<Run>>,
    in_flight: Mutex<HashMap<String, usize>>,
    overlaps: Mutex<Vec<String>>,
}

impl Record {
    fn start(&self, cm: &ConfigMap) -> usize {
        let name = cm.name_any();
        let v = cm.data.as_ref().and_then(|d| d.get("v").cloned());
        let n = {
            let mut in_flight = self.in_flight.lock().unwrap();
            let n = in_flight.entry(name.clone()).or_default();
            *n += 1;
            *n
        };
        if n > 1 {
            self.overlaps.lock().unwrap().push(name.clone());
        }
        let mut runs = self.runs.lock().unwrap();
        runs.push((name, Instant::now(), None, v));
        runs.len() - 1
    }

    fn end(&self, index: usize) {
        let mut runs = self.runs.lock().unwrap();
        runs[index].2 = Some(Instant::now());
        *self
            .in_flight
            .lock()
            .unwrap()
            .get_mut(&runs[index].0)
            .unwrap() -= 1;
    }

    fn names(&self) -> Vec<String> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.0.clone())
            .collect()
    }

    fn count(&self, name: &str) -> usize {
        self.names().iter().filter(|n| *n == name).count()
    }

    fn saw(&self, name: &str, v: &str) -> bool {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.0 == name && r.3.as_deref() == Some(v))
    }
}

fn cm(name: &str, v: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(BTreeMap::from([("v".to_string(), v.to_string())]));
    cm
}

/// Runs a controller on a task; the returned sender stops it gracefully.
fn spawn<S>(stream: S) -> JoinHandle<Vec<String>>
where
    S: futures::Stream + Send + 'static,
    S::Item: std::fmt::Debug,
{
    tokio::spawn(stream.map(|r| format!("{r:?}")).collect::<Vec<_>>())
}

fn error_policy<K>(_: Arc<K>, _: &TestError, _: Arc<Record>) -> Action {
    Action::requeue(Duration::from_millis(50))
}

/// A reconcile that records, then waits `pause`.
fn recording(
    pause: Duration,
) -> impl FnMut(
    Arc<ConfigMap>,
    Arc<Record>,
) -> futures::future::BoxFuture<'static, Result<Action, TestError>> {
    move |cm, record| {
        Box::pin(async move {
            let i = record.start(&cm);
            tokio::time::sleep(pause).await;
            record.end(i);
            Ok(Action::await_change())
        })
    }
}

// ------------------------------------------------------------------ cases

/// A change to an owned child reconciles its owner.
async fn owned_child_triggers_owner_case(client: Client, ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let owner = cms
        .create(&PostParams::default(), &cm("owner", "1"))
        .await
        .unwrap();
    let mut child = Secret::default();
    child.metadata.name = Some("child".into());
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.uid().unwrap(),
        controller: Some(true),
        ..Default::default()
    }]);
    secrets
        .create(&PostParams::default(), &child)
        .await
        .unwrap();

    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .owns(secrets.clone(), watcher::Config::default())
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(recording(Duration::ZERO), error_policy, record.clone()),
    );
    eventually(LIMIT, "the owner's first reconcile", || {
        record.count("owner") >= 1
    })
    .await;
    // Let the children's initial list settle before changing the child.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = record.count("owner");
    secrets
        .patch(
            "child",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"k": "changed"}})),
        )
        .await
        .unwrap();
    eventually(LIMIT, "the owner reconciled for its child's change", || {
        record.count("owner") > before
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    assert!(record.overlaps.lock().unwrap().is_empty());
}

/// `watches` with a mapper: a Secret labelled `for=NAME` triggers NAME.
async fn mapper_triggers_keys_case(client: Client, ns: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    cms.create(&PostParams::default(), &cm("target", "1"))
        .await
        .unwrap();
    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let namespace = ns.to_string();
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .watches(
                secrets.clone(),
                watcher::Config::default(),
                move |s: Secret| {
                    s.labels().get("for").map(|name| {
                        kube_runtime::reflector::ObjectRef::new(name).within(&namespace)
                    })
                },
            )
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(recording(Duration::ZERO), error_policy, record.clone()),
    );
    eventually(LIMIT, "the first reconcile", || record.count("target") >= 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = record.count("target");
    let mut s = Secret::default();
    s.metadata.name = Some("pointer".into());
    s.metadata.labels = Some(BTreeMap::from([("for".to_string(), "target".to_string())]));
    secrets.create(&PostParams::default(), &s).await.unwrap();
    eventually(LIMIT, "the mapped key reconciled", || {
        record.count("target") > before
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
}

/// kube-runtime's finalizer helper: the finalizer is added on the first
/// reconcile, a deletion runs the clean-up once, and the object goes.
async fn finalizer_flow_case(client: Client, ns: &str) {
    const NAME: &str = "example.test/cleanup";
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    cms.create(&PostParams::default(), &cm("guarded", "1"))
        .await
        .unwrap();
    let cleanups = Arc::new(Mutex::new(0usize));
    let applies = Arc::new(Mutex::new(0usize));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (api, c, a) = (cms.clone(), cleanups.clone(), applies.clone());
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(
                move |obj: Arc<ConfigMap>, _ctx: Arc<()>| {
                    let (api, c, a) = (api.clone(), c.clone(), a.clone());
                    async move {
                        finalizer(&api, NAME, obj, |event| async move {
                            match event {
                                Finalizer::Apply(_) => *a.lock().unwrap() += 1,
                                Finalizer::Cleanup(_) => *c.lock().unwrap() += 1,
                            }
                            Ok::<_, TestError>(Action::await_change())
                        })
                        .await
                        .map_err(|e| TestError(e.to_string()))
                    }
                },
                |_, _: &TestError, _| Action::requeue(Duration::from_millis(50)),
                Arc::new(()),
            ),
    );
    let deadline = Instant::now() + LIMIT;
    loop {
        let got = cms.get("guarded").await.unwrap();
        if got.finalizers().iter().any(|f| f == NAME) && *applies.lock().unwrap() >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the finalizer was never added");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cms.delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    while cms.get_opt("guarded").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the object was never removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*cleanups.lock().unwrap(), 1, "clean-up ran once");
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
}

/// A change made while 1,000 listed objects wait is reconciled within the
/// first few, not after the backlog.
async fn change_overtakes_backlog_case(
    client: Client,
    ns: &str,
    seed: impl AsyncFnOnce(&Api<ConfigMap>),
) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    seed(&cms).await;
    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .concurrency(2)
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(
                recording(Duration::from_millis(2)),
                error_policy,
                record.clone(),
            ),
    );
    eventually(LIMIT, "the backlog started", || !record.names().is_empty()).await;
    cms.patch(
        "bulk-999",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "changed"}})),
    )
    .await
    .unwrap();
    eventually(LIMIT, "the change reconciled", || {
        record.saw("bulk-999", "changed")
    })
    .await;
    let position = record
        .runs
        .lock()
        .unwrap()
        .iter()
        .position(|r| r.0 == "bulk-999" && r.3.as_deref() == Some("changed"))
        .unwrap();
    assert!(
        position < 200,
        "the change waited behind {position} listed objects"
    );
    // No key reconciled twice at once, then drain the rest.
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    assert!(record.overlaps.lock().unwrap().is_empty());
}

// ---------------------------------------------------------- every backend

/// Creates `bulk-0` .. `bulk-999` through the API, 16 at a time.
async fn seed_backlog(cms: &Api<ConfigMap>) {
    futures::stream::iter(0..1000)
        .for_each_concurrent(16, |i| async move {
            cms.create(&PostParams::default(), &cm(&format!("bulk-{i}"), "0"))
                .await
                .unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_child_triggers_owner() {
    for_each_backend("owns", |ns| async move {
        owned_child_triggers_owner_case(ns.client(), ns.name()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapper_triggers_keys() {
    for_each_backend("watches", |ns| async move {
        mapper_triggers_keys_case(ns.client(), ns.name()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizer_flow() {
    for_each_backend("finalizer", |ns| async move {
        finalizer_flow_case(ns.client(), ns.name()).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_overtakes_backlog() {
    for_each_backend("backlog", |ns| async move {
        change_overtakes_backlog_case(ns.client(), ns.name(), seed_backlog).await
    })
    .await;
}

// ------------------------------------------------ a local server of its own

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_overtakes_backlog_with_zero_gets_local() {
    let server = LocalApiServer::start().await;
    change_overtakes_backlog_case(server.client(), "default", async |_: &Api<ConfigMap>| {
        for i in 0..1000 {
            let mut c = cm(&format!("bulk-{i}"), "0");
            c.metadata.namespace = Some("default".into());
            server.upsert(&c).unwrap();
        }
    })
    .await;
    // Reconciles read the store: not one GET of a ConfigMap.
    assert_eq!(server.requests().of(Verb::Get, "configmaps"), 0);
}

/// After a 410 Gone the watcher re-lists: every object comes again with its
/// old resourceVersion (low priority), so a change made then goes first,
/// and no key is reconciled twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_is_low_priority_local() {
    let server = LocalApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..300 {
        let mut c = cm(&format!("obj-{i}"), "0");
        c.metadata.namespace = Some("default".into());
        server.upsert(&c).unwrap();
    }
    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .concurrency(1)
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(
                recording(Duration::from_millis(1)),
                error_policy,
                record.clone(),
            ),
    );
    eventually(LIMIT, "the initial list reconciled", || {
        record.names().len() >= 300
    })
    .await;
    assert!(server.wait_for_watches(1, LIMIT).await);
    let listed = record.names().len();
    server.expire_watches();
    // The re-list brings all 300 again; a change made now must not wait.
    cms.patch(
        "obj-299",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "changed"}})),
    )
    .await
    .unwrap();
    eventually(LIMIT, "the change reconciled", || {
        record.saw("obj-299", "changed")
    })
    .await;
    let after: Vec<String> = record.names()[listed..].to_vec();
    let position = after.iter().position(|n| n == "obj-299").unwrap();
    assert!(
        position < 20,
        "the change waited behind {position} re-listed keys"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    assert!(record.overlaps.lock().unwrap().is_empty());
    assert_eq!(server.requests().of(Verb::Get, "configmaps"), 0);
}

/// A trigger backoff that waits a minute and counts how often it was asked.
struct MinuteBackoff(Arc<std::sync::atomic::AtomicUsize>);

impl Iterator for MinuteBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(Duration::from_secs(60))
    }
}

impl kube_runtime::utils::Backoff for MinuteBackoff {
    fn reset(&mut self) {}
}

/// A 410 Gone in a watch re-lists at once: it neither waits out the trigger
/// backoff nor advances it (the chaos soak found recoveries of 10 to 15 s
/// after network cuts from that wait). With a backoff of a minute, a change
/// made after the compaction is reconciled well within the test's limit,
/// after exactly one more list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_does_not_wait_out_the_trigger_backoff_local() {
    let server = LocalApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(&PostParams::default(), &cm("obj", "0"))
        .await
        .unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .trigger_backoff(MinuteBackoff(asked.clone()))
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(recording(Duration::ZERO), error_policy, record.clone()),
    );
    eventually(LIMIT, "the first reconcile", || record.saw("obj", "0")).await;
    assert!(server.wait_for_watches(1, LIMIT).await);
    let lists = server.requests().of(Verb::List, "configmaps");
    server.expire_watches();
    cms.patch(
        "obj",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    eventually(LIMIT, "the change after the 410 reconciled", || {
        record.saw("obj", "1")
    })
    .await;
    assert_eq!(server.requests().of(Verb::List, "configmaps"), lists + 1);
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the 410 advanced the trigger backoff"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
}
