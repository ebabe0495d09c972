//! The manager's endpoint over TLS (`Manager::serve_tls`, feature `tls`):
//! the probes and `/metrics` answer over HTTPS to a client that trusts the
//! certificate, plain HTTP gets no answer, a rotated certificate is served
//! without a restart, and files that cannot be used are refused when
//! `serve_tls` is called. The fixtures are in `tests/fixtures/tls/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube_local_apiserver::LocalApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_workqueue_kube::{Manager, ManagerError};

use crate::manager_common::{Running, get};

const LIMIT: Duration = Duration::from_secs(10);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// `GET path` over TLS to `localhost` at `addr`, trusting only the
/// certificates in `root`: the status code and body, or why the connection
/// failed.
async fn tls_get(
    addr: std::net::SocketAddr,
    root: &Path,
    path: &str,
) -> Result<(u16, String), String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(root).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    if let Err(e) = tls.read_to_end(&mut response).await
        && response.is_empty()
    {
        return Err(e.to_string());
    }
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A folder of its own under the system's temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("manager-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_over_tls_and_plain_http_gets_no_answer() {
    let server = LocalApiServer::start().await;
    let mut manager = Manager::new(server.client());
    manager
        .serve_tls("127.0.0.1:0", fixture("cert-a.pem"), fixture("key-a.pem"))
        .unwrap();
    let addr = manager.local_addr().unwrap();
    let running = Running::start(manager);

    let (status, body) = tls_get(addr, &fixture("cert-a.pem"), "/healthz")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = tls_get(addr, &fixture("cert-a.pem"), "/nowhere")
        .await
        .unwrap();
    assert_eq!(status, 404);
    // A client that trusts another certificate refuses the server's.
    let refused = tls_get(addr, &fixture("cert-b.pem"), "/healthz").await;
    assert!(refused.is_err(), "{refused:?}");
    // Plain HTTP to the TLS port: no HTTP answer.
    let (status, _) = get(addr, "/healthz").await;
    assert_ne!(status, 200);
    running.stop(LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = TempDir::new("rotate");
    let (cert, key) = (dir.0.join("tls.crt"), dir.0.join("tls.key"));
    std::fs::copy(fixture("cert-a.pem"), &cert).unwrap();
    std::fs::copy(fixture("key-a.pem"), &key).unwrap();
    let server = LocalApiServer::start().await;
    let mut manager = Manager::new(server.client());
    manager.serve_tls("127.0.0.1:0", &cert, &key).unwrap();
    let addr = manager.local_addr().unwrap();
    let running = Running::start(manager);
    assert_eq!(
        tls_get(addr, &fixture("cert-a.pem"), "/healthz")
            .await
            .unwrap()
            .0,
        200
    );

    // The key first: for a moment the files do not match, and the old
    // pair goes on being served.
    std::fs::copy(fixture("key-b.pem"), &key).unwrap();
    assert_eq!(
        tls_get(addr, &fixture("cert-a.pem"), "/healthz")
            .await
            .unwrap()
            .0,
        200
    );
    std::fs::copy(fixture("cert-b.pem"), &cert).unwrap();
    // Real time: the files are looked at again at most once a second.
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        if let Ok((200, _)) = tls_get(addr, &fixture("cert-b.pem"), "/healthz").await {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old = tls_get(addr, &fixture("cert-a.pem"), "/healthz").await;
    assert!(old.is_err(), "the old certificate is still served: {old:?}");
    running.stop(LIMIT).await;
}

#[tokio::test]
async fn unusable_files_are_refused_by_serve_tls() {
    let server = LocalApiServer::start().await;
    let refused = |result: Result<&mut Manager, ManagerError>| match result {
        Err(ManagerError::Tls(reason)) => reason,
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("accepted"),
    };

    let mut manager = Manager::new(server.client());
    let missing = fixture("missing.pem");
    let reason = refused(manager.serve_tls("127.0.0.1:0", &missing, fixture("key-a.pem")));
    assert!(reason.contains("missing.pem"), "{reason}");

    let reason =
        refused(manager.serve_tls("127.0.0.1:0", fixture("cert-a.pem"), fixture("key-b.pem")));
    assert!(reason.contains("key-b.pem"), "{reason}");

    // A key where the certificate should be: no certificate in it.
    let reason =
        refused(manager.serve_tls("127.0.0.1:0", fixture("key-a.pem"), fixture("key-a.pem")));
    assert!(reason.contains("no certificate"), "{reason}");

    // Nothing was bound by the refused calls: the endpoint can still be set.
    manager
        .serve_tls("127.0.0.1:0", fixture("cert-a.pem"), fixture("key-a.pem"))
        .unwrap();
    assert!(matches!(
        manager.serve_tls("127.0.0.1:0", fixture("cert-a.pem"), fixture("key-a.pem")),
        Err(ManagerError::ServeTwice)
    ));
}
