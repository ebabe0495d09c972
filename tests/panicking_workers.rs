//! A worker that panics still ends its lease.

use futures::StreamExt;
use tokio_workqueue::WorkQueue;

#[tokio::test]
async fn a_panicking_worker_ends_its_lease() {
    let q = WorkQueue::new();
    q.add("boom").unwrap();
    let item = q.get().await.unwrap();
    let task = tokio::spawn(async move {
        let _item = item;
        panic!("reconcile failed");
    });
    assert!(task.await.unwrap_err().is_panic());
    q.add("boom").unwrap();
    assert_eq!(q.len(), 1, "the key is free to be handed out again");
    assert_eq!(*q.get().await.unwrap(), "boom");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_in_spawned_workers_do_not_stall_the_queue() {
    let q: WorkQueue<u32> = WorkQueue::new();
    for k in 0..100 {
        q.add(k).unwrap();
    }
    let consumer = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut done = 0;
            let mut stream = q;
            while let Some(item) = stream.next().await {
                let worker = tokio::spawn(async move {
                    if *item % 3 == 0 {
                        panic!("key {} failed", *item);
                    }
                });
                if worker.await.is_ok() {
                    done += 1;
                }
            }
            done
        })
    };
    q.shutdown_with_drain().await;
    assert_eq!(consumer.await.unwrap(), 66);
}
