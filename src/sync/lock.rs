//! The lock the shards, the lanes' ends and the waiter table sit behind:
//! taken with one compare-and-swap, and released with a plain store.
//!
//! Every add, hand-out and lease end takes two or three of these locks
//! for a few dozen instructions each. On x86 a locked instruction (a
//! compare-and-swap, a swap) does not complete until every earlier store
//! of its core has left the store buffer, and a critical section's stores
//! (a node, an index entry, a lane's slot) often miss the cache. A
//! `parking_lot` mutex is released with a compare-and-swap, because its
//! releaser must learn, in the same step, whether a waiter has parked; so
//! each section ended waiting for its own stores to drain (on the Intel
//! VMs of `PERFORMANCE.md`, 86% of the lease end's release samples sat on
//! that instruction). Here the release is a store, which x86 orders after
//! the section's stores without waiting for them, followed by a plain
//! load of whether anyone parked.
//!
//! That load can be answered before the store is seen by other cores (x86
//! lets a load pass an earlier store), so a releaser can miss a waiter
//! that parked in that instant. Rather than fence every release, a parked
//! waiter sleeps at most [`PARK_TIMEOUT`] before it looks again: a missed
//! wake-up costs that waiter a millisecond, and happens only to a waiter
//! that has parked, after about a microsecond of looks and a few hundred
//! yields of its CPU (see [`RawLock::lock`]), which the short sections of
//! the queue seldom make anyone do. A waiter that parks raises the flag
//! under the parking lot's bucket lock, and a releaser that sees it wakes
//! one waiter and lowers the flag there too when none is left, so a lock
//! nobody waits for costs its releaser one load of a line it holds.
//!
//! The parking itself is `parking_lot_core`'s (a table of parked threads
//! keyed by address), and the guard and the `Mutex` type are `lock_api`'s,
//! the crates `parking_lot` is built from; only the lock word is this
//! crate's. No poisoning, as with `parking_lot`: a panic in a section
//! releases the lock as the guard unwinds.

use lock_api::RawMutex as _;

use super::atomic::{AtomicBool, Ordering::*};

/// A value behind a [`RawLock`].
pub type Mutex<T> = lock_api::Mutex<RawLock, T>;
/// A [`Mutex`] held.
#[cfg_attr(tokio_workqueue_loom, allow(dead_code))] // the queue's models use loom's
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawLock, T>;

/// How often a waiter looks at the lock, with a pause between looks,
/// before it yields: about a microsecond on the VMs of `PERFORMANCE.md`,
/// longer than the queue's sections take.
#[cfg(not(tokio_workqueue_loom))]
const SPINS: u32 = 64;
/// None under loom: a look that fails and then waits is the same to the
/// model as a wait, and every look would be one more branch to explore.
#[cfg(tokio_workqueue_loom)]
const SPINS: u32 = 0;

/// How often a waiter gives its CPU up, and looks again, before it parks:
/// about 75 µs of `sched_yield` on the VMs of `PERFORMANCE.md`.
///
/// A holder that an interrupt or the scheduler stopped holds the lock for
/// tens of microseconds, a few hundred times in W1's million keys; a
/// waiter that parks at once (as `parking_lot`'s does after 7 yields)
/// costs a futex wait, and its waker a futex wake, while yielding lets a
/// holder stopped on the waiter's own CPU run (`PERFORMANCE.md`, "Waiting
/// for a shard's lock": W1's futex calls 0.85 to 0.28 per 1,000 keys).
#[cfg(not(tokio_workqueue_loom))]
const YIELDS: u32 = 256;
/// None under loom, whose threads only run when the model schedules them.
#[cfg(tokio_workqueue_loom)]
const YIELDS: u32 = 0;

/// The longest a parked waiter sleeps before it looks at the lock again:
/// what a wake-up missed by a releaser (see the [module docs](self)) can
/// cost. Longer in the unit tests, so that a test of the wake-up fails
/// rather than pass on the timeout.
#[cfg(all(not(test), not(tokio_workqueue_loom)))]
const PARK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1);
#[cfg(all(test, not(tokio_workqueue_loom)))]
const PARK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The lock word: whether the lock is held, and whether a waiter may be
/// parked on it (see the [module docs](self)).
pub struct RawLock {
    locked: AtomicBool,
    parked: AtomicBool,
}

// SAFETY: `try_lock` sets `locked` from false with an acquire
// compare-and-swap, so one thread at a time holds the lock, and `unlock`
// clears it with a release store, so the next holder sees the last one's
// writes.
unsafe impl lock_api::RawMutex for RawLock {
    #[allow(clippy::declare_interior_mutable_const)] // the lock's initial state, copied
    #[cfg(not(tokio_workqueue_loom))]
    const INIT: RawLock = RawLock {
        locked: AtomicBool::new(false),
        parked: AtomicBool::new(false),
    };
    // loom's atomics are not const-constructible: a loom build never uses
    // this constant (`Mutex::new` does not need it), and makes it a panic.
    #[allow(clippy::declare_interior_mutable_const)]
    #[cfg(tokio_workqueue_loom)]
    const INIT: RawLock = panic!("no const lock under loom");

    type GuardMarker = lock_api::GuardSend;

    /// Takes the lock: looks at it for about a microsecond, then yields the
    /// CPU a few hundred times, and only then parks, until it is free.
    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.locked
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.locked.store(false, Release);
        if self.parked.load(Relaxed) {
            self.wake_one();
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.locked.load(Relaxed)
    }
}

impl RawLock {
    /// A fresh lock, not held (loom's atomics cannot be made in a
    /// constant, so [`Mutex::new`](lock_api::Mutex::new) is not available
    /// under loom; [`new_mutex`] is, in both builds).
    #[cfg(any(test, tokio_workqueue_loom))]
    fn new() -> Self {
        RawLock {
            locked: AtomicBool::new(false),
            parked: AtomicBool::new(false),
        }
    }

    #[cold]
    #[inline(never)]
    // Under loom both counts are zero.
    #[cfg_attr(tokio_workqueue_loom, allow(clippy::absurd_extreme_comparisons))]
    fn lock_slow(&self) {
        let mut round = 0u32;
        loop {
            // Looking before trying keeps waiters from taking the line
            // from the holder only to find the lock held.
            if !self.locked.load(Relaxed) && self.try_lock() {
                return;
            }
            if round < SPINS {
                super::spin();
                round += 1;
            } else if round < SPINS + YIELDS {
                #[cfg(not(tokio_workqueue_loom))]
                std::thread::yield_now();
                round += 1;
            } else {
                self.park();
            }
        }
    }

    /// The parking lot's key for this lock: its address.
    #[cfg(not(tokio_workqueue_loom))]
    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Sleeps until a releaser wakes this thread, or [`PARK_TIMEOUT`]
    /// passes, unless the lock is free already.
    #[cfg(not(tokio_workqueue_loom))]
    fn park(&self) {
        let deadline = std::time::Instant::now() + PARK_TIMEOUT;
        // SAFETY: the key is this lock's address, which no other kind of
        // parked thread uses; the closures neither panic nor park.
        unsafe {
            parking_lot_core::park(
                self.key(),
                || {
                    // Under the bucket's lock, which every waker takes:
                    // a releaser that sees the lock held by then sees
                    // the flag, but for the reordering the module docs
                    // describe, which the fence closes on this side.
                    self.parked.store(true, Relaxed);
                    super::atomic::fence(SeqCst);
                    self.locked.load(Relaxed)
                },
                || {},
                |_, last| {
                    if last {
                        self.parked.store(false, Relaxed);
                    }
                },
                parking_lot_core::DEFAULT_PARK_TOKEN,
                Some(deadline),
            );
        }
    }

    /// Under loom, which cannot model the parking lot: gives the model's
    /// other threads a turn instead, so that the holder runs.
    #[cfg(tokio_workqueue_loom)]
    fn park(&self) {
        loom::thread::yield_now();
    }

    /// Wakes one parked waiter, and lowers the flag if it was the last.
    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        #[cfg(not(tokio_workqueue_loom))]
        // SAFETY: as in `park`; the callback runs under the bucket's lock.
        unsafe {
            parking_lot_core::unpark_one(self.key(), |result| {
                if !result.have_more_threads {
                    self.parked.store(false, Relaxed);
                }
                parking_lot_core::DEFAULT_UNPARK_TOKEN
            });
        }
        #[cfg(tokio_workqueue_loom)]
        self.parked.store(false, Relaxed);
    }
}

/// `value` behind a fresh lock, in the builds that cannot use
/// [`Mutex::new`](lock_api::Mutex::new) (loom's) and the tests beside them.
#[cfg(any(test, tokio_workqueue_loom))]
pub fn new_mutex<T>(value: T) -> Mutex<T> {
    lock_api::Mutex::from_raw(RawLock::new(), value)
}

#[cfg(all(test, not(tokio_workqueue_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    #[test]
    fn threads_adding_under_the_lock_lose_no_update() {
        let m = Arc::new(new_mutex(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        // A read and a write apart: a second holder
                        // between them would lose an update.
                        let mut g = m.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 200_000);
    }

    /// A waiter past its looks and yields parks, and the release wakes it:
    /// it gets the lock well before its park would have timed out (2 s in
    /// the tests).
    #[test]
    fn a_parked_waiter_is_woken_by_the_release() {
        let m = Arc::new(new_mutex(()));
        let got = Arc::new(AtomicUsize::new(0));
        let held = m.lock();
        let waiter = {
            let (m, got) = (m.clone(), got.clone());
            std::thread::spawn(move || {
                let _g = m.lock();
                got.store(1, SeqCst);
            })
        };
        // The waiter shows it parked by raising the flag.
        let start = Instant::now();
        while !unsafe { m.raw() }.parked.load(Relaxed) {
            assert!(start.elapsed() < Duration::from_secs(10), "never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got.load(SeqCst), 0, "took a held lock");
        let released = Instant::now();
        drop(held);
        waiter.join().unwrap();
        assert_eq!(got.load(SeqCst), 1);
        assert!(
            released.elapsed() < PARK_TIMEOUT / 2,
            "woken by its timeout, not the release: {:?}",
            released.elapsed()
        );
        assert!(!unsafe { m.raw() }.parked.load(Relaxed), "flag left up");
    }

    /// A release that misses a parked waiter costs it at most the timeout:
    /// a waiter parked with the flag lowered behind its back (as a missed
    /// wake-up leaves it) still gets the lock once it is free.
    #[test]
    fn a_missed_wake_up_is_bounded_by_the_timeout() {
        let m = Arc::new(new_mutex(()));
        let held = m.lock();
        let waiter = {
            let m = m.clone();
            std::thread::spawn(move || drop(m.lock()))
        };
        let raw = unsafe { m.raw() };
        let start = Instant::now();
        while !raw.parked.load(Relaxed) {
            assert!(start.elapsed() < Duration::from_secs(10), "never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
        raw.parked.store(false, Relaxed);
        drop(held);
        waiter.join().unwrap();
        assert!(m.try_lock().is_some());
    }

    #[test]
    fn a_panic_in_a_section_releases_the_lock() {
        let m = Arc::new(new_mutex(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("in the section");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*m.try_lock().expect("released"), 1);
    }
}
