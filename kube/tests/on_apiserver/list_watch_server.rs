//! End to end: a real `kube::Client` and kube-runtime `watcher` feeding a
//! queue through the adapter, with a key-only worker loop reconciling, against
//! every backend `TEST_CLUSTER` selects (the local API server and a real
//! kube-apiserver, through `kube-test-cluster`). Checks that every object is
//! reconciled through changes and deletes, that initial-list objects wait
//! behind fresh changes, and that no object is reconciled twice at once.
//!
//! Local only: a re-list after 410 Gone that reveals a missed delete. A
//! real API server can neither be made to expire a resourceVersion on
//! demand nor to lose an event, so that test runs on a local API server of
//! its own (its faults act on the whole server).
//!
//! Objects are written through the API on both backends. Each test's
//! ConfigMaps carry a label naming its namespace, and its watcher selects
//! on it: the watch spans all namespaces, as a controller's does, yet sees
//! only its own test's objects on a server shared by the binary.

use crate::eventually;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube_client::{Api, Client};
use kube_local_apiserver::Verb;
use kube_runtime::{WatchStreamExt, watcher};
use kube_test_cluster::{Backend, TestNamespace, backends, for_each_backend};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_workqueue::WorkQueue;
use tokio_workqueue_kube::{Action, Cause, EnqueueError, Enqueued, ObjectRef, WatchQueueExt};

type Key = ObjectRef<ConfigMap>;

/// The label that ties a ConfigMap to its test (value: the test's
/// namespace).
const TEST_LABEL: &str = "tokio-workqueue.test/run";

/// Creates or changes ConfigMap `ns/name` with `data` through the API
/// (server-side apply), labelled for the test `run`.
async fn apply(client: &Client, run: &str, ns: &str, name: &str, data: &[(&str, &str)]) {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": ns, "labels": { TEST_LABEL: run } },
        "data": data,
    });
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("kube-list-watch-server").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {ns}/{name}: {e}"));
}

/// Deletes ConfigMap `ns/name` through the API.
async fn delete(client: &Client, ns: &str, name: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {ns}/{name}: {e}"));
}

/// `namespace/name` of every ConfigMap of the test `run`, listed through
/// the API.
async fn object_names(client: &Client, run: &str) -> Vec<String> {
    Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{TEST_LABEL}={run}")))
        .await
        .expect("list the test's ConfigMaps")
        .items
        .iter()
        .map(|cm| {
            format!(
                "{}/{}",
                cm.metadata.namespace.as_deref().unwrap_or(""),
                cm.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// Every test is bounded in time.
const LIMIT: Duration = Duration::from_secs(60);

fn name_of(key: &Key) -> String {
    format!("{}/{}", key.namespace.as_deref().unwrap_or(""), key.name)
}

/// What the adapter reported: an added key, or an error as text.
type Report = Result<Enqueued<Key>, String>;

/// Runs a watcher on the ConfigMaps of the test `run`, in all namespaces,
/// into `queue`, forwarding the adapter's reports. Aborted by the test at
/// its end.
fn start_feeder(
    client: Client,
    run: &str,
    queue: WorkQueue<Key>,
) -> (mpsc::UnboundedReceiver<Report>, JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let api: Api<ConfigMap> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{TEST_LABEL}={run}"));
    let feeder = tokio::spawn(
        watcher(api, config)
            .default_backoff()
            .enqueue(queue)
            .for_each(move |report| {
                let report = match report {
                    Ok(added) => Ok(added),
                    Err(EnqueueError::Watcher(e)) => Err(format!("watcher: {e}")),
                    Err(e) => Err(e.to_string()),
                };
                let _ = tx.send(report);
                async {}
            }),
    );
    (rx, feeder)
}

/// Receives reports until `want` accepted the collected ones, or panics.
async fn reports_until(
    rx: &mut mpsc::UnboundedReceiver<Report>,
    mut want: impl FnMut(&[Report]) -> bool,
) -> Vec<Report> {
    let mut got = Vec::new();
    tokio::time::timeout(LIMIT, async {
        while !want(&got) {
            got.push(rx.recv().await.expect("feeder runs"));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; reports so far: {got:#?}"));
    got
}

fn count_cause(reports: &[Report], cause: Cause) -> usize {
    reports
        .iter()
        .filter(|r| matches!(r, Ok(e) if e.cause == cause))
        .count()
}

/// What the reconciler saw: per object, every observation in order (the
/// object's `data.v`, or `None` when it was gone).
#[derive(Default)]
struct Observations {
    seen: Mutex<BTreeMap<String, Vec<Option<String>>>>,
    order: Mutex<Vec<String>>,
    in_flight: Mutex<HashMap<String, usize>>,
    max_in_flight_per_key: AtomicUsize,
}

impl Observations {
    fn last(&self, name: &str) -> Option<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .get(name)
            .and_then(|v| v.last().cloned())
    }
}

/// A reconcile as a real controller writes it: fetch the object by key,
/// look at it, record what was seen.
fn reconciler(
    client: Client,
    obs: Arc<Observations>,
    gate: Option<Arc<Notify>>,
    pause: Duration,
) -> impl FnMut(
    Key,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Action, kube_client::Error>> + Send>>
+ Send
+ 'static {
    let first = Arc::new(AtomicUsize::new(0));
    move |key: Key| {
        let (client, obs, gate, first) = (client.clone(), obs.clone(), gate.clone(), first.clone());
        Box::pin(async move {
            let name = name_of(&key);
            {
                let mut in_flight = obs.in_flight.lock().unwrap();
                let n = in_flight.entry(name.clone()).or_default();
                *n += 1;
                obs.max_in_flight_per_key.fetch_max(*n, Ordering::SeqCst);
            }
            obs.order.lock().unwrap().push(name.clone());
            let is_first = first.fetch_add(1, Ordering::SeqCst) == 0;
            if let (Some(gate), true) = (gate, is_first) {
                gate.notified().await;
            }
            let api: Api<ConfigMap> =
                Api::namespaced(client, key.namespace.as_deref().unwrap_or("default"));
            let found = api.get_opt(&key.name).await;
            tokio::time::sleep(pause).await;
            *obs.in_flight.lock().unwrap().get_mut(&name).unwrap() -= 1;
            let found = found?;
            let v = found.and_then(|cm| cm.data.and_then(|d| d.get("v").cloned()));
            obs.seen.lock().unwrap().entry(name).or_default().push(v);
            Ok(Action::await_change())
        })
    }
}

/// One finished reconcile: the key and the priority it was handed out with.
struct Reconciled {
    key: Key,
    priority: i32,
}

/// Runs a key-only worker loop on a task (reconcile, requeue with backoff on
/// error, drain on stop); returns its results channel, a shutdown trigger
/// and the task.
fn start_controller<F, Fut>(
    queue: WorkQueue<Key>,
    concurrency: usize,
    mut reconcile: F,
) -> (
    mpsc::UnboundedReceiver<Reconciled>,
    oneshot::Sender<()>,
    JoinHandle<()>,
)
where
    F: FnMut(Key) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Action, kube_client::Error>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let drain = queue.clone();
    tokio::spawn(async move {
        let _ = stop_rx.await;
        drain.shutdown_with_drain().await;
    });
    let task = tokio::spawn(
        queue
            .clone()
            .map(move |item| (reconcile(item.key().clone()), item))
            .for_each_concurrent(concurrency, move |(reconciling, item)| {
                let tx = tx.clone();
                async move {
                    let (key, priority) = (item.key().clone(), item.priority());
                    match reconciling.await {
                        Ok(_) => item.forget(),
                        Err(_) => {
                            let _ = item.requeue_rate_limited();
                        }
                    }
                    let _ = tx.send(Reconciled { key, priority });
                }
            }),
    );
    (rx, stop_tx, task)
}

async fn stop(stop_tx: oneshot::Sender<()>, controller: JoinHandle<()>, feeder: JoinHandle<()>) {
    stop_tx.send(()).unwrap();
    tokio::time::timeout(LIMIT, controller)
        .await
        .expect("controller drains and ends")
        .unwrap();
    feeder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_is_reconciled_through_changes_and_deletes() {
    for_each_backend("every-object", |t| async move {
        let (client, run) = (t.client(), t.name().to_owned());
        let other = t.another("every-object-other").await;
        for i in 0..10 {
            apply(&client, &run, &run, &format!("cm-{i}"), &[("v", "1")]).await;
        }
        apply(&client, &run, &other, "cm-x", &[("v", "1")]).await;
        let queue = WorkQueue::builder().name("configmaps").build();
        let (mut reports, feeder) = start_feeder(client.clone(), &run, queue.clone());
        let obs = Arc::new(Observations::default());
        let (_results, stop_tx, controller) = start_controller(
            queue.clone(),
            3,
            reconciler(client.clone(), obs.clone(), None, Duration::ZERO),
        );

        // The initial list: everything, at low priority.
        let initial = reports_until(&mut reports, |r| r.len() == 11).await;
        assert_eq!(
            count_cause(&initial, Cause::InitialList),
            11,
            "{initial:#?}"
        );
        let names = object_names(&client, &run).await;
        assert_eq!(names.len(), 11, "{names:?}");
        eventually(LIMIT, "initial reconciles", || {
            names.iter().all(|n| obs.last(n) == Some(Some("1".into())))
        })
        .await;

        // Changes through the watch: a modification, a creation and a
        // delete. The local server also sends a bookmark in between (a
        // real one sends them on its own schedule); it adds nothing.
        apply(&client, &run, &run, "cm-3", &[("v", "2")]).await;
        if let Some(local) = t.local() {
            local.bookmark();
        }
        apply(&client, &run, &run, "cm-new", &[("v", "1")]).await;
        delete(&client, &run, "cm-5").await;
        let changes = reports_until(&mut reports, |r| r.len() == 3).await;
        assert_eq!(count_cause(&changes, Cause::Changed), 2, "{changes:#?}");
        assert_eq!(count_cause(&changes, Cause::Deleted), 1, "{changes:#?}");
        eventually(LIMIT, "changes reconciled", || {
            obs.last(&format!("{run}/cm-3")) == Some(Some("2".into()))
                && obs.last(&format!("{run}/cm-new")) == Some(Some("1".into()))
                && obs.last(&format!("{run}/cm-5")) == Some(None)
        })
        .await;

        stop(stop_tx, controller, feeder).await;

        // Every object that ever existed was reconciled, and the last thing
        // the reconciler saw of each is what the server has now.
        let seen = obs.seen.lock().unwrap().clone();
        let mut all: Vec<String> = (0..10).map(|i| format!("{run}/cm-{i}")).collect();
        all.push(format!("{run}/cm-new"));
        all.push(format!("{other}/cm-x"));
        for name in &all {
            assert!(seen.contains_key(name), "{name} never reconciled");
        }
        let live = object_names(&client, &run).await;
        for name in &all {
            let expected_live = live.contains(name);
            let last = seen[name].last().unwrap();
            assert_eq!(last.is_some(), expected_live, "{name}: last saw {last:?}");
        }
        assert_eq!(obs.max_in_flight_per_key.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_list_objects_wait_behind_fresh_changes() {
    for_each_backend("initial-list", |t| async move {
        let (client, run) = (t.client(), t.name().to_owned());
        for i in 0..20 {
            apply(&client, &run, &run, &format!("cm-{i:02}"), &[("v", "1")]).await;
        }
        let queue: WorkQueue<Key> = WorkQueue::new();
        let (mut reports, feeder) = start_feeder(client.clone(), &run, queue.clone());
        let obs = Arc::new(Observations::default());
        let gate = Arc::new(Notify::new());
        // One at a time, and the first reconcile waits at the gate.
        let (mut results, stop_tx, controller) = start_controller(
            queue.clone(),
            1,
            reconciler(
                client.clone(),
                obs.clone(),
                Some(gate.clone()),
                Duration::ZERO,
            ),
        );
        reports_until(&mut reports, |r| count_cause(r, Cause::InitialList) == 20).await;
        eventually(LIMIT, "first reconcile at the gate", || {
            obs.order.lock().unwrap().len() == 1
        })
        .await;

        // Fresh changes while the initial list waits: an object of the list
        // is modified (its key is raised) and two are created.
        apply(&client, &run, &run, "cm-15", &[("v", "2")]).await;
        apply(&client, &run, &run, "fresh-a", &[("v", "1")]).await;
        apply(&client, &run, &run, "fresh-b", &[("v", "1")]).await;
        let fresh = reports_until(&mut reports, |r| count_cause(r, Cause::Changed) == 3).await;
        assert!(
            fresh.iter().all(|r| matches!(r, Ok(e) if e.priority == 0)),
            "{fresh:#?}"
        );
        gate.notify_one();

        let mut got = Vec::new();
        tokio::time::timeout(LIMIT, async {
            while got.len() < 22 {
                let r = results.recv().await.unwrap();
                got.push((name_of(&r.key), r.priority));
            }
        })
        .await
        .expect("all reconciled");
        stop(stop_tx, controller, feeder).await;

        // The first went before the changes arrived; then the fresh
        // changes, at normal priority; then the rest of the initial list,
        // at low priority.
        assert_eq!(got[0], (format!("{run}/cm-00"), -100));
        let mut fresh: Vec<(String, i32)> = got[1..4].to_vec();
        fresh.sort();
        assert_eq!(
            fresh,
            [
                (format!("{run}/cm-15"), 0),
                (format!("{run}/fresh-a"), 0),
                (format!("{run}/fresh-b"), 0),
            ]
        );
        let rest: Vec<&(String, i32)> = got[4..].iter().collect();
        assert_eq!(rest.len(), 18);
        assert!(rest.iter().all(|(_, p)| *p == -100), "{rest:?}");
        // Within the low priority, the list order (FIFO): by name on both
        // servers.
        let names: Vec<&str> = rest.iter().map(|(n, _)| n.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(obs.last(&format!("{run}/cm-15")), Some(Some("2".into())));
    })
    .await;
}

/// Local only, on a server of its own: see the module docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_410_reveals_a_missed_delete_behind_changes_missed_while_disconnected() {
    if !backends().contains(&Backend::Local) {
        eprintln!("local only (expire_watches, forget), and TEST_CLUSTER selects no local backend");
        return;
    }
    let t = TestNamespace::on_own_local_server("relist").await;
    let server = t.local().expect("a local server");
    let (client, run) = (t.client(), t.name().to_owned());
    for i in 0..8 {
        apply(&client, &run, &run, &format!("cm-{i}"), &[("v", "1")]).await;
    }
    let queue: WorkQueue<Key> = WorkQueue::new();
    let (mut reports, feeder) = start_feeder(client.clone(), &run, queue.clone());
    reports_until(&mut reports, |r| r.len() == 8).await;
    assert!(server.wait_for_watches(1, LIMIT).await);
    // Nobody consumes yet: take the initial keys out by hand.
    while !queue.is_empty() {
        queue.get().await.unwrap().done();
    }
    let lists_before = server.requests().of(Verb::List, "configmaps");

    // The watch breaks with 410; while it is down, cm-2 changes and cm-4's
    // delete is missed (removed with no watch event). The re-list tells
    // them from the unchanged rest.
    server.expire_watches();
    assert!(server.forget("v1", "ConfigMap", Some(&run), "cm-4"));
    apply(&client, &run, &run, "cm-2", &[("v", "2")]).await;
    let relist = reports_until(&mut reports, |r| {
        count_cause(r, Cause::MissingAfterRelist) == 1
    })
    .await;
    assert!(
        relist
            .iter()
            .any(|r| matches!(r, Err(e) if e.contains("watcher"))),
        "the 410 is surfaced: {relist:#?}"
    );
    assert!(server.requests().of(Verb::List, "configmaps") > lists_before);
    let added: Vec<(String, Cause, i32)> = relist
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|e| (name_of(&e.key), e.cause, e.priority))
        .collect();
    let mut expected: Vec<(String, Cause, i32)> = [0, 1, 3, 5, 6, 7]
        .iter()
        .map(|i| (format!("{run}/cm-{i}"), Cause::Unchanged, -100))
        .collect();
    expected.insert(2, (format!("{run}/cm-2"), Cause::Changed, 0));
    expected.push((format!("{run}/cm-4"), Cause::MissingAfterRelist, 0));
    assert_eq!(added, expected);

    // Hand-out order: the change and the missed delete first.
    let mut order = Vec::new();
    while !queue.is_empty() {
        let item = queue.get().await.unwrap();
        order.push((name_of(item.key()), item.priority()));
    }
    assert_eq!(order[0], (format!("{run}/cm-2"), 0));
    assert_eq!(order[1], (format!("{run}/cm-4"), 0));
    assert!(order[2..].iter().all(|(_, p)| *p == -100));
    assert_eq!(order.len(), 8);
    feeder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_object_is_reconciled_twice_at_once() {
    for_each_backend("twice-at-once", |t| async move {
        let (client, run) = (t.client(), t.name().to_owned());
        for i in 0..4 {
            apply(&client, &run, &run, &format!("cm-{i}"), &[("v", "0")]).await;
        }
        let queue: WorkQueue<Key> = WorkQueue::new();
        let (mut reports, feeder) = start_feeder(client.clone(), &run, queue.clone());
        let obs = Arc::new(Observations::default());
        let (_results, stop_tx, controller) = start_controller(
            queue.clone(),
            4,
            reconciler(client.clone(), obs.clone(), None, Duration::from_millis(50)),
        );
        reports_until(&mut reports, |r| r.len() == 4).await;

        // A burst of changes to the same few objects while they are
        // reconciled: 15 rounds, each changing all four at once, so the
        // changes outpace the reconciles on either server (a real one
        // takes milliseconds per write, the local one far less).
        for round in 1..=15 {
            let v = round.to_string();
            let writes = (0..4).map(|i| {
                let (client, run, v) = (&client, &run, &v);
                async move { apply(client, run, run, &format!("cm-{i}"), &[("v", v)]).await }
            });
            futures::future::join_all(writes).await;
        }
        // Each object's last reconcile saw its last version: changes made
        // during a reconcile were reconciled again afterwards.
        eventually(LIMIT, "last versions reconciled", || {
            (0..4).all(|i| obs.last(&format!("{run}/cm-{i}")) == Some(Some("15".into())))
        })
        .await;
        stop(stop_tx, controller, feeder).await;
        assert_eq!(obs.max_in_flight_per_key.load(Ordering::SeqCst), 1);
        // De-duplication: fewer reconciles than the 64 versions (4 created,
        // 60 changes).
        let reconciles = obs.order.lock().unwrap().len();
        assert!(reconciles < 64, "{reconciles} reconciles");
        eprintln!(
            "{} on {}: {reconciles} reconciles for 64 versions",
            t.name(),
            t.backend()
        );
        drop(reports);
    })
    .await;
}
