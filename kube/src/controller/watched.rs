//! A [`watch`] receiver the runner polls from its `poll_next`: each poll
//! has the task woken at the channel's next change, so the runner looks
//! at the value again (leadership, the shard view) without a task of its
//! own.

use std::task::Context;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::watch;

pub(crate) struct Watched<T> {
    rx: watch::Receiver<T>,
    next: Option<BoxFuture<'static, ()>>,
}

impl<T: Send + Sync + 'static> Watched<T> {
    pub(crate) fn new(rx: watch::Receiver<T>) -> Self {
        Watched { rx, next: None }
    }

    /// Has `cx` woken at the next change; never, once the sender is gone
    /// (a closed channel does not change again).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) {
        loop {
            if self.next.is_none() {
                if self.rx.has_changed().is_err() {
                    return;
                }
                let mut rx = self.rx.clone();
                rx.borrow_and_update();
                self.next = Some(
                    async move {
                        let _ = rx.changed().await;
                    }
                    .boxed(),
                );
            }
            let next = self.next.as_mut().expect("set above");
            if next.as_mut().poll(cx).is_pending() {
                return;
            }
            self.next = None;
        }
    }

    /// The receiver: its value is the latest.
    pub(crate) fn receiver(&self) -> &watch::Receiver<T> {
        &self.rx
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn each_change_wakes_the_poller_and_a_closed_channel_stops_it() {
        let (tx, rx) = watch::channel(0);
        let mut watched = Watched::new(rx);
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        watched.poll(&mut cx);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        tx.send_replace(1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        watched.poll(&mut cx);
        assert_eq!(*watched.receiver().borrow(), 1);
        tx.send_replace(2);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        drop(tx);
        // Neither spins nor panics.
        watched.poll(&mut cx);
        watched.poll(&mut cx);
        assert_eq!(*watched.receiver().borrow(), 2);
    }
}
