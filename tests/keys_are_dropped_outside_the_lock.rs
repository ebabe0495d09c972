//! A key the queue lets go of is dropped after the lock it was kept under is
//! released: the copy an add brings of a key the queue holds already (a
//! merge), a key whose lease ends, a delayed key a shutdown drops, and the
//! rate limiter's copy of a key it forgets. A key's drop can take long (a
//! last reference to a large value), and every other thread would wait for
//! it; a drop that calls back into the queue would deadlock. The keys here
//! call `len()` (every shard's lock) and `num_requeues` (the limiter's) as
//! they are dropped, so a drop under either lock hangs the thread, and the
//! test fails on its deadline instead of hanging with it.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_workqueue::WorkQueue;

/// A key that looks at its queue when it is dropped.
#[derive(Clone)]
struct Reentrant {
    name: &'static str,
    queue: Arc<OnceLock<WorkQueue<Reentrant>>>,
    drops: Arc<AtomicUsize>,
}

impl PartialEq for Reentrant {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for Reentrant {}
impl Hash for Reentrant {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl Drop for Reentrant {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.get() {
            // Take every shard's lock and the rate limiter's: either hangs
            // if this thread holds it.
            let _ = queue.len();
            let _ = queue.num_requeues(self);
        }
        self.drops.fetch_add(1, SeqCst);
    }
}

/// Runs `scenario` on a thread of its own and fails if it has not finished
/// within the deadline (a drop under a lock never finishes); a scenario
/// that fails on its own passes its panic on.
fn finishes(scenario: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        scenario();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(10)) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("a key was dropped while a lock was held: the thread hangs")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[test]
fn merged_released_forgotten_and_shut_down_keys_are_dropped_outside_the_lock() {
    finishes(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let queue = Arc::new(OnceLock::new());
            let drops = Arc::new(AtomicUsize::new(0));
            let key = || Reentrant {
                name: "a",
                queue: queue.clone(),
                drops: drops.clone(),
            };
            let q = queue.get_or_init(WorkQueue::new).clone();

            q.add(key()).unwrap();
            // Merges into the ready key: the new copy is dropped.
            q.add(key()).unwrap();
            assert_eq!(drops.load(SeqCst), 1);

            let item = q.get().await.unwrap();
            // Merges into the leased key (it goes dirty): dropped again.
            q.add(key()).unwrap();
            assert_eq!(drops.load(SeqCst), 2);
            // A dirty key stays queued at its lease end: nothing dropped.
            drop(item);
            assert_eq!(drops.load(SeqCst), 2);
            assert_eq!(q.len(), 1);

            // This lease ends clean: the queue lets go of the key.
            drop(q.get().await.unwrap());
            assert_eq!(drops.load(SeqCst), 3);
            assert!(q.is_empty());

            // A rate-limited add: the limiter keeps a copy of the key (the
            // queue's waits on its backoff) until it forgets the key.
            q.add_rate_limited(key()).unwrap();
            assert_eq!(q.num_requeues(&key()), 1);
            assert_eq!(drops.load(SeqCst), 4, "the key asked about");
            q.forget(&key());
            assert_eq!(
                drops.load(SeqCst),
                6,
                "the key asked about, the limiter's copy"
            );

            // A shutdown drops the delays still pending, and their keys.
            q.shutdown();
            assert_eq!(drops.load(SeqCst), 7);
        });
    });
}
