//! A bounded chaos soak on a real kube-apiserver: nothing is lost through
//! the faults operators meet.
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example chaos_soak --features rustls                  # 3 minutes
//! cargo run -p tokio-workqueue-kube --example chaos_soak --features rustls -- --seconds 25  # CI: under a minute
//! cargo run -p tokio-workqueue-kube --example chaos_soak --features rustls -- --seconds 600 --seed 7
//! ```
//!
//! With `CHAOS_LOG_ERRORS=1` in the environment, every error the
//! controllers' streams report (watch failures among them) is printed to
//! stderr with its time, on the fault lines' clock.
//!
//! `--trigger-backoff-ms N` sets a constant backoff after watch errors
//! (`Controller::trigger_backoff`) instead of kube-runtime's default (800 ms
//! doubling to 30 s, reset by the next event), to compare recoveries.
//!
//! It starts a real cluster of its own (`kube_test_cluster::faults`:
//! kube-apiserver and etcd built from Go on first use, etcd compacted every
//! 5 s, the watch cache off so that every resumed watch meets compaction),
//! installs a custom resource `Churn` and runs, each on a client of its
//! own behind a TCP proxy of its own:
//!
//! * **a controller** (`controller`), with finalizer
//!   `chaos.workqueue.tokio.rs/controller`;
//! * **three shard replicas** (`replica-0..2`, one shard group on Leases:
//!   lease 3 s, renew deadline 2 s, retry 0.5 s), with finalizer
//!   `chaos.workqueue.tokio.rs/shards`.
//!
//! Each reconcile adds its finalizer (kube-runtime's `finalizer` helper)
//! or, once the object is being deleted, removes it, and writes its start
//! and end to a record of its own (one for the controller, one for the
//! group): the checks read only those records and the API server.
//!
//! A **churn writer**, straight to the API server, creates, updates and
//! deletes `--keys` objects (40) at `--rate` changes a second (20), for
//! `--seconds` (180). Meanwhile **faults** fire one after the other on a
//! schedule drawn from `--seed`, in rounds that each hold every kind once
//! in a shuffled order (the run always finishes its last round, so every
//! kind fires at least once; a fault after which the controllers are not
//! current within 45 s ends the faults early, a failure):
//!
//! | kind | what |
//! | --- | --- |
//! | `restart` | kube-apiserver and etcd killed (SIGKILL) and started again on their data: every watch breaks at once |
//! | `compact` | etcd compacted to its current revision, then every connection reset: every watch resumes at a compacted revision (410 Gone) and re-lists |
//! | `delay` | every proxy holds each chunk 100-400 ms, for 1-3 s |
//! | `stall` | one client's connections hang half-open for 1-4 s (past the renew deadline: a replica fences) |
//! | `reset` | one client's connections are reset (TCP RST) |
//! | `cut` | one client loses the API server for 1-4 s while the others keep it |
//!
//! After each fault it measures how long the controller and the group
//! took to be current again, the writer resting meanwhile: first until
//! each has reconciled every object as it was when the fault ended (a key
//! whose reconcile failed in the fault and was never retried stays behind
//! here), then, touching every object (an annotation), until each has
//! reconciled every object at that version: every key went through every
//! watch and queue again (the touching takes about 0.2 s for 40 objects).
//!
//! At the end (the writer stopped, every fault healed) it waits for the
//! controllers to settle and checks:
//!
//! 1. every object's last change was reconciled after it was made, by the
//!    controller and by the group, and carries both finalizers;
//! 2. no key was reconciled by two replicas (or twice by one) at once;
//! 3. no deleted object is left behind with a finalizer;
//! 4. no stuck keys: every queue is empty, nothing in flight or waiting;
//! 5. the process's resident memory over the second half of the run did
//!    not grow beyond noise (the last fifth of the samples against the
//!    first fifth of the second half: at most 16 MiB and 25 % more);
//! 6. every kind of fault fired;
//! 7. every controller shut down gracefully within 30 s.
//!
//! It prints, per fault kind: how many fired, the longest time from a
//! fault's end to the controllers being current again, the changes the
//! writer made from the start of such a fault to the start of the next
//! (during the fault, and after the recovery; the writer rests during the
//! recovery itself) and how many of those were lost (never reconciled:
//! must be 0), and exits with status 1 on any miss.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::fmt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::CustomResource;
use kube::CustomResourceExt;
use kube_client::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_client::{Api, Client, ResourceExt};
use kube_runtime::controller::Action;
use kube_runtime::finalizer::{self, Event as Finalizer, finalizer};
use kube_runtime::utils::Backoff;
use kube_runtime::watcher;
use kube_test_cluster::faults::{ChaosCluster, FaultProxy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, sleep, timeout};
use tokio_workqueue::WorkQueue;
use tokio_workqueue::metrics::{MetricsHook, Probe};
use tokio_workqueue_kube::Controller;
use tokio_workqueue_kube::shard::{ShardConfig, Shards};

const USAGE: &str = "\
usage: chaos_soak [--seconds N] [--seed N] [--keys N] [--rate N] [--watch-cache]
                  [--trigger-backoff-ms N]

A controller and three shard replicas on a real kube-apiserver of its own,
a churn writer, and faults (restart, compact, delay, stall, reset, cut) on
a seeded schedule for --seconds (180); then checks that nothing was lost.
--watch-cache runs kube-apiserver with its watch cache (off by default, so
that compaction reaches every resumed watch). --trigger-backoff-ms waits a
constant N ms after a watch error instead of kube-runtime's default backoff
(800 ms doubling to 30 s), for comparison.";

/// A custom resource the writer churns.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "chaos.workqueue.tokio.rs",
    version = "v1",
    kind = "Churn",
    namespaced
)]
pub struct ChurnSpec {
    /// Changed by every update.
    n: u64,
}

const NAMESPACE: &str = "default";
const CONTROLLER_FINALIZER: &str = "chaos.workqueue.tokio.rs/controller";
const SHARDS_FINALIZER: &str = "chaos.workqueue.tokio.rs/shards";
const GROUP: &str = "chaos-soak";
/// The annotation `wait_current` sets on every object after a fault.
const PROBE: &str = "chaos.workqueue.tokio.rs/probe";
const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);
/// How long the controllers may take to be current after a fault, and to
/// settle at the end, before it counts as a miss.
const RECOVERY_LIMIT: Duration = Duration::from_secs(45);
/// A recovery slower than this says who is behind.
const SLOW: Duration = Duration::from_secs(5);
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(30);
/// Names of the four clients, each behind a proxy of its own.
const CLIENTS: [&str; 4] = ["controller", "replica-0", "replica-1", "replica-2"];

// ---------------------------------------------------------------------------
// The command line.

#[derive(Debug)]
struct Options {
    seconds: u64,
    seed: u64,
    keys: usize,
    rate: f64,
    watch_cache: bool,
    /// A constant trigger backoff instead of kube-runtime's default.
    trigger_backoff: Option<Duration>,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            seconds: 180,
            seed: 1,
            keys: 40,
            rate: 20.0,
            watch_cache: false,
            trigger_backoff: None,
        };
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            fn number<T: std::str::FromStr>(name: &str, text: String) -> Result<T, String> {
                text.parse()
                    .map_err(|_| format!("{name}: `{text}` is not a number"))
            }
            match arg.as_str() {
                "--seconds" => options.seconds = number(&arg, value(&arg)?)?,
                "--seed" => options.seed = number(&arg, value(&arg)?)?,
                "--keys" => options.keys = number(&arg, value(&arg)?)?,
                "--rate" => options.rate = number(&arg, value(&arg)?)?,
                "--watch-cache" => options.watch_cache = true,
                "--trigger-backoff-ms" => {
                    options.trigger_backoff =
                        Some(Duration::from_millis(number(&arg, value(&arg)?)?));
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if options.keys == 0 || options.rate <= 0.0 || options.rate > 1000.0 {
            return Err("--keys must be positive and --rate in (0, 1000]".into());
        }
        Ok(options)
    }
}

/// splitmix64: a small seeded generator, so a schedule can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A duration in `[lo, hi]` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

// ---------------------------------------------------------------------------
// The record the reconciles write.

/// One reconcile, as the reconcile function saw it.
#[derive(Debug, Clone)]
struct Run {
    key: String,
    replica: &'static str,
    /// The object's resourceVersion.
    version: u64,
    start: Instant,
    /// When it ended; `None` while it runs.
    end: Option<Instant>,
    /// It ran to its end and succeeded (a fenced reconcile is cancelled,
    /// a conflict is an error).
    ok: bool,
}

/// Every reconcile of one controller (or of the three replicas of the
/// group), written by the reconcile function itself.
#[derive(Default)]
struct Record {
    runs: Mutex<Vec<Run>>,
    /// Per key, the highest resourceVersion a successful reconcile saw.
    reconciled: Mutex<HashMap<String, u64>>,
    /// Per key, failures since its last success, and the last error.
    failing: Mutex<HashMap<String, (u32, String)>>,
}

/// A reconcile in progress: writes its end when dropped (at its end, or
/// where a cancelled reconcile stopped).
struct Running {
    record: Arc<Record>,
    index: usize,
    ok: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let (key, version) = {
            let mut runs = self.record.runs.lock().unwrap();
            let run = &mut runs[self.index];
            run.end = Some(Instant::now());
            run.ok = self.ok;
            (run.key.clone(), run.version)
        };
        if self.ok {
            self.record.failing.lock().unwrap().remove(&key);
            let mut reconciled = self.record.reconciled.lock().unwrap();
            let best = reconciled.entry(key).or_default();
            *best = (*best).max(version);
        }
    }
}

impl Record {
    fn start(self: &Arc<Self>, obj: &Churn, replica: &'static str) -> Running {
        let mut runs = self.runs.lock().unwrap();
        runs.push(Run {
            key: obj.name_any(),
            replica,
            version: version(obj),
            start: Instant::now(),
            end: None,
            ok: false,
        });
        Running {
            record: self.clone(),
            index: runs.len() - 1,
            ok: false,
        }
    }

    /// The highest version of `key` a successful reconcile saw.
    fn reconciled(&self, key: &str) -> u64 {
        self.reconciled
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Pairs of runs of one key that overlapped in time.
    fn overlaps(&self) -> Vec<(Run, Run)> {
        let now = Instant::now();
        let mut by_key: BTreeMap<String, Vec<Run>> = BTreeMap::new();
        for run in self.runs.lock().unwrap().iter() {
            by_key.entry(run.key.clone()).or_default().push(run.clone());
        }
        let mut found = Vec::new();
        for runs in by_key.values_mut() {
            runs.sort_by_key(|r| r.start);
            for (i, a) in runs.iter().enumerate() {
                for b in &runs[i + 1..] {
                    if b.start >= a.end.unwrap_or(now) {
                        break;
                    }
                    found.push((a.clone(), b.clone()));
                }
            }
        }
        found
    }

    fn len(&self) -> usize {
        self.runs.lock().unwrap().len()
    }
}

fn version(obj: &Churn) -> u64 {
    obj.resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// The reconcile, run by the controller and the replicas.

struct Ctx {
    client: Client,
    replica: &'static str,
    finalizer: &'static str,
    record: Arc<Record>,
}

type Error = finalizer::Error<Infallible>;

async fn reconcile(obj: Arc<Churn>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let mut running = ctx.record.start(&obj, ctx.replica);
    // Some work, so that hand-overs and faults meet reconciles in flight.
    sleep(Duration::from_millis(10)).await;
    let api: Api<Churn> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    let result = finalizer(&api, ctx.finalizer, obj, |event| async move {
        match event {
            Finalizer::Apply(_) | Finalizer::Cleanup(_) => {
                Ok::<_, Infallible>(Action::await_change())
            }
        }
    })
    .await;
    running.ok = result.is_ok();
    result
}

fn error_policy(obj: Arc<Churn>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let mut failing = ctx.record.failing.lock().unwrap();
    let entry = failing.entry(obj.name_any()).or_default();
    entry.0 += 1;
    entry.1 = format!("{} at v{}: {error}", ctx.replica, version(&obj));
    Action::requeue(Duration::from_millis(250))
}

/// The same wait after every watch error (`--trigger-backoff-ms`).
struct ConstantBackoff(Duration);

impl Iterator for ConstantBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.0)
    }
}

impl Backoff for ConstantBackoff {
    fn reset(&mut self) {}
}

/// Keeps the queue's probe, to read its gauges at the end.
#[derive(Clone, Default)]
struct ProbeHook(Arc<Mutex<Option<Probe>>>);

impl MetricsHook for ProbeHook {
    fn bind(&self, _name: &str, probe: Probe) {
        *self.0.lock().unwrap() = Some(probe);
    }
}

/// One of the four: its client's proxy, its task, its queue's probe.
/// When the faults' clock started: the times `CHAOS_LOG_ERRORS` prints
/// count from it, as the fault lines do.
static SOAK_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

struct Member {
    name: &'static str,
    proxy: FaultProxy,
    probe: ProbeHook,
    errors: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

fn spawn_member(
    name: &'static str,
    client: Client,
    proxy: FaultProxy,
    record: Arc<Record>,
    trigger_backoff: Option<Duration>,
) -> Member {
    let probe = ProbeHook::default();
    let errors = Arc::new(AtomicU64::new(0));
    let (shutdown, on_shutdown) = oneshot::channel::<()>();
    let is_controller = name == "controller";
    let mut controller = Controller::new(
        Api::<Churn>::namespaced(client.clone(), NAMESPACE),
        watcher::Config::default(),
    )
    .queue(WorkQueue::builder().name(name).metrics(probe.clone()))
    .graceful_shutdown_on(async move {
        let _ = on_shutdown.await;
    });
    if let Some(backoff) = trigger_backoff {
        controller = controller.trigger_backoff(ConstantBackoff(backoff));
    }
    if !is_controller {
        let config = ShardConfig::new(GROUP, NAMESPACE, name)
            .with_lease_duration(LEASE)
            .with_renew_deadline(RENEW)
            .with_retry_period(RETRY);
        controller = controller.shards(Shards::new(client.clone(), config));
    }
    let ctx = Arc::new(Ctx {
        client,
        replica: name,
        finalizer: if is_controller {
            CONTROLLER_FINALIZER
        } else {
            SHARDS_FINALIZER
        },
        record,
    });
    let counted = errors.clone();
    let log_errors = std::env::var_os("CHAOS_LOG_ERRORS").is_some();
    let task = tokio::spawn(
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(move |item| {
                if let Err(error) = &item {
                    counted.fetch_add(1, Ordering::Relaxed);
                    if log_errors {
                        let at = SOAK_START.get().map_or(0.0, |s| s.elapsed().as_secs_f64());
                        eprintln!("{at:>7.2} s  {name}: {error}");
                    }
                }
                async {}
            }),
    );
    Member {
        name,
        proxy,
        probe,
        errors,
        shutdown: Some(shutdown),
        task,
    }
}

// ---------------------------------------------------------------------------
// The churn writer.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    Absent,
    Present,
    Deleting,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangeKind {
    Create,
    Update,
    /// A deletion that left the object with finalizers (being deleted).
    Delete,
}

/// A change the writer made (the API server answered it).
#[derive(Debug, Clone)]
struct Change {
    key: String,
    uid: String,
    version: u64,
    kind: ChangeKind,
    /// The last fault that started before it, by index: the change was
    /// made during that fault, its recovery or the rest before the next.
    fault: Option<usize>,
}

/// The writer's record, and the switches the fault loop sets.
#[derive(Default)]
struct Writes {
    changes: Mutex<Vec<Change>>,
    failed: AtomicU64,
    /// The last fault that started, by index.
    active: Mutex<Option<usize>>,
    /// Rest (while the controllers catch up after a fault).
    paused: AtomicBool,
    stop: AtomicBool,
}

async fn churn(api: Api<Churn>, keys: usize, rate: f64, seed: u64, writes: Arc<Writes>) {
    let mut rng = Rng(seed ^ 0x5eed_c4a0);
    // A fresh cluster: none of the objects exists yet.
    let mut views = vec![View::Absent; keys];
    let mut n = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while !writes.stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if writes.paused.load(Ordering::Relaxed) {
            continue;
        }
        let i = rng.below(keys as u64) as usize;
        let name = format!("churn-{i}");
        n += 1;
        let record = |obj: &Churn, kind| {
            let fault = *writes.active.lock().unwrap();
            writes.changes.lock().unwrap().push(Change {
                key: obj.name_any(),
                uid: obj.uid().unwrap_or_default(),
                version: version(obj),
                kind,
                fault,
            });
        };
        let outcome: Result<View, kube_client::Error> = match views[i] {
            View::Unknown | View::Deleting => match api.get_opt(&name).await {
                Ok(None) => Ok(View::Absent),
                Ok(Some(obj)) if obj.metadata.deletion_timestamp.is_some() => Ok(View::Deleting),
                Ok(Some(_)) => Ok(View::Present),
                Err(e) => Err(e),
            },
            View::Absent => {
                let obj = Churn::new(&name, ChurnSpec { n });
                match api.create(&PostParams::default(), &obj).await {
                    Ok(obj) => {
                        record(&obj, ChangeKind::Create);
                        Ok(View::Present)
                    }
                    Err(e) => Err(e),
                }
            }
            View::Present if rng.below(4) != 0 => {
                let patch = Patch::Merge(json!({ "spec": { "n": n } }));
                match api.patch(&name, &PatchParams::default(), &patch).await {
                    Ok(obj) => {
                        record(&obj, ChangeKind::Update);
                        Ok(View::Present)
                    }
                    Err(e) => Err(e),
                }
            }
            View::Present => match api.delete(&name, &DeleteParams::default()).await {
                Ok(either) => match either.left() {
                    Some(obj) => {
                        record(&obj, ChangeKind::Delete);
                        Ok(View::Deleting)
                    }
                    None => Ok(View::Absent),
                },
                Err(e) => Err(e),
            },
        };
        views[i] = outcome.unwrap_or_else(|_| {
            writes.failed.fetch_add(1, Ordering::Relaxed);
            View::Unknown
        });
    }
}

// ---------------------------------------------------------------------------
// Faults.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Restart,
    Compact,
    Delay,
    Stall,
    Reset,
    Cut,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Restart,
        Kind::Compact,
        Kind::Delay,
        Kind::Stall,
        Kind::Reset,
        Kind::Cut,
    ];
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Restart => "restart",
            Kind::Compact => "compact",
            Kind::Delay => "delay",
            Kind::Stall => "stall",
            Kind::Reset => "reset",
            Kind::Cut => "cut",
        })
    }
}

/// A fault that fired.
#[derive(Debug, Clone)]
struct Fired {
    kind: Kind,
    /// From its start to its end (healed, restarted).
    held: Duration,
    /// From its end to the controller and the group being current again;
    /// `None`: not within the limit.
    recovery: Option<Duration>,
}

/// Fires one fault of `kind` and ends it; returns what it did.
async fn fire(
    kind: Kind,
    rng: &mut Rng,
    cluster: &mut ChaosCluster,
    members: &[Member],
) -> Result<String, String> {
    let target = &members[rng.below(members.len() as u64) as usize];
    Ok(match kind {
        Kind::Restart => {
            let down = cluster.restart().await?;
            format!("down {:.2} s", down.as_secs_f64())
        }
        Kind::Compact => {
            let revision = cluster.compact().await?;
            for m in members {
                m.proxy.reset();
            }
            format!("at revision {revision}, every connection reset")
        }
        Kind::Delay => {
            let delay = rng.millis(100, 400);
            let hold = rng.millis(1000, 3000);
            for m in members {
                m.proxy.delay(delay);
            }
            sleep(hold).await;
            for m in members {
                m.proxy.heal();
            }
            format!(
                "{} ms a chunk for {:.1} s",
                delay.as_millis(),
                hold.as_secs_f64()
            )
        }
        Kind::Stall => {
            let hold = rng.millis(1000, 4000);
            target.proxy.stall();
            sleep(hold).await;
            target.proxy.heal();
            format!("{} for {:.1} s", target.name, hold.as_secs_f64())
        }
        Kind::Reset => {
            target.proxy.reset();
            target.name.to_string()
        }
        Kind::Cut => {
            let hold = rng.millis(1000, 4000);
            target.proxy.cut();
            sleep(hold).await;
            target.proxy.heal();
            format!("{} for {:.1} s", target.name, hold.as_secs_f64())
        }
    })
}

/// Lists the objects, retrying through faults (for at most `limit`).
async fn list(api: &Api<Churn>, limit: Duration) -> Option<Vec<Churn>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(list) = api.list(&ListParams::default()).await {
            return Some(list.items);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the controller and the group are current after fault
/// `probe`, in two steps, and returns how long that took from the call,
/// or `None` after `limit`:
///
/// 1. both records have reconciled every object as it is now (or a later
///    version), untouched: a key whose reconcile failed in the fault and
///    was not retried stays behind here (the writer rests meanwhile);
/// 2. then every object is touched (an annotation naming the fault) and
///    both records reconcile each at that version: every key, whoever
///    owns it, went through each watch and queue again.
///
/// Objects deleted meanwhile owe nothing.
async fn wait_current(
    api: &Api<Churn>,
    records: &[&Record],
    limit: Duration,
    probe: usize,
) -> Option<Duration> {
    let started = Instant::now();
    let deadline = started + limit;
    let owed: HashMap<String, (String, u64)> = list(api, limit)
        .await?
        .iter()
        .map(|o| (o.name_any(), (o.uid().unwrap_or_default(), version(o))))
        .collect();
    wait_owed(api, records, owed, deadline, started, "as they were").await?;
    let patch =
        Patch::Merge(json!({ "metadata": { "annotations": { PROBE: probe.to_string() } } }));
    let mut owed = HashMap::new();
    for o in list(api, deadline.saturating_duration_since(Instant::now())).await? {
        // Retried until it is written: a touch lost to a broken connection
        // would make the wait vacuous. An object deleted meanwhile is
        // NotFound: nothing owed.
        loop {
            match api
                .patch(&o.name_any(), &PatchParams::default(), &patch)
                .await
            {
                Ok(o) => {
                    owed.insert(o.name_any(), (o.uid().unwrap_or_default(), version(&o)));
                    break;
                }
                Err(kube_client::Error::Api(e)) if e.code == 404 => break,
                Err(_) if Instant::now() < deadline => sleep(Duration::from_millis(100)).await,
                Err(_) => return None,
            }
        }
    }
    wait_owed(api, records, owed, deadline, started, "touched").await?;
    Some(started.elapsed())
}

/// Waits until both records have reconciled every key of `owed` (uid,
/// resourceVersion) at that version or later, or the object is gone.
async fn wait_owed(
    api: &Api<Churn>,
    records: &[&Record],
    mut owed: HashMap<String, (String, u64)>,
    deadline: Instant,
    started: Instant,
    step: &str,
) -> Option<()> {
    let mut told = false;
    let step_start = Instant::now();
    loop {
        owed.retain(|key, (_, v)| records.iter().any(|r| r.reconciled(key) < *v));
        if owed.is_empty() {
            return Some(());
        }
        if !told && step_start.elapsed() >= SLOW {
            told = true;
            let behind = |r: &Record| {
                let failing = r.failing.lock().unwrap();
                owed.iter()
                    .filter(|(key, (_, v))| r.reconciled(key) < *v)
                    .map(|(key, _)| match failing.get(key) {
                        Some((n, last)) => {
                            format!("{key} ({n} failures in a row, the last {last})")
                        }
                        None => key.clone(),
                    })
                    .collect::<BTreeSet<String>>()
            };
            println!(
                "           still behind {SLOW:?} into the wait for the objects {step} \
                 ({:.1} s after the fault's end): the controller on {:?}, the group on {:?}",
                started.elapsed().as_secs_f64(),
                behind(records[0]),
                behind(records[1])
            );
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(100)).await;
        if let Some(now) = list(api, deadline.saturating_duration_since(Instant::now())).await {
            let present: BTreeSet<String> = now.iter().filter_map(|o| o.uid()).collect();
            owed.retain(|_, (uid, _)| present.contains(uid));
        }
    }
}

/// The process's resident memory, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            if message.is_empty() {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("{message}\n\n{USAGE}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut cluster = ChaosCluster::builder()
        .compaction_interval(Duration::from_secs(5))
        .watch_cache(options.watch_cache)
        .start()
        .await?;
    let direct = Client::try_from(cluster.client_config().await)?;
    kube_test_cluster::install_crd(direct.clone(), &Churn::crd()).await;
    let api: Api<Churn> = Api::namespaced(direct.clone(), NAMESPACE);
    println!(
        "chaos soak: kube-apiserver at {} (log {}), watch cache {}, etcd compacted every 5 s; \
         {} s, seed {}, {} keys, {} changes/s, trigger backoff {}",
        cluster.server(),
        cluster.log().display(),
        if options.watch_cache { "on" } else { "off" },
        options.seconds,
        options.seed,
        options.keys,
        options.rate,
        options
            .trigger_backoff
            .map_or("kube-runtime's default".to_string(), |d| format!(
                "{d:?} constant"
            ))
    );

    let controller_record = Arc::new(Record::default());
    let group_record = Arc::new(Record::default());
    let mut members = Vec::new();
    for name in CLIENTS {
        let proxy = cluster.proxy().await;
        let client = Client::try_from(cluster.client_config_via(&proxy).await)?;
        let record = if name == "controller" {
            controller_record.clone()
        } else {
            group_record.clone()
        };
        members.push(spawn_member(
            name,
            client,
            proxy,
            record,
            options.trigger_backoff,
        ));
    }

    let start = Instant::now();
    let _ = SOAK_START.set(start);
    let writes = Arc::new(Writes::default());
    let writer = tokio::spawn(churn(
        api.clone(),
        options.keys,
        options.rate,
        options.seed,
        writes.clone(),
    ));
    let samples: Arc<Mutex<Vec<u64>>> = Arc::default();
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                samples.lock().unwrap().push(rss());
            }
        })
    };

    // Faults start once there is something to lose: as many changes as
    // keys.
    let warm_up = Instant::now();
    while writes.changes.lock().unwrap().len() < options.keys {
        if warm_up.elapsed() >= RECOVERY_LIMIT {
            return Err("the writer made no changes: is the API server answering?".into());
        }
        sleep(Duration::from_millis(50)).await;
    }

    // The faults, in shuffled rounds of every kind, until the time is up
    // and the round is complete.
    let mut rng = Rng(options.seed);
    let mut fired: Vec<Fired> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let records = [controller_record.as_ref(), group_record.as_ref()];
    'rounds: loop {
        let mut round = Kind::ALL.to_vec();
        for i in (1..round.len()).rev() {
            round.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for kind in round {
            sleep(rng.millis(500, 1500)).await;
            let index = fired.len();
            *writes.active.lock().unwrap() = Some(index);
            let at = start.elapsed();
            let what = match fire(kind, &mut rng, &mut cluster, &members).await {
                Ok(what) => what,
                Err(e) => {
                    failures.push(format!("fault {index} ({kind}) could not fire: {e}"));
                    break 'rounds;
                }
            };
            let held = start.elapsed() - at;
            // The writer rests while the controllers catch up, so that a
            // key left behind (a failed reconcile not retried) stays behind.
            writes.paused.store(true, Ordering::Relaxed);
            let recovery = wait_current(&api, &records, RECOVERY_LIMIT, index).await;
            writes.paused.store(false, Ordering::Relaxed);
            println!(
                "{:>7.2} s  {kind:<7} {what}; current again {}",
                at.as_secs_f64(),
                match recovery {
                    Some(d) => format!("{:.2} s after its end", d.as_secs_f64()),
                    None => format!("NOT within {RECOVERY_LIMIT:?}"),
                }
            );
            fired.push(Fired {
                kind,
                held,
                recovery,
            });
            if recovery.is_none() {
                failures.push(format!(
                    "after fault {index} ({kind}, {what}) the controllers were not current within {RECOVERY_LIMIT:?}"
                ));
                // A miss is a failure already: on to the final checks.
                break 'rounds;
            }
        }
        if start.elapsed() >= Duration::from_secs(options.seconds) {
            break;
        }
    }
    writes.stop.store(true, Ordering::Relaxed);
    let _ = writer.await;
    sampler.abort();
    let run_time = start.elapsed();
    for m in &members {
        m.proxy.heal();
    }

    // Settle: every object reconciled as it is, nothing being deleted, the
    // queues empty.
    let settle_start = Instant::now();
    let mut last_state;
    let settled = loop {
        let objects = list(&api, RECOVERY_LIMIT).await.unwrap_or_default();
        let behind = objects
            .iter()
            .filter(|o| {
                records
                    .iter()
                    .any(|r| r.reconciled(&o.name_any()) < version(o))
            })
            .count();
        let deleting = objects
            .iter()
            .filter(|o| o.metadata.deletion_timestamp.is_some())
            .count();
        let busy: Vec<String> = members
            .iter()
            .filter_map(|m| {
                let snapshot = m.probe.0.lock().unwrap().as_ref().and_then(Probe::snapshot);
                match snapshot {
                    Some(s) if s.depth() == 0 && s.in_flight == 0 && s.waiting == 0 => None,
                    Some(s) => Some(format!(
                        "{}: {} ready, {} in flight, {} waiting",
                        m.name,
                        s.depth(),
                        s.in_flight,
                        s.waiting
                    )),
                    None => Some(format!("{}: no queue", m.name)),
                }
            })
            .collect();
        last_state = format!(
            "{behind} objects not reconciled at their last version, {deleting} being deleted, queues: [{}]",
            busy.join("; ")
        );
        if behind == 0 && deleting == 0 && busy.is_empty() {
            break true;
        }
        if settle_start.elapsed() >= RECOVERY_LIMIT {
            break false;
        }
        sleep(Duration::from_millis(200)).await;
    };
    if !settled {
        failures.push(format!(
            "not settled {RECOVERY_LIMIT:?} after the run: {last_state}"
        ));
    }

    // The final state, and the checks on it.
    let objects = list(&api, RECOVERY_LIMIT).await.unwrap_or_default();
    let by_uid: HashMap<String, &Churn> = objects
        .iter()
        .map(|o| (o.uid().unwrap_or_default(), o))
        .collect();
    for o in &objects {
        for (record, who) in [
            (&controller_record, "the controller"),
            (&group_record, "the group"),
        ] {
            if record.reconciled(&o.name_any()) < version(o) {
                failures.push(format!(
                    "{}'s last change (resourceVersion {}) was never reconciled by {who}",
                    o.name_any(),
                    version(o)
                ));
            }
        }
        if o.metadata.deletion_timestamp.is_some() {
            failures.push(format!(
                "{} was deleted but is still there with finalizers {:?}",
                o.name_any(),
                o.finalizers()
            ));
        } else {
            for f in [CONTROLLER_FINALIZER, SHARDS_FINALIZER] {
                if !o.finalizers().iter().any(|x| x == f) {
                    failures.push(format!("{} lacks finalizer {f}", o.name_any()));
                }
            }
        }
    }
    for (record, who) in [
        (&controller_record, "the controller"),
        (&group_record, "the group"),
    ] {
        for (a, b) in record.overlaps().iter().take(10) {
            failures.push(format!(
                "{who}: {} reconciled by {} and {} at once (versions {} and {})",
                a.key, a.replica, b.replica, a.version, b.version
            ));
        }
    }
    // A change is lost if its object is still there (that incarnation)
    // and some record never reconciled it or a later version; or if it
    // was a deletion and the object is still there.
    let changes = writes.changes.lock().unwrap().clone();
    let lost = |c: &Change| -> bool {
        match by_uid.get(&c.uid) {
            None => false,
            Some(_) if c.kind == ChangeKind::Delete => true,
            Some(_) => records.iter().any(|r| r.reconciled(&c.key) < c.version),
        }
    };
    let lost_total = changes.iter().filter(|c| lost(c)).count();
    if lost_total > 0 {
        failures.push(format!("{lost_total} changes lost"));
    }
    for kind in Kind::ALL {
        if !fired.iter().any(|f| f.kind == kind) {
            failures.push(format!("no {kind} fault fired"));
        }
    }

    // Memory over the second half of the run.
    let samples = samples.lock().unwrap().clone();
    let half = &samples[samples.len() / 2..];
    let fifth = (half.len() / 5).max(1);
    let (early, late) = if half.len() >= 2 * fifth {
        (
            median(half[..fifth].to_vec()),
            median(half[half.len() - fifth..].to_vec()),
        )
    } else {
        (0, 0)
    };
    let allowed = early + (16 << 20).max(early / 4);
    if late > allowed {
        failures.push(format!(
            "resident memory grew over the second half: {:.1} MiB to {:.1} MiB",
            early as f64 / 1048576.0,
            late as f64 / 1048576.0
        ));
    }

    // Graceful shutdown of the four.
    for m in &mut members {
        if let Some(shutdown) = m.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
    for m in &mut members {
        if timeout(SHUTDOWN_LIMIT, &mut m.task).await.is_err() {
            failures.push(format!(
                "{} did not shut down within {SHUTDOWN_LIMIT:?}",
                m.name
            ));
            m.task.abort();
        }
    }

    // The figures.
    println!();
    println!(
        "{:.0} s of churn and faults ({} faults, {} restarts), settled {:.2} s after; \
         {} changes made ({} writes failed on faults), {} reconciles by the controller, {} by the group",
        run_time.as_secs_f64(),
        fired.len(),
        cluster.restarts(),
        settle_start.elapsed().as_secs_f64(),
        changes.len(),
        writes.failed.load(Ordering::Relaxed),
        controller_record.len(),
        group_record.len()
    );
    println!(
        "errors reported by the controllers' streams (watch failures, fenced reconciles, conflicts): {}",
        members
            .iter()
            .map(|m| format!("{} {}", m.name, m.errors.load(Ordering::Relaxed)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "resident memory over the second half: {:.1} MiB -> {:.1} MiB ({} samples)",
        early as f64 / 1048576.0,
        late as f64 / 1048576.0,
        half.len()
    );
    println!();
    println!(
        "  {:<8} {:>5}  {:>16}  {:>12}  {:>12}  {:>4}",
        "fault", "fired", "longest recovery", "longest held", "changes made", "lost"
    );
    let mut rows: Vec<Option<Kind>> = Kind::ALL.iter().copied().map(Some).collect();
    rows.push(None);
    for row in rows {
        let of_kind: Vec<(usize, &Fired)> = fired
            .iter()
            .enumerate()
            .filter(|(_, f)| Some(f.kind) == row)
            .collect();
        let made: Vec<&Change> = changes
            .iter()
            .filter(|c| c.fault.map(|i| fired[i].kind) == row)
            .collect();
        let longest = |f: fn(&Fired) -> Option<Duration>| {
            let all: Vec<Option<Duration>> = of_kind.iter().map(|(_, x)| f(x)).collect();
            if all.is_empty() {
                "-".to_string()
            } else if all.contains(&None) {
                "miss".to_string()
            } else {
                format!(
                    "{:.2} s",
                    all.into_iter()
                        .flatten()
                        .max()
                        .unwrap_or_default()
                        .as_secs_f64()
                )
            }
        };
        println!(
            "  {:<8} {:>5}  {:>16}  {:>12}  {:>12}  {:>4}",
            row.map_or("(start)".to_string(), |k| k.to_string()),
            if row.is_some() {
                of_kind.len().to_string()
            } else {
                "-".into()
            },
            longest(|f| f.recovery),
            longest(|f| Some(f.held)),
            made.len(),
            made.iter().filter(|c| lost(c)).count()
        );
    }

    drop(cluster);
    println!();
    if failures.is_empty() {
        println!(
            "OK: every object's last change reconciled by the controller and the group, no key \
             reconciled twice at once, no finalizer left on a deleted object, queues empty, \
             memory flat, every fault kind fired, 0 changes lost"
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for failure in failures.iter().take(50) {
            println!("FAILED: {failure}");
        }
        if failures.len() > 50 {
            println!("... and {} more", failures.len() - 50);
        }
        Ok(ExitCode::FAILURE)
    }
}
