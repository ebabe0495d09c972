//! Work the runner does once, at its end (releasing a Lease), driven from
//! its `poll_next` like everything else it does.

use std::task::{Context, Poll};

use futures_util::future::BoxFuture;

#[derive(Default)]
pub(crate) struct AtEnd {
    running: Option<BoxFuture<'static, ()>>,
    done: bool,
}

impl AtEnd {
    /// Runs the work `start` makes on the first call (`None`: nothing to
    /// do); ready once it is done, and on every call after.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        start: impl FnOnce() -> Option<BoxFuture<'static, ()>>,
    ) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        let running = match &mut self.running {
            Some(running) => running,
            None => match start() {
                Some(work) => self.running.insert(work),
                None => {
                    self.done = true;
                    return Poll::Ready(());
                }
            },
        };
        if running.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.running = None;
        self.done = true;
        Poll::Ready(())
    }
}
