//! A test's own namespace on a backend, and the client to reach it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::api::PostParams;
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Api, Client, Resource};
use kube_local_apiserver::LocalApiServer;

use crate::backend::{Backend, backends};
use crate::{crd, local, real};

/// Longest a namespace name may be (a DNS label).
const MAX_NAME: usize = 63;

/// A namespace made for one test on one backend, with a client made in the
/// test's own runtime.
///
/// The backend is started on first use and shared by every test of the
/// binary; namespaces keep the tests apart. A namespace is not deleted
/// afterwards: the whole backend goes when the test binary ends.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_client::api::PostParams;
/// use kube_test_cluster::{Backend, TestNamespace};
///
/// // Backend::Real works the same way (after its first build).
/// let ns = TestNamespace::new(Backend::Local, "configmaps").await;
/// let configmaps = ns.api::<ConfigMap>();
/// assert!(configmaps.list(&Default::default()).await.unwrap().items.is_empty());
///
/// let mut cm = ConfigMap::default();
/// cm.metadata.name = Some("settings".into());
/// configmaps.create(&PostParams::default(), &cm).await.unwrap();
/// let listed = configmaps.list(&Default::default()).await.unwrap();
/// assert_eq!(listed.items[0].metadata.namespace.as_deref(), Some(ns.name()));
/// assert!(ns.local().is_some(), "fault injection is there on the local backend");
/// # }
/// ```
#[derive(Clone)]
pub struct TestNamespace {
    backend: Backend,
    name: String,
    client: Client,
    /// The local server, on the local backend.
    local: Option<LocalServer>,
}

/// The local server a namespace is on: the binary's shared one, or one of
/// the test's own.
#[derive(Clone)]
enum LocalServer {
    Shared(&'static LocalApiServer),
    Own(Arc<LocalApiServer>),
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestNamespace {
    /// Starts `backend` if this test binary has not yet (building the real
    /// cluster first if it is not cached), makes a client for it in the
    /// calling runtime and creates a fresh namespace named after `prefix`
    /// through the API.
    ///
    /// # Panics
    ///
    /// If the backend cannot be started (for the real one: no Go, a failed
    /// build, a cluster that does not get ready; the message says which) or
    /// refuses the namespace.
    pub async fn new(backend: Backend, prefix: &str) -> TestNamespace {
        let client = client(backend).await;
        let name = unique_name(prefix);
        create_namespace(&client, backend, &name).await;
        let local = match backend {
            Backend::Local => Some(LocalServer::Shared(local::server())),
            Backend::Real => None,
        };
        TestNamespace {
            backend,
            name,
            client,
            local,
        }
    }

    /// A namespace on a local API server of the test's own, started in the
    /// calling runtime (it stops with it), for a test whose faults act on
    /// the whole server: [`LocalApiServer::expire_watches`] breaks every
    /// open watch, and request counts and disconnects are server-wide, so
    /// on the shared server they would reach the other tests of the binary
    /// running beside it. Such a test runs on the local backend only.
    pub async fn on_own_local_server(prefix: &str) -> TestNamespace {
        let server = Arc::new(LocalApiServer::start().await);
        let client = Client::try_from(server.client_config())
            .unwrap_or_else(|e| panic!("a client for the local API server: {e}"));
        let name = unique_name(prefix);
        create_namespace(&client, Backend::Local, &name).await;
        TestNamespace {
            backend: Backend::Local,
            name,
            client,
            local: Some(LocalServer::Own(server)),
        }
    }

    /// Which backend this namespace is on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A client for the backend, made in the runtime that called
    /// [`new`](Self::new) (a `Client` belongs to the runtime it was made
    /// in).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// An `Api` for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client(), &self.name)
    }

    /// The local API server, for what only it can do (expire watches, count
    /// requests, drop connections); `None` on the real cluster. A test that
    /// needs it says so and runs on the local backend only; one whose
    /// faults act on the whole server uses
    /// [`on_own_local_server`](Self::on_own_local_server).
    pub fn local(&self) -> Option<&LocalApiServer> {
        match self.local.as_ref()? {
            LocalServer::Shared(server) => Some(server),
            LocalServer::Own(server) => Some(server),
        }
    }

    /// Creates another fresh namespace on the same backend, for a test that
    /// spans namespaces, and returns its name.
    pub async fn another(&self, prefix: &str) -> String {
        let name = unique_name(prefix);
        create_namespace(&self.client, self.backend, &name).await;
        name
    }

    /// Installs a CustomResourceDefinition through the apiextensions API
    /// and waits until it is Established; see [`crate::install_crd`].
    pub async fn install_crd(&self, crd: &CustomResourceDefinition) -> CustomResourceDefinition {
        crd::install_crd(self.client(), crd).await
    }
}

async fn create_namespace(client: &Client, backend: Backend, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name} on {backend}: {e}"));
}

/// A client for `backend`, made in the calling runtime, starting the
/// backend first if needed.
///
/// # Panics
///
/// If the backend cannot be started.
pub async fn client(backend: Backend) -> Client {
    let config = client_config(backend).await;
    Client::try_from(config).unwrap_or_else(|e| panic!("a client for {backend}: {e}"))
}

/// The client configuration for `backend`: for the real cluster, read from
/// the kubeconfig it wrote (as any kube-client program would read it).
///
/// # Panics
///
/// If the backend cannot be started.
pub async fn client_config(backend: Backend) -> kube_client::Config {
    match backend {
        Backend::Local => {
            let server = blocking(local::server).await;
            server.client_config()
        }
        Backend::Real => {
            let cluster = blocking(real::cluster).await;
            let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig())
                .unwrap_or_else(|e| panic!("reading {}: {e}", cluster.kubeconfig().display()));
            let mut config = kube_client::Config::from_custom_kubeconfig(
                kubeconfig,
                &KubeConfigOptions::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("the real cluster's kubeconfig: {e}"));
            config.connect_timeout = Some(Duration::from_secs(5));
            config
        }
    }
}

/// Runs `start` (which may take minutes: a first build) off the async
/// workers, passing its panic on as it is.
async fn blocking<T: Send + 'static>(start: fn() -> T) -> T {
    match tokio::task::spawn_blocking(start).await {
        Ok(value) => value,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("starting a backend: {e}"),
        },
    }
}

/// Runs `test` once per backend that `TEST_CLUSTER` selects, each time with
/// a fresh namespace named after `prefix`, one backend after the other. A
/// failure says which backend it was on, then fails the test.
///
/// ```no_run
/// # async fn test() {
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// kube_test_cluster::for_each_backend("lists", |ns| async move {
///     let configmaps = ns.api::<ConfigMap>();
///     assert!(configmaps.list(&Default::default()).await.unwrap().items.is_empty());
/// })
/// .await;
/// # }
/// ```
pub async fn for_each_backend<F, Fut>(prefix: &str, mut test: F)
where
    F: FnMut(TestNamespace) -> Fut,
    Fut: Future<Output = ()>,
{
    for backend in backends() {
        let ns = TestNamespace::new(backend, prefix).await;
        let name = ns.name().to_owned();
        if let Err(panic) = AssertUnwindSafe(test(ns)).catch_unwind().await {
            eprintln!(
                "^ failed against {backend} (TEST_CLUSTER={}), namespace {name}",
                backend.name()
            );
            std::panic::resume_unwind(panic);
        }
    }
}

/// `prefix` made into a DNS label, with a number unique in this process.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let suffix = format!("-{n}");
    let mut name: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    name = name.trim_matches('-').to_owned();
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.insert_str(0, "t-");
    }
    name.truncate(MAX_NAME - suffix.len());
    let mut name = name.trim_end_matches('-').to_owned();
    name.push_str(&suffix);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= MAX_NAME
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }

    #[test]
    fn names_are_dns_labels_and_unique() {
        let long = "x".repeat(100);
        let inputs = [
            "relist",
            "Every_Object::is reconciled",
            "",
            "--",
            "9lives",
            long.as_str(),
        ];
        let names: Vec<String> = inputs.iter().map(|p| unique_name(p)).collect();
        for name in &names {
            assert!(is_dns_label(name), "{name:?}");
        }
        let mut distinct = names.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert!(names[0].starts_with("relist-"), "{}", names[0]);
        assert!(
            names[1].starts_with("every-object--is-reconciled-"),
            "{}",
            names[1]
        );
    }
}
