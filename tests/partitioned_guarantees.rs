//! Inside a partition every queue guarantee holds: de-duplication, stingy
//! leases, delays, priorities and lanes, rate limits, shutdown and drain.

mod partitioned_common;

use std::time::Duration;

use partitioned_common::{Log, run_logged, secs};
use tokio_workqueue::{AddError, AddOpts, ExponentialBackoff, Lane, Partitioned};

/// Keys are (partition, name).
type Key = (usize, &'static str);

fn queue(n: usize) -> Partitioned<Key> {
    Partitioned::builder(n, |k: &Key| k.0)
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(60)).unwrap())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_key_added_many_times_before_it_runs_is_processed_once() {
    let q = queue(2);
    for _ in 0..3 {
        q.add((0, "a")).unwrap();
        q.add((1, "b")).unwrap();
    }
    assert_eq!(q.depths(), [1, 1]);
    let log = Log::new();
    run_logged(&q, &log, |_| secs(1))
        .shutdown_with_drain()
        .await
        .unwrap();
    assert_eq!(log.order(0), [(0, "a")]);
    assert_eq!(log.order(1), [(1, "b")]);
}

#[tokio::test(start_paused = true)]
async fn a_key_added_while_it_runs_comes_back_once_after_its_run() {
    let q = queue(2);
    q.add((0, "a")).unwrap();
    let log = Log::new();
    let handle = run_logged(&q, &log, |_| secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    q.add((0, "a")).unwrap();
    q.add((0, "a")).unwrap();
    assert_eq!(q.depths(), [0, 0], "leased: remembered, not ready");
    tokio::time::sleep(secs(3)).await;
    handle.shutdown_with_drain().await.unwrap();
    assert_eq!(log.starts_of((0, "a")), [secs(0), secs(1)]);
    assert_eq!(log.max_active_per_partition(), 1);
}

#[tokio::test(start_paused = true)]
async fn delayed_adds_wait_in_their_partition() {
    let q = queue(2);
    q.add_after((0, "late"), secs(5)).unwrap();
    q.add_with((1, "later"), AddOpts::default().after(secs(7)))
        .unwrap();
    q.add((0, "now")).unwrap();
    q.add_after((0, "zero"), Duration::ZERO).unwrap();
    assert_eq!(q.depths(), [2, 0], "delayed keys are not ready yet");
    let log = Log::new();
    let handle = run_logged(&q, &log, |_| secs(1));
    tokio::time::sleep(secs(8)).await;
    handle.shutdown_with_drain().await.unwrap();
    assert_eq!(log.order(0), [(0, "now"), (0, "zero"), (0, "late")]);
    assert_eq!(log.starts_of((0, "late")), [secs(5)]);
    assert_eq!(log.starts_of((1, "later")), [secs(7)]);
}

#[tokio::test(start_paused = true)]
async fn priorities_and_lanes_order_the_keys_of_a_partition() {
    let q = queue(2);
    q.add_to_lane((0, "bulk"), Lane::Slow).unwrap();
    q.add((0, "fresh")).unwrap();
    q.add_with((0, "urgent"), AddOpts::default().priority(10))
        .unwrap();
    q.add_to_lane((1, "other"), Lane::Slow).unwrap();
    let log = Log::new();
    run_logged(&q, &log, |_| secs(1))
        .shutdown_with_drain()
        .await
        .unwrap();
    assert_eq!(log.order(0), [(0, "urgent"), (0, "fresh"), (0, "bulk")]);
    // A slow lane in one partition does not wait for another's fast lane.
    assert_eq!(log.starts_of((1, "other")), [secs(0)]);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_adds_and_requeues_back_off_per_key() {
    let q = queue(2);
    q.add_rate_limited((0, "r")).unwrap();
    assert_eq!(q.num_requeues(&(0, "r")), 1);
    let log = Log::new();
    let log2 = log.clone();
    // Fails twice (rate-limited requeue), then succeeds (forget).
    let handle = q.run(move |item| {
        let log = log2.clone();
        async move {
            let run = log.start(*item, item.0);
            drop(run);
            if item.num_requeues() < 3 {
                item.requeue_rate_limited().unwrap();
            } else {
                item.forget();
            }
        }
    });
    tokio::time::sleep(secs(10)).await;
    // 1 s for the add, then 2 s and 4 s for the two requeues.
    assert_eq!(log.starts_of((0, "r")), [secs(1), secs(3), secs(7)]);
    assert_eq!(q.num_requeues(&(0, "r")), 0, "forgotten after success");

    q.add_rate_limited((1, "s")).unwrap();
    q.forget(&(1, "s"));
    assert_eq!(q.num_requeues(&(1, "s")), 0);
    handle.shutdown_with_drain().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_drain_processes_every_ready_key_then_the_tasks_end() {
    let q = queue(3);
    for (p, name) in [(0, "a"), (0, "b"), (1, "c"), (2, "d"), (2, "e"), (2, "f")] {
        q.add((p, name)).unwrap();
    }
    q.add_after((1, "delayed"), secs(60)).unwrap();
    let log = Log::new();
    let handle = run_logged(&q, &log, |_| secs(1));
    let t0 = tokio::time::Instant::now();
    handle.shutdown_with_drain().await.unwrap();
    // The longest partition had three keys; the delayed key was dropped.
    assert_eq!(t0.elapsed(), secs(3));
    assert_eq!(log.keys().len(), 6);
    assert!(!log.keys().contains(&(1, "delayed")));
    assert_eq!(q.add((0, "z")), Err(AddError::ShuttingDown));
    assert_eq!(q.add_rate_limited((0, "z")), Err(AddError::ShuttingDown));
    assert_eq!(q.depths(), [0, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn the_queue_can_be_drained_from_a_clone_while_the_handle_is_awaited_elsewhere() {
    let q = queue(2);
    q.add((0, "a")).unwrap();
    q.add((1, "b")).unwrap();
    let log = Log::new();
    let handle = run_logged(&q, &log, |_| secs(1));
    let waiter = tokio::spawn(async move { handle.await });
    q.clone().shutdown_with_drain().await;
    assert_eq!(log.keys().len(), 2);
    waiter.await.unwrap().unwrap();
}
