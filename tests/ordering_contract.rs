//! What the queue does when a user's ordering breaks its contract: it never
//! leases a key twice or hands out one that is not ready, and it does not
//! lose keys silently; it panics with a message that names the fault.

use tokio_workqueue::WorkQueue;
use tokio_workqueue::ordering::{Handle, Ordering, Queued};

/// Holds its keys but never hands one out.
#[derive(Debug, Default)]
struct Hoarder {
    held: usize,
}

impl<K> Ordering<K> for Hoarder {
    type Entry = ();
    fn push(&mut self, _: &mut Queued<'_, K, ()>, _: Handle, _: i32) {
        self.held += 1;
    }
    fn pop(&mut self, _: &mut Queued<'_, K, ()>) -> Option<Handle> {
        None
    }
    fn touch(&mut self, _: &mut Queued<'_, K, ()>, _: Handle, _: i32, _: i32) {}
    fn remove(&mut self, _: &mut Queued<'_, K, ()>, _: Handle) {
        self.held -= 1;
    }
    fn len(&self) -> usize {
        self.held
    }
}

#[tokio::test]
#[should_panic(expected = "handed out nothing with 1 keys ready (it says it holds 1)")]
async fn an_ordering_that_hands_out_nothing_makes_get_panic_rather_than_lose_keys() {
    let queue = WorkQueue::builder().ordering(Hoarder::default()).build();
    queue.add("a").unwrap();
    let _ = queue.get().await;
}

/// Hands out the first key it was ever given, every time.
#[derive(Debug, Default)]
struct Stuck {
    first: Option<Handle>,
    len: usize,
}

impl<K> Ordering<K> for Stuck {
    type Entry = ();
    fn push(&mut self, _: &mut Queued<'_, K, ()>, h: Handle, _: i32) {
        self.first.get_or_insert(h);
        self.len += 1;
    }
    fn pop(&mut self, _: &mut Queued<'_, K, ()>) -> Option<Handle> {
        self.len -= 1;
        self.first
    }
    fn touch(&mut self, _: &mut Queued<'_, K, ()>, _: Handle, _: i32, _: i32) {}
    fn remove(&mut self, _: &mut Queued<'_, K, ()>, _: Handle) {
        self.len -= 1;
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[tokio::test]
async fn an_ordering_that_hands_out_a_leased_key_gets_a_panic_not_a_second_lease() {
    let queue = WorkQueue::builder().ordering(Stuck::default()).build();
    queue.add("a").unwrap();
    queue.add("b").unwrap();
    let first = queue.get().await.unwrap();
    assert_eq!(*first, "a");
    let again = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.get().await.map(|item| *item) })
    };
    let err = again.await.expect_err("a second lease of \"a\"");
    let message = err.into_panic();
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted panic message");
    assert!(
        message.contains("which holds no ready key: a bug in the ordering"),
        "{message}"
    );
    // "a" is still leased once; the queue still counts "b" as ready.
    assert_eq!(queue.snapshot().in_flight, 1);
    assert_eq!(queue.len(), 1);
}

/// Looks at a key after handing it out.
#[derive(Debug, Default)]
struct Peeker {
    keys: Vec<Handle>,
    last: Option<Handle>,
}

impl<K> Ordering<K> for Peeker {
    type Entry = ();
    fn push(&mut self, q: &mut Queued<'_, K, ()>, h: Handle, _: i32) {
        if let Some(last) = self.last {
            // `last` was handed out: no longer ready.
            let _ = q.priority(last);
        }
        self.keys.push(h);
    }
    fn pop(&mut self, _: &mut Queued<'_, K, ()>) -> Option<Handle> {
        self.last = self.keys.pop();
        self.last
    }
    fn touch(&mut self, _: &mut Queued<'_, K, ()>, _: Handle, _: i32, _: i32) {}
    fn remove(&mut self, _: &mut Queued<'_, K, ()>, h: Handle) {
        self.keys.retain(|k| *k != h);
    }
    fn len(&self) -> usize {
        self.keys.len()
    }
}

#[tokio::test]
#[should_panic(expected = "does not name a ready key")]
async fn reading_a_key_that_is_no_longer_ready_panics() {
    let queue = WorkQueue::builder().ordering(Peeker::default()).build();
    queue.add(1).unwrap();
    let _item = queue.get().await.unwrap();
    queue.add(2).unwrap();
}
