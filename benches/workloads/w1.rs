//! W1 fifo-drain.

use crate::go_peers;
use crate::harness::{repeat_with_go, run_counted};
use crate::report::Report;
use crate::settings::{Config, keys};
use crate::subjects::Subject;

/// W1 fifo-drain (and its variants): 1 producer adds n distinct keys, 4
/// consumers. Figure: items/s.
pub fn w1(cfg: &Config, report: &mut Report, workload: &str, n: usize, subjects: &[&dyn Subject]) {
    let go = go_peers::Run { workload: "W1", n };
    repeat_with_go(cfg, report, workload, subjects, Some(go), |subject, _| {
        let run = run_counted(subject, keys(0..n), |a, _, k| a.add(k), |_| {});
        vec![
            ("items/s", run.items_per_sec(n)),
            ("left at last add", run.left_at_last_add as f64),
            ("adds/s beside consumers", run.adds_per_sec(n)),
            ("drain items/s after", run.drain_per_sec()),
        ]
    });
}
