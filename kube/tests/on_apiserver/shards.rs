//! Shards across replicas against every backend `TEST_CLUSTER` selects (the
//! local API server and a real kube-apiserver, through
//! `kube-test-cluster`): three replicas, each with a client of its own,
//! split the keys by rendezvous hashing; one crashes without deleting its
//! Lease, every key changes, and the two others take the crashed replica's
//! keys over once its Lease expired; a graceful shutdown releases the
//! Lease.
//!
//! The reconcile function writes every start and end to a record of its
//! own; the checks read only that record: never two replicas reconciling
//! one key at once, every key's last change reconciled after it was made.
//! The fault-injection tests (a replica cut off, clocks skewed, a replica
//! joining) are in `tests/replicas/shards.rs`, on the local server only.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_client::{Api, ResourceExt};
use kube_runtime::watcher;
use kube_test_cluster::{TestNamespace, for_each_backend};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::shard::{ShardConfig, Shards, owner};
use tokio_workqueue_kube::{Action, Controller};

use crate::replica_common::{Record, TestError};

/// Longer than the local-only replica tests: a real API server writes
/// through etcd.
const LEASE: Duration = Duration::from_millis(1_500);
const RENEW: Duration = Duration::from_millis(1_000);
const RETRY: Duration = Duration::from_millis(250);
const LIMIT: Duration = Duration::from_secs(10);
const KEYS: usize = 24;
const GROUP: &str = "shards-on-apiserver";

impl Record {
    /// Waits until every change in `changes` (name, resourceVersion) was
    /// reconciled, at or after that version, by one of `by`; returns the
    /// last of those reconciles' starts.
    async fn wait_reconciled(&self, changes: &[(String, u64)], by: &[usize]) -> Instant {
        let deadline = Instant::now() + LIMIT;
        loop {
            let runs = self.runs();
            let firsts: Vec<Option<Instant>> = changes
                .iter()
                .map(|(key, version)| {
                    runs.iter()
                        .filter(|r| &r.key == key && r.version >= *version)
                        .map(|r| {
                            assert!(by.contains(&r.replica), "{r:?} by a replica not in {by:?}");
                            r.start
                        })
                        .min()
                })
                .collect();
            if firsts.iter().all(Option::is_some) {
                return firsts.into_iter().flatten().max().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "not every change reconciled in {LIMIT:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let _running = ctx.record.start(&cm, ctx.replica);
    sleep(Duration::from_millis(20)).await;
    Ok(Action::await_change())
}

fn identity(replica: usize) -> String {
    format!("replica-{replica}")
}

struct Replica {
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
}

async fn replica(ns: &TestNamespace, replica: usize, record: &Arc<Record>) -> Replica {
    // A client of its own, as another process would have.
    let client = kube_test_cluster::client(ns.backend()).await;
    let config = ShardConfig::new(GROUP, ns.name(), identity(replica))
        .with_lease_duration(LEASE)
        .with_renew_deadline(RENEW)
        .with_retry_period(RETRY);
    let (shutdown, graceful) = oneshot::channel::<()>();
    let stream = Controller::new(
        Api::<ConfigMap>::namespaced(client.clone(), ns.name()),
        watcher::Config::default(),
    )
    .shards(Shards::new(client, config))
    .graceful_shutdown_on(async move {
        let _ = graceful.await;
    })
    .run(
        reconcile,
        |_, _, _| Action::requeue(Duration::from_millis(50)),
        Arc::new(Ctx {
            record: record.clone(),
            replica,
        }),
    );
    Replica {
        task: tokio::spawn(stream.for_each(|_| async {})),
        shutdown: Some(shutdown),
    }
}

/// Sets `data.v` on every ConfigMap; returns each one's new version.
async fn change_all(api: &Api<ConfigMap>, value: &str) -> Vec<(String, u64)> {
    let patch = Patch::Merge(json!({ "data": { "v": value } }));
    let mut changes = Vec::new();
    for i in 0..KEYS {
        let cm = api
            .patch(&format!("cm-{i}"), &PatchParams::default(), &patch)
            .await
            .unwrap();
        changes.push((
            cm.name_any(),
            cm.resource_version().unwrap().parse().unwrap(),
        ));
    }
    changes
}

#[tokio::test]
async fn replicas_split_keys_and_hand_a_crashed_replica_s_over() {
    for_each_backend("shards", |ns| async move {
        let api = ns.api::<ConfigMap>();
        for i in 0..KEYS {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("cm-{i}"));
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
        let record = Arc::new(Record::default());
        let mut replicas = Vec::new();
        for i in 0..3 {
            replicas.push(replica(&ns, i, &record).await);
        }
        let ids: Vec<String> = (0..3).map(identity).collect();

        // Settled: a change to every key is reconciled by its owner alone.
        let settle = Instant::now() + LIMIT;
        loop {
            let leases: Api<Lease> = ns.api();
            let n = leases.list(&Default::default()).await.unwrap().items.len();
            if n == 3 {
                break;
            }
            assert!(Instant::now() < settle, "the three Leases never appeared");
            sleep(RETRY).await;
        }
        // Give every replica time to read the others' acknowledgements.
        sleep(4 * RETRY).await;
        let changed = Instant::now();
        let changes = change_all(&api, "split").await;
        record.wait_reconciled(&changes, &[0, 1, 2]).await;
        sleep(4 * RETRY).await;
        for run in record.runs().iter().filter(|r| r.start >= changed) {
            let expected = owner(&format!("{}/{}", ns.name(), run.key), &ids).unwrap();
            assert_eq!(identity(run.replica), expected, "{run:?}");
        }
        let owners: std::collections::BTreeSet<usize> = record
            .runs()
            .iter()
            .filter(|r| r.start >= changed)
            .map(|r| r.replica)
            .collect();
        assert_eq!(owners.len(), 3, "the keys were not split three ways");

        // Replica 0 crashes: its Lease stays; every key changes.
        replicas[0].task.abort();
        let crashed = Instant::now();
        let changes = change_all(&api, "after the crash").await;
        let last = record.wait_reconciled(&changes, &[1, 2]).await;
        let handover = last - crashed;
        println!(
            "{}: the crashed replica's keys were reconciled {handover:?} after the crash",
            ns.backend()
        );
        assert!(handover <= LEASE + 4 * RETRY, "hand-over took {handover:?}");
        let survivors = [identity(1), identity(2)];
        for (key, _) in &changes {
            let expected = owner(&format!("{}/{key}", ns.name()), &survivors).unwrap();
            let last = record
                .runs()
                .into_iter()
                .filter(|r| &r.key == key)
                .max_by_key(|r| r.start)
                .unwrap();
            assert_eq!(identity(last.replica), expected, "{last:?}");
        }

        // Replica 1 shuts down gracefully: its Lease is released, and
        // replica 2 takes everything well before a lease duration.
        let leases: Api<Lease> = ns.api();
        let name = format!("{GROUP}-{}", identity(1));
        assert!(leases.get_opt(&name).await.unwrap().is_some());
        let _ = replicas[1].shutdown.take().unwrap().send(());
        tokio::time::timeout(LIMIT, &mut replicas[1].task)
            .await
            .expect("replica 1 ended")
            .unwrap();
        let holder = leases
            .get(&name)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.holder_identity);
        assert_eq!(holder, None, "its Lease was not released");
        let left = Instant::now();
        let changes = change_all(&api, "after the shutdown").await;
        let last = record.wait_reconciled(&changes, &[2]).await;
        println!(
            "{}: every key reconciled by the last replica {:?} after the shutdown",
            ns.backend(),
            last - left
        );
        assert!(
            last - left < LEASE,
            "the graceful hand-over took {:?}",
            last - left
        );

        record.check_no_overlap().unwrap();
        for r in &replicas {
            r.task.abort();
        }
    })
    .await;
}
