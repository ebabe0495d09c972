//! The benchmark workloads of `shared/bench/WORKLOADS.md` (W1..W7), run
//! side by side against this crate and the `mpsc` baseline in one process:
//!
//! - `mpsc`: `tokio::sync::mpsc::unbounded_channel`, consumers sharing the
//!   receiver behind a mutex (the floor: handing a key from task to task);
//!
//! and, on W1, W1-100k and W2, beside the Go queues controllers use
//! (client-go's workqueue, controller-runtime's priority queue), run by the Go
//! program in `benches/go-peers/` between the Rust runs (see
//! `workloads/go_peers.rs`).
//!
//! W7 (a tenant's flood) compares two orderings of this crate instead: fair
//! share by namespace, and FIFO. W6 also measures fair share's memory.
//!
//! The `kube-runtime` baseline (its scheduler, on W1, W1-100k, W2, W3 and W6)
//! and the controller workload C1 need Kubernetes crates, which this crate
//! never depends on: they are the benchmark of the `tokio-workqueue-kube`
//! crate (`kube/benches/workloads.rs`, which shares these files).
//!
//! ```text
//! cargo bench --bench workloads              # the full run (minutes)
//! cargo bench --bench workloads -- --quick   # N/20, 3 runs: what CI runs
//! cargo bench --bench workloads -- W1 W6     # only workloads whose name contains W1 or W6
//! cargo bench --bench workloads -- --impl=mpsc W1   # and only implementations named so
//! cargo bench --bench workloads -- '--impl=tokio-workqueue$' W1   # exactly so
//! cargo bench --bench workloads -- --verbose  # also print every run's figures
//! cargo bench --bench workloads -- --no-go    # without the Go peers
//! cargo bench --bench workloads -- --threads=8 W1 W2   # 8 tokio workers, GOMAXPROCS=8
//! cargo bench --bench workloads --features prometheus   # metrics rows on Prometheus
//! cargo bench --bench workloads -- --help     # these options
//! ```
//!
//! Prints a table, target verdicts (ratios of medians measured in this run,
//! headed by the CPU they ran on, from `/proc/cpuinfo`)
//! and writes the rows to `target/workloads.json`. Each figure is the median
//! of the runs after one warm-up run, with the min and max beside it; each run
//! gets a fresh tokio runtime (2 workers, `--threads=N` for N), and the implementations take turns
//! run by run so that load on the machine falls on all of them alike.

use std::time::Duration;

#[path = "workloads/cores.rs"]
mod cores;
#[path = "workloads/go_peers.rs"]
mod go_peers;
#[path = "workloads/harness.rs"]
mod harness;
#[path = "workloads/report.rs"]
mod report;
#[path = "workloads/settings.rs"]
mod settings;
#[path = "workloads/subjects.rs"]
mod subjects;
#[path = "workloads/verdicts.rs"]
mod verdicts;
#[path = "workloads/w1.rs"]
mod w1;
#[path = "workloads/w2.rs"]
mod w2;
#[path = "workloads/w3.rs"]
mod w3;
#[path = "workloads/w4.rs"]
mod w4;
#[path = "workloads/w5.rs"]
mod w5;
#[path = "workloads/w6.rs"]
mod w6;
#[path = "workloads/w7.rs"]
mod w7;

use report::Report;
use settings::{Config, W5_BOUND};
use subjects::{CRATE, Crate, Mpsc, Order, Subject};

/// The root crate's folder (`settings::root_dir`): this crate's.
const ROOT_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn main() {
    w6::child_if_asked(|_, _, _| None);
    let cfg = Config::from_args();
    let started = std::time::Instant::now();
    let mut report = Report::default();
    let metrics = Crate {
        metrics: true,
        ..CRATE
    };
    // The consumers as the docs run them, in one task: beside the spawned
    // consumers on the workloads the Go peers run too.
    let one_task = Crate {
        one_task: true,
        ..CRATE
    };
    let all: [&dyn Subject; 2] = [&CRATE, &Mpsc];
    let both_ways: [&dyn Subject; 3] = [&CRATE, &one_task, &Mpsc];
    let with_metrics: [&dyn Subject; 4] = [&CRATE, &one_task, &metrics, &Mpsc];
    let n = cfg.n(1_000_000);
    w1::w1(&cfg, &mut report, "W1", n, &with_metrics);
    w1::w1(&cfg, &mut report, "W1-100k", n / 10, &both_ways);
    w2::w2(&cfg, &mut report, &both_ways);
    w3::w3(&cfg, &mut report, &all);
    w4::w4(&cfg, &mut report, &all);
    let window = if cfg.quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    let bounded = Crate {
        bound: Some(Some(W5_BOUND)),
        ..CRATE
    };
    let strict = Crate {
        bound: Some(None),
        ..CRATE
    };
    w5::w5(&cfg, &mut report, window, &[&bounded, &strict]);
    let fair = Crate {
        ordering: Order::FairByNamespace,
        ..CRATE
    };
    let fifo = Crate {
        ordering: Order::Fifo,
        ..CRATE
    };
    w7::w7(&cfg, &mut report, &[&fair, &fifo]);
    w6::w6(&cfg, &mut report, &w6::W6_VARIANTS);

    let mut lines = verdicts::queue(&report);
    lines.extend(verdicts::go(&report, &cfg));
    verdicts::finish(&cfg, &report, lines, "workloads.json", started);
}
