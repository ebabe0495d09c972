//! `WorkQueue::run`: a panicking job is a failed attempt of its key alone,
//! retried with backoff; the loop, the other jobs in flight and the queued
//! keys go on, and a drain ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio_workqueue::metrics::MetricsHook;
use tokio_workqueue::{AddError, AddOpts, WorkQueue};

/// Waits (on the paused clock) until `done` holds; fails, rather than
/// hangs, if it never does.
async fn until(mut done: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(600), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("never happened");
}

/// A drain that must end: fails, rather than hangs, if it does not.
async fn drain(queue: &WorkQueue<impl tokio_workqueue::Key>) {
    tokio::time::timeout(Duration::from_secs(600), queue.shutdown_with_drain())
        .await
        .expect("the drain never ended");
}

/// Keys 0..20. The jobs below take 10 ms each, two at a time, so another
/// job is in flight when key 5's panics.
fn queue_with_jobs() -> WorkQueue<u32> {
    let queue = WorkQueue::new();
    for key in 0..20 {
        queue.add(key).unwrap();
    }
    queue
}

/// What the issue saw with `for_each_concurrent`: one panic ends the loop,
/// the job in flight beside it is dropped (its lease ends as a success) and
/// the queued keys are stranded. Kept as a control: the loss the tests
/// below guard against is real.
#[tokio::test(start_paused = true)]
async fn control_for_each_concurrent_ends_at_the_first_panic() {
    let queue = queue_with_jobs();
    let finished = Arc::new(AtomicUsize::new(0));
    let workers = tokio::spawn({
        let finished = finished.clone();
        queue.clone().for_each_concurrent(2, move |item| {
            let finished = finished.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if *item == 5 {
                    panic!("job 5 failed");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    assert!(workers.await.unwrap_err().is_panic());
    assert!(finished.load(Ordering::Relaxed) < 19);
    assert!(!queue.is_empty(), "queued keys stranded");
    queue.shutdown();
    assert!(
        tokio::time::timeout(Duration::from_secs(60), queue.shutdown_with_drain())
            .await
            .is_err(),
        "with no consumer left the drain never ends"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_fails_one_attempt_of_its_key_and_the_loop_goes_on() {
    let queue = queue_with_jobs();
    let finished = Arc::new(Mutex::new(Vec::new()));
    let panics = Arc::new(Mutex::new(Vec::new()));
    let workers = tokio::spawn(
        queue
            .workers(2)
            .on_panic({
                let panics = panics.clone();
                move |p| panics.lock().unwrap().push(p.clone())
            })
            .run({
                let finished = finished.clone();
                move |item| {
                    let finished = finished.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        if *item == 5 && item.num_requeues() == 0 {
                            panic!("job 5 failed");
                        }
                        finished.lock().unwrap().push(*item);
                        item.succeed();
                    }
                }
            }),
    );
    until(|| finished.lock().unwrap().len() == 20).await;
    drain(&queue).await;
    let report = workers.await.unwrap();
    assert_eq!((report.jobs, report.panics), (21, 1));
    assert!(report.not_requeued.is_empty());
    let mut finished = finished.lock().unwrap().clone();
    finished.sort();
    assert_eq!(finished, (0..20).collect::<Vec<_>>(), "every job, once");
    let panics = panics.lock().unwrap();
    assert_eq!(panics.len(), 1);
    assert_eq!((panics[0].key, panics[0].requeued), (5, Ok(())));
    assert_eq!(panics[0].to_string(), "job 5 panicked: job 5 failed");
    assert_eq!(queue.num_requeues(&5), 0, "its success forgot the failure");
}

/// A panic in the call itself, before any future exists, is caught too,
/// and the retry keeps the priority the key was handed out with.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_call_is_caught_and_the_retry_keeps_its_priority() {
    let queue = WorkQueue::new();
    queue
        .add_with("urgent", AddOpts::new().priority(10))
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut calls = 0;
    let workers = tokio::spawn(queue.run(1, {
        let seen = seen.clone();
        move |item| {
            calls += 1;
            if calls == 1 {
                panic!("before the future");
            }
            seen.lock().unwrap().push((*item.key(), item.priority()));
            async {}
        }
    }));
    until(|| !seen.lock().unwrap().is_empty()).await;
    drain(&queue).await;
    assert_eq!(workers.await.unwrap().panics, 1);
    assert_eq!(*seen.lock().unwrap(), [("urgent", 10)]);
}

/// During a drain the retry is refused: the report names the key.
#[tokio::test(start_paused = true)]
async fn a_key_that_panics_during_the_drain_is_reported_not_requeued() {
    let queue = WorkQueue::new();
    queue.add("doomed").unwrap();
    queue.add("fine").unwrap();
    queue.shutdown();
    let report = tokio::time::timeout(
        Duration::from_secs(600),
        queue.run(4, |item| async move {
            if *item == "doomed" {
                panic!("no luck");
            }
        }),
    )
    .await
    .expect("the loop ended");
    assert_eq!((report.jobs, report.panics), (2, 1));
    assert_eq!(report.not_requeued, ["doomed"]);
}

#[tokio::test(start_paused = true)]
async fn no_more_than_concurrency_jobs_run_at_once() {
    let queue = WorkQueue::new();
    for key in 0..50_u32 {
        queue.add(key).unwrap();
    }
    queue.shutdown();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let report = queue
        .run(3, |_item| {
            let running = running.clone();
            let most = most.clone();
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
            }
        })
        .await;
    assert_eq!(report.jobs, 50);
    assert_eq!(most.load(Ordering::SeqCst), 3);
    // 0 is taken as 1, not as "no limit".
    queue_zero_is_one().await;
}

async fn queue_zero_is_one() {
    let queue = WorkQueue::new();
    queue.add(1).unwrap();
    queue.add(2).unwrap();
    queue.shutdown();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    queue
        .run(0, |_item| {
            let running = running.clone();
            let most = most.clone();
            async move {
                most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
            }
        })
        .await;
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

/// The metrics hook has no panic event: the retry a panic causes is
/// counted as a retry, and the panic itself in the report.
#[tokio::test(start_paused = true)]
async fn the_retry_after_a_panic_is_a_retry_in_the_metrics() {
    #[derive(Default)]
    struct Retries(AtomicUsize);
    impl MetricsHook for Retries {
        fn retry(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let retries = Arc::new(Retries::default());
    let queue = WorkQueue::builder().metrics(retries.clone()).build();
    queue.add(1_u8).unwrap();
    let workers = tokio::spawn(queue.run(1, |item| async move {
        if item.num_requeues() == 0 {
            panic!("first attempt");
        }
    }));
    until(|| queue.num_requeues(&1) == 1 && queue.snapshot().waiting == 0 && queue.is_empty())
        .await;
    drain(&queue).await;
    assert_eq!(workers.await.unwrap().panics, 1);
    assert_eq!(retries.0.load(Ordering::Relaxed), 1);
    assert_eq!(queue.add(2), Err(AddError::ShuttingDown));
}

#[test]
fn the_new_public_types_are_send_sync_and_debug() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<tokio_workqueue::Workers<String>>();
    check::<tokio_workqueue::RunReport<String>>();
    check::<tokio_workqueue::WorkerPanic<String>>();
    check::<tokio_workqueue::Drain<String>>();
    check::<tokio_workqueue::DrainReport<String>>();
}
