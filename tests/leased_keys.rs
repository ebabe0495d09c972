//! A lease reads its key where the queue keeps it, not a copy: the key must
//! stay there, unchanged, whatever the queue does until the lease ends.
//!
//! These tests drive what could move or free a leased key (its shard
//! growing by many keys, the key added again, other keys dropped at
//! shutdown, the queue emptied of every other key) and read the key after
//! each. A key moved or freed under a lease is undefined behaviour, which a
//! test cannot promise to catch; each key here owns heap memory that a free
//! would hand back for reuse, so a reused buffer shows up as a wrong key.
//! The address stability of the node storage itself is pinned by the unit
//! tests in `src/nodes.rs`.

use std::time::Duration;

use tokio_workqueue::{WorkItem, WorkQueue};

fn key(i: usize) -> String {
    format!("namespace-{}/object-{i}", i % 7)
}

/// A queue and a lease on its first key, `key(0)`.
async fn leased_first() -> (WorkQueue<String>, WorkItem<String>) {
    let q = WorkQueue::new();
    q.add(key(0)).unwrap();
    let item = q.get().await.unwrap();
    (q, item)
}

#[tokio::test]
async fn a_leased_key_stays_readable_while_the_queue_grows_around_it() {
    let (q, item) = leased_first().await;
    // Every shard grows through many chunks of nodes.
    for i in 1..50_000 {
        q.add(key(i)).unwrap();
    }
    assert_eq!(*item, key(0));
    // Added again while leased: the queue keeps its own key and drops this
    // one, and the lease still reads the first.
    q.add(key(0)).unwrap();
    assert_eq!(item.key(), &key(0));
    // Hand out and finish every other key: their nodes are freed and
    // reused by new keys.
    for _ in 1..50_000 {
        let other = q.get().await.unwrap();
        assert_ne!(*other, key(0), "a leased key handed out twice");
    }
    for i in 50_000..60_000 {
        q.add(key(i)).unwrap();
    }
    assert_eq!(*item, key(0));
    drop(item);
    // The re-add made during the lease brings the key back once.
    let mut seen = 0;
    while let Ok(Some(next)) = tokio::time::timeout(Duration::from_millis(50), q.get()).await {
        seen += usize::from(*next == key(0));
    }
    assert_eq!(seen, 1);
}

#[tokio::test]
async fn a_leased_key_stays_readable_through_a_shutdown_that_drops_the_rest() {
    let (q, item) = leased_first().await;
    for i in 1..5_000 {
        q.add_after(key(i), Duration::from_secs(60)).unwrap();
    }
    // The shutdown drops every waiting key; the leased one stays, as does
    // its lease.
    q.shutdown();
    let snapshot = q.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.waiting), (1, 0));
    assert_eq!(*item, key(0));
    assert_eq!(
        format!("{item:?}"),
        format!("WorkItem {{ key: {:?}, priority: 0, .. }}", key(0))
    );
    drop(item);
    assert_eq!(q.snapshot().in_flight, 0);
    assert!(q.get().await.is_none(), "shut down and drained");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_keys_read_right_while_other_threads_add_and_finish() {
    let q: WorkQueue<String> = WorkQueue::new();
    let n = 20_000;
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                for i in (p..n).step_by(2) {
                    q.add(key(i)).unwrap();
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(item) = q.get().await {
                    // The key must be one of the keys added, whole.
                    let i: usize = item
                        .rsplit_once("object-")
                        .and_then(|(_, i)| i.parse().ok())
                        .unwrap_or_else(|| panic!("a torn key: {:?}", &*item));
                    assert_eq!(*item, key(i));
                    tokio::task::yield_now().await;
                    assert_eq!(*item, key(i), "the key changed during its lease");
                    got.push(i);
                }
                got
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    q.shutdown_with_drain().await;
    let mut all = Vec::new();
    for c in consumers {
        all.extend(c.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>());
}
