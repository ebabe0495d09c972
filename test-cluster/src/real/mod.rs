//! The real backend: kube-apiserver and etcd from the Go module in
//! `test-cluster/go`, built once ([`build`]) and run as one child process
//! per test binary ([`process`]).

mod build;
pub(crate) mod process;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(crate) use build::{KUBERNETES_VERSION, binary, cache_root};

/// The running real cluster of this process: kube-apiserver and etcd in
/// one child process, started on first use and stopped when the process
/// ends (see [`real_cluster`](crate::real_cluster)).
#[derive(Debug)]
pub struct RealCluster {
    kubeconfig: PathBuf,
    server: String,
    version: String,
    pid: u32,
    dir: PathBuf,
    build_time: Duration,
    start_time: Duration,
    log: PathBuf,
}

impl RealCluster {
    /// The kubeconfig the cluster wrote (server, CA, admin token), for
    /// `KUBECONFIG`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The Kubernetes version the API server reports.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The process id of the cluster (etcd and kube-apiserver run inside
    /// it).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The cluster's temporary directory (data, certificates, kubeconfig),
    /// removed when it stops.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long finding the cached binary, or building it, took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    /// From starting the cluster's process to its API server answering
    /// `/readyz`.
    pub fn start_time(&self) -> Duration {
        self.start_time
    }

    /// The cluster's log (its standard error), under
    /// `target/test-cluster/logs/`.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

/// The cluster, started on first use. A failure (no Go, a failed build, a
/// cluster that would not start) is kept and reported to every test that
/// asks, rather than retried by each.
pub(crate) fn cluster() -> &'static RealCluster {
    try_cluster().unwrap_or_else(|e| panic!("{e}"))
}

/// The cluster, started on first use, or why it is not available.
pub(crate) fn try_cluster() -> Result<&'static RealCluster, String> {
    static CLUSTER: OnceLock<Result<RealCluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(start)
        .as_ref()
        .map_err(|e| format!("the real test cluster is not available: {e}"))
}

fn start() -> Result<RealCluster, String> {
    let started = Instant::now();
    let binary = build::binary()?;
    let build_time = started.elapsed();
    let started = Instant::now();
    let log = process::log_path(&build::cache_root().join("logs"), "")?;
    let run = process::start(&binary, &[], &log)?;
    let cluster = RealCluster {
        kubeconfig: run.kubeconfig,
        server: run.server,
        version: run.version,
        pid: run.pid,
        dir: run.dir,
        build_time,
        start_time: started.elapsed(),
        log: run.log,
    };
    // Straight to the terminal (print macros are captured): the one line a
    // run shows about the cluster, with the figures the README quotes.
    let _ = writeln!(
        std::io::stderr(),
        "kube-test-cluster: kube-apiserver {} ready at {} in {:.2} s (the child measured {:.2} s; binary found or built in {:.2} s; log {})",
        cluster.version,
        cluster.server,
        cluster.start_time.as_secs_f64(),
        run.ready_in.as_secs_f64(),
        cluster.build_time.as_secs_f64(),
        cluster.log.display()
    );
    Ok(cluster)
}
