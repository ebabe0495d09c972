//! What the `Manager`'s tests share (`tests/manager/manager.rs`, and
//! `manager.rs` and `secure_metrics.rs` in `tests/on_apiserver/`): objects
//! to reconcile, an HTTP client for the endpoint, and a manager that stops
//! when the test says.

#![allow(dead_code)] // each test file uses its part

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::api::PostParams;
use kube_client::{Api, Client, ResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_workqueue_kube::{Manager, ManagerError};

/// ConfigMaps `cm-0..n` (with `data.v = "1"`) in `ns`, each owning a
/// Secret `secret-i`.
pub async fn configmaps_owning_secrets(client: &Client, ns: &str, n: usize) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    for i in 0..n {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        cm.data = Some(BTreeMap::from([("v".into(), "1".into())]));
        let cm = cms.create(&PostParams::default(), &cm).await.unwrap();
        let mut secret = Secret::default();
        secret.metadata.name = Some(format!("secret-{i}"));
        secret.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: cm.name_any(),
            uid: cm.uid().unwrap(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
}

/// `method path` on the endpoint, with a bearer token if given: the status
/// code (0 when nothing listens) and the body.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET path`: the status code and the body.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, None).await
}

/// A running manager that the test stops.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<Result<(), ManagerError>>,
}

impl Running {
    /// Runs `manager` until [`stop`](Self::stop).
    pub fn start(mut manager: Manager) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        manager.shutdown_on(async move {
            let _ = stopped.await;
        });
        Running {
            stop: Some(stop),
            task: tokio::spawn(manager.run()),
        }
    }

    /// Asks the manager to shut down, without waiting.
    pub fn signal(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts the manager down and waits (up to `limit`) until `run`
    /// returned, which it must with `Ok`.
    pub async fn stop(mut self, limit: Duration) {
        self.signal();
        tokio::time::timeout(limit, &mut self.task)
            .await
            .expect("the manager stopped")
            .unwrap()
            .unwrap();
    }
}
