//! One list in the order keys became ready.

use super::list::{Links, List};
use super::{Handle, Ordering, Queued};

/// Keys come out in the order they became ready, whatever their priority:
/// client-go's plain queue.
///
/// An add of a key that is already ready never moves it, not even with a
/// higher priority (the queue still keeps the higher priority, and
/// [`WorkItem::priority`](crate::WorkItem::priority) tells it). One list
/// linked through the keys' slots: every operation is O(1).
///
/// ```
/// use tokio_workqueue::{AddOpts, Fifo, WorkQueue};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue = WorkQueue::builder().ordering(Fifo::new()).build();
/// queue.add_with("first", AddOpts::default().priority(-5)).unwrap();
/// queue.add_with("second", AddOpts::default().priority(5)).unwrap();
/// let item = queue.get().await.unwrap();
/// assert_eq!((*item, item.priority()), ("first", -5));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Fifo {
    keys: List,
}

impl Fifo {
    /// An empty list.
    pub const fn new() -> Self {
        Fifo { keys: List::EMPTY }
    }
}

impl<K> Ordering<K> for Fifo {
    type Entry = Links;

    #[inline]
    fn push(&mut self, q: &mut Queued<'_, K, Links>, key: Handle, _priority: i32) {
        self.keys.push_back(q, key);
    }

    #[inline]
    fn pop(&mut self, q: &mut Queued<'_, K, Links>) -> Option<Handle> {
        self.keys.pop_front(q)
    }

    #[inline]
    fn touch(&mut self, _: &mut Queued<'_, K, Links>, _: Handle, _: i32, _: i32) {}

    #[inline]
    fn remove(&mut self, q: &mut Queued<'_, K, Links>, key: Handle) {
        self.keys.unlink(q, key);
    }

    fn len(&self) -> usize {
        self.keys.len
    }

    #[inline]
    fn prefetch_next(&self, q: &Queued<'_, K, Links>) -> Option<Handle> {
        self.keys.peek_and_prefetch(q)
    }
}
