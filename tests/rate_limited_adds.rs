//! Rate-limited adds and requeues go through the queue's limiter.

use std::time::Duration;

use tokio::time::Instant;
use tokio_workqueue::{AddOpts, ExponentialBackoff, WorkQueue};

fn queue() -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .rate_limiter(
            ExponentialBackoff::new(Duration::from_millis(10), Duration::from_secs(1)).unwrap(),
        )
        .build()
}

#[tokio::test(start_paused = true)]
async fn each_failure_doubles_the_wait_and_forget_resets_it() {
    let q = queue();
    let start = Instant::now();
    q.add_rate_limited("k").unwrap();
    let item = q.get().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(10));
    assert_eq!(item.num_requeues(), 1);
    let t = Instant::now();
    item.requeue_rate_limited().unwrap();
    let item = q.get().await.unwrap();
    assert_eq!(t.elapsed(), Duration::from_millis(20));
    assert_eq!(q.num_requeues(&"k"), 2);
    item.forget();
    assert_eq!(q.num_requeues(&"k"), 0);
    let t = Instant::now();
    item.requeue_rate_limited().unwrap();
    drop(q.get().await.unwrap());
    assert_eq!(t.elapsed(), Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn rate_limited_and_after_together_wait_the_longer() {
    let q = queue();
    let start = Instant::now();
    q.add_with(
        "k",
        AddOpts::default()
            .rate_limited()
            .after(Duration::from_millis(50)),
    )
    .unwrap();
    drop(q.get().await.unwrap());
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    q.forget(&"k");
    let start = Instant::now();
    q.add_with(
        "k",
        AddOpts::default()
            .rate_limited()
            .after(Duration::from_millis(1)),
    )
    .unwrap();
    drop(q.get().await.unwrap());
    assert_eq!(start.elapsed(), Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn the_default_limiter_is_client_gos() {
    let q: WorkQueue<u32> = WorkQueue::new();
    let start = Instant::now();
    q.add_rate_limited(1).unwrap();
    drop(q.get().await.unwrap());
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(5),
        "5 ms base backoff"
    );
}
