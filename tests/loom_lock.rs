//! loom models of the lock behind the queue's shards, lanes and waiter
//! table (`src/sync/lock.rs`): taken with a compare-and-swap, released with a
//! plain store.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg tokio_workqueue_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_lock
//! ```
//!
//! The value behind the lock is a loom cell, so loom fails a model in
//! which two holders touch it without the lock ordering them (a release
//! that did not publish the section's writes, or two holders at once).
//! loom cannot model the parking lot: under its cfg a waiter past its
//! looks yields to the model's other threads instead of parking, so these
//! models check exclusion, the order of the sections and progress, and
//! the unit tests in `src/sync/lock.rs` check parking and waking on real
//! threads. The queue's own models (`tests/loom_queue.rs`) use loom's
//! mutex in the lock's place, which keeps their state space small.
#![cfg(tokio_workqueue_loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use tokio_workqueue::__loom::{Mutex, new_mutex};

/// Adds one to the value behind the lock, read and written apart: a
/// second holder between the two would lose an update, and loom sees the
/// unordered accesses first.
fn add_one(m: &Mutex<UnsafeCell<u32>>) {
    let g = m.lock();
    let v = g.with(|p| unsafe { *p });
    g.with_mut(|p| unsafe { *p = v + 1 });
}

/// Two threads, each taking the lock `times` times to add one: the total
/// shows that no update was lost, and loom that no two sections overlapped.
fn two_threads_adding(times: u32) {
    loom::model(move || {
        let m = Arc::new(new_mutex(UnsafeCell::new(0u32)));
        let other = {
            let m = m.clone();
            thread::spawn(move || (0..times).for_each(|_| add_one(&m)))
        };
        (0..times).for_each(|_| add_one(&m));
        other.join().unwrap();
        assert_eq!(m.lock().with(|p| unsafe { *p }), 2 * times);
    });
}

#[test]
fn two_holders_never_overlap_and_see_each_others_writes() {
    two_threads_adding(1);
}

/// Each holder twice, so that a lock is taken again after its own
/// release, and by the other thread between (two threads: a waiter under
/// loom yields in a loop, and with a third the model outgrows loom's
/// branch limit; `src/sync/lock.rs`'s unit test runs four real threads).
#[test]
fn holders_taking_it_again_never_overlap() {
    two_threads_adding(2);
}

/// A `try_lock` fails while the lock is held and takes nothing; once the
/// holder has released, it succeeds and sees the holder's write.
#[test]
fn a_try_lock_takes_only_a_free_lock() {
    loom::model(|| {
        let m = Arc::new(new_mutex(UnsafeCell::new(0u32)));
        let holder = {
            let m = m.clone();
            thread::spawn(move || {
                let g = m.lock();
                g.with_mut(|p| unsafe { *p = 7 });
            })
        };
        if let Some(g) = m.try_lock() {
            // Before the holder's section or after it, never inside it.
            let v = g.with(|p| unsafe { *p });
            assert!(v == 0 || v == 7);
        }
        holder.join().unwrap();
        let g = m.try_lock().expect("free once the holder is done");
        assert_eq!(g.with(|p| unsafe { *p }), 7);
    });
}
