//! The real backend: kube-apiserver and etcd from the Go module in
//! `test-cluster/go`, built once ([`build`]) and run as one child process
//! per test binary ([`process`]).

mod build;
mod process;

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub(crate) use build::KUBERNETES_VERSION;

/// The running real cluster of this test binary.
#[derive(Debug)]
pub(crate) struct RealCluster {
    /// The kubeconfig the cluster wrote; clients are made from it.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// What the cluster's `/version` reports.
    pub version: String,
    /// How long finding or building the binary took in this process.
    pub build_time: Duration,
    /// From starting the child to its API server being ready.
    pub start_time: Duration,
    /// The cluster's log file.
    pub log: PathBuf,
}

/// The cluster, started on first use. A failure (no Go, a failed build, a
/// cluster that would not start) is kept and reported to every test that
/// asks, rather than retried by each.
pub(crate) fn cluster() -> &'static RealCluster {
    static CLUSTER: OnceLock<Result<RealCluster, String>> = OnceLock::new();
    match CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(e) => panic!("the real test cluster is not available: {e}"),
    }
}

fn start() -> Result<RealCluster, String> {
    let started = Instant::now();
    let binary = build::binary()?;
    let build_time = started.elapsed();
    let started = Instant::now();
    let run = process::start(&binary, &build::cache_root().join("logs"))?;
    let cluster = RealCluster {
        kubeconfig: run.kubeconfig,
        server: run.server,
        version: run.version,
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
