//! controller-runtime's controller metrics, on `prometheus-client`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;

/// controller-runtime's reconcile-time buckets, in seconds.
pub const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

struct Families {
    total: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    panics: Family<Labels, Counter>,
    time: Family<Labels, Histogram, fn() -> Histogram>,
    max_concurrent: Family<Labels, Gauge>,
    active: Family<Labels, Gauge>,
}

/// The metrics controller-runtime records for each controller, under its
/// names, labelled by `controller` (the controller's queue name):
///
/// | family | type | meaning |
/// | --- | --- | --- |
/// | `controller_runtime_reconcile_total{controller, result}` | counter | reconciles by result: `success`, `error`, `requeue_after` |
/// | `controller_runtime_reconcile_errors_total` | counter | reconciles that failed (errors, panics, timeouts) |
/// | `controller_runtime_reconcile_panics_total` | counter | reconciles that panicked |
/// | `controller_runtime_reconcile_time_seconds` | histogram | how long each reconcile ran ([`RECONCILE_TIME_BUCKETS`]) |
/// | `controller_runtime_max_concurrent_reconciles` | gauge | how many reconciles may run at once |
/// | `controller_runtime_active_workers` | gauge | how many reconciles are running |
///
/// Give a clone to each controller's
/// [`Controller::metrics`](crate::Controller::metrics) and register
/// it once. The queue's `workqueue_*` families come from a
/// [`PrometheusMetrics`](tokio_workqueue::metrics::prometheus::PrometheusMetrics)
/// given to the controller's queue builder.
///
/// ```
/// use prometheus_client::registry::Registry;
/// use tokio_workqueue_kube::metrics::ControllerMetrics;
///
/// let metrics = ControllerMetrics::new();
/// let mut registry = Registry::default();
/// metrics.register(&mut registry);
/// ```
#[derive(Clone)]
pub struct ControllerMetrics {
    families: Arc<Families>,
}

impl fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerMetrics").finish_non_exhaustive()
    }
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Empty families, not registered anywhere yet.
    pub fn new() -> Self {
        ControllerMetrics {
            families: Arc::new(Families {
                total: Family::default(),
                errors: Family::default(),
                panics: Family::default(),
                time: Family::new_with_constructor(reconcile_time_histogram),
                max_concurrent: Family::default(),
                active: Family::default(),
            }),
        }
    }

    /// Adds the families to `registry`. Register them once.
    pub fn register(&self, registry: &mut Registry) {
        let f = &self.families;
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            f.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            f.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            f.panics.clone(),
        );
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Length of time per reconciliation per controller",
            Unit::Seconds,
            f.time.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            f.max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            f.active.clone(),
        );
    }

    pub(crate) fn recorder(self, controller: &str) -> Recorder {
        let labels = vec![("controller", controller.to_string())];
        let with_result = |result: &str| {
            let mut l = labels.clone();
            l.push(("result", result.to_string()));
            l
        };
        // Each series is created up front, so a fresh controller reports
        // zeros rather than nothing (as controller-runtime does), and kept:
        // a reconcile then records without looking its labels up.
        let f = &self.families;
        let total = |result| f.total.get_or_create(&with_result(result)).clone();
        Recorder {
            total: [total("success"), total("error"), total("requeue_after")],
            errors: f.errors.get_or_create(&labels).clone(),
            panics: f.panics.get_or_create(&labels).clone(),
            time: f.time.get_or_create(&labels).clone(),
            max_concurrent: f.max_concurrent.get_or_create(&labels).clone(),
            active: f.active.get_or_create(&labels).clone(),
        }
    }
}

/// How a reconcile ended, for `controller_runtime_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Result {
    Success,
    Error,
    RequeueAfter,
    Panic,
}

/// One controller's series.
pub(crate) struct Recorder {
    /// `reconcile_total` by result: success, error, requeue_after.
    total: [Counter; 3],
    errors: Counter,
    panics: Counter,
    time: Histogram,
    max_concurrent: Gauge,
    active: Gauge,
}

impl Recorder {
    pub(crate) fn max_concurrent(&self, n: usize) {
        self.max_concurrent
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn active_workers(&self, n: usize) {
        self.active.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn finished(&self, result: Result, took: Duration) {
        let index = match result {
            Result::Success => 0,
            Result::Error | Result::Panic => 1,
            Result::RequeueAfter => 2,
        };
        self.total[index].inc();
        if matches!(result, Result::Error | Result::Panic) {
            self.errors.inc();
        }
        if result == Result::Panic {
            self.panics.inc();
        }
        self.time.observe(took.as_secs_f64());
    }
}
