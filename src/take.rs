//! Taking a key: what a consumer keeps while it waits for one (a
//! [`Wait`]), the look at the shards that turns a ready key into a
//! [`WorkItem`], the lease on it, and the end of a wait given up
//! ([`Shared::cancel`]).
//!
//! The queue's shared state ([`crate::shared`]) pops keys and ends leases
//! but never names a [`WorkItem`]; the lease ([`crate::item`]) ends itself
//! through that state. This module stands above both, so neither imports
//! the other back. The
//! protocol between a consumer that goes to sleep and a producer that makes
//! a key ready is [`crate::shared`]'s (its module docs): `poll_take` is
//! the consumer's side of it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::Key;
use crate::item::WorkItem;
use crate::ordering::Ordering;
use crate::shared::{Holder, Shared, Taken};
use crate::state::Popped;
use crate::sync::Arc;
use crate::sync::atomic::{Ordering::SeqCst, fence};
use crate::waiters::{Found, WaiterId, WakeList};

impl<K: Key, O: Ordering<K>> Holder<K, O> {
    /// Takes a ready key now, if there is one, waiting for a shard's lock
    /// if need be (for a drain that hands back what is left).
    pub(crate) fn take_ready(self: &Arc<Self>) -> Option<WorkItem<K, O>> {
        let queue: &Shared<K, O> = self;
        match queue.pop(true) {
            Taken::Key(i, popped) => Some(self.item(i, popped)),
            Taken::Empty | Taken::Busy => None,
        }
    }

    /// The lease on a key just handed out.
    fn item(self: &Arc<Self>, shard: usize, popped: Popped<K>) -> WorkItem<K, O> {
        let now = popped.taken_at;
        if let (Some(m), Some(now), Some(ready_at)) = (&self.metrics, now, popped.ready_at) {
            m.handed_out(now.saturating_duration_since(ready_at));
        }
        WorkItem::new(
            self.clone(),
            popped.key,
            shard as u32,
            popped.slot,
            popped.lease,
            popped.priority,
            now,
        )
    }

    /// Takes the next ready key, or registers `wait` to be woken when
    /// there may be one (the body of `get` and of the stream).
    ///
    /// A registered consumer that is polled again looks again only if it
    /// was notified or keys are ready.
    pub(crate) fn poll_take(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        wait: &mut Wait,
    ) -> Poll<Option<WorkItem<K, O>>> {
        // The queue behind the holder, reached once.
        let queue: &Shared<K, O> = self;
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        // A consumer that finds nothing looks once more before it
        // registers: that gives a producer on another thread a moment to
        // add, which is much cheaper than a wake-up through the scheduler.
        let mut second_look = wait.waiter.is_none();
        loop {
            if let Some(sleep) = &mut wait.throttled {
                ready!(sleep.as_mut().poll(cx));
                wait.throttled = None;
            }
            if let Some(id) = wait.waiter {
                let mut waiters = queue.waiters();
                match waiters.poll(id, cx.waker()) {
                    Found::Waiting if !queue.any_ready() && !queue.is_closed() => {
                        return Poll::Pending;
                    }
                    // Keys are ready, though not for this one: it takes one.
                    Found::Waiting => _ = waiters.cancel(id),
                    Found::Notified => {}
                }
                drop(waiters);
                wait.waiter = None;
            }
            if let Some(throttle) = &queue.throttle
                && !wait.permit
                && queue.any_ready()
            {
                match throttle.try_acquire() {
                    // Kept until a key is taken with it: a hand-out that
                    // finds the key's shard busy, or the key gone, keeps
                    // its token for the next look.
                    Ok(()) => wait.permit = true,
                    Err(pause) => {
                        wait.throttled = Some(Box::pin(tokio::time::sleep(pause)));
                        continue;
                    }
                }
            }
            match queue.pop(false) {
                Taken::Key(i, popped) => {
                    wait.permit = false;
                    coop.made_progress();
                    return Poll::Ready(Some(self.item(i, popped)));
                }
                Taken::Busy => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Taken::Empty => {}
            }
            if queue.is_closed() {
                coop.made_progress();
                return Poll::Ready(None);
            }
            if std::mem::take(&mut second_look) {
                continue;
            }
            wait.waiter = Some(queue.waiters().register(cx.waker()));
            // Pairs with the SeqCst store of a producer that publishes a
            // ticket, or makes a queue's one shard show a key (see
            // `BackGuard::push` and `Marks::publish`): either this look sees
            // the key, or every producer of that shard from then on sees
            // this consumer registered and wakes it.
            fence(SeqCst);
            if !queue.any_ready() && !queue.is_closed() {
                return Poll::Pending;
            }
            // Something came: the next round unregisters and takes it.
        }
    }
}

/// A consumer's wait for a key, kept between polls (by a `get` future, or
/// by a [`WorkQueue`](crate::WorkQueue) polled as a stream): its place among
/// the waiting consumers, if it has one, and the sleep of a throttled
/// consumer. It holds nothing pinned, so it is kept inline; only a throttle's
/// sleep is boxed (throttles are opt-in, and that sleep is rare).
///
/// A dropped wait must be given to [`Shared::cancel`], which passes on a
/// wake-up it had received (and takes no lock if it was not registered).
#[derive(Debug, Default)]
pub(crate) struct Wait {
    waiter: Option<WaiterId>,
    throttled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A throttle token taken for a key not taken yet.
    permit: bool,
}

impl<K, O: Ordering<K>> Shared<K, O> {
    /// Ends a wait that stops before it got a key (a dropped `get` or
    /// stream): unregisters it, and passes a wake-up it had received, but
    /// not used, to the next waiting consumer.
    pub(crate) fn cancel(&self, wait: &mut Wait) {
        wait.throttled = None;
        let Some(id) = wait.waiter.take() else {
            return;
        };
        let mut wake = WakeList::default();
        let mut waiters = self.waiters();
        if waiters.cancel(id) && self.any_ready() {
            waiters.notify(1, &mut wake);
        }
        drop(waiters);
        wake.wake();
    }
}
