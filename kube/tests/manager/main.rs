//! The `Manager` on local API servers of each test's own: its caches,
//! probes, metrics endpoint (over TLS too) and shutdown, on a real SIGTERM
//! too, and one leader election, or one shard membership (splitting the caches
//! too), for all its controllers across replicas. One test binary for them all.

#[path = "../manager_common/mod.rs"]
mod manager_common;
#[path = "../replica_common/mod.rs"]
mod replica_common;

mod leader_election;
mod manager;
mod shards;
mod sigterm;
mod split_caches;
#[cfg(feature = "tls")]
mod tls;
