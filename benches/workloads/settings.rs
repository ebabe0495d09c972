//! Run settings from the command line, the workloads' constants, the
//! runtime every run gets, and the keys.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::go_peers;

/// Run settings from the command line.
pub struct Config {
    pub quick: bool,
    /// Divides every N (20 in quick mode).
    pub scale: usize,
    /// Timed runs after the warm-up.
    pub runs: usize,
    /// Substrings of the workload names to run; empty runs all.
    pub only: Vec<String>,
    /// `--impl=NAME`: only the implementations whose name contains NAME
    /// (`--impl=NAME$`: whose name is NAME).
    pub imp: Option<String>,
    /// `--verbose`: print every run's figures.
    pub verbose: bool,
    /// The Go peers of this sitting (`--no-go`: none).
    pub go_peers: go_peers::GoPeers,
}

/// What `--help` prints. Flags it does not list are ignored (`cargo bench`
/// passes `--bench`).
const USAGE: &str = "\
usage: cargo bench [-p tokio-workqueue-kube] --bench workloads [--features prometheus] -- [OPTIONS] [WORKLOAD...]

  WORKLOAD...      run only the workloads whose name contains one of these
                   (W1, W1-100k, W2 .. W7; C1 in the kube crate's benchmark)
  --quick          N/20 and 3 runs, as CI runs it
  --impl=NAME      only the implementations whose name contains NAME
  --impl=NAME$     only the implementation named NAME
  --threads=N      N tokio worker threads (and GOMAXPROCS=N for the Go peers); 2 by default
  --no-go          without the Go peers
  --verbose        also print every run's figures
  -h, --help       this text

Prints a table and the target verdicts (with the CPU they ran on), and writes
the rows to target/workloads.json (the kube crate's: target/workloads-kube.json).
";

/// `--threads=N`: tokio worker threads for every run of ours and mpsc's, and
/// GOMAXPROCS for the Go peers. Default 2 (the 2-vCPU machines the targets
/// were set on).
static WORKERS: OnceLock<usize> = OnceLock::new();

/// The worker threads of every run (see [`WORKERS`]).
pub fn workers() -> usize {
    *WORKERS.get().unwrap_or(&2)
}

impl Config {
    pub fn from_args() -> Self {
        let mut quick = false;
        let mut only = Vec::new();
        let mut imp = None;
        let mut verbose = false;
        for arg in std::env::args().skip(1) {
            match arg.as_str() {
                "--help" | "-h" => {
                    print!("{USAGE}");
                    std::process::exit(0);
                }
                "--quick" => quick = true,
                "--verbose" => verbose = true,
                a if a.starts_with("--impl=") => imp = Some(a["--impl=".len()..].to_string()),
                a if a.starts_with("--threads=") => {
                    let n = a["--threads=".len()..]
                        .parse()
                        .ok()
                        .filter(|&n: &usize| n > 0)
                        .expect("--threads=N takes a positive number");
                    let _ = WORKERS.set(n);
                }
                // `cargo bench` passes `--bench`; other flags are not ours.
                a if a.starts_with('-') => {}
                a => only.push(a.to_string()),
            }
        }
        Config {
            quick,
            scale: if quick { 20 } else { 1 },
            runs: if quick { 3 } else { 5 },
            only,
            imp,
            verbose,
            go_peers: go_peers::GoPeers::from_args(),
        }
    }

    pub fn wants(&self, workload: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| workload.contains(o.as_str()))
    }

    /// Whether `--impl` selects `name`: by substring, or exactly when the
    /// pattern ends in `$`.
    pub fn runs_impl(&self, name: &str) -> bool {
        match self.imp.as_deref() {
            None => true,
            Some(p) => match p.strip_suffix('$') {
                Some(exact) => name == exact,
                None => name.contains(p),
            },
        }
    }

    pub fn n(&self, full: usize) -> usize {
        full / self.scale
    }
}

/// The consumers of W1..W4.
pub const CONSUMERS: usize = 4;
/// W5: the consumer's time per item, and the starvation bound under test.
pub const W5_ITEM: Duration = Duration::from_micros(50);
pub const W5_BOUND: Duration = Duration::from_millis(100);
pub const W5_LOW: usize = 100;
pub const W5_AHEAD: Duration = Duration::from_millis(10);
/// W7: the consumer's time per item, the other tenants and their keys, and
/// the most hand-outs one of their keys may wait for under fair share.
pub const W7_ITEM: Duration = Duration::from_micros(50);
pub const W7_TENANTS: usize = 9;
pub const W7_PER_TENANT: usize = 10;
pub const W7_TARGET: f64 = 100.0;
/// W2: distinct keys, producers.
pub const W2_KEYS: usize = 1000;
pub const W2_PRODUCERS: usize = 4;
/// W4: the priority of key `i` is `W4_PRIORITIES[i % 3]`.
pub const W4_PRIORITIES: [i32; 3] = [-100, 0, 10];

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers())
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The root crate's folder, where `benches/go-peers` is, whichever crate's
/// benchmark this is (each binary's `ROOT_DIR`).
pub fn root_dir() -> &'static Path {
    Path::new(crate::ROOT_DIR)
}

/// The workspace's target folder: `CARGO_TARGET_DIR`, else `target/` in
/// the root crate's folder.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root_dir().join("target"))
}

/// Key `i` in the Kubernetes form the workloads use.
pub fn key(i: usize) -> String {
    format!("ns-{}/obj-{i}", i % 100)
}

pub fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(key).collect()
}

/// The number `i` of a key made by [`key`].
pub fn key_index(key: &str) -> usize {
    key.rsplit_once('-')
        .and_then(|(_, i)| i.parse().ok())
        .expect("a workload key")
}
