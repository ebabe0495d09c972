//! The pause after a watch fails, except where the failure asks for a
//! re-list.
//!
//! A watcher must be paced between failures, or it retries at once, in a
//! loop. A controller's trigger streams are kube-runtime watchers merged
//! into one stream, and one [`Backoff`] paces them (the controller's
//! trigger backoff); a Manager's shared watch, which runs on a task of its
//! own, is paced by one of kube-runtime's default backoff: after an error the stream is not
//! polled until the backoff's next delay has passed, and any event resets
//! it. That is kube-runtime's `StreamBackoff`, with one difference.
//!
//! A `410 Gone` in a watch (a resourceVersion the server has compacted) is
//! not a failure of the server: the watcher has already dropped its watch
//! and re-lists the moment it is polled again. Pausing there only delays
//! the re-list, and it costs most right after an outage: a client cut off
//! for a few seconds has climbed the backoff (800 ms, 1.6 s, 3.2 s, ...) by
//! the time it reconnects, its resumed watch meets a compacted revision,
//! and the next step of the backoff (6.4 s) passed before it re-listed
//! (the chaos soak measured 10 to 15 s to be current again after such
//! cuts, under 2 s without this pause). So a `410` in a watch goes through
//! at once, neither waiting nor advancing the backoff; the re-list that
//! follows is an ordinary request, and if it fails, that failure backs off.
//! A server that keeps answering with 410 is still paced: each 410 follows
//! a full list.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use kube_runtime::utils::Backoff;
use kube_runtime::watcher;
use pin_project::pin_project;
use tokio::time::{Sleep, sleep};

/// `stream`, paused by `backoff` after each error other than a watch's
/// `410 Gone`; ends if the backoff gives up (returns `None`).
#[pin_project]
pub(crate) struct WatchBackoff<S, B> {
    #[pin]
    stream: S,
    backoff: B,
    #[pin]
    pause: Option<Sleep>,
    given_up: bool,
}

impl<S, B> WatchBackoff<S, B> {
    pub(crate) fn new(stream: S, backoff: B) -> Self {
        WatchBackoff {
            stream,
            backoff,
            pause: None,
            given_up: false,
        }
    }
}

/// Whether the watcher answers `error` by re-listing at once (its state is
/// already back to the start), so that waiting would only delay the list.
fn relists(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

impl<S, T, B> Stream for WatchBackoff<S, B>
where
    S: Stream<Item = Result<T, watcher::Error>>,
    B: Backoff,
{
    type Item = Result<T, watcher::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if *this.given_up {
            return Poll::Ready(None);
        }
        if let Some(pause) = this.pause.as_mut().as_pin_mut() {
            ready!(pause.poll(cx));
            this.pause.set(None);
        }
        let item = ready!(this.stream.poll_next(cx));
        match &item {
            Some(Ok(_)) => this.backoff.reset(),
            Some(Err(error)) if relists(error) => {
                tracing::debug!(%error, "watch expired: re-listing without a backoff");
            }
            Some(Err(error)) => match this.backoff.next() {
                Some(delay) => {
                    tracing::debug!(%error, ?delay, "watch failed: backing off");
                    this.pause.set(Some(sleep(delay)));
                }
                None => {
                    tracing::debug!(%error, "watch failed and the backoff gives up");
                    *this.given_up = true;
                }
            },
            None => {}
        }
        Poll::Ready(item)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::StreamExt;
    use futures_util::stream;
    use kube_client::core::Status;
    use tokio::time::Instant;

    use super::*;

    /// A constant backoff that counts how often it was asked, and gives up
    /// after `limit` delays.
    struct Counting {
        delay: Duration,
        asked: Arc<AtomicUsize>,
        resets: Arc<AtomicUsize>,
        limit: usize,
    }

    impl Iterator for Counting {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            let asked = self.asked.fetch_add(1, Ordering::SeqCst);
            (asked < self.limit).then_some(self.delay)
        }
    }

    impl Backoff for Counting {
        fn reset(&mut self) {
            self.resets.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting(limit: usize) -> (Counting, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let asked = Arc::new(AtomicUsize::new(0));
        let resets = Arc::new(AtomicUsize::new(0));
        let backoff = Counting {
            delay: Duration::from_secs(30),
            asked: asked.clone(),
            resets: resets.clone(),
            limit,
        };
        (backoff, asked, resets)
    }

    fn status(code: u16) -> watcher::Error {
        let mut status = Status::failure("test", "Expired");
        status.code = code;
        watcher::Error::WatchError(Box::new(status))
    }

    #[tokio::test(start_paused = true)]
    async fn a_410_in_a_watch_goes_through_without_a_pause() {
        let (backoff, asked, resets) = counting(usize::MAX);
        let items = stream::iter(vec![Ok(1), Err(status(410)), Ok(2)]);
        let start = Instant::now();
        let out: Vec<_> = WatchBackoff::new(items, backoff).collect().await;
        assert_eq!(out.len(), 3);
        assert!(matches!(out[1], Err(watcher::Error::WatchError(ref s)) if s.code == 410));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(
            asked.load(Ordering::SeqCst),
            0,
            "the 410 advanced the backoff"
        );
        assert_eq!(resets.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_pause_for_the_backoffs_delay() {
        let (backoff, asked, _) = counting(usize::MAX);
        let items = stream::iter(vec![Err(status(500)), Ok(1), Err(status(403)), Ok(2)]);
        let mut triggers = std::pin::pin!(WatchBackoff::new(items, backoff));
        let start = Instant::now();
        assert!(triggers.next().await.unwrap().is_err());
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the error itself is not held"
        );
        assert_eq!(triggers.next().await.unwrap().unwrap(), 1);
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert!(triggers.next().await.unwrap().is_err());
        assert_eq!(triggers.next().await.unwrap().unwrap(), 2);
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backoff_that_gives_up_ends_the_stream() {
        let (backoff, _, _) = counting(0);
        let items = stream::iter(vec![Err(status(500)), Ok(1)]);
        let out: Vec<_> = WatchBackoff::new(items, backoff).collect().await;
        assert_eq!(out.len(), 1, "nothing after the backoff gave up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transport_failure_is_not_taken_for_a_410() {
        let (backoff, asked, _) = counting(usize::MAX);
        let gone = kube_client::Error::Api(Box::new({
            let mut s = Status::failure("gone", "Gone");
            s.code = 410;
            s
        }));
        // A watch that could not even start: the watcher retries the same
        // resourceVersion, so this is paced like any failure.
        let items = stream::iter(vec![Err::<u8, _>(watcher::Error::WatchStartFailed(gone))]);
        let out: Vec<_> = WatchBackoff::new(items, backoff).collect().await;
        assert_eq!(out.len(), 1);
        assert_eq!(asked.load(Ordering::SeqCst), 1);
    }
}
