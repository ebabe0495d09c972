//! The real cluster never outlives the process that started it: not when
//! that process exits normally (the exit handler stops it before the exit
//! completes), and not when it is killed with SIGKILL (the child sees its
//! standard input close, and gets SIGTERM from PR_SET_PDEATHSIG). Either
//! way its temporary directory goes too.
//!
//! The process that starts the cluster here is this crate's binary
//! (`cargo run -p kube-test-cluster`), which holds one until its standard
//! input closes.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_test_cluster::{Backend, backends};

/// How long the cluster may take to go once its parent is gone.
const GONE_LIMIT: Duration = Duration::from_secs(15);

struct Holder {
    process: Child,
    cluster_pid: u32,
    dir: PathBuf,
    log: PathBuf,
}

/// Starts a holder and waits until its cluster is ready.
fn start_holder() -> Holder {
    let mut process = Command::new(env!("CARGO_BIN_EXE_kube-test-cluster"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the holder");
    let stdout = BufReader::new(process.stdout.take().unwrap());
    let (mut pid, mut dir, mut log) = (None, None, None);
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(p) = line.strip_prefix("pid=") {
            pid = Some(p.parse().unwrap());
        } else if let Some(d) = line.strip_prefix("dir=") {
            dir = Some(PathBuf::from(d));
        } else if let Some(l) = line.strip_prefix("log=") {
            log = Some(PathBuf::from(l));
        } else if line == "ready" {
            break;
        }
    }
    let holder = Holder {
        process,
        cluster_pid: pid.expect("the holder printed the cluster's pid"),
        dir: dir.expect("the holder printed the cluster's directory"),
        log: log.expect("the holder printed the cluster's log"),
    };
    assert!(is_running(holder.cluster_pid), "the cluster runs");
    assert!(
        holder.dir.join("kubeconfig").is_file(),
        "{}",
        holder.dir.display()
    );
    holder
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be
/// reaped by whoever inherited it).
fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state is the field after the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

fn wait_gone(holder: &Holder, limit: Duration) -> Duration {
    let (pid, dir) = (holder.cluster_pid, &holder.dir);
    let started = Instant::now();
    while is_running(pid) || dir.exists() {
        assert!(
            started.elapsed() < limit,
            "the cluster (pid {pid}, running: {}) or its directory {} (exists: {}) outlived its parent by {limit:?}; its log: {}",
            is_running(pid),
            dir.display(),
            dir.exists(),
            holder.log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn the_cluster_never_outlives_the_process_that_started_it() {
    if !backends().contains(&Backend::Real) {
        eprintln!("TEST_CLUSTER selects no real backend");
        return;
    }

    // A normal exit: gone by the time the parent has exited.
    let mut holder = start_holder();
    drop(holder.process.stdin.take());
    let status = holder.process.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !is_running(holder.cluster_pid),
        "stopped before the parent's exit"
    );
    assert!(!holder.dir.exists(), "{} removed", holder.dir.display());

    // SIGKILL: nothing runs in the parent, the kernel alone tells the child.
    let mut holder = start_holder();
    let stdin = holder.process.stdin.take();
    holder.process.kill().unwrap();
    holder.process.wait().unwrap();
    let took = wait_gone(&holder, GONE_LIMIT);
    eprintln!("gone {took:?} after its parent was killed");
    drop(stdin);
    std::io::stderr().flush().unwrap();
}
