//! Tests on the backends `TEST_CLUSTER` selects, through
//! `for_each_backend`: the harness itself and the local API server's
//! behaviour checks. One test binary for both, so a run starts one real
//! cluster (and one local server), which every test shares, each in a
//! namespace of its own.

mod backends;
mod conformance;
