//! A `Manager` whose shard membership splits the cache: replicas, each a
//! manager with a ConfigMap controller and a Secret controller, one
//! Lease each and one coordinator for the group. Checked on what the
//! local API server holds (the labels), on each controller's store, and
//! on the record every reconcile writes of itself (`replica_common`),
//! never on what the code under test reports.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::api::{Patch, PatchParams};
use kube_client::{Api, Resource, ResourceExt};
use kube_local_apiserver::LocalApiServer;
use kube_runtime::reflector::Store;
use kube_runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::shard::{LabelRate, ShardConfig, Shards, label_key};
use tokio_workqueue_kube::{Action, Manager};

use crate::manager_common::Running;
use crate::replica_common::{
    LEASE, RENEW, RETRY, Record, TestError, lease_holder, shard_identity as identity,
    shard_owner as owner_of,
};

const GROUP: &str = "manager-split";
/// Longest any wait in these tests may take.
const LIMIT: Duration = Duration::from_secs(5);
/// Objects of each kind: `obj-0..N` ConfigMaps and Secrets of the same
/// names, so that each name's two objects go to one replica.
const N: usize = 24;
/// The kinds, in the order of the records and stores.
const KINDS: [&str; 2] = ["ConfigMap", "Secret"];

fn config(replica: usize) -> ShardConfig {
    ShardConfig::new(GROUP, "default", identity(replica))
        .with_lease_duration(LEASE)
        .with_renew_deadline(RENEW)
        .with_retry_period(RETRY)
        .split_cache(LabelRate::DEFAULT)
}

fn names() -> Vec<String> {
    (0..N).map(|i| format!("obj-{i}")).collect()
}

async fn server() -> LocalApiServer {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    for name in names() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.clone());
        configmaps.create(&Default::default(), &cm).await.unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some(name);
        secrets.create(&Default::default(), &secret).await.unwrap();
    }
    server
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
}

async fn reconcile<K: ResourceExt>(object: Arc<K>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let running = ctx.record.start_object(&*object, ctx.replica);
    sleep(Duration::from_millis(5)).await;
    running.finish();
    Ok(Action::await_change())
}

fn policy<K>(_: Arc<K>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// A replica: a manager with a ConfigMap and a Secret controller (records
/// `records[0]` and `[1]`), one split membership for both.
struct Replica {
    /// Until stopped.
    running: Option<Running>,
    configmaps: Store<ConfigMap>,
    secrets: Store<Secret>,
    /// A manager store of every ConfigMap: it stays whole.
    whole: Store<ConfigMap>,
    shards: Shards,
}

impl Replica {
    fn start(server: &LocalApiServer, replica: usize, records: &[Arc<Record>; 2]) -> Self {
        let client = server.client();
        let mut manager = Manager::new(client.clone());
        let shards = Shards::new(client.clone(), config(replica));
        manager.shards(shards.clone()).unwrap();
        let ctx = |i: usize| {
            Arc::new(Ctx {
                record: records[i].clone(),
                replica,
            })
        };
        let configmaps = manager.controller_for::<ConfigMap>(watcher::Config::default());
        let configmaps_store = configmaps.store();
        let configmaps = configmaps.run(reconcile, policy, ctx(0));
        let secrets = manager.controller_for::<Secret>(watcher::Config::default());
        let secrets_store = secrets.store();
        let secrets = secrets.run(reconcile, policy, ctx(1));
        let whole = manager.store(Api::<ConfigMap>::all(client), watcher::Config::default());
        manager
            .add("configmaps", configmaps)
            .unwrap()
            .add("secrets", secrets)
            .unwrap();
        Replica {
            running: Some(Running::start(manager)),
            configmaps: configmaps_store,
            secrets: secrets_store,
            whole,
            shards,
        }
    }

    async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop(LIMIT).await;
        }
    }

    /// As a crash: nothing is released.
    fn crash(&self) {
        if let Some(running) = &self.running {
            running.task.abort();
        }
    }

    /// The names each controller's store holds, by kind.
    fn held(&self) -> [Vec<String>; 2] {
        fn sorted<K: Resource + ResourceExt + Clone>(store: &Store<K>) -> Vec<String>
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            let mut names: Vec<String> = store.state().iter().map(|o| o.name_any()).collect();
            names.sort();
            names
        }
        [sorted(&self.configmaps), sorted(&self.secrets)]
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.crash();
    }
}

async fn wait_until(what: &str, check: impl Fn() -> Result<(), String>) {
    let deadline = Instant::now() + LIMIT;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Every object of both kinds carries its owner among `live` as its
/// shard label, read from the server.
fn check_labels(server: &LocalApiServer, live: &[usize]) -> Result<(), String> {
    let key = label_key(GROUP);
    for kind in KINDS {
        for name in names() {
            let label = server
                .object("v1", kind, Some("default"), &name)
                .and_then(|o| {
                    o["metadata"]["labels"][key.as_str()]
                        .as_str()
                        .map(str::to_owned)
                });
            let owner = identity(owner_of(&name, live));
            if label.as_deref() != Some(owner.as_str()) {
                return Err(format!(
                    "{kind} {name} is labelled {label:?}, its owner is {owner}"
                ));
            }
        }
    }
    Ok(())
}

/// Each replica of `live` holds exactly its share among `live` in both
/// controllers' stores, and every ConfigMap in its whole store.
fn check_stores(replicas: &[Replica], live: &[usize]) -> Result<(), String> {
    for &i in live {
        let own: Vec<String> = {
            let mut own: Vec<String> = names()
                .into_iter()
                .filter(|n| owner_of(n, live) == i)
                .collect();
            own.sort();
            own
        };
        for (kind, held) in KINDS.iter().zip(replicas[i].held()) {
            if held != own {
                return Err(format!(
                    "replica-{i}'s {kind} store holds {held:?}, it owns {own:?} among {live:?}"
                ));
            }
        }
        let whole = replicas[i].whole.state().len();
        if whole != N {
            return Err(format!(
                "replica-{i}'s whole store holds {whole} ConfigMaps"
            ));
        }
    }
    Ok(())
}

/// Annotates every object of `kind` with `round` and returns each one's
/// new resourceVersion.
async fn change_all<K>(server: &LocalApiServer, round: &str) -> Vec<(String, u64)>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(server.client(), "default");
    let patch = serde_json::json!({ "metadata": { "annotations": { "round": round } } });
    let mut changed = Vec::new();
    for name in names() {
        let object = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        changed.push((name, object.resource_version().unwrap().parse().unwrap()));
    }
    changed
}

/// Changes every object of both kinds, then waits until each change is
/// reconciled by its owner among `live`, and checks that no other
/// replica reconciled it.
async fn changes_reach_their_owners(
    server: &LocalApiServer,
    records: &[Arc<Record>; 2],
    live: &[usize],
    round: &str,
) {
    let changed = [
        change_all::<ConfigMap>(server, round).await,
        change_all::<Secret>(server, round).await,
    ];
    for ((kind, record), changed) in KINDS.iter().zip(records).zip(&changed) {
        wait_until(
            &format!("every {kind} change reconciled by its owner"),
            || {
                let runs = record.runs();
                let missing: Vec<&String> = changed
                    .iter()
                    .filter(|(name, version)| {
                        !runs.iter().any(|r| {
                            &r.key == name
                                && r.version >= *version
                                && r.finished
                                && r.replica == owner_of(name, live)
                        })
                    })
                    .map(|(name, _)| name)
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "not reconciled by their owners among {live:?}: {missing:?}"
                    ))
                }
            },
        )
        .await;
        let elsewhere: Vec<_> = record
            .runs()
            .into_iter()
            .filter(|r| {
                changed
                    .iter()
                    .any(|(name, version)| *name == r.key && r.version >= *version)
                    && r.replica != owner_of(&r.key, live)
            })
            .collect();
        assert!(
            elsewhere.is_empty(),
            "{kind}s reconciled off their owner: {elsewhere:?}"
        );
        record.check_no_overlap().unwrap();
    }
}

/// The replica holding the coordinator's Lease, if one does.
async fn coordinator(server: &LocalApiServer) -> Option<usize> {
    let holder = lease_holder(server.client(), &format!("{GROUP}.coordinator")).await?;
    holder.strip_prefix("replica-").and_then(|i| i.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_manager_holds_each_replicas_share_of_every_controllers_kind_through_a_coordinator_crash()
 {
    let server = server().await;
    let records = [Arc::new(Record::default()), Arc::new(Record::default())];
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&server, i, &records))
        .collect();
    let all = [0, 1, 2];

    // One coordinator labels both kinds; each controller's store holds its
    // replica's share, the manager's own store everything.
    wait_until("every object labelled with its owner", || {
        check_labels(&server, &all)
    })
    .await;
    wait_until("each store holding its replica's share", || {
        check_stores(&replicas, &all)
    })
    .await;
    let written: u64 = replicas.iter().map(|r| r.shards.label_patches()).sum();
    assert!(
        written >= 2 * N as u64,
        "{written} label writes for {} objects",
        2 * N
    );
    changes_reach_their_owners(&server, &records, &all, "1").await;

    // The coordinator crashes: another member takes its Lease and labels
    // the crashed replica's share of both kinds to the survivors.
    let crashed = coordinator(&server).await.expect("a coordinator");
    replicas[crashed].crash();
    let live: Vec<usize> = all.into_iter().filter(|&i| i != crashed).collect();
    wait_until(
        "every object labelled with its owner among the survivors",
        || check_labels(&server, &live),
    )
    .await;
    wait_until("each survivor's stores holding its share", || {
        check_stores(&replicas, &live)
    })
    .await;
    changes_reach_their_owners(&server, &records, &live, "2").await;

    // The new coordinator shuts down gracefully: it releases the
    // coordinator's Lease on its way out.
    let next = coordinator(&server).await.expect("a coordinator");
    assert!(
        live.contains(&next),
        "replica-{next} coordinates after the crash"
    );
    replicas[next].stop().await;
    assert_ne!(
        coordinator(&server).await,
        Some(next),
        "the Lease was released"
    );
}

/// A controller of a split manager holds only the manager's share: given
/// shards or an election of its own, it reports that as its only item and
/// ends (a controller that took them would wait for the manager, which
/// never runs here: the timeouts fail the test then).
#[tokio::test]
async fn a_split_managers_controller_refuses_a_replication_of_its_own() {
    use futures::StreamExt;
    use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
    use tokio_workqueue_kube::{ControllerError, Error};

    let server = LocalApiServer::start().await;
    let client = server.client();
    let ctx = || {
        Arc::new(Ctx {
            record: Arc::default(),
            replica: 0,
        })
    };
    let mut manager = Manager::new(client.clone());
    manager
        .shards(Shards::new(client.clone(), config(0)))
        .unwrap();
    let own_shards = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .shards(Shards::new(
            client.clone(),
            ShardConfig::new("other", "default", identity(0)),
        ));
    let own_election = manager
        .controller_for::<Secret>(watcher::Config::default())
        .leader_election(LeaderElection::new(
            client.clone(),
            LeaseConfig::new("own", "default", identity(0)),
        ));
    /// Whether the stream's only item was the refusal.
    fn only_refusal<T, E: std::fmt::Display>(
        results: Vec<Result<T, Error<E, ControllerError>>>,
    ) -> bool {
        results.len() == 1
            && matches!(
                &results[0],
                Err(Error::QueueError(
                    ControllerError::OwnReplicationInSplitManager
                ))
            )
    }
    let own_shards = tokio::time::timeout(
        LIMIT,
        own_shards.run(reconcile, policy, ctx()).collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ended");
    assert!(only_refusal(own_shards), "shards of its own were taken");
    let own_election = tokio::time::timeout(
        LIMIT,
        own_election
            .run(reconcile, policy, ctx())
            .collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ended");
    assert!(
        only_refusal(own_election),
        "an election of its own was taken"
    );
}
