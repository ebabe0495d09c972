//! The `Controller`'s failure handling end to end against every API server
//! `TEST_CLUSTER` selects (the local one and a real kube-apiserver), on
//! short real durations: per-key backoff that resets on
//! success, a panicking reconcile, a reconcile timeout, graceful shutdown
//! with work in flight, and the metrics families after the run. The same
//! rules are pinned exactly on paused time in `tests/controller/`; this
//! one shows them with a real watcher and store.

use crate::eventually;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_client::{Api, ResourceExt};
use kube_local_apiserver::Verb;
use kube_runtime::controller::Error;
use kube_runtime::watcher;
use kube_test_cluster::{TestNamespace, for_each_backend};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::time::Instant;
use tokio_workqueue::{ExponentialBackoff, WorkQueue};
use tokio_workqueue_kube::metrics::{ControllerMetrics, PrometheusMetrics};
use tokio_workqueue_kube::{Action, Controller, ControllerError};

const LIMIT: Duration = Duration::from_secs(20);
const BASE: Duration = Duration::from_millis(40);

#[derive(Debug)]
struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed on purpose")
    }
}

impl std::error::Error for Failed {}

/// Start times by name, and whether a reconcile is running for each.
#[derive(Default)]
struct Record {
    starts: Mutex<HashMap<String, Vec<Instant>>>,
    slow_finished: Mutex<bool>,
}

impl Record {
    fn starts(&self, name: &str) -> Vec<Instant> {
        self.starts
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

async fn reconcile(cm: Arc<ConfigMap>, record: Arc<Record>) -> Result<Action, Failed> {
    let name = cm.name_any();
    let attempt = {
        let mut starts = record.starts.lock().unwrap();
        let v = starts.entry(name.clone()).or_default();
        v.push(Instant::now());
        v.len()
    };
    let wants_failure = cm
        .data
        .as_ref()
        .and_then(|d| d.get("fail"))
        .map(String::as_str);
    match (name.as_str(), attempt) {
        // Fails three times, then succeeds; fails again after a change.
        ("flaky", 1..=3) => Err(Failed),
        ("flaky", _) if wants_failure == Some("once") && attempt == 5 => Err(Failed),
        ("panicky", 1) => panic!("reconcile panicked on purpose"),
        ("slow", 1) => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Action::await_change())
        }
        ("in-flight", _) => {
            // Shorter than the timeout, long enough to be in flight when
            // the shutdown comes.
            tokio::time::sleep(Duration::from_millis(150)).await;
            *record.slow_finished.lock().unwrap() = true;
            Ok(Action::await_change())
        }
        _ => Ok(Action::await_change()),
    }
}

fn error_policy(_: Arc<ConfigMap>, _: &Failed, _: Arc<Record>) -> Action {
    // Shorter than the backoff: the per-key backoff must win.
    Action::requeue(Duration::from_millis(1))
}

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(BTreeMap::from([("v".to_string(), "1".to_string())]));
    cm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_panics_timeouts_shutdown_and_metrics_on_an_apiserver() {
    for_each_backend("failures", |ns| async move { failures(ns).await }).await;
}

async fn failures(ns: TestNamespace) {
    // On the local server (shared by the tests of this binary) the test
    // talks through an endpoint of its own, whose request counts are its
    // own requests only.
    let endpoint = ns.local().map(|server| server.endpoint());
    let cms: Api<ConfigMap> = match &endpoint {
        Some(endpoint) => Api::namespaced(endpoint.client(), ns.name()),
        None => ns.api(),
    };
    for name in ["flaky", "panicky", "slow", "steady"] {
        cms.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    let queue_metrics = PrometheusMetrics::new();
    let controller_metrics = ControllerMetrics::new();
    let mut registry = Registry::default();
    queue_metrics.register(&mut registry);
    controller_metrics.register(&mut registry);

    let record = Arc::new(Record::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let results = Arc::new(Mutex::new(Vec::new()));
    let sink = results.clone();
    let run = tokio::spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .queue(
                WorkQueue::builder()
                    .name("failures")
                    .metrics(queue_metrics)
                    .rate_limiter(ExponentialBackoff::new(BASE, Duration::from_secs(5)).unwrap()),
            )
            .metrics(controller_metrics)
            .concurrency(3)
            .reconcile_timeout(Duration::from_millis(200))
            .graceful_shutdown_on(async {
                let _ = stopped.await;
            })
            .run(reconcile, error_policy, record.clone())
            .for_each(move |r| {
                sink.lock().unwrap().push(r);
                async {}
            }),
    );

    // Backoff: three failures, each retry at least twice as late.
    eventually(LIMIT, "flaky's success", || {
        record.starts("flaky").len() >= 4
    })
    .await;
    let flaky = record.starts("flaky");
    for (i, want) in [BASE, BASE * 2, BASE * 4].iter().enumerate() {
        let gap = flaky[i + 1] - flaky[i];
        assert!(gap >= *want, "retry {i} after {gap:?}, backoff {want:?}");
    }
    // A success forgets the failures: the next failure backs off from the
    // base again, not from 8x.
    cms.patch(
        "flaky",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"fail": "once"}})),
    )
    .await
    .unwrap();
    eventually(LIMIT, "flaky's retry after the change", || {
        record.starts("flaky").len() >= 6
    })
    .await;
    let flaky = record.starts("flaky");
    let gap = flaky[5] - flaky[4];
    assert!(
        // Below 8x with room for a late timer on a loaded machine.
        gap >= BASE && gap < BASE * 6,
        "after a success the backoff starts again from {BASE:?}, not {:?}: {gap:?}",
        BASE * 8
    );

    // A panic and a timeout: errors for those keys only, retried.
    eventually(LIMIT, "panicky retried", || {
        record.starts("panicky").len() >= 2
    })
    .await;
    eventually(LIMIT, "slow retried", || record.starts("slow").len() >= 2).await;
    assert_eq!(record.starts("steady").len(), 1, "the others went on once");

    // Graceful shutdown with work in flight: it finishes, then the stream ends.
    cms.create(&PostParams::default(), &cm("in-flight"))
        .await
        .unwrap();
    eventually(LIMIT, "in-flight started", || {
        !record.starts("in-flight").is_empty()
    })
    .await;
    stop.send(()).unwrap();
    tokio::time::timeout(LIMIT, run).await.unwrap().unwrap();
    assert!(
        *record.slow_finished.lock().unwrap(),
        "the reconcile in flight finished"
    );

    let results = results.lock().unwrap();
    let failed = results
        .iter()
        .filter(|r| matches!(r, Err(Error::ReconcilerFailed(..))))
        .count();
    assert_eq!(
        failed, 4,
        "flaky failed three times, then once after the change"
    );
    assert!(results.iter().any(|r| matches!(
        r,
        Err(Error::QueueError(ControllerError::ReconcilePanicked { .. }))
    )));
    assert!(results.iter().any(|r| matches!(
        r,
        Err(Error::QueueError(ControllerError::ReconcileTimedOut { .. }))
    )));
    // The store answered every reconcile: not one GET (counted on the
    // local server, on this test's own endpoint).
    if let Some(endpoint) = &endpoint {
        assert_eq!(endpoint.requests().of(Verb::Get, "configmaps"), 0);
    }

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"controller_runtime_reconcile_errors_total{controller="failures"} 6"#,
        r#"controller_runtime_reconcile_panics_total{controller="failures"} 1"#,
        r#"controller_runtime_max_concurrent_reconciles{controller="failures"} 3"#,
        r#"controller_runtime_active_workers{controller="failures"} 0"#,
        r#"workqueue_retries_total{name="failures"} 6"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // The queue's gauges (depth, unfinished work, longest running) are read
    // from the live queue at each scrape and went away with it; the
    // counters and histograms stay.
    for family in [
        "controller_runtime_reconcile_total{",
        "controller_runtime_reconcile_time_seconds_bucket{",
        "workqueue_adds_total{",
        "workqueue_queue_duration_seconds_bucket{",
        "workqueue_work_duration_seconds_bucket{",
    ] {
        assert!(text.contains(family), "missing {family} in\n{text}");
    }
}
