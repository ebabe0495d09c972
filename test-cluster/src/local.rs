//! The local backend: one `LocalApiServer` per test binary, on a runtime of
//! its own.
//!
//! A server started inside a `#[tokio::test]` lives on that test's runtime
//! and dies with it, so a server shared by the tests of a binary runs on a
//! dedicated thread whose runtime never ends. Its clients are plain TCP
//! clients, so each test makes its own inside its own runtime.

use std::sync::OnceLock;
use std::sync::mpsc;

use kube_local_apiserver::LocalApiServer;

/// The server of this test binary, started on first use.
pub(crate) fn server() -> &'static LocalApiServer {
    static SERVER: OnceLock<&'static LocalApiServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("local-apiserver".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("local-apiserver-worker")
                    .enable_all()
                    .build()
                    .expect("a runtime for the local API server");
                runtime.block_on(async move {
                    let server: &'static LocalApiServer =
                        Box::leak(Box::new(LocalApiServer::start().await));
                    let _ = tx.send(server);
                    std::future::pending::<()>().await
                })
            })
            .expect("spawn the local API server's thread");
        rx.recv().expect("the local API server starts")
    })
}
