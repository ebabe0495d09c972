//! Panics: in the partition function or in a worker, no key is lost and the
//! other partitions go on.

mod partitioned_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use partitioned_common::{Log, secs};
use tokio_workqueue::{
    AddError, ExponentialBackoff, PanicSource, PartitionHandle, PartitionPanic, Partitioned,
};

/// Keys are (partition, name).
type Key = (usize, &'static str);

/// What a worker does on one attempt at a key.
#[derive(Clone, Copy)]
enum Act {
    Work(Duration),
    PanicAfter(Duration),
    PanicAtOnce,
}

type Reports = Arc<Mutex<Vec<PartitionPanic<Key>>>>;

/// A queue of `n` partitions that backs off 1 s, 2 s, 4 s, ... and keeps
/// the panic reports.
fn queue(n: usize, partition_fn: fn(&Key) -> usize) -> (Partitioned<Key>, Reports) {
    let reports = Reports::default();
    let log = reports.clone();
    let q = Partitioned::builder(n, partition_fn)
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(60)).unwrap())
        .on_panic(move |r| log.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    (q, reports)
}

/// Runs `q` with workers that do `act(key, attempt)`, attempts counted
/// from 1, logging each run (with `partition` as the key's first field).
fn run(
    q: &Partitioned<Key>,
    log: &Arc<Log<Key>>,
    act: impl Fn(&Key, u32) -> Act + Send + Sync + 'static,
) -> PartitionHandle<Key> {
    let attempts = Arc::new(Mutex::new(HashMap::<Key, u32>::new()));
    let log = log.clone();
    q.run(move |item| {
        let key = *item;
        let attempt = {
            let mut a = attempts.lock().unwrap();
            let n = a.entry(key).or_default();
            *n += 1;
            *n
        };
        let run = log.start(key, key.0);
        let action = act(&key, attempt);
        if let Act::PanicAtOnce = action {
            // Before a future is even returned.
            panic!("{key:?} failed at once");
        }
        async move {
            match action {
                Act::Work(d) => tokio::time::sleep(d).await,
                Act::PanicAfter(d) => {
                    tokio::time::sleep(d).await;
                    panic!("{key:?} failed on attempt {attempt}");
                }
                Act::PanicAtOnce => unreachable!(),
            }
            drop(run);
            item.forget();
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_panicking_worker_does_not_stop_other_partitions_and_its_key_is_retried() {
    let (q, reports) = queue(2, |k| k.0);
    q.add((0, "boom")).unwrap();
    q.add((0, "after-boom")).unwrap();
    q.add((1, "x")).unwrap();
    q.add((1, "y")).unwrap();
    let log = Log::new();
    let handle = run(&q, &log, |k, attempt| {
        if k.1 == "boom" && attempt == 1 {
            Act::PanicAfter(Duration::from_millis(500))
        } else {
            Act::Work(secs(1))
        }
    });
    // Shut down only once the retry is due: after a shutdown it is refused.
    tokio::time::sleep(secs(2)).await;
    handle.shutdown_with_drain().await.unwrap();

    let ms = Duration::from_millis;
    // The other partition never noticed.
    assert_eq!(log.starts_of((1, "x")), [secs(0)]);
    assert_eq!(log.last_end(1), Some(secs(2)));
    // The panicking partition's task went on with its next key ...
    assert_eq!(log.starts_of((0, "after-boom")), [ms(500)]);
    // ... and the key came back after the rate limiter's delay (1 s).
    assert_eq!(log.starts_of((0, "boom")), [ms(0), ms(1500)]);
    assert_eq!(
        log.order(0),
        [(0, "boom"), (0, "after-boom"), (0, "boom")],
        "still one key at a time"
    );
    assert_eq!(log.max_active_per_partition(), 1);

    assert_eq!(q.reconcile_panics(), 1);
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r.source, PanicSource::Reconcile);
    assert_eq!((r.partition, r.key), (0, (0, "boom")));
    assert_eq!(r.message, "(0, \"boom\") failed on attempt 1");
    assert_eq!(r.requeued, Some(Ok(())));
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_panics_before_returning_its_future_is_caught_too() {
    let (q, reports) = queue(1, |_| 0);
    q.add((0, "a")).unwrap();
    q.add((0, "b")).unwrap();
    let log = Log::new();
    let handle = run(&q, &log, |k, attempt| {
        if k.1 == "a" && attempt == 1 {
            Act::PanicAtOnce
        } else {
            Act::Work(secs(1))
        }
    });
    tokio::time::sleep(secs(2)).await;
    handle.shutdown_with_drain().await.unwrap();
    assert_eq!(log.keys(), [(0, "a"), (0, "b"), (0, "a")]);
    assert_eq!(
        reports.lock().unwrap()[0].message,
        "(0, \"a\") failed at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_that_always_panics_backs_off_and_does_not_block_its_partition() {
    let (q, _reports) = queue(1, |_| 0);
    q.add((0, "bad")).unwrap();
    let log = Log::new();
    let handle = run(&q, &log, |k, _| {
        if k.1 == "bad" {
            Act::PanicAfter(Duration::ZERO)
        } else {
            Act::Work(secs(1))
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    q.add((0, "good")).unwrap();
    tokio::time::sleep(Duration::from_millis(6500)).await;

    // Retried after 1 s, 2 s, 4 s of backoff, not in a tight loop.
    assert_eq!(
        log.starts_of((0, "bad")),
        [secs(0), secs(1), secs(3), secs(7)]
    );
    assert_eq!(q.num_requeues(&(0, "bad")), 4);
    assert_eq!(q.reconcile_panics(), 4);
    // A key added meanwhile ran in the gap.
    assert_eq!(log.starts_of((0, "good")), [Duration::from_millis(1500)]);
    handle.shutdown();
    handle.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_worker_panic_during_shutdown_is_reported_as_not_requeued() {
    let (q, reports) = queue(2, |k| k.0);
    q.add((0, "late")).unwrap();
    let log = Log::new();
    let handle = run(&q, &log, |_, _| Act::PanicAfter(secs(1)));
    tokio::task::yield_now().await;
    handle.shutdown();
    handle.await.unwrap();

    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1, "the key is not silently dropped");
    assert_eq!(reports[0].requeued, Some(Err(AddError::ShuttingDown)));
    assert!(reports[0].to_string().contains("not requeued"));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_partition_fn_sends_the_key_to_partition_zero_where_it_is_processed() {
    let (q, reports) = queue(3, |k| {
        if k.1 == "orphan" {
            panic!("no node for {}", k.1);
        }
        k.0
    });
    // The log's partition is the key's first field, so the orphan says 0.
    for key in [(0, "a"), (1, "b"), (2, "c"), (0, "orphan")] {
        q.add(key).unwrap();
    }
    assert_eq!(q.depths(), [2, 1, 1]);
    assert_eq!(q.partition_fn_panics(), 1);
    let log = Log::new();
    let handle = run(&q, &log, |_, _| Act::Work(secs(1)));
    handle.shutdown_with_drain().await.unwrap();

    let runs = log.runs();
    let task_of = |name| runs.iter().find(|r| r.key.1 == name).unwrap().task;
    assert_eq!(
        task_of("orphan"),
        task_of("a"),
        "processed by partition 0's task"
    );
    assert_eq!(log.order(0), [(0, "a"), (0, "orphan")]);
    // The other partitions were not held up.
    assert_eq!(
        (log.last_end(1), log.last_end(2)),
        (Some(secs(1)), Some(secs(1)))
    );

    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].source, PanicSource::PartitionFn);
    assert_eq!((reports[0].partition, reports[0].key), (0, (0, "orphan")));
    assert_eq!(reports[0].message, "no node for orphan");
    assert_eq!(reports[0].requeued, None);
}

#[tokio::test(start_paused = true)]
async fn an_out_of_range_partition_is_reduced_modulo_n() {
    // "far" says partition 10: with 3 partitions that is 10 % 3 == 1.
    let (q, _reports) = queue(3, |k| if k.1 == "far" { 10 } else { k.0 });
    q.add((1, "near")).unwrap();
    q.add((1, "far")).unwrap();
    assert_eq!(q.partition_of(&(1, "far")), 1);
    assert_eq!(q.depths(), [0, 2, 0]);
    let log = Log::new();
    let handle = run(&q, &log, |_, _| Act::Work(secs(1)));
    handle.shutdown_with_drain().await.unwrap();

    let runs = log.runs();
    assert_eq!(runs[0].task, runs[1].task, "one partition, one task");
    assert_eq!(
        log.starts_of((1, "far")),
        [secs(1)],
        "after the key before it"
    );
}
