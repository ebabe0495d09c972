//! Semantic 7: dropping a `get()` future or a stream at any point loses no key.

use futures::StreamExt;
use tokio_test::{assert_pending, assert_ready, task};
use tokio_workqueue::WorkQueue;

#[tokio::test]
async fn a_get_dropped_before_it_is_woken_loses_nothing() {
    let q = WorkQueue::new();
    let mut get = task::spawn(q.get());
    assert_pending!(get.poll());
    drop(get);
    q.add(1).unwrap();
    assert_eq!(*q.get().await.unwrap(), 1);
}

#[tokio::test]
async fn a_woken_get_that_is_dropped_passes_its_wake_up_on() {
    let q = WorkQueue::new();
    let mut first = task::spawn(q.get());
    let mut second = task::spawn(q.get());
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    q.add(7).unwrap();
    // One key, one wake-up: it went to the first parked consumer.
    assert!(first.is_woken());
    assert!(!second.is_woken());
    drop(first);
    assert!(second.is_woken(), "the dropped consumer's wake-up moves on");
    let item = assert_ready!(second.poll()).unwrap();
    assert_eq!(*item, 7);
}

#[tokio::test]
async fn one_wake_up_per_ready_key() {
    let q = WorkQueue::new();
    let mut gets: Vec<_> = (0..4).map(|_| task::spawn(q.get())).collect();
    for g in &mut gets {
        assert_pending!(g.poll());
    }
    q.add(1).unwrap();
    q.add(2).unwrap();
    let woken = gets.iter().filter(|g| g.is_woken()).count();
    assert_eq!(woken, 2, "no thundering herd");
}

#[tokio::test]
async fn a_stream_dropped_while_waiting_loses_nothing() {
    let q = WorkQueue::new();
    let mut stream = q.clone();
    {
        let mut next = task::spawn(stream.next());
        assert_pending!(next.poll());
    }
    drop(stream);
    q.add("k").unwrap();
    let mut other = q.clone();
    assert_eq!(*other.next().await.unwrap(), "k");
}

#[tokio::test]
async fn a_stream_polled_again_after_a_dropped_next_still_gets_the_key() {
    let q = WorkQueue::new();
    let mut stream = q.clone();
    {
        let mut next = task::spawn(stream.next());
        assert_pending!(next.poll());
    }
    q.add("k").unwrap();
    assert_eq!(*stream.next().await.unwrap(), "k");
}

#[tokio::test]
async fn a_dropped_item_ends_its_lease() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    let item = q.get().await.unwrap();
    q.add(1).unwrap();
    assert!(q.is_empty());
    drop(item);
    assert_eq!(q.len(), 1);
}
