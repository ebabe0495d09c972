//! Semantic 8: shutdown refuses adds, still hands out ready keys, and drain
//! waits for queued keys as well as leased ones.

use std::time::Duration;

use tokio_test::{assert_pending, assert_ready, task};
use tokio_workqueue::{AddError, AddOpts, WorkQueue};

#[tokio::test]
async fn adds_after_shutdown_are_refused_and_the_caller_can_tell() {
    let q = WorkQueue::new();
    q.shutdown();
    assert!(q.is_shutting_down());
    assert_eq!(q.add(1), Err(AddError::ShuttingDown));
    assert_eq!(
        q.add_after(1, Duration::from_secs(1)),
        Err(AddError::ShuttingDown)
    );
    assert_eq!(q.add_rate_limited(1), Err(AddError::ShuttingDown));
    assert_eq!(
        q.add_with(1, AddOpts::default().priority(5)),
        Err(AddError::ShuttingDown)
    );
    assert_eq!(
        q.num_requeues(&1),
        0,
        "a refused rate-limited add records no failure"
    );
    assert!(q.get().await.is_none());
}

#[tokio::test]
async fn ready_keys_are_still_handed_out_after_shutdown() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    q.add(2).unwrap();
    q.shutdown();
    assert_eq!(*q.get().await.unwrap(), 1);
    assert_eq!(*q.get().await.unwrap(), 2);
    assert!(q.get().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn shutdown_drops_delayed_keys() {
    let q = WorkQueue::new();
    q.add_after(1, Duration::from_secs(1)).unwrap();
    q.shutdown();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(q.get().await.is_none());
    assert_eq!(q.snapshot().waiting, 0);
}

#[tokio::test]
async fn parked_consumers_end_at_shutdown() {
    let q: WorkQueue<u8> = WorkQueue::new();
    let mut get = task::spawn(q.get());
    assert_pending!(get.poll());
    q.shutdown();
    assert!(get.is_woken());
    assert!(assert_ready!(get.poll()).is_none());
}

#[tokio::test]
async fn drain_waits_for_queued_keys_not_only_leased_ones() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    q.add(2).unwrap();
    let mut drain = task::spawn(q.shutdown_with_drain());
    assert_pending!(drain.poll());
    let one = q.get().await.unwrap();
    drop(one);
    assert_pending!(drain.poll(), "key 2 is still queued");
    let two = q.get().await.unwrap();
    assert_pending!(drain.poll(), "key 2 is still leased");
    drop(two);
    assert!(drain.is_woken());
    assert_ready!(drain.poll());
}

#[tokio::test]
async fn a_re_add_accepted_during_a_lease_is_still_handed_out_after_shutdown() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    let item = q.get().await.unwrap();
    q.add(1).unwrap();
    let mut drain = task::spawn(q.shutdown_with_drain());
    let mut next = task::spawn(q.get());
    assert_pending!(next.poll(), "the dirty key is owed: the consumer must wait");
    drop(item);
    assert!(next.is_woken());
    let again = assert_ready!(next.poll()).unwrap();
    assert_eq!(*again, 1);
    assert_pending!(drain.poll());
    drop(again);
    assert_ready!(drain.poll());
    assert!(q.get().await.is_none());
}

#[tokio::test]
async fn requeue_after_shutdown_is_refused_but_the_lease_ends() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    let item = q.get().await.unwrap();
    let mut drain = task::spawn(q.shutdown_with_drain());
    assert_pending!(drain.poll());
    assert_eq!(item.requeue(), Err(AddError::ShuttingDown));
    assert_ready!(drain.poll());
}

#[tokio::test]
async fn drain_on_an_empty_queue_returns_at_once() {
    let q: WorkQueue<u8> = WorkQueue::new();
    q.shutdown_with_drain().await;
    q.shutdown_with_drain().await;
}

#[tokio::test]
async fn closed_resolves_at_shutdown() {
    let q: WorkQueue<u8> = WorkQueue::new();
    let mut closed = task::spawn(q.closed());
    assert_pending!(closed.poll());
    q.add(1).unwrap();
    assert_pending!(closed.poll(), "adds do not close it");
    q.shutdown();
    assert!(closed.is_woken());
    assert_ready!(closed.poll());
    q.closed().await; // already shut down: at once
}
