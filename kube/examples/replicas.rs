//! Shards across replicas: several replicas of one `Controller<ConfigMap>`
//! split the ConfigMaps between them through `coordination.k8s.io/v1`
//! Leases (`.shards(..)`), and the keys of a replica that crashes move to
//! the others once its Lease expires.
//!
//! # Three replicas in one process (the default)
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example replicas
//! ```
//!
//! It starts the local API server, creates 30 ConfigMaps and runs three
//! replicas, each with a client on its own endpoint of the server, with
//! short timings (lease 1.5 s, renew deadline 1 s, retry 250 ms) so the
//! whole demo takes a few seconds (about 2 s). Each reconcile prints
//! `replica-N reconciled default/cm-K (v=..)`. Once the three replicas
//! acknowledge each other on their Leases it changes every ConfigMap
//! (`v=1`), then kills `replica-1` (its task is aborted: a crash, its Lease
//! stays) and changes every ConfigMap again (`v=2`). The keys of
//! `replica-1` move to the two others when its Lease expires. At the end it
//! prints which replica reconciled how many keys at each stage and how long
//! the hand-over took, then shuts the two others down gracefully (they
//! release their Leases; the crashed one's was released by the others
//! when it expired, and all three are deleted later, once unchanged for
//! the forget-after time).
//!
//! It exits with status 1 if a check fails, so it doubles as a smoke test:
//! every key's last change was reconciled, no two replicas ever reconciled
//! one key at once, each change was reconciled by the replica
//! `shard::owner` names for the members of the moment, and no Lease of
//! the group has a holder after the graceful shutdown.
//!
//! `--lease-duration`, `--renew-deadline` and `--retry-period` (seconds,
//! fractions allowed) change the timings.
//!
//! # One replica per process, against a cluster
//!
//! With `--cluster`, one replica runs against the cluster in `KUBECONFIG`
//! (or the in-cluster configuration), with client-go's default timings
//! (lease 15 s, renew deadline 10 s, retry 2 s) unless the flags above
//! say otherwise, and reconciles the ConfigMaps of its namespace until
//! Ctrl-C or SIGTERM. Then it shuts down gracefully: it finishes the
//! queued keys, releases its Lease, and the others take its keys at their
//! next retry. The identity is `--identity NAME` (or `POD_NAME`), the
//! namespace of the ConfigMaps and Leases `--namespace NS` (or
//! `POD_NAMESPACE`, or the client's default namespace), the shard group
//! `--group NAME` (`replicas-example` by default). A real cluster needs
//! TLS, hence the feature `rustls`. In three terminals:
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example replicas --features rustls -- --cluster --identity replica-a
//! cargo run -p tokio-workqueue-kube --example replicas --features rustls -- --cluster --identity replica-b
//! cargo run -p tokio-workqueue-kube --example replicas --features rustls -- --cluster --identity replica-c
//! ```
//!
//! and in a fourth, make changes and watch who reconciles them:
//!
//! ```text
//! for i in $(seq 0 9); do kubectl create configmap cm-$i --from-literal=v=0; done
//! kubectl get leases -l workqueue.tokio.rs/shard-group=replicas-example \
//!   -o custom-columns=NAME:.metadata.name,HOLDER:.spec.holderIdentity,ACK:'.metadata.annotations.workqueue\.tokio\.rs/acknowledged-members'
//! for i in $(seq 0 9); do kubectl patch configmap cm-$i -p '{"data":{"v":"1"}}'; done
//! ```
//!
//! Each replica prints the members it acknowledges whenever that changes.
//! Kill one with `kill -9` (a crash: its keys move once its Lease has not
//! changed for a lease duration; the others release its Lease then and
//! delete it after the forget-after time, 60 s by default) or stop it
//! with Ctrl-C (its keys move within a few retry periods). The identity
//! needs the rights the README's "Scale-out across replicas" section lists
//! (Leases and ConfigMaps in the namespace).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube_client::api::{ListParams, Patch, PatchParams, PostParams};
use kube_client::{Api, Client, ResourceExt};
use kube_runtime::watcher;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_workqueue_kube::shard::{ACK_ANNOTATION, GROUP_LABEL, ShardConfig, Shards, owner};
use tokio_workqueue_kube::{Action, Controller};

const USAGE: &str = "\
usage: replicas [--cluster] [--identity NAME] [--namespace NS] [--group NAME]
                [--lease-duration SECS] [--renew-deadline SECS] [--retry-period SECS]
                [--keys N]

Without --cluster: three replicas in this process against an in-process API
server, one killed half-way (--keys ConfigMaps, 30 by default). With
--cluster: one replica against the cluster in KUBECONFIG until Ctrl-C.";

/// The command line.
#[derive(Debug)]
struct Options {
    cluster: bool,
    identity: Option<String>,
    namespace: Option<String>,
    group: String,
    lease_duration: Option<Duration>,
    renew_deadline: Option<Duration>,
    retry_period: Option<Duration>,
    keys: usize,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            cluster: false,
            identity: None,
            namespace: None,
            group: "replicas-example".into(),
            lease_duration: None,
            renew_deadline: None,
            retry_period: None,
            keys: 30,
        };
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            let seconds = |name: &str, text: String| {
                text.parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("{name}: `{text}` is not a number of seconds"))
            };
            match arg.as_str() {
                "--cluster" => options.cluster = true,
                "--identity" => options.identity = Some(value("--identity")?),
                "--namespace" => options.namespace = Some(value("--namespace")?),
                "--group" => options.group = value("--group")?,
                "--lease-duration" => {
                    options.lease_duration = Some(seconds(&arg, value(&arg)?)?);
                }
                "--renew-deadline" => {
                    options.renew_deadline = Some(seconds(&arg, value(&arg)?)?);
                }
                "--retry-period" => {
                    options.retry_period = Some(seconds(&arg, value(&arg)?)?);
                }
                "--keys" => {
                    let text = value("--keys")?;
                    options.keys = text
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("--keys: `{text}` is not a positive number"))?;
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        Ok(options)
    }

    /// The timings: those given on the command line, `defaults` for the
    /// others.
    fn timings(&self, defaults: Timings) -> Timings {
        Timings {
            lease: self.lease_duration.unwrap_or(defaults.lease),
            renew: self.renew_deadline.unwrap_or(defaults.renew),
            retry: self.retry_period.unwrap_or(defaults.retry),
        }
    }

    /// This replica's shard configuration.
    fn config(&self, namespace: &str, identity: &str, timings: Timings) -> ShardConfig {
        ShardConfig::new(self.group.clone(), namespace, identity)
            .with_lease_duration(timings.lease)
            .with_renew_deadline(timings.renew)
            .with_retry_period(timings.retry)
    }
}

/// Lease duration, renew deadline and retry period.
#[derive(Debug, Clone, Copy)]
struct Timings {
    lease: Duration,
    renew: Duration,
    retry: Duration,
}

/// client-go's defaults (and `ShardConfig`'s): for `--cluster`.
const CLUSTER_TIMINGS: Timings = Timings {
    lease: Duration::from_secs(15),
    renew: Duration::from_secs(10),
    retry: Duration::from_secs(2),
};

/// Short timings, so that the local demo takes seconds.
const LOCAL_TIMINGS: Timings = Timings {
    lease: Duration::from_millis(1500),
    renew: Duration::from_millis(1000),
    retry: Duration::from_millis(250),
};

#[tokio::main]
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
    if options.cluster {
        one_replica(options).await
    } else {
        three_replicas(options).await
    }
}

// ---------------------------------------------------------------------------
// What every replica runs.

/// One replica's context: its name and the record its reconciles write to.
struct Ctx {
    replica: String,
    record: Arc<Record>,
    /// Whether to print the wall-clock time with each line (processes
    /// side by side).
    timestamps: bool,
}

/// Prints the change it was given. A real reconciler would make the world
/// match the object here; this one takes a little time, so that hand-overs
/// can meet reconciles in flight.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Infallible> {
    let running = ctx.record.start(&cm, &ctx.replica);
    sleep(Duration::from_millis(20)).await;
    running.finish();
    println!(
        "{}{} reconciled {}/{} (v={})",
        now(ctx.timestamps),
        ctx.replica,
        cm.namespace().unwrap_or_default(),
        cm.name_any(),
        value(&cm)
    );
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, error: &Infallible, _: Arc<Ctx>) -> Action {
    match *error {}
}

/// The time of day (UTC), to line up the output of several processes,
/// or nothing.
fn now(timestamps: bool) -> String {
    if timestamps {
        format!("{} ", Timestamp::now().strftime("%H:%M:%S%.3f"))
    } else {
        String::new()
    }
}

/// The ConfigMap's `v`, which this example changes.
fn value(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("v").cloned())
        .unwrap_or_else(|| "-".into())
}

/// One reconcile, as the reconcile function saw it.
#[derive(Debug, Clone)]
struct Run {
    /// The controller's key: `namespace/name`.
    key: String,
    replica: String,
    /// The object's resourceVersion.
    version: u64,
    /// Its `v`.
    value: String,
    start: Instant,
    /// When it ended (finished or was cancelled); `None` while it runs.
    end: Option<Instant>,
    /// Whether it ran to its end (a fenced reconcile is cancelled).
    finished: bool,
}

/// Every reconcile of every replica, written by the reconcile function
/// itself: the checks read this, not the code under test.
#[derive(Default)]
struct Record {
    runs: Mutex<Vec<Run>>,
}

/// A reconcile in progress: writes its end when dropped (at the end of the
/// reconcile, or where a cancelled reconcile stopped).
struct Running {
    record: Arc<Record>,
    index: usize,
    finished: bool,
}

impl Running {
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut runs = self.record.runs.lock().unwrap();
        runs[self.index].end = Some(Instant::now());
        runs[self.index].finished = self.finished;
    }
}

impl Record {
    fn start(self: &Arc<Self>, cm: &ConfigMap, replica: &str) -> Running {
        let mut runs = self.runs.lock().unwrap();
        runs.push(Run {
            key: key(cm),
            replica: replica.to_string(),
            version: cm
                .resource_version()
                .and_then(|v| v.parse().ok())
                .unwrap_or_default(),
            value: value(cm),
            start: Instant::now(),
            end: None,
            finished: false,
        });
        Running {
            record: self.clone(),
            index: runs.len() - 1,
            finished: false,
        }
    }

    fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    /// The keys in `versions` with no finished reconcile of that
    /// resourceVersion or a later one.
    fn unreconciled(&self, versions: &BTreeMap<String, u64>) -> Vec<String> {
        let runs = self.runs();
        versions
            .iter()
            .filter(|&(key, &version)| {
                !runs
                    .iter()
                    .any(|r| r.finished && &r.key == key && r.version >= version)
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Waits until every key in `versions` has been reconciled at its
    /// version, for at most `limit`; returns those that were not.
    async fn wait_reconciled(
        &self,
        versions: &BTreeMap<String, u64>,
        limit: Duration,
    ) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let missing = self.unreconciled(versions);
            if missing.is_empty() || Instant::now() >= deadline {
                return missing;
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Pairs of runs of one key by two replicas that overlapped in time.
    fn overlaps(&self) -> Vec<(Run, Run)> {
        let now = Instant::now();
        let runs = self.runs();
        let mut found = Vec::new();
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.key == b.key
                    && a.replica != b.replica
                    && a.start < b.end.unwrap_or(now)
                    && b.start < a.end.unwrap_or(now)
                {
                    found.push((a.clone(), b.clone()));
                }
            }
        }
        found
    }
}

/// The controller's key of an object: `namespace/name`.
fn key(cm: &ConfigMap) -> String {
    format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any())
}

/// Runs one replica's controller on `client` until `shutdown` (graceful:
/// the queued keys are reconciled, then the Lease is released) or, if
/// `shutdown` is `None`, until Ctrl-C or SIGTERM. Errors reported by the
/// controller (a watch failing, a reconcile fenced during a hand-over) are
/// printed.
fn controller(
    client: Client,
    namespace: &str,
    replica: String,
    config: ShardConfig,
    record: Arc<Record>,
    shutdown: Option<oneshot::Receiver<()>>,
) -> impl Future<Output = ()> + Send + 'static {
    let shards = Shards::new(client.clone(), config);
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, namespace),
        watcher::Config::default(),
    )
    .shards(shards);
    let timestamps = shutdown.is_none();
    let controller = match shutdown {
        Some(shutdown) => controller.graceful_shutdown_on(async move {
            let _ = shutdown.await;
        }),
        None => controller.shutdown_on_signal(),
    };
    let ctx = Arc::new(Ctx {
        replica: replica.clone(),
        record,
        timestamps,
    });
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(move |item| {
            if let Err(e) = item {
                println!("{}{replica}: {e}", now(timestamps));
            }
            async {}
        })
}

fn identity_of_lease(lease_name: &str, group: &str) -> String {
    lease_name
        .strip_prefix(group)
        .and_then(|rest| rest.strip_prefix('-'))
        .unwrap_or(lease_name)
        .to_string()
}

/// The group's Leases: name, holder and acknowledged members.
async fn group_leases(
    leases: &Api<Lease>,
    group: &str,
) -> Result<Vec<(String, Option<String>, Option<String>)>, kube_client::Error> {
    let list = leases
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={group}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|lease| {
            let ack = lease.annotations().get(ACK_ANNOTATION).cloned();
            let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
            (lease.name_any(), holder, ack)
        })
        .collect())
}

// ---------------------------------------------------------------------------
// --cluster: one replica in this process.

async fn one_replica(options: Options) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let namespace = options
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let Some(identity) = options
        .identity
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
    else {
        eprintln!("--cluster needs --identity NAME (or POD_NAME)\n\n{USAGE}");
        return Ok(ExitCode::from(2));
    };
    let timings = options.timings(CLUSTER_TIMINGS);
    let config = options.config(&namespace, &identity, timings);
    config.validate()?;
    let lease_name = config.lease_name();
    println!(
        "{}{identity}: shard group {} in namespace {namespace}, Lease {lease_name}, \
         lease {:?}, renew deadline {:?}, retry {:?}; Ctrl-C to stop",
        now(true),
        options.group,
        timings.lease,
        timings.renew,
        timings.retry,
    );
    let retry = timings.retry;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);

    // Prints the members this replica acknowledges whenever they change:
    // the view it publishes on its own Lease.
    let watch_leases = leases.clone();
    let me = identity.clone();
    let watch_name = lease_name.clone();
    let acks = tokio::spawn(async move {
        let mut last: Option<String> = None;
        loop {
            if let Ok(Some(lease)) = watch_leases.get_opt(&watch_name).await {
                let ack = lease.annotations().get(ACK_ANNOTATION).cloned();
                if ack.is_some() && ack != last {
                    println!(
                        "{}{me}: acknowledges members [{}]",
                        now(true),
                        ack.as_deref().unwrap_or_default()
                    );
                    last = ack;
                }
            }
            sleep(retry).await;
        }
    });

    controller(
        client,
        &namespace,
        identity.clone(),
        config,
        Arc::new(Record::default()),
        None,
    )
    .await;
    acks.abort();
    match leases.get_opt(&lease_name).await {
        Ok(Some(lease))
            if lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_none() =>
        {
            println!(
                "{}{identity}: shut down; its Lease {lease_name} is released",
                now(true)
            );
        }
        Ok(None) => println!(
            "{}{identity}: shut down; its Lease {lease_name} is gone",
            now(true)
        ),
        Ok(Some(_)) => println!(
            "{}{identity}: shut down, but its Lease {lease_name} is still held",
            now(true)
        ),
        Err(e) => println!(
            "{}{identity}: shut down; reading its Lease failed: {e}",
            now(true)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------
// The default: three replicas in this process against the local API server.

const REPLICAS: usize = 3;
/// The replica killed half-way.
const KILLED: usize = 1;
const NAMESPACE: &str = "default";

/// One replica's controller, on a task of its own.
struct Replica {
    name: String,
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// Something the example saw: when (since the start) and what.
struct Events {
    start: Instant,
    lines: Mutex<Vec<(Duration, String)>>,
}

impl Events {
    fn note(&self, line: String) {
        let at = self.start.elapsed();
        println!("--- {:>6.2} s  {line}", at.as_secs_f64());
        self.lines.lock().unwrap().push((at, line));
    }
}

async fn three_replicas(options: Options) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let server = kube_local_apiserver::LocalApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let timings = options.timings(LOCAL_TIMINGS);
    let names: Vec<String> = (0..REPLICAS).map(|i| format!("replica-{i}")).collect();
    let configs: Vec<ShardConfig> = names
        .iter()
        .map(|name| options.config(NAMESPACE, name, timings))
        .collect();
    for config in &configs {
        config.validate()?;
    }
    let Timings {
        lease,
        renew,
        retry,
    } = timings;
    // Generous bounds for each stage (a slow, loaded machine included).
    let limit = lease * 4 + Duration::from_secs(10);

    for i in 0..options.keys {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        cm.data = Some(BTreeMap::from([("v".to_string(), "0".to_string())]));
        cms.create(&PostParams::default(), &cm).await?;
    }
    let keys: Vec<String> = (0..options.keys)
        .map(|i| format!("{NAMESPACE}/cm-{i}"))
        .collect();
    println!(
        "local API server at {}; {} ConfigMaps; {REPLICAS} replicas in shard group {}, \
         lease {lease:?}, renew deadline {:?}, retry {retry:?}",
        server.url(),
        options.keys,
        options.group,
        renew,
    );

    let record = Arc::new(Record::default());
    let events = Arc::new(Events {
        start: Instant::now(),
        lines: Mutex::new(Vec::new()),
    });
    let mut replicas: Vec<Replica> = configs
        .into_iter()
        .zip(&names)
        .map(|(config, name)| {
            // Each replica has its own line to the server, as separate
            // processes would.
            let replica_client = server.endpoint().client();
            let (shutdown, on_shutdown) = oneshot::channel();
            let task = tokio::spawn(controller(
                replica_client,
                NAMESPACE,
                name.clone(),
                config,
                record.clone(),
                Some(on_shutdown),
            ));
            Replica {
                name: name.clone(),
                task,
                shutdown: Some(shutdown),
            }
        })
        .collect();
    events.note(format!("started {}", names.join(", ")));
    let observer = tokio::spawn(observe_acks(
        leases.clone(),
        options.group.clone(),
        events.clone(),
    ));

    let mut failures: Vec<String> = Vec::new();
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let survivors: Vec<&str> = all
        .iter()
        .copied()
        .filter(|&n| n != names[KILLED])
        .collect();

    // 1. The three find each other.
    if !wait_acks(&leases, &options.group, &all, limit).await? {
        failures.push(format!(
            "the replicas did not all acknowledge [{}] within {limit:?}",
            all.join(",")
        ));
    }
    events.note(format!("every replica acknowledges [{}]", all.join(",")));

    // 2. Every ConfigMap changes; each change goes to its owner.
    let v1 = change_all(&cms, options.keys, "1").await?;
    events.note("changed every ConfigMap to v=1".into());
    let missing = record.wait_reconciled(&v1, limit).await;
    if !missing.is_empty() {
        failures.push(format!("v=1 never reconciled: {missing:?}"));
    }
    events.note("every v=1 reconciled".into());

    // 3. replica-1 crashes: its task is aborted, its Lease stays.
    replicas[KILLED].task.abort();
    let killed_at = Instant::now();
    events.note(format!(
        "killed {} (a crash: its Lease stays)",
        names[KILLED]
    ));

    // 4. Every ConfigMap changes again, replica-1's too: they wait until
    // its Lease expires, then its keys move to the two others.
    let v2 = change_all(&cms, options.keys, "2").await?;
    events.note("changed every ConfigMap to v=2".into());
    let missing = record.wait_reconciled(&v2, limit).await;
    if !missing.is_empty() {
        failures.push(format!(
            "the last change (v=2) of {} keys was never reconciled: {missing:?}",
            missing.len()
        ));
    }
    events.note("every v=2 reconciled".into());

    // 5. The two others stop gracefully and release their Leases.
    for replica in &mut replicas {
        if let Some(shutdown) = replica.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
    for replica in replicas.iter_mut().filter(|r| r.name != names[KILLED]) {
        if timeout(limit, &mut replica.task).await.is_err() {
            failures.push(format!(
                "{} did not shut down within {limit:?}",
                replica.name
            ));
        }
    }
    events.note(format!("shut down {} gracefully", survivors.join(" and ")));
    observer.abort();
    // Released by their replicas, or (the crashed one's) by the others
    // when it expired: none is held any more.
    let left: Vec<String> = group_leases(&leases, &options.group)
        .await?
        .into_iter()
        .filter(|(_, holder, _)| holder.is_some())
        .map(|(name, _, _)| name)
        .collect();
    if !left.is_empty() {
        failures.push(format!(
            "after the graceful shutdown these Leases of the group are still held: {left:?}"
        ));
    }

    // The summary, from the record.
    let runs = record.runs();
    print_summary(
        &runs, &names, &keys, &all, &survivors, killed_at, &events, lease, retry, &left,
    );

    // The checks.
    for (a, b) in record.overlaps() {
        failures.push(format!(
            "{} and {} reconciled {} at once",
            a.replica, b.replica, a.key
        ));
    }
    for run in runs.iter().filter(|r| r.value == "1") {
        let expected = owner(&run.key, &all).unwrap_or_default();
        if run.replica != expected {
            failures.push(format!(
                "{} reconciled {} at v=1, but its owner among [{}] is {expected}",
                run.replica,
                run.key,
                all.join(",")
            ));
        }
    }
    for run in runs.iter().filter(|r| r.value == "2") {
        let expected = owner(&run.key, &survivors).unwrap_or_default();
        if run.replica != expected {
            failures.push(format!(
                "{} reconciled {} at v=2, but its owner among [{}] is {expected}",
                run.replica,
                run.key,
                survivors.join(",")
            ));
        }
    }

    println!();
    if failures.is_empty() {
        println!(
            "OK: every key's last change was reconciled, never by two replicas at once, \
             always by its owner"
        );
        Ok(ExitCode::SUCCESS)
    } else {
        for failure in &failures {
            println!("FAILED: {failure}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// Patches every ConfigMap's `v`; returns each key's new resourceVersion.
async fn change_all(
    cms: &Api<ConfigMap>,
    keys: usize,
    v: &str,
) -> Result<BTreeMap<String, u64>, kube_client::Error> {
    let patch = Patch::Merge(json!({ "data": { "v": v } }));
    let mut versions = BTreeMap::new();
    for i in 0..keys {
        let cm = cms
            .patch(&format!("cm-{i}"), &PatchParams::default(), &patch)
            .await?;
        let version = cm
            .resource_version()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        versions.insert(key(&cm), version);
    }
    Ok(versions)
}

/// Waits until the Leases of `members` each acknowledge exactly
/// `members`, for at most `limit`.
async fn wait_acks(
    leases: &Api<Lease>,
    group: &str,
    members: &[&str],
    limit: Duration,
) -> Result<bool, kube_client::Error> {
    let expected = {
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        sorted.join(",")
    };
    let deadline = Instant::now() + limit;
    loop {
        let acks: BTreeMap<String, Option<String>> = group_leases(leases, group)
            .await?
            .into_iter()
            .map(|(name, _, ack)| (identity_of_lease(&name, group), ack))
            .collect();
        if members
            .iter()
            .all(|m| acks.get(*m).and_then(|a| a.as_deref()) == Some(expected.as_str()))
        {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Notes every change of a replica's acknowledged members, as read from
/// its Lease.
async fn observe_acks(leases: Api<Lease>, group: String, events: Arc<Events>) {
    let mut seen: BTreeMap<String, Option<String>> = BTreeMap::new();
    loop {
        if let Ok(list) = group_leases(&leases, &group).await {
            for (name, _, ack) in list {
                let identity = identity_of_lease(&name, &group);
                if ack.is_some() && seen.get(&identity) != Some(&ack) {
                    events.note(format!(
                        "{identity} acknowledges [{}]",
                        ack.as_deref().unwrap_or_default()
                    ));
                    seen.insert(identity, ack);
                }
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
}

#[allow(clippy::too_many_arguments)]
fn print_summary(
    runs: &[Run],
    names: &[String],
    keys: &[String],
    all: &[&str],
    survivors: &[&str],
    killed_at: Instant,
    events: &Events,
    lease: Duration,
    retry: Duration,
    leases_left: &[String],
) {
    let killed = names[KILLED].as_str();
    let distinct = |replica: &str, v: &str| -> BTreeSet<&str> {
        runs.iter()
            .filter(|r| r.replica == replica && r.value == v && r.finished)
            .map(|r| r.key.as_str())
            .collect()
    };
    println!();
    println!("keys reconciled, per replica:");
    println!(
        "  {:<10}  {:>14}  {:>20}  {:>19}",
        "replica", "at start (v=0)", "before the kill (v=1)", "after the kill (v=2)"
    );
    for name in names {
        let after = if name == killed {
            "killed".to_string()
        } else {
            distinct(name, "2").len().to_string()
        };
        println!(
            "  {:<10}  {:>14}  {:>20}  {:>19}",
            name,
            distinct(name, "0").len(),
            distinct(name, "1").len(),
            after
        );
    }
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| owner(k, all) == Some(killed))
        .collect();
    let mut to: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for k in &moved {
        if let Some(new) = owner(k, survivors) {
            to.entry(new).or_default().push(k.as_str());
        }
    }
    println!(
        "  {killed}'s {} keys go to: {}",
        moved.len(),
        to.iter()
            .map(|(r, ks)| format!("{r} ({})", ks.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Hand-over: from the kill to the first and the last start, by a
    // survivor, of a key the killed replica owned.
    let taken: Vec<&Run> = runs
        .iter()
        .filter(|r| r.start >= killed_at && r.replica != killed && moved.contains(&&r.key))
        .collect();
    let since_kill = |t: Instant| (t - killed_at).as_secs_f64();
    match (
        taken.iter().map(|r| r.start).min(),
        taken.iter().map(|r| r.start).max(),
    ) {
        (Some(first), Some(last)) => println!(
            "  hand-over: {killed}'s first key restarted {:.2} s after the kill, its last {:.2} s \
             after (lease {:.2} s + retry {:.2} s = {:.2} s)",
            since_kill(first),
            since_kill(last),
            lease.as_secs_f64(),
            retry.as_secs_f64(),
            (lease + retry).as_secs_f64(),
        ),
        _ => println!("  hand-over: none of {killed}'s keys was reconciled after the kill"),
    }
    let cancelled = runs
        .iter()
        .filter(|r| r.end.is_some() && !r.finished)
        .count();
    println!("  reconciles cancelled (fenced or killed): {cancelled}");
    println!(
        "  Leases still held in the group: {}",
        if leases_left.is_empty() {
            "none".to_string()
        } else {
            leases_left.join(", ")
        }
    );
    println!("  timeline:");
    for (at, line) in events.lines.lock().unwrap().iter() {
        println!("    {:>6.2} s  {line}", at.as_secs_f64());
    }
}
