//! `kube-test-cluster` (`cargo install kube-test-cluster`, or `cargo run -p
//! kube-test-cluster` in a workspace that has it): starts the real test
//! cluster (building it first if it is not cached), prints where it is, and
//! runs until its
//! standard input closes (Ctrl-D) or it is interrupted (Ctrl-C); then the
//! cluster stops and its temporary directory goes.
//!
//! It prints, one per line: `KUBECONFIG=<path>`, `server=<url>`,
//! `version=<git version>`, `pid=<cluster process>`, `dir=<its temporary
//! directory>`, `log=<its log file>` and `ready`. For example, to run the controller example
//! against a real kube-apiserver:
//!
//! ```text
//! cargo run -p kube-test-cluster        # in one terminal; note KUBECONFIG
//! KUBECONFIG=... cargo run --example kube_controller --features kube-rustls
//! ```

use std::io::{Read, Write};

fn main() {
    let cluster = kube_test_cluster::real_cluster();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "KUBECONFIG={}", cluster.kubeconfig().display());
    let _ = writeln!(out, "server={}", cluster.server());
    let _ = writeln!(out, "version={}", cluster.version());
    let _ = writeln!(out, "pid={}", cluster.pid());
    let _ = writeln!(out, "dir={}", cluster.dir().display());
    let _ = writeln!(out, "log={}", cluster.log().display());
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    let _ = std::io::copy(
        &mut std::io::stdin().lock().take(u64::MAX),
        &mut std::io::sink(),
    );
    // Returning from main runs the exit handler that stops the cluster.
}
