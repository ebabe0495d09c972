//! The `Controller` and the watcher adapter without an API server, fed
//! hand-made watcher events and stores (timings on paused tokio time). One
//! module per behaviour, one test binary for them all: each binary links
//! kube, k8s-openapi and hyper, tens of MB apiece.

mod common;

mod concurrency;
mod drop_in;
mod failures;
#[cfg(feature = "prometheus")]
mod metrics;
mod ordering;
mod owners_and_mappers;
mod priorities;
mod requeue_and_backoff;
mod shared_streams;
mod shutdown;
mod store_gate;
mod tracing_spans;
mod watch_priorities;
