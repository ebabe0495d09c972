//! TLS for the manager's endpoint (feature `tls`): rustls with ring, the
//! certificate chain and key read from PEM files.
//!
//! The files are read when [`Manager::serve_tls`](super::Manager::serve_tls)
//! is called, so a missing file, a file without a certificate or key, or a
//! key that does not match the certificate is an error there, not at the
//! first scrape. Certificates in Kubernetes are rotated by rewriting the
//! files (cert-manager, or a Secret volume the kubelet updates), so the
//! files are looked at again, at most once per [`RECHECK`], when a client
//! connects: if either changed, the pair is read again and used from that
//! handshake on. A rewrite that does not load (a key written before its
//! certificate, say) keeps the previous pair and is logged; the next check
//! tries again. controller-runtime's certwatcher does the same with a file
//! watch.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

/// How often, at most, the files are looked at for a change.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// A certificate chain and key that follow their files.
#[derive(Debug)]
pub(crate) struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

#[derive(Debug)]
struct Current {
    pair: Arc<CertifiedKey>,
    /// The files' modification times when `pair` was read.
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

/// Why the files could not be used; the message names the file.
fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in the file", cert.display()));
    }
    let private =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, private, provider)
        .map(Arc::new)
        .map_err(|e| format!("{} with {}: {e}", key.display(), cert.display()))
}

fn stamp(cert: &Path, key: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

impl CertFiles {
    /// Reads the pair now.
    pub(crate) fn open(cert: &Path, key: &Path) -> Result<Self, String> {
        let provider = Arc::new(ring::default_provider());
        let before = stamp(cert, key);
        let pair = load(cert, key, &provider)?;
        Ok(CertFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            provider,
            current: Mutex::new(Current {
                pair,
                stamp: before,
                checked: Instant::now(),
            }),
        })
    }

    /// The pair to hand a client: re-read first if the files changed.
    fn pair(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock();
        if current.checked.elapsed() >= RECHECK {
            current.checked = Instant::now();
            let now = stamp(&self.cert, &self.key);
            if now != current.stamp {
                match load(&self.cert, &self.key, &self.provider) {
                    Ok(pair) => {
                        tracing::info!(cert = %self.cert.display(), "manager endpoint: certificate reloaded");
                        current.pair = pair;
                        current.stamp = now;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "manager endpoint: changed certificate files do not load; keeping the previous pair");
                    }
                }
            }
        }
        current.pair.clone()
    }

    /// An acceptor for HTTP/1.1 over TLS 1.2 or 1.3.
    pub(crate) fn acceptor(self: Arc<Self>) -> Result<TlsAcceptor, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pair())
    }
}
