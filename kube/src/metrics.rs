//! Prometheus metrics (feature `prometheus`): the controller's
//! `controller_runtime_*` families, and the queue's `workqueue_*` families
//! re-exported from [`tokio_workqueue::metrics::prometheus`], so one import
//! serves an operator.
//!
//! Leader election and shards have their own gauges:
//! [`LeaderMetrics`](crate::leader::LeaderMetrics) and
//! [`ShardMetrics`](crate::shard::ShardMetrics).

pub use crate::controller::metrics::{ControllerMetrics, RECONCILE_TIME_BUCKETS};
pub use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
