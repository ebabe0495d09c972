//! Prometheus metrics on [`prometheus-client`](prometheus_client): the
//! families Go controllers export, labelled by queue `name`.
//!
//! A [`PrometheusMetrics`] is a cheap handle to one set of metric families.
//! Register it once in a [`Registry`], then give a clone of it to each queue's
//! [`Builder::metrics`](crate::Builder::metrics):
//!
//! The [`Registry`] and encoder must come from the same `prometheus-client`
//! as the queue's metrics. The crate re-exports it as
//! [`prometheus_client`]: use that path, or depend
//! on `prometheus-client` yourself at the version this crate uses (0.25).
//!
//! ```
//! use tokio_workqueue::WorkQueue;
//! use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
//! use tokio_workqueue::metrics::prometheus::prometheus_client::encoding::text::encode;
//! use tokio_workqueue::metrics::prometheus::prometheus_client::registry::Registry;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let metrics = PrometheusMetrics::new();
//! let mut registry = Registry::default();
//! metrics.register(&mut registry);
//!
//! let queue = WorkQueue::builder().name("pods").metrics(metrics.clone()).build();
//! queue.add("default/web").unwrap();
//! queue.add("default/web").unwrap(); // de-duplicated: one add
//! queue.add_with("default/db", tokio_workqueue::AddOpts::new().priority(-100)).unwrap();
//!
//! let mut text = String::new();
//! encode(&mut text, &registry).unwrap();
//! assert!(text.contains(r#"workqueue_depth{name="pods",priority="0"} 1"#));
//! assert!(text.contains(r#"workqueue_depth{name="pods",priority="-100"} 1"#));
//! assert!(text.contains(r#"workqueue_adds_total{name="pods"} 2"#));
//! # }
//! ```
//!
//! # Families
//!
//! Names, types, help texts and meanings are client-go's (as registered by
//! k8s.io/component-base and controller-runtime), so dashboards and alerts
//! written for Go controllers apply. Each series has a `name` label, the
//! queue's [`Builder::name`](crate::Builder::name) (empty if it has none:
//! unlike client-go, an unnamed queue given metrics still reports them).
//!
//! | family | type | meaning |
//! | --- | --- | --- |
//! | `workqueue_depth{name, priority}` | gauge | keys ready to be handed out, by priority level |
//! | `workqueue_adds_total` | counter | keys that joined the set waiting to be processed |
//! | `workqueue_queue_duration_seconds` | histogram | how long a key was ready before it was handed out |
//! | `workqueue_work_duration_seconds` | histogram | how long a lease ran, from hand-out to its end |
//! | `workqueue_unfinished_work_seconds` | gauge | the sum of how long each lease in flight has run |
//! | `workqueue_longest_running_processor_seconds` | gauge | how long the oldest lease in flight has run |
//! | `workqueue_retries_total` | counter | accepted rate-limited adds and requeues |
//! | `workqueue_delayed_items` | gauge | keys waiting on a delay or a backoff (the name proposed for client-go in kubernetes#135543) |
//!
//! The two histograms share [`DEFAULT_BUCKETS`] unless built with
//! [`PrometheusMetrics::with_buckets`].
//!
//! Precisely:
//!
//! - **Depth** counts ready keys only: not keys waiting on a delay, not
//!   leased keys, and not keys re-added while leased until their lease ends.
//!   It is read from the queue when scraped, so it can never drift or go
//!   negative. It is split by `priority` as controller-runtime's priority
//!   queue does: `sum by (name) (workqueue_depth)` is client-go's depth. A
//!   queue's `priority="0"` series is always there, and a level once seen
//!   stays, reading 0 when empty, so series do not flicker. As in
//!   controller-runtime, at most [`MAX_PRIORITY_LABELS`] (25) priority values
//!   are labelled per name: once a name's queues have used more, its whole
//!   depth is reported as one series, `priority="exceeded_cardinality_limit"`,
//!   for as long as any queue of that name lives.
//! - **Adds** count a key each time it joins the keys waiting to be
//!   processed: it becomes ready, or is re-added while leased. An add that
//!   merges into a key already pending is not counted (de-duplication), and a
//!   delayed add counts when its delay ends, so a key added with a delay and
//!   then added now counts once.
//! - **Queue duration** runs from the moment a key became ready (its add, the
//!   end of its delay, or the end of the lease it was re-added during) to the
//!   hand-out. Delays and rate-limit waits are not part of it.
//! - **Work duration** runs from the hand-out to the end of the lease
//!   ([`WorkItem::done`](crate::WorkItem::done), a requeue, or the drop).
//! - **Unfinished work** and **longest running processor** are computed from
//!   the lease start times when scraped: no background task updates them, so
//!   there is nothing to run and nothing to stop.
//! - **Retries** count each accepted
//!   [`add_rate_limited`](crate::WorkQueue::add_rate_limited),
//!   [`AddOpts::rate_limited`](crate::AddOpts::rate_limited) add and
//!   [`requeue_rate_limited`](crate::WorkItem::requeue_rate_limited).
//!
//! Differences from client-go, all deliberate: client-go counts a key re-added
//! while it is processed in its depth at once and starts its queue time at
//! that add, although no consumer can take it yet; here it counts once it is
//! ready. client-go refreshes the two running-time gauges every 500 ms from a
//! goroutine per queue; here they are exact at each scrape.
//!
//! # Several queues, and queues that go away
//!
//! One [`PrometheusMetrics`] serves any number of queues: give each its own
//! clone. Queues that share a name share their series: the counters and
//! histograms add up, depth and unfinished work are summed, and the longest
//! running processor is the longest of them (this is what several Go workers
//! of one queue look like). A [`Partitioned`](crate::Partitioned) queue
//! gives each partition its own clone through
//! [`configure`](crate::PartitionedBuilder::configure), and partition `i`
//! reports as `{name}-{i}`:
//!
//! ```
//! # use tokio_workqueue::Partitioned;
//! # use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
//! let metrics = PrometheusMetrics::new();
//! let m = metrics.clone();
//! let queue = Partitioned::builder(4, |key: &String| key.len())
//!     .name("pods")
//!     .configure(move |_, builder| builder.metrics(m.clone()))
//!     .build()
//!     .unwrap();
//! # drop(queue);
//! ```
//!
//! When every queue of a name is dropped, its three gauges disappear from the
//! output at the next scrape (Prometheus marks them stale) and its counters
//! and histograms stay, as counters should. A queue that is shut down but not
//! dropped keeps reporting, so a drain can be watched to the end.
//!
//! # Cost
//!
//! A queue built without metrics pays nothing: it keeps no times and reads no
//! clock for them. With this hook:
//!
//! - each key made ready and each hand-out reads tokio's clock once, and each
//!   lease end once more; the queue keeps a ready time per key slot (16
//!   bytes; a starvation bound adds two links to find the oldest ready
//!   key) and a start time per lease in flight, in a small table of its
//!   own that a scrape reads;
//! - an add or a retry is one relaxed atomic increment; a hand-out and a lease
//!   end each observe a histogram whose buckets are atomic counters, sharded
//!   by thread on cache lines of their own, so workers on different threads
//!   neither wait for each other there nor pull one line back and forth
//!   (`prometheus-client`'s own `Histogram` takes a mutex per observation).
//!   Two threads observing flat out into one histogram took 31 to 114 ns an
//!   observation unsharded and 11 ns sharded, on the machine below.
//!
//! Measured on the project's 2-core machine (release build, one task on a
//! current-thread runtime filling a queue with 1,000,000 distinct keys, then
//! taking and finishing each), taking and finishing a key cost about 163 ns
//! without metrics, 207 ns with a hook that records nothing (the queue
//! keeping its times and reading the clock) and 288 ns with this hook. A
//! clock read costs 31 ns in a tight loop there, and more inside the queue
//! (its profile samples gather just after the ordering barrier the vDSO
//! puts before reading the CPU's timestamp counter). In the benchmark's W1,
//! where consumers on two threads drain a backlog, that per-key cost is
//! what metrics cost: they drain at about half the rate (see
//! `PERFORMANCE.md` in the crate's sources for the measurements).
//!
//! A scrape locks each queue once, briefly, and walks its leases in flight.

/// The `prometheus-client` crate the metrics are built on, re-exported so
/// that registering and encoding them needs no dependency of your own (and
/// no matching of versions).
pub use prometheus_client;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::{Registry, Unit};

use super::{MetricsHook, Probe, Snapshot};

mod histogram;
use histogram::AtomicHistogram;

/// The buckets of both duration histograms, in seconds: 10 ns to 1000 s, a
/// factor of 10 apart.
///
/// These are controller-runtime's (`ExponentialBuckets(10e-9, 10, 12)`). They
/// hold every bucket of client-go's classic set (10 ns to 10 s, the one
/// k8s.io/component-base long registered), so queries written for either keep
/// working, plus 100 s and 1000 s for slow reconciles and long queues.
/// Newer component-base releases use 1 µs to 1000 s; pass those to
/// [`PrometheusMetrics::with_buckets`] to match them exactly.
pub const DEFAULT_BUCKETS: [f64; 12] = [
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0,
];

const HELP_DEPTH: &str = "Current depth of workqueue by workqueue and priority";
const HELP_ADDS: &str = "Total number of adds handled by workqueue";
const HELP_QUEUE_DURATION: &str =
    "How long in seconds an item stays in workqueue before being requested.";
const HELP_WORK_DURATION: &str = "How long in seconds processing an item from workqueue takes.";
const HELP_UNFINISHED: &str = "How many seconds of work has been done that is in progress and \
     hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce \
     the number of stuck threads by observing the rate at which this increases.";
const HELP_LONGEST: &str =
    "How many seconds has the longest running processor for workqueue been running.";
const HELP_RETRIES: &str = "Total number of retries handled by workqueue";
const HELP_DELAYED: &str = "Current number of items waiting on a delay or a retry backoff";

/// Prometheus metrics for work queues: a [`MetricsHook`] that records into
/// `prometheus-client` families, registered with [`register`](Self::register).
///
/// Cloning is cheap and gives a handle to the same families that is not yet
/// bound to a queue: give each queue its own clone. See the
/// [module docs](self) for the families and their meanings.
///
/// # Panics
///
/// A queue's events do not say which queue they come from, so one handle can
/// only serve queues of one name. Building a queue with a handle that is
/// already bound to a queue of another name (by sharing it in an `Arc`)
/// panics; clone the handle instead. Sharing one handle between queues of the
/// same name is fine: their series add up either way.
pub struct PrometheusMetrics {
    queues: Arc<Queues>,
    /// The series of the queue this handle was given to.
    bound: OnceLock<Bound>,
}

/// Every series, by queue name.
struct Queues {
    buckets: Box<[f64]>,
    by_name: Mutex<BTreeMap<Arc<str>, Named>>,
}

/// The series of one queue name, and the queues of that name.
struct Named {
    series: Arc<Series>,
    probes: Vec<Probe>,
    /// Priority levels seen non-empty while a queue of this name lived.
    priorities: BTreeSet<i32>,
}

/// The series updated on the hot path.
struct Series {
    adds: Counter,
    retries: Counter,
    queue_duration: AtomicHistogram,
    work_duration: AtomicHistogram,
}

struct Bound {
    name: Arc<str>,
    series: Arc<Series>,
}

impl PrometheusMetrics {
    /// Metrics with the [`DEFAULT_BUCKETS`].
    pub fn new() -> Self {
        Self::with_buckets(DEFAULT_BUCKETS)
    }

    /// Metrics whose two duration histograms use `buckets` (upper bounds in
    /// seconds). They are sorted and de-duplicated; infinite and NaN bounds
    /// are dropped, as the `+Inf` bucket is always there.
    ///
    /// ```
    /// use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
    ///
    /// // component-base's newer set: 1 µs to 1000 s.
    /// let metrics = PrometheusMetrics::with_buckets([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0]);
    /// # drop(metrics);
    /// ```
    pub fn with_buckets(buckets: impl IntoIterator<Item = f64>) -> Self {
        let mut buckets: Vec<f64> = buckets.into_iter().filter(|b| b.is_finite()).collect();
        buckets.sort_by(f64::total_cmp);
        buckets.dedup();
        PrometheusMetrics {
            queues: Arc::new(Queues {
                buckets: buckets.into(),
                by_name: Mutex::new(BTreeMap::new()),
            }),
            bound: OnceLock::new(),
        }
    }

    /// Adds these metrics to `registry`, as one collector that encodes all
    /// seven families at each scrape. Register them once: each registration
    /// encodes every family again.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(WorkqueueCollector(self.queues.clone())));
    }

    /// The upper bounds of the duration histograms' buckets, in seconds
    /// (`+Inf` left out).
    pub fn buckets(&self) -> &[f64] {
        &self.queues.buckets
    }

    /// The name of the queue this handle was given to, if it was.
    pub fn queue_name(&self) -> Option<&str> {
        self.bound.get().map(|b| &*b.name)
    }

    fn series(&self) -> Option<&Series> {
        self.bound.get().map(|b| &*b.series)
    }
}

impl Default for PrometheusMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for PrometheusMetrics {
    /// A handle to the same families, not bound to any queue yet.
    fn clone(&self) -> Self {
        PrometheusMetrics {
            queues: self.queues.clone(),
            bound: OnceLock::new(),
        }
    }
}

impl fmt::Debug for PrometheusMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusMetrics")
            .field("queue_name", &self.queue_name())
            .field("buckets", &self.queues.buckets)
            .field("queue_names", &self.queues.by_name.lock().len())
            .finish()
    }
}

impl MetricsHook for PrometheusMetrics {
    fn bind(&self, name: &str, probe: Probe) {
        if let Some(first) = self.queue_name()
            && first != name
        {
            panic!(
                "one PrometheusMetrics handle was given to queue {first:?} and to queue {name:?}: \
                 give each queue its own clone"
            );
        }
        let buckets = &self.queues.buckets;
        let mut by_name = self.queues.by_name.lock();
        let named = by_name.entry(Arc::from(name)).or_insert_with(|| Named {
            series: Arc::new(Series::new(buckets)),
            probes: Vec::new(),
            priorities: BTreeSet::new(),
        });
        self.bound.get_or_init(|| Bound {
            name: Arc::from(name),
            series: named.series.clone(),
        });
        if named.probes.iter().all(|p| !p.is_alive()) {
            // The first live queue of this name: forget the levels of the last.
            named.priorities.clear();
        }
        named.probes.retain(Probe::is_alive);
        named.probes.push(probe);
    }

    fn add(&self) {
        if let Some(s) = self.series() {
            s.adds.inc();
        }
    }

    fn retry(&self) {
        if let Some(s) = self.series() {
            s.retries.inc();
        }
    }

    fn handed_out(&self, waited: Duration) {
        if let Some(s) = self.series() {
            s.queue_duration.observe(waited);
        }
    }

    fn done(&self, worked: Duration) {
        if let Some(s) = self.series() {
            s.work_duration.observe(worked);
        }
    }
}

impl Probe {
    fn is_alive(&self) -> bool {
        self.source.strong_count() > 0
    }
}

impl Series {
    fn new(buckets: &[f64]) -> Self {
        Series {
            adds: Counter::default(),
            retries: Counter::default(),
            queue_duration: AtomicHistogram::new(buckets),
            work_duration: AtomicHistogram::new(buckets),
        }
    }
}

/// One queue name at one scrape.
struct Row {
    name: Arc<str>,
    series: Arc<Series>,
    /// `None` once every queue of this name is gone.
    gauges: Option<Gauges>,
}

/// How many distinct `priority` values `workqueue_depth` labels per queue
/// name before it reports the whole depth under
/// `priority="exceeded_cardinality_limit"` (controller-runtime's limit).
pub const MAX_PRIORITY_LABELS: usize = 25;

/// The label of the one depth series of a name past the limit.
const EXCEEDED_CARDINALITY: &str = "exceeded_cardinality_limit";

#[derive(Default)]
struct Gauges {
    /// Ready keys by priority, highest first, with 0 for seen empty levels.
    depth: Vec<(i32, u64)>,
    /// Set when more than [`MAX_PRIORITY_LABELS`] priorities were seen: the
    /// whole depth, reported under one label instead of `depth`.
    exceeded: Option<u64>,
    unfinished: Duration,
    longest: Duration,
    /// Keys waiting on a delay or backoff.
    delayed: u64,
}

impl Queues {
    /// Reads every live queue and drops the probes of dropped ones.
    fn gather(&self) -> Vec<Row> {
        let mut by_name = self.by_name.lock();
        let mut rows = Vec::with_capacity(by_name.len());
        for (name, named) in by_name.iter_mut() {
            let mut live: Vec<Snapshot> = Vec::with_capacity(named.probes.len());
            named.probes.retain(|p| match p.snapshot() {
                Some(s) => {
                    live.push(s);
                    true
                }
                None => false,
            });
            let gauges = if live.is_empty() {
                named.priorities.clear();
                None
            } else {
                Some(aggregate(&live, &mut named.priorities))
            };
            rows.push(Row {
                name: name.clone(),
                series: named.series.clone(),
                gauges,
            });
        }
        rows
    }
}

/// Sums the snapshots of the live queues of one name.
fn aggregate(live: &[Snapshot], seen: &mut BTreeSet<i32>) -> Gauges {
    seen.insert(0);
    let mut depth: BTreeMap<i32, u64> = BTreeMap::new();
    let mut g = Gauges::default();
    for s in live {
        for &(p, n) in &s.ready_by_priority {
            seen.insert(p);
            *depth.entry(p).or_default() += n as u64;
        }
        g.unfinished += s.unfinished_work;
        g.delayed += s.waiting as u64;
        g.longest = g.longest.max(s.longest_running);
    }
    if seen.len() > MAX_PRIORITY_LABELS {
        g.exceeded = Some(depth.values().sum());
        return g;
    }
    g.depth = seen
        .iter()
        .rev()
        .map(|p| (*p, depth.get(p).copied().unwrap_or(0)))
        .collect();
    g
}

/// Encodes every family at each scrape.
struct WorkqueueCollector(Arc<Queues>);

impl fmt::Debug for WorkqueueCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkqueueCollector").finish_non_exhaustive()
    }
}

impl Collector for WorkqueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let rows = self.0.gather();
        let live: Vec<(&str, &Gauges)> = rows
            .iter()
            .filter_map(|r| Some((&*r.name, r.gauges.as_ref()?)))
            .collect();

        if !live.is_empty() {
            let mut m = encoder.encode_descriptor(
                "workqueue_depth",
                HELP_DEPTH,
                None,
                MetricType::Gauge,
            )?;
            for &(name, g) in &live {
                if let Some(n) = g.exceeded {
                    let labels = [("name", name), ("priority", EXCEEDED_CARDINALITY)];
                    m.encode_family(&labels)?.encode_gauge(&n)?;
                }
                for &(p, n) in &g.depth {
                    let priority = p.to_string();
                    let labels = [("name", name), ("priority", &*priority)];
                    m.encode_family(&labels)?.encode_gauge(&n)?;
                }
            }
        }
        encode_each(
            &mut encoder,
            "workqueue_adds",
            HELP_ADDS,
            None,
            &rows,
            |s| &s.adds,
        )?;
        encode_each(
            &mut encoder,
            "workqueue_queue_duration",
            HELP_QUEUE_DURATION,
            Some(&Unit::Seconds),
            &rows,
            |s| &s.queue_duration,
        )?;
        encode_each(
            &mut encoder,
            "workqueue_work_duration",
            HELP_WORK_DURATION,
            Some(&Unit::Seconds),
            &rows,
            |s| &s.work_duration,
        )?;
        if !live.is_empty() {
            encode_seconds(
                &mut encoder,
                "workqueue_unfinished_work",
                HELP_UNFINISHED,
                &live,
                |g| g.unfinished,
            )?;
            encode_seconds(
                &mut encoder,
                "workqueue_longest_running_processor",
                HELP_LONGEST,
                &live,
                |g| g.longest,
            )?;
        }
        encode_each(
            &mut encoder,
            "workqueue_retries",
            HELP_RETRIES,
            None,
            &rows,
            |s| &s.retries,
        )?;
        if !live.is_empty() {
            let mut m = encoder.encode_descriptor(
                "workqueue_delayed_items",
                HELP_DELAYED,
                None,
                MetricType::Gauge,
            )?;
            for &(name, g) in &live {
                m.encode_family(&[("name", name)])?
                    .encode_gauge(&g.delayed)?;
            }
        }
        Ok(())
    }
}

/// Encodes one family with a series per queue name, from each name's
/// [`Series`]. Nothing is written when there are no names yet.
fn encode_each<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: &[Row],
    metric: impl Fn(&Series) -> &M,
) -> Result<(), fmt::Error> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let metric_type = metric(&first.series).metric_type();
    let mut m = encoder.encode_descriptor(name, help, unit, metric_type)?;
    for row in rows {
        metric(&row.series).encode(m.encode_family(&[("name", &*row.name)])?)?;
    }
    Ok(())
}

/// Encodes one gauge family in seconds, a series per live queue name.
fn encode_seconds(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    live: &[(&str, &Gauges)],
    value: impl Fn(&Gauges) -> Duration,
) -> Result<(), fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?;
    for &(queue, g) in live {
        m.encode_family(&[("name", queue)])?
            .encode_gauge(&value(g).as_secs_f64())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WorkQueue;
    use prometheus_client::encoding::text::encode;

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    fn queue(name: &str, metrics: &PrometheusMetrics) -> WorkQueue<u32> {
        WorkQueue::builder()
            .name(name)
            .metrics(metrics.clone())
            .build()
    }

    #[test]
    fn default_buckets_are_controller_runtimes_and_hold_client_gos() {
        assert_eq!(DEFAULT_BUCKETS.len(), 12);
        assert_eq!(PrometheusMetrics::new().buckets(), &DEFAULT_BUCKETS);
        let classic: Vec<f64> = (0..10).map(|i| 10e-9 * 10f64.powi(i)).collect();
        for (want, have) in classic.iter().zip(DEFAULT_BUCKETS) {
            assert!((want - have).abs() <= have * 1e-12, "{want} vs {have}");
        }
        assert_eq!(DEFAULT_BUCKETS[11], 1000.0);
    }

    #[test]
    fn custom_buckets_are_sorted_deduplicated_and_finite() {
        let m = PrometheusMetrics::with_buckets([5.0, 1.0, f64::INFINITY, 1.0, f64::NAN, 0.5]);
        assert_eq!(m.buckets(), &[0.5, 1.0, 5.0]);
    }

    #[test]
    fn nothing_is_encoded_before_a_queue_binds() {
        let m = PrometheusMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        assert_eq!(scrape(&registry), "# EOF\n");
    }

    #[test]
    fn an_unbound_handle_ignores_events() {
        let m = PrometheusMetrics::new();
        m.add();
        m.retry();
        m.handed_out(Duration::from_secs(1));
        m.done(Duration::from_secs(1));
        assert_eq!(m.queue_name(), None);
        assert!(m.queues.by_name.lock().is_empty());
    }

    #[test]
    fn clones_share_families_but_bind_separately() {
        let m = PrometheusMetrics::new();
        let _a = queue("a", &m);
        let _b = queue("b", &m);
        assert_eq!(m.queue_name(), None, "the original stays unbound");
        let names: Vec<String> = m
            .queues
            .by_name
            .lock()
            .keys()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(names, ["a", "b"]);
        let bound = m.clone();
        let _c: WorkQueue<u32> = WorkQueue::builder()
            .name("c")
            .metrics(Arc::new(bound))
            .build();
        let debug = format!("{m:?}");
        assert!(debug.contains("queue_names: 3"), "{debug}");
    }

    #[test]
    fn one_handle_can_serve_queues_of_one_name() {
        let m = Arc::new(PrometheusMetrics::new());
        let q1: WorkQueue<u32> = WorkQueue::builder().name("same").metrics(m.clone()).build();
        let q2: WorkQueue<u32> = WorkQueue::builder().name("same").metrics(m.clone()).build();
        q1.add(1).unwrap();
        q2.add(1).unwrap();
        q2.add(2).unwrap();
        assert_eq!(m.queue_name(), Some("same"));
        let by_name = m.queues.by_name.lock();
        let named = &by_name["same"];
        assert_eq!(named.probes.len(), 2);
        assert_eq!(named.series.adds.get(), 3);
    }

    #[test]
    #[should_panic(expected = "give each queue its own clone")]
    fn one_handle_for_two_names_panics() {
        let m = Arc::new(PrometheusMetrics::new());
        let _a: WorkQueue<u32> = WorkQueue::builder().name("a").metrics(m.clone()).build();
        let _b: WorkQueue<u32> = WorkQueue::builder().name("b").metrics(m.clone()).build();
    }

    #[test]
    fn aggregate_sums_depth_and_unfinished_and_keeps_the_longest() {
        let mut seen = BTreeSet::from([5]);
        let a = Snapshot {
            ready_by_priority: vec![(10, 1), (0, 2)],
            unfinished_work: Duration::from_secs(3),
            longest_running: Duration::from_secs(2),
            ..Snapshot::default()
        };
        let b = Snapshot {
            ready_by_priority: vec![(0, 1), (-100, 4)],
            unfinished_work: Duration::from_secs(1),
            longest_running: Duration::from_secs(1),
            ..Snapshot::default()
        };
        let g = aggregate(&[a, b], &mut seen);
        assert_eq!(g.depth, [(10, 1), (5, 0), (0, 3), (-100, 4)]);
        assert_eq!(g.unfinished, Duration::from_secs(4));
        assert_eq!(g.longest, Duration::from_secs(2));
        assert_eq!(seen, BTreeSet::from([-100, 0, 5, 10]));
    }

    #[test]
    fn a_fresh_queue_reports_zero_depth_at_priority_zero() {
        let m = PrometheusMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let _q = queue("fresh", &m);
        let text = scrape(&registry);
        assert!(
            text.contains("workqueue_depth{name=\"fresh\",priority=\"0\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("workqueue_adds_total{name=\"fresh\"} 0\n"));
        assert!(text.contains("workqueue_retries_total{name=\"fresh\"} 0\n"));
        assert!(text.contains("workqueue_delayed_items{name=\"fresh\"} 0\n"));
        assert!(text.contains("workqueue_unfinished_work_seconds{name=\"fresh\"} 0.0\n"));
    }

    #[test]
    fn past_25_priorities_the_depth_is_one_series_as_in_controller_runtime() {
        let m = PrometheusMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let q = queue("many", &m);
        // 0 and 24 more: exactly the limit, every level labelled.
        for p in 1..25 {
            q.add_with(p as u32, crate::AddOpts::new().priority(p))
                .unwrap();
        }
        let text = scrape(&registry);
        assert!(
            text.contains("workqueue_depth{name=\"many\",priority=\"24\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains(EXCEEDED_CARDINALITY), "{text}");
        // One more level: the whole depth under one label, from now on.
        q.add_with(100, crate::AddOpts::new().priority(-5)).unwrap();
        let text = scrape(&registry);
        let depth: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("workqueue_depth{"))
            .collect();
        assert_eq!(
            depth,
            ["workqueue_depth{name=\"many\",priority=\"exceeded_cardinality_limit\"} 25"],
            "{text}"
        );
    }

    #[test]
    fn families_come_in_client_go_order_with_units() {
        let m = PrometheusMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let _q = queue("q", &m);
        let text = scrape(&registry);
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        assert_eq!(
            types,
            [
                "# TYPE workqueue_depth gauge",
                "# TYPE workqueue_adds counter",
                "# TYPE workqueue_queue_duration_seconds histogram",
                "# TYPE workqueue_work_duration_seconds histogram",
                "# TYPE workqueue_unfinished_work_seconds gauge",
                "# TYPE workqueue_longest_running_processor_seconds gauge",
                "# TYPE workqueue_retries counter",
                "# TYPE workqueue_delayed_items gauge",
            ]
        );
        assert!(text.contains("# UNIT workqueue_queue_duration_seconds seconds\n"));
        assert!(text.contains(&format!("# HELP workqueue_adds {HELP_ADDS}\n")));
    }

    #[test]
    fn a_registry_prefix_applies() {
        let m = PrometheusMetrics::new();
        let mut registry = Registry::with_prefix("app");
        m.register(&mut registry);
        let _q = queue("q", &m);
        let text = scrape(&registry);
        assert!(
            text.contains("app_workqueue_adds_total{name=\"q\"} 0\n"),
            "{text}"
        );
    }
}
