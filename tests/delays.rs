//! Semantics 2 and 9 for delayed adds, on paused time.

use std::time::Duration;

use tokio::time::{Instant, advance};
use tokio_test::{assert_pending, assert_ready, task};
use tokio_workqueue::{AddError, AddOpts, MAX_DELAY, WorkQueue};

const MS: Duration = Duration::from_millis(1);

/// Lets the timer task run after the clock moved.
async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_key_is_ready_exactly_after_its_delay() {
    let q = WorkQueue::new();
    let start = Instant::now();
    q.add_after("k", 250 * MS).unwrap();
    assert!(q.is_empty());
    let item = q.get().await.unwrap();
    assert_eq!(start.elapsed(), 250 * MS);
    assert_eq!(*item, "k");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_key_keeps_the_earlier_ready_time() {
    let q = WorkQueue::new();
    let start = Instant::now();
    q.add_after("k", 100 * MS).unwrap();
    q.add_after("k", 500 * MS).unwrap(); // later: ignored
    q.add_after("k", 50 * MS).unwrap(); // earlier: wins
    let item = q.get().await.unwrap();
    assert_eq!(start.elapsed(), 50 * MS);
    drop(item);
    advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(q.is_empty(), "one entry, one hand-out");
    assert_eq!(q.snapshot().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn an_immediate_add_makes_a_waiting_key_ready_now_and_drops_its_timer() {
    let q = WorkQueue::new();
    q.add_after("k", Duration::from_secs(60)).unwrap();
    assert_eq!(q.snapshot().waiting, 1);
    q.add("k").unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q.snapshot().waiting, 0, "the timer is gone");
    drop(q.get().await.unwrap());
    advance(Duration::from_secs(61)).await;
    settle().await;
    assert!(q.is_empty(), "the old timer did not fire");
}

#[tokio::test(start_paused = true)]
async fn a_delayed_add_of_a_ready_key_leaves_it_ready_once() {
    let q = WorkQueue::new();
    q.add("k").unwrap();
    q.add_after("k", 10 * MS).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q.snapshot().waiting, 0);
    drop(q.get().await.unwrap());
    advance(20 * MS).await;
    settle().await;
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_delay_ending_during_a_lease_follows_the_stingy_rule() {
    let q = WorkQueue::new();
    q.add("k").unwrap();
    let item = q.get().await.unwrap();
    q.add_after("k", 10 * MS).unwrap();
    advance(20 * MS).await;
    settle().await;
    assert!(q.is_empty(), "not handed out while leased");
    drop(item);
    assert_eq!(q.len(), 1, "ready once the lease ends");
}

#[tokio::test(start_paused = true)]
async fn a_lease_ending_before_the_delay_leaves_the_key_waiting() {
    let q = WorkQueue::new();
    let start = Instant::now();
    q.add("k").unwrap();
    let item = q.get().await.unwrap();
    q.add_after("k", 100 * MS).unwrap();
    drop(item);
    assert!(q.is_empty());
    let again = q.get().await.unwrap();
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(*again, "k");
}

#[tokio::test(start_paused = true)]
async fn zero_delay_means_now_and_needs_no_timer() {
    let q = WorkQueue::new();
    q.add_after(1, Duration::ZERO).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q.snapshot().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn huge_delays_are_clamped_not_a_panic() {
    let q = WorkQueue::new();
    let start = Instant::now();
    q.add_after(1, Duration::MAX).unwrap();
    q.add_with(
        2,
        AddOpts::default().after(MAX_DELAY + Duration::from_secs(1)),
    )
    .unwrap();
    assert_eq!(q.snapshot().waiting, 2);
    let first = q.get().await.unwrap();
    assert_eq!(start.elapsed(), MAX_DELAY);
    assert_eq!(*first, 1);
}

#[tokio::test(start_paused = true)]
async fn delayed_keys_come_out_in_the_order_they_became_ready() {
    let q = WorkQueue::new();
    for (k, ms) in [(1, 30), (2, 10), (3, 20), (4, 10)] {
        q.add_after(k, ms * MS).unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(*q.get().await.unwrap());
    }
    assert_eq!(order, [2, 4, 3, 1]);
}

#[tokio::test(start_paused = true)]
async fn an_idle_queue_with_a_distant_key_does_nothing_until_then() {
    let q = WorkQueue::new();
    q.add_after("later", Duration::from_secs(3600)).unwrap();
    let mut get = task::spawn(q.get());
    assert_pending!(get.poll());
    advance(Duration::from_secs(3599)).await;
    settle().await;
    assert!(!get.is_woken(), "no wake-up before the deadline");
    advance(Duration::from_secs(1)).await;
    settle().await;
    assert!(get.is_woken());
    assert_eq!(*assert_ready!(get.poll()).unwrap(), "later");
}

#[tokio::test(start_paused = true)]
async fn requeue_after_brings_the_key_back_at_its_priority() {
    let q = WorkQueue::new();
    q.add_with("k", AddOpts::default().priority(7)).unwrap();
    let start = Instant::now();
    let item = q.get().await.unwrap();
    item.requeue_after(40 * MS).unwrap();
    let again = q.get().await.unwrap();
    assert_eq!(start.elapsed(), 40 * MS);
    assert_eq!(again.priority(), 7);
}

#[test]
fn a_delayed_add_outside_a_runtime_is_refused_and_says_why() {
    let q = WorkQueue::new();
    assert_eq!(
        q.add_after(1, Duration::from_secs(1)),
        Err(AddError::NoRuntime)
    );
    assert_eq!(q.add(1), Ok(()), "immediate adds need no runtime");
    assert_eq!(q.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_timer_task_ends_with_the_queue() {
    let q: WorkQueue<u32> = WorkQueue::new();
    q.add_after(1, Duration::from_secs(10)).unwrap();
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    assert_eq!(before, 1, "one timer task");
    drop(q);
    settle().await;
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_the_timer_task() {
    let q: WorkQueue<u32> = WorkQueue::new();
    for k in 0..1000 {
        q.add_after(k, Duration::from_secs(10)).unwrap();
    }
    q.shutdown();
    settle().await;
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        0
    );
    assert_eq!(q.snapshot().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn many_waiting_keys_fire_in_batches() {
    let q: WorkQueue<u32> = WorkQueue::new();
    for k in 0..10_000 {
        q.add_after(k, 5 * MS).unwrap();
    }
    advance(5 * MS).await;
    let mut seen = 0;
    while seen < 10_000 {
        let item = q.get().await.unwrap();
        assert_eq!(*item, seen, "FIFO by ready time, then insertion");
        seen += 1;
    }
}

#[test]
fn delays_outlive_the_runtime_that_timed_them() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let q = WorkQueue::new();
    paused().block_on(async {
        q.add_after("a", 10_000 * MS).unwrap();
        q.add_after("b", 3_600_000 * MS).unwrap();
        settle().await;
    });
    // That runtime, and the timer task it ran, are gone. The next delayed
    // add starts a task on this one, which must learn the two delays.
    paused().block_on(async {
        let start = Instant::now();
        q.add_after("c", 5_000 * MS).unwrap();
        let next = || tokio::time::timeout(20_000 * MS, q.get());
        assert_eq!(*next().await.expect("c is handed out").unwrap(), "c");
        assert_eq!(*next().await.expect("a is handed out").unwrap(), "a");
        // "a" was due 10 s after the first runtime's start, which came
        // before this one's: never later than 10 s from here.
        assert!(start.elapsed() <= 10_000 * MS, "{:?}", start.elapsed());
        assert!(q.is_empty());
        assert_eq!(q.snapshot().waiting, 1, "b still waits");
    });
}
