//! The work queue Kubernetes controllers are built on, native to tokio.
//!
//! A controller takes keys (say `namespace/name`) from a queue and reconciles
//! each one. This crate gives it the queue, with client-go's guarantees and
//! more:
//!
//! - **A stream of leases.** [`WorkQueue`] is a [`Stream`](futures_core::Stream)
//!   of [`WorkItem`] guards. Dropping a guard ends the lease, so a worker can
//!   never forget to mark a key done, not even when it panics (a dropped
//!   guard counts as a success, though). [`queue.run(n, job)`](WorkQueue::run)
//!   is the main way to use it: unlike `for_each_concurrent`, it survives a
//!   panicking job, which it retries with backoff.
//! - **De-duplicated and stingy.** A key added many times before it is taken
//!   is processed once, and a key is never leased to two workers at once; one
//!   re-added while leased comes back, once, after its lease ends.
//! - **Delays and rate limits.** [`add_after`](WorkQueue::add_after) and
//!   [`add_rate_limited`](WorkQueue::add_rate_limited), with client-go's
//!   [limiters](limiter) and an async [`TokenBucket`] that can also throttle
//!   hand-outs ([`Builder::throttle`]).
//! - **Priorities and lanes**, highest first and FIFO within a priority, with
//!   an optional [starvation bound](Builder::starvation_bound) that Go's
//!   priority queue lacks.
//! - **Swappable orderings** ([`ordering`]): priorities (the default), FIFO,
//!   two lanes, [fair share](FairShare) across tenants such as namespaces,
//!   or an order of your own behind the [`Ordering`] trait, chosen with
//!   [`Builder::ordering`]. The queue's guarantees hold whatever the order,
//!   and the default costs nothing for the choice.
//! - **Partitions**: [`Partitioned`] pins each partition (say, all pods of a
//!   node) to one spawned task, so related keys are handled in order.
//! - **Metrics** through a [hook](metrics::MetricsHook), and with the
//!   `prometheus` feature, the families Go controllers export.
//! - **Kubernetes controllers** live in the companion crate
//!   `tokio-workqueue-kube`: a drop-in for kube-runtime's `Controller` on
//!   this queue, leader election and shards on Leases. This crate never
//!   depends on Kubernetes.
//!
//! # Semantics
//! 1. Fair: keys come out in the order they became ready (FIFO within a
//!    priority). This and 4 and 6 are the default ordering's; another
//!    [ordering](Builder::ordering) decides the order instead, and every
//!    other point holds whatever the ordering.
//! 2. De-duplicated: a key has at most one entry. Adding a ready key changes
//!    nothing (unless it raises its priority); adding a key that waits on a
//!    delay keeps the earlier ready time; an immediate add makes a waiting key
//!    ready now and drops its timer.
//! 3. Stingy: a key added while leased becomes ready when the lease ends, at
//!    the back of its priority level, once however often it was added.
//! 4. Priorities: higher first; a re-add with a higher priority raises a ready
//!    key to the back of the new level, a lower one never lowers it.
//!    [`WorkItem::priority`] tells the priority a key was handed out with, and
//!    `requeue*` keep it.
//! 5. Bounded starvation, when configured: a ready key does not wait longer
//!    than the bound while consumers keep taking keys, whatever its
//!    priority and whatever the ordering.
//! 6. Two [lanes](Lane) are two named priorities.
//! 7. Cancel safe: dropping a `get()` future or a stream at any await point
//!    loses no key.
//! 8. Shutdown: [`shutdown`](WorkQueue::shutdown) refuses new adds (each add
//!    returns [`AddError::ShuttingDown`]) and drops delayed keys; ready keys,
//!    and keys re-added during a lease, are still handed out.
//!    [`shutdown_with_drain`](WorkQueue::shutdown_with_drain) resolves once
//!    nothing is ready and nothing is leased. [`drain`](WorkQueue::drain)
//!    can keep delayed keys (all, or those due soon enough) and run them,
//!    hands back in a [`DrainReport`] the keys whose delays it dropped, and
//!    can give up after a timeout, reporting what was left.
//! 9. Delays: zero means now, delays beyond [`MAX_DELAY`] are clamped, never a
//!    panic. Ready times use tokio's clock, so paused-time tests are exact (to
//!    the millisecond the timer wheel works in).
//!
//! # Example
//! A job runner: up to 4 jobs at once, failures retried with backoff, and a
//! drain at the end that loses nothing without saying so.
//! ```
//! use std::time::Duration;
//! use tokio_workqueue::WorkQueue;
//!
//! async fn reconcile(key: &str) -> Result<(), String> {
//!     println!("reconciled {key}");
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<String> = WorkQueue::new();
//! for name in ["web", "db", "web", "web"] {
//!     queue.add(format!("default/{name}")).unwrap();
//! }
//! assert_eq!(queue.len(), 2); // "default/web" is queued once
//!
//! // A panicking job is a failed attempt of its key alone: retried with
//! // backoff, while the loop goes on.
//! let workers = tokio::spawn(queue.run(4, |item| async move {
//!     match reconcile(item.key()).await {
//!         // Done, and the key's backoff starts over (`done()` and a drop
//!         // keep it).
//!         Ok(()) => item.succeed(),
//!         // Back after the key's backoff; refused once the queue drains.
//!         Err(e) => {
//!             if let Err(refused) = item.requeue_rate_limited() {
//!                 eprintln!("{e}, not retried: {refused}");
//!             }
//!         }
//!     }
//! }));
//!
//! // Retries due within 5 s still run; the report names the keys dropped.
//! let report = queue
//!     .drain()
//!     .wait_for_delayed_within(Duration::from_secs(5))
//!     .await;
//! for key in &report.dropped {
//!     eprintln!("not run: {key}"); // persist or log them
//! }
//! let run = workers.await.unwrap(); // ends once the queue is drained
//! assert_eq!((run.jobs, run.panics), (2, 0));
//! # }
//! ```
//!
//! # Jobs with payloads
//! A key is an identity, and identities de-duplicate: keep the data a job
//! needs beside the queue, keyed the same way, and let the latest payload
//! win. A worker takes the payload when its job starts, so one submitted
//! during the run waits for the next round (the key comes back once), and
//! puts it back if the job fails, unless a newer one came meanwhile.
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use tokio_workqueue::{AddError, WorkQueue};
//!
//! type Payloads = Arc<Mutex<HashMap<u64, String>>>;
//!
//! fn submit(queue: &WorkQueue<u64>, payloads: &Payloads, id: u64, job: &str) -> Result<(), AddError> {
//!     // Before the add, so a worker handed the key finds its payload.
//!     payloads.lock().unwrap().insert(id, job.to_owned());
//!     queue.add(id)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue = WorkQueue::new();
//! let payloads = Payloads::default();
//! submit(&queue, &payloads, 1, "resize a.png to 100px").unwrap();
//! submit(&queue, &payloads, 1, "resize a.png to 200px").unwrap(); // wins
//! submit(&queue, &payloads, 2, "resize b.png to 100px").unwrap();
//!
//! queue.shutdown(); // the two ready jobs still run
//! let ran = Arc::new(Mutex::new(Vec::new()));
//! let report = queue
//!     .run(2, |item| {
//!         let (payloads, ran) = (payloads.clone(), ran.clone());
//!         async move {
//!             let Some(job) = payloads.lock().unwrap().remove(item.key()) else {
//!                 return; // already done in an earlier round
//!             };
//!             let ok = true; // ... run the job ...
//!             if ok {
//!                 ran.lock().unwrap().push(job);
//!                 item.succeed();
//!             } else {
//!                 payloads.lock().unwrap().entry(*item.key()).or_insert(job);
//!                 let _ = item.requeue_rate_limited();
//!             }
//!         }
//!     })
//!     .await;
//! assert_eq!(report.jobs, 2);
//! let mut ran = ran.lock().unwrap().clone();
//! ran.sort();
//! assert_eq!(ran, ["resize a.png to 200px", "resize b.png to 100px"]);
//! # }
//! ```
//!
//! # Cost
//! An undelayed queue runs no background task. Its keys are split by hash
//! across shards (64 by default, see [`Builder::shards`]), and each add,
//! hand-out and lease end takes the lock of one shard once, briefly, so
//! threads rarely wait for one another; the queue still hands out one order
//! (highest priority first, FIFO within a priority). Each key that becomes
//! ready wakes at most one waiting consumer, and with none waiting an add
//! takes no other lock. A waiting consumer (a `get`, or the queue polled as
//! a stream) keeps its wait inline and allocates nothing while it waits. A
//! queue keeps, per key, one 48-byte slot (for `String` keys) and a 4-byte
//! index entry; a key waiting on a delay also
//! holds one timer entry, released when the key leaves the wait.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(rust_2018_idioms)]

mod builder;
mod catch;
mod clock;
mod drain;
mod error;
mod item;
mod item_ext;
mod key;
mod lane;
mod lanes;
pub mod limiter;
pub mod metrics;
mod nodes;
mod options;
pub mod ordering;
pub mod partition;
mod prefetch;
mod queue;
mod segmented;
mod shard;
mod shared;
mod shown;
mod slot;
mod state;
mod sync;
mod take;
mod throttle;
mod timer;
mod waiters;
mod workers;

/// The lock of `src/sync/lock.rs`, for its loom model (`tests/loom_lock.rs`), reachable
/// only in the loom build.
#[cfg(tokio_workqueue_loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::sync::lock::{Mutex, new_mutex};
}

pub use builder::Builder;
pub use drain::{Drain, DrainReport};
pub use error::AddError;
pub use item::WorkItem;
pub use key::Key;
pub use limiter::{
    ExponentialBackoff, FastSlow, InvalidLimiter, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
    default_controller_rate_limiter,
};
pub use options::{AddOpts, Lane};
pub use ordering::{FairShare, Fifo, Ordering, Priorities};
pub use partition::{
    PanicSource, PartitionHandle, PartitionPanic, Partitioned, PartitionedBuilder, ZeroPartitions,
};
pub use queue::WorkQueue;
pub use state::MAX_DELAY;
pub use workers::{RunReport, WorkerPanic, Workers};

/// The README's code blocks, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
