//! One shard membership for every controller of a `Manager`: replicas, each
//! a manager with two controllers on the ConfigMaps, one Lease each; checked
//! on the record every reconcile writes of itself (`replica_common`) and on
//! the Leases read from the API server, never on what the code under test
//! reports.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams};
use kube_client::{Api, ResourceExt};
use kube_local_apiserver::{Fault, LocalApiServer, Verb};
use kube_runtime::watcher;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
use tokio_workqueue_kube::shard::{ShardConfig, Shards};
use tokio_workqueue_kube::{Action, Manager, ManagerError};

use crate::manager_common::{Running, get};
use crate::replica_common::{
    RETRY, Record, Run, TestError, lease_holder, server_with_configmaps,
    shard_identity as identity, shard_owner as owner_of, wait_acknowledged,
};

const GROUP: &str = "manager-shards";
const LIMIT: Duration = Duration::from_secs(5);
const KEYS: usize = 12;
/// How long the second controller's reconcile of an object annotated
/// `slow` takes: longer than a hand-over, shorter than the fencing grace.
const SLOW: Duration = Duration::from_millis(1200);

/// Fast rounds, but a long lease, so the fencing grace (half of lease
/// duration minus renew deadline: 1.5 s) outlasts a slow reconcile and a
/// lost key in flight runs to its end rather than being cancelled: what
/// holds the new owner back is then the old owner's acknowledgement alone.
fn config(replica: usize) -> ShardConfig {
    ShardConfig::new(GROUP, "default", identity(replica))
        .with_lease_duration(Duration::from_secs(4))
        .with_renew_deadline(Duration::from_secs(1))
        .with_retry_period(RETRY)
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
    /// Whether reconciles of objects annotated `slow` take [`SLOW`].
    slow: bool,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let running = ctx.record.start(&cm, ctx.replica);
    let slow = ctx.slow && cm.annotations().contains_key("slow");
    sleep(if slow { SLOW } else { Duration::from_millis(5) }).await;
    running.finish();
    Ok(Action::await_change())
}

fn policy(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// A replica: a manager with two controllers on the ConfigMaps (all
/// namespaces, and `default` only: two caches), one membership for both.
/// `records[i]` is controller `i`'s; the second is the slow one.
fn replica(server: &LocalApiServer, replica: usize, records: &[Arc<Record>; 2]) -> Running {
    let client = server.client();
    let mut manager = Manager::new(client.clone());
    manager
        .shards(Shards::new(client.clone(), config(replica)))
        .unwrap();
    let ctx = |i: usize| {
        Arc::new(Ctx {
            record: records[i].clone(),
            replica,
            slow: i == 1,
        })
    };
    let all = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .run(reconcile, policy, ctx(0));
    let default = manager
        .controller(
            Api::<ConfigMap>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .run(reconcile, policy, ctx(1));
    manager
        .add("all", all)
        .unwrap()
        .add("default", default)
        .unwrap();
    Running::start(manager)
}

/// Waits until some run of `record` matches, up to `LIMIT`.
async fn wait_run(record: &Record, what: &str, matches: impl Fn(&Run) -> bool) -> Run {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(run) = record.runs().into_iter().find(&matches) {
            return run;
        }
        assert!(Instant::now() < deadline, "{what}: {:?}", record.runs());
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_membership_for_every_controller_and_a_hand_over_waits_for_each_of_them() {
    let server = server_with_configmaps(KEYS).await;
    let client = server.client();
    let records = [Arc::new(Record::default()), Arc::new(Record::default())];
    let mut replicas: Vec<Running> = (0..2).map(|i| replica(&server, i, &records)).collect();
    // One Lease per replica, not per controller. (Replica 0 may have
    // reconciled every key alone before replica 1 joined.) Once both
    // acknowledge both, a change to every key is reconciled by its owner
    // alone, in each controller.
    wait_acknowledged(&client, GROUP, &[0, 1], true, LIMIT).await;
    let names: Vec<String> = (0..KEYS).map(|i| format!("cm-{i}")).collect();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut changed = Vec::new();
    for name in &names {
        let patch = serde_json::json!({ "metadata": { "annotations": { "round": "1" } } });
        let cm = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let version: u64 = cm.resource_version().unwrap().parse().unwrap();
        changed.push((name.clone(), version));
    }
    for record in &records {
        for (name, version) in &changed {
            wait_run(record, "every change reconciled", |r| {
                &r.key == name && r.version >= *version && r.finished
            })
            .await;
        }
        let by_others: Vec<Run> = record
            .runs()
            .into_iter()
            .filter(|r| {
                changed.iter().any(|(n, v)| *n == r.key && r.version >= *v)
                    && r.replica != owner_of(&r.key, &[0, 1])
            })
            .collect();
        assert!(
            by_others.is_empty(),
            "reconciled off its owner: {by_others:?}"
        );
    }

    // A key that moves to the third replica when it joins: the slow
    // controller is reconciling it on its owner when that happens, the
    // fast one is not.
    let moving = names
        .iter()
        .find(|n| owner_of(n, &[0, 1, 2]) == 2)
        .expect("some key moves to the third replica")
        .clone();
    let from = owner_of(&moving, &[0, 1]);
    let patch = serde_json::json!({ "metadata": { "annotations": { "slow": "1" } } });
    let slowed: u64 = api
        .patch(&moving, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    let slow = wait_run(&records[1], "the slow reconcile started", |r| {
        r.key == moving && r.replica == from && r.version >= slowed && r.end.is_none()
    })
    .await;
    wait_run(&records[0], "the fast reconcile finished", |r| {
        r.key == moving && r.replica == from && r.version >= slowed && r.finished
    })
    .await;
    replicas.push(replica(&server, 2, &records));

    // The new owner starts the key in each controller only once the slow
    // controller on the old owner let go of it (it ran out or was
    // cancelled): the old owner acknowledged for both controllers at once.
    let mut firsts = Vec::new();
    for record in &records {
        firsts.push(
            wait_run(record, "the new owner reconciled the key", |r| {
                r.key == moving && r.replica == 2
            })
            .await,
        );
    }
    let slow_end = records[1]
        .runs()
        .iter()
        .find(|r| r.key == moving && r.replica == from && r.start == slow.start)
        .and_then(|r| r.end);
    for first in &firsts {
        assert!(
            slow_end.is_some_and(|end| first.start >= end),
            "the new owner started {moving} at {:?}, while the old owner's slow controller \
             still ran it (it ended at {slow_end:?})",
            first.start
        );
    }
    wait_acknowledged(&client, GROUP, &[0, 1, 2], true, LIMIT).await;
    for record in &records {
        record.check_no_overlap().unwrap();
    }

    // A replica that shuts down drains both controllers, then releases its
    // one Lease.
    replicas.remove(2).stop(LIMIT).await;
    assert_eq!(
        lease_holder(client.clone(), &format!("{GROUP}-{}", identity(2))).await,
        None
    );
    for record in &records {
        assert!(
            record
                .runs()
                .iter()
                .filter(|r| r.replica == 2)
                .all(|r| r.end.is_some()),
            "{:?}",
            record.runs()
        );
    }
}

#[tokio::test]
async fn shards_after_controllers_twice_beside_an_election_or_with_a_bad_config_are_refused() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let shards = |config: ShardConfig| Shards::new(client.clone(), config);

    let mut manager = Manager::new(client.clone());
    let bad = config(0).with_renew_deadline(Duration::from_secs(8));
    assert!(matches!(
        manager.shards(shards(bad)).err().unwrap(),
        ManagerError::InvalidLeaseConfig(_)
    ));
    manager.shards(shards(config(0))).unwrap();
    let twice = manager.shards(shards(config(0))).err().unwrap();
    assert!(matches!(twice, ManagerError::ShardsTwice), "{twice}");
    let election = LeaderElection::new(client.clone(), LeaseConfig::new("m", "default", "me"));
    let both = manager.leader_election(election.clone()).err().unwrap();
    assert!(matches!(both, ManagerError::ElectionWithShards), "{both}");

    let mut elected = Manager::new(client.clone());
    elected.leader_election(election).unwrap();
    let both = elected.shards(shards(config(0))).err().unwrap();
    assert!(matches!(both, ManagerError::ElectionWithShards), "{both}");

    let mut late = Manager::new(client.clone());
    let _controller = late.controller_for::<ConfigMap>(watcher::Config::default());
    let error = late.shards(shards(config(0))).err().unwrap();
    assert!(matches!(error, ManagerError::ShardsAfterControllers));
    assert!(error.to_string().contains("before"), "{error}");
}

/// `/readyz` follows the shard Lease: 503 until the first renewal, 200
/// while renewals are on time, 503 again once the replica, cut off from
/// the API server, is past its renew deadline (it fences then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_shard_lease() {
    let server = server_with_configmaps(2).await;
    let endpoint = server.endpoint();
    let client = endpoint.client();
    let mut manager = Manager::new(client.clone());
    // A renewal takes at least 300 ms: `/readyz` is asked before it ends.
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .verb(Verb::Create)
            .resource("leases")
            .times(1),
    );
    manager
        .shards(Shards::new(client.clone(), config(0)))
        .unwrap();
    let stream = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .run(
            |_, _: Arc<()>| async { Ok::<_, TestError>(Action::await_change()) },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
    manager.add("all", stream).unwrap();
    manager.serve("127.0.0.1:0").unwrap();
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);

    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shard lease"), "{body}");
    let deadline = Instant::now() + LIMIT;
    while get(addr, "/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        sleep(RETRY).await;
    }
    // Cut off: renewals fail; past the renew deadline it is not ready.
    endpoint.disconnect();
    let cut = Instant::now();
    loop {
        let (status, body) = get(addr, "/readyz").await;
        if status == 503 {
            assert!(body.contains("renew deadline"), "{body}");
            break;
        }
        assert!(Instant::now() < cut + LIMIT, "still ready while cut off");
        sleep(RETRY).await;
    }
    // The deadline runs from the last renewal sent before the cut, at most
    // a round (a renewal, a list and a retry period) earlier: well after
    // half the renew deadline of 1 s, whatever the machine's load.
    assert!(
        cut.elapsed() >= Duration::from_millis(500),
        "not ready {:?} after the cut, long before the renew deadline",
        cut.elapsed()
    );
    assert_eq!(get(addr, "/healthz").await.0, 200);
    run.stop(LIMIT).await;
}
