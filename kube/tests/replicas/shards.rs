//! Shards across replicas: three (or four) controllers in one process, each
//! with its own endpoint and client on one local API server, splitting the
//! keys of one shard group by rendezvous hashing while replicas join,
//! crash, shut down, are cut off from the server or run with wall clocks
//! 5 s off.
//!
//! The reconcile function writes every start and end (key, replica, the
//! resourceVersion it saw, times) to a record of its own; a guard writes
//! the end when the reconcile is dropped, so a cancelled reconcile ends
//! where it stopped running. Every test ends with two checks on that
//! record alone, independent of the code under test:
//! - never two reconciles of one key at once (by two replicas, or one);
//! - every key's last change was reconciled after it was made, by a
//!   replica still running.
//!
//! Settling is read from the cluster, not from the code under test's
//! state: the group is steady once every live member's Lease acknowledges
//! exactly the live members.
//!
//! The API server runs on real time on its own thread, so these tests use
//! short real timings (lease 600 ms, renew deadline 400 ms, retry 100 ms),
//! wait for conditions with deadlines, and each runs for a few seconds.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube_client::api::ListParams;
use kube_client::{Api, ResourceExt};
use kube_local_apiserver::{Endpoint, LocalApiServer};
use kube_runtime::reflector::Store;
use kube_runtime::watcher;
use serde_json::json;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig, LeaseConfigError};
use tokio_workqueue_kube::shard::{ACK_ANNOTATION, LabelRate, ShardConfig, Shards, label_key};
use tokio_workqueue_kube::{Action, Controller, ControllerError, Error};

use crate::replica_common::{
    LEASE, RENEW, RETRY, Record, Run, TestError, group_leases, shard_identity as identity,
    shard_owner as owner_of, skewed, wait_acknowledged,
};

const GROUP: &str = "shards";
/// Longest any wait in these tests may take.
const LIMIT: Duration = Duration::from_secs(3);

fn config(replica: usize) -> ShardConfig {
    ShardConfig::new(GROUP, "default", identity(replica))
        .with_lease_duration(LEASE)
        .with_renew_deadline(RENEW)
        .with_retry_period(RETRY)
}

fn owners(names: &[String], members: &[usize]) -> HashMap<String, usize> {
    names
        .iter()
        .map(|n| (n.clone(), owner_of(n, members)))
        .collect()
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("cm-{i}")).collect()
}

impl Record {
    /// The replica whose run of each key started last.
    fn last_reconcilers(&self) -> HashMap<String, usize> {
        let mut last: HashMap<String, (Instant, usize)> = HashMap::new();
        for run in self.runs() {
            let e = last
                .entry(run.key.clone())
                .or_insert((run.start, run.replica));
            if run.start >= e.0 {
                *e = (run.start, run.replica);
            }
        }
        last.into_iter().map(|(k, (_, r))| (k, r)).collect()
    }

    /// The first run started at or after `after` that `matches`.
    fn first(&self, after: Instant, matches: impl Fn(&Run) -> bool) -> Option<Run> {
        self.runs()
            .into_iter()
            .filter(|r| r.start >= after && matches(r))
            .min_by_key(|r| r.start)
    }

    /// Waits up to `LIMIT` for [`first`](Self::first).
    async fn wait_first(&self, what: &str, after: Instant, matches: impl Fn(&Run) -> bool) -> Run {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(run) = self.first(after, &matches) {
                return run;
            }
            assert!(Instant::now() < deadline, "{what}: not within {LIMIT:?}");
            sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every run of a key in `names` started at or after `after` was by
    /// the owner of its key among `members`; and every one was run since.
    fn check_owners_since(
        &self,
        after: Instant,
        names: &[String],
        members: &[usize],
    ) -> Result<(), String> {
        let owners = owners(names, members);
        let runs: Vec<Run> = self
            .runs()
            .into_iter()
            .filter(|r| r.start >= after && owners.contains_key(&r.key))
            .collect();
        if let Some(r) = runs.iter().find(|r| owners[&r.key] != r.replica) {
            return Err(format!(
                "{r:?} by a replica that does not own it among {members:?} (owner: replica-{})",
                owners[&r.key]
            ));
        }
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !runs.iter().any(|r| &r.key == *n))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} keys not reconciled since, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            ))
        }
    }

    /// Every key's last reconcile was by its owner among `members`.
    fn check_last_by_owners(&self, names: &[String], members: &[usize]) -> Result<(), String> {
        let last = self.last_reconcilers();
        let owners = owners(names, members);
        let wrong: Vec<(&String, Option<&usize>, usize)> = names
            .iter()
            .map(|n| (n, last.get(n), owners[n]))
            .filter(|(_, last, owner)| *last != Some(owner))
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} keys last reconciled by another than their owner among {members:?}, e.g. (key, last, owner) {:?}",
                wrong.len(),
                &wrong[..wrong.len().min(5)]
            ))
        }
    }
}

/// The last change the test made to each key.
#[derive(Default)]
struct Changes {
    last: Mutex<BTreeMap<String, Change>>,
}

#[derive(Debug, Clone, Copy)]
struct Change {
    version: u64,
    /// Just before the write was sent.
    made: Instant,
}

impl Changes {
    /// Creates or replaces ConfigMap `name` with `value` (through the
    /// server's backdoor: the same watch events as the API, no HTTP) and
    /// remembers the change.
    fn set(&self, server: &LocalApiServer, name: &str, value: &str) {
        let made = Instant::now();
        // Labels stay as they are (a split cache's shard label among them).
        let labels = server
            .object("v1", "ConfigMap", Some("default"), name)
            .and_then(|o| o["metadata"].get("labels").cloned())
            .unwrap_or_else(|| json!({}));
        let stored = server
            .upsert(&json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name, "namespace": "default", "labels": labels },
                "data": { "v": value },
            }))
            .expect("stored");
        let version = stored["metadata"]["resourceVersion"]
            .as_str()
            .expect("a resourceVersion")
            .parse()
            .expect("a number");
        self.last
            .lock()
            .unwrap()
            .insert(name.to_owned(), Change { version, made });
    }

    fn set_all(&self, server: &LocalApiServer, names: &[String], value: &str) {
        for name in names {
            self.set(server, name, value);
        }
    }

    /// Check (b): every key's last change was reconciled after it was made,
    /// at that version or a later one, by one of `live`.
    fn check_reconciled(&self, record: &Record, live: &[usize]) -> Result<(), String> {
        let runs = record.runs();
        let last = self.last.lock().unwrap().clone();
        let missing: Vec<(&String, &Change)> = last
            .iter()
            .filter(|(key, change)| {
                !runs.iter().any(|r| {
                    &r.key == *key
                        && r.version >= change.version
                        && r.start >= change.made
                        && live.contains(&r.replica)
                })
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} keys' last change not reconciled by {live:?}, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            ))
        }
    }
}

/// Waits up to `limit` for `check` to pass; panics with its last error.
async fn wait_until(what: &str, limit: Duration, check: impl Fn() -> Result<(), String>) {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: not within {limit:?}: {e}"),
            Err(_) => sleep(Duration::from_millis(10)).await,
        }
    }
}

/// The checks every test ends with: (b) waited for, then (a).
async fn final_checks(record: &Record, changes: &Changes, live: &[usize]) {
    wait_until("every key's last change reconciled", LIMIT, || {
        changes.check_reconciled(record, live)
    })
    .await;
    record.check_no_overlap().unwrap();
}

/// Waits until the group's members `live` hold their Leases and
/// acknowledge exactly `live` (other Leases may stay); returns when it saw
/// that.
async fn acknowledged(server: &LocalApiServer, live: &[usize]) -> Instant {
    wait_acknowledged(&server.client(), GROUP, live, false, LIMIT).await
}

struct Ctx {
    record: Arc<Record>,
    replica: usize,
    /// How long each reconcile takes.
    work: Duration,
    /// Requeue after each reconcile, or wait for a change.
    requeue: Option<Duration>,
    /// While set, reconciles started take far longer than any lease.
    slow: Arc<AtomicBool>,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let running = ctx.record.start(&cm, ctx.replica);
    let work = if ctx.slow.load(Ordering::SeqCst) {
        Duration::from_secs(30)
    } else {
        ctx.work
    };
    sleep(work).await;
    running.finish();
    Ok(ctx
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

fn error_policy(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(20))
}

/// How a replica runs.
#[derive(Clone)]
struct Opts {
    work: Duration,
    requeue: Option<Duration>,
    skew_seconds: i64,
    /// Split the cache, at this label rate if given (the default's if not).
    split: bool,
    label_rate: Option<LabelRate>,
    #[cfg(feature = "prometheus")]
    metrics: Option<tokio_workqueue_kube::shard::ShardMetrics>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            work: Duration::from_millis(20),
            requeue: None,
            skew_seconds: 0,
            split: false,
            label_rate: None,
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }
}

/// One controller replica on its own endpoint.
struct Replica {
    endpoint: Endpoint,
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
    /// The controller's error reports, as text.
    errors: Arc<Mutex<Vec<String>>>,
    /// How many reconciles it reported cancelled by fencing.
    fenced: Arc<AtomicUsize>,
    /// Makes its reconciles slow (see `Ctx::slow`).
    slow: Arc<AtomicBool>,
    /// While true, nobody polls its controller stream.
    stall: watch::Sender<bool>,
    /// Its controller's store.
    store: Store<ConfigMap>,
    /// Its membership (for the label writes it made as coordinator).
    shards: Shards,
}

impl Replica {
    fn start(server: &LocalApiServer, replica: usize, record: &Arc<Record>, opts: Opts) -> Self {
        let endpoint = server.endpoint();
        let client = endpoint.client();
        let (shutdown, graceful) = oneshot::channel::<()>();
        let slow = Arc::new(AtomicBool::new(false));
        let config = if opts.split {
            config(replica).split_cache(opts.label_rate.unwrap_or_default())
        } else {
            config(replica)
        };
        let shards = Shards::new(client.clone(), config).wall_clock(skewed(opts.skew_seconds));
        #[cfg(feature = "prometheus")]
        let shards = match opts.metrics {
            Some(m) => shards.metrics(m),
            None => shards,
        };
        let controller = Controller::new(
            Api::<ConfigMap>::namespaced(client, "default"),
            watcher::Config::default(),
        );
        let store = controller.store();
        let stream = controller
            .shards(shards.clone())
            .graceful_shutdown_on(async move {
                let _ = graceful.await;
            })
            .run(
                reconcile,
                error_policy,
                Arc::new(Ctx {
                    record: record.clone(),
                    replica,
                    work: opts.work,
                    requeue: opts.requeue,
                    slow: slow.clone(),
                }),
            );
        let errors = Arc::new(Mutex::new(Vec::new()));
        let fenced = Arc::new(AtomicUsize::new(0));
        let (reported, counted) = (errors.clone(), fenced.clone());
        let (stall, mut stalled) = watch::channel(false);
        // Consumes the stream, except while stalled: then nobody polls it.
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                if *stalled.borrow_and_update() {
                    let _ = stalled.wait_for(|s| !*s).await;
                }
                let item = tokio::select! {
                    item = stream.next() => item,
                    _ = stalled.wait_for(|s| *s) => continue,
                };
                let Some(item) = item else { return };
                if let Err(e) = item {
                    if matches!(
                        e,
                        Error::QueueError(ControllerError::ReconcileFenced { .. })
                    ) {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    reported.lock().unwrap().push(e.to_string());
                }
            }
        });
        Replica {
            endpoint,
            task,
            shutdown: Some(shutdown),
            errors,
            fenced,
            slow,
            stall,
            store,
            shards,
        }
    }

    /// Stops without releasing anything, as a crashed process.
    fn crash(&self) {
        self.task.abort();
    }
}

fn start_all(
    server: &LocalApiServer,
    n: usize,
    record: &Arc<Record>,
    opts: impl Fn(usize) -> Opts,
) -> Vec<Replica> {
    (0..n)
        .map(|i| Replica::start(server, i, record, opts(i)))
        .collect()
}

/// A server with ConfigMaps `cm-0`.. `cm-{n-1}`, their creation recorded
/// as their first change.
async fn server_with(n: usize) -> (LocalApiServer, Vec<String>, Changes) {
    let server = LocalApiServer::start().await;
    let names = names(n);
    let changes = Changes::default();
    changes.set_all(&server, &names, "created");
    (server, names, changes)
}

fn count_by_owner(names: &[String], members: &[usize]) -> BTreeMap<usize, usize> {
    let mut counts = BTreeMap::new();
    for n in names {
        *counts.entry(owner_of(n, members)).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_shards_split_the_keys() {
    let (server, names, changes) = server_with(60).await;
    let record = Arc::new(Record::default());
    let _replicas = start_all(&server, 3, &record, |_| Opts {
        requeue: Some(Duration::from_millis(50)),
        ..Opts::default()
    });
    let all = [0, 1, 2];
    let settled = acknowledged(&server, &all).await;
    println!("split among 3: {:?}", count_by_owner(&names, &all));

    // From then on each key is reconciled (again, as it requeues) and
    // only by its owner.
    wait_until("every key reconciled by its owner", LIMIT, || {
        record.check_owners_since(settled, &names, &all)
    })
    .await;
    let by: Vec<usize> = all
        .iter()
        .map(|&i| {
            record
                .runs()
                .iter()
                .filter(|r| r.start >= settled && r.replica == i)
                .count()
        })
        .collect();
    println!("reconciles per replica since settling: {by:?}");
    assert!(
        by.iter().all(|&n| n > 0),
        "a replica reconciled nothing: {by:?}"
    );

    changes.set_all(&server, &names, "changed");
    final_checks(&record, &changes, &all).await;
    record.check_owners_since(settled, &names, &all).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_joins_and_moves_about_a_quarter_of_the_keys() {
    const KEYS: usize = 1000;
    let (server, names, changes) = server_with(KEYS).await;
    let record = Arc::new(Record::default());
    let three = [0, 1, 2];
    let four = [0, 1, 2, 3];
    let opts = |_| Opts {
        work: Duration::ZERO,
        ..Opts::default()
    };
    let mut replicas = start_all(&server, 3, &record, opts);
    acknowledged(&server, &three).await;
    // Keys a replica gains are queued, so each ends last reconciled by
    // its owner among the three.
    wait_until(
        "every key last reconciled by its owner among 3",
        LIMIT,
        || record.check_last_by_owners(&names, &three),
    )
    .await;
    let before = record.last_reconcilers();

    let joined = Instant::now();
    replicas.push(Replica::start(&server, 3, &record, opts(3)));
    acknowledged(&server, &four).await;
    wait_until(
        "every key last reconciled by its owner among 4",
        LIMIT,
        || record.check_last_by_owners(&names, &four),
    )
    .await;
    let after = record.last_reconcilers();
    let took = record
        .runs()
        .iter()
        .filter(|r| r.start >= joined)
        .map(|r| r.start - joined)
        .max()
        .unwrap_or_default();
    println!("the 4th replica reconciled its keys within {took:?} of joining");

    let mut moved: Vec<&String> = names.iter().filter(|n| before[*n] != after[*n]).collect();
    moved.sort();
    let fraction = moved.len() as f64 / KEYS as f64;
    println!(
        "keys moved from 3 to 4 replicas: {} of {KEYS} = {fraction:.3}",
        moved.len()
    );
    assert!(
        (fraction - 0.25).abs() <= 0.05,
        "moved {fraction:.3} of the keys"
    );
    let mut expected: Vec<&String> = names
        .iter()
        .filter(|n| owner_of(n, &three) != owner_of(n, &four))
        .collect();
    expected.sort();
    assert_eq!(
        moved, expected,
        "the keys moved are not those owner() moves"
    );
    // Only to the newcomer, and nobody else had anything to do: a join
    // takes keys from the others and gives them none.
    assert!(moved.iter().all(|n| after[*n] == 3));
    let others = record
        .runs()
        .into_iter()
        .filter(|r| r.start >= joined && r.replica != 3)
        .count();
    assert_eq!(others, 0, "old members reconciled after the join");

    final_checks(&record, &changes, &four).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_crash_without_release_hands_its_keys_over() {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let replicas = start_all(&server, 3, &record, |_| Opts::default());
    let all = [0, 1, 2];
    let live = [0, 2];
    let crashed = 1;
    acknowledged(&server, &all).await;
    wait_until("every key last reconciled by its owner", LIMIT, || {
        record.check_last_by_owners(&names, &all)
    })
    .await;

    replicas[crashed].crash();
    let crash = Instant::now();
    changes.set_all(&server, &names, "after the crash");
    let owners = owners(&names, &all);
    let first = record
        .wait_first(
            "a live replica starts a crashed replica's key",
            crash,
            |r| owners[&r.key] == crashed && r.replica != crashed,
        )
        .await;
    let handover = first.start - crash;
    println!("hand-over after a crash: {handover:?}");
    assert!(
        handover <= LEASE + 3 * RETRY,
        "hand-over took {handover:?}, more than lease + 3 retry periods"
    );
    // Nobody released: the others waited for the lease to expire.
    assert!(
        handover >= LEASE - 2 * RETRY,
        "hand-over after only {handover:?}"
    );
    // The crashed replica's Lease stays.
    let lease = Api::<Lease>::namespaced(server.client(), "default")
        .get(&format!("{GROUP}-{}", identity(crashed)))
        .await;
    assert!(lease.is_ok(), "the crashed replica's lease is gone");

    final_checks(&record, &changes, &live).await;
    let runs = record.runs();
    assert!(
        !runs
            .iter()
            .any(|r| r.replica == crashed && r.start >= crash),
        "the crashed replica ran"
    );
    // The live replicas' own keys did not wait for the hand-over.
    let slowest = names
        .iter()
        .filter(|n| owners[*n] != crashed)
        .map(|n| {
            runs.iter()
                .filter(|r| &r.key == n && r.start >= crash)
                .map(|r| r.start - crash)
                .min()
                .expect("reconciled")
        })
        .max()
        .unwrap();
    println!("live keys reconciled within {slowest:?} of the crash");
    assert!(
        slowest < first.start - crash,
        "live keys waited for the hand-over"
    );
    acknowledged(&server, &live).await;
    record.check_no_overlap().unwrap();

    // The others took its keys only after writing its Lease as released
    // (so a renewal of its landing late fails).
    let leases = Api::<Lease>::namespaced(server.client(), "default");
    let name = format!("{GROUP}-{}", identity(crashed));
    let lease = leases.get(&name).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the expired Lease was not released"
    );
    // Left so for the forget-after time (four lease durations by default),
    // it is deleted by the others.
    let forget_after = config(crashed).forget_after();
    let deadline = crash + LEASE + forget_after + 4 * RETRY;
    while leases.get_opt(&name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the crashed replica's Lease is still there {:?} after the crash",
            crash.elapsed()
        );
        sleep(Duration::from_millis(10)).await;
    }
    let forgotten = crash.elapsed();
    println!("the crashed replica's Lease was deleted {forgotten:?} after the crash");
    assert!(
        forgotten >= LEASE + forget_after - 2 * RETRY,
        "deleted after only {forgotten:?}"
    );
    assert_eq!(group_leases(server.client(), GROUP).await.len(), live.len());
}

/// Three replicas whose reconciles take 150 ms and requeue after 50 ms, so
/// some are in flight at any time; returned once the group settled and
/// every key was reconciled by its owner.
async fn start_busy(
    server: &LocalApiServer,
    names: &[String],
    record: &Arc<Record>,
    split: bool,
) -> Vec<Replica> {
    let replicas = start_all(server, 3, record, |_| Opts {
        work: Duration::from_millis(150),
        requeue: Some(Duration::from_millis(50)),
        split,
        ..Opts::default()
    });
    let all = [0, 1, 2];
    let settled = acknowledged(server, &all).await;
    wait_until("every key reconciled by its owner", LIMIT, || {
        record.check_owners_since(settled, names, &all)
    })
    .await;
    replicas
}

/// What [`cut_off_while_slow`] saw.
struct CutOff {
    /// When its reconciles turned slow.
    slowed: Instant,
    /// When it was cut off.
    cut: Instant,
    /// The first reconcile of one of its keys by another replica.
    taken: Run,
    /// Its runs until then.
    old: Vec<Run>,
    /// When the last of them ended.
    last_end: Instant,
}

/// Makes `replica`'s reconciles outlast any lease, waits for one to start,
/// stalls its stream if `stall` (nobody polls it), and cuts it off from the
/// API server; then checks that everything it ran ended, by its renew
/// deadline plus the grace, before another replica started one of its
/// keys, and that it started nothing after its renew deadline.
async fn cut_off_while_slow(
    replicas: &[Replica],
    replica: usize,
    record: &Record,
    names: &[String],
    stall: bool,
) -> CutOff {
    replicas[replica].slow.store(true, Ordering::SeqCst);
    let slowed = Instant::now();
    record
        .wait_first("a slow reconcile starts", slowed, |r| r.replica == replica)
        .await;
    if stall {
        replicas[replica].stall.send_replace(true);
    }
    replicas[replica].endpoint.disconnect();
    let cut = Instant::now();
    let owners = owners(names, &[0, 1, 2]);
    let taken = record
        .wait_first(
            "another replica starts a key of the cut-off one",
            cut,
            |r| owners[&r.key] == replica && r.replica != replica,
        )
        .await;
    let old: Vec<Run> = record
        .runs()
        .into_iter()
        .filter(|r| r.replica == replica)
        .collect();
    for run in &old {
        let end = run
            .end
            .unwrap_or_else(|| panic!("{run:?} still runs at the takeover"));
        assert!(end <= taken.start, "{run:?} ran when {taken:?} started");
    }
    let last_end = old.iter().filter_map(|r| r.end).max().unwrap();
    println!("cut-off replica stopped {:?} after the cut", last_end - cut);
    assert!(
        last_end - cut <= RENEW + config(0).fencing_grace() + RETRY,
        "stopped {:?} after the cut",
        last_end - cut
    );
    assert!(
        !old.iter().any(|r| r.start > cut + RENEW),
        "started a reconcile after its renew deadline"
    );
    assert!(
        old.iter().any(|r| !r.finished && r.start >= slowed),
        "nothing was in flight past the grace"
    );
    record.check_no_overlap().unwrap();
    CutOff {
        slowed,
        cut,
        taken,
        old,
        last_end,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_cut_off_from_the_api_server_fences_and_comes_back() {
    cut_off_and_back(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_a_replica_cut_off_fences_and_comes_back() {
    cut_off_and_back(true).await;
}

async fn cut_off_and_back(split: bool) {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let replicas = start_busy(&server, &names, &record, split).await;
    let all = [0, 1, 2];
    let cut_off = 2;
    let CutOff {
        slowed,
        cut,
        taken,
        old,
        last_end,
    } = cut_off_while_slow(&replicas, cut_off, &record, &names, false).await;
    let takeover = taken.start - cut;
    println!("takeover after a cut-off: {takeover:?}");
    assert!(
        takeover >= LEASE - 2 * RETRY,
        "taken over after only {takeover:?}"
    );
    assert!(
        takeover <= LEASE + 3 * RETRY,
        "taken over after {takeover:?}"
    );
    let owners = owners(&names, &all);

    // Reconciles that did not finish within the grace were cancelled and
    // reported so (those of keys it lost while the group formed too).
    let at_cut = old
        .iter()
        .filter(|r| !r.finished && r.start >= slowed)
        .count();
    let cancelled = old.iter().filter(|r| !r.finished).count();
    println!("cancelled by fencing after the cut: {at_cut}, in all: {cancelled}");
    assert!(at_cut > 0, "nothing was in flight past the grace");
    wait_until("the fenced reconciles reported", LIMIT, || {
        let fenced = replicas[cut_off].fenced.load(Ordering::SeqCst);
        if fenced == cancelled {
            Ok(())
        } else {
            Err(format!(
                "{fenced} reported, {cancelled} cancelled: {:?}",
                replicas[cut_off].errors.lock().unwrap()
            ))
        }
    })
    .await;
    // All its keys went to the two others meanwhile.
    let cut_keys: Vec<String> = names
        .iter()
        .filter(|n| owners[*n] == cut_off)
        .cloned()
        .collect();
    wait_until(
        "the others reconciled every key of the cut-off one",
        LIMIT,
        || record.check_owners_since(last_end, &cut_keys, &[0, 1]),
    )
    .await;
    record.check_no_overlap().unwrap();

    replicas[cut_off].slow.store(false, Ordering::SeqCst);
    replicas[cut_off].endpoint.reconnect();
    let back = Instant::now();
    let again = record
        .wait_first("the replica back reconciles", back, |r| {
            r.replica == cut_off
        })
        .await;
    println!(
        "back to reconciling {:?} after reconnecting",
        again.start - back
    );
    let resettled = acknowledged(&server, &all).await;
    wait_until("every key reconciled by its owner again", LIMIT, || {
        record.check_owners_since(resettled, &names, &all)
    })
    .await;
    if split {
        wait_until(
            "each store holding its replica's share again",
            LIMIT,
            || check_stores(&replicas, &names, &all),
        )
        .await;
    }

    changes.set_all(&server, &names, "after the return");
    final_checks(&record, &changes, &all).await;
    record.check_owners_since(resettled, &names, &all).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_clock_5s_ahead_or_behind_changes_nothing() {
    clocks_5s_apart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_clocks_5s_apart_change_nothing() {
    clocks_5s_apart(true).await;
}

async fn clocks_5s_apart(split: bool) {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let skew = [-5, 5, 0];
    let replicas = start_all(&server, 3, &record, |i| Opts {
        requeue: Some(Duration::from_millis(50)),
        skew_seconds: skew[i],
        split,
        ..Opts::default()
    });
    let all = [0, 1, 2];
    let settled = acknowledged(&server, &all).await;
    if split {
        wait_until("each store holding its replica's share", LIMIT, || {
            check_stores(&replicas, &names, &all)
        })
        .await;
    }

    // The clocks are in effect: renewTimes 5 s off either way.
    let now = Timestamp::now();
    for lease in group_leases(server.client(), GROUP).await {
        let name = lease.name_any();
        let renewed = lease.spec.unwrap().renew_time.expect("renewed").0;
        let off = renewed.duration_since(now).as_secs_f64();
        match name.strip_prefix("shards-replica-") {
            Some("0") => assert!(off < -4.0, "replica-0 renewed at {off} s"),
            Some("1") => assert!(off > 4.0, "replica-1 renewed at {off} s"),
            _ => assert!(off.abs() < 1.0, "replica-2 renewed at {off} s"),
        }
    }

    // Steady for twice the lease: the split holds, nothing moves.
    sleep(2 * LEASE).await;
    record.check_owners_since(settled, &names, &all).unwrap();
    acknowledged(&server, &all).await;
    assert!(
        replicas
            .iter()
            .all(|r| r.fenced.load(Ordering::SeqCst) == 0),
        "a replica fenced itself"
    );

    // A crashed replica whose clock is 5 s ahead does not hold its keys
    // for 5 s more.
    replicas[1].crash();
    let crash = Instant::now();
    let owners = owners(&names, &all);
    let first = record
        .wait_first("a live replica starts the crashed one's key", crash, |r| {
            owners[&r.key] == 1 && r.replica != 1
        })
        .await;
    let handover = first.start - crash;
    println!("hand-over from a replica 5 s ahead: {handover:?}");
    assert!(handover <= LEASE + 3 * RETRY, "hand-over took {handover:?}");

    changes.set_all(&server, &names, "changed");
    final_checks(&record, &changes, &[0, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_graceful_shutdown_releases_its_lease_and_hands_over() {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let mut replicas = start_all(&server, 3, &record, |_| Opts::default());
    let all = [0, 1, 2];
    let live = [1, 2];
    let leaving = 0;
    acknowledged(&server, &all).await;
    wait_until("every key last reconciled by its owner", LIMIT, || {
        record.check_last_by_owners(&names, &all)
    })
    .await;

    let replica = &mut replicas[leaving];
    replica.shutdown.take().unwrap().send(()).unwrap();
    let asked = Instant::now();
    tokio::time::timeout(LIMIT, &mut replica.task)
        .await
        .expect("the controller ended")
        .unwrap();
    let ended = Instant::now();
    println!("graceful shutdown took {:?}", ended - asked);
    // Released: no holder, nothing acknowledged (the others delete it
    // after the forget-after time).
    let lease = Api::<Lease>::namespaced(server.client(), "default")
        .get(&config(leaving).lease_name())
        .await
        .unwrap();
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.clone()),
        None,
        "the lease was not released: {lease:?}"
    );
    assert_eq!(
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ACK_ANNOTATION))
            .map(String::as_str),
        Some(""),
        "the released lease still acknowledges a set"
    );

    // Its keys are queued on their new owners, which start them at their
    // next read of the group.
    let owners = owners(&names, &all);
    let leaving_keys: Vec<String> = names
        .iter()
        .filter(|n| owners[*n] == leaving)
        .cloned()
        .collect();
    wait_until(
        "the leaving replica's keys reconciled by the others",
        LIMIT,
        || record.check_owners_since(asked, &leaving_keys, &live),
    )
    .await;
    let last = leaving_keys
        .iter()
        .map(|k| record.first(asked, |r| &r.key == k).unwrap().start)
        .max()
        .unwrap();
    let handover = last.saturating_duration_since(ended);
    println!("hand-over after a graceful shutdown: {handover:?}");
    assert!(handover <= 4 * RETRY, "hand-over took {handover:?}");
    acknowledged(&server, &live).await;

    changes.set_all(&server, &names, "changed");
    final_checks(&record, &changes, &live).await;
}

#[tokio::test]
async fn replica_shards_config_errors_are_error_items() {
    let server = LocalApiServer::start().await;
    let record = Arc::new(Record::default());
    let ctx = || {
        Arc::new(Ctx {
            record: record.clone(),
            replica: 0,
            work: Duration::ZERO,
            requeue: None,
            slow: Arc::default(),
        })
    };
    let controller = || {
        Controller::new(
            Api::<ConfigMap>::namespaced(server.client(), "default"),
            watcher::Config::default(),
        )
    };

    let bad = config(0).with_renew_deadline(LEASE);
    assert!(matches!(
        bad.validate(),
        Err(LeaseConfigError::RenewDeadlineNotShorterThanLease { .. })
    ));
    let comma = ShardConfig::new(GROUP, "default", "a,b");
    for (config, why) in [(bad, "renew deadline"), (comma, "identity")] {
        let items: Vec<_> = controller()
            .shards(Shards::new(server.client(), config))
            .run(reconcile, error_policy, ctx())
            .collect()
            .await;
        assert_eq!(items.len(), 1, "{items:?}");
        match &items[0] {
            Err(Error::QueueError(ControllerError::InvalidLeaseConfig(e))) => {
                assert!(e.to_string().contains(why), "{e}");
            }
            other => panic!("unexpected item {other:?}"),
        }
    }

    // Shards and leader election at once, in either order.
    let election = || {
        LeaderElection::new(
            server.client(),
            LeaseConfig::new("leader", "default", "replica-0")
                .with_lease_duration(LEASE)
                .with_renew_deadline(RENEW)
                .with_retry_period(RETRY),
        )
    };
    for shards_first in [true, false] {
        let shards = Shards::new(server.client(), config(0));
        let both = if shards_first {
            controller().shards(shards).leader_election(election())
        } else {
            controller().leader_election(election()).shards(shards)
        };
        let items: Vec<_> = tokio::time::timeout(
            LIMIT,
            both.run(reconcile, error_policy, ctx()).collect::<Vec<_>>(),
        )
        .await
        .expect("the controller ended");
        assert_eq!(items.len(), 1, "{items:?}");
        assert!(
            matches!(
                &items[0],
                Err(Error::QueueError(ControllerError::LeaderElectionWithShards))
            ),
            "unexpected item {:?}",
            items[0]
        );
    }

    // Nothing was written, and nothing reconciled.
    assert!(group_leases(server.client(), GROUP).await.is_empty());
    let leases = Api::<Lease>::namespaced(server.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(leases.items.is_empty(), "{:?}", leases.items);
    assert!(record.runs().is_empty());
}

#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_shard_gauges_count_members_and_owned_keys() {
    use tokio_workqueue_kube::shard::ShardMetrics;

    let (server, names, changes) = server_with(60).await;
    let record = Arc::new(Record::default());
    // One gauge family per replica, as each process has its own registry.
    let metrics: Vec<ShardMetrics> = (0..3).map(|_| ShardMetrics::new()).collect();
    let mut replicas = start_all(&server, 3, &record, |i| Opts {
        metrics: Some(metrics[i].clone()),
        ..Opts::default()
    });
    let all = [0, 1, 2];
    acknowledged(&server, &all).await;
    let expected = count_by_owner(&names, &all);
    let gauges = |of: &[usize]| -> Vec<(i64, i64)> {
        of.iter()
            .map(|&i| (metrics[i].members(GROUP), metrics[i].keys_owned(GROUP)))
            .collect()
    };
    wait_until(
        "the gauges count 3 members and every key once",
        LIMIT,
        || {
            let seen = gauges(&all);
            let want: Vec<(i64, i64)> = all.iter().map(|i| (3, expected[i] as i64)).collect();
            if seen == want {
                Ok(())
            } else {
                Err(format!("(members, keys owned) {seen:?}, expected {want:?}"))
            }
        },
    )
    .await;
    let owned: i64 = gauges(&all).iter().map(|g| g.1).sum();
    assert_eq!(owned, names.len() as i64);

    let mut registry = prometheus_client::registry::Registry::default();
    metrics[0].register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(&format!("workqueue_shard_members{{name=\"{GROUP}\"}} 3")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "workqueue_shard_keys_owned{{name=\"{GROUP}\"}} {}",
            expected[&0]
        )),
        "{text}"
    );

    // One leaves: the two left count two members and all keys between them.
    let replica = &mut replicas[0];
    replica.shutdown.take().unwrap().send(()).unwrap();
    tokio::time::timeout(LIMIT, &mut replica.task)
        .await
        .expect("the controller ended")
        .unwrap();
    let live = [1, 2];
    wait_until(
        "the gauges count 2 members and every key once",
        LIMIT,
        || {
            let seen = gauges(&live);
            let owned: i64 = seen.iter().map(|g| g.1).sum();
            if seen.iter().all(|g| g.0 == 2) && owned == names.len() as i64 {
                Ok(())
            } else {
                Err(format!("(members, keys owned) {seen:?}"))
            }
        },
    )
    .await;

    changes.set_all(&server, &names, "changed");
    final_checks(&record, &changes, &live).await;
}

/// The record checks themselves: each fails on the record it must reject.
#[tokio::test]
async fn replica_record_checks_can_fail() {
    // In the past, so "now" is after every run below.
    let t = Instant::now() - Duration::from_secs(10);
    let ms = Duration::from_millis;
    let run = |key: &str, replica, version, from: u64, to: Option<u64>| Run {
        key: key.to_owned(),
        version,
        replica,
        start: t + ms(from),
        end: to.map(|to| t + ms(to)),
        finished: to.is_some(),
    };
    let record = |runs: Vec<Run>| {
        let r = Record::default();
        *r.runs.lock().unwrap() = runs;
        r
    };

    // (a) One key on two replicas at once; one key on one replica at once;
    // a run still going (or cancelled, never ended) under a later one; a
    // short run inside a long one.
    for bad in [
        vec![run("a", 0, 1, 0, Some(10)), run("a", 1, 1, 5, Some(15))],
        vec![run("a", 0, 1, 0, Some(10)), run("a", 0, 1, 9, Some(15))],
        vec![run("a", 0, 1, 0, None), run("a", 1, 1, 50, Some(60))],
        vec![
            run("a", 0, 1, 0, Some(100)),
            run("a", 1, 1, 10, Some(20)),
            run("a", 2, 1, 30, Some(40)),
        ],
    ] {
        assert!(record(bad).check_no_overlap().is_err());
    }
    let good = record(vec![
        run("a", 0, 1, 0, Some(10)),
        run("a", 1, 1, 10, Some(20)),
        run("b", 2, 1, 5, Some(15)),
    ]);
    good.check_no_overlap().unwrap();

    // (b) The last change of `a` is version 5, made at t + 10 ms.
    let changes = Changes::default();
    changes.last.lock().unwrap().insert(
        "a".to_owned(),
        Change {
            version: 5,
            made: t + ms(10),
        },
    );
    for bad in [
        // An older version.
        vec![run("a", 0, 4, 20, Some(30))],
        // Started before the change was made.
        vec![run("a", 0, 5, 0, Some(30))],
        // By a replica that is not live.
        vec![run("a", 1, 5, 20, Some(30))],
        // Another key.
        vec![run("b", 0, 5, 20, Some(30))],
    ] {
        assert!(changes.check_reconciled(&record(bad), &[0, 2]).is_err());
    }
    changes
        .check_reconciled(&record(vec![run("a", 2, 6, 20, None)]), &[0, 2])
        .unwrap();

    // Ownership: a run by a replica that does not own its key.
    let names = names(30);
    let all = [0, 1, 2];
    let by_owner: Vec<Run> = names
        .iter()
        .map(|n| run(n, owner_of(n, &all), 1, 0, Some(1)))
        .collect();
    record(by_owner.clone())
        .check_owners_since(t, &names, &all)
        .unwrap();
    let mut wrong = by_owner.clone();
    wrong[0].replica = (wrong[0].replica + 1) % 3;
    assert!(record(wrong).check_owners_since(t, &names, &all).is_err());
    assert!(
        record(by_owner[1..].to_vec())
            .check_owners_since(t, &names, &all)
            .is_err()
    );
}

/// The fence runs in the reconciles' own tasks: a replica cut off while
/// nobody polls its controller stream (a consumer busy with one item)
/// still stops what it runs before the others take its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_fences_even_while_its_stream_is_not_polled() {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let replicas = start_busy(&server, &names, &record, false).await;
    let all = [0, 1, 2];
    let cut_off = 2;
    cut_off_while_slow(&replicas, cut_off, &record, &names, true).await;

    replicas[cut_off].slow.store(false, Ordering::SeqCst);
    replicas[cut_off].endpoint.reconnect();
    replicas[cut_off].stall.send_replace(false);
    let resettled = acknowledged(&server, &all).await;
    wait_until("every key reconciled by its owner again", LIMIT, || {
        record.check_owners_since(resettled, &names, &all)
    })
    .await;
    changes.set_all(&server, &names, "after the return");
    final_checks(&record, &changes, &all).await;
}

/// Someone deletes a live member's Lease: the others keep it a member (with
/// its last acknowledgement) until it would expire, so they never start
/// its keys while it runs them; it makes a new Lease at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_whose_lease_is_deleted_keeps_its_keys() {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let _replicas = start_busy(&server, &names, &record, false).await;
    let all = [0, 1, 2];
    let victim = 2;

    let leases = Api::<Lease>::namespaced(server.client(), "default");
    let name = config(victim).lease_name();
    leases.delete(&name, &Default::default()).await.unwrap();
    let deleted = Instant::now();
    // Watch for a few rounds (well short of a lease duration): its keys
    // stay with it.
    sleep(4 * RETRY).await;
    let owners = owners(&names, &all);
    if let Some(r) = record
        .runs()
        .iter()
        .find(|r| r.start >= deleted && owners[&r.key] == victim && r.replica != victim)
    {
        panic!("{r:?} took a key of the replica whose Lease was deleted");
    }
    record.check_no_overlap().unwrap();
    let again = leases.get_opt(&name).await.unwrap();
    assert!(
        again.and_then(|l| l.spec?.holder_identity).as_deref() == Some(identity(victim).as_str()),
        "the replica did not make its Lease again"
    );
    changes.set_all(&server, &names, "after the deletion");
    final_checks(&record, &changes, &all).await;
    record.check_owners_since(deleted, &names, &all).unwrap();
}

/// Split caches: the shard label each object carries, read from the server.
fn shard_label(server: &LocalApiServer, name: &str) -> Option<String> {
    server.object("v1", "ConfigMap", Some("default"), name)?["metadata"]["labels"]
        [label_key(GROUP).as_str()]
    .as_str()
    .map(str::to_owned)
}

/// Every object is labelled with its owner among `members`.
fn check_labels(
    server: &LocalApiServer,
    names: &[String],
    members: &[usize],
) -> Result<(), String> {
    let wrong: Vec<(&String, Option<String>)> = names
        .iter()
        .map(|n| (n, shard_label(server, n)))
        .filter(|(n, label)| label.as_deref() != Some(&*identity(owner_of(n, members))))
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} objects not labelled with their owner among {members:?}, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        ))
    }
}

/// Waits until the members `live` acknowledge exactly `live` and every
/// object is labelled with its owner among them; returns when the
/// acknowledgement was seen.
async fn labelled(server: &LocalApiServer, names: &[String], live: &[usize]) -> Instant {
    let settled = acknowledged(server, live).await;
    wait_until(
        &format!("every object labelled with its owner among {live:?}"),
        LIMIT,
        || check_labels(server, names, live),
    )
    .await;
    settled
}

/// The replica holding the coordinator's Lease.
async fn coordinator(server: &LocalApiServer) -> usize {
    let holder =
        crate::replica_common::lease_holder(server.client(), &format!("{GROUP}.coordinator"))
            .await
            .expect("a coordinator");
    holder
        .strip_prefix("replica-")
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("{holder} is not a replica of these tests"))
}

/// Each replica of `live` holds exactly the objects it owns among `live`
/// in its store.
fn check_stores(replicas: &[Replica], names: &[String], live: &[usize]) -> Result<(), String> {
    for &i in live {
        let mut held: Vec<String> = replicas[i]
            .store
            .state()
            .iter()
            .map(|o| o.name_any())
            .collect();
        held.sort();
        let mut own: Vec<String> = names
            .iter()
            .filter(|n| owner_of(n, live) == i)
            .cloned()
            .collect();
        own.sort();
        if held != own {
            return Err(format!(
                "replica-{i} holds {} objects, owns {} among {live:?}",
                held.len(),
                own.len()
            ));
        }
    }
    Ok(())
}

fn split(_: usize) -> Opts {
    Opts {
        split: true,
        ..Opts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_caches_hold_each_replicas_share_and_its_owner_reconciles_every_change() {
    let (server, names, changes) = server_with(60).await;
    let record = Arc::new(Record::default());
    #[cfg(feature = "prometheus")]
    let metrics: Vec<_> = (0..3)
        .map(|_| tokio_workqueue_kube::shard::ShardMetrics::new())
        .collect();
    // Requeued, so that every key is reconciled again after the group
    // settled, by its owner alone.
    let replicas = start_all(&server, 3, &record, |i| Opts {
        requeue: Some(Duration::from_millis(50)),
        #[cfg(feature = "prometheus")]
        metrics: Some(metrics[i].clone()),
        ..split(i)
    });
    let all = [0, 1, 2];
    let settled = labelled(&server, &names, &all).await;
    wait_until("each store holding its replica's share", LIMIT, || {
        check_stores(&replicas, &names, &all)
    })
    .await;
    wait_until("every key reconciled by its owner", LIMIT, || {
        record.check_owners_since(settled, &names, &all)
    })
    .await;
    changes.set_all(&server, &names, "changed");
    final_checks(&record, &changes, &all).await;
    record.check_owners_since(settled, &names, &all).unwrap();
    // One replica at a time coordinates, and every object needed a label.
    let written: u64 = replicas.iter().map(|r| r.shards.label_patches()).sum();
    assert!(written >= 60, "{written} label writes for 60 objects");
    #[cfg(feature = "prometheus")]
    for (r, m) in replicas.iter().zip(&metrics) {
        assert_eq!(m.label_patches(GROUP), r.shards.label_patches());
    }
    for r in &replicas {
        assert!(r.errors.lock().unwrap().is_empty(), "{:?}", r.errors);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_a_crashed_coordinators_objects_move_to_the_survivors() {
    let (server, names, changes) = server_with(60).await;
    let record = Arc::new(Record::default());
    let replicas = start_all(&server, 3, &record, split);
    let all = [0, 1, 2];
    labelled(&server, &names, &all).await;
    // The coordinator goes, and takes its own share with it.
    let crashed = coordinator(&server).await;
    replicas[crashed].crash();
    let live: Vec<usize> = all.into_iter().filter(|&i| i != crashed).collect();
    labelled(&server, &names, &live).await;
    wait_until("each survivor's store holding its share", LIMIT, || {
        check_stores(&replicas, &names, &live)
    })
    .await;
    changes.set_all(&server, &names, "after the crash");
    final_checks(&record, &changes, &live).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_a_joining_replica_takes_its_share_out_of_the_others_caches() {
    let (server, names, changes) = server_with(60).await;
    let record = Arc::new(Record::default());
    let mut replicas = start_all(&server, 3, &record, split);
    labelled(&server, &names, &[0, 1, 2]).await;
    replicas.push(Replica::start(&server, 3, &record, split(3)));
    let all = [0, 1, 2, 3];
    labelled(&server, &names, &all).await;
    // Objects left the three stores (the server sends them as deleted)
    // and entered the fourth's.
    wait_until("each store holding its share among four", LIMIT, || {
        check_stores(&replicas, &names, &all)
    })
    .await;
    changes.set_all(&server, &names, "after the join");
    final_checks(&record, &changes, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_label_edited_by_hand_is_put_back() {
    let (server, names, changes) = server_with(30).await;
    let record = Arc::new(Record::default());
    let _replicas = start_all(&server, 2, &record, split);
    let all = [0, 1];
    labelled(&server, &names, &all).await;
    // A member that never was, and the other member.
    for (name, wrong) in [
        ("cm-0", "nobody".to_string()),
        ("cm-1", identity(1 - owner_of("cm-1", &all))),
    ] {
        let mut object = server
            .object("v1", "ConfigMap", Some("default"), name)
            .unwrap();
        object["metadata"]["labels"][label_key(GROUP).as_str()] = json!(wrong);
        object["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        server.upsert(&object).unwrap();
        assert_eq!(shard_label(&server, name).as_deref(), Some(&*wrong));
    }
    wait_until("the labels put back", LIMIT, || {
        check_labels(&server, &names, &all)
    })
    .await;
    changes.set_all(&server, &names, "after the edit");
    final_checks(&record, &changes, &all).await;
}

#[tokio::test]
async fn a_split_cache_needs_the_controllers_own_watcher() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let (reader, writer) = kube_runtime::reflector::store();
    let stream = kube_runtime::WatchStreamExt::applied_objects(kube_runtime::reflector(
        writer,
        watcher(api, watcher::Config::default()),
    ));
    let shards = Shards::new(client, config(0).split_cache(LabelRate::DEFAULT));
    let results: Vec<_> = Controller::for_stream(stream, reader)
        .shards(shards)
        .run(
            reconcile,
            error_policy,
            Arc::new(Ctx {
                record: Arc::default(),
                replica: 0,
                work: Duration::ZERO,
                requeue: None,
                slow: Arc::default(),
            }),
        )
        .collect()
        .await;
    assert_eq!(results.len(), 1);
    assert!(
        matches!(
            &results[0],
            Err(Error::QueueError(ControllerError::SplitCacheWithoutWatcher))
        ),
        "{:?}",
        results[0].as_ref().err().map(ToString::to_string)
    );
}

/// A coordinator that shuts down gracefully releases its Lease, so the
/// next one labels new objects well before a lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_a_coordinator_that_shuts_down_hands_over_at_once() {
    let (server, names, changes) = server_with(20).await;
    let record = Arc::new(Record::default());
    let mut replicas = start_all(&server, 2, &record, split);
    let all = [0, 1];
    labelled(&server, &names, &all).await;
    let leaving = coordinator(&server).await;
    let live = [1 - leaving];

    let replica = &mut replicas[leaving];
    replica.shutdown.take().unwrap().send(()).unwrap();
    tokio::time::timeout(LIMIT, &mut replica.task)
        .await
        .expect("the controller ended")
        .unwrap();
    let ended = Instant::now();
    // A new object, which only a coordinator labels into a cache.
    let mut names = names;
    names.push("cm-new".to_string());
    changes.set(&server, "cm-new", "created");
    wait_until("every object labelled with the survivor", LIMIT, || {
        check_labels(&server, &names, &live)
    })
    .await;
    let relabelled = ended.elapsed();
    println!("the survivor labelled every object {relabelled:?} after the coordinator left");
    // Had the Lease been left to expire, the survivor would have taken it
    // a lease duration after the last renewal it saw, a retry period at
    // most before the shutdown: 500 ms after it at the earliest. The bound
    // sits below that, with room for the election's requests, a new
    // list and watch and three rounds of label patches on a loaded
    // machine (locally about 110 ms in all).
    assert!(
        relabelled < LEASE * 3 / 4,
        "{relabelled:?}: the next coordinator waited for the Lease to expire"
    );
    assert_eq!(coordinator(&server).await, live[0]);
    changes.set_all(&server, &names, "after the shutdown");
    final_checks(&record, &changes, &live).await;
}

/// The coordinator crashes while it moves objects to a replica that just
/// joined (labels written slowly, so that the crash falls in the middle):
/// the next coordinator, elected once its Lease expired, finishes the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_split_caches_a_coordinator_crashing_mid_relabel_is_finished_by_the_next() {
    let (server, names, changes) = server_with(20).await;
    let record = Arc::new(Record::default());
    let slow = |i| Opts {
        label_rate: Some(LabelRate {
            per_second: 20.0,
            burst: 1,
        }),
        ..split(i)
    };
    let mut replicas = start_all(&server, 3, &record, slow);
    labelled(&server, &names, &[0, 1, 2]).await;
    let coordinator = coordinator(&server).await;
    replicas.push(Replica::start(&server, 3, &record, slow(3)));
    let all = [0, 1, 2, 3];
    let moving = names.iter().filter(|n| owner_of(n, &all) == 3).count();
    assert!(moving >= 2, "only {moving} objects move to the new replica");
    // Some moved, not all: the crash falls mid-relabel.
    let moved = || {
        names
            .iter()
            .filter(|n| shard_label(&server, n).as_deref() == Some("replica-3"))
            .count()
    };
    wait_until("the first objects moved", LIMIT, || {
        if moved() >= 1 {
            Ok(())
        } else {
            Err("none yet".into())
        }
    })
    .await;
    replicas[coordinator].crash();
    let moved = moved();
    println!("{moved} of {moving} objects moved when the coordinator crashed");
    assert!(moved < moving, "the move was over before the crash");
    let live: Vec<usize> = all.into_iter().filter(|&i| i != coordinator).collect();
    labelled(&server, &names, &live).await;
    wait_until("each live store holding its share", LIMIT, || {
        check_stores(&replicas, &names, &live)
    })
    .await;
    changes.set_all(&server, &names, "after the crash");
    final_checks(&record, &changes, &live).await;
}
