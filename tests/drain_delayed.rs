//! A drain loses nothing silently: retries accepted before the shutdown run
//! (`wait_for_delayed`), or come back in the report (`dropped`), and a drain
//! with no consumer left ends at its timeout saying what was left.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio_workqueue::{AddError, WorkQueue};

/// The job runner: 8 workers, every job fails on its first attempt
/// and asks for a rate-limited retry; the drain starts while the retries
/// wait on their backoff.
async fn job_runner(
    jobs: u32,
) -> (
    WorkQueue<u32>,
    Arc<Mutex<HashSet<u32>>>,
    tokio::task::JoinHandle<()>,
) {
    let queue = WorkQueue::new();
    for job in 0..jobs {
        queue.add(job).unwrap();
    }
    let succeeded = Arc::new(Mutex::new(HashSet::new()));
    let workers = tokio::spawn({
        let succeeded = succeeded.clone();
        queue.clone().for_each_concurrent(8, move |item| {
            let succeeded = succeeded.clone();
            async move {
                if item.num_requeues() == 0 {
                    // The first attempt fails; the retry is accepted.
                    item.requeue_rate_limited().unwrap();
                } else {
                    succeeded.lock().unwrap().insert(*item.key());
                    item.succeed();
                }
            }
        })
    });
    // Every first attempt has run: all the retries wait on their delay.
    while queue.snapshot().waiting < jobs as usize {
        tokio::task::yield_now().await;
    }
    (queue, succeeded, workers)
}

/// What the issue saw: `shutdown_with_drain` drops the waiting retries
/// without a word. Kept as a control: the loss the tests below guard
/// against is real.
#[tokio::test(start_paused = true)]
async fn control_shutdown_with_drain_drops_accepted_retries() {
    let (queue, succeeded, workers) = job_runner(46).await;
    queue.shutdown_with_drain().await;
    workers.await.unwrap();
    assert_eq!(succeeded.lock().unwrap().len(), 0, "every retry was lost");
}

#[tokio::test(start_paused = true)]
async fn wait_for_delayed_runs_every_accepted_retry() {
    let (queue, succeeded, workers) = job_runner(46).await;
    let report = queue.drain().wait_for_delayed().await;
    assert!(report.is_complete(), "{report:?}");
    assert!(report.dropped.is_empty());
    workers.await.unwrap();
    assert_eq!(succeeded.lock().unwrap().len(), 46);
    assert_eq!(queue.add(1), Err(AddError::ShuttingDown));
}

#[tokio::test(start_paused = true)]
async fn the_default_drain_hands_back_the_keys_it_drops() {
    let (queue, succeeded, workers) = job_runner(46).await;
    let report = queue.drain().await;
    workers.await.unwrap();
    assert!(!report.is_complete());
    let dropped: HashSet<u32> = report.dropped.into_iter().collect();
    assert_eq!(dropped, (0..46).collect(), "each dropped key, once");
    assert!(succeeded.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn wait_for_delayed_within_runs_those_due_and_reports_the_rest() {
    let queue = WorkQueue::new();
    queue
        .add_after("200ms", Duration::from_millis(200))
        .unwrap();
    queue.add_after("1s", Duration::from_secs(1)).unwrap();
    queue.add_after("1h", Duration::from_secs(3600)).unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let workers = tokio::spawn({
        let ran = ran.clone();
        queue.clone().for_each_concurrent(2, move |item| {
            let ran = ran.clone();
            async move { ran.lock().unwrap().push(*item.key()) }
        })
    });
    let start = tokio::time::Instant::now();
    let report = queue
        .drain()
        .wait_for_delayed_within(Duration::from_secs(1))
        .await;
    assert_eq!(report.dropped, ["1h"]);
    assert_eq!(start.elapsed(), Duration::from_secs(1), "waited for \"1s\"");
    workers.await.unwrap();
    assert_eq!(*ran.lock().unwrap(), ["200ms", "1s"]);
}

/// A key leased at the shutdown with a retry pending: its lease ends as
/// usual, and its retry is reported, not dropped silently.
#[tokio::test(start_paused = true)]
async fn a_pending_retry_of_a_leased_key_is_reported() {
    let queue = WorkQueue::new();
    queue.add("a").unwrap();
    let item = queue.get().await.unwrap();
    queue.add_after("a", Duration::from_secs(10)).unwrap();
    let drain = tokio::spawn(queue.drain().into_future());
    tokio::task::yield_now().await;
    assert!(!drain.is_finished(), "the lease is still running");
    item.done();
    let report = drain.await.unwrap();
    assert_eq!(report.dropped, ["a"]);
    assert!(queue.get().await.is_none());
}

/// Retries asked for during the drain are refused, so the drain ends even
/// for a job that always fails; the worker is told.
#[tokio::test(start_paused = true)]
async fn requeues_during_a_drain_are_refused() {
    let queue = WorkQueue::new();
    queue.add_after("flaky", Duration::from_millis(50)).unwrap();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let workers = tokio::spawn({
        let refused = refused.clone();
        queue.clone().for_each(move |item| {
            let refused = refused.clone();
            async move {
                if let Err(e) = item.requeue_rate_limited() {
                    refused.lock().unwrap().push(e);
                }
            }
        })
    });
    let report = queue.drain().wait_for_delayed().await;
    assert!(report.is_complete());
    workers.await.unwrap();
    assert_eq!(*refused.lock().unwrap(), [AddError::ShuttingDown]);
}

/// No consumer is left: a drain with a timeout does not wait forever, and
/// hands back the keys nobody took.
#[tokio::test(start_paused = true)]
async fn a_drain_without_consumers_ends_at_its_timeout_with_the_keys_left() {
    let queue = WorkQueue::new();
    queue.add("a").unwrap();
    queue.add("b").unwrap();
    queue.add_after("c", Duration::from_secs(1)).unwrap();
    let leased = queue.get().await.unwrap();
    let report = queue
        .drain()
        .wait_for_delayed()
        .timeout(Duration::from_secs(5))
        .await;
    assert!(report.timed_out && !report.is_complete());
    let mut left = report.not_handed_out.clone();
    left.sort();
    assert_eq!(left, ["b", "c"], "\"c\" fell due during the wait");
    assert_eq!((report.in_flight, report.waiting), (1, 0));
    drop(leased);
    assert!(queue.get().await.is_none(), "the keys reported are gone");
}

/// The runtime that timed the delays is gone: the drain starts a timer
/// task on its own runtime, so the kept keys still run.
#[test]
fn kept_delays_outlive_the_runtime_that_timed_them() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let queue = WorkQueue::new();
    paused().block_on(async {
        queue.add_after("a", Duration::from_millis(100)).unwrap();
    });
    paused().block_on(async {
        let workers = tokio::spawn(queue.clone().for_each(|_item| async {}));
        let report = tokio::time::timeout(
            Duration::from_secs(60),
            queue.drain().wait_for_delayed().into_future(),
        )
        .await
        .expect("the kept delay fired");
        assert!(report.is_complete());
        workers.await.unwrap();
    });
}

/// With no timer to be had, kept delays could never fire: the drain drops
/// and reports them instead of waiting forever.
#[test]
fn without_a_timer_kept_delays_are_dropped_and_reported() {
    let queue = WorkQueue::new();
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(async {
            queue.add_after("a", Duration::from_secs(1)).unwrap();
        });
    // On a thread of its own, so that a drain that hangs fails the test
    // (no tokio timeout without time).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let timeless = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let report = timeless.block_on(queue.drain().wait_for_delayed().into_future());
        let _ = tx.send(report);
    });
    let report = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the drain waited for a delay that could never fire");
    assert_eq!(report.dropped, ["a"]);
}
