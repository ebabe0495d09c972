//! Semantics 1 and 2: keys come out in the order they became ready, and a key
//! added many times before it is taken is handed out once.

use tokio_workqueue::WorkQueue;

#[tokio::test]
async fn keys_come_out_in_the_order_they_became_ready() {
    let q = WorkQueue::new();
    for i in 0..100 {
        q.add(i).unwrap();
    }
    for i in 0..100 {
        let item = q.get().await.unwrap();
        assert_eq!(*item, i);
    }
    assert!(q.is_empty());
}

#[tokio::test]
async fn a_key_added_many_times_before_it_is_taken_is_handed_out_once() {
    let q = WorkQueue::new();
    for _ in 0..10 {
        q.add("a").unwrap();
        q.add("b").unwrap();
    }
    assert_eq!(q.len(), 2);
    let a = q.get().await.unwrap();
    let b = q.get().await.unwrap();
    assert_eq!((*a, *b), ("a", "b"));
    drop((a, b));
    q.shutdown();
    assert!(q.get().await.is_none(), "no second entry for either key");
}

#[tokio::test]
async fn a_re_added_ready_key_keeps_its_place() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    q.add(2).unwrap();
    q.add(1).unwrap();
    assert_eq!(*q.get().await.unwrap(), 1);
    assert_eq!(*q.get().await.unwrap(), 2);
}

#[tokio::test]
async fn len_counts_ready_keys_only() {
    let q = WorkQueue::new();
    q.add(1).unwrap();
    q.add(2).unwrap();
    let item = q.get().await.unwrap();
    assert_eq!(q.len(), 1, "the leased key is not counted");
    q.add(1).unwrap();
    assert_eq!(q.len(), 1, "nor is a leased key added again");
    drop(item);
    assert_eq!(q.len(), 2);
}
