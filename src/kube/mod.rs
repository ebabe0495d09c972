//! Kubernetes controllers on a [`WorkQueue`](crate::WorkQueue): kube-runtime watchers in,
//! reconcilers out (feature `kube`).
//!
//! Two pieces, usable apart:
//!
//! * [`WatchAdapter`] (or [`WatchQueueExt::enqueue`] on a watcher stream)
//!   turns kube-runtime [`watcher`](kube_runtime::watcher()) events into
//!   queue adds. Each object becomes a key (its [`ObjectRef`] by default, or
//!   whatever a key function returns). Objects of the initial list, and
//!   re-deliveries whose `resourceVersion` did not change, go in at a low
//!   priority; real changes and deletions at normal priority, so a fresh
//!   change is not stuck behind a list of thousands of objects. The
//!   priorities are configurable ([`WatchPriorities`]).
//! * [`run_controller`] runs a reconcile function over the queue with
//!   bounded concurrency: an error or a panic requeues the key with the rate
//!   limiter, success forgets its failures, [`Action::RequeueAfter`] re-adds
//!   it after a delay at the same priority, and
//!   [`shutdown_on`](ControllerStream::shutdown_on) shuts down gracefully,
//!   draining the queue.
//!
//! The queue's guarantees carry over: a key is never reconciled twice at
//! once, and a key changed during its reconcile is reconciled again after.
//! Priorities are strict unless the queue has a starvation bound
//! ([`Builder::starvation_bound`](crate::Builder::starvation_bound)): with a
//! steady stream of changes, set one so the low-priority list still moves.
//!
//! The adapter keeps one small entry per watched object (its name, key and
//! last `resourceVersion`), much less than a reflector store.
//!
//! # Dependencies
//!
//! The feature builds on kube-runtime and kube-client 5, which need Rust
//! 1.89 or later.
//!
//! Like every kube-rs library, this feature picks no Kubernetes version: the
//! application enables one on its own `k8s-openapi` dependency (for example
//! `k8s-openapi = { version = "0.29", features = ["latest"] }`), and a TLS
//! stack on its `kube` dependency to reach a real cluster (`kube`'s default
//! features include rustls). The feature `kube-rustls` turns rustls on in
//! `kube-client` from this crate, for programs without a `kube` dependency
//! of their own.
//!
//! # Example
//!
//! A controller over ConfigMaps. Here the watcher is replaced by a few
//! hand-made events, so the example runs anywhere; with a cluster, the
//! events come from `watcher(Api::<ConfigMap>::all(client), Config::default())`
//! (see [`WatchQueueExt`] and the `kube_controller` example).
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_runtime::watcher::Event;
//! use tokio_workqueue::WorkQueue;
//! use tokio_workqueue::kube::{Action, ObjectRef, WatchQueueExt, run_controller};
//!
//! fn cm(name: &str, rv: &str) -> ConfigMap {
//!     let mut cm = ConfigMap::default();
//!     cm.metadata.name = Some(name.into());
//!     cm.metadata.namespace = Some("default".into());
//!     cm.metadata.resource_version = Some(rv.into());
//!     cm
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder().name("configmaps").build();
//!
//! // Watcher events in, keys out. (A real watcher never ends; spawn it.)
//! let events = futures::stream::iter([
//!     Ok(Event::Init),
//!     Ok(Event::InitApply(cm("listed", "1"))),
//!     Ok(Event::InitDone),
//!     Ok(Event::Apply(cm("changed", "2"))),
//! ]);
//! let added = events.enqueue(queue.clone()).count().await;
//! assert_eq!(added, 2);
//!
//! // Reconcile one key at a time; the fresh change goes first.
//! let controller = run_controller(queue.clone(), 1, |key: ObjectRef<ConfigMap>| async move {
//!     // Fetch the object by `key`, compare with what should be, act.
//!     Ok::<_, kube_client::Error>(Action::Done)
//! })
//! .shutdown_on(tokio::time::sleep(Duration::from_millis(100)));
//! let order: Vec<String> = controller.map(|r| r.key.name).collect().await;
//! assert_eq!(order, ["changed", "listed"]);
//! # }
//! ```

mod adapter;
mod controller;

pub use adapter::{
    Cause, Enqueue, EnqueueError, Enqueued, ObjectRefFn, WatchAdapter, WatchPriorities,
    WatchQueueExt,
};
pub use controller::{
    Action, ControllerStream, ReconcileError, Reconciled, Requeued, run_controller,
};
/// The default key: a reference to an object by kind, namespace and name
/// (re-exported from kube-runtime).
pub use kube_runtime::reflector::ObjectRef;
