//! Prometheus metrics of a work queue: a few workers reconcile keys, one key
//! fails twice and is retried with backoff, and the metrics are printed in
//! the OpenMetrics text format, once while work is in flight and once at the
//! end.
//!
//! Run with `cargo run --example metrics --features prometheus`.

use std::time::Duration;

use futures::StreamExt;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
use tokio_workqueue::{ExponentialBackoff, Lane, WorkQueue};

#[tokio::main]
async fn main() {
    let metrics = PrometheusMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);

    let queue: WorkQueue<String> = WorkQueue::builder()
        .name("pods")
        .rate_limiter(
            ExponentialBackoff::new(Duration::from_millis(10), Duration::from_secs(1))
                .expect("valid backoff"),
        )
        .metrics(metrics.clone())
        .build();

    // An initial list in the slow lane, then fresh events, some repeated.
    for i in 0..8 {
        queue
            .add_to_lane(format!("default/pod-{i}"), Lane::Slow)
            .unwrap();
    }
    for i in [1, 2, 2, 3, 3, 3] {
        queue.add(format!("default/pod-{i}")).unwrap();
    }
    queue.add("default/flaky".to_string()).unwrap();

    let (flaky_done, mut flaky_rx) = tokio::sync::watch::channel(false);
    let workers = tokio::spawn(queue.clone().for_each_concurrent(2, move |item| {
        let flaky_done = flaky_done.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let flaky = item.key() == "default/flaky";
            if flaky && item.num_requeues() < 2 {
                item.requeue_rate_limited().expect("queue is running");
            } else {
                item.forget();
                if flaky {
                    flaky_done.send_replace(true);
                }
            }
        }
    }));

    tokio::time::sleep(Duration::from_millis(30)).await;
    println!("--- while two leases are in flight (histogram buckets left out):");
    for line in scrape(&registry).lines() {
        if !line.contains("_bucket{") {
            println!("{line}");
        }
    }

    // Stop once the flaky key went through; the drain waits for the rest.
    flaky_rx.wait_for(|done| *done).await.expect("workers run");
    queue.shutdown_with_drain().await;
    workers.await.expect("workers ran");
    println!("--- after the drain:");
    print!("{}", scrape(&registry));
}

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).expect("writing to a String");
    text
}
