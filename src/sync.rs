//! The synchronisation primitives the queue is built on, swappable for loom's.
//!
//! Normal builds use `parking_lot`'s mutex and tokio's `Notify`. Built with
//! `RUSTFLAGS="--cfg tokio_workqueue_loom"`, the mutex is loom's (wrapped to
//! keep `parking_lot`'s API: `lock()` returns the guard, no `Result`) and
//! `Notify` is a small loom-based stand-in for tokio's, so loom can explore
//! every interleaving of adds, hand-outs, lease ends and shutdowns (see
//! `tests/loom_*.rs`). A crate-specific cfg is used rather than `cfg(loom)`
//! because tokio changes under `cfg(loom)` and would then need loom's
//! runtime everywhere.
//!
//! What loom does not see:
//! - `Arc` stays `std`'s in both builds: loom's `Arc` has no `Weak`, which
//!   the timer task and the metrics probe need. Reference counting is not
//!   what the models check.
//! - Timers and the clock: the delay wheel (tokio-util's `DelayQueue`), the
//!   timer task and tokio's clock are not loom-aware, so the loom models use
//!   only immediate adds and requeues. Delays, the starvation bound and the
//!   throttle are covered by the property tests in `tests/model.rs` (paused
//!   tokio time) and the multi-threaded stress test and soak example instead.
//! - The rate limiters' own locks, which the models do not use.

pub(crate) use std::sync::Arc;

#[cfg(not(tokio_workqueue_loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(tokio_workqueue_loom))]
pub(crate) use tokio::sync::{Notify, futures::OwnedNotified};

#[cfg(tokio_workqueue_loom)]
pub(crate) use self::loom_impl::{Mutex, MutexGuard, Notify, OwnedNotified};

#[cfg(tokio_workqueue_loom)]
mod loom_impl {
    use std::collections::VecDeque;
    use std::fmt;
    use std::future::Future;
    use std::ops::Deref;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// A lock with `parking_lot`'s API, made of a loom atomic: `try_lock`
    /// a compare-and-swap that can fail, release a store, `lock` waiting on
    /// a loom condition variable between tries (loom could not explore a
    /// spin to the end).
    ///
    /// loom's own mutex blocks every thread whose next operation is on a
    /// held mutex, `try_lock` included, so a `try_lock` that fails would go
    /// unexplored with it (an earlier intake of this crate was reached only
    /// through one); this one keeps the models honest if one is used again.
    pub(crate) struct Mutex<T> {
        locked: loom::sync::atomic::AtomicBool,
        data: loom::cell::UnsafeCell<T>,
        /// Taken by a waiting `lock` to check `locked` and wait, and by a
        /// release between its store and its notification, so that no
        /// release is missed.
        gate: loom::sync::Mutex<()>,
        released: loom::sync::Condvar,
    }

    // SAFETY: the data is only reached through a guard, and a guard exists
    // only while `locked` is held by its thread, as with any mutex.
    unsafe impl<T: Send> Send for Mutex<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Sync for Mutex<T> {}

    /// The lock held; released on drop.
    pub(crate) struct MutexGuard<'a, T> {
        lock: &'a Mutex<T>,
        /// `None` only while dropping: loom's record of the access must end
        /// before the lock is released.
        data: Option<loom::cell::MutPtr<T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex {
                locked: loom::sync::atomic::AtomicBool::new(false),
                data: loom::cell::UnsafeCell::new(value),
                gate: loom::sync::Mutex::new(()),
                released: loom::sync::Condvar::new(),
            }
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            loop {
                if let Some(guard) = self.try_lock() {
                    return guard;
                }
                let gate = self.gate.lock().expect("a poisoned lock");
                if self.locked.load(loom::sync::atomic::Ordering::Relaxed) {
                    drop(self.released.wait(gate).expect("a poisoned lock"));
                }
            }
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            use loom::sync::atomic::Ordering::{Acquire, Relaxed};
            self.locked
                .compare_exchange(false, true, Acquire, Relaxed)
                .ok()
                .map(|_| MutexGuard {
                    lock: self,
                    data: Some(self.data.get_mut()),
                })
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            // SAFETY: `&mut self`: no guard exists, nothing else reaches
            // the data.
            unsafe { &mut *self.data.with_mut(|p| p) }
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            // SAFETY: the guard holds the lock.
            unsafe { self.data.as_ref().expect("held").deref() }
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: the guard holds the lock, and `&mut self` the guard.
            unsafe { self.data.as_ref().expect("held").deref() }
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            drop(self.data.take());
            self.lock
                .locked
                .store(false, loom::sync::atomic::Ordering::Release);
            drop(self.lock.gate.lock().expect("a poisoned lock"));
            self.lock.released.notify_all();
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex { .. }")
        }
    }

    /// loom's own mutex, for the `Notify` stand-in's bookkeeping: its
    /// `try_lock` is never used, and blocking is cheaper to explore than
    /// the spinning of [`Mutex`].
    #[derive(Debug)]
    struct NotifyLock<T>(loom::sync::Mutex<T>);

    impl<T> NotifyLock<T> {
        fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().expect("a poisoned lock")
        }
    }

    /// How a waiter was notified.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        One,
        All,
    }

    #[derive(Debug)]
    struct Waiter {
        id: u64,
        waker: Option<Waker>,
        notified: Option<Kind>,
    }

    #[derive(Debug, Default)]
    struct Inner {
        /// A `notify_one` that found no waiter, kept for the next one.
        permit: bool,
        /// Calls to `notify_waiters` so far.
        generation: u64,
        next_id: u64,
        /// Registered waiters, oldest first.
        waiters: VecDeque<Waiter>,
    }

    impl Inner {
        /// Notifies the oldest waiter not yet notified, or stores a permit.
        fn notify_one(&mut self) -> Option<Waker> {
            match self.waiters.iter_mut().find(|w| w.notified.is_none()) {
                Some(w) => {
                    w.notified = Some(Kind::One);
                    w.waker.take()
                }
                None => {
                    self.permit = true;
                    None
                }
            }
        }
    }

    /// The part of `tokio::sync::Notify` the queue uses, on loom.
    ///
    /// As tokio's: `notify_one` wakes the oldest waiter or stores one permit;
    /// `notify_waiters` wakes every waiter registered (or created) before it
    /// and stores nothing; a `Notified` dropped after `notify_one` picked it
    /// but before it completed passes the notification on.
    #[derive(Debug)]
    pub(crate) struct Notify {
        inner: NotifyLock<Inner>,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Notify {
                inner: NotifyLock(loom::sync::Mutex::new(Inner::default())),
            }
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            let generation = self.inner.lock().generation;
            NotifiedBy {
                notify: self,
                state: State::Init { generation },
            }
        }

        pub(crate) fn notified_owned(self: std::sync::Arc<Self>) -> OwnedNotified {
            let generation = self.inner.lock().generation;
            NotifiedBy {
                notify: self,
                state: State::Init { generation },
            }
        }

        pub(crate) fn notify_one(&self) {
            let waker = self.inner.lock().notify_one();
            if let Some(w) = waker {
                w.wake();
            }
        }

        pub(crate) fn notify_waiters(&self) {
            let mut wakers = Vec::new();
            {
                let mut inner = self.inner.lock();
                inner.generation += 1;
                for w in inner.waiters.iter_mut() {
                    if w.notified.is_none() {
                        w.notified = Some(Kind::All);
                        wakers.extend(w.waker.take());
                    }
                }
            }
            for w in wakers {
                w.wake();
            }
        }
    }

    #[derive(Debug)]
    enum State {
        Init { generation: u64 },
        Waiting { id: u64 },
        Done,
    }

    /// The future of [`Notify::notified`] and [`Notify::notified_owned`].
    #[derive(Debug)]
    pub(crate) struct NotifiedBy<N: Deref<Target = Notify>> {
        notify: N,
        state: State,
    }

    /// [`Notify::notified`]'s future.
    pub(crate) type Notified<'a> = NotifiedBy<&'a Notify>;
    /// [`Notify::notified_owned`]'s future.
    pub(crate) type OwnedNotified = NotifiedBy<std::sync::Arc<Notify>>;

    impl<N: Deref<Target = Notify> + Unpin> NotifiedBy<N> {
        /// Registers as a waiter without waiting; true if already notified.
        pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
            self.get_mut().register(None)
        }

        fn register(&mut self, waker: Option<&Waker>) -> bool {
            let mut inner = self.notify.inner.lock();
            match self.state {
                State::Init { generation } => {
                    if inner.generation != generation || std::mem::take(&mut inner.permit) {
                        self.state = State::Done;
                        return true;
                    }
                    let id = inner.next_id;
                    inner.next_id += 1;
                    inner.waiters.push_back(Waiter {
                        id,
                        waker: waker.cloned(),
                        notified: None,
                    });
                    self.state = State::Waiting { id };
                    false
                }
                State::Waiting { id } => {
                    let i = inner
                        .waiters
                        .iter()
                        .position(|w| w.id == id)
                        .expect("a waiting Notified is registered");
                    if inner.waiters[i].notified.is_some() {
                        inner.waiters.remove(i);
                        self.state = State::Done;
                        return true;
                    }
                    if let Some(waker) = waker {
                        inner.waiters[i].waker = Some(waker.clone());
                    }
                    false
                }
                State::Done => true,
            }
        }
    }

    impl<N: Deref<Target = Notify> + Unpin> Future for NotifiedBy<N> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.get_mut().register(Some(cx.waker())) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl<N: Deref<Target = Notify>> Drop for NotifiedBy<N> {
        fn drop(&mut self) {
            let State::Waiting { id } = self.state else {
                return;
            };
            let waker = {
                let mut inner = self.notify.inner.lock();
                let i = inner
                    .waiters
                    .iter()
                    .position(|w| w.id == id)
                    .expect("a waiting Notified is registered");
                let w = inner.waiters.remove(i).expect("found above");
                // A notify_one this waiter took but never used goes on.
                if w.notified == Some(Kind::One) {
                    inner.notify_one()
                } else {
                    None
                }
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}
