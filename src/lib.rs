//! The work queue Kubernetes controllers are built on, native to tokio.
//!
//! A controller takes keys (say `namespace/name`) from a queue and reconciles
//! each one. This crate gives it the queue, with client-go's guarantees and
//! more:
//!
//! - **A stream of leases.** [`WorkQueue`] is a [`Stream`](futures_core::Stream)
//!   of [`WorkItem`] guards. Dropping a guard ends the lease, so a worker can
//!   never forget to mark a key done, not even when it panics.
//!   `queue.for_each_concurrent(n, reconcile)` is the main way to use it.
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
//!    nothing is ready and nothing is leased.
//! 9. Delays: zero means now, delays beyond [`MAX_DELAY`] are clamped, never a
//!    panic. Ready times use tokio's clock, so paused-time tests are exact (to
//!    the millisecond the timer wheel works in).
//!
//! # Example
//! ```
//! use futures::StreamExt;
//! use tokio_workqueue::WorkQueue;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<String> = WorkQueue::new();
//! for name in ["web", "db", "web", "web"] {
//!     queue.add(format!("default/{name}")).unwrap();
//! }
//! assert_eq!(queue.len(), 2); // "default/web" is queued once
//!
//! let workers = tokio::spawn(queue.clone().for_each_concurrent(4, |item| async move {
//!     // Reconcile item.key(); dropping `item` marks it done.
//!     println!("reconciled {}", item.key());
//! }));
//! queue.shutdown_with_drain().await; // waits for both keys to be processed
//! workers.await.unwrap();
//! # }
//! ```
//!
//! # Cost
//! An undelayed queue runs no background task. Each add, hand-out and lease
//! end takes one lock once, briefly; each key that becomes ready wakes at most
//! one parked consumer. A queue keeps, per key, one 48-byte slot (for `String`
//! keys) and a 4-byte index entry; a key waiting on a delay also holds one
//! timer entry, released when the key leaves the wait.
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(rust_2018_idioms)]

mod builder;
mod error;
mod item;
mod key;
pub mod limiter;
pub mod metrics;
mod options;
pub mod ordering;
pub mod partition;
mod prefetch;
mod queue;
mod shared;
mod state;
mod sync;
mod throttle;
mod timer;

pub use builder::Builder;
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

/// The README's code blocks, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
