//! The benchmark workloads of `shared/bench/WORKLOADS.md` (W1..W7, and C1
//! with the `kube` feature, on the local API server and, as C1-real, on a
//! real kube-apiserver from `kube-test-cluster`), run
//! side by side against this crate and two baselines in one process:
//!
//! - `mpsc`: `tokio::sync::mpsc::unbounded_channel`, consumers sharing the
//!   receiver behind a mutex (the floor: handing a key from task to task);
//! - `kube-runtime`: `kube_runtime::scheduler::scheduler` fed by a channel of
//!   `ScheduleRequest`s and driven as kube-runtime's controller runner drives
//!   it (see [`kube_runner`]);
//!
//! and, on W1, W1-100k and W2, beside the Go queues controllers use
//! (client-go's workqueue, controller-runtime's priority queue), run by the Go
//! program in `benches/go-peers/` between the Rust runs (see [`go_peers`]).
//!
//! W7 (a tenant's flood) compares two orderings of this crate instead: fair
//! share by namespace, and FIFO. W6 also measures fair share's memory.
//!
//! ```text
//! cargo bench --bench workloads              # the full run (minutes)
//! cargo bench --bench workloads -- --quick   # N/20, 3 runs: what CI runs
//! cargo bench --bench workloads -- W1 W6     # only workloads whose name contains W1 or W6
//! cargo bench --bench workloads -- --impl=mpsc W1   # and only implementations named so
//! cargo bench --bench workloads -- '--impl=tokio-workqueue$' W1   # exactly so
//! cargo bench --bench workloads -- --verbose  # also print every run's figures
//! cargo bench --bench workloads -- --no-go    # without the Go peers
//! ```
//!
//! Prints a table, target verdicts (ratios of medians measured in this run)
//! and writes the rows to `target/workloads.json`. Each figure is the median
//! of the runs after one warm-up run, with the min and max beside it; each run
//! gets a fresh 2-worker tokio runtime, and the implementations take turns
//! run by run so that load on the machine falls on all of them alike.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::{mpsc as fmpsc, oneshot};
use kube_runtime::scheduler::{ScheduleRequest, Scheduler, scheduler};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_workqueue::ordering::Ordering as QueueOrdering;
use tokio_workqueue::{AddOpts, FairShare, Fifo, WorkQueue};

#[path = "workloads/c1.rs"]
mod c1;

#[path = "workloads/go_peers.rs"]
mod go_peers;

// ---------------------------------------------------------------- settings

/// Run settings from the command line.
struct Config {
    quick: bool,
    /// Divides every N (20 in quick mode).
    scale: usize,
    /// Timed runs after the warm-up.
    runs: usize,
    /// Substrings of the workload names to run; empty runs all.
    only: Vec<String>,
    /// `--impl=NAME`: only the implementations whose name contains NAME
    /// (`--impl=NAME$`: whose name is NAME).
    imp: Option<String>,
    /// `--verbose`: print every run's figures.
    verbose: bool,
    /// The Go peers of this sitting (`--no-go`: none).
    go_peers: go_peers::GoPeers,
}

impl Config {
    fn from_args() -> Self {
        let mut quick = false;
        let mut only = Vec::new();
        let mut imp = None;
        let mut verbose = false;
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--quick" => quick = true,
                "--verbose" => verbose = true,
                a if a.starts_with("--impl=") => imp = Some(a["--impl=".len()..].to_string()),
                // `cargo bench` passes `--bench`; other flags are not ours.
                a if a.starts_with('-') => {}
                a => only.push(a.to_string()),
            }
        }
        Config {
            quick,
            scale: if quick { 20 } else { 1 },
            runs: if quick { 3 } else { 5 },
            only,
            imp,
            verbose,
            go_peers: go_peers::GoPeers::from_args(),
        }
    }

    fn wants(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| workload.contains(o.as_str()))
    }

    /// Whether `--impl` selects `name`: by substring, or exactly when the
    /// pattern ends in `$`.
    fn runs_impl(&self, name: &str) -> bool {
        match self.imp.as_deref() {
            None => true,
            Some(p) => match p.strip_suffix('$') {
                Some(exact) => name == exact,
                None => name.contains(p),
            },
        }
    }

    fn n(&self, full: usize) -> usize {
        full / self.scale
    }
}

/// The consumers of W1..W4.
const CONSUMERS: usize = 4;
/// W5: the consumer's time per item, and the starvation bound under test.
const W5_ITEM: Duration = Duration::from_micros(50);
const W5_BOUND: Duration = Duration::from_millis(100);
const W5_LOW: usize = 100;
const W5_AHEAD: Duration = Duration::from_millis(10);
/// W7: the consumer's time per item, the other tenants and their keys, and
/// the most hand-outs one of their keys may wait for under fair share.
const W7_ITEM: Duration = Duration::from_micros(50);
const W7_TENANTS: usize = 9;
const W7_PER_TENANT: usize = 10;
const W7_TARGET: f64 = 100.0;
/// W2: distinct keys, producers.
const W2_KEYS: usize = 1000;
const W2_PRODUCERS: usize = 4;
/// W4: the priority of key `i` is `W4_PRIORITIES[i % 3]`.
const W4_PRIORITIES: [i32; 3] = [-100, 0, 10];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Key `i` in the Kubernetes form the workloads use.
fn key(i: usize) -> String {
    format!("ns-{}/obj-{i}", i % 100)
}

fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(key).collect()
}

/// The number `i` of a key made by [`key`].
fn key_index(key: &str) -> usize {
    key.rsplit_once('-')
        .and_then(|(_, i)| i.parse().ok())
        .expect("a workload key")
}

// ------------------------------------------------------- implementations

/// What a workload does with each key handed out: the "processing".
type Work = Arc<dyn Fn(&str) + Send + Sync>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The producer side of an implementation.
trait Adder: Send + Sync {
    fn add(&self, key: String);
    fn add_after(&self, key: String, delay: Duration);
    /// Only called on implementations with [`Subject::priorities`].
    fn add_priority(&self, key: String, priority: i32);
}

/// The end of a drain: when the last processing ended and how many there were.
struct Drained {
    end: Instant,
    processed: u64,
}

/// An implementation started on the current runtime.
struct Running {
    adder: Arc<dyn Adder>,
    /// Poll only once every producer is done and every `adder` clone but
    /// this one's is dropped (the driver drops its own first): resolves when
    /// every key added was processed and nothing is queued or in flight.
    drain: BoxFuture<Drained>,
}

/// One implementation under test.
trait Subject {
    fn name(&self) -> String;
    fn priorities(&self) -> bool {
        false
    }
    /// Starts `consumers` consumers that run `work` on each key handed out.
    fn start(&self, consumers: usize, work: Work) -> Running;
}

async fn join_sum(handles: Vec<JoinHandle<u64>>) -> u64 {
    let mut sum = 0;
    for h in handles {
        sum += h.await.expect("a consumer panicked");
    }
    sum
}

/// This crate, optionally with metrics, a starvation bound or an ordering
/// other than the default.
struct Crate {
    metrics: bool,
    bound: Option<Option<Duration>>,
    ordering: Order,
}

/// The orderings the workloads run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// `Priorities`, the default.
    Default,
    Fifo,
    /// `FairShare` across namespaces (the part of a key before `/`).
    FairByNamespace,
}

const CRATE: Crate = Crate {
    metrics: false,
    bound: None,
    ordering: Order::Default,
};

/// A key's namespace: its tenant under fair share.
fn namespace_of(key: &str) -> String {
    key.split_once('/').map_or(key, |(ns, _)| ns).to_string()
}

fn fair_by_namespace() -> FairShare<String, String> {
    FairShare::new(|key: &String| namespace_of(key))
}

/// The hook behind the "metrics on" rows: the crate's Prometheus metrics when
/// it has the `prometheus` feature (`cargo bench --bench workloads --features
/// prometheus`), else a hook that records nothing.
mod metrics_hook {
    use tokio_workqueue::Builder;

    /// A metrics hook that records nothing: the queue keeps its times (a
    /// clock read per add and hand-out, ready and lease stamps) and calls the
    /// hook, which costs nothing of its own.
    #[cfg(not(feature = "prometheus"))]
    struct NoopMetrics;

    #[cfg(not(feature = "prometheus"))]
    impl tokio_workqueue::metrics::MetricsHook for NoopMetrics {}

    #[cfg(not(feature = "prometheus"))]
    pub const KIND: &str = "noop";

    #[cfg(not(feature = "prometheus"))]
    pub fn with_metrics(b: Builder<String>) -> Builder<String> {
        b.metrics(NoopMetrics)
    }

    #[cfg(feature = "prometheus")]
    pub const KIND: &str = "prometheus";

    #[cfg(feature = "prometheus")]
    pub fn with_metrics(b: Builder<String>) -> Builder<String> {
        let metrics = tokio_workqueue::metrics::prometheus::PrometheusMetrics::new();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        b.name("bench").metrics(metrics)
    }
}

impl Subject for Crate {
    fn name(&self) -> String {
        let mut name = "tokio-workqueue".to_string();
        if self.metrics {
            name += &format!("[metrics={}]", metrics_hook::KIND);
        }
        match self.bound {
            Some(Some(b)) => name += &format!("[bound={}ms]", b.as_millis()),
            Some(None) => name += "[bound=off]",
            None => {}
        }
        match self.ordering {
            Order::Default => {}
            Order::Fifo => name += "[fifo]",
            Order::FairByNamespace => name += "[fair=namespace]",
        }
        name
    }

    fn priorities(&self) -> bool {
        true
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let mut builder = WorkQueue::<String>::builder();
        if self.metrics {
            builder = metrics_hook::with_metrics(builder);
        }
        if let Some(Some(bound)) = self.bound {
            builder = builder.starvation_bound(bound);
        }
        match self.ordering {
            Order::Default => start_queue(builder.build(), consumers, work),
            Order::Fifo => start_queue(builder.ordering(Fifo::new()).build(), consumers, work),
            Order::FairByNamespace => start_queue(
                builder.ordering(fair_by_namespace()).build(),
                consumers,
                work,
            ),
        }
    }
}

/// Starts `consumers` consumers of `queue` that run `work` on each key.
fn start_queue<O: QueueOrdering<String>>(
    queue: WorkQueue<String, O>,
    consumers: usize,
    work: Work,
) -> Running {
    let handles = (0..consumers)
        .map(|_| {
            let (queue, work) = (queue.clone(), work.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while let Some(item) = queue.get().await {
                    work(item.key());
                    n += 1;
                    // Dropping `item` marks the key done.
                }
                n
            })
        })
        .collect();
    let drain_queue = queue.clone();
    Running {
        adder: Arc::new(queue),
        drain: Box::pin(async move {
            drain_queue.shutdown_with_drain().await;
            let end = Instant::now();
            let processed = join_sum(handles).await;
            Drained { end, processed }
        }),
    }
}

impl<O: QueueOrdering<String>> Adder for WorkQueue<String, O> {
    fn add(&self, key: String) {
        WorkQueue::add(self, key).expect("the queue is open");
    }
    fn add_after(&self, key: String, delay: Duration) {
        WorkQueue::add_after(self, key, delay).expect("the queue is open");
    }
    fn add_priority(&self, key: String, priority: i32) {
        self.add_with(key, AddOpts::default().priority(priority))
            .expect("the queue is open");
    }
}

/// The floor: a tokio unbounded channel whose consumers share the receiver
/// behind a mutex. No de-duplication, no in-flight tracking. Delayed keys go
/// through one forwarding task that holds them in a `tokio_util` `DelayQueue`
/// (the tool tokio offers for many delays) and sends each when it is due.
struct Mpsc;

struct MpscAdder {
    now: tokio::sync::mpsc::UnboundedSender<String>,
    later: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
}

/// Holds delayed keys until they are due, then sends them on `out`. Ends
/// once every sender of `requests` is gone and no key is left waiting.
async fn forward_when_due(
    mut requests: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let mut waiting = tokio_util::time::DelayQueue::new();
    let mut open = true;
    poll_fn(|cx| {
        while open {
            match requests.poll_recv(cx) {
                Poll::Ready(Some((key, at))) => {
                    waiting.insert_at(key, at);
                }
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(due)) = waiting.poll_expired(cx) {
            let _ = out.send(due.into_inner());
        }
        if open || !waiting.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

impl Subject for Mpsc {
    fn name(&self) -> String {
        "mpsc".into()
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let handles = (0..consumers)
            .map(|_| {
                let (rx, work) = (rx.clone(), work.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    loop {
                        let next = rx.lock().await.recv().await;
                        let Some(key) = next else { break n };
                        work(&key);
                        n += 1;
                    }
                })
            })
            .collect();
        let (later, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(forward_when_due(requests, tx.clone()));
        Running {
            adder: Arc::new(MpscAdder { now: tx, later }),
            // The channel closes when the last sender (the adder's, and the
            // forwarder's once nothing waits) is gone; the consumers then end.
            drain: Box::pin(async move {
                let processed = join_sum(handles).await;
                Drained {
                    end: Instant::now(),
                    processed,
                }
            }),
        }
    }
}

impl Adder for MpscAdder {
    fn add(&self, key: String) {
        self.now.send(key).expect("the consumers are running");
    }
    fn add_after(&self, key: String, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        self.later
            .send((key, Instant::now() + delay))
            .expect("the forwarder is running");
    }
    fn add_priority(&self, _: String, _: i32) {
        unreachable!("mpsc has no priorities")
    }
}

/// kube-runtime's scheduler, fed by a channel of `ScheduleRequest`s and
/// driven by [`kube_runner`].
struct Kube;

type KubeRequests = fmpsc::UnboundedReceiver<ScheduleRequest<String>>;

struct KubeAdder(fmpsc::UnboundedSender<ScheduleRequest<String>>);

/// A key no workload uses: scheduled last by a drain, it tells the runner
/// that every earlier request has come out of the scheduler.
const SENTINEL: &str = "\0drain";
/// How far after the drain starts the sentinel is due: past the millisecond
/// tick of every earlier request, so the scheduler's `DelayQueue` hands it
/// out after all of them.
const SENTINEL_AFTER: Duration = Duration::from_millis(2);

impl Subject for Kube {
    fn name(&self) -> String {
        "kube-runtime".into()
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let (tx, rx) = fmpsc::unbounded();
        let (done_tx, done_rx) = oneshot::channel();
        let draining = Arc::new(AtomicBool::new(false));
        tokio::spawn(kube_runner(
            scheduler(rx),
            consumers,
            work,
            draining.clone(),
            done_tx,
        ));
        let sentinel_tx = tx.clone();
        Running {
            adder: Arc::new(KubeAdder(tx)),
            // The scheduler ends as soon as its request stream does, dropping
            // what it still holds, so a drain cannot just close the channel:
            // it schedules a sentinel after every request made so far, and
            // the runner reports once the sentinel is out and nothing is in
            // flight or held. The end is the last processing's, so the
            // sentinel's wait is not counted.
            drain: Box::pin(async move {
                draining.store(true, Ordering::SeqCst);
                sentinel_tx
                    .unbounded_send(ScheduleRequest {
                        message: SENTINEL.to_string(),
                        run_at: Instant::now() + SENTINEL_AFTER,
                    })
                    .expect("the runner is running");
                done_rx.await.expect("the runner reports its drain")
            }),
        }
    }
}

impl KubeAdder {
    fn request(&self, message: String, run_at: Instant) {
        self.0
            .unbounded_send(ScheduleRequest { message, run_at })
            .expect("the runner is running");
    }
}

impl Adder for KubeAdder {
    fn add(&self, key: String) {
        self.request(key, Instant::now());
    }
    fn add_after(&self, key: String, delay: Duration) {
        self.request(key, Instant::now() + delay);
    }
    fn add_priority(&self, _: String, _: i32) {
        unreachable!("kube-runtime's scheduler has no priorities")
    }
}

/// Drives a kube-runtime `Scheduler` as kube-runtime's controller `Runner`
/// does (kube-runtime 5, `src/controller/runner.rs`, which is private to that
/// crate; this is a small model of it, not a copy): each poll first reaps
/// finished reconciles (their `FutureHashMap` of slots keyed by message);
/// then, while fewer than `concurrency` are running, it takes the next
/// message with `hold_unless(|msg| !slots.contains_key(msg))`, so a key in
/// flight is held back, and spawns its reconcile as a task (as
/// `Controller::run` does, through `CancelableJoinHandle::spawn`); when all
/// slots are busy it polls `hold()`, which takes requests in and holds what
/// expires.
async fn kube_runner(
    scheduler: Scheduler<String, KubeRequests>,
    concurrency: usize,
    work: Work,
    draining: Arc<AtomicBool>,
    report: oneshot::Sender<Drained>,
) {
    let mut scheduler = pin!(scheduler);
    let mut slots: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut processed = 0u64;
    let mut last_done = None;
    let mut sentinel_seen = false;
    let mut report = Some(report);
    poll_fn(|cx| {
        let running = slots.len();
        slots.retain(|_, reconcile| match Pin::new(reconcile).poll(cx) {
            Poll::Ready(outcome) => {
                outcome.expect("a reconcile panicked");
                false
            }
            Poll::Pending => true,
        });
        if slots.len() < running {
            processed += (running - slots.len()) as u64;
            if draining.load(Ordering::Relaxed) {
                last_done = Some(Instant::now());
            }
        }
        loop {
            if slots.len() >= concurrency {
                return match scheduler.as_mut().hold().poll_next_unpin(cx) {
                    Poll::Ready(Some(_)) => unreachable!("hold never emits"),
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                };
            }
            let next = scheduler
                .as_mut()
                .hold_unless(|msg| !slots.contains_key(msg))
                .poll_next_unpin(cx);
            match next {
                Poll::Ready(Some(msg)) if msg == SENTINEL => sentinel_seen = true,
                Poll::Ready(Some(msg)) => {
                    let (key, work) = (msg.clone(), work.clone());
                    slots.insert(msg, tokio::spawn(async move { work(&key) }));
                    // As the Runner does: poll again, so the new slot's
                    // handle gets polled (and registers this task).
                    cx.waker().wake_by_ref();
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending if sentinel_seen && slots.is_empty() => {
                    let end = last_done.unwrap_or_else(Instant::now);
                    if let Some(report) = report.take() {
                        let _ = report.send(Drained { end, processed });
                    }
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

// ------------------------------------------------------------- results

/// One figure of one implementation on one workload, one sample per run.
struct Row {
    imp: String,
    workload: String,
    figure: &'static str,
    samples: Vec<f64>,
}

impl Row {
    fn sorted(&self) -> Vec<f64> {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        s
    }
    fn min(&self) -> f64 {
        self.sorted()[0]
    }
    fn median(&self) -> f64 {
        let s = self.sorted();
        s[s.len() / 2]
    }
    fn max(&self) -> f64 {
        *self.sorted().last().expect("a sample")
    }
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn push(&mut self, imp: &str, workload: &str, figure: &'static str, sample: f64) {
        match self
            .rows
            .iter_mut()
            .find(|r| r.imp == imp && r.workload == workload && r.figure == figure)
        {
            Some(row) => row.samples.push(sample),
            None => self.rows.push(Row {
                imp: imp.to_string(),
                workload: workload.to_string(),
                figure,
                samples: vec![sample],
            }),
        }
    }

    fn median(&self, imp: &str, workload: &str, figure: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.imp == imp && r.workload == workload && r.figure == figure)
            .map(Row::median)
    }

    fn print_table(&self) {
        println!(
            "\n{:<10} {:<24} {:<38} {:>12} {:>12} {:>12}",
            "workload", "figure", "impl", "median", "min", "max"
        );
        println!("{}", "-".repeat(113));
        for r in &self.rows {
            println!(
                "{:<10} {:<24} {:<38} {:>12} {:>12} {:>12}",
                r.workload,
                r.figure,
                r.imp,
                fmt_num(r.median()),
                fmt_num(r.min()),
                fmt_num(r.max())
            );
        }
    }

    fn write_json(&self) -> std::io::Result<std::path::PathBuf> {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "impl": r.imp,
                    "workload": r.workload,
                    "figure": r.figure,
                    "min": r.min(),
                    "median": r.median(),
                    "max": r.max(),
                })
            })
            .collect();
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("workloads.json");
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        std::fs::write(&path, text + "\n")?;
        Ok(path)
    }
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x.abs() >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

// ----------------------------------------------------------- workloads

/// Counts processings down to zero and remembers when it got there.
struct Countdown {
    left: AtomicUsize,
    end: OnceLock<Instant>,
    reached: Notify,
}

impl Countdown {
    fn new(n: usize) -> Self {
        Countdown {
            left: AtomicUsize::new(n),
            end: OnceLock::new(),
            reached: Notify::new(),
        }
    }

    fn hit(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.end.set(Instant::now());
            self.reached.notify_one();
        }
    }

    async fn wait(&self) -> Instant {
        self.reached.notified().await;
        *self.end.get().expect("set before the notification")
    }
}

/// What [`run_counted`] saw.
#[derive(Clone, Copy)]
struct Counted {
    /// The first add.
    start: Instant,
    /// When the producer's last add returned.
    last_add: Instant,
    /// When the last key was processed.
    end: Instant,
    /// Keys not yet processed when the producer's last add returned: how
    /// far the consumers fell behind (W1's run-to-run spread is mostly
    /// whether they keep up or not).
    left_at_last_add: usize,
}

impl Counted {
    /// Keys processed per second, from the first add to the last key done.
    fn items_per_sec(self, n: usize) -> f64 {
        n as f64 / (self.end - self.start).as_secs_f64()
    }

    /// Adds per second while the consumers ran beside the producer.
    fn adds_per_sec(self, n: usize) -> f64 {
        n as f64 / (self.last_add - self.start).as_secs_f64()
    }

    /// Keys per second processed after the producer finished: the rate at
    /// which the consumers alone, on both threads, drained what was left
    /// (zero when nothing was left).
    fn drain_per_sec(self) -> f64 {
        let secs = (self.end - self.last_add).as_secs_f64();
        if self.left_at_last_add == 0 || secs <= 0.0 {
            0.0
        } else {
            self.left_at_last_add as f64 / secs
        }
    }
}

/// One producer adds `keys` with `add(adder, i, key)`; `CONSUMERS` consumers
/// run `work` on each key handed out.
fn run_counted(
    subject: &dyn Subject,
    keys: Vec<String>,
    add: impl Fn(&dyn Adder, usize, String) + Send + 'static,
    work: impl Fn(&str) + Send + Sync + 'static,
) -> Counted {
    let rt = runtime();
    rt.block_on(async {
        let countdown = Arc::new(Countdown::new(keys.len()));
        let counted = countdown.clone();
        let running = subject.start(
            CONSUMERS,
            Arc::new(move |k: &str| {
                work(k);
                counted.hit()
            }),
        );
        let adder = running.adder;
        let left = countdown.clone();
        let producer = tokio::spawn(async move {
            let start = Instant::now();
            for (i, k) in keys.into_iter().enumerate() {
                add(&*adder, i, k);
            }
            let left_at_last_add = left.left.load(Ordering::Relaxed);
            (start, Instant::now(), left_at_last_add)
        });
        let end = countdown.wait().await;
        let (start, last_add, left_at_last_add) = producer.await.expect("the producer");
        Counted {
            start,
            last_add,
            end,
            left_at_last_add,
        }
    })
}

/// Runs `one(subject)` for a warm-up and `cfg.runs` times, the subjects taking
/// turns, and records each sample `one` returns under `workload`.
fn repeat(
    cfg: &Config,
    report: &mut Report,
    workload: &str,
    subjects: &[&dyn Subject],
    one: impl FnMut(&dyn Subject, bool) -> Vec<(&'static str, f64)>,
) {
    repeat_with_go(cfg, report, workload, subjects, None, one)
}

/// [`repeat`], and after each round of the subjects' runs, a run of each Go
/// peer on `go`.
fn repeat_with_go(
    cfg: &Config,
    report: &mut Report,
    workload: &str,
    subjects: &[&dyn Subject],
    go: Option<go_peers::Run>,
    mut one: impl FnMut(&dyn Subject, bool) -> Vec<(&'static str, f64)>,
) {
    if !cfg.wants(workload) {
        return;
    }
    eprintln!("running {workload}...");
    for run in 0..=cfg.runs {
        let warm_up = run == 0;
        for &subject in subjects {
            if !cfg.runs_impl(&subject.name()) {
                continue;
            }
            let figures = one(subject, warm_up || cfg.quick);
            if cfg.verbose {
                eprintln!("  {workload} {} run {run}: {figures:?}", subject.name());
            }
            if !warm_up {
                for (figure, value) in figures {
                    report.push(&subject.name(), workload, figure, value);
                }
            }
        }
        if let Some(go) = go {
            cfg.go_peers.run(cfg, report, workload, go, run);
        }
    }
}

/// W1 fifo-drain (and its variants): 1 producer adds n distinct keys, 4
/// consumers. Figure: items/s.
fn w1(cfg: &Config, report: &mut Report, workload: &str, n: usize, subjects: &[&dyn Subject]) {
    let go = go_peers::Run { workload: "W1", n };
    repeat_with_go(cfg, report, workload, subjects, Some(go), |subject, _| {
        let run = run_counted(subject, keys(0..n), |a, _, k| a.add(k), |_| {});
        vec![
            ("items/s", run.items_per_sec(n)),
            ("left at last add", run.left_at_last_add as f64),
            ("adds/s beside consumers", run.adds_per_sec(n)),
            ("drain items/s after", run.drain_per_sec()),
        ]
    });
}

/// W2 hot-keys: 4 producers, 1,000 keys, a yield every 100 adds.
fn w2(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let per_producer = cfg.n(250_000);
    let adds = (per_producer * W2_PRODUCERS) as f64;
    let go = go_peers::Run {
        workload: "W2",
        n: per_producer * W2_PRODUCERS,
    };
    repeat_with_go(cfg, report, "W2", subjects, Some(go), |subject, verify| {
        let names = Arc::new(keys(0..W2_KEYS));
        // Verification: adds of each key so far, and the most a processing
        // of it saw; after the run both must agree for every key.
        let added: Arc<Vec<AtomicU64>> =
            Arc::new((0..W2_KEYS).map(|_| AtomicU64::new(0)).collect());
        let seen: Arc<Vec<AtomicU64>> = Arc::new((0..W2_KEYS).map(|_| AtomicU64::new(0)).collect());
        let rt = runtime();
        let (took, drain, processed) = rt.block_on(async {
            let (added2, seen2) = (added.clone(), seen.clone());
            let work: Work = if verify {
                Arc::new(move |k: &str| {
                    let i = key_index(k);
                    seen2[i].fetch_max(added2[i].load(Ordering::SeqCst), Ordering::SeqCst);
                })
            } else {
                Arc::new(|_: &str| {})
            };
            let running = subject.start(CONSUMERS, work);
            let producers: Vec<_> = (0..W2_PRODUCERS)
                .map(|p| {
                    let (adder, names, added) =
                        (running.adder.clone(), names.clone(), added.clone());
                    tokio::spawn(async move {
                        let start = Instant::now();
                        for j in 0..per_producer {
                            let i = (p * 7919 + j) % W2_KEYS;
                            if verify {
                                added[i].fetch_add(1, Ordering::SeqCst);
                            }
                            adder.add(names[i].clone());
                            if (j + 1) % 100 == 0 {
                                tokio::task::yield_now().await;
                            }
                        }
                        (start, Instant::now())
                    })
                })
                .collect();
            drop(running.adder);
            let mut start = None::<Instant>;
            let mut last_add = None::<Instant>;
            for p in producers {
                let (s, l) = p.await.expect("a producer");
                start = Some(start.map_or(s, |t| t.min(s)));
                last_add = Some(last_add.map_or(l, |t| t.max(l)));
            }
            let drained = running.drain.await;
            (
                drained.end - start.expect("producers"),
                drained
                    .end
                    .saturating_duration_since(last_add.expect("producers")),
                drained.processed,
            )
        });
        drop(rt);
        if verify {
            assert!(
                processed >= W2_KEYS as u64,
                "{}: W2 processed {processed} < 1000",
                subject.name()
            );
            for i in 0..W2_KEYS {
                let (a, s) = (
                    added[i].load(Ordering::SeqCst),
                    seen[i].load(Ordering::SeqCst),
                );
                assert_eq!(
                    a,
                    s,
                    "{}: W2 key {i} not processed after its last add",
                    subject.name()
                );
            }
        }
        vec![
            ("adds/s", adds / took.as_secs_f64()),
            ("processed/adds", processed as f64 / adds),
            // How long the queue took to empty once the adds were over.
            ("drain ms after last add", drain.as_secs_f64() * 1e3),
        ]
    });
}

/// W3 delayed: 1 producer adds N keys with a delay of `(i % 1000) * 100 us`.
fn w3(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let n = cfg.n(100_000);
    let delay = |i: usize| Duration::from_micros((i % 1000) as u64 * 100);
    repeat(cfg, report, "W3", subjects, |subject, _| {
        let base = Instant::now();
        let nanos = move |t: Instant| (t - base).as_nanos() as i64;
        let added_at: Arc<Vec<AtomicI64>> = Arc::new((0..n).map(|_| AtomicI64::new(0)).collect());
        let late: Arc<Vec<AtomicI64>> = Arc::new((0..n).map(|_| AtomicI64::new(0)).collect());
        let (added_at2, late2) = (added_at.clone(), late.clone());
        let Counted {
            start,
            last_add,
            end,
            ..
        } = run_counted(
            subject,
            keys(0..n),
            move |a, i, k| {
                added_at[i].store(nanos(Instant::now()), Ordering::Relaxed);
                a.add_after(k, delay(i));
            },
            move |k| {
                let i = key_index(k);
                let due = added_at2[i].load(Ordering::Relaxed) + delay(i).as_nanos() as i64;
                late2[i].store(nanos(Instant::now()) - due, Ordering::Relaxed);
            },
        );
        let mut late: Vec<i64> = late.iter().map(|l| l.load(Ordering::Relaxed)).collect();
        late.sort_unstable();
        let ms = |ns: i64| ns as f64 / 1e6;
        let pct = |p: f64| ms(late[((late.len() - 1) as f64 * p).round() as usize]);
        vec![
            ("total ms", (end - start).as_secs_f64() * 1e3),
            // The last key due is added last: the total is about this plus
            // the longest delay plus its lateness.
            ("adds ms", (last_add - start).as_secs_f64() * 1e3),
            ("lateness p50 ms", pct(0.50)),
            ("lateness p99 ms", pct(0.99)),
            ("lateness max ms", ms(*late.last().expect("keys"))),
        ]
    });
}

/// W4 priority: W1 with priorities `[-100, 0, 10][i % 3]`.
fn w4(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let n = cfg.n(1_000_000);
    let subjects: Vec<_> = subjects
        .iter()
        .copied()
        .filter(|s| s.priorities())
        .collect();
    repeat(cfg, report, "W4", &subjects, |subject, _| {
        let run = run_counted(
            subject,
            keys(0..n),
            |a, i, k| a.add_priority(k, W4_PRIORITIES[i % 3]),
            |_| {},
        );
        vec![("items/s", run.items_per_sec(n))]
    });
}

/// W5 fairness under flood: one consumer at 50 us an item; 100 keys at
/// priority -100 at the start, then distinct priority-0 keys at twice the
/// consumer's rate for the window.
fn w5(cfg: &Config, report: &mut Report, window: Duration, subjects: &[&dyn Subject]) {
    let rate = 2.0 / W5_ITEM.as_secs_f64(); // keys per second
    let high_n = (rate * window.as_secs_f64()) as usize + 1000;
    repeat(cfg, report, "W5", subjects, |subject, _| {
        let mut low = keys(0..W5_LOW);
        let high = keys(W5_LOW..W5_LOW + high_n);
        let base = Instant::now();
        let waits: Arc<Vec<AtomicI64>> =
            Arc::new((0..W5_LOW).map(|_| AtomicI64::new(-1)).collect());
        let added_at: Arc<Vec<AtomicI64>> =
            Arc::new((0..W5_LOW).map(|_| AtomicI64::new(0)).collect());
        let window_end = Arc::new(AtomicI64::new(i64::MAX));
        let high_out = Arc::new(AtomicU64::new(0));
        let rt = runtime();
        rt.block_on(async {
            let (waits2, added_at2, window_end2, high_out2) = (
                waits.clone(),
                added_at.clone(),
                window_end.clone(),
                high_out.clone(),
            );
            let work: Work = Arc::new(move |k: &str| {
                let out = Instant::now();
                let at = (out - base).as_nanos() as i64;
                if at > window_end2.load(Ordering::Relaxed) {
                    return; // past the window: drain quickly
                }
                let i = key_index(k);
                if i < W5_LOW {
                    waits2[i].store(at - added_at2[i].load(Ordering::Relaxed), Ordering::Relaxed);
                } else {
                    high_out2.fetch_add(1, Ordering::Relaxed);
                }
                while out.elapsed() < W5_ITEM {
                    std::hint::spin_loop();
                }
            });
            let running = subject.start(1, work);
            let adder = running.adder;
            let producer = tokio::spawn(async move {
                let start = Instant::now();
                window_end.store(
                    ((start - base) + window).as_nanos() as i64,
                    Ordering::Relaxed,
                );
                let mut high = high.into_iter();
                let mut sent = 0usize;
                loop {
                    let elapsed = start.elapsed();
                    if elapsed >= window {
                        break;
                    }
                    // The flood runs W5_AHEAD ahead of the clock, so that a
                    // late wake-up of this task (the timer works in whole
                    // milliseconds, and the machine may be busy) does not
                    // leave the consumer without high-priority keys.
                    let due = ((elapsed + W5_AHEAD).as_secs_f64() * rate) as usize;
                    for k in high.by_ref().take(due.saturating_sub(sent)) {
                        adder.add_priority(k, 0);
                        sent += 1;
                    }
                    if sent > 0 && !low.is_empty() {
                        // The low keys go in at the start, with the first
                        // batch of the flood.
                        for (i, k) in std::mem::take(&mut low).into_iter().enumerate() {
                            added_at[i].store(
                                (Instant::now() - base).as_nanos() as i64,
                                Ordering::Relaxed,
                            );
                            adder.add_priority(k, -100);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            producer.await.expect("the producer");
        });
        drop(rt);
        let waits: Vec<i64> = waits.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        let served = waits.iter().filter(|&&w| w >= 0).count();
        // A key never handed out waited at least the whole window.
        let longest = waits
            .iter()
            .map(|&w| if w < 0 { window.as_nanos() as i64 } else { w })
            .max()
            .unwrap_or(0);
        let high = high_out.load(Ordering::Relaxed) as f64;
        vec![
            ("low handed out (of 100)", served as f64),
            ("low max wait ms", longest as f64 / 1e6),
            ("high share %", 100.0 * high / (high + served as f64)),
        ]
    });
}

// ------------------------------------------------------------------ W7

/// The index among the other tenants' keys of `key` (`ns-{t}/obj-{j}` with
/// `t` from 1), or `None` for the flooding tenant's.
fn w7_other(key: &str) -> Option<usize> {
    let (ns, obj) = key.split_once('/')?;
    let t: usize = ns.strip_prefix("ns-")?.parse().ok()?;
    let j: usize = obj.strip_prefix("obj-")?.parse().ok()?;
    (t >= 1).then(|| (t - 1) * W7_PER_TENANT + j)
}

/// W7 tenant flood: one consumer at 50 us an item; `ns-0` adds N keys, then
/// each of 9 other tenants adds 10. Figures for the other tenants' keys: the
/// most hand-outs from a key's add to its own hand-out (its own counted),
/// and the longest wait.
fn w7(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let flood = cfg.n(100_000);
    let others = W7_TENANTS * W7_PER_TENANT;
    repeat(cfg, report, "W7", subjects, |subject, _| {
        let flood_keys: Vec<String> = (0..flood).map(|i| format!("ns-0/obj-{i}")).collect();
        let other_keys: Vec<String> = (1..=W7_TENANTS)
            .flat_map(|t| (0..W7_PER_TENANT).map(move |j| format!("ns-{t}/obj-{j}")))
            .collect();
        let atomics = |n: usize| -> Arc<Vec<AtomicI64>> {
            Arc::new((0..n).map(|_| AtomicI64::new(-1)).collect())
        };
        let (add_seq, out_seq, add_at, out_at) = (
            atomics(others),
            atomics(others),
            atomics(others),
            atomics(others),
        );
        let handed = Arc::new(AtomicI64::new(0));
        let left = Arc::new(AtomicUsize::new(others));
        let all_out = Arc::new(Notify::new());
        let base = Instant::now();
        let nanos = move |t: Instant| (t - base).as_nanos() as i64;
        let rt = runtime();
        rt.block_on(async {
            let work: Work = {
                let (handed, left, all_out) = (handed.clone(), left.clone(), all_out.clone());
                let (out_seq, out_at) = (out_seq.clone(), out_at.clone());
                Arc::new(move |k: &str| {
                    let out = Instant::now();
                    let seq = handed.fetch_add(1, Ordering::SeqCst) + 1;
                    if left.load(Ordering::SeqCst) == 0 {
                        return; // every measured key is out: drain quickly
                    }
                    if let Some(i) = w7_other(k) {
                        out_seq[i].store(seq, Ordering::SeqCst);
                        out_at[i].store(nanos(out), Ordering::SeqCst);
                        if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                            all_out.notify_one();
                        }
                    }
                    while out.elapsed() < W7_ITEM {
                        std::hint::spin_loop();
                    }
                })
            };
            let running = subject.start(1, work);
            let adder = running.adder;
            let (handed, add_seq, add_at) = (handed.clone(), add_seq.clone(), add_at.clone());
            let producer = tokio::spawn(async move {
                for k in flood_keys {
                    adder.add(k);
                }
                for (i, k) in other_keys.into_iter().enumerate() {
                    // Read before the add: a hand-out during the add counts.
                    add_seq[i].store(handed.load(Ordering::SeqCst), Ordering::SeqCst);
                    add_at[i].store(nanos(Instant::now()), Ordering::SeqCst);
                    adder.add(k);
                }
            });
            producer.await.expect("the producer");
            all_out.notified().await;
        });
        drop(rt);
        let load = |v: &Arc<Vec<AtomicI64>>| -> Vec<i64> {
            v.iter().map(|a| a.load(Ordering::SeqCst)).collect()
        };
        let (add_seq, out_seq, add_at, out_at) =
            (load(&add_seq), load(&out_seq), load(&add_at), load(&out_at));
        let most_hand_outs = (0..others)
            .map(|i| out_seq[i] - add_seq[i])
            .max()
            .unwrap_or(0);
        let longest = (0..others)
            .map(|i| out_at[i] - add_at[i])
            .max()
            .unwrap_or(0);
        vec![
            ("others max hand-outs", most_hand_outs as f64),
            ("others max wait ms", longest as f64 / 1e6),
        ]
    });
}

// ------------------------------------------------------------------ W6

/// The W6 measurements, each made in a fresh process (allocator reuse across
/// runs would blur resident memory): the variant's name, and what it adds.
const W6_VARIANTS: [(&str, &str); 6] = [
    ("tokio-workqueue", "W6"),
    ("tokio-workqueue[fair=namespace]", "W6"),
    ("tokio-workqueue", "W6-delayed"),
    ("mpsc", "W6"),
    ("kube-runtime", "W6"),
    ("kube-runtime", "W6-delayed"),
];

fn w6(cfg: &Config, report: &mut Report) {
    for (imp, workload) in W6_VARIANTS {
        if !cfg.wants(workload) || !cfg.runs_impl(imp) {
            continue;
        }
        eprintln!("running {workload} for {imp}...");
        for run in 0..=cfg.runs {
            let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
                .env("WORKLOADS_W6", format!("{imp}/{workload}"))
                .env("WORKLOADS_W6_N", cfg.n(1_000_000).to_string())
                .output()
                .expect("a W6 child");
            assert!(
                out.status.success(),
                "W6 child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let bytes: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("a W6 child prints bytes per key");
            if run > 0 {
                report.push(imp, workload, "bytes/key", bytes);
            }
        }
    }
}

/// Resident memory of this process, in bytes. `smaps_rollup` walks the page
/// tables; `VmRSS` in `/proc/self/status` lags, as threads batch their
/// counter updates.
fn rss() -> f64 {
    let rollup =
        std::fs::read_to_string("/proc/self/smaps_rollup").expect("/proc/self/smaps_rollup");
    let kb: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an Rss line");
    kb * 1024.0
}

/// In a W6 child: adds `n` keys to one implementation with no consumer and
/// prints the resident memory this took per key.
fn w6_child(variant: &str, n: usize) {
    let rt = runtime();
    let per_key = rt.block_on(async {
        let delay = if variant.ends_with("delayed") {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        };
        // Keys are moved out with `drain`, which keeps the vector's buffer:
        // freeing it would hand its pages back and hide as many.
        let mut keys = keys(0..n);
        let measure = |before: f64| (rss() - before) / n as f64;
        match variant.split('/').next() {
            Some("tokio-workqueue") => {
                let before = rss();
                let queue = WorkQueue::<String>::new();
                for k in keys.drain(..) {
                    queue.add_after(k, delay).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget(queue);
                per_key
            }
            Some("tokio-workqueue[fair=namespace]") => {
                let before = rss();
                let queue = WorkQueue::builder().ordering(fair_by_namespace()).build();
                for k in keys.drain(..) {
                    queue.add_after(k, delay).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget(queue);
                per_key
            }
            Some("mpsc") => {
                let before = rss();
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                for k in keys.drain(..) {
                    tx.send(k).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget((tx, rx));
                per_key
            }
            Some("kube-runtime") => {
                // The requests are built first (a request holds its key), and
                // fed from an iterator that never ends, so the scheduler
                // keeps all it was given.
                let run_at = Instant::now() + delay;
                let requests: Vec<_> = keys
                    .drain(..)
                    .map(|message| ScheduleRequest { message, run_at })
                    .collect();
                let before = rss();
                let stream = futures::stream::iter(requests).chain(futures::stream::pending());
                let mut scheduler = Box::pin(scheduler(stream));
                // As a runner with every worker busy: `hold` takes the
                // requests in and moves the due ones to its pending set.
                for _ in 0..2 {
                    poll_fn(|cx| {
                        let _ = scheduler.as_mut().hold().poll_next_unpin(cx);
                        Poll::Ready(())
                    })
                    .await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let per_key = measure(before);
                std::mem::forget(scheduler);
                per_key
            }
            _ => panic!("unknown W6 variant {variant}"),
        }
    });
    println!("{per_key}");
    std::process::exit(0);
}

// ---------------------------------------------------------------- main

fn verdicts(report: &Report, cfg: &Config) {
    let m = |imp: &str, w: &str, f: &str| report.median(imp, w, f);
    let metrics = Crate {
        metrics: true,
        bound: None,
        ordering: Order::Default,
    }
    .name();
    let bound_on = Crate {
        metrics: false,
        bound: Some(Some(W5_BOUND)),
        ordering: Order::Default,
    }
    .name();
    let bound_off = Crate {
        metrics: false,
        bound: Some(None),
        ordering: Order::Default,
    }
    .name();
    let c = "tokio-workqueue";
    let mut lines: Vec<(String, Option<bool>)> = Vec::new();
    let mut ratio = |what: &str, a: Option<f64>, b: Option<f64>, want: f64, at_least: bool| {
        if let (Some(a), Some(b)) = (a, b) {
            let r = a / b;
            let ok = if at_least { r >= want } else { r <= want };
            let op = if at_least { ">=" } else { "<=" };
            // Three decimals, so that a ratio just past its target (1.055
            // against 1.05) does not print as equal to it.
            lines.push((format!("{what}: {r:.3}x (target {op} {want}x)"), Some(ok)));
        }
    };
    // (what, numerator, denominator as (impl, workload, figure), target,
    // whether the ratio must be at least the target or at most).
    let targets = [
        (
            "W1 items/s vs mpsc",
            (c, "W1", "items/s"),
            ("mpsc", "W1", "items/s"),
            0.6,
            true,
        ),
        (
            "W1 items/s vs kube-runtime",
            (c, "W1", "items/s"),
            ("kube-runtime", "W1", "items/s"),
            4.0,
            true,
        ),
        (
            "W1 items/s at N vs at N/10 (W1-100k)",
            (c, "W1", "items/s"),
            (c, "W1-100k", "items/s"),
            0.8,
            true,
        ),
        (
            "W2 adds/s vs mpsc",
            (c, "W2", "adds/s"),
            ("mpsc", "W2", "adds/s"),
            1.0,
            true,
        ),
        (
            "W3 total time vs mpsc",
            (c, "W3", "total ms"),
            ("mpsc", "W3", "total ms"),
            1.05,
            false,
        ),
        (
            "W4 items/s vs own W1",
            (c, "W4", "items/s"),
            (c, "W1", "items/s"),
            0.8,
            true,
        ),
        (
            "W1 items/s, metrics on vs off",
            (&metrics, "W1", "items/s"),
            (c, "W1", "items/s"),
            0.8,
            true,
        ),
    ];
    for (what, (ia, wa, fa), (ib, wb, fb), want, at_least) in targets {
        ratio(what, m(ia, wa, fa), m(ib, wb, fb), want, at_least);
    }
    if let (Some(a), Some(b)) = (
        m(c, "W3", "lateness p99 ms"),
        m("mpsc", "W3", "lateness p99 ms"),
    ) {
        lines.push((
            format!("W3 p99 lateness: {a:.2} ms vs mpsc {b:.2} ms (target <= mpsc + 2 ms)"),
            Some(a <= b + 2.0),
        ));
    }
    if let (Some(served), Some(wait), Some(share)) = (
        m(&bound_on, "W5", "low handed out (of 100)"),
        m(&bound_on, "W5", "low max wait ms"),
        m(&bound_on, "W5", "high share %"),
    ) {
        let limit = (W5_BOUND + W5_ITEM).as_secs_f64() * 1e3;
        lines.push((
            format!(
                "W5 bound 100 ms: {served:.0}/100 low keys out, longest wait {wait:.2} ms \
                 (target <= {limit:.2}), high share {share:.2}% (target >= 90%)"
            ),
            Some(served >= 100.0 && wait <= limit && share >= 90.0),
        ));
    }
    if let Some(served) = m(&bound_off, "W5", "low handed out (of 100)") {
        lines.push((
            format!("W5 bound off: {served:.0}/100 low keys out (starvation shown if < 100)"),
            Some(served < 100.0),
        ));
    }
    if let Some(b) = m(c, "W6", "bytes/key") {
        lines.push((
            format!("W6 bytes per queued key: {b:.1} (target <= 64)"),
            Some(b <= 64.0),
        ));
    }
    let fair = Crate {
        ordering: Order::FairByNamespace,
        ..CRATE
    }
    .name();
    let fifo = Crate {
        ordering: Order::Fifo,
        ..CRATE
    }
    .name();
    if let (Some(f), Some(b)) = (m(&fair, "W6", "bytes/key"), m(c, "W6", "bytes/key")) {
        lines.push((
            format!(
                "W6 fair share by namespace: {f:.1} bytes per queued key, {:+.1} vs the default \
                 (target <= +16)",
                f - b
            ),
            Some(f - b <= 16.0),
        ));
    }
    if let (Some(h), Some(ms)) = (
        m(&fair, "W7", "others max hand-outs"),
        m(&fair, "W7", "others max wait ms"),
    ) {
        let fifo_figures = match (
            m(&fifo, "W7", "others max hand-outs"),
            m(&fifo, "W7", "others max wait ms"),
        ) {
            (Some(fh), Some(fms)) => {
                format!("; FIFO beside it: {fh:.0} hand-outs, {fms:.1} ms (the flood blocks them)")
            }
            _ => String::new(),
        };
        lines.push((
            format!(
                "W7 fair share by namespace: other tenants' keys waited at most {h:.0} hand-outs \
                 (target <= {W7_TARGET:.0}), {ms:.2} ms{fifo_figures}"
            ),
            Some(h <= W7_TARGET),
        ));
    }
    c1::verdicts(report, &mut lines);
    lines.extend(cfg.go_peers.verdicts(report, &metrics, metrics_hook::KIND));
    if lines.is_empty() {
        return;
    }
    println!("\nTargets (ratios of medians from this run):");
    if cfg.quick {
        println!("  (quick mode: small N and few runs, so these say little)");
    }
    for (line, ok) in lines {
        let mark = match ok {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "    ",
        };
        println!("  {mark}  {line}");
    }
}

fn main() {
    if let Ok(variant) = std::env::var("WORKLOADS_W6") {
        let n = std::env::var("WORKLOADS_W6_N")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000_000);
        return w6_child(&variant, n);
    }
    let cfg = Config::from_args();
    let started = std::time::Instant::now();
    let mut report = Report::default();
    let metrics = Crate {
        metrics: true,
        bound: None,
        ordering: Order::Default,
    };
    let all: [&dyn Subject; 3] = [&CRATE, &Mpsc, &Kube];
    let with_metrics: [&dyn Subject; 4] = [&CRATE, &metrics, &Mpsc, &Kube];
    let n = cfg.n(1_000_000);
    w1(&cfg, &mut report, "W1", n, &with_metrics);
    w1(&cfg, &mut report, "W1-100k", n / 10, &all);
    w2(&cfg, &mut report, &all);
    w3(&cfg, &mut report, &all);
    w4(&cfg, &mut report, &all);
    let window = if cfg.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    let bounded = Crate {
        metrics: false,
        bound: Some(Some(W5_BOUND)),
        ordering: Order::Default,
    };
    let strict = Crate {
        metrics: false,
        bound: Some(None),
        ordering: Order::Default,
    };
    w5(&cfg, &mut report, window, &[&bounded, &strict]);
    let fair = Crate {
        ordering: Order::FairByNamespace,
        ..CRATE
    };
    let fifo = Crate {
        ordering: Order::Fifo,
        ..CRATE
    };
    w7(&cfg, &mut report, &[&fair, &fifo]);
    w6(&cfg, &mut report);
    c1::c1(&cfg, &mut report);

    report.print_table();
    verdicts(&report, &cfg);
    match report.write_json() {
        Ok(path) => println!("\nrows written to {}", path.display()),
        Err(e) => eprintln!("could not write target/workloads.json: {e}"),
    }
    println!(
        "{} mode, median of {} runs after a warm-up, 2-worker runtime; took {:.1} s",
        if cfg.quick { "quick" } else { "full" },
        cfg.runs,
        started.elapsed().as_secs_f64()
    );
    if cfg.go_peers.failed() {
        eprintln!("the Go peers failed (see above)");
        std::process::exit(1);
    }
}
