//! The local API server through real clients (kube-client, kube-runtime's
//! watcher, HTTP by hand), each test on a server of its own. One module
//! per behaviour, one test binary for them all: each binary links
//! kube-client and k8s-openapi, tens of MB apiece.

// The checks need the `conformance` feature. Inside this repository the
// self dev-dependency turns it on; in the published crate (where that
// dev-dependency is left out) `cargo test` leaves them out instead of
// failing to compile them, and `--features conformance` runs them.
#[cfg(feature = "conformance")]
mod conformance_checks;
mod endpoints_and_faults;
mod http_keep_alive_and_bad_requests;
mod request_counts_and_backdoors;
mod watch_compaction_and_bookmarks;
