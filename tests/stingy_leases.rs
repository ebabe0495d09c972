//! Semantic 3: a key is never leased twice at once, and a key added during
//! its lease is processed once more after it, exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio_workqueue::WorkQueue;

/// Whether a `get` on `q` stays pending for 10 ms.
async fn nothing_handed_out<K: tokio_workqueue::Key>(q: &WorkQueue<K>) -> bool {
    tokio::time::timeout(Duration::from_millis(10), q.get())
        .await
        .is_err()
}

#[tokio::test]
async fn a_leased_key_is_not_handed_out_again_until_its_lease_ends() {
    let q = WorkQueue::new();
    q.add("k").unwrap();
    let first = q.get().await.unwrap();
    q.add("k").unwrap();
    q.add("k").unwrap();
    assert!(
        nothing_handed_out(&q).await,
        "a second consumer must not get the leased key"
    );
    drop(first);
    let second = q.get().await.unwrap();
    assert_eq!(*second, "k");
    drop(second);
    q.shutdown();
    assert!(q.get().await.is_none(), "re-added twice, processed once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn for_each_concurrent_processes_every_key_and_re_adds_exactly_once_more() {
    let q: WorkQueue<u32> = WorkQueue::new();
    let active: Arc<Mutex<HashMap<u32, u32>>> = Default::default();
    let runs: Arc<Mutex<HashMap<u32, u32>>> = Default::default();
    for k in 0..200 {
        q.add(k).unwrap();
    }
    // Counts finished runs, so the test shuts down only once every re-add
    // has been made (adds after shutdown would be refused).
    let (finished_tx, mut finished_rx) = tokio::sync::watch::channel(0u32);
    let worker = {
        let (q2, active, runs) = (q.clone(), active.clone(), runs.clone());
        tokio::spawn(q.clone().for_each_concurrent(8, move |item| {
            let (q, active, runs) = (q2.clone(), active.clone(), runs.clone());
            let finished_tx = finished_tx.clone();
            async move {
                let k = *item;
                {
                    let mut a = active.lock().unwrap();
                    let n = a.entry(k).or_default();
                    *n += 1;
                    assert_eq!(*n, 1, "key {k} leased twice at once");
                }
                let round = {
                    let mut r = runs.lock().unwrap();
                    let n = r.entry(k).or_default();
                    *n += 1;
                    *n
                };
                if round == 1 {
                    // Re-added three times during the lease: one more run.
                    for _ in 0..3 {
                        q.add(k).unwrap();
                    }
                }
                tokio::task::yield_now().await;
                *active.lock().unwrap().get_mut(&k).unwrap() -= 1;
                finished_tx.send_modify(|n| *n += 1);
            }
        }))
    };
    finished_rx.wait_for(|&n| n >= 200).await.unwrap();
    q.shutdown_with_drain().await;
    worker.await.unwrap();
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 200);
    assert!(runs.values().all(|&n| n == 2), "{runs:?}");
}

/// A lease outlives the handle that handed it out (its count is that
/// handle's, not the queue's): the key stays leased while it lives, its
/// requeue reaches the other handles, and once every handle is gone
/// its end still finishes it.
#[tokio::test]
async fn a_lease_outlives_the_handle_that_handed_it_out() {
    let q: WorkQueue<&str> = WorkQueue::new();
    let giver = q.clone();
    q.add("k").unwrap();
    let item = giver.get().await.unwrap();
    drop(giver);
    assert_eq!(q.snapshot().in_flight, 1);
    q.add("k").unwrap();
    assert!(
        nothing_handed_out(&q).await,
        "still leased after its handle went"
    );
    item.requeue().unwrap();
    let again = q.get().await.unwrap();
    assert_eq!(*again, "k");
    // The last handle goes while a lease lives: the queue lives on in the
    // lease, whose requeue is taken.
    drop(q);
    assert_eq!(again.requeue(), Ok(()));
}
