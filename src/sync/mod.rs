//! The synchronisation primitives the queue is built on, swappable for loom's.
//!
//! Normal builds use the crate's own lock ([`lock`]: taken with a
//! compare-and-swap, released with a plain store) and tokio's `Notify` (for
//! drain waiters; consumers wait in the queue's own waiter table). Built
//! with `RUSTFLAGS="--cfg tokio_workqueue_loom"`, the mutex is loom's
//! (wrapped to keep `lock_api`'s API: `lock()` returns the guard, no
//! `Result`) and `Notify` is a small loom-based stand-in for tokio's, so
//! loom can explore every interleaving of adds, hand-outs, lease ends and
//! shutdowns (see
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
//! - The crate's lock itself, in the queue's models (loom's mutex, one
//!   step per lock and unlock, keeps their state space small): it has
//!   models of its own (`tests/loom_lock.rs`), in which a waiter yields
//!   where it would park.

pub(crate) use std::sync::Arc;

pub(crate) mod lock;

/// A pause in a loop that waits for another thread: a hint to the CPU, or
/// under loom a yield, so that the model schedules the other thread.
#[inline]
pub(crate) fn spin() {
    #[cfg(not(tokio_workqueue_loom))]
    std::hint::spin_loop();
    #[cfg(tokio_workqueue_loom)]
    loom::thread::yield_now();
}

/// Atomics: loom's under the loom cfg, so the models explore the shards'
/// marks and the sleeping-consumer count.
pub(crate) mod atomic {
    #[cfg(not(tokio_workqueue_loom))]
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };

    #[cfg(tokio_workqueue_loom)]
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
    };
}

#[cfg(not(tokio_workqueue_loom))]
pub(crate) use self::lock::{Mutex, MutexGuard};
#[cfg(not(tokio_workqueue_loom))]
pub(crate) use tokio::sync::Notify;

#[cfg(tokio_workqueue_loom)]
pub(crate) use self::loom_impl::{Mutex, Notify};
#[cfg(tokio_workqueue_loom)]
pub(crate) use loom::sync::MutexGuard;

#[cfg(tokio_workqueue_loom)]
mod loom_impl {
    use std::collections::VecDeque;
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// loom's mutex with `lock_api`'s API.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().expect("a poisoned lock")
        }

        pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().expect("a poisoned lock")
        }
    }

    impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex { .. }")
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
        inner: Mutex<Inner>,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Notify {
                inner: Mutex::new(Inner::default()),
            }
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            let generation = self.inner.lock().generation;
            Notified {
                notify: self,
                state: State::Init { generation },
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

    /// The future of [`Notify::notified`].
    #[derive(Debug)]
    pub(crate) struct Notified<'a> {
        notify: &'a Notify,
        state: State,
    }

    impl Notified<'_> {
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

    impl Future for Notified<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.get_mut().register(Some(cx.waker())) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl Drop for Notified<'_> {
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
