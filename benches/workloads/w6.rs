//! W6 memory: each measurement in a child process of the benchmark binary.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_workqueue::WorkQueue;

use crate::report::Report;
use crate::settings::{Config, keys, runtime};
use crate::subjects::fair_by_namespace;

/// The W6 measurements, each made in a fresh process (allocator reuse across
/// runs would blur resident memory): the variant's name, and what it adds.
/// (The kube-runtime variants are measured by the kube crate's benchmark.)
pub const W6_VARIANTS: [Variant; 4] = [
    ("tokio-workqueue", "W6"),
    ("tokio-workqueue[fair=namespace]", "W6"),
    ("tokio-workqueue", "W6-delayed"),
    ("mpsc", "W6"),
];

/// A W6 variant: the implementation's name, and the workload (`W6`, or
/// `W6-delayed` for keys added with a delay of an hour).
pub type Variant = (&'static str, &'static str);

/// A W6 child's measurement of an implementation this file does not know:
/// given the implementation's name, the keys and their delay, the future
/// that adds them and returns the resident bytes per key (see [`rss`]), or
/// `None` for an unknown name.
pub type Other = fn(&str, Vec<String>, Duration) -> Option<Pin<Box<dyn Future<Output = f64>>>>;

/// Runs `variants`, each in a fresh child process of this binary (see
/// [`child_if_asked`]).
pub fn w6(cfg: &Config, report: &mut Report, variants: &[Variant]) {
    for &(imp, workload) in variants {
        if !cfg.wants(workload) || !cfg.runs_impl(imp) {
            continue;
        }
        eprintln!("running {workload} for {imp}...");
        for run in 0..=cfg.runs {
            let out = std::process::Command::new(std::env::current_exe().expect("this binary"))
                .env("WORKLOADS_W6", format!("{imp}/{workload}"))
                .env("WORKLOADS_W6_N", cfg.n(1_000_000).to_string())
                .output()
                .expect("a W6 child");
            assert!(
                out.status.success(),
                "W6 child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let bytes: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("a W6 child prints bytes per key");
            if run > 0 {
                report.push(imp, workload, "bytes/key", bytes);
            }
        }
    }
}

/// Resident memory of this process, in bytes. `smaps_rollup` walks the page
/// tables; `VmRSS` in `/proc/self/status` lags, as threads batch their
/// counter updates.
pub fn rss() -> f64 {
    let rollup =
        std::fs::read_to_string("/proc/self/smaps_rollup").expect("/proc/self/smaps_rollup");
    let kb: f64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("an Rss line");
    kb * 1024.0
}

/// In a W6 child (the environment says which variant), measures and exits;
/// else returns. `other` measures the implementations this file does not
/// know. Called first thing in `main`.
pub fn child_if_asked(other: Other) {
    if let Ok(variant) = std::env::var("WORKLOADS_W6") {
        let n = std::env::var("WORKLOADS_W6_N")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1_000_000);
        w6_child(&variant, n, other);
    }
}

/// In a W6 child: adds `n` keys to one implementation with no consumer and
/// prints the resident memory this took per key.
fn w6_child(variant: &str, n: usize, other: Other) -> ! {
    let rt = runtime();
    let per_key = rt.block_on(async {
        let delay = if variant.ends_with("delayed") {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        };
        // Keys are moved out with `drain`, which keeps the vector's buffer:
        // freeing it would hand its pages back and hide as many.
        let mut keys = keys(0..n);
        let measure = |before: f64| (rss() - before) / n as f64;
        let imp = variant.split_once('/').map_or(variant, |(imp, _)| imp);
        match imp {
            "tokio-workqueue" => {
                let before = rss();
                let queue = WorkQueue::<String>::new();
                for k in keys.drain(..) {
                    queue.add_after(k, delay).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget(queue);
                per_key
            }
            "tokio-workqueue[fair=namespace]" => {
                let before = rss();
                let queue = WorkQueue::builder().ordering(fair_by_namespace()).build();
                for k in keys.drain(..) {
                    queue.add_after(k, delay).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget(queue);
                per_key
            }
            "mpsc" => {
                let before = rss();
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                for k in keys.drain(..) {
                    tx.send(k).expect("open");
                }
                let per_key = measure(before);
                std::mem::forget((tx, rx));
                per_key
            }
            imp => match other(imp, keys, delay) {
                Some(measured) => measured.await,
                None => panic!("unknown W6 variant {variant}"),
            },
        }
    });
    println!("{per_key}");
    std::process::exit(0);
}
