//! The timer task: moves delayed keys to the ready set when they are due.
//!
//! One task per queue, spawned by the first delayed add, drives the queue's
//! `DelayQueue` under the queue's lock. It holds the queue weakly and is
//! aborted when the queue is dropped, so it never outlives it; it also ends
//! at shutdown, which drops every timer. An idle wheel costs nothing: the task
//! sleeps until the earliest deadline, and an earlier insert wakes it.

use std::future::poll_fn;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::task::Poll;

use tokio::time::Instant;

use crate::error::AddError;
use crate::queue::Shared;
use crate::state::State;

/// Starts the timer task if there is none, or if the runtime that ran the
/// last one has gone (its keys then move to a fresh wheel).
pub(crate) fn ensure_running<K: Clone + Eq + Hash + Send + Sync + 'static>(
    shared: &Arc<Shared<K>>,
    st: &mut State<K>,
) -> Result<(), AddError> {
    if st.timer_running() {
        return Ok(());
    }
    let handle = tokio::runtime::Handle::try_current().map_err(|_| AddError::NoRuntime)?;
    if st.timer_task.is_some() {
        st.rebuild_timers();
    }
    // Unconstrained: tokio's co-operative budget would otherwise cut a burst
    // of keys due in one millisecond into pieces, and the wheel hands those
    // out last-in first, so only a whole burst can be put back in order.
    let task = handle.spawn(tokio::task::unconstrained(run(Arc::downgrade(shared))));
    st.timer_task = Some(task.abort_handle());
    Ok(())
}

async fn run<K: Clone + Eq + Hash + Send + Sync + 'static>(queue: Weak<Shared<K>>) {
    poll_fn(|cx| {
        let Some(shared) = queue.upgrade() else {
            return Poll::Ready(());
        };
        let now = Instant::now();
        let mut st = shared.state.lock();
        if st.is_shutdown() {
            return Poll::Ready(());
        }
        let fx = st.poll_timers(cx, now);
        let wake = fx.wake.min(st.parked as u32);
        drop(st);
        shared.apply(fx, wake);
        Poll::Pending
    })
    .await
}
