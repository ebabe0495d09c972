//! The manager's HTTP endpoint: `/metrics`, `/healthz` and `/readyz` on one
//! listener, HTTP/1.1 on hyper, plain or over TLS.
//!
//! What each path answers:
//!
//! | path | 200 when | otherwise |
//! | --- | --- | --- |
//! | `/healthz` | the process is live: no controller task has died | 500, naming the dead controllers |
//! | `/readyz` | every shared cache has synced and, with leader election or shards, lease renewals are on time | 503, saying what is missing |
//! | `/metrics` | always, with the registry given (OpenMetrics text) | 404 without a registry |
//!
//! Other paths get 404, other methods than `GET` and `HEAD` 405. The
//! listener speaks plain HTTP, or HTTPS with
//! [`Manager::serve_tls`](super::Manager::serve_tls) (feature `tls`). With [`Manager::secure_metrics`](super::Manager::secure_metrics)
//! `/metrics` asks for a bearer token that the API server authenticates and
//! authorizes (see the `auth` module); the probes stay open, as the kubelet
//! calls them without credentials.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::auth::{Authorizer, Verdict};
use super::health::Health;

/// What the endpoint serves.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) health: Arc<Health>,
    /// Set when `/metrics` needs an authorized bearer token.
    pub(crate) auth: Option<Arc<Authorizer>>,
    #[cfg(feature = "prometheus")]
    pub(crate) registry: Option<Arc<prometheus_client::registry::Registry>>,
}

/// How connections to the endpoint are spoken to.
#[derive(Clone)]
pub(crate) enum Transport {
    /// Plain HTTP/1.1.
    Plain,
    /// HTTP/1.1 over TLS (feature `tls`).
    #[cfg(feature = "tls")]
    Tls(tokio_rustls::TlsAcceptor),
}

/// How long a client may take over its TLS handshake before the connection
/// is dropped (a client that connects and says nothing holds no task for
/// longer).
#[cfg(feature = "tls")]
const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `endpoint` on `listener` until `stop` is cancelled; connections
/// in progress are finished, new ones are not accepted.
pub(crate) async fn serve(
    listener: TcpListener,
    transport: Transport,
    endpoint: Endpoint,
    stop: CancellationToken,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(conn) => conn,
            // Out of file descriptors and the like: keep serving.
            Err(error) => {
                tracing::warn!(%error, "manager endpoint: accept failed");
                continue;
            }
        };
        let endpoint = endpoint.clone();
        let stop = stop.clone();
        let transport = transport.clone();
        connections.spawn(async move {
            match transport {
                Transport::Plain => connection(stream, endpoint, stop).await,
                #[cfg(feature = "tls")]
                Transport::Tls(acceptor) => {
                    let handshake = tokio::time::timeout(HANDSHAKE, acceptor.accept(stream));
                    let tls = tokio::select! {
                        _ = stop.cancelled() => return,
                        tls = handshake => tls,
                    };
                    match tls {
                        Ok(Ok(stream)) => connection(stream, endpoint, stop).await,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "manager endpoint: TLS handshake failed");
                        }
                        Err(_) => tracing::debug!("manager endpoint: TLS handshake timed out"),
                    }
                }
            }
        });
    }
    while connections.join_next().await.is_some() {}
}

/// Answers requests on one connection until the client closes it or `stop`
/// is cancelled (then the request in progress is finished first).
async fn connection<S>(stream: S, endpoint: Endpoint, stop: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let endpoint = endpoint.clone();
        async move { Ok::<_, Infallible>(answer(&endpoint, &req).await) }
    });
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

async fn answer(endpoint: &Endpoint, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        response
            .headers_mut()
            .insert("allow", HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match req.uri().path() {
        "/healthz" | "/livez" => match endpoint.health.dead() {
            dead if dead.is_empty() => text(StatusCode::OK, "ok\n"),
            dead => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("controllers ended: {}\n", dead.join(", ")),
            ),
        },
        "/readyz" => match endpoint.health.not_ready() {
            missing if missing.is_empty() => text(StatusCode::OK, "ok\n"),
            missing => text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("not ready: {}\n", missing.join("; ")),
            ),
        },
        "/metrics" => {
            if let Some(auth) = &endpoint.auth {
                let header = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|h| h.to_str().ok());
                match auth.check(header).await {
                    Verdict::Allowed => {}
                    Verdict::Unauthenticated(why) => {
                        let mut response = text(StatusCode::UNAUTHORIZED, &format!("{why}\n"));
                        response.headers_mut().insert(
                            hyper::header::WWW_AUTHENTICATE,
                            HeaderValue::from_static("Bearer"),
                        );
                        return response;
                    }
                    Verdict::Forbidden(why) => {
                        return text(StatusCode::FORBIDDEN, &format!("{why}\n"));
                    }
                    Verdict::Unavailable(why) => {
                        return text(StatusCode::SERVICE_UNAVAILABLE, &format!("{why}\n"));
                    }
                }
            }
            metrics(endpoint)
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

#[cfg(feature = "prometheus")]
fn metrics(endpoint: &Endpoint) -> Response<Full<Bytes>> {
    let Some(registry) = &endpoint.registry else {
        return text(StatusCode::NOT_FOUND, "no metrics registry given\n");
    };
    let mut body = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut body, registry) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics failed: {error}\n"),
        );
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

#[cfg(not(feature = "prometheus"))]
fn metrics(_: &Endpoint) -> Response<Full<Bytes>> {
    text(
        StatusCode::NOT_FOUND,
        "metrics need the `prometheus` feature\n",
    )
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
