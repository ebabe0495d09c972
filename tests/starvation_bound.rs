//! Semantic 5: with a starvation bound, a ready key is handed out within the
//! bound while consumers keep taking keys, even under a flood of higher
//! priorities (shared/bench/WORKLOADS.md W5, on paused time). Without the
//! bound, strict priority: the low keys starve. The bound is the queue's,
//! so it holds whatever ordering is plugged in.

use std::time::Duration;

use tokio::time::Instant;
use tokio_workqueue::ordering::{Ordering, TwoLanes};
use tokio_workqueue::{AddOpts, Builder, FairShare, Fifo, WorkQueue};

type Key = (bool, u32);

const ITEM: Duration = Duration::from_micros(50);
const RUN: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct W5 {
    low_served: usize,
    longest_low_wait: Duration,
    handed_out: usize,
    high_share: f64,
}

/// One consumer at 50 us per item; a producer adding distinct priority-0 keys
/// at twice that rate for 2 s; 100 priority -100 keys at the start.
///
/// tokio's timers work in whole milliseconds, so instead of sleeping 50 us
/// the consumer moves the paused clock on by exactly 50 us per item, and the
/// producer's two adds per item run in lockstep with it.
async fn w5(bound: Option<Duration>) -> W5 {
    w5_with(bound, |b| b).await
}

/// W5 on a queue with the ordering `order` puts on the builder.
async fn w5_with<O: Ordering<Key>>(
    bound: Option<Duration>,
    order: impl FnOnce(Builder<Key>) -> Builder<Key, O>,
) -> W5 {
    let mut b = order(WorkQueue::builder());
    if let Some(bound) = bound {
        b = b.starvation_bound(bound);
    }
    let q: WorkQueue<Key, O> = b.build();
    let start = Instant::now();
    for i in 0..100 {
        q.add_with((true, i), AddOpts::default().priority(-100))
            .unwrap();
    }
    let (mut low_served, mut longest, mut handed_out, mut high) = (0, Duration::ZERO, 0, 0);
    let mut next_high = 0;
    while start.elapsed() < RUN {
        for _ in 0..2 {
            q.add((false, next_high)).unwrap();
            next_high += 1;
        }
        let item = q.get().await.unwrap();
        handed_out += 1;
        if item.0 {
            low_served += 1;
            longest = longest.max(start.elapsed());
        } else {
            high += 1;
        }
        drop(item);
        tokio::time::advance(ITEM).await;
    }
    W5 {
        low_served,
        longest_low_wait: longest,
        handed_out,
        high_share: high as f64 / handed_out as f64,
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_bound_every_low_key_is_served_within_it() {
    let bound = Duration::from_millis(100);
    let r = w5(Some(bound)).await;
    println!("W5 bound 100 ms: {r:?}");
    assert_eq!(r.low_served, 100, "{r:?}");
    assert!(r.longest_low_wait <= bound + ITEM, "{r:?}");
    assert!(r.high_share >= 0.9, "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn without_the_bound_low_keys_starve() {
    let r = w5(None).await;
    println!("W5 no bound: {r:?}");
    assert_eq!(r.low_served, 0, "strict priority: {r:?}");
    assert_eq!(r.handed_out, 40_000, "2 s at 50 us per item");
}

#[tokio::test(start_paused = true)]
async fn the_oldest_key_is_promoted_first() {
    let q: WorkQueue<&str> = WorkQueue::builder()
        .starvation_bound(Duration::from_millis(100))
        .build();
    q.add_with("old-low", AddOpts::default().priority(-5))
        .unwrap();
    tokio::time::advance(Duration::from_millis(10)).await;
    q.add_with("older-high", AddOpts::default().priority(0))
        .unwrap();
    q.add_with("newer-low", AddOpts::default().priority(-5))
        .unwrap();
    q.add_with("top", AddOpts::default().priority(9)).unwrap();
    // Nothing is past half the bound yet: strict priority.
    assert_eq!(*q.get().await.unwrap(), "top");
    tokio::time::advance(Duration::from_millis(45)).await;
    // Now "old-low" (55 ms) is past 50 ms; the others (45 ms) are not.
    assert_eq!(*q.get().await.unwrap(), "old-low");
    assert_eq!(*q.get().await.unwrap(), "older-high");
    assert_eq!(*q.get().await.unwrap(), "newer-low");
}

#[tokio::test(start_paused = true)]
async fn a_zero_bound_hands_out_in_ready_order() {
    let q: WorkQueue<i32> = WorkQueue::builder()
        .starvation_bound(Duration::ZERO)
        .build();
    for (k, prio) in [(1, -1), (2, 5), (3, 0)] {
        q.add_with(k, AddOpts::default().priority(prio)).unwrap();
    }
    let order: Vec<i32> = [q.get().await, q.get().await, q.get().await]
        .into_iter()
        .map(|i| *i.unwrap())
        .collect();
    assert_eq!(order, [1, 2, 3]);
}

/// Fair share with the low keys as one tenant per ten keys and the flood as
/// ten tenants: fairness works within a priority, so across the two
/// priorities only the bound helps the low keys.
fn fair(b: Builder<Key>) -> Builder<Key, FairShare<Key, (bool, u32)>> {
    b.ordering(FairShare::new(|k: &Key| (k.0, k.1 % 10)))
}

#[tokio::test(start_paused = true)]
async fn with_the_bound_every_low_key_is_served_within_it_with_each_ordering() {
    let bound = Duration::from_millis(100);
    let runs = [
        (
            "two lanes",
            w5_with(Some(bound), |b| b.ordering(TwoLanes::new())).await,
        ),
        (
            "fifo",
            w5_with(Some(bound), |b| b.ordering(Fifo::new())).await,
        ),
        ("fair share", w5_with(Some(bound), fair).await),
    ];
    for (ordering, r) in runs {
        println!("W5 bound 100 ms, {ordering}: {r:?}");
        assert_eq!(r.low_served, 100, "{ordering}: {r:?}");
        assert!(r.longest_low_wait <= bound + ITEM, "{ordering}: {r:?}");
        assert!(r.high_share >= 0.9, "{ordering}: {r:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_the_bound_low_keys_starve_under_each_priority_ordering() {
    for (ordering, r) in [
        (
            "two lanes",
            w5_with(None, |b| b.ordering(TwoLanes::new())).await,
        ),
        ("fair share", w5_with(None, fair).await),
    ] {
        println!("W5 no bound, {ordering}: {r:?}");
        assert_eq!(r.low_served, 0, "{ordering}: strict priority: {r:?}");
        assert_eq!(r.handed_out, 40_000, "{ordering}: {r:?}");
    }
    // FIFO ignores priorities: the low keys, ready first, go first.
    let r = w5_with(None, |b| b.ordering(Fifo::new())).await;
    println!("W5 no bound, fifo: {r:?}");
    assert_eq!(r.low_served, 100, "fifo: {r:?}");
    assert!(r.longest_low_wait <= 100 * ITEM, "fifo: {r:?}");
}
