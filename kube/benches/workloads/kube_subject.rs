//! The `kube-runtime` baseline: `kube_runtime::scheduler::scheduler` fed by a
//! channel of `ScheduleRequest`s and driven as kube-runtime's controller
//! runner drives it (see [`kube_runner`]); and its W6 measurement.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::{mpsc as fmpsc, oneshot};
use kube_runtime::scheduler::{ScheduleRequest, Scheduler, scheduler};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::subjects::{Adder, Drained, Running, Subject, Work};
use crate::w6::rss;

/// kube-runtime's scheduler, fed by a channel of `ScheduleRequest`s and
/// driven by [`kube_runner`].
pub struct Kube;

pub type KubeRequests = fmpsc::UnboundedReceiver<ScheduleRequest<String>>;

pub struct KubeAdder(fmpsc::UnboundedSender<ScheduleRequest<String>>);

/// A key no workload uses: scheduled last by a drain, it tells the runner
/// that every earlier request has come out of the scheduler.
pub const SENTINEL: &str = "\0drain";
/// How far after the drain starts the sentinel is due: past the millisecond
/// tick of every earlier request, so the scheduler's `DelayQueue` hands it
/// out after all of them.
pub const SENTINEL_AFTER: Duration = Duration::from_millis(2);

impl Subject for Kube {
    fn name(&self) -> String {
        "kube-runtime".into()
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let (tx, rx) = fmpsc::unbounded();
        let (done_tx, done_rx) = oneshot::channel();
        let draining = Arc::new(AtomicBool::new(false));
        tokio::spawn(kube_runner(
            scheduler(rx),
            consumers,
            work,
            draining.clone(),
            done_tx,
        ));
        let sentinel_tx = tx.clone();
        Running {
            adder: Arc::new(KubeAdder(tx)),
            // The scheduler ends as soon as its request stream does, dropping
            // what it still holds, so a drain cannot just close the channel:
            // it schedules a sentinel after every request made so far, and
            // the runner reports once the sentinel is out and nothing is in
            // flight or held. The end is the last processing's, so the
            // sentinel's wait is not counted.
            drain: Box::pin(async move {
                draining.store(true, Ordering::SeqCst);
                sentinel_tx
                    .unbounded_send(ScheduleRequest {
                        message: SENTINEL.to_string(),
                        run_at: Instant::now() + SENTINEL_AFTER,
                    })
                    .expect("the runner is running");
                done_rx.await.expect("the runner reports its drain")
            }),
        }
    }
}

impl KubeAdder {
    fn request(&self, message: String, run_at: Instant) {
        self.0
            .unbounded_send(ScheduleRequest { message, run_at })
            .expect("the runner is running");
    }
}

impl Adder for KubeAdder {
    fn add(&self, key: String) {
        self.request(key, Instant::now());
    }
    fn add_after(&self, key: String, delay: Duration) {
        self.request(key, Instant::now() + delay);
    }
    fn add_priority(&self, _: String, _: i32) {
        unreachable!("kube-runtime's scheduler has no priorities")
    }
}

/// Drives a kube-runtime `Scheduler` as kube-runtime's controller `Runner`
/// does (kube-runtime 5, `src/controller/runner.rs`, which is private to that
/// crate; this is a small model of it, not a copy): each poll first reaps
/// finished reconciles (their `FutureHashMap` of slots keyed by message);
/// then, while fewer than `concurrency` are running, it takes the next
/// message with `hold_unless(|msg| !slots.contains_key(msg))`, so a key in
/// flight is held back, and spawns its reconcile as a task (as
/// `Controller::run` does, through `CancelableJoinHandle::spawn`); when all
/// slots are busy it polls `hold()`, which takes requests in and holds what
/// expires.
pub async fn kube_runner(
    scheduler: Scheduler<String, KubeRequests>,
    concurrency: usize,
    work: Work,
    draining: Arc<AtomicBool>,
    report: oneshot::Sender<Drained>,
) {
    let mut scheduler = pin!(scheduler);
    let mut slots: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut processed = 0u64;
    let mut last_done = None;
    let mut sentinel_seen = false;
    let mut report = Some(report);
    poll_fn(|cx| {
        let running = slots.len();
        slots.retain(|_, reconcile| match Pin::new(reconcile).poll(cx) {
            Poll::Ready(outcome) => {
                outcome.expect("a reconcile panicked");
                false
            }
            Poll::Pending => true,
        });
        if slots.len() < running {
            processed += (running - slots.len()) as u64;
            if draining.load(Ordering::Relaxed) {
                last_done = Some(Instant::now());
            }
        }
        loop {
            if slots.len() >= concurrency {
                return match scheduler.as_mut().hold().poll_next_unpin(cx) {
                    Poll::Ready(Some(_)) => unreachable!("hold never emits"),
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                };
            }
            let next = scheduler
                .as_mut()
                .hold_unless(|msg| !slots.contains_key(msg))
                .poll_next_unpin(cx);
            match next {
                Poll::Ready(Some(msg)) if msg == SENTINEL => sentinel_seen = true,
                Poll::Ready(Some(msg)) => {
                    let (key, work) = (msg.clone(), work.clone());
                    slots.insert(msg, tokio::spawn(async move { work(&key) }));
                    // As the Runner does: poll again, so the new slot's
                    // handle gets polled (and registers this task).
                    cx.waker().wake_by_ref();
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending if sentinel_seen && slots.is_empty() => {
                    let end = last_done.unwrap_or_else(Instant::now);
                    if let Some(report) = report.take() {
                        let _ = report.send(Drained { end, processed });
                    }
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

/// The kube-runtime variants of W6.
pub const W6_VARIANTS: [crate::w6::Variant; 2] =
    [("kube-runtime", "W6"), ("kube-runtime", "W6-delayed")];

/// W6 in a child process, for `kube-runtime`: its scheduler holding `keys`
/// (see `crate::w6::Other`).
pub fn w6_measure(
    imp: &str,
    keys: Vec<String>,
    delay: Duration,
) -> Option<Pin<Box<dyn Future<Output = f64>>>> {
    if imp != "kube-runtime" {
        return None;
    }
    Some(Box::pin(async move {
        let mut keys = keys;
        let n = keys.len();
        // The requests are built first (a request holds its key), and
        // fed from an iterator that never ends, so the scheduler
        // keeps all it was given.
        let run_at = Instant::now() + delay;
        let requests: Vec<_> = keys
            .drain(..)
            .map(|message| ScheduleRequest { message, run_at })
            .collect();
        let before = rss();
        let stream = futures::stream::iter(requests).chain(futures::stream::pending());
        let mut scheduler = Box::pin(scheduler(stream));
        // As a runner with every worker busy: `hold` takes the
        // requests in and moves the due ones to its pending set.
        for _ in 0..2 {
            poll_fn(|cx| {
                let _ = scheduler.as_mut().hold().poll_next_unpin(cx);
                Poll::Ready(())
            })
            .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let per_key = (rss() - before) / n as f64;
        std::mem::forget(scheduler);
        per_key
    }))
}
