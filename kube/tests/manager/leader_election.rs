//! One leader election for every controller of a `Manager`: two replicas,
//! each a manager with two controllers, on one local API server; checked on
//! the record every reconcile writes of itself (`replica_common`), never on
//! what the code under test reports.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Api;
use kube_client::api::PostParams;
use kube_local_apiserver::{Endpoint, LocalApiServer};
use kube_runtime::watcher;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
use tokio_workqueue_kube::{Action, Manager, ManagerError};

use crate::manager_common::Running;
use crate::replica_common::{
    LEASE, RELEASE_FAILOVER_MAX, RENEW, RETRY, Record, TestError, fast_lease, lease_holder,
    server_with_configmaps,
};

const LIMIT: Duration = Duration::from_secs(5);
const KEYS: usize = 4;

fn config(replica: usize) -> LeaseConfig {
    fast_lease("managers", format!("manager-{replica}"))
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
    work: Duration,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let running = ctx.record.start(&cm, ctx.replica);
    sleep(ctx.work).await;
    running.finish();
    Ok(Action::await_change())
}

fn policy(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// A replica: a manager with two controllers on the ConfigMaps (one in
/// `default` only), one election for both.
struct Replica {
    endpoint: Endpoint,
    running: Running,
}

impl Replica {
    /// `records[0]` is the first controller's, `records[1]` the second's:
    /// one key may be reconciled by both controllers at once, never by one
    /// controller on two replicas.
    fn start(
        server: &LocalApiServer,
        replica: usize,
        records: &[Arc<Record>; 2],
        work: Duration,
    ) -> Self {
        let endpoint = server.endpoint();
        let client = endpoint.client();
        let mut manager = Manager::new(client.clone());
        manager
            .leader_election(LeaderElection::new(client.clone(), config(replica)))
            .unwrap();
        let ctx = |i: usize| {
            Arc::new(Ctx {
                record: records[i].clone(),
                replica,
                work,
            })
        };
        let all = manager
            .controller_for::<ConfigMap>(watcher::Config::default())
            .run(reconcile, policy, ctx(0));
        let labelled = manager
            .controller(
                Api::<ConfigMap>::namespaced(client, "default"),
                watcher::Config::default().labels("pick=me"),
            )
            .run(reconcile, policy, ctx(1));
        manager
            .add("all", all)
            .unwrap()
            .add("labelled", labelled)
            .unwrap();
        Replica {
            endpoint,
            running: Running::start(manager),
        }
    }
}

/// Waits until `done` holds for the record, up to `LIMIT`.
async fn until(record: &Record, mut done: impl FnMut(&[crate::replica_common::Run]) -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done(&record.runs()) {
        assert!(Instant::now() < deadline, "timed out: {:?}", record.runs());
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_election_for_every_controller_and_a_release_hands_over_at_once() {
    let server = server_with_configmaps(KEYS).await;
    let records = [Arc::new(Record::default()), Arc::new(Record::default())];
    let record = &records[0];
    let mut replicas: Vec<Replica> = (0..2)
        .map(|i| Replica::start(&server, i, &records, Duration::from_millis(5)))
        .collect();
    // The leader reconciles every key; the follower none.
    until(record, |runs| {
        runs.iter().filter(|r| r.finished).count() >= KEYS
    })
    .await;
    sleep(RETRY * 3).await;
    let runs = record.runs();
    let leader = runs[0].replica;
    assert!(runs.iter().all(|r| r.replica == leader), "{runs:?}");
    assert_eq!(
        lease_holder(server.client(), "managers").await,
        Some(format!("manager-{leader}"))
    );

    // The leader shuts down: every controller drains, then the Lease is
    // released and the other replica leads at its next try.
    replicas.swap_remove(leader).running.stop(LIMIT).await;
    let released = Instant::now();
    assert_ne!(
        lease_holder(server.client(), "managers").await,
        Some(format!("manager-{leader}"))
    );
    // A change is then reconciled by the new leader, in both controllers.
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("after".into());
    cm.metadata.labels = Some([("pick".to_string(), "me".to_string())].into());
    api.create(&PostParams::default(), &cm).await.unwrap();
    for record in &records {
        until(record, |runs| {
            runs.iter()
                .any(|r| r.key == "after" && r.replica != leader && r.finished)
        })
        .await;
    }
    let first = record
        .runs()
        .iter()
        .filter(|r| r.replica != leader)
        .map(|r| r.start)
        .min()
        .unwrap();
    assert!(
        first - released <= RELEASE_FAILOVER_MAX,
        "the new leader started {:?} after the release",
        first - released
    );
    for record in &records {
        record.check_no_overlap().unwrap();
    }
    // The labelled controller's cache holds only the labelled object.
    assert!(records[1].runs().iter().all(|r| r.key == "after"));
    for replica in &mut replicas {
        replica.running.signal();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_fences_every_controller() {
    let server = server_with_configmaps(KEYS).await;
    let records = [Arc::new(Record::default()), Arc::new(Record::default())];
    let record = &records[0];
    // Long reconciles: they are in flight when the leader is cut off.
    let replicas: Vec<Replica> = (0..2)
        .map(|i| Replica::start(&server, i, &records, Duration::from_secs(2)))
        .collect();
    until(record, |runs| !runs.is_empty()).await;
    let leader = record.runs()[0].replica;
    let cut = Instant::now();
    replicas[leader].endpoint.disconnect();
    // The other replica takes over once the lease expired on its clock,
    // and reconciles the keys; the cut-off leader's reconciles were
    // cancelled before that.
    until(record, |runs| runs.iter().any(|r| r.replica != leader)).await;
    let takeover = record
        .runs()
        .iter()
        .filter(|r| r.replica != leader)
        .map(|r| r.start)
        .min()
        .unwrap();
    let last_end = record
        .runs()
        .iter()
        .filter(|r| r.replica == leader)
        .map(|r| r.end.expect("the cut-off leader's reconciles ended"))
        .max()
        .unwrap();
    assert!(last_end < takeover, "{:?}", record.runs());
    assert!(
        last_end - cut <= RENEW + config(0).fencing_grace() + RETRY,
        "fenced {:?} after the cut",
        last_end - cut
    );
    record.check_no_overlap().unwrap();
    for replica in replicas {
        replica.running.task.abort();
    }
}

#[tokio::test]
async fn an_election_after_controllers_or_a_bad_lease_config_is_refused() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let mut manager = Manager::new(client.clone());
    let bad = LeaseConfig::new("m", "default", "me").with_renew_deadline(LEASE * 2);
    assert!(matches!(
        manager
            .leader_election(LeaderElection::new(client.clone(), bad))
            .err()
            .unwrap(),
        ManagerError::InvalidLeaseConfig(_)
    ));
    let _controller = manager.controller_for::<ConfigMap>(watcher::Config::default());
    let late = manager
        .leader_election(LeaderElection::new(client, config(0)))
        .err()
        .unwrap();
    assert!(matches!(late, ManagerError::ElectionAfterControllers));
    assert!(late.to_string().contains("before"), "{late}");
}
