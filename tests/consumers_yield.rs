//! A consumer that always finds a key still lets the other tasks of its
//! thread run: taking a key spends tokio's co-operative budget, as a
//! channel's `recv` does, so a busy consumer yields every so often instead
//! of holding its worker until the queue is empty (or forever, when each
//! reconcile requeues its key at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use futures::StreamExt;
use tokio_workqueue::WorkQueue;

/// Runs `consume` on a current-thread runtime beside a task that only sets
/// a flag, and returns how many keys `consume` had taken when that task ran.
/// The consumer requeues each key it takes, so it never runs out of work: if
/// it never yielded, the flag task would never run and the consumer would
/// stop only at its own limit.
fn taken_before_the_other_task_runs<F, Fut>(consume: F) -> usize
where
    F: FnOnce(WorkQueue<u32>, Arc<AtomicBool>, Arc<AtomicUsize>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let queue = WorkQueue::<u32>::new();
    for k in 0..16 {
        queue.add(k).expect("open");
    }
    let other_ran = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicUsize::new(0));
    let taken_then = Arc::new(AtomicUsize::new(usize::MAX));
    rt.block_on(async {
        let consumer = tokio::spawn(consume(queue.clone(), other_ran.clone(), taken.clone()));
        let (ran, taken2, then) = (other_ran.clone(), taken.clone(), taken_then.clone());
        let other = tokio::spawn(async move {
            then.store(taken2.load(SeqCst), SeqCst);
            ran.store(true, SeqCst);
        });
        consumer.await.expect("the consumer");
        other.await.expect("the other task");
    });
    taken_then.load(SeqCst)
}

/// The consumer stops once the other task has run, or after this many keys
/// (which it reaches only if it never yields).
const LIMIT: usize = 100_000;

#[test]
fn a_consumer_of_get_that_always_finds_a_key_yields_to_other_tasks() {
    let taken = taken_before_the_other_task_runs(|queue, other_ran, taken| async move {
        while let Some(item) = queue.get().await {
            let n = taken.fetch_add(1, SeqCst) + 1;
            if other_ran.load(SeqCst) || n >= LIMIT {
                break;
            }
            item.requeue().expect("open");
        }
    });
    assert!(
        taken < 1_000,
        "the other task ran only after the consumer had taken {taken} keys"
    );
}

#[test]
fn a_stream_consumer_that_always_finds_a_key_yields_to_other_tasks() {
    let taken = taken_before_the_other_task_runs(|mut queue, other_ran, taken| async move {
        while let Some(item) = queue.next().await {
            let n = taken.fetch_add(1, SeqCst) + 1;
            if other_ran.load(SeqCst) || n >= LIMIT {
                break;
            }
            item.requeue().expect("open");
        }
    });
    assert!(
        taken < 1_000,
        "the other task ran only after the consumer had taken {taken} keys"
    );
}

#[test]
fn a_run_loop_whose_jobs_always_requeue_yields_to_other_tasks() {
    let taken = taken_before_the_other_task_runs(|queue, other_ran, taken| async move {
        let stop = queue.clone();
        queue
            .run(4, move |item| {
                let n = taken.fetch_add(1, SeqCst) + 1;
                if other_ran.load(SeqCst) || n >= LIMIT {
                    stop.shutdown();
                } else {
                    item.requeue().expect("open");
                }
                std::future::ready(())
            })
            .await;
    });
    assert!(
        taken < 1_000,
        "the other task ran only after the loop had taken {taken} keys"
    );
}
