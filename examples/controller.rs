//! A small controller loop on a work queue: four workers reconcile pod keys,
//! bursts of events for the same pod collapse into one reconcile, and a pod
//! whose reconcile fails is retried with backoff until it succeeds.
//!
//! Run with `cargo run --example controller`; add `--features prometheus` to
//! also print the Prometheus metrics the queue gathered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_workqueue::{ExponentialBackoff, Lane, WorkQueue};

#[tokio::main]
async fn main() {
    #[cfg(feature = "prometheus")]
    let (metrics, registry) = {
        let metrics = tokio_workqueue::metrics::prometheus::PrometheusMetrics::new();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        (metrics, registry)
    };
    let builder = WorkQueue::builder();
    #[cfg(feature = "prometheus")]
    let builder = builder.metrics(metrics.clone());
    let queue: WorkQueue<String> = builder
        .name("pods")
        .rate_limiter(
            ExponentialBackoff::new(Duration::from_millis(20), Duration::from_secs(1))
                .expect("valid backoff"),
        )
        .build();
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let runs: Arc<Mutex<HashMap<String, u32>>> = Default::default();

    // A watcher's initial list goes in the slow lane; then a burst of change
    // events, many for the same few pods.
    let mut events = 0;
    for i in 0..6 {
        queue
            .add_to_lane(format!("default/pod-{i}"), Lane::Slow)
            .unwrap();
        events += 1;
    }
    for _burst in 0..5 {
        for i in [1, 2, 3] {
            queue.add(format!("default/pod-{i}")).unwrap();
            events += 1;
        }
    }
    queue.add("kube-system/flaky".to_string()).unwrap();
    events += 1;
    println!(
        "{events} events queued as {} keys: de-duplicated before any worker ran",
        queue.len()
    );

    let workers = {
        let (log, runs) = (log.clone(), runs.clone());
        tokio::spawn(queue.clone().for_each_concurrent(4, move |item| {
            let (log, runs) = (log.clone(), runs.clone());
            async move {
                let key = item.key().clone();
                let attempt = {
                    let mut runs = runs.lock().unwrap();
                    let n = runs.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                // Pretend to talk to the API server.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let line = if key.ends_with("flaky") && attempt < 4 {
                    let line = format!(
                        "{:>6.1?}  {key:<20} priority {:>4}  failed (attempt {attempt}), retry with backoff",
                        start.elapsed(),
                        item.priority()
                    );
                    item.requeue_rate_limited().expect("queue is running");
                    line
                } else {
                    let line = format!(
                        "{:>6.1?}  {key:<20} priority {:>4}  reconciled (attempt {attempt})",
                        start.elapsed(),
                        item.priority()
                    );
                    item.forget();
                    line
                };
                log.lock().unwrap().push(line);
            }
        }))
    };

    // Wait for the flaky pod to succeed, then drain and stop.
    loop {
        let done = runs.lock().unwrap().get("kube-system/flaky").copied() == Some(4);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    queue.shutdown_with_drain().await;
    workers.await.expect("workers ran");

    for line in log.lock().unwrap().iter() {
        println!("{line}");
    }
    let runs = runs.lock().unwrap();
    let total: u32 = runs.values().sum();
    println!(
        "{events} events, {} keys, {total} reconciles ({} retries of the flaky pod), done in {:.0?}",
        runs.len(),
        runs["kube-system/flaky"] - 1,
        start.elapsed()
    );

    #[cfg(feature = "prometheus")]
    {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        println!("\nPrometheus metrics gathered:\n{text}");
    }
}
