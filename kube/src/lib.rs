//! Kubernetes controllers on a [`WorkQueue`](tokio_workqueue::WorkQueue): kube-runtime
//! watchers in, reconcilers out.
//!
//! Migrating from kube-runtime: add this crate and change one import,
//! `use kube::runtime::Controller` to `use tokio_workqueue_kube::Controller`.
//! Reconcilers, error policies and the result stream stay as they are.
//!
//! Two layers, usable apart:
//!
//! * [`Controller`] is kube-runtime's controller with the same builder and
//!   the same `run`: a reconciler, error policy and result-stream consumer
//!   written for `kube::runtime::Controller` work unchanged. Underneath, keys
//!   wait in a priority queue with per-key backoff, metrics, a finite
//!   concurrency and a drain on shutdown.
//! * [`WatchAdapter`] (or [`WatchQueueExt::enqueue`] on a watcher stream)
//!   turns watcher events into queue adds with a priority per [`Cause`], for
//!   programs that drive a [`WorkQueue`](tokio_workqueue::WorkQueue) themselves
//!   (`queue.for_each_concurrent(n, ...)`).
//!
//! Several replicas of a controller coordinate through a Lease:
//! [`Controller::leader_election`] reconciles only on the replica that
//! leads, and [`leader`] holds the elector, usable on its own for any
//! singleton work.
//!
//! # The controller
//!
//! [`Controller::run`] takes keys from the queue only once the reflector
//! store's first list is complete, and reconciles the object as the store
//! holds it (no GET per reconcile). What decides the order:
//!
//! | what queued the key | priority ([`WatchPriorities`]) |
//! | --- | --- |
//! | the first list, and children's first lists | `initial_list` (-100) |
//! | an object delivered again with the `resourceVersion` last seen (a re-list after `410 Gone` or a restarted watch) | `unchanged` (-100) |
//! | [`reconcile_all_on`](Controller::reconcile_all_on) | `unchanged` (-100) |
//! | a new object or a new `resourceVersion` (also when a re-list shows one) | `changed` (0) |
//! | a child's or related object's deletion | `deleted` (0) |
//! | [`reconcile_on`](Controller::reconcile_on) | `changed` (0) |
//!
//! A requeue keeps the priority its key was handed out with. Within a
//! priority keys come out FIFO, and a key is never reconciled twice at once
//! (changed while reconciling, it is reconciled once more afterwards).
//!
//! After a reconcile:
//!
//! * `Ok(Action::requeue(d))`: the key's failures are forgotten and it comes
//!   back after `d` (a change before then brings it back at once, and the
//!   earlier time wins);
//! * `Ok(Action::await_change())`: failures forgotten, nothing queued;
//! * `Err(e)`: `error_policy` is asked; `Action::requeue(d)` brings the key
//!   back after the larger of `d` and the queue rate limiter's per-key delay
//!   (exponential per key by default, so a failing key backs off however
//!   short `d` is, and starts from the base again after a success:
//!   kube-rs#1916); `await_change()` does not bring it back;
//! * a panic or a [`reconcile_timeout`](Controller::reconcile_timeout): an
//!   error for that key only, requeued through the rate limiter and
//!   reported on the stream as a [`ControllerError`] in kube-runtime's
//!   `QueueError` slot.
//!
//! Keys whose object has left the store are not reconciled (kube-runtime's
//! rule: clean-up goes through finalizers) and are reported as
//! `ObjectNotFound`. Each reconcile runs in a tracing span named
//! `reconciling object` with `object.ref` and `object.reason` (kube-runtime's
//! [`ReconcileReason`]).
//!
//! ## Differences from kube-runtime
//!
//! | | kube-runtime | here |
//! | --- | --- | --- |
//! | concurrency | unbounded by default | [`DEFAULT_CONCURRENCY`]; `with_config` concurrency 0 keeps it |
//! | order | by when a key was scheduled | by priority, then FIFO; keys wait in the queue while workers are busy |
//! | errors | requeued when `error_policy` says | the larger of `error_policy`'s delay and a per-key backoff that resets on success |
//! | panics, timeouts | a panic ends the task, the key is not retried | an error for that key, retried with backoff, reported on the stream |
//! | first reconcile | may run before the store is complete | after the store's first list |
//! | graceful shutdown | drops what is queued | reconciles what is queued (delayed keys are dropped) |
//! | `debounce` | trailing | the add is delayed; the first trigger's time wins |
//! | `for_stream`, `owns_stream`, `watches_stream`, `reconcile_on` | behind unstable features | stable |
//! | metrics | none | the queue's `workqueue_*` and controller-runtime's `controller_runtime_*` families (feature `prometheus`) |
//! | leader election | none (kube-rs#485) | [`leader_election`](Controller::leader_election) on Leases, with self-fencing |
//! | a key's `ObjectRef` (results, errors, spans) | carries the `resourceVersion` and `uid` of the object as first triggered (`extra`) | namespace and name only, `extra` empty (two allocations less per queued key); the store's object has both |
//!
//! kube-runtime's `Action` and `Config` keep their fields private; this
//! controller reads them through their `Debug` text, checked by rebuilding
//! the value, with tests pinning kube-runtime 5's format. An `Action` that
//! cannot be read is reported ([`ControllerError::UnreadableAction`]) and
//! the key requeued with backoff.
//!
//! # Example
//!
//! The events come from a hand-made stream here, so the example runs
//! anywhere; with a cluster, `Controller::new(Api::<ConfigMap>::all(client),
//! watcher::Config::default())` watches it (see the `configmap_generator`
//! example).
//!
//! ```
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_runtime::reflector::store::Writer;
//! use kube_runtime::watcher::Event;
//! use tokio_workqueue_kube::{Action, Controller};
//!
//! fn cm(name: &str, rv: &str) -> ConfigMap {
//!     let mut cm = ConfigMap::default();
//!     cm.metadata.name = Some(name.into());
//!     cm.metadata.namespace = Some("default".into());
//!     cm.metadata.resource_version = Some(rv.into());
//!     cm
//! }
//!
//! #[derive(Debug)]
//! struct Error;
//! impl std::fmt::Display for Error {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("failed")
//!     }
//! }
//! impl std::error::Error for Error {}
//!
//! // A reconciler and error policy exactly as written for kube-runtime.
//! async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, Error> {
//!     println!("reconciling {}", cm.metadata.name.as_deref().unwrap_or_default());
//!     Ok(Action::await_change())
//! }
//! fn error_policy(_cm: Arc<ConfigMap>, _error: &Error, _ctx: Arc<()>) -> Action {
//!     Action::requeue(std::time::Duration::from_secs(5))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let events = futures::stream::iter([
//!     Ok(Event::Init),
//!     Ok(Event::InitApply(cm("listed", "1"))),
//!     Ok(Event::InitDone),
//!     Ok(Event::Apply(cm("changed", "2"))),
//! ]);
//! // The stream ends, so the controller drains and ends too.
//! let reconciled: Vec<String> = Controller::for_events(events, Writer::default())
//!     .concurrency(1)
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .map(|result| result.unwrap().0.name)
//!     .collect()
//!     .await;
//! // The fresh change went first, then the initial list.
//! assert_eq!(reconciled, ["changed", "listed"]);
//! # }
//! ```
//!
//! # Dependencies
//!
//! The crate builds on kube-runtime and kube-client 5, which need Rust
//! 1.89 or later, and on the public API of `tokio-workqueue`.
//!
//! Like every kube-rs library, this crate picks no Kubernetes version: the
//! application enables one on its own `k8s-openapi` dependency (for example
//! `k8s-openapi = { version = "0.29", features = ["latest"] }`), and a TLS
//! stack on its `kube` dependency to reach a real cluster (`kube`'s default
//! features include rustls). The feature `rustls` turns rustls on in
//! `kube-client` from this crate, for programs without a `kube` dependency
//! of their own.

#![warn(missing_docs)]
#![deny(rust_2018_idioms)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod adapter;
mod controller;
pub mod leader;
mod lease;
pub mod manager;
#[cfg(feature = "prometheus")]
pub mod metrics;
pub mod ordering;
pub mod shard;
mod signals;
mod triage;
mod watch_backoff;

pub use adapter::{
    Enqueue, EnqueueError, Enqueued, ObjectRefFn, WatchAdapter, WatchPriorities, WatchQueueExt,
};
pub use controller::{
    Controller, ControllerError, DEFAULT_CONCURRENCY, RunResult, Runner, set_requeue_priority,
};
/// kube-runtime's reconcile answer, used unchanged: `Action::requeue(d)` or
/// `Action::await_change()`.
pub use kube_runtime::controller::Action;
/// kube-runtime's controller settings, accepted by
/// [`Controller::with_config`].
pub use kube_runtime::controller::Config;
/// kube-runtime's error enum, the error side of [`Controller::run`]'s items.
pub use kube_runtime::controller::Error;
/// Why a reconcile was queued, as recorded in each reconcile's tracing span.
pub use kube_runtime::controller::ReconcileReason;
/// The default key: a reference to an object by kind, namespace and name
/// (re-exported from kube-runtime).
pub use kube_runtime::reflector::ObjectRef;
pub use manager::{Manager, ManagerError};
pub use triage::Cause;

/// The README's code blocks, compiled and run as doc-tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
