//! Run your Kubernetes controller tests against two API servers behind one
//! interface: an in-process one ([`kube-local-apiserver`], milliseconds to
//! start, with request counts and fault injection) and a real
//! kube-apiserver with etcd, built from Go sources on first use: an
//! envtest for Rust.
//!
//! [`kube-local-apiserver`]: kube_local_apiserver
//!
//! # What it does
//!
//! * **Two backends** ([`Backend`]), chosen by the `TEST_CLUSTER`
//!   environment variable ([`ENV`], read by [`backends`]): `local`, `real`,
//!   or `all` (the default when unset or empty). Any other value panics,
//!   so a typo never quietly runs fewer tests. [`for_each_backend`] runs a
//!   test body once per selected backend, each time in a fresh namespace.
//! * **One namespace per test** ([`TestNamespace`]): each backend is
//!   started at most once per test binary and shared by its tests;
//!   namespaces (created through the API, named after the test) keep them
//!   apart, and each test gets a `Client` made in its own runtime. A test
//!   whose faults act on the whole server takes a local server of its own
//!   ([`TestNamespace::on_own_local_server`]).
//! * **The real backend** ([`RealCluster`], [`real_cluster`]):
//!   kube-apiserver [`KUBERNETES_VERSION`], an embedded etcd and
//!   kube-controller-manager's namespace controller (so deleting a
//!   namespace empties it), built from the Go module shipped in this
//!   crate's `go/` folder and run as one child process on loopback ports
//!   chosen at run time, with a generated CA, serving certificate and admin
//!   token (RBAC on; the token is in `system:masters`). It writes a
//!   kubeconfig that clients are made from ([`client_config`]), so any
//!   kube-client program can use it, and `cargo run -p kube-test-cluster`
//!   runs one by hand.
//! * **CRDs**: [`install_crd`] creates one through apiextensions and waits
//!   until it is Established, on either backend.
//! * **Faults on the real API server** ([`faults`]): a cluster of a test's
//!   own ([`faults::ChaosCluster`]) that restarts with its data kept
//!   (every watch breaks at once), compacts etcd on request or every few
//!   seconds (resumed watches get 410 Gone), and a loopback TCP proxy per
//!   client ([`faults::FaultProxy`]) that delays, stalls (half-open),
//!   resets and cuts its connections, so one replica can lose the API
//!   server while the others keep it.
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
//! # What the real backend needs
//!
//! * **Go 1.26 or newer**: `$GO` if set, else `go` on `PATH`, else
//!   `/usr/local/go/bin/go`. The build runs with `GOTOOLCHAIN=local`, so an
//!   older Go fails the build (with Go's own message) rather than
//!   downloading a newer toolchain.
//! * **The Go module proxy** (or a filled module cache) on the first
//!   build: about 0.7 GB of modules go into Go's module cache.
//! * **Disk**: that module cache, about 3 GB of Go build cache, and the
//!   built binary (about 180 MB) under `<target dir>/test-cluster/`, where
//!   it is cached, keyed by the Kubernetes version, the Go version and a
//!   digest of the Go sources; builds of other keys are removed.
//! * **Time**: the first build takes minutes: kube-apiserver alone
//!   compiles in about 4 minutes on two idle cores; the whole first build,
//!   module download included, took about 10 minutes on two cores shared
//!   with other builds. Test binaries that start meanwhile wait for that one
//!   build. Then each test binary starts its cluster in 4 to 7 seconds.
//! * **Linux**: the child process is tied to the test binary with
//!   `prctl(PR_SET_PDEATHSIG)`.
//!
//! Without Go, every test that asks for the real backend fails with a
//! message that says what is missing and what to do (install Go, point
//! `$GO` at it, or run `TEST_CLUSTER=local`): it never skips quietly, since
//! a run that was asked for the real cluster and did not use it would
//! prove nothing. A failed build or a cluster that does not get ready
//! fails them the same way, with Go's output or the cluster's log.
//! [`try_real_cluster`] returns the reason instead, for a caller that can
//! go on without the cluster.
//!
//! # It stops what it started
//!
//! The real cluster is one child process (etcd, kube-apiserver and the
//! namespace controller run inside it), stopped when the test binary ends,
//! however it ends: at normal exit an `atexit` handler closes the child's
//! standard input and waits for it (killing it after 10 s); if the test
//! binary is killed, the kernel closes that pipe, and also signals the
//! child (`PR_SET_PDEATHSIG`). The child then removes its temporary
//! directory (data, certificates, kubeconfig). Its log is kept under
//! `<target dir>/test-cluster/logs/` for a day. The local server is a
//! thread of the test process and goes with it. Namespaces are not deleted
//! after each test: the whole backend goes when the test binary ends.
//!
//! # What it does not do
//!
//! * The real backend is not a whole cluster: no scheduler, no kubelet
//!   (Pods never run), no garbage collector, no other controllers than the
//!   namespace controller, no admission webhooks; the ServiceAccount
//!   admission plugin is off.
//! * One Kubernetes version ([`KUBERNETES_VERSION`]), the one its Go module
//!   pins.
//! * Request counts and request-level fault injection (a given verb
//!   failing, a watch ending with a given error) are the local backend's
//!   only ([`TestNamespace::local`]); on the real backend the faults are
//!   those of [`faults`]: process restarts, compaction and the network. Where the local server differs from kube-apiserver is
//!   listed in [`kube_local_apiserver`]'s documentation.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod backend;
mod crd;
pub mod faults;
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
/// not get ready (the message says which, with Go's output or the
/// cluster's log).
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

// The README's example is compiled and run with the doc-tests, so what
// users copy from it works.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
