//! The controller loop (`run_controller`) over a plain queue: bounded
//! concurrency, one reconcile per key at a time, requeue on error and panic,
//! forget on success, requeue-after keeping the priority, graceful shutdown.
#![cfg(feature = "kube")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_workqueue::kube::{Action, ReconcileError, Reconciled, Requeued, run_controller};
use tokio_workqueue::{AddError, AddOpts, WorkQueue};

type Outcome = Reconciled<String, String>;

/// Counts reconciles in flight, per key and overall, remembering the maxima.
#[derive(Default)]
struct InFlight {
    per_key: Mutex<HashMap<String, usize>>,
    max_per_key: AtomicUsize,
    total: AtomicUsize,
    max_total: AtomicUsize,
}

impl InFlight {
    fn enter(&self, key: &str) {
        let mut map = self.per_key.lock().unwrap();
        let n = map.entry(key.to_string()).or_default();
        *n += 1;
        self.max_per_key.fetch_max(*n, Ordering::SeqCst);
        let total = self.total.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_total.fetch_max(total, Ordering::SeqCst);
    }
    fn leave(&self, key: &str) {
        *self.per_key.lock().unwrap().get_mut(key).unwrap() -= 1;
        self.total.fetch_sub(1, Ordering::SeqCst);
    }
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_reconciled_with_bounded_concurrency() {
    let queue = WorkQueue::new();
    for key in keys(30) {
        queue.add(key).unwrap();
    }
    let in_flight = Arc::new(InFlight::default());
    let seen = in_flight.clone();
    let controller = run_controller(queue.clone(), 4, move |key: String| {
        let seen = seen.clone();
        async move {
            seen.enter(&key);
            tokio::time::sleep(Duration::from_millis(5)).await;
            seen.leave(&key);
            Ok::<_, String>(Action::Done)
        }
    });
    let mut done: Vec<String> = controller.take(30).map(|r| r.key).collect().await;
    done.sort();
    let mut expected = keys(30);
    expected.sort();
    assert_eq!(done, expected);
    assert_eq!(in_flight.max_total.load(Ordering::SeqCst), 4);
    assert_eq!(in_flight.max_per_key.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_never_reconciled_twice_at_once() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let in_flight = Arc::new(InFlight::default());
    let seen = in_flight.clone();
    let controller = run_controller(queue.clone(), 8, move |key: String| {
        let seen = seen.clone();
        async move {
            seen.enter(&key);
            tokio::time::sleep(Duration::from_millis(2)).await;
            seen.leave(&key);
            Ok::<_, String>(Action::Done)
        }
    })
    .shutdown_on({
        let queue = queue.clone();
        async move {
            // Hammer three keys while they are being reconciled.
            for round in 0..200 {
                queue.add(format!("key-{}", round % 3)).unwrap();
                if round % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    });
    let results: Vec<Outcome> = tokio::time::timeout(Duration::from_secs(20), controller.collect())
        .await
        .expect("controller ends");
    assert!(results.len() >= 3);
    assert!(results.iter().all(|r| r.result.is_ok()));
    assert_eq!(in_flight.max_per_key.load(Ordering::SeqCst), 1);
    assert!(in_flight.max_total.load(Ordering::SeqCst) <= 3);
}

#[tokio::test(start_paused = true)]
async fn errors_requeue_with_the_rate_limiter_and_success_forgets() {
    let queue: WorkQueue<String> = WorkQueue::new();
    queue.add("flaky".to_string()).unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let q = queue.clone();
    let counter = attempts.clone();
    let mut controller = run_controller(queue.clone(), 1, move |key: String| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let q = q.clone();
        async move {
            // The failures so far, as the rate limiter counts them.
            assert_eq!(q.num_requeues(&key), n as u32);
            if n < 3 {
                Err(format!("attempt {n} failed"))
            } else {
                Ok(Action::Done)
            }
        }
    });
    for n in 0..3 {
        let r = controller.next().await.unwrap();
        assert_eq!(r.key, "flaky");
        assert_eq!(r.requeued, Requeued::RateLimited);
        match r.result {
            Err(ReconcileError::Failed(e)) => assert_eq!(e, format!("attempt {n} failed")),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(queue.num_requeues(&"flaky".to_string()), n + 1);
    }
    let r = controller.next().await.unwrap();
    assert!(matches!(r.result, Ok(Action::Done)));
    assert_eq!(r.requeued, Requeued::No);
    assert_eq!(queue.num_requeues(&"flaky".to_string()), 0);
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn requeue_after_keeps_the_priority_and_waits() {
    let queue: WorkQueue<String> = WorkQueue::new();
    queue
        .add_with("periodic".to_string(), AddOpts::default().priority(7))
        .unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let mut controller = run_controller(queue.clone(), 1, move |_key: String| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Ok::<_, String>(Action::requeue(Duration::from_secs(30)))
            } else {
                Ok(Action::Done)
            }
        }
    });
    let start = Instant::now();
    let first = controller.next().await.unwrap();
    assert_eq!(first.priority, 7);
    assert_eq!(first.requeued, Requeued::After(Duration::from_secs(30)));
    // While it waits, a plain add of another key at priority 0 runs first...
    queue.add("other".to_string()).unwrap();
    assert_eq!(controller.next().await.unwrap().key, "other");
    // ...and the requeued key comes back after its delay, at priority 7.
    let second = controller.next().await.unwrap();
    assert_eq!(second.key, "periodic");
    assert_eq!(second.priority, 7);
    assert!(start.elapsed() >= Duration::from_secs(30));
    assert!(start.elapsed() < Duration::from_secs(31));
    assert_eq!(queue.num_requeues(&"periodic".to_string()), 0);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_reconcile_does_not_lose_the_key() {
    let queue: WorkQueue<String> = WorkQueue::new();
    queue
        .add_with("fragile".to_string(), AddOpts::default().priority(-3))
        .unwrap();
    queue.add("eager".to_string()).unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let mut controller = run_controller(queue.clone(), 2, move |key: String| {
        if key == "eager" && counter.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("panicked before the future was made");
        }
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if key == "fragile" && n < 3 {
                panic!("reconcile of {key} blew up");
            }
            Ok::<_, String>(Action::Done)
        }
    });
    let mut panics = 0;
    let mut done = Vec::new();
    while done.len() < 2 {
        let r = controller.next().await.unwrap();
        match &r.result {
            Err(ReconcileError::Panicked(msg)) => {
                assert!(msg.contains("before the future") || msg.contains("blew up"));
                assert_eq!(r.requeued, Requeued::RateLimited);
                if r.key == "fragile" {
                    assert_eq!(r.priority, -3);
                }
                panics += 1;
            }
            Ok(Action::Done) => done.push(r.key.clone()),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(panics >= 2, "{panics}");
    done.sort();
    assert_eq!(done, ["eager", "fragile"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_ready_keys_and_refuses_requeues() {
    let queue: WorkQueue<String> = WorkQueue::new();
    for key in keys(10) {
        queue.add(key).unwrap();
    }
    let gate = Arc::new(Notify::new());
    let stop = Arc::new(Notify::new());
    let (g, s) = (gate.clone(), stop.clone());
    let controller = run_controller(queue.clone(), 2, move |key: String| {
        let (g, s) = (g.clone(), s.clone());
        async move {
            if key == "key-0" {
                // The first reconcile raises the signal and waits until the
                // shutdown has begun.
                s.notify_one();
                g.notified().await;
                return Err("failed during shutdown".to_string());
            }
            if key == "key-1" {
                return Ok(Action::requeue(Duration::from_secs(10)));
            }
            Ok(Action::Done)
        }
    })
    .shutdown_on(async move { stop.notified().await });
    let q = queue.clone();
    let release = tokio::spawn(async move {
        while !q.is_shutting_down() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(q.add("late".to_string()), Err(AddError::ShuttingDown));
        gate.notify_one();
    });
    let results: Vec<Outcome> = tokio::time::timeout(Duration::from_secs(10), controller.collect())
        .await
        .expect("the controller drains and ends");
    release.await.unwrap();
    // Every key that was ready at shutdown was still reconciled, once.
    let mut reconciled: Vec<&str> = results.iter().map(|r| r.key.as_str()).collect();
    reconciled.sort();
    let mut expected = keys(10);
    expected.sort();
    assert_eq!(reconciled, expected);
    let key0 = results.iter().find(|r| r.key == "key-0").unwrap();
    assert_eq!(key0.requeued, Requeued::Refused(AddError::ShuttingDown));
    assert!(queue.is_shutting_down());
    assert!(queue.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_ends_when_the_queue_is_shut_down_elsewhere() {
    let queue: WorkQueue<String> = WorkQueue::new();
    queue.add("a".to_string()).unwrap();
    let controller = run_controller(queue.clone(), 1, |_key: String| async {
        Ok::<_, String>(Action::Done)
    });
    let q = queue.clone();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shutdown_with_drain().await;
    });
    let results: Vec<Outcome> = tokio::time::timeout(Duration::from_secs(10), controller.collect())
        .await
        .expect("ends");
    assert_eq!(results.len(), 1);
    stopper.await.unwrap();
}
