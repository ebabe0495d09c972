//! Partitions: one key at a time and in order inside a partition, partitions
//! in parallel, and a hot partition slows only itself.

mod partitioned_common;

use std::collections::HashSet;
use std::time::Duration;

use partitioned_common::{Log, run_logged, secs};
use tokio::time::Instant;
use tokio_workqueue::{Partitioned, WorkQueue};

/// Keys are (partition, sequence number).
type Key = (usize, u32);

fn by_first(n: usize) -> Partitioned<Key> {
    WorkQueue::partitioned(n, |k: &Key| k.0).unwrap()
}

#[tokio::test(start_paused = true)]
async fn keys_of_one_partition_run_one_at_a_time_in_the_order_they_were_added() {
    let q = by_first(3);
    // Interleaved adds across partitions.
    for seq in 0..5 {
        for p in [2, 0, 1] {
            q.add((p, seq)).unwrap();
        }
    }
    let log = Log::new();
    // Later keys are quicker, so a second worker on a partition would finish
    // (and start) them out of order.
    let handle = run_logged(&q, &log, |k: &Key| secs(10 - u64::from(k.1)));
    handle.shutdown_with_drain().await.unwrap();

    for p in 0..3 {
        let expected: Vec<Key> = (0..5).map(|seq| (p, seq)).collect();
        assert_eq!(log.order(p), expected, "partition {p}");
        let tasks: HashSet<_> = log
            .runs()
            .iter()
            .filter(|r| r.partition == p)
            .map(|r| r.task)
            .collect();
        assert_eq!(tasks.len(), 1, "partition {p} is processed by one task");
    }
    assert_eq!(log.max_active_per_partition(), 1);
    // Each run of a partition starts when the one before it ends.
    for p in 0..3 {
        let runs: Vec<_> = log
            .runs()
            .into_iter()
            .filter(|r| r.partition == p)
            .collect();
        for pair in runs.windows(2) {
            assert_eq!(Some(pair[1].start), pair[0].end, "partition {p}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn different_partitions_run_concurrently() {
    let q = by_first(4);
    for p in 0..4 {
        q.add((p, 0)).unwrap();
        q.add((p, 1)).unwrap();
    }
    let log = Log::new();
    let t0 = Instant::now();
    let handle = run_logged(&q, &log, |_| secs(1));
    handle.shutdown_with_drain().await.unwrap();

    // Eight one-second keys in four partitions: two seconds, not eight.
    assert_eq!(t0.elapsed(), secs(2));
    assert_eq!(log.max_active_total(), 4);
    assert_eq!(log.max_active_per_partition(), 1);
    let tasks: HashSet<_> = log.runs().iter().map(|r| r.task).collect();
    assert_eq!(tasks.len(), 4, "one task per partition");
}

#[tokio::test(start_paused = true)]
async fn a_hot_partition_does_not_slow_the_others() {
    let q = by_first(4);
    // One hot node with 100 pods; three with 3 pods each.
    for seq in 0..100 {
        q.add((0, seq)).unwrap();
    }
    for p in 1..4 {
        for seq in 0..3 {
            q.add((p, seq)).unwrap();
        }
    }
    assert_eq!(q.depths(), [100, 3, 3, 3]);
    let log = Log::new();
    let t0 = Instant::now();
    let handle = run_logged(&q, &log, |_| secs(1));

    tokio::time::sleep(Duration::from_millis(3500)).await;
    // The cold partitions are done as fast as if they were alone ...
    for p in 1..4 {
        assert_eq!(log.last_end(p), Some(secs(3)), "partition {p}");
    }
    // ... while the hot one has done only as many keys, and its depth shows it.
    assert_eq!(handle.depths(), [96, 0, 0, 0]);
    assert_eq!(log.order(0).len(), 4);

    // New keys on a cold node are picked up at once, not behind the hot node.
    let t = Instant::now();
    q.add((2, 99)).unwrap();
    tokio::time::sleep(secs(1) + Duration::from_millis(1)).await;
    let run = log.runs().into_iter().find(|r| r.key == (2, 99)).unwrap();
    assert_eq!(run.start, t - t0);
    assert_eq!(run.end, Some(t - t0 + secs(1)));

    handle.shutdown_with_drain().await.unwrap();
    assert_eq!(log.last_end(0), Some(secs(100)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_many_threads_a_partition_still_runs_one_key_at_a_time_in_order() {
    let q = by_first(4);
    let log = Log::new();
    let (q2, log2) = (q.clone(), log.clone());
    let handle = q.run(move |item| {
        let (q, log) = (q2.clone(), log2.clone());
        async move {
            let run = log.start(*item, q.partition_of(&item));
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            drop(run);
        }
    });
    // Add while the tasks run, from two producers at once.
    let producers: Vec<_> = [(0..4).step_by(2), (1..4).step_by(2)]
        .into_iter()
        .map(|parts| {
            let q = q.clone();
            tokio::spawn(async move {
                let parts: Vec<usize> = parts.collect();
                for seq in 0..250 {
                    for &p in &parts {
                        q.add((p, seq)).unwrap();
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    handle.shutdown_with_drain().await.unwrap();

    assert_eq!(log.max_active_per_partition(), 1);
    for p in 0..4 {
        let order = log.order(p);
        assert_eq!(order.len(), 250, "partition {p}: every key processed once");
        assert!(
            order.windows(2).all(|w| w[0].1 < w[1].1),
            "partition {p} in order"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_handle_can_be_awaited_and_reports_per_partition_depth() {
    let q = by_first(2);
    for seq in 0..3 {
        q.add((0, seq)).unwrap();
    }
    q.add((1, 0)).unwrap();
    let log = Log::new();
    let handle = run_logged(&q, &log, |_| secs(1));
    tokio::task::yield_now().await;
    // Each task has taken its first key.
    assert_eq!(handle.depths(), [2, 0]);
    assert_eq!(handle.queue().len(), 2);
    handle.shutdown();
    assert!(
        !handle.is_finished(),
        "shutdown does not cancel work in flight"
    );
    handle.await.unwrap();
    assert_eq!(log.keys().len(), 4);
    assert_eq!(q.add((1, 9)), Err(tokio_workqueue::AddError::ShuttingDown));
}
