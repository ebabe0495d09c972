//! Replicas in one process, each with an endpoint and a client of its own
//! on a local API server of each test's own, on short real timings: leader
//! election and shards through crashes, cuts, joins and skewed clocks. One
//! test binary for both.

#[path = "../replica_common/mod.rs"]
mod replica_common;

mod leader_election;
mod shards;
