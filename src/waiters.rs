//! The consumers waiting for a key, behind a small lock of their own.
//!
//! A consumer that finds nothing ready registers its waker here (see
//! `Shared` for how a key added meanwhile is not missed), and gets back a
//! [`WaiterId`]: a plain number, so the
//! wait it is in (a `get` future, or a [`WorkQueue`](crate::WorkQueue) polled
//! as a stream) holds no pinned or boxed part. Each key that becomes ready
//! notifies the longest-waiting consumer, one per key; a shutdown notifies
//! all of them. The lock holder picks whom to wake and carries their wakers
//! out in a [`WakeList`], so no task is woken under the lock.
//!
//! A notified consumer looks again at its next poll. One that is dropped
//! before it does passes its notification to the next waiting consumer (if
//! a key is ready), so a cancelled `get` loses no wake-up.

use std::collections::VecDeque;
use std::task::Waker;

/// A registered consumer: its slot in [`Waiters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId(u32);

#[derive(Debug)]
enum Slot {
    Free,
    Waiting(Waker),
    Notified,
}

/// What a registered consumer finds when it polls again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Not notified: still waiting (its waker is kept up to date).
    Waiting,
    /// Notified, and no longer registered.
    Notified,
}

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Waiting consumers, longest-waiting first.
    queue: VecDeque<u32>,
}

impl Waiters {
    /// Consumers waiting and not yet notified.
    pub(crate) fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Registers a consumer that found nothing ready.
    pub(crate) fn register(&mut self, waker: &Waker) -> WaiterId {
        let slot = Slot::Waiting(waker.clone());
        let id = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 waiting consumers")
            }
        };
        self.queue.push_back(id);
        WaiterId(id)
    }

    /// A registered consumer polls again: notified (then it is no longer
    /// registered), or still waiting, with `waker` kept for its wake-up.
    pub(crate) fn poll(&mut self, id: WaiterId, waker: &Waker) -> Found {
        match &mut self.slots[id.0 as usize] {
            Slot::Waiting(w) => {
                if !w.will_wake(waker) {
                    w.clone_from(waker);
                }
                Found::Waiting
            }
            Slot::Notified => {
                self.release(id);
                Found::Notified
            }
            Slot::Free => unreachable!("a waiter polled after it was released"),
        }
    }

    /// Unregisters a consumer that stops waiting (it found a key without
    /// being notified, or is dropped). Returns whether it had been notified,
    /// so that the caller can pass the notification on.
    pub(crate) fn cancel(&mut self, id: WaiterId) -> bool {
        let notified = matches!(self.slots[id.0 as usize], Slot::Notified);
        if !notified && let Some(at) = self.queue.iter().position(|&i| i == id.0) {
            self.queue.remove(at);
        }
        self.release(id);
        notified
    }

    fn release(&mut self, id: WaiterId) {
        self.slots[id.0 as usize] = Slot::Free;
        self.free.push(id.0);
    }

    /// Notifies up to `n` waiting consumers, longest-waiting first, putting
    /// their wakers in `wake`.
    pub(crate) fn notify(&mut self, n: u32, wake: &mut WakeList) {
        for _ in 0..n {
            let Some(i) = self.queue.pop_front() else {
                return;
            };
            match std::mem::replace(&mut self.slots[i as usize], Slot::Notified) {
                Slot::Waiting(w) => wake.push(w),
                other => unreachable!("a queued waiter in state {other:?}"),
            }
        }
    }

    /// Notifies every waiting consumer.
    pub(crate) fn notify_all(&mut self, wake: &mut WakeList) {
        self.notify(u32::try_from(self.queue.len()).unwrap_or(u32::MAX), wake);
    }
}

/// Wakers to wake once the lock is released: the first few inline, as one
/// lock round rarely wakes more than one consumer.
#[derive(Debug, Default)]
pub(crate) struct WakeList {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl WakeList {
    fn push(&mut self, waker: Waker) {
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.more.push(waker);
        }
    }

    /// Wakes every waker in the list.
    pub(crate) fn wake(self) {
        if let Some(w) = self.first {
            w.wake();
        }
        for w in self.more {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker counting its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn woken(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    #[test]
    fn each_key_notifies_the_longest_waiting_consumer() {
        let mut w = Waiters::default();
        let (ca, a) = counted();
        let (cb, b) = counted();
        let (ia, ib) = (w.register(&a), w.register(&b));
        let mut wake = WakeList::default();
        w.notify(1, &mut wake);
        wake.wake();
        assert_eq!((woken(&ca), woken(&cb)), (1, 0));
        assert_eq!(w.poll(ia, &a), Found::Notified);
        assert_eq!(w.poll(ib, &b), Found::Waiting);
        assert_eq!(w.waiting(), 1);
    }

    #[test]
    fn notifying_more_than_are_waiting_notifies_those_there_are() {
        let mut w = Waiters::default();
        let (c, a) = counted();
        w.register(&a);
        let mut wake = WakeList::default();
        w.notify(5, &mut wake);
        wake.wake();
        assert_eq!(woken(&c), 1);
        assert_eq!(w.waiting(), 0);
    }

    #[test]
    fn a_cancelled_waiter_says_whether_it_was_notified() {
        let mut w = Waiters::default();
        let (_, a) = counted();
        let (ia, ib) = (w.register(&a), w.register(&a));
        assert!(!w.cancel(ia));
        w.notify_all(&mut WakeList::default());
        assert!(w.cancel(ib));
        assert_eq!(w.waiting(), 0);
    }

    #[test]
    fn a_waiter_polled_with_a_new_waker_is_woken_through_it() {
        let mut w = Waiters::default();
        let (old, a) = counted();
        let (new, b) = counted();
        let id = w.register(&a);
        assert_eq!(w.poll(id, &b), Found::Waiting);
        let mut wake = WakeList::default();
        w.notify(1, &mut wake);
        wake.wake();
        assert_eq!((woken(&old), woken(&new)), (0, 1));
    }

    #[test]
    fn slots_are_reused() {
        let mut w = Waiters::default();
        let (_, a) = counted();
        let id = w.register(&a);
        w.cancel(id);
        assert_eq!(w.register(&a), id);
    }
}
