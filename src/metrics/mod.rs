//! Metrics: a hook the queue calls, and what it can read at scrape time.
//!
//! A queue built with [`Builder::metrics`](crate::Builder::metrics) calls its
//! [`MetricsHook`] for events (adds, retries, hand-outs with how long the key
//! was ready, lease ends with how long the work took) and hands it a [`Probe`]
//! once, at build time, from which gauges (depth by priority, unfinished work,
//! the longest running lease) are read when they are scraped. So the gauges
//! need no background task, can never drift from the queue, and stop with it.
//!
//! A queue without a hook reads no clock and keeps no times: metrics cost
//! nothing unless they are asked for.
//!
//! ```
//! use std::sync::Mutex;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use tokio_workqueue::metrics::{MetricsHook, Probe};
//! use tokio_workqueue::WorkQueue;
//!
//! #[derive(Default)]
//! struct Adds(AtomicU64, Mutex<Option<Probe>>);
//! impl MetricsHook for Adds {
//!     fn bind(&self, _name: &str, probe: Probe) {
//!         *self.1.lock().unwrap() = Some(probe);
//!     }
//!     fn add(&self) {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!     }
//! }
//!
//! let hook = std::sync::Arc::new(Adds::default());
//! let queue = WorkQueue::builder().name("demo").metrics(hook.clone()).build();
//! queue.add("a").unwrap();
//! queue.add("a").unwrap(); // de-duplicated: not an add
//! assert_eq!(hook.0.load(Ordering::Relaxed), 1);
//! let snapshot = hook.1.lock().unwrap().as_ref().unwrap().snapshot().unwrap();
//! assert_eq!(snapshot.depth(), 1);
//! ```

#[cfg(feature = "prometheus")]
pub mod prometheus;

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Receives a queue's events. Every method has an empty default.
///
/// Methods are called outside the queue's lock, from whichever task made the
/// call, so they must be cheap and must not block.
pub trait MetricsHook: Send + Sync + 'static {
    /// Called once, when the queue is built, with its name and a probe that
    /// reads its gauges. The probe holds no strong reference to the queue.
    fn bind(&self, name: &str, probe: Probe) {
        let _ = (name, probe);
    }
    /// A key joined the set of keys waiting to be processed (client-go's
    /// `adds`): it became ready, or was marked for another round while leased.
    /// Adds that merge into a key already pending are not counted, and a
    /// delayed add counts when its delay ends.
    fn add(&self) {}
    /// A rate-limited add or requeue was accepted (client-go's `retries`).
    fn retry(&self) {}
    /// A key was handed out after being ready for `waited`.
    fn handed_out(&self, waited: Duration) {
        let _ = waited;
    }
    /// A lease ended after `worked`.
    fn done(&self, worked: Duration) {
        let _ = worked;
    }
}

impl<H: MetricsHook + ?Sized> MetricsHook for Arc<H> {
    fn bind(&self, name: &str, probe: Probe) {
        (**self).bind(name, probe)
    }
    fn add(&self) {
        (**self).add()
    }
    fn retry(&self) {
        (**self).retry()
    }
    fn handed_out(&self, waited: Duration) {
        (**self).handed_out(waited)
    }
    fn done(&self, worked: Duration) {
        (**self).done(worked)
    }
}

/// The gauges of a queue at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Ready keys per priority level, highest first; empty levels left out.
    pub ready_by_priority: Vec<(i32, usize)>,
    /// Keys leased to workers.
    pub in_flight: usize,
    /// Keys waiting on a delay.
    pub waiting: usize,
    /// Sum of how long each lease in flight has run (client-go's
    /// `unfinished_work_seconds`).
    pub unfinished_work: Duration,
    /// How long the oldest lease in flight has run (client-go's
    /// `longest_running_processor_seconds`).
    pub longest_running: Duration,
}

impl Snapshot {
    /// All ready keys (client-go's `depth`).
    pub fn depth(&self) -> usize {
        self.ready_by_priority.iter().map(|&(_, n)| n).sum()
    }
}

pub(crate) trait Source: Send + Sync {
    fn snapshot(&self) -> Snapshot;
}

/// Reads a queue's gauges. Holds the queue weakly: once the queue is gone,
/// [`snapshot`](Probe::snapshot) returns `None`.
#[derive(Clone)]
pub struct Probe {
    pub(crate) source: Weak<dyn Source>,
}

impl Probe {
    /// The queue's gauges now, or `None` if the queue was dropped.
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.source.upgrade().map(|s| s.snapshot())
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("alive", &(self.source.strong_count() > 0))
            .finish()
    }
}
