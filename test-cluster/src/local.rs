//! The local backend: one `LocalApiServer` shared by the tests of a binary.
//!
//! The server runs on a thread and runtime of its own (kube-local-apiserver
//! does that itself), so the shared one outlives each test's runtime, and
//! clients made in any runtime reach it over loopback TCP.

use std::sync::OnceLock;

use kube_local_apiserver::LocalApiServer;

/// The server of this test binary, started on first use and kept for the
/// life of the process.
pub(crate) fn server() -> &'static LocalApiServer {
    static SERVER: OnceLock<LocalApiServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        // `start` is async for its callers' sake but needs no runtime of
        // theirs: a throwaway one drives it here.
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime to start the local API server")
            .block_on(LocalApiServer::start())
    })
}
