//! Runs an operation sequence against the real queue and the reference model
//! side by side, on a current-thread runtime with paused time, and checks
//! after every step that they agree and that the invariants hold.
//!
//! Shared by the property tests (`tests/model.rs`) and the fuzz target
//! (`fuzz/fuzz_targets/ops.rs`). A disagreement panics with the step and
//! both sides' view.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_test::task::{Spawn, spawn};
use tokio_workqueue::metrics::MetricsHook;
use tokio_workqueue::ordering::{Ordering, TwoLanes};
use tokio_workqueue::{
    AddError, AddOpts, Builder, ExponentialBackoff, FairShare, Fifo, WorkItem, WorkQueue,
};

use super::model::{Backoff, End, Key, Model, ShuttingDown};
use super::order_model::OrderingKind;

/// The operation language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `add_with(key, priority(p).after(delay_ms))`, rate limited if asked.
    Add {
        key: Key,
        priority: i8,
        delay_ms: u8,
        rate_limited: bool,
    },
    /// Start a `get` and poll it once; kept if pending.
    Get,
    /// Poll every pending `get`, oldest first.
    PollGets,
    /// Drop a pending `get` (index modulo their number).
    DropGet(u8),
    /// Poll the stream consumer (made on first use).
    StreamNext,
    /// Drop the stream consumer, pending `next` and all.
    DropStream,
    /// End a lease (index modulo their number).
    End { lease: u8, how: EndHow },
    /// `forget(key)` on the queue's rate limiter.
    Forget(Key),
    /// Move paused time on by this many milliseconds, one at a time.
    Advance(u8),
    /// `shutdown()`.
    Shutdown,
    /// Start `shutdown_with_drain()` (once) and poll it.
    Drain,
}

/// How an [`Op::End`] ends a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndHow {
    /// Drop the item (a panic in a worker ends its lease this way too).
    Drop,
    /// `done()`.
    Done,
    /// `requeue()`, or `requeue_after(ms)` when not zero.
    Requeue(u8),
    /// `requeue_rate_limited()`.
    RequeueRateLimited,
}

/// Per-run settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// `Builder::starvation_bound`, in ms.
    pub starvation_bound_ms: Option<u8>,
    /// With a metrics hook, whose events are checked against the model.
    pub metrics: bool,
    /// The ordering plugged in (and its reference model).
    pub ordering: OrderingKind,
}

/// A metrics hook that counts what it is told.
#[derive(Debug, Default)]
pub struct Counting {
    adds: AtomicU64,
    retries: AtomicU64,
    handed_out: AtomicU64,
    waited_ns: AtomicU64,
    done: AtomicU64,
    worked_ns: AtomicU64,
}

impl MetricsHook for Counting {
    fn add(&self) {
        self.adds.fetch_add(1, Relaxed);
    }
    fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }
    fn handed_out(&self, waited: Duration) {
        self.handed_out.fetch_add(1, Relaxed);
        self.waited_ns.fetch_add(waited.as_nanos() as u64, Relaxed);
    }
    fn done(&self, worked: Duration) {
        self.done.fetch_add(1, Relaxed);
        self.worked_ns.fetch_add(worked.as_nanos() as u64, Relaxed);
    }
}

/// The rate limiter both sides use: 1 ms, 2 ms, 4 ms, 4 ms, ...
const BACKOFF: (u64, u64) = (1, 4);

type GetFut<O> = Pin<Box<dyn Future<Output = Option<WorkItem<Key, O>>> + Send>>;
type DrainFut = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The real queue, its consumers and leases, and the model.
pub struct Driver<O: Ordering<Key>> {
    q: WorkQueue<Key, O>,
    model: Model,
    /// Leases held, and when each started.
    leases: Vec<(WorkItem<Key, O>, Instant)>,
    /// Whether the queue keeps times (a starvation bound or metrics).
    track: bool,
    hook: Option<Arc<Counting>>,
    /// Leases ended, and their total length.
    ended: u64,
    worked: Duration,
    gets: Vec<Spawn<GetFut<O>>>,
    /// The stream consumer, and whether its last poll was pending.
    stream: Option<(Spawn<WorkQueue<Key, O>>, bool)>,
    /// A `shutdown_with_drain()` in progress, and whether it was polled.
    drain: Option<(Spawn<DrainFut>, bool)>,
    step: usize,
    /// Hand-outs so far (for statistics).
    pub handed_out: usize,
}

/// Lets the timer task run after the clock moved.
async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

/// Runs `ops` and then quiesces; panics on any disagreement. Builds its own
/// paused current-thread runtime.
pub fn run(cfg: Config, ops: &[Op]) -> usize {
    match cfg.ordering {
        OrderingKind::Priorities => run_with(cfg, ops, |b| b),
        OrderingKind::TwoLanes => run_with(cfg, ops, |b| b.ordering(TwoLanes::new())),
        OrderingKind::Fifo => run_with(cfg, ops, |b| b.ordering(Fifo::new())),
        OrderingKind::FairShare {
            tenants,
            weight0,
            subgroups,
        } => {
            let mut fair = FairShare::new(move |k: &Key| k % tenants);
            if let Some(w) = std::num::NonZeroU32::new(weight0.into()) {
                fair = fair.weight(0, w);
            }
            match subgroups {
                None => run_with(cfg, ops, move |b| b.ordering(fair)),
                Some(n) => {
                    let fair = fair.then_by(move |k: &Key| (k / tenants) % n);
                    run_with(cfg, ops, move |b| b.ordering(fair))
                }
            }
        }
    }
}

/// [`run`] with the ordering `order` puts on the builder.
fn run_with<O: Ordering<Key>>(
    cfg: Config,
    ops: &[Op],
    order: impl FnOnce(Builder<Key>) -> Builder<Key, O>,
) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut d = Driver::new(cfg, order);
        for op in ops {
            d.apply(*op).await;
        }
        d.quiesce().await;
        d.handed_out
    })
}

impl<O: Ordering<Key>> Driver<O> {
    pub fn new(cfg: Config, order: impl FnOnce(Builder<Key>) -> Builder<Key, O>) -> Self {
        let ms = Duration::from_millis;
        let mut b = order(
            WorkQueue::builder()
                .rate_limiter(ExponentialBackoff::new(ms(BACKOFF.0), ms(BACKOFF.1)).unwrap()),
        );
        if let Some(bound) = cfg.starvation_bound_ms {
            b = b.starvation_bound(ms(bound.into()));
        }
        let hook = cfg.metrics.then(|| Arc::new(Counting::default()));
        if let Some(h) = &hook {
            b = b.metrics(h.clone());
        }
        Driver {
            track: cfg.metrics || cfg.starvation_bound_ms.is_some(),
            hook,
            ended: 0,
            worked: Duration::ZERO,
            q: b.build(),
            model: Model::new(
                cfg.starvation_bound_ms.map(u64::from),
                Backoff::new(BACKOFF.0, BACKOFF.1),
                cfg.ordering,
            ),
            leases: Vec::new(),
            gets: Vec::new(),
            stream: None,
            drain: None,
            step: 0,
            handed_out: 0,
        }
    }

    /// Applies one operation to both sides and checks them.
    pub async fn apply(&mut self, op: Op) {
        self.step += 1;
        match op {
            Op::Add {
                key,
                priority,
                delay_ms,
                rate_limited,
            } => {
                let mut opts = AddOpts::default()
                    .priority(priority.into())
                    .after(Duration::from_millis(delay_ms.into()));
                if rate_limited {
                    opts = opts.rate_limited();
                }
                let real = self.q.add_with(key, opts);
                let model = self
                    .model
                    .add(key, priority.into(), delay_ms.into(), rate_limited);
                self.same_outcome(op, real, model);
            }
            Op::Get => {
                let q = self.q.clone();
                let fut: GetFut<O> = Box::pin(async move { q.get().await });
                let mut get = spawn(fut);
                match get.poll() {
                    Poll::Ready(out) => self.handed(out, "get"),
                    Poll::Pending => {
                        assert_eq!(self.model.ready_len(), 0, "get pending with keys ready");
                        self.gets.push(get);
                    }
                }
            }
            Op::PollGets => {
                let gets = std::mem::take(&mut self.gets);
                for mut get in gets {
                    let woken = get.is_woken();
                    match get.poll() {
                        Poll::Ready(out) => self.handed(out, "parked get"),
                        Poll::Pending => {
                            // A parked get polled without a wake-up may stay
                            // parked: the key's wake-up went to another.
                            if woken {
                                assert_eq!(
                                    self.model.ready_len(),
                                    0,
                                    "woken get pending with keys ready"
                                );
                            }
                            self.gets.push(get);
                        }
                    }
                }
            }
            Op::DropGet(i) => {
                if !self.gets.is_empty() {
                    let i = usize::from(i) % self.gets.len();
                    drop(self.gets.remove(i));
                }
            }
            Op::StreamNext => {
                let (mut stream, parked) = self.stream.take().unwrap_or_else(|| {
                    let s = spawn(self.q.clone());
                    (s, false)
                });
                let must_look = !parked || stream.is_woken();
                match stream.poll_next() {
                    Poll::Ready(out) => {
                        self.handed(out, "stream");
                        self.stream = Some((stream, false));
                    }
                    Poll::Pending => {
                        if must_look {
                            assert_eq!(self.model.ready_len(), 0, "stream pending with keys ready");
                        }
                        self.stream = Some((stream, true));
                    }
                }
            }
            Op::DropStream => self.stream = None,
            Op::End { lease, how } => {
                if !self.leases.is_empty() {
                    let i = usize::from(lease) % self.leases.len();
                    let (item, started) = self.leases.remove(i);
                    self.ended += 1;
                    self.worked += started.elapsed();
                    let key = *item.key();
                    let (real, end) = match how {
                        EndHow::Drop => {
                            drop(item);
                            (Ok(()), End::Done)
                        }
                        EndHow::Done => {
                            item.done();
                            (Ok(()), End::Done)
                        }
                        EndHow::Requeue(0) => (item.requeue(), End::Requeue(0)),
                        EndHow::Requeue(ms) => (
                            item.requeue_after(Duration::from_millis(ms.into())),
                            End::Requeue(ms.into()),
                        ),
                        EndHow::RequeueRateLimited => {
                            (item.requeue_rate_limited(), End::RequeueRateLimited)
                        }
                    };
                    let model = self.model.finish(key, end);
                    self.same_outcome(op, real, model);
                }
            }
            Op::Forget(key) => {
                self.q.forget(&key);
                self.model.limiter.forget(key);
            }
            Op::Advance(ms) => {
                for _ in 0..ms {
                    tokio::time::advance(Duration::from_millis(1)).await;
                    settle().await;
                    self.model.tick();
                    self.check(op);
                }
            }
            Op::Shutdown => {
                self.q.shutdown();
                self.model.shutdown();
            }
            Op::Drain => {
                if self.drain.is_none() {
                    let q = self.q.clone();
                    let fut: DrainFut = Box::pin(async move { q.shutdown_with_drain().await });
                    let mut drain = spawn(fut);
                    // It shuts down when first polled.
                    let ready = drain.poll().is_ready();
                    self.model.shutdown();
                    assert_eq!(ready, self.model.drained(), "step {}: drain", self.step);
                    if !ready {
                        self.drain = Some((drain, true));
                    }
                }
            }
        }
        self.check(op);
    }

    fn same_outcome(&self, op: Op, real: Result<(), AddError>, model: Result<(), ShuttingDown>) {
        let real = real.map_err(|e| {
            assert_eq!(e, AddError::ShuttingDown, "step {} {op:?}", self.step);
            ShuttingDown
        });
        assert_eq!(real, model, "step {} {op:?}: outcome", self.step);
    }

    /// A consumer got `out`: the model must hand out the same.
    fn handed(&mut self, out: Option<WorkItem<Key, O>>, who: &str) {
        match out {
            Some(item) => {
                let expected = self.model.pop();
                assert_eq!(
                    Some((*item.key(), item.priority())),
                    expected,
                    "step {}: {who} handed out the wrong key (key, priority); model {:?}",
                    self.step,
                    self.model
                );
                assert!(
                    self.leases.iter().all(|(l, _)| l.key() != item.key()),
                    "step {}: key {} leased twice at once",
                    self.step,
                    item.key()
                );
                self.handed_out += 1;
                self.leases.push((item, Instant::now()));
            }
            None => assert!(
                self.model.closed(),
                "step {}: {who} ended while the model is not closed: {:?}",
                self.step,
                self.model
            ),
        }
    }

    /// Everything both sides can be asked without changing them.
    fn check(&mut self, op: Op) {
        let step = self.step;
        let m = &self.model;
        let ctx = || format!("step {step} after {op:?}; model {m:?}");
        assert_eq!(self.q.len(), m.ready_len(), "len: {}", ctx());
        let snap = self.q.snapshot();
        assert_eq!(
            snap.ready_by_priority,
            m.ready_by_priority(),
            "levels: {}",
            ctx()
        );
        assert_eq!(snap.in_flight, m.leased(), "in flight: {}", ctx());
        assert_eq!(
            snap.in_flight,
            self.leases.len(),
            "in flight vs leases: {}",
            ctx()
        );
        assert_eq!(snap.waiting, m.waiting(), "waiting: {}", ctx());
        assert_eq!(self.q.is_shutting_down(), m.shutdown, "shutdown: {}", ctx());
        for key in 0..16 {
            assert_eq!(
                self.q.num_requeues(&key),
                m.limiter.num_requeues(key),
                "num_requeues({key}): {}",
                ctx()
            );
        }
        for (l, _) in &self.leases {
            assert!(
                m.entry(*l.key()).is_some_and(|e| matches!(
                    e,
                    super::model::Entry::Leased { .. }
                        | super::model::Entry::LeasedDirty { .. }
                        | super::model::Entry::LeasedWaiting { .. }
                )),
                "lease on {} unknown to the model: {}",
                l.key(),
                ctx()
            );
        }

        // Lease times, kept when the queue tracks times.
        if self.track {
            let now = Instant::now();
            let ran: Vec<Duration> = self.leases.iter().map(|(_, at)| now - *at).collect();
            let longest = ran.iter().max().copied().unwrap_or_default();
            assert_eq!(snap.longest_running, longest, "longest running: {}", ctx());
            let total: Duration = ran.iter().sum();
            assert_eq!(snap.unfinished_work, total, "unfinished work: {}", ctx());
        }
        // The metrics hook was told exactly what happened.
        if let Some(h) = &self.hook {
            let got = [
                h.adds.load(Relaxed),
                h.retries.load(Relaxed),
                h.handed_out.load(Relaxed),
                h.waited_ns.load(Relaxed),
                h.done.load(Relaxed),
                h.worked_ns.load(Relaxed),
            ];
            let want = [
                m.adds,
                m.retries,
                self.handed_out as u64,
                m.waited_ms * 1_000_000,
                self.ended,
                self.worked.as_nanos() as u64,
            ];
            assert_eq!(
                got,
                want,
                "metrics [adds, retries, handed out, waited, done, worked]: {}",
                ctx()
            );
        }

        // Wake-ups: with keys ready, as many parked consumers are woken as
        // there are keys (or consumers); once closed, all of them.
        let mut parked = self.gets.len();
        let mut woken = self.gets.iter().filter(|g| g.is_woken()).count();
        if let Some((s, true)) = &self.stream {
            parked += 1;
            woken += usize::from(s.is_woken());
        }
        if m.closed() {
            assert_eq!(woken, parked, "closed, consumers left asleep: {}", ctx());
        } else {
            assert!(
                woken >= parked.min(m.ready_len()),
                "{woken} of {parked} parked consumers woken for {} ready keys: {}",
                m.ready_len(),
                ctx()
            );
        }

        // A drain resolves exactly when the model is drained.
        let drained = m.drained();
        if let Some((drain, polled)) = &mut self.drain {
            if drained && *polled {
                assert!(drain.is_woken(), "drained, drain not woken: {}", ctx());
            }
            *polled = true;
            let ready = drain.poll().is_ready();
            assert_eq!(ready, drained, "drain resolved: {}", ctx());
            if ready {
                self.drain = None;
            }
        }
    }

    /// Ends every lease, lets every delay run out, takes every key left and
    /// checks nothing was lost: the queue is then empty, a drain resolves at
    /// once, and every consumer ends.
    pub async fn quiesce(&mut self) {
        while !self.leases.is_empty() {
            self.apply(Op::End {
                lease: 0,
                how: EndHow::Done,
            })
            .await;
        }
        // Let every delay run out, a millisecond at a time (the language
        // makes delays of at most 255 ms, the limiter's of at most 4).
        for _ in 0..=u8::MAX as u64 + BACKOFF.1 {
            if self.model.waiting() == 0 {
                break;
            }
            self.apply(Op::Advance(1)).await;
        }
        assert_eq!(self.model.waiting(), 0);
        // Take everything left, ending each lease at once.
        loop {
            self.apply(Op::Get).await;
            if self.leases.is_empty() {
                break;
            }
            self.apply(Op::End {
                lease: 0,
                how: EndHow::Done,
            })
            .await;
        }
        assert_eq!(self.model.entries, [], "keys left in the model");
        // Every parked consumer was handed nothing it could lose; draining
        // an empty queue resolves at once and ends them all.
        self.apply(Op::Drain).await;
        assert!(
            self.drain.is_none(),
            "drain of an empty queue did not resolve"
        );
        self.apply(Op::PollGets).await;
        assert!(self.gets.is_empty(), "a get still pending after the drain");
        if self.stream.is_some() {
            self.apply(Op::StreamNext).await;
            assert!(matches!(self.stream, Some((_, false))));
        }
        let end = spawn(self.q.get()).poll();
        assert!(matches!(end, Poll::Ready(None)));
    }
}
