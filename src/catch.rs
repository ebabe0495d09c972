//! One attempt at a key with its panic caught: shared by
//! [`Partitioned::run`](crate::Partitioned::run) and
//! [`WorkQueue::run`](crate::WorkQueue::run), so that both treat a panic
//! the same way: as a failed attempt of that key alone, retried with the
//! rate limiter's backoff. The message of a caught panic
//! ([`panic_message`], public as `partition::panic_message`) lives here
//! too, so that the partitions use this module and not the reverse.

use crate::Key;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};

use futures_util::FutureExt;

use crate::ordering::Ordering;
use crate::{AddError, AddOpts, WorkItem, WorkQueue};

/// A panic caught while a key was processed, and what became of the key.
pub(crate) struct Caught<K> {
    pub(crate) key: K,
    pub(crate) priority: i32,
    pub(crate) message: String,
    /// Whether adding the key again (rate limited, at the priority it was
    /// handed out with) was accepted.
    pub(crate) requeued: Result<(), AddError>,
}

/// A job handed its item, its panic (if the call panicked) caught.
pub(crate) struct Started<K, Fut> {
    /// Kept to requeue the key: unwinding drops the item with it.
    key: K,
    priority: i32,
    work: std::thread::Result<Fut>,
}

/// Hands `item` to `call` now, catching a panic in the call. Made before
/// the job's future is polled so that a worker loop lends its `FnMut` only
/// for the call.
pub(crate) fn start<K: Key, O: Ordering<K>, Fut>(
    item: WorkItem<K, O>,
    call: impl FnOnce(WorkItem<K, O>) -> Fut,
) -> Started<K, Fut> {
    Started {
        key: item.key().clone(),
        priority: item.priority(),
        work: catch_unwind(AssertUnwindSafe(|| call(item))),
    }
}

/// Runs a started job, catching a panic in its future. After a panic the
/// item has been dropped by the unwinding (so the lease has ended) and the
/// key is added again, rate limited at the priority it was handed out
/// with, so that a key that always panics backs off instead of spinning.
pub(crate) async fn finish<K: Key, O: Ordering<K>, Fut: Future<Output = ()>>(
    queue: &WorkQueue<K, O>,
    started: Started<K, Fut>,
) -> Option<Caught<K>> {
    let Started {
        key,
        priority,
        work,
    } = started;
    let outcome = match work {
        Ok(work) => AssertUnwindSafe(work).catch_unwind().await,
        Err(payload) => Err(payload),
    };
    let payload = outcome.err()?;
    let opts = AddOpts::new().priority(priority).rate_limited();
    let requeued = queue.add_with(key.clone(), opts);
    Some(Caught {
        key,
        priority,
        message: panic_message(&*payload),
        requeued,
    })
}

/// The message of a caught panic's payload, as the default panic hook
/// prints it: the `&str` or `String` given to `panic!`, or `Box<dyn Any>`
/// for any other payload.
///
/// The queue reports caught panics with it
/// ([`PartitionPanic::message`](crate::PartitionPanic::message)); it is
/// public for code that catches its own (a controller's reconciles).
///
/// ```
/// use tokio_workqueue::partition::panic_message;
///
/// let payload = std::panic::catch_unwind(|| panic!("no node for {}", 7)).unwrap_err();
/// assert_eq!(panic_message(&*payload), "no node for 7");
/// ```
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "Box<dyn Any>".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        let s = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(&*s), "static");
        let n = 3;
        let s = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(&*s), "formatted 3");
        let s = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(&*s), "Box<dyn Any>");
    }
}
