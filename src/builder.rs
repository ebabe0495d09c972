//! Configuring a queue before it is built.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::WorkQueue;
use crate::limiter::{RateLimiter, TokenBucket, default_controller_rate_limiter};
use crate::metrics::MetricsHook;
use crate::throttle::Throttle;

/// Configures a [`WorkQueue`]: its name, rate limiter, metrics, starvation
/// bound and hand-out throttle.
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
pub struct Builder<K> {
    name: String,
    limiter: Option<Box<dyn RateLimiter<K>>>,
    metrics: Option<Box<dyn MetricsHook>>,
    starvation_bound: Option<Duration>,
    throttle: Option<Box<dyn Throttle>>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Builder<K> {
    /// An unnamed FIFO queue with the default controller rate limiter.
    pub fn new() -> Self {
        Builder {
            name: String::new(),
            limiter: None,
            metrics: None,
            starvation_bound: None,
            throttle: None,
        }
    }

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
    /// whatever its priority.
    ///
    /// How: ready keys are also kept in the order they became ready. At each
    /// hand-out, if the oldest ready key has waited half the bound or more, it
    /// is handed out before any higher priority; otherwise the highest
    /// priority goes first as usual. The other half of the bound is headroom,
    /// so a backlog of old keys drains within the bound as long as it is not
    /// larger than what consumers take in half the bound.
    ///
    /// Cost: one clock read per key made ready and per hand-out, and a ready
    /// time and two links (24 bytes) per key slot. A zero bound hands keys out
    /// strictly in the order they became ready, ignoring priorities.
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

    /// Builds the queue. It needs no runtime until its first delayed add.
    pub fn build(self) -> WorkQueue<K> {
        WorkQueue::from_builder(
            self.name,
            self.limiter
                .unwrap_or_else(|| Box::new(default_controller_rate_limiter())),
            self.metrics,
            self.starvation_bound,
            self.throttle,
        )
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Builder<K> {
    /// The name given to [`name`](Self::name) (empty by default).
    pub(crate) fn get_name(&self) -> &str {
        &self.name
    }

    /// `n` builders for the partitions of one queue: they share this one's
    /// rate limiter, metrics hook and throttle, keep its starvation bound,
    /// and keep its name.
    ///
    /// One name, not `{name}-{i}`: the partitions share one metrics hook,
    /// and a `PrometheusMetrics` handle serves queues of one name only (it
    /// panics on a second name).
    /// Under one name their series add up, as one queue's would.
    pub(crate) fn split(self, n: usize) -> Vec<Builder<K>> {
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
            })
            .collect()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Default for Builder<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for Builder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("rate_limiter", &self.limiter.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("starvation_bound", &self.starvation_bound)
            .field("throttle", &self.throttle.is_some())
            .finish()
    }
}
