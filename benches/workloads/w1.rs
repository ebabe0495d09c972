//! W1 fifo-drain.

use std::cell::RefCell;

use crate::go_peers;
use crate::harness::{repeat_with_go, run_counted};
use crate::report::Report;
use crate::settings::{Config, keys};
use crate::subjects::Subject;

#[path = "futex.rs"]
mod futex;

thread_local! {
    /// The futex counter of this sitting, opened on the first W1 run (on
    /// the main thread, which starts every run's runtime): `None` if it
    /// could not be opened, and why, said once.
    static FUTEX: RefCell<Option<Option<futex::FutexCounter>>> = const { RefCell::new(None) };
}

/// Futex system calls made during `run` (by this process and the threads it
/// started and that exited, as every run's runtime threads have by the time
/// it returns), or `None` where they cannot be counted.
fn counting_futexes<T>(run: impl FnOnce() -> T) -> (T, Option<u64>) {
    FUTEX.with(|f| {
        let mut f = f.borrow_mut();
        let counter = f.get_or_insert_with(|| match futex::FutexCounter::open() {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("W1 futex calls not counted: {e}");
                None
            }
        });
        let before = counter.as_mut().map(|c| c.read());
        let out = run();
        let calls = counter.as_mut().zip(before).map(|(c, b)| c.read() - b);
        (out, calls)
    })
}

/// W1 fifo-drain (and its variants): 1 producer adds n distinct keys, 4
/// consumers. Figures: items/s, and the futex system calls the run made per
/// 1,000 items (what sleeping and waking threads cost; see `futex.rs`).
pub fn w1(cfg: &Config, report: &mut Report, workload: &str, n: usize, subjects: &[&dyn Subject]) {
    let go = go_peers::Run { workload: "W1", n };
    repeat_with_go(cfg, report, workload, subjects, Some(go), |subject, _| {
        let keys = keys(0..n);
        let (run, futexes) =
            counting_futexes(|| run_counted(subject, keys, |a, _, k| a.add(k), |_| {}));
        let mut figures = vec![
            ("items/s", run.items_per_sec(n)),
            ("left at last add", run.left_at_last_add as f64),
            ("adds/s beside consumers", run.adds_per_sec(n)),
            ("drain items/s after", run.drain_per_sec()),
        ];
        if let Some(cores) = run.cores_busy() {
            figures.push(("cores busy", cores));
        }
        if let Some(calls) = futexes {
            figures.push(("futex calls/1k items", calls as f64 * 1000.0 / n as f64));
        }
        figures
    });
}
