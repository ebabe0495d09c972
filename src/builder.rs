//! Configuring a queue before it is built.

use crate::Key;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::WorkQueue;
use crate::limiter::{RateLimiter, TokenBucket, default_controller_rate_limiter};
use crate::metrics::MetricsHook;
use crate::ordering::{Ordering, Priorities};
use crate::shard::{DEFAULT_SHARDS, PARTITION_SHARDS};
use crate::throttle::Throttle;

/// Configures a [`WorkQueue`]: its name, rate limiter, metrics, starvation
/// bound, hand-out throttle and [ordering](Self::ordering).
///
/// ```
/// use std::time::Duration;
/// use tokio_workqueue::{ExponentialBackoff, WorkQueue};
///
/// let queue: WorkQueue<String> = WorkQueue::builder()
///     .name("pods")
///     .rate_limiter(ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(60)).unwrap())
///     .starvation_bound(Duration::from_secs(10))
///     .build();
/// assert_eq!(queue.name(), "pods");
/// ```
pub struct Builder<K, O = Priorities> {
    name: String,
    limiter: Option<Box<dyn RateLimiter<K>>>,
    metrics: Option<Box<dyn MetricsHook>>,
    starvation_bound: Option<Duration>,
    throttle: Option<Box<dyn Throttle>>,
    ordering: O,
    /// `None`: the default, which a partition's builder sets lower.
    shards: Option<usize>,
}

impl<K: Key> Builder<K> {
    /// An unnamed queue with the default ordering ([`Priorities`]: FIFO
    /// within a priority) and the default controller rate limiter.
    pub fn new() -> Self {
        Builder {
            name: String::new(),
            limiter: None,
            metrics: None,
            starvation_bound: None,
            throttle: None,
            ordering: Priorities::new(),
            shards: None,
        }
    }
}

impl<K: Key, O: Ordering<K>> Builder<K, O> {
    /// The queue's name: the `name` label of its metrics.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The limiter behind rate-limited adds and requeues. The default is
    /// [`default_controller_rate_limiter`], client-go's default.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K>) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// A hook that receives the queue's events and can read its gauges.
    /// Without one, the queue reads no clock for metrics.
    pub fn metrics(mut self, hook: impl MetricsHook) -> Self {
        self.metrics = Some(Box::new(hook));
        self
    }

    /// Bounds how long a ready key can wait while consumers keep taking keys,
    /// whatever its priority and whatever the [ordering](Self::ordering).
    ///
    /// How: ready keys are also kept in the order they became ready. At each
    /// hand-out, if the oldest ready key has waited half the bound or more, it
    /// is handed out before any higher priority; otherwise the ordering's
    /// choice goes first as usual. The other half of the bound is headroom,
    /// so a backlog of old keys drains within the bound as long as it is not
    /// larger than what consumers take in half the bound.
    ///
    /// A key's wait counts from its ready time, the clock reading its add
    /// took before taking its shard's lock. A hand-out reads every shard's
    /// oldest ready time only once one can be past the bound, by what the
    /// last such look saw; so a key whose add took effect well after its
    /// reading (its thread stopped in between) may wait up to the bound
    /// from when the add took effect instead.
    ///
    /// Cost: one clock read per key made ready and per hand-out, and a ready
    /// time and two links (24 bytes) per key slot. A zero bound hands keys out
    /// strictly in the order they became ready, ignoring priorities and the
    /// ordering.
    ///
    /// Off by default: strict priority, as in controller-runtime.
    pub fn starvation_bound(mut self, bound: Duration) -> Self {
        self.starvation_bound = Some(bound);
        self
    }

    /// Caps how fast keys are handed out: each hand-out takes a token from
    /// `bucket`, and a consumer waits for one when the bucket is empty.
    /// Tokens are only taken when a key is there to hand out.
    pub fn throttle(mut self, bucket: TokenBucket) -> Self {
        self.throttle = Some(Box::new(bucket));
        self
    }

    /// How many shards the queue splits its keys into (rounded up to a
    /// power of two, at most 64, which is the default; a
    /// [partition](crate::partition)'s is 8).
    ///
    /// Each shard has its own lock, so adds, hand-outs and lease ends on
    /// different threads rarely wait for one another. The queue still hands
    /// out one order across its shards: every key made ready pushes a
    /// ticket to a lane of its priority, which all shards share, and a
    /// hand-out takes the key of the highest lane's front ticket. Only an
    /// ordering that hands out highest priority first and FIFO within a
    /// priority can be kept this way ([`Ordering::split`]): the default
    /// [`Priorities`] can; with any other the queue has one shard whatever
    /// this says ([`WorkQueue::shards`] tells).
    ///
    /// A ticket names its shard and slot in 32 bits, so in a queue of `n`
    /// shards (more than one) a shard holds at most `2^32 / n - 1` keys
    /// (67 million with 64, 4.3 billion in all); the add past that panics,
    /// saying so.
    ///
    /// One shard costs the least per operation on one thread, and the least
    /// memory; more pay off with more threads adding and taking at once.
    /// On a 2-core machine, 8 shards took the futex calls of the `W1`
    /// benchmark (a producer and 4 consumers) from about 30 to 0.1-0.3 per
    /// 1,000 keys (each is a thread parked on, or woken from, a contended
    /// lock), and 64 ran it 1.46x as fast as 8 on an Intel VM, where a
    /// lock found taken costs more than the operation it waits for.
    /// Fewer cost less memory (an empty queue of 64 shards holds about
    /// 110 KB, of 8 about 31 KB, of one 3 KB) and run a little faster
    /// with a single consumer thread (about 2-4% in `W1-100k` with the
    /// consumers in one task). A queue with a starvation bound reads every
    /// shard's oldest ready time at each hand-out; 64 shards still ran `W1`
    /// with a bound 1.16x as fast as 8 on that VM.
    ///
    /// ```
    /// use tokio_workqueue::WorkQueue;
    ///
    /// let queue: WorkQueue<String> = WorkQueue::builder().shards(4).build();
    /// # drop(queue);
    /// ```
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Which ready key is handed out next: see [`crate::ordering`].
    ///
    /// The default is [`Priorities`]. The built-ins are
    /// [`Fifo`](crate::Fifo), [`Priorities`],
    /// [`TwoLanes`](crate::ordering::TwoLanes) and
    /// [`FairShare`](crate::FairShare) (round-robin across tenants within a
    /// priority); any type that implements [`Ordering`] will do. The queue's
    /// type names its ordering: `WorkQueue<K, O>`.
    ///
    /// Whatever the ordering, the queue keeps its guarantees: one entry and
    /// one lease per key, delays, the rate limiter, shutdown and drain,
    /// metrics, and the [starvation bound](Self::starvation_bound), which
    /// applies to every ordering.
    ///
    /// ```
    /// use tokio_workqueue::{FairShare, WorkQueue};
    ///
    /// // One tenant per namespace (keys are "namespace/name").
    /// let queue: WorkQueue<String, _> = WorkQueue::builder()
    ///     .name("pods")
    ///     .ordering(FairShare::new(|key: &String| {
    ///         key.split_once('/').map_or("", |(ns, _)| ns).to_string()
    ///     }))
    ///     .build();
    /// # drop(queue);
    /// ```
    pub fn ordering<P: Ordering<K>>(self, ordering: P) -> Builder<K, P> {
        Builder {
            name: self.name,
            limiter: self.limiter,
            metrics: self.metrics,
            starvation_bound: self.starvation_bound,
            throttle: self.throttle,
            ordering,
            shards: self.shards,
        }
    }

    /// Builds the queue. It needs no runtime until its first delayed add.
    pub fn build(self) -> WorkQueue<K, O> {
        WorkQueue::from_builder(
            self.name,
            self.limiter
                .unwrap_or_else(|| Box::new(default_controller_rate_limiter())),
            self.metrics,
            self.starvation_bound,
            self.throttle,
            self.ordering,
            self.shards.unwrap_or(DEFAULT_SHARDS),
        )
    }
}

impl<K, O> Builder<K, O> {
    /// The name given to [`name`](Self::name) (empty by default), for code
    /// that labels its own metrics after the queue it configures.
    pub fn queue_name(&self) -> &str {
        &self.name
    }
}

impl<K: Key, O: Ordering<K> + Clone> Builder<K, O> {
    /// `n` builders that share this one's rate limiter, metrics hook and
    /// throttle, and keep its name, starvation bound and ordering.
    pub(crate) fn split(self, n: usize) -> Vec<Builder<K, O>> {
        let limiter: Arc<dyn RateLimiter<K>> = match self.limiter {
            Some(limiter) => Arc::from(limiter),
            None => Arc::new(default_controller_rate_limiter()),
        };
        let metrics: Option<Arc<dyn MetricsHook>> = self.metrics.map(Arc::from);
        let throttle: Option<Arc<dyn Throttle>> = self.throttle.map(Arc::from);
        (0..n)
            .map(|_| Builder {
                name: self.name.clone(),
                limiter: Some(Box::new(limiter.clone())),
                metrics: metrics.clone().map(|m| Box::new(m) as Box<dyn MetricsHook>),
                starvation_bound: self.starvation_bound,
                throttle: throttle.clone().map(|t| Box::new(t) as Box<dyn Throttle>),
                ordering: self.ordering.clone(),
                shards: Some(self.shards.unwrap_or(PARTITION_SHARDS)),
            })
            .collect()
    }
}

impl<K: Key> Default for Builder<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, O> fmt::Debug for Builder<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("rate_limiter", &self.limiter.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("starvation_bound", &self.starvation_bound)
            .field("throttle", &self.throttle.is_some())
            .field("ordering", &std::any::type_name::<O>())
            .field("shards", &self.shards)
            .finish()
    }
}

// How a queue is made, kept beside the builder that makes it: the queue
// module then never names the builder, which names the queue.
impl<K: Key> WorkQueue<K> {
    /// A queue with the default ordering ([`Priorities`]: FIFO within a
    /// priority), the default controller rate limiter and no metrics.
    pub fn new() -> Self {
        Builder::new().build()
    }

    /// Starts configuring a queue: name, rate limiter, metrics, starvation
    /// bound, throttle, ordering.
    pub fn builder() -> Builder<K> {
        Builder::new()
    }
}

impl<K: Key> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}
