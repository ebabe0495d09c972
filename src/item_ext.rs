//! Ways to end a lease beyond those of the guard itself: with the key's
//! backoff reset, or with the key handed back.

use crate::Key;
use crate::item::WorkItem;
use crate::ordering::Ordering;

impl<K: Key, O: Ordering<K>> WorkItem<K, O> {
    /// Ends the lease as a success: forgets the rate limiter's failures for
    /// the key (as [`forget`](Self::forget) does), then ends the lease.
    ///
    /// [`done`](Self::done) and dropping the item end the lease without
    /// forgetting, so after them the key's next rate-limited requeue backs
    /// off as if the success had never happened.
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// queue.add("job").unwrap();
    /// queue.get().await.unwrap().requeue_rate_limited().unwrap(); // failed once
    /// assert_eq!(queue.num_requeues(&"job"), 1);
    /// # tokio::time::pause();
    /// # tokio::time::advance(std::time::Duration::from_secs(1)).await;
    /// let item = queue.get().await.unwrap();
    /// item.succeed(); // worked this time: the backoff starts over
    /// assert_eq!(queue.num_requeues(&"job"), 0);
    /// # }
    /// ```
    pub fn succeed(self) {
        self.forget();
    }

    /// Ends the lease, as [`done`](Self::done) does, and returns the key.
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = WorkQueue::new();
    /// queue.add("ns/a".to_string()).unwrap();
    /// let key: String = queue.get().await.unwrap().into_key();
    /// assert_eq!(key, "ns/a");
    /// queue.add(key).unwrap(); // the lease has ended: ready again at once
    /// assert_eq!(queue.len(), 1);
    /// # }
    /// ```
    pub fn into_key(self) -> K {
        // A clone: the guard's `Drop` ends the lease and needs the item whole.
        self.key().clone()
    }
}
