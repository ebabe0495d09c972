//! The implementations under test: the traits a workload drives them
//! through ([`Subject`], [`Adder`]), this crate's queue ([`Crate`]) and the
//! `mpsc` floor ([`Mpsc`]).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_workqueue::ordering::Ordering as QueueOrdering;
use tokio_workqueue::{AddOpts, FairShare, Fifo, WorkQueue};

/// What a workload does with each key handed out: the "processing".
pub type Work = Arc<dyn Fn(&str) + Send + Sync>;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The producer side of an implementation.
pub trait Adder: Send + Sync {
    fn add(&self, key: String);
    fn add_after(&self, key: String, delay: Duration);
    /// Only called on implementations with [`Subject::priorities`].
    fn add_priority(&self, key: String, priority: i32);
}

/// The end of a drain: when the last processing ended and how many there were.
pub struct Drained {
    pub end: Instant,
    pub processed: u64,
}

/// An implementation started on the current runtime.
pub struct Running {
    pub adder: Arc<dyn Adder>,
    /// Poll only once every producer is done and every `adder` clone but
    /// this one's is dropped (the driver drops its own first): resolves when
    /// every key added was processed and nothing is queued or in flight.
    pub drain: BoxFuture<Drained>,
}

/// One implementation under test.
pub trait Subject {
    fn name(&self) -> String;
    fn priorities(&self) -> bool {
        false
    }
    /// Starts `consumers` consumers that run `work` on each key handed out.
    fn start(&self, consumers: usize, work: Work) -> Running;
}

pub async fn join_sum(handles: Vec<JoinHandle<u64>>) -> u64 {
    let mut sum = 0;
    for h in handles {
        sum += h.await.expect("a consumer panicked");
    }
    sum
}

/// This crate, optionally with metrics, a starvation bound or an ordering
/// other than the default.
pub struct Crate {
    pub metrics: bool,
    pub bound: Option<Option<Duration>>,
    pub ordering: Order,
    /// The consumers as the crate's docs run them, in one task
    /// (`queue.for_each_concurrent(consumers, ..)`), rather than one
    /// spawned task each.
    pub one_task: bool,
}

/// The orderings the workloads run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `Priorities`, the default.
    Default,
    Fifo,
    /// `FairShare` across namespaces (the part of a key before `/`).
    FairByNamespace,
}

pub const CRATE: Crate = Crate {
    metrics: false,
    bound: None,
    ordering: Order::Default,
    one_task: false,
};

/// A key's namespace: its tenant under fair share.
pub fn namespace_of(key: &str) -> String {
    key.split_once('/').map_or(key, |(ns, _)| ns).to_string()
}

pub fn fair_by_namespace() -> FairShare<String, String> {
    FairShare::new(|key: &String| namespace_of(key))
}

/// The hook behind the "metrics on" rows: the crate's Prometheus metrics when
/// it has the `prometheus` feature (`cargo bench --bench workloads --features
/// prometheus`), else a hook that records nothing.
pub mod metrics_hook {
    use tokio_workqueue::Builder;

    /// A metrics hook that records nothing: the queue keeps its times (a
    /// clock read per add and hand-out, ready and lease stamps) and calls the
    /// hook, which costs nothing of its own.
    #[cfg(not(feature = "prometheus"))]
    struct NoopMetrics;

    #[cfg(not(feature = "prometheus"))]
    impl tokio_workqueue::metrics::MetricsHook for NoopMetrics {}

    #[cfg(not(feature = "prometheus"))]
    pub const KIND: &str = "noop";

    #[cfg(not(feature = "prometheus"))]
    pub fn with_metrics(b: Builder<String>) -> Builder<String> {
        b.metrics(NoopMetrics)
    }

    #[cfg(feature = "prometheus")]
    pub const KIND: &str = "prometheus";

    #[cfg(feature = "prometheus")]
    pub fn with_metrics(b: Builder<String>) -> Builder<String> {
        let metrics = tokio_workqueue::metrics::prometheus::PrometheusMetrics::new();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        b.name("bench").metrics(metrics)
    }
}

impl Subject for Crate {
    fn name(&self) -> String {
        let mut name = "tokio-workqueue".to_string();
        if self.metrics {
            name += &format!("[metrics={}]", metrics_hook::KIND);
        }
        match self.bound {
            Some(Some(b)) => name += &format!("[bound={}ms]", b.as_millis()),
            Some(None) => name += "[bound=off]",
            None => {}
        }
        match self.ordering {
            Order::Default => {}
            Order::Fifo => name += "[fifo]",
            Order::FairByNamespace => name += "[fair=namespace]",
        }
        if self.one_task {
            name += "[for_each_concurrent]";
        }
        name
    }

    fn priorities(&self) -> bool {
        true
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let mut builder = WorkQueue::<String>::builder();
        if self.metrics {
            builder = metrics_hook::with_metrics(builder);
        }
        if let Some(Some(bound)) = self.bound {
            builder = builder.starvation_bound(bound);
        }
        match self.ordering {
            Order::Default => start_queue(builder.build(), consumers, self.one_task, work),
            Order::Fifo => start_queue(
                builder.ordering(Fifo::new()).build(),
                consumers,
                self.one_task,
                work,
            ),
            Order::FairByNamespace => start_queue(
                builder.ordering(fair_by_namespace()).build(),
                consumers,
                self.one_task,
                work,
            ),
        }
    }
}

/// Starts `consumers` consumers of `queue` that run `work` on each key: a
/// spawned task each, or with `one_task` all in one task, as
/// `for_each_concurrent` runs them (at most `consumers` keys leased at a
/// time, polled by one task, so on one worker thread at a time).
pub fn start_queue<O: QueueOrdering<String>>(
    queue: WorkQueue<String, O>,
    consumers: usize,
    one_task: bool,
    work: Work,
) -> Running {
    let handles = if one_task {
        let (queue, work) = (queue.clone(), work.clone());
        vec![tokio::spawn(async move {
            let mut n = 0;
            queue
                .for_each_concurrent(consumers, |item| {
                    work(item.key());
                    n += 1;
                    // Dropping `item` marks the key done.
                    std::future::ready(())
                })
                .await;
            n
        })]
    } else {
        (0..consumers)
            .map(|_| {
                let (queue, work) = (queue.clone(), work.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while let Some(item) = queue.get().await {
                        work(item.key());
                        n += 1;
                        // Dropping `item` marks the key done.
                    }
                    n
                })
            })
            .collect()
    };
    let drain_queue = queue.clone();
    Running {
        adder: Arc::new(queue),
        drain: Box::pin(async move {
            drain_queue.shutdown_with_drain().await;
            let end = Instant::now();
            let processed = join_sum(handles).await;
            Drained { end, processed }
        }),
    }
}

impl<O: QueueOrdering<String>> Adder for WorkQueue<String, O> {
    fn add(&self, key: String) {
        WorkQueue::add(self, key).expect("the queue is open");
    }
    fn add_after(&self, key: String, delay: Duration) {
        WorkQueue::add_after(self, key, delay).expect("the queue is open");
    }
    fn add_priority(&self, key: String, priority: i32) {
        self.add_with(key, AddOpts::default().priority(priority))
            .expect("the queue is open");
    }
}

/// The floor: a tokio unbounded channel whose consumers share the receiver
/// behind a mutex. No de-duplication, no in-flight tracking. Delayed keys go
/// through one forwarding task that holds them in a `tokio_util` `DelayQueue`
/// (the tool tokio offers for many delays) and sends each when it is due.
pub struct Mpsc;

pub struct MpscAdder {
    now: tokio::sync::mpsc::UnboundedSender<String>,
    later: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
}

/// Holds delayed keys until they are due, then sends them on `out`. Ends
/// once every sender of `requests` is gone and no key is left waiting.
pub async fn forward_when_due(
    mut requests: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
) {
    let mut waiting = tokio_util::time::DelayQueue::new();
    let mut open = true;
    poll_fn(|cx| {
        while open {
            match requests.poll_recv(cx) {
                Poll::Ready(Some((key, at))) => {
                    waiting.insert_at(key, at);
                }
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(due)) = waiting.poll_expired(cx) {
            let _ = out.send(due.into_inner());
        }
        if open || !waiting.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

impl Subject for Mpsc {
    fn name(&self) -> String {
        "mpsc".into()
    }

    fn start(&self, consumers: usize, work: Work) -> Running {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let handles = (0..consumers)
            .map(|_| {
                let (rx, work) = (rx.clone(), work.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    loop {
                        let next = rx.lock().await.recv().await;
                        let Some(key) = next else { break n };
                        work(&key);
                        n += 1;
                    }
                })
            })
            .collect();
        let (later, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(forward_when_due(requests, tx.clone()));
        Running {
            adder: Arc::new(MpscAdder { now: tx, later }),
            // The channel closes when the last sender (the adder's, and the
            // forwarder's once nothing waits) is gone; the consumers then end.
            drain: Box::pin(async move {
                let processed = join_sum(handles).await;
                Drained {
                    end: Instant::now(),
                    processed,
                }
            }),
        }
    }
}

impl Adder for MpscAdder {
    fn add(&self, key: String) {
        self.now.send(key).expect("the consumers are running");
    }
    fn add_after(&self, key: String, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        self.later
            .send((key, Instant::now() + delay))
            .expect("the forwarder is running");
    }
    fn add_priority(&self, _: String, _: i32) {
        unreachable!("mpsc has no priorities")
    }
}
