//! Tests that start clusters of their own, apart from the backends the
//! other tests share: the fault calls (a proxy, a `ChaosCluster`) and the
//! real cluster's lifecycle (it never outlives the process that started
//! it). One test binary for both.

mod faults;
mod lifecycle;
