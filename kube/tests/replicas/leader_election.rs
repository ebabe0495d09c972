//! Leader election across replicas: three electors or controllers in one
//! process, each with its own endpoint and client on one local API server,
//! with crashes, graceful releases, a replica cut off from the server and
//! wall clocks skewed by 5 s.
//!
//! The controllers' reconcile function writes every start and end (key,
//! replica, times) to a record of its own; a guard writes the end when the
//! reconcile is dropped, so a cancelled reconcile ends where it stopped
//! running. The checks read only that record: never two replicas
//! reconciling one key at once (in fact never two replicas reconciling
//! anything at once), and failover times.
//!
//! The API server runs on real time on its own thread, so these tests use
//! short real timings (lease 600 ms, renew deadline 400 ms, retry 100 ms)
//! and each runs for a few seconds at most.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams};
use kube_client::{Api, ResourceExt};
use kube_local_apiserver::{Endpoint, LocalApiServer, Verb};
use kube_runtime::watcher;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::leader::{LeaderElection, LeaderState, LeaseConfig, LeaseConfigError};
use tokio_workqueue_kube::{Action, Controller, ControllerError, Error};

use crate::replica_common::{
    CRASH_FAILOVER_MAX, LEASE, RELEASE_FAILOVER_MAX, RENEW, RETRY, Record, Run, TestError,
    fast_lease, lease_holder, server_with_configmaps, skewed,
};

/// Longest any wait in these tests may take.
const LIMIT: Duration = Duration::from_secs(3);
const KEYS: usize = 4;

fn config(replica: usize) -> LeaseConfig {
    fast_lease("replicas", format!("replica-{replica}"))
}

impl Record {
    /// The first run started after `after` by a replica other than
    /// `not`, waiting up to `LIMIT` for it.
    async fn first_start_after(&self, after: Instant, not: Option<usize>) -> Run {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(run) = self
                .runs()
                .into_iter()
                .filter(|r| r.start >= after && Some(r.replica) != not)
                .min_by_key(|r| r.start)
            {
                return run;
            }
            assert!(Instant::now() < deadline, "nobody reconciled in {LIMIT:?}");
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Panics if two runs overlap in time while being of one key, or (since
    /// only the leader reconciles) of two replicas.
    fn check_one_leader_at_a_time(&self) {
        self.check_no_overlap().unwrap();
        let now = Instant::now();
        let runs = self.runs();
        assert!(!runs.is_empty(), "nothing was reconciled");
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                let overlap = a.start < b.end.unwrap_or(now) && b.start < a.end.unwrap_or(now);
                assert!(
                    !(overlap && a.replica != b.replica),
                    "two replicas reconciling at once: {a:?} and {b:?}"
                );
            }
        }
    }

    fn replicas_after(&self, after: Instant) -> Vec<usize> {
        let mut replicas: Vec<usize> = self
            .runs()
            .iter()
            .filter(|r| r.start >= after)
            .map(|r| r.replica)
            .collect();
        replicas.sort_unstable();
        replicas.dedup();
        replicas
    }
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
    /// How long each reconcile takes.
    work: Duration,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let _running = ctx.record.start(&cm, ctx.replica);
    sleep(ctx.work).await;
    Ok(Action::requeue(Duration::from_millis(20)))
}

fn error_policy(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(20))
}

/// One controller replica on its own endpoint.
struct Replica {
    endpoint: Endpoint,
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
    /// The controller's error reports, as text.
    errors: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    fn start(
        server: &LocalApiServer,
        replica: usize,
        record: &Arc<Record>,
        skew_seconds: i64,
    ) -> Replica {
        Self::start_with(
            server,
            replica,
            record,
            skew_seconds,
            Duration::from_millis(30),
        )
    }

    fn start_with(
        server: &LocalApiServer,
        replica: usize,
        record: &Arc<Record>,
        skew_seconds: i64,
        work: Duration,
    ) -> Replica {
        let endpoint = server.endpoint();
        let client = endpoint.client();
        let (shutdown, graceful) = oneshot::channel::<()>();
        let election =
            LeaderElection::new(client.clone(), config(replica)).wall_clock(skewed(skew_seconds));
        let stream = Controller::new(
            Api::<ConfigMap>::namespaced(client, "default"),
            watcher::Config::default(),
        )
        .leader_election(election)
        .graceful_shutdown_on(async move {
            let _ = graceful.await;
        })
        .run(
            reconcile,
            error_policy,
            Arc::new(Ctx {
                record: record.clone(),
                replica,
                work,
            }),
        );
        let errors = Arc::new(Mutex::new(Vec::new()));
        let reported = errors.clone();
        let task = tokio::spawn(stream.for_each(move |item| {
            if let Err(e) = item {
                reported.lock().unwrap().push(e.to_string());
            }
            async {}
        }));
        Replica {
            endpoint,
            task,
            shutdown: Some(shutdown),
            errors,
        }
    }

    /// Stops without releasing anything, as a crashed process.
    fn crash(&self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn replica_leader_crash_fails_over_within_lease_plus_retry() {
    let server = server_with_configmaps(KEYS).await;
    let record = Arc::new(Record::default());
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&server, i, &record, 0))
        .collect();

    let first = record.first_start_after(Instant::now(), None).await;
    sleep(Duration::from_millis(500)).await;
    // The leader reconciles all along; the others never do.
    let t = Instant::now() - Duration::from_millis(400);
    assert_eq!(record.replicas_after(t), [first.replica]);

    let lists = |r: &Replica| r.endpoint.requests().of(Verb::List, "configmaps");
    let lists_before: Vec<u64> = replicas.iter().map(lists).collect();
    replicas[first.replica].crash();
    let crashed = Instant::now();
    // Every key changes while nobody leads.
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let patch = Patch::Merge(json!({ "data": { "v": "after the crash" } }));
    let mut changed = Vec::new();
    for i in 0..KEYS {
        let cm = api
            .patch(&format!("cm-{i}"), &PatchParams::default(), &patch)
            .await
            .unwrap();
        changed.push((
            cm.name_any(),
            cm.resource_version().unwrap().parse::<u64>().unwrap(),
        ));
    }
    let next = record.first_start_after(crashed, Some(first.replica)).await;
    let failover = next.start - crashed;
    println!("failover after a crash: {failover:?}");
    assert!(
        failover <= CRASH_FAILOVER_MAX,
        "failover took {failover:?}, more than {CRASH_FAILOVER_MAX:?}"
    );
    // The lease was not released: the failover waited for it to expire.
    assert!(
        failover >= LEASE - 2 * RETRY,
        "failover took only {failover:?}"
    );
    sleep(Duration::from_millis(300)).await;
    record.check_one_leader_at_a_time();
    assert_eq!(
        lease_holder(server.client(), "replicas").await,
        Some(format!("replica-{}", next.replica))
    );
    // The new leader reconciled every change made while nobody led, from
    // the store it kept warm: no replica listed again.
    let runs = record.runs();
    for (key, version) in &changed {
        assert!(
            runs.iter()
                .any(|r| r.replica == next.replica && &r.key == key && r.version >= *version),
            "{key} at version {version} was not reconciled"
        );
    }
    for (i, replica) in replicas.iter().enumerate() {
        if i != first.replica {
            assert_eq!(lists(replica), lists_before[i], "replica {i} listed again");
        }
    }
}

#[tokio::test]
async fn replica_graceful_shutdown_releases_for_immediate_failover() {
    let server = server_with_configmaps(KEYS).await;
    let record = Arc::new(Record::default());
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&server, i, &record, 0))
        .collect();
    let first = record.first_start_after(Instant::now(), None).await;
    sleep(Duration::from_millis(200)).await;

    let leader = &mut replicas[first.replica];
    leader.shutdown.take().unwrap().send(()).unwrap();
    // The stream ends once the queue drained and the lease is released.
    tokio::time::timeout(LIMIT, &mut leader.task)
        .await
        .expect("the leader's controller ended")
        .unwrap();
    let released = Instant::now();
    // Released: the Lease no longer names the old leader (a follower may
    // have taken it already, at its next try).
    let old = format!("replica-{}", first.replica);
    assert_ne!(
        lease_holder(server.client(), "replicas").await.as_deref(),
        Some(old.as_str())
    );
    let next = record
        .first_start_after(released, Some(first.replica))
        .await;
    let failover = next.start - released;
    println!("failover after a release: {failover:?}");
    // At the next try, not a lease duration later.
    assert!(
        failover <= RELEASE_FAILOVER_MAX,
        "failover took {failover:?}"
    );
    sleep(Duration::from_millis(200)).await;
    record.check_one_leader_at_a_time();
}

#[tokio::test]
async fn replica_cut_off_from_the_api_server_fences_before_another_takes_over() {
    let server = server_with_configmaps(KEYS).await;
    let record = Arc::new(Record::default());
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&server, i, &record, 0))
        .collect();
    let first = record.first_start_after(Instant::now(), None).await;
    sleep(Duration::from_millis(300)).await;

    replicas[first.replica].endpoint.disconnect();
    let cut = Instant::now();
    let next = record.first_start_after(cut, Some(first.replica)).await;
    println!("takeover after a cut-off: {:?}", next.start - cut);
    // The cut-off leader's last reconcile ended before the new leader's
    // first one started.
    let old_runs: Vec<Run> = record
        .runs()
        .into_iter()
        .filter(|r| r.replica == first.replica)
        .collect();
    let last_end = old_runs
        .iter()
        .map(|r| r.end.expect("ended"))
        .max()
        .unwrap();
    assert!(
        last_end < next.start,
        "the old leader was still reconciling"
    );
    // It stopped within its renew deadline plus the fencing grace.
    assert!(last_end - cut <= RENEW + config(0).fencing_grace() + RETRY);

    replicas[first.replica].endpoint.reconnect();
    let back = Instant::now();
    sleep(LEASE * 2).await;
    // Back online, it follows: the new leader goes on alone.
    assert_eq!(record.replicas_after(back), [next.replica]);
    record.check_one_leader_at_a_time();
}

#[tokio::test]
async fn replica_cut_off_cancels_long_reconciles_within_the_fencing_grace() {
    let server = server_with_configmaps(KEYS).await;
    let record = Arc::new(Record::default());
    // Reconciles that would run far past any lease.
    let work = Duration::from_secs(30);
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start_with(&server, i, &record, 0, work))
        .collect();
    let first = record.first_start_after(Instant::now(), None).await;
    sleep(Duration::from_millis(100)).await;
    let leader = &replicas[first.replica];

    leader.endpoint.disconnect();
    let cut = Instant::now();
    let next = record.first_start_after(cut, Some(first.replica)).await;
    let old: Vec<Run> = record
        .runs()
        .into_iter()
        .filter(|r| r.replica == first.replica)
        .collect();
    assert_eq!(old.len(), KEYS, "every key was in flight on the old leader");
    for run in &old {
        let end = run.end.expect("cancelled");
        assert!(end < next.start, "{run:?} still ran when {next:?} started");
        assert!(
            end - cut <= RENEW + config(0).fencing_grace() + RETRY,
            "cancelled {:?} after the cut",
            end - cut
        );
    }
    let fenced = leader
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.contains("stopped leading"))
        .count();
    assert_eq!(fenced, KEYS);
    record.check_one_leader_at_a_time();
}

#[tokio::test]
async fn replica_wall_clocks_5_s_off_do_not_make_two_leaders() {
    let server = server_with_configmaps(KEYS).await;
    let record = Arc::new(Record::default());
    // A leader whose clock is 5 s behind writes renewTimes that look long
    // expired to anyone comparing them with their own clock.
    let behind = Replica::start(&server, 0, &record, -5);
    let first = record.first_start_after(Instant::now(), None).await;
    assert_eq!(first.replica, 0);
    let ahead = Replica::start(&server, 1, &record, 5);
    sleep(LEASE * 2).await;
    assert_eq!(record.replicas_after(first.start), [0]);

    // A leader whose clock is 5 s ahead writes renewTimes that look
    // unexpired for 5 s more: failover must not wait for them.
    behind.crash();
    let crashed = Instant::now();
    let second = record.first_start_after(crashed, Some(0)).await;
    assert_eq!(second.replica, 1);
    let _exact = Replica::start(&server, 2, &record, 0);
    sleep(LEASE * 2).await;
    assert_eq!(record.replicas_after(second.start), [1]);
    ahead.crash();
    let crashed = Instant::now();
    let third = record.first_start_after(crashed, Some(1)).await;
    let failover = third.start - crashed;
    println!("failover from a leader 5 s ahead: {failover:?}");
    assert_eq!(third.replica, 2);
    assert!(failover <= CRASH_FAILOVER_MAX, "failover took {failover:?}");
    sleep(Duration::from_millis(200)).await;
    record.check_one_leader_at_a_time();
}

#[tokio::test]
async fn replica_electors_elect_one_fence_when_cut_off_and_follow_when_back() {
    let server = LocalApiServer::start().await;
    let endpoints: Vec<Endpoint> = (0..3).map(|_| server.endpoint()).collect();
    let electors: Vec<_> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| LeaderElection::new(ep.client(), config(i)).start().unwrap())
        .collect();
    let leader = wait_for_one_leader(&electors, None).await;
    let leading: Vec<bool> = electors.iter().map(|e| e.is_leader()).collect();
    assert_eq!(leading.iter().filter(|l| **l).count(), 1);

    endpoints[leader].disconnect();
    let cut = Instant::now();
    let mut state = electors[leader].state();
    tokio::time::timeout(LIMIT, state.wait_for(|s| *s == LeaderState::Fenced))
        .await
        .unwrap()
        .unwrap();
    let fenced = Instant::now();
    // Nobody else could lead yet.
    assert!(electors.iter().all(|e| !e.is_leader()));
    assert!(
        fenced - cut <= RENEW + RETRY,
        "fenced after {:?}",
        fenced - cut
    );
    let next = wait_for_one_leader(&electors, Some(leader)).await;
    let took_over = Instant::now();
    assert!(took_over - fenced >= LEASE - RENEW - RETRY);

    endpoints[leader].reconnect();
    tokio::time::timeout(LIMIT, state.wait_for(|s| *s == LeaderState::Following))
        .await
        .unwrap()
        .unwrap();
    assert!(electors[next].is_leader());
    assert!(!electors[leader].is_leader());
}

#[tokio::test]
async fn replica_elector_release_hands_over_at_the_next_try() {
    let server = LocalApiServer::start().await;
    let mut electors: Vec<Option<_>> = (0..3)
        .map(|i| {
            Some(
                LeaderElection::new(server.endpoint().client(), config(i))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let all: Vec<_> = electors.iter().flatten().collect();
    let leader = wait_for_one_leader(&all, None).await;
    let elector = electors[leader].take().unwrap();
    let mut state = elector.state();
    assert!(elector.release().await.unwrap());
    assert_eq!(*state.borrow_and_update(), LeaderState::Following);
    let released = Instant::now();
    let rest: Vec<_> = electors.iter().flatten().collect();
    wait_for_one_leader(&rest, None).await;
    let failover = released.elapsed();
    println!("elector failover after a release: {failover:?}");
    assert!(
        failover <= RELEASE_FAILOVER_MAX,
        "failover took {failover:?}"
    );
    let lease: Lease = Api::namespaced(server.client(), "default")
        .get("replicas")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));
}

/// Waits for one of `electors` other than `not` to lead; its index.
async fn wait_for_one_leader(
    electors: &[impl std::borrow::Borrow<tokio_workqueue_kube::leader::LeaderElector>],
    not: Option<usize>,
) -> usize {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(i) = electors
            .iter()
            .position(|e| e.borrow().is_leader())
            .filter(|i| Some(*i) != not)
        {
            return i;
        }
        assert!(Instant::now() < deadline, "no leader within {LIMIT:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn replica_invalid_lease_config_is_an_error_not_a_panic() {
    let server = LocalApiServer::start().await;
    let bad = config(0).with_renew_deadline(LEASE);
    let err = LeaderElection::new(server.client(), bad.clone())
        .start()
        .unwrap_err();
    assert!(matches!(
        err,
        LeaseConfigError::RenewDeadlineNotShorterThanLease { .. }
    ));

    let record = Arc::new(Record::default());
    let items: Vec<_> = Controller::new(
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .leader_election(LeaderElection::new(server.client(), bad))
    .run(
        reconcile,
        error_policy,
        Arc::new(Ctx {
            record,
            replica: 0,
            work: Duration::ZERO,
        }),
    )
    .collect()
    .await;
    assert_eq!(items.len(), 1);
    match &items[0] {
        Err(Error::QueueError(ControllerError::InvalidLeaseConfig(e))) => {
            assert!(e.to_string().contains("renew deadline"));
        }
        other => panic!("unexpected item {other:?}"),
    }
    // Nothing was written.
    assert_eq!(lease_holder(server.client(), "replicas").await, None);
}

#[cfg(feature = "prometheus")]
#[tokio::test]
async fn replica_gauge_reports_who_leads() {
    use tokio_workqueue_kube::leader::LeaderMetrics;

    let server = LocalApiServer::start().await;
    // One gauge family per replica, as each process has its own registry.
    let metrics: Vec<LeaderMetrics> = (0..3).map(|_| LeaderMetrics::new()).collect();
    let mut electors: Vec<Option<_>> = metrics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            Some(
                LeaderElection::new(server.endpoint().client(), config(i))
                    .metrics(m.clone())
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let all: Vec<_> = electors.iter().flatten().collect();
    let leader = wait_for_one_leader(&all, None).await;
    let status: Vec<i64> = metrics.iter().map(|m| m.status("replicas")).collect();
    let mut expected = vec![0; 3];
    expected[leader] = 1;
    assert_eq!(status, expected);

    let mut registry = prometheus_client::registry::Registry::default();
    metrics[leader].register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("leader_election_master_status{name=\"replicas\"} 1"),
        "{text}"
    );

    electors[leader].take().unwrap().release().await.unwrap();
    assert_eq!(metrics[leader].status("replicas"), 0);
}
