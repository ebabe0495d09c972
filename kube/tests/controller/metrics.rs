//! With `prometheus`: after a run, controller-runtime's controller families
//! count every reconcile by result, errors, panics and reconcile times, and
//! show the concurrency and the workers in use; the queue's `workqueue_*`
//! families come from the metrics given to the queue builder.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio_workqueue::{ExponentialBackoff, WorkQueue};
use tokio_workqueue_kube::Action;
use tokio_workqueue_kube::metrics::{ControllerMetrics, PrometheusMetrics};

use crate::common::*;

/// Every sample of the registry: `name{labels}` to value.
fn samples(registry: &Registry) -> BTreeMap<String, f64> {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn get(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(series)
        .unwrap_or_else(|| panic!("no {series} in {samples:#?}"))
}

/// Runs a controller named `name` over keys that succeed, ask for a
/// requeue, fail once, panic once and time out once, then shuts it down;
/// returns the samples 10 ms in and at the end.
async fn run_once(
    name: &str,
    partitions: Option<usize>,
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let mut registry = Registry::default();
    let controller_metrics = ControllerMetrics::new();
    controller_metrics.register(&mut registry);
    let queue_metrics = PrometheusMetrics::new();
    queue_metrics.register(&mut registry);

    let record = Record::new();
    let (feed, controller) = fed();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut controller = controller
        .concurrency(3)
        .reconcile_timeout(ms(50))
        .queue(
            WorkQueue::builder()
                .name(name)
                .rate_limiter(ExponentialBackoff::new(ms(100), Duration::from_secs(10)).unwrap())
                .metrics(queue_metrics.clone()),
        )
        .metrics(controller_metrics.clone())
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        });
    if let Some(n) = partitions {
        controller = controller.partition_by(n, |key| key.name.len());
    }
    let stream = controller.run(
        record.reconciler_with(
            |name, attempt| {
                if name == "t1" && attempt == 1 {
                    ms(100)
                } else {
                    ms(20)
                }
            },
            |name, attempt| match (name, attempt) {
                ("r1", 1) => Ok(Action::requeue(Duration::from_secs(1))),
                ("e1", 1) => fail("once"),
                ("p1", 1) => panic!("once"),
                _ => Ok(Action::await_change()),
            },
        ),
        policy(Action::requeue(ms(1))),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(["s1", "s2", "r1", "e1", "p1", "t1"].map(|n| cm(n, "1")));
    advance(ms(10)).await;
    let early = samples(&registry);
    advance(Duration::from_secs(60)).await;
    stop.send(()).unwrap();
    let reports = run.finish().await;
    assert_eq!(record.len(), 10, "{reports:?}");
    (early, samples(&registry))
}

#[tokio::test(start_paused = true)]
async fn controller_runtime_and_workqueue_families_after_a_run() {
    let (early, s) = run_once("cms", None).await;
    let c = r#"controller="cms""#;
    let q = r#"name="cms""#;

    // 10 ms in: three reconciles running, three listed keys waiting.
    let at = |series: String| get(&early, &series);
    assert_eq!(at(format!("controller_runtime_active_workers{{{c}}}")), 3.0);
    assert_eq!(
        at(format!(
            "controller_runtime_max_concurrent_reconciles{{{c}}}"
        )),
        3.0
    );
    assert_eq!(at(format!("workqueue_depth{{{q},priority=\"-100\"}}")), 3.0);
    assert_eq!(at(format!("workqueue_depth{{{q},priority=\"0\"}}")), 0.0);
    assert!((at(format!("workqueue_unfinished_work_seconds{{{q}}}")) - 0.03).abs() < 1e-9);
    assert_eq!(
        at(format!(
            "controller_runtime_reconcile_total{{{c},result=\"success\"}}"
        )),
        0.0,
        "series exist before the first reconcile ends"
    );

    // s1, s2 and the second rounds of r1, e1, p1, t1; r1's first; e1's
    // failure, p1's panic and t1's timeout.
    let total = |result: &str| {
        get(
            &s,
            &format!("controller_runtime_reconcile_total{{{c},result=\"{result}\"}}"),
        )
    };
    assert_eq!(total("success"), 6.0);
    assert_eq!(total("requeue_after"), 1.0);
    assert_eq!(total("error"), 3.0);
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_reconcile_errors_total{{{c}}}")
        ),
        3.0
    );
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_reconcile_panics_total{{{c}}}")
        ),
        1.0
    );
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_reconcile_timeouts_total{{{c}}}")
        ),
        1.0,
        "t1's first run timed out"
    );
    // Every reconcile worked 20 ms (paused time), except t1's first, cut at
    // its 50 ms timeout.
    let time = |suffix: &str| {
        get(
            &s,
            &format!("controller_runtime_reconcile_time_seconds_{suffix}"),
        )
    };
    assert_eq!(time(&format!("count{{{c}}}")), 10.0);
    assert!((time(&format!("sum{{{c}}}")) - (9.0 * 0.02 + 0.05)).abs() < 1e-9);
    assert_eq!(time(&format!("bucket{{le=\"0.01\",{c}}}")), 0.0);
    assert_eq!(time(&format!("bucket{{le=\"0.025\",{c}}}")), 9.0);
    assert_eq!(time(&format!("bucket{{le=\"0.05\",{c}}}")), 10.0);
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_max_concurrent_reconciles{{{c}}}")
        ),
        3.0
    );
    assert_eq!(
        get(&s, &format!("controller_runtime_active_workers{{{c}}}")),
        0.0
    );

    // The queue's own families, under the same name. (Its gauges went with
    // the queue when the run ended.)
    // Six listed, r1's requeue, three retries.
    assert_eq!(get(&s, &format!("workqueue_adds_total{{{q}}}")), 10.0);
    assert_eq!(get(&s, &format!("workqueue_retries_total{{{q}}}")), 3.0);
    assert_eq!(
        get(&s, &format!("workqueue_work_duration_seconds_count{{{q}}}")),
        10.0
    );
    assert_eq!(
        get(
            &s,
            &format!("workqueue_queue_duration_seconds_count{{{q}}}")
        ),
        10.0
    );
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_controller_reports_its_queue_metrics_too() {
    let (_, s) = run_once("parts", Some(2)).await;
    let c = r#"controller="parts""#;
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_reconcile_total{{{c},result=\"success\"}}")
        ),
        6.0
    );
    // One reconcile at a time per partition.
    assert_eq!(
        get(
            &s,
            &format!("controller_runtime_max_concurrent_reconciles{{{c}}}")
        ),
        2.0
    );
    // The partitions' queue series, under the controller's name.
    assert_eq!(get(&s, r#"workqueue_adds_total{name="parts"}"#), 10.0);
    assert_eq!(get(&s, r#"workqueue_retries_total{name="parts"}"#), 3.0);
}
