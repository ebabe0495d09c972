//! The benchmark workloads of `shared/bench/WORKLOADS.md` that need
//! Kubernetes crates: the `kube-runtime` baseline on W1, W1-100k, W2, W3 and
//! W6, side by side with the queue crate's `tokio-workqueue` in one process
//! (so that the ratio to kube-runtime is measured in one run), and C1 on the
//! local API server and, as C1-real, on a real kube-apiserver from
//! `kube-test-cluster`.
//!
//! - `kube-runtime`: `kube_runtime::scheduler::scheduler` fed by a channel of
//!   `ScheduleRequest`s and driven as kube-runtime's controller runner drives
//!   it (see `workloads/kube_subject.rs`).
//!
//! The workloads, the queue under test, the report and the verdicts are the
//! queue crate's benchmark's own files (`../../benches/workloads/`), shared
//! by `#[path]`; that benchmark runs W1..W7 against `mpsc` and the Go peers.
//! The Go peers are not run here (`--no-go` is accepted and changes nothing).
//!
//! ```text
//! cargo bench -p tokio-workqueue-kube --bench workloads              # the full run
//! cargo bench -p tokio-workqueue-kube --bench workloads -- --quick   # N/20, 3 runs: what CI runs
//! cargo bench -p tokio-workqueue-kube --bench workloads -- W1 C1     # only workloads whose name contains W1 or C1
//! cargo bench -p tokio-workqueue-kube --bench workloads -- --impl=kube-runtime W1
//! cargo bench -p tokio-workqueue-kube --bench workloads -- --verbose # also print every run's figures
//! cargo bench -p tokio-workqueue-kube --bench workloads -- --help    # the options
//! ```
//!
//! Prints a table, target verdicts (ratios of medians measured in this run,
//! headed by the CPU they ran on) and writes the rows to
//! `target/workloads-kube.json`. Each figure is the median of the runs after
//! one warm-up run, with the min and max beside it; each run gets a fresh
//! 2-worker tokio runtime, and the implementations take turns run by run so
//! that load on the machine falls on all of them alike.

// The shared files also hold what only the queue crate's benchmark uses
// (mpsc, W4, W5, W7, the Go peers' runs).
#[allow(dead_code)]
#[path = "../../benches/workloads/cores.rs"]
mod cores;
#[allow(dead_code)]
#[path = "../../benches/workloads/go_peers.rs"]
mod go_peers;
#[allow(dead_code)]
#[path = "../../benches/workloads/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../../benches/workloads/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../../benches/workloads/settings.rs"]
mod settings;
#[allow(dead_code)]
#[path = "../../benches/workloads/subjects.rs"]
mod subjects;
#[allow(dead_code)]
#[path = "../../benches/workloads/verdicts.rs"]
mod verdicts;
#[path = "../../benches/workloads/w1.rs"]
mod w1;
#[path = "../../benches/workloads/w2.rs"]
mod w2;
#[path = "../../benches/workloads/w3.rs"]
mod w3;
#[allow(dead_code)]
#[path = "../../benches/workloads/w6.rs"]
mod w6;

#[path = "workloads/c1.rs"]
mod c1;
#[path = "workloads/kube_subject.rs"]
mod kube_subject;

use kube_subject::Kube;
use report::Report;
use settings::Config;
use subjects::{CRATE, Subject};

/// The root crate's folder (`settings::root_dir`): this crate's parent.
const ROOT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn main() {
    w6::child_if_asked(kube_subject::w6_measure);
    let mut cfg = Config::from_args();
    cfg.go_peers = go_peers::GoPeers::skipped(
        "they run in the queue crate's benchmark (cargo bench --bench workloads)",
    );
    let started = std::time::Instant::now();
    let mut report = Report::default();
    let all: [&dyn Subject; 2] = [&CRATE, &Kube];
    let n = cfg.n(1_000_000);
    w1::w1(&cfg, &mut report, "W1", n, &all);
    w1::w1(&cfg, &mut report, "W1-100k", n / 10, &all);
    w2::w2(&cfg, &mut report, &all);
    w3::w3(&cfg, &mut report, &all);
    let mut w6_variants = vec![("tokio-workqueue", "W6"), ("tokio-workqueue", "W6-delayed")];
    w6_variants.extend(kube_subject::W6_VARIANTS);
    w6::w6(&cfg, &mut report, &w6_variants);
    c1::c1(&cfg, &mut report);

    let mut lines = Vec::new();
    let m = |imp: &str| report.median(imp, "W1", "items/s");
    verdicts::ratio(
        &mut lines,
        "W1 items/s vs kube-runtime",
        m(CRATE.name().as_str()),
        m(Kube.name().as_str()),
        4.0,
        true,
    );
    lines.extend(verdicts::queue(&report));
    c1::verdicts(&report, &mut lines);
    lines.extend(verdicts::go(&report, &cfg));
    verdicts::finish(&cfg, &report, lines, "workloads-kube.json", started);
}
