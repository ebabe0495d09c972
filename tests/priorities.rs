//! Semantics 4 and 6: priorities and lanes.

use std::time::Duration;

use tokio::time::advance;
use tokio_workqueue::{AddOpts, Lane, WorkQueue};

async fn drain_order<K: Clone + Eq + std::hash::Hash + Send + Sync + 'static>(
    q: &WorkQueue<K>,
) -> Vec<(K, i32)> {
    let mut out = Vec::new();
    while !q.is_empty() {
        let item = q.get().await.unwrap();
        out.push((item.key().clone(), item.priority()));
    }
    out
}

fn p(n: i32) -> AddOpts {
    AddOpts::default().priority(n)
}

#[tokio::test]
async fn higher_priority_first_fifo_within_a_priority() {
    let q = WorkQueue::new();
    q.add_with("a", p(0)).unwrap();
    q.add_with("b", p(10)).unwrap();
    q.add_with("c", p(-5)).unwrap();
    q.add_with("d", p(10)).unwrap();
    q.add_with("e", p(0)).unwrap();
    assert_eq!(
        drain_order(&q).await,
        [("b", 10), ("d", 10), ("a", 0), ("e", 0), ("c", -5)]
    );
}

#[tokio::test]
async fn a_raise_moves_the_key_to_the_back_of_its_new_level() {
    let q = WorkQueue::new();
    q.add_with("x", p(5)).unwrap();
    q.add_with("low", p(0)).unwrap();
    q.add_with("y", p(5)).unwrap();
    q.add_with("low", p(5)).unwrap();
    assert_eq!(drain_order(&q).await, [("x", 5), ("y", 5), ("low", 5)]);
}

#[tokio::test]
async fn a_lower_priority_never_lowers_a_key() {
    let q = WorkQueue::new();
    q.add_with("a", p(5)).unwrap();
    q.add_with("b", p(1)).unwrap();
    q.add_with("a", p(-100)).unwrap();
    q.add("a").unwrap();
    assert_eq!(drain_order(&q).await, [("a", 5), ("b", 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_delayed_key_takes_the_highest_priority_of_its_adds() {
    let q = WorkQueue::new();
    q.add_with("k", p(1).after(Duration::from_millis(10)))
        .unwrap();
    q.add_with("k", p(9).after(Duration::from_millis(20)))
        .unwrap();
    q.add_with("other", p(5)).unwrap();
    advance(Duration::from_millis(10)).await;
    for _ in 0..4 {
        tokio::task::yield_now().await; // let the timer task move the key
    }
    let first = q.get().await.unwrap();
    assert_eq!((*first, first.priority()), ("k", 9));
}

#[tokio::test]
async fn requeue_keeps_the_priority_it_was_handed_out_with() {
    let q = WorkQueue::new();
    q.add_with("k", p(3)).unwrap();
    q.add_with("other", p(2)).unwrap();
    let item = q.get().await.unwrap();
    item.requeue().unwrap();
    assert_eq!(drain_order(&q).await, [("k", 3), ("other", 2)]);
}

#[tokio::test]
async fn a_re_add_during_a_lease_comes_back_at_the_re_added_priority() {
    let q = WorkQueue::new();
    q.add_with("k", p(3)).unwrap();
    let item = q.get().await.unwrap();
    q.add_with("k", p(-1)).unwrap();
    q.add_with("other", p(0)).unwrap();
    drop(item);
    assert_eq!(drain_order(&q).await, [("other", 0), ("k", -1)]);
}

#[tokio::test]
async fn lanes_are_named_priorities_and_the_fast_lane_wins() {
    let q = WorkQueue::new();
    q.add_to_lane("resync", Lane::Slow).unwrap();
    q.add_to_lane("change", Lane::Fast).unwrap();
    q.add_with("bulk", AddOpts::default().lane(Lane::Slow))
        .unwrap();
    q.add_to_lane("bulk", Lane::Fast).unwrap(); // moves to the fast lane
    let order = drain_order(&q).await;
    assert_eq!(order, [("change", 0), ("bulk", 0), ("resync", -100)]);
    assert_eq!(Lane::from_priority(order[2].1), Lane::Slow);
    assert_eq!(Lane::from_priority(0), Lane::Fast);
}

#[tokio::test]
async fn extreme_priorities_are_ordered_too() {
    let q = WorkQueue::new();
    q.add_with(1, p(i32::MIN)).unwrap();
    q.add_with(2, p(i32::MAX)).unwrap();
    q.add_with(3, p(0)).unwrap();
    assert_eq!(
        drain_order(&q).await,
        [(2, i32::MAX), (3, 0), (1, i32::MIN)]
    );
}

#[tokio::test]
async fn many_distinct_priorities_keep_their_order() {
    let q = WorkQueue::new();
    for i in 0..100 {
        q.add_with(i, p((i * 37) % 50)).unwrap();
    }
    let order = drain_order(&q).await;
    assert!(
        order
            .windows(2)
            .all(|w| w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0))
    );
    assert_eq!(order.len(), 100);
}
