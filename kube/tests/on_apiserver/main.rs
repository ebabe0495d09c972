//! End to end against every API server `TEST_CLUSTER` selects: the local
//! one and a real kube-apiserver (`kube-test-cluster`, built from Go on
//! first use). One test binary for them all, so a run starts one real
//! cluster and one local server, which these tests share, each in a
//! namespace of its own. What acts on a whole server (expired watches,
//! injected faults) runs on a local server of the test's own, and request
//! counts are read on the test's own server or endpoint.

#[path = "../manager_common/mod.rs"]
mod manager_common;
#[path = "../replica_common/mod.rs"]
mod replica_common;

/// Waits until `done` holds, polling every 10 ms; panics naming `what`
/// once `limit` has passed (real time: these tests talk to real servers).
async fn eventually(limit: std::time::Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

mod controller;
#[cfg(feature = "prometheus")]
mod controller_failures;
mod list_watch_server;
mod manager;
mod secure_metrics;
mod shards;
