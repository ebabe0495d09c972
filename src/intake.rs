//! A lock-free intake of operations for whoever holds the queue's lock.
//!
//! An add or a lease end that finds the state's lock taken does not wait for
//! it: it pushes itself here and returns, and the lock holder applies it
//! before it releases the lock (see [`crate::shared`] for the handshake that
//! makes sure no pushed operation is left behind). Under contention the
//! producer and the consumers then never sleep on the lock, and a holder
//! applies a batch of operations while the state's cache lines are on its
//! core, instead of each operation pulling them over.
//!
//! The intake is a Treiber stack in one word: the address of the newest node,
//! with the low bit set once the queue is shut down. Pushing is one
//! compare-and-swap; the holder takes every node at once with one
//! `fetch_and` and reverses them, so operations are applied in the order
//! they were pushed. One word for both is what makes shutdown exact: an add
//! that may be refused pushes only with a compare-and-swap that saw the bit
//! clear, and shutdown sets it with an atomic read-modify-write of the same
//! word, so every add is ordered wholly before the shutdown (and then taken
//! by the shutdown's drain) or wholly after it (and refused).
//!
//! Nodes are boxed one by one: only operations that met contention pay for
//! an allocation. A taken node is never touched by another thread again, so
//! there is no ABA problem: pushers only ever link to the head they read,
//! and nothing else pops single nodes.

use crate::sync::atomic::{AtomicUsize, Ordering::*};

/// The bit set in the intake's word once the queue is shut down.
const CLOSED: usize = 1;

struct Node<T> {
    value: T,
    /// The node pushed before this one (its address), or 0.
    next: usize,
}

/// An unbounded multi-producer intake that one consumer (the lock holder)
/// empties all at once.
pub(crate) struct Intake<T> {
    /// `*mut Node<T>` as an address, or-ed with [`CLOSED`].
    head: AtomicUsize,
    _owns: std::marker::PhantomData<Box<Node<T>>>,
}

/// Whether a push should go ahead after a shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IfClosed {
    /// Push anyway: lease ends, which must happen whatever the state.
    Push,
    /// Hand the value back: adds, which a shut-down queue refuses.
    Refuse,
}

// SAFETY: the intake moves values of `T` between threads (pushed on one,
// taken on another), which is sound when `T: Send`; it never hands out
// shared references to them.
unsafe impl<T: Send> Send for Intake<T> {}
// SAFETY: as above: `&Intake` only lets a thread move a `T` in or out.
unsafe impl<T: Send> Sync for Intake<T> {}

impl<T> Intake<T> {
    pub(crate) fn new() -> Self {
        Intake {
            head: AtomicUsize::new(0),
            _owns: std::marker::PhantomData,
        }
    }

    /// Pushes `value`, unless the intake is closed and `if_closed` says to
    /// refuse: then `value` comes back. Release, so that the taker sees the
    /// value written.
    pub(crate) fn push(&self, value: T, if_closed: IfClosed) -> Result<(), T> {
        let mut head = self.head.load(Relaxed);
        if head & CLOSED != 0 && if_closed == IfClosed::Refuse {
            return Err(value);
        }
        let node = Box::into_raw(Box::new(Node { value, next: 0 }));
        // The address is turned back into a pointer by `take`, which needs
        // the provenance exposed.
        let addr = node.expose_provenance();
        debug_assert_eq!(addr & CLOSED, 0, "nodes are aligned");
        loop {
            if head & CLOSED != 0 && if_closed == IfClosed::Refuse {
                // SAFETY: the node was never published: it is still ours.
                let node = unsafe { Box::from_raw(node) };
                return Err(node.value);
            }
            // SAFETY: unpublished, so only this thread sees the node.
            unsafe { (*node).next = head & !CLOSED };
            match self
                .head
                .compare_exchange_weak(head, addr | (head & CLOSED), Release, Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => head = now,
            }
        }
    }

    /// Takes every value pushed so far, oldest first. Acquire, pairing with
    /// the pushes.
    pub(crate) fn take(&self) -> Taken<T> {
        // Keeps the closed bit; clears the list. A load first spares the
        // common empty case a write to a shared cache line.
        if self.head.load(Relaxed) & !CLOSED == 0 {
            return Taken {
                next: 0,
                _owns: std::marker::PhantomData,
            };
        }
        let mut list = self.head.fetch_and(CLOSED, Acquire) & !CLOSED;
        // Reverse: the stack holds the newest first.
        let mut reversed = 0;
        while list != 0 {
            let node: *mut Node<T> = std::ptr::with_exposed_provenance_mut(list);
            // SAFETY: the list was detached by the `fetch_and` above, so
            // this thread owns every node on it.
            let next = unsafe { (*node).next };
            unsafe { (*node).next = reversed };
            reversed = list;
            list = next;
        }
        Taken {
            next: reversed,
            _owns: std::marker::PhantomData,
        }
    }

    /// Whether anything waits to be taken. Relaxed: the callers order it
    /// with a fence of their own where that matters.
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Relaxed) & !CLOSED == 0
    }

    /// Refuses further [`IfClosed::Refuse`] pushes. Returns whether it was
    /// already closed.
    pub(crate) fn close(&self) -> bool {
        self.head.fetch_or(CLOSED, AcqRel) & CLOSED != 0
    }

    /// Whether [`close`](Self::close) was called. Acquire: a reader that
    /// sees the bit sees what the closer did before it.
    pub(crate) fn is_closed(&self) -> bool {
        self.head.load(Acquire) & CLOSED != 0
    }
}

impl<T> Drop for Intake<T> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// Values taken from an [`Intake`], oldest first; dropping it drops the rest.
pub(crate) struct Taken<T> {
    next: usize,
    _owns: std::marker::PhantomData<Box<Node<T>>>,
}

impl<T> Iterator for Taken<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if self.next == 0 {
            return None;
        }
        let node: *mut Node<T> = std::ptr::with_exposed_provenance_mut(self.next);
        // SAFETY: the nodes of a `Taken` are owned by it alone (detached
        // from the intake by `take`), and each is freed exactly once, here.
        let node = unsafe { Box::from_raw(node) };
        self.next = node.next;
        Some(node.value)
    }
}

impl<T> Drop for Taken<T> {
    fn drop(&mut self) {
        for _ in self.by_ref() {}
    }
}

#[cfg(all(test, not(tokio_workqueue_loom)))]
mod tests {
    use super::*;

    #[test]
    fn values_come_out_in_push_order_and_the_closed_bit_survives_takes() {
        let intake = Intake::new();
        for i in 0..5 {
            intake.push(i, IfClosed::Refuse).unwrap();
        }
        assert!(!intake.is_empty());
        assert_eq!(intake.take().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert!(intake.is_empty());
        assert!(!intake.close());
        assert!(intake.close(), "already closed");
        assert_eq!(intake.push(9, IfClosed::Refuse), Err(9));
        intake.push(7, IfClosed::Push).unwrap();
        assert_eq!(intake.take().collect::<Vec<_>>(), [7]);
        assert!(intake.is_closed());
    }

    #[test]
    fn values_left_behind_are_dropped() {
        let value = std::sync::Arc::new(());
        let intake = Intake::new();
        intake.push(value.clone(), IfClosed::Push).unwrap();
        intake.push(value.clone(), IfClosed::Push).unwrap();
        let mut taken = intake.take();
        drop(taken.next());
        intake.push(value.clone(), IfClosed::Push).unwrap();
        drop(taken);
        drop(intake);
        assert_eq!(std::sync::Arc::strong_count(&value), 1);
    }

    #[test]
    fn concurrent_pushes_all_arrive_in_each_pushers_order() {
        let intake = std::sync::Arc::new(Intake::new());
        let pushers: Vec<_> = (0..4)
            .map(|p| {
                let intake = intake.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        intake.push((p, i), IfClosed::Push).unwrap();
                    }
                })
            })
            .collect();
        let mut last = [None; 4];
        let mut seen = 0;
        while seen < 40_000 {
            for (p, i) in intake.take() {
                assert!(last[p].is_none_or(|l| l < i), "pusher {p} out of order");
                last[p] = Some(i);
                seen += 1;
            }
        }
        for p in pushers {
            p.join().unwrap();
        }
        assert!(intake.is_empty());
    }
}
