//! Test harness: run `tokio-workqueue`'s Kubernetes tests against the local
//! API server and against a real kube-apiserver, behind one interface.
//!
//! Two backends ([`Backend`]):
//!
//! * **local**: `kube-local-apiserver`, in-process, fast, and the only one
//!   with fault injection ([`TestNamespace::local`]);
//! * **real**: kube-apiserver and an embedded etcd from the pinned
//!   `k8s.io/kubernetes` release, built from the Go module in
//!   `test-cluster/go` the first time a test needs it (minutes, once; then
//!   cached under `target/test-cluster/`) and run as one child process on
//!   loopback ports chosen at run time, with a generated CA, serving
//!   certificate and admin token. It writes a kubeconfig that clients are
//!   made from, and stops when the test binary ends, however it ends.
//!
//! Each backend is started at most once per test binary and shared by its
//! tests; each test gets a namespace of its own ([`TestNamespace`]) and a
//! client made in its own runtime. [`backends`] reads `TEST_CLUSTER`
//! (`local`, `real` or `all`, the default), and [`for_each_backend`] runs a
//! test body once per selected backend:
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::api::PostParams;
//!
//! #[tokio::test]
//! async fn a_created_configmap_is_listed() {
//!     kube_test_cluster::for_each_backend("listed", |ns| async move {
//!         let api = ns.api::<ConfigMap>();
//!         let mut cm = ConfigMap::default();
//!         cm.metadata.name = Some("a".into());
//!         api.create(&PostParams::default(), &cm).await.unwrap();
//!         assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
//!     })
//!     .await;
//! }
//! ```
//!
//! Without Go the real backend fails the tests that use it with a message
//! saying so: it never skips quietly. `TEST_CLUSTER=local` runs the local
//! backend only.

mod backend;
mod crd;
mod local;
mod namespace;
mod real;

pub use backend::{Backend, ENV, backends};
pub use crd::install_crd;
pub use kube_local_apiserver::LocalApiServer;
pub use namespace::{TestNamespace, client, client_config, for_each_backend};

pub use real::RealCluster;

/// The Kubernetes release the real backend runs.
pub const KUBERNETES_VERSION: &str = real::KUBERNETES_VERSION;

/// The real cluster of this process, started on first use (building it
/// first if it is not cached: minutes, once). Blocks: from async code,
/// prefer [`TestNamespace::new`] or [`client`], which start it off the
/// async workers.
///
/// # Panics
///
/// If it cannot be started: no Go, a failed build, or a cluster that does
/// not get ready (the message says which, with the cluster's log).
pub fn real_cluster() -> &'static RealCluster {
    real::cluster()
}

/// Like [`real_cluster`], but says why the cluster is not available
/// instead of panicking, for a caller that can go on without it (the
/// benchmark's C1-real prints the reason and runs the rest).
///
/// ```no_run
/// match kube_test_cluster::try_real_cluster() {
///     Ok(cluster) => println!("kube-apiserver {} at {}", cluster.version(), cluster.server()),
///     Err(why) => eprintln!("no real cluster: {why}"),
/// }
/// ```
pub fn try_real_cluster() -> Result<&'static RealCluster, String> {
    real::try_cluster()
}
