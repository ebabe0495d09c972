//! The `Manager` on local API servers of each test's own: its caches,
//! probes, metrics endpoint and shutdown, and one leader election for all
//! its controllers across two replicas. One test binary for both.

#[path = "../manager_common/mod.rs"]
mod manager_common;
#[path = "../replica_common/mod.rs"]
mod replica_common;

mod leader_election;
mod manager;
