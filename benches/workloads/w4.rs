//! W4 priority.

use crate::harness::{repeat, run_counted};
use crate::report::Report;
use crate::settings::{Config, W4_PRIORITIES, keys};
use crate::subjects::Subject;

/// W4 priority: W1 with priorities `[-100, 0, 10][i % 3]`.
pub fn w4(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let n = cfg.n(1_000_000);
    let subjects: Vec<_> = subjects
        .iter()
        .copied()
        .filter(|s| s.priorities())
        .collect();
    repeat(cfg, report, "W4", &subjects, |subject, _| {
        let run = run_counted(
            subject,
            keys(0..n),
            |a, i, k| a.add_priority(k, W4_PRIORITIES[i % 3]),
            |_| {},
        );
        vec![("items/s", run.items_per_sec(n))]
    });
}
