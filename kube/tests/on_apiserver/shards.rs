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
//! A second test runs replicas whose wall clocks are 5 s apart, and a
//! replica joining them (a rollout's new Pod), a third deletes a live
//! member's Lease, a fourth runs managers of two controllers on one
//! membership each, on both servers. The fault-injection tests beyond those
//! (a replica cut off while the others go on, one whose stream nobody
//! polls) are in
//! `tests/replicas/shards.rs`, on the local server; cuts, stalls, resets
//! and restarts on a real kube-apiserver are the chaos soak's
//! (`examples/chaos_soak.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_client::{Api, ResourceExt};
use kube_runtime::reflector::Store;
use kube_runtime::watcher;
use kube_test_cluster::{TestNamespace, for_each_backend};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::shard::{
    LABEL_MANAGER, LabelRate, ShardConfig, Shards, label_key, owner,
};
use tokio_workqueue_kube::{Action, Controller, Manager};

use crate::replica_common::{Record, TestError, skewed};

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

impl Ctx {
    fn new(record: &Arc<Record>, replica: usize) -> Arc<Self> {
        Arc::new(Ctx {
            record: record.clone(),
            replica,
        })
    }
}

fn retry(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(50))
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let _running = ctx.record.start(&cm, ctx.replica);
    sleep(Duration::from_millis(20)).await;
    Ok(Action::await_change())
}

fn identity(replica: usize) -> String {
    format!("replica-{replica}")
}

/// Replica `replica`'s membership in the group, with these tests' timings.
fn config(ns: &TestNamespace, replica: usize) -> ShardConfig {
    ShardConfig::new(GROUP, ns.name(), identity(replica))
        .with_lease_duration(LEASE)
        .with_renew_deadline(RENEW)
        .with_retry_period(RETRY)
}

/// A running replica; dropping it stops it as a crash would.
struct Replica {
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Replica {
    /// Shuts replica `id` down gracefully: it ends within `LIMIT`, and its
    /// Lease, which existed, is released.
    async fn shut_down(&mut self, ns: &TestNamespace, id: usize) {
        let leases: Api<Lease> = ns.api();
        let name = format!("{GROUP}-{}", identity(id));
        assert!(leases.get_opt(&name).await.unwrap().is_some());
        let _ = self.shutdown.take().unwrap().send(());
        tokio::time::timeout(LIMIT, &mut self.task)
            .await
            .expect("the replica ended")
            .unwrap();
        let holder = leases
            .get(&name)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.holder_identity);
        assert_eq!(holder, None, "its Lease was not released");
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Replicas `0..n`, unskewed.
async fn replicas(ns: &TestNamespace, n: usize, record: &Arc<Record>) -> Vec<Replica> {
    let mut started = Vec::new();
    for i in 0..n {
        started.push(replica(ns, i, record).await);
    }
    started
}

async fn replica(ns: &TestNamespace, replica: usize, record: &Arc<Record>) -> Replica {
    replica_skewed(ns, replica, record, 0).await
}

/// A replica whose wall clock (the one its Lease times are written and
/// read by) is `skew_seconds` off the system's.
async fn replica_skewed(
    ns: &TestNamespace,
    replica: usize,
    record: &Arc<Record>,
    skew_seconds: i64,
) -> Replica {
    start(ns, replica, record, skew_seconds, false).await.0
}

/// Replica `replica`, its wall clock `skew_seconds` off, its cache split or
/// not, and its controller's store.
async fn start(
    ns: &TestNamespace,
    replica: usize,
    record: &Arc<Record>,
    skew_seconds: i64,
    split: bool,
) -> (Replica, Store<ConfigMap>) {
    // A client of its own, as another process would have.
    let client = kube_test_cluster::client(ns.backend()).await;
    let mut config = config(ns, replica);
    if split {
        config = config.split_cache(LabelRate::DEFAULT);
    }
    let (shutdown, graceful) = oneshot::channel::<()>();
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client.clone(), ns.name()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let stream = controller
        .shards(Shards::new(client, config).wall_clock(skewed(skew_seconds)))
        .graceful_shutdown_on(async move {
            let _ = graceful.await;
        })
        .run(reconcile, retry, Ctx::new(record, replica));
    let replica = Replica {
        task: tokio::spawn(stream.for_each(|_| async {})),
        shutdown: Some(shutdown),
    };
    (replica, store)
}

/// Creates the ConfigMaps `cm-0..KEYS`, each with some data (a real API
/// server then keeps `managedFields` on them, as on most objects).
async fn create_all(api: &Api<ConfigMap>) {
    for i in 0..KEYS {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        cm.data = Some([("v".to_string(), "created".to_string())].into());
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
}

/// Waits until the group has `n` Leases, then lets every replica read the
/// others' acknowledgements.
async fn wait_for_leases(ns: &TestNamespace, n: usize) {
    let leases: Api<Lease> = ns.api();
    let deadline = Instant::now() + LIMIT;
    while leases.list(&Default::default()).await.unwrap().items.len() != n {
        assert!(Instant::now() < deadline, "the {n} Leases never appeared");
        sleep(RETRY).await;
    }
    sleep(4 * RETRY).await;
}

/// Checks that every reconcile started after `since` ran on the owner of
/// its key among `members`.
fn assert_owners(ns: &TestNamespace, record: &Record, since: Instant, members: &[usize]) {
    let ids: Vec<String> = members.iter().map(|&m| identity(m)).collect();
    for run in record.runs().iter().filter(|r| r.start >= since) {
        let expected = owner(&format!("{}/{}", ns.name(), run.key), &ids).unwrap();
        assert_eq!(identity(run.replica), expected, "{run:?}");
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
        create_all(&api).await;
        let record = Arc::new(Record::default());
        let mut replicas = replicas(&ns, 3, &record).await;

        // Settled: a change to every key is reconciled by its owner alone.
        wait_for_leases(&ns, 3).await;
        let changed = Instant::now();
        let changes = change_all(&api, "split").await;
        record.wait_reconciled(&changes, &[0, 1, 2]).await;
        sleep(4 * RETRY).await;
        assert_owners(&ns, &record, changed, &[0, 1, 2]);
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
        replicas[1].shut_down(&ns, 1).await;
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
        drop(replicas);
    })
    .await;
}

#[tokio::test]
async fn replicas_with_skewed_clocks_split_keys_and_take_in_a_joining_one() {
    for_each_backend("shards-skew", |ns| async move {
        let api = ns.api::<ConfigMap>();
        create_all(&api).await;
        let record = Arc::new(Record::default());
        // Two replicas 5 s apart (more than three lease durations): Lease
        // times are only compared with the reader's own clock, so neither
        // takes the other's Lease for expired.
        let mut replicas = vec![
            replica_skewed(&ns, 0, &record, 5).await,
            replica_skewed(&ns, 1, &record, 0).await,
        ];
        wait_for_leases(&ns, 2).await;
        let changed = Instant::now();
        let changes = change_all(&api, "two").await;
        record.wait_reconciled(&changes, &[0, 1]).await;
        sleep(4 * RETRY).await;
        assert_owners(&ns, &record, changed, &[0, 1]);

        // A third replica joins, its clock 5 s behind the first: the keys
        // it gains are handed over (never reconciled by two at once), and
        // every key's next change is reconciled by its owner among three.
        replicas.push(replica_skewed(&ns, 2, &record, -5).await);
        wait_for_leases(&ns, 3).await;
        // Until the hand-over settles, a key may still be reconciled by its
        // old owner; what must hold is that its last change ends up with
        // its new one, and no overlap.
        let deadline = Instant::now() + LIMIT;
        loop {
            let changed = Instant::now();
            let changes = change_all(&api, &format!("three {changed:?}")).await;
            record.wait_reconciled(&changes, &[0, 1, 2]).await;
            sleep(4 * RETRY).await;
            let ids: Vec<String> = (0..3).map(identity).collect();
            let settled = changes.iter().all(|(key, _)| {
                let expected = owner(&format!("{}/{key}", ns.name()), &ids).unwrap();
                record
                    .runs()
                    .into_iter()
                    .filter(|r| &r.key == key && r.start >= changed)
                    .all(|r| identity(r.replica) == expected)
            });
            if settled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the joining replica never got its share"
            );
        }
        let joined: std::collections::BTreeSet<usize> =
            record.runs().iter().map(|r| r.replica).collect();
        assert!(
            joined.contains(&2),
            "the joining replica reconciled nothing"
        );
        record.check_no_overlap().unwrap();
        drop(replicas);
    })
    .await;
}

/// Someone deletes a live member's Lease: the others keep it a member
/// until it would have expired, so a change made meanwhile is reconciled by
/// the key's owner among all three; the member makes its Lease again at its
/// next renewal.
#[tokio::test]
async fn a_replica_whose_lease_is_deleted_keeps_its_keys() {
    for_each_backend("shards-deleted-lease", |ns| async move {
        let api = ns.api::<ConfigMap>();
        create_all(&api).await;
        let record = Arc::new(Record::default());
        let replicas = replicas(&ns, 3, &record).await;
        wait_for_leases(&ns, 3).await;
        let leases: Api<Lease> = ns.api();
        let name = format!("{GROUP}-{}", identity(2));
        leases.delete(&name, &Default::default()).await.unwrap();
        let deleted = Instant::now();
        let changes = change_all(&api, "after the deletion").await;
        record.wait_reconciled(&changes, &[0, 1, 2]).await;
        // It makes its Lease again within a retry period, long before the
        // deleted one would have expired: its membership never lapses.
        assert_owners(&ns, &record, deleted, &[0, 1, 2]);
        let deadline = Instant::now() + LIMIT;
        loop {
            let holder = leases
                .get_opt(&name)
                .await
                .unwrap()
                .and_then(|l| l.spec?.holder_identity);
            if holder.as_deref() == Some(identity(2).as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not make its Lease again"
            );
            sleep(RETRY).await;
        }
        record.check_no_overlap().unwrap();
        drop(replicas);
    })
    .await;
}

/// A replica that is a `Manager` of two controllers over the namespace's
/// ConfigMaps (one shared cache), one shard membership for both, its
/// cache split or not; each controller writes its own record. Also the
/// first controller's store.
fn manager_replica(
    client: kube_client::Client,
    ns: &TestNamespace,
    replica: usize,
    records: &[Arc<Record>; 2],
    split: bool,
) -> (Replica, Store<ConfigMap>) {
    let mut config = config(ns, replica);
    if split {
        config = config.split_cache(LabelRate::DEFAULT);
    }
    let mut manager = Manager::new(client.clone());
    manager
        .shards(Shards::new(client.clone(), config))
        .expect("shards before controllers");
    let mut stores = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let controller = manager.controller(
            Api::<ConfigMap>::namespaced(client.clone(), ns.name()),
            watcher::Config::default(),
        );
        stores.push(controller.store());
        let stream = controller.run(reconcile, retry, Ctx::new(record, replica));
        manager.add(&format!("controller-{i}"), stream).unwrap();
    }
    let (shutdown, graceful) = oneshot::channel::<()>();
    manager.shutdown_on(async move {
        let _ = graceful.await;
    });
    let replica = Replica {
        task: tokio::spawn(async move { manager.run().await.expect("the manager ran") }),
        shutdown: Some(shutdown),
    };
    (replica, stores.swap_remove(0))
}

/// Three managers of two controllers each, one membership per manager: one
/// Lease per replica (not per controller); both controllers split the keys
/// by the same owners; a manager that shuts down drains both and releases
/// its one Lease, and the others take its keys in both controllers.
#[tokio::test]
async fn managers_share_one_membership_among_their_controllers() {
    for_each_backend("shards-manager", |ns| async move {
        let api = ns.api::<ConfigMap>();
        create_all(&api).await;
        let records = [Arc::new(Record::default()), Arc::new(Record::default())];
        let mut replicas = Vec::new();
        for i in 0..3 {
            let client = kube_test_cluster::client(ns.backend()).await;
            replicas.push(manager_replica(client, &ns, i, &records, false).0);
        }
        wait_for_leases(&ns, 3).await;
        let changed = Instant::now();
        let changes = change_all(&api, "split").await;
        for record in &records {
            record.wait_reconciled(&changes, &[0, 1, 2]).await;
        }
        sleep(4 * RETRY).await;
        let leases: Api<Lease> = ns.api();
        assert_eq!(
            leases.list(&Default::default()).await.unwrap().items.len(),
            3
        );
        for record in &records {
            assert_owners(&ns, record, changed, &[0, 1, 2]);
        }

        replicas[2].shut_down(&ns, 2).await;
        let left = Instant::now();
        let changes = change_all(&api, "after the shutdown").await;
        for record in &records {
            record.wait_reconciled(&changes, &[0, 1]).await;
        }
        sleep(4 * RETRY).await;
        for record in &records {
            assert_owners(&ns, record, left, &[0, 1]);
            record.check_no_overlap().unwrap();
        }
        drop(replicas);
    })
    .await;
}

/// Waits until every ConfigMap carries its owner among `members` in its
/// shard label, as the API server returns them, and each store of
/// `members` holds exactly its replica's objects.
async fn wait_split(
    ns: &TestNamespace,
    stores: &[Store<ConfigMap>],
    members: &[usize],
) -> Result<(), String> {
    let api = ns.api::<ConfigMap>();
    let ids: Vec<String> = members.iter().map(|&m| identity(m)).collect();
    let owner_of = |name: &str| {
        owner(&format!("{}/{name}", ns.name()), &ids)
            .unwrap()
            .to_owned()
    };
    let key = label_key(GROUP);
    let deadline = Instant::now() + LIMIT;
    loop {
        let listed = api.list(&Default::default()).await.unwrap().items;
        let wrong = listed
            .iter()
            .filter(|cm| cm.labels().get(&key) != Some(&owner_of(&cm.name_any())))
            .count();
        let stores_wrong: Vec<String> = members
            .iter()
            .filter_map(|&m| {
                let mut held: Vec<String> =
                    stores[m].state().iter().map(|cm| cm.name_any()).collect();
                held.sort();
                let mut own: Vec<String> = listed
                    .iter()
                    .map(ResourceExt::name_any)
                    .filter(|n| owner_of(n) == identity(m))
                    .collect();
                own.sort();
                (held != own)
                    .then(|| format!("replica-{m} holds {}, owns {}", held.len(), own.len()))
            })
            .collect();
        if listed.len() == KEYS && wrong == 0 && stores_wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{wrong} of {} objects labelled wrong among {members:?}; {stores_wrong:?}",
                listed.len()
            ));
        }
        sleep(RETRY).await;
    }
}

/// Whether `cm` carries the `managedFields` entry of the coordinator's
/// label writes.
fn label_entry(cm: &ConfigMap) -> bool {
    cm.managed_fields()
        .iter()
        .any(|f| f.manager.as_deref() == Some(LABEL_MANAGER))
}

/// Split caches on both servers: each replica's store holds exactly its
/// share (objects relabelled away leave it, as the API server sends them
/// deleted; relabelled in, they enter it), through the crash of the
/// coordinator; every change is reconciled by the owner alone. The stores
/// keep no record of the label writes, which the API server keeps (the
/// real one: the local server keeps no `managedFields`).
#[tokio::test]
async fn split_caches_hold_each_replicas_share_through_a_coordinator_crash() {
    for_each_backend("shards-split", |ns| async move {
        let api = ns.api::<ConfigMap>();
        create_all(&api).await;
        let record = Arc::new(Record::default());
        let mut replicas = Vec::new();
        let mut stores = Vec::new();
        for i in 0..3 {
            let (replica, store) = start(&ns, i, &record, 0, true).await;
            replicas.push(replica);
            stores.push(store);
        }
        wait_split(&ns, &stores, &[0, 1, 2]).await.unwrap();
        let listed = api.list(&Default::default()).await.unwrap().items;
        if listed.iter().any(|cm| cm.metadata.managed_fields.is_some()) {
            assert!(
                listed.iter().all(label_entry),
                "{}: an object without the coordinator's managedFields entry",
                ns.backend()
            );
        }
        for (i, store) in stores.iter().enumerate() {
            let held = store.state();
            assert!(!held.is_empty(), "replica-{i} holds nothing");
            assert!(
                !held.iter().any(|cm| label_entry(cm)),
                "replica-{i} keeps the record of the label writes"
            );
        }
        let changes = change_all(&api, "split").await;
        record.wait_reconciled(&changes, &[0, 1, 2]).await;

        let leases: Api<Lease> = ns.api();
        let holder = leases
            .get(&format!("{GROUP}.coordinator"))
            .await
            .unwrap()
            .spec
            .and_then(|s| s.holder_identity)
            .expect("a coordinator");
        let crashed = (0..3).find(|&i| identity(i) == holder).unwrap();
        replicas[crashed].task.abort();
        let crash = Instant::now();
        let live: Vec<usize> = (0..3).filter(|&i| i != crashed).collect();
        wait_split(&ns, &stores, &live).await.unwrap();
        println!(
            "{}: the survivors' caches held their new shares {:?} after the coordinator crashed",
            ns.backend(),
            crash.elapsed()
        );
        let changes = change_all(&api, "after the crash").await;
        record.wait_reconciled(&changes, &live).await;
        record.check_no_overlap().unwrap();
        drop(replicas);
    })
    .await;
}

/// Split caches in a `Manager` on both servers: three managers of two
/// controllers on the namespace's ConfigMaps (one share, one labelled
/// kind) hold exactly their shares; a manager that shuts down gracefully
/// hands its objects to the others' caches; every change is reconciled by
/// its owner alone, in both controllers.
#[tokio::test]
async fn split_managers_hold_each_replicas_share_through_a_shutdown() {
    for_each_backend("shards-split-manager", |ns| async move {
        let api = ns.api::<ConfigMap>();
        create_all(&api).await;
        let records = [Arc::new(Record::default()), Arc::new(Record::default())];
        let mut replicas = Vec::new();
        let mut stores = Vec::new();
        for i in 0..3 {
            let client = kube_test_cluster::client(ns.backend()).await;
            let (replica, store) = manager_replica(client, &ns, i, &records, true);
            replicas.push(replica);
            stores.push(store);
        }
        wait_split(&ns, &stores, &[0, 1, 2]).await.unwrap();
        let changed = Instant::now();
        let changes = change_all(&api, "split").await;
        for record in &records {
            record.wait_reconciled(&changes, &[0, 1, 2]).await;
            assert_owners(&ns, record, changed, &[0, 1, 2]);
        }

        replicas[2].shut_down(&ns, 2).await;
        wait_split(&ns, &stores, &[0, 1]).await.unwrap();
        let left = Instant::now();
        let changes = change_all(&api, "after the shutdown").await;
        for record in &records {
            record.wait_reconciled(&changes, &[0, 1]).await;
            assert_owners(&ns, record, left, &[0, 1]);
            record.check_no_overlap().unwrap();
        }
        drop(replicas);
    })
    .await;
}
