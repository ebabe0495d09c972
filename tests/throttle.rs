//! The builder's throttle caps how fast keys are handed out.

use std::time::Duration;

use tokio::time::Instant;
use tokio_workqueue::{TokenBucket, WorkQueue};

#[tokio::test(start_paused = true)]
async fn hand_outs_follow_the_bucket_rate_after_its_burst() {
    let bucket = TokenBucket::new(10.0, 5).unwrap();
    let q: WorkQueue<u32> = WorkQueue::builder().throttle(bucket).build();
    for k in 0..25 {
        q.add(k).unwrap();
    }
    let start = Instant::now();
    let mut times = Vec::new();
    for _ in 0..25 {
        drop(q.get().await.unwrap());
        times.push(start.elapsed());
    }
    // Five at once (the burst), then one every 100 ms.
    assert!(times[..5].iter().all(|t| t.is_zero()), "{times:?}");
    assert_eq!(times[5], Duration::from_millis(100));
    assert_eq!(times[24], Duration::from_millis(2000));
}

#[tokio::test(start_paused = true)]
async fn an_empty_queue_spends_no_tokens() {
    let bucket = TokenBucket::new(1.0, 1).unwrap();
    let q: WorkQueue<u32> = WorkQueue::builder().throttle(bucket.clone()).build();
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { *q.get().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        bucket.try_acquire().is_ok(),
        "the parked consumer took no token"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.add(7).unwrap();
    assert_eq!(waiting.await.unwrap(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_throttled_get_that_is_dropped_takes_no_token_and_loses_no_key() {
    let bucket = TokenBucket::new(1.0, 1).unwrap();
    let q: WorkQueue<u32> = WorkQueue::builder().throttle(bucket.clone()).build();
    q.add(1).unwrap();
    q.add(2).unwrap();
    drop(q.get().await.unwrap()); // the burst token
    let cancelled = tokio::time::timeout(Duration::from_millis(500), q.get()).await;
    assert!(cancelled.is_err(), "no token for 1 s");
    assert_eq!(q.len(), 1, "the key is still queued");
    let start = Instant::now();
    assert_eq!(*q.get().await.unwrap(), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}
