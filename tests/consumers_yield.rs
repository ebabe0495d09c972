//! A consumer that always finds a key still lets the other tasks of its
//! thread run: taking a key spends tokio's co-operative budget, as a
//! channel's `recv` does, so a busy consumer yields every so often instead
//! of holding its worker until the queue is empty (or forever, when each
//! reconcile requeues its key at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use futures::{Stream, StreamExt};
use tokio_workqueue::{WorkItem, WorkQueue};

/// The consumer stops once the other task has run, or after this many keys
/// (which it reaches only if it never yields).
const LIMIT: usize = 100_000;

/// What the consumer and the other task share: whether the other task ran,
/// and how many keys the consumer took.
#[derive(Clone, Default)]
struct Record {
    other_ran: Arc<AtomicBool>,
    taken: Arc<AtomicUsize>,
}

impl Record {
    /// Counts a key taken: whether the consumer goes on (and requeues it).
    fn go_on(&self) -> bool {
        let n = self.taken.fetch_add(1, SeqCst) + 1;
        !self.other_ran.load(SeqCst) && n < LIMIT
    }
}

/// Runs `consume` on a current-thread runtime beside a task that only sets
/// a flag, and checks that the task ran before the consumer had taken 1,000
/// keys. The consumer requeues each key it takes, so it never runs out of
/// work: if it never yielded, the flag task would never run and the consumer
/// would stop only at its own limit.
fn yields_to_the_other_task<F, Fut>(consume: F)
where
    F: FnOnce(WorkQueue<u32>, Record) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let queue = WorkQueue::<u32>::new();
    for k in 0..16 {
        queue.add(k).expect("open");
    }
    let record = Record::default();
    let taken_then = Arc::new(AtomicUsize::new(usize::MAX));
    rt.block_on(async {
        let consumer = tokio::spawn(consume(queue.clone(), record.clone()));
        let (seen, then) = (record.clone(), taken_then.clone());
        let other = tokio::spawn(async move {
            then.store(seen.taken.load(SeqCst), SeqCst);
            seen.other_ran.store(true, SeqCst);
        });
        consumer.await.expect("the consumer");
        other.await.expect("the other task");
    });
    let taken = taken_then.load(SeqCst);
    assert!(
        taken < 1_000,
        "the other task ran only after the consumer had taken {taken} keys"
    );
}

/// Takes keys from `keys` and requeues each at once, until `record` says
/// to stop.
async fn requeue_each(mut keys: impl Stream<Item = WorkItem<u32>> + Unpin, record: Record) {
    while let Some(item) = keys.next().await {
        if !record.go_on() {
            break;
        }
        item.requeue().expect("open");
    }
}

#[test]
fn a_consumer_of_get_that_always_finds_a_key_yields_to_other_tasks() {
    yields_to_the_other_task(|queue, record| {
        // Each key through `get`, not through the queue's own stream.
        let gets = futures::stream::unfold(queue, |queue| async move {
            let item = queue.get().await?;
            Some((item, queue))
        });
        requeue_each(Box::pin(gets), record)
    });
}

#[test]
fn a_stream_consumer_that_always_finds_a_key_yields_to_other_tasks() {
    yields_to_the_other_task(requeue_each);
}

#[test]
fn a_run_loop_whose_jobs_always_requeue_yields_to_other_tasks() {
    yields_to_the_other_task(|queue, record| async move {
        let stop = queue.clone();
        queue
            .run(4, move |item| {
                if record.go_on() {
                    item.requeue().expect("open");
                } else {
                    stop.shutdown();
                }
                std::future::ready(())
            })
            .await;
    });
}
