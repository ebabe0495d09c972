//! The counted run most workloads are made of ([`run_counted`]), and the
//! warm-up and timed runs of a workload with the implementations taking
//! turns ([`repeat`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::report::Report;
use crate::settings::{CONSUMERS, Config, runtime};
use crate::subjects::{Adder, Subject};
use crate::{cores, go_peers};

/// Counts processings down to zero and remembers when it got there.
pub struct Countdown {
    left: AtomicUsize,
    end: OnceLock<Instant>,
    reached: Notify,
}

impl Countdown {
    pub fn new(n: usize) -> Self {
        Countdown {
            left: AtomicUsize::new(n),
            end: OnceLock::new(),
            reached: Notify::new(),
        }
    }

    pub fn hit(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = self.end.set(Instant::now());
            self.reached.notify_one();
        }
    }

    pub async fn wait(&self) -> Instant {
        self.reached.notified().await;
        *self.end.get().expect("set before the notification")
    }
}

/// What [`run_counted`] saw.
#[derive(Clone, Copy)]
pub struct Counted {
    /// The first add.
    pub start: Instant,
    /// When the producer's last add returned.
    pub last_add: Instant,
    /// When the last key was processed.
    pub end: Instant,
    /// Keys not yet processed when the producer's last add returned: how
    /// far the consumers fell behind (W1's run-to-run spread is mostly
    /// whether they keep up or not).
    pub left_at_last_add: usize,
    /// CPU time the process's threads ran while the run's runtime was up
    /// (`None` where /proc does not say).
    pub cpu: Option<std::time::Duration>,
}

impl Counted {
    /// Keys processed per second, from the first add to the last key done.
    pub fn items_per_sec(self, n: usize) -> f64 {
        n as f64 / (self.end - self.start).as_secs_f64()
    }

    /// Adds per second while the consumers ran beside the producer.
    pub fn adds_per_sec(self, n: usize) -> f64 {
        n as f64 / (self.last_add - self.start).as_secs_f64()
    }

    /// The cores the run kept busy on average: its threads' CPU time over
    /// the time from the first add to the last key done. About 2 on two
    /// workers that both work; about 1 when one does all of it (which
    /// tells a slow run where a worker sat parked from one where both ran
    /// but moved cache lines between cores on every item).
    pub fn cores_busy(self) -> Option<f64> {
        self.cpu
            .map(|cpu| cpu.as_secs_f64() / (self.end - self.start).as_secs_f64())
    }

    /// Keys per second processed after the producer finished: the rate at
    /// which the consumers alone, on both threads, drained what was left
    /// (zero when nothing was left).
    pub fn drain_per_sec(self) -> f64 {
        let secs = (self.end - self.last_add).as_secs_f64();
        if self.left_at_last_add == 0 || secs <= 0.0 {
            0.0
        } else {
            self.left_at_last_add as f64 / secs
        }
    }
}

/// One producer adds `keys` with `add(adder, i, key)`; `CONSUMERS` consumers
/// run `work` on each key handed out.
pub fn run_counted(
    subject: &dyn Subject,
    keys: Vec<String>,
    add: impl Fn(&dyn Adder, usize, String) + Send + 'static,
    work: impl Fn(&str) + Send + Sync + 'static,
) -> Counted {
    let rt = runtime();
    let cpu_before = threads_cpu();
    let mut counted = rt.block_on(async {
        let countdown = Arc::new(Countdown::new(keys.len()));
        let counted = countdown.clone();
        let running = subject.start(
            CONSUMERS,
            Arc::new(move |k: &str| {
                work(k);
                counted.hit()
            }),
        );
        let adder = running.adder;
        let left = countdown.clone();
        let producer = tokio::spawn(async move {
            let start = Instant::now();
            for (i, k) in keys.into_iter().enumerate() {
                add(&*adder, i, k);
            }
            let left_at_last_add = left.left.load(Ordering::Relaxed);
            (start, Instant::now(), left_at_last_add)
        });
        let end = countdown.wait().await;
        let (start, last_add, left_at_last_add) = producer.await.expect("the producer");
        Counted {
            start,
            last_add,
            end,
            left_at_last_add,
            cpu: None,
        }
    });
    // Read while the runtime's workers are still alive: /proc lists only
    // live threads.
    counted.cpu = threads_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    counted
}

/// CPU time run so far by the process's live threads, from each thread's
/// /proc schedstat (nanoseconds, unlike /proc/self/stat's clock ticks).
fn threads_cpu() -> Option<std::time::Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(std::time::Duration::from_nanos(ns))
}

/// Runs `one(subject)` for a warm-up and `cfg.runs` times, the subjects taking
/// turns, and records each sample `one` returns under `workload`.
pub fn repeat(
    cfg: &Config,
    report: &mut Report,
    workload: &str,
    subjects: &[&dyn Subject],
    one: impl FnMut(&dyn Subject, bool) -> Vec<(&'static str, f64)>,
) {
    repeat_with_go(cfg, report, workload, subjects, None, one)
}

/// [`repeat`], and after each round of the subjects' runs, a run of each Go
/// peer on `go`. Each run's figures include the machine's core-to-core round
/// trip right before it (see `cores.rs`).
pub fn repeat_with_go(
    cfg: &Config,
    report: &mut Report,
    workload: &str,
    subjects: &[&dyn Subject],
    go: Option<go_peers::Run>,
    mut one: impl FnMut(&dyn Subject, bool) -> Vec<(&'static str, f64)>,
) {
    if !cfg.wants(workload) {
        return;
    }
    eprintln!("running {workload}...");
    for run in 0..=cfg.runs {
        let warm_up = run == 0;
        for &subject in subjects {
            if !cfg.runs_impl(&subject.name()) {
                continue;
            }
            let Ok::<_, Infallible>(figures) =
                cores::with_round_trip(|| Ok(one(subject, warm_up || cfg.quick)));
            if cfg.verbose {
                eprintln!("  {workload} {} run {run}: {figures:?}", subject.name());
            }
            if !warm_up {
                for (figure, value) in figures {
                    report.push(&subject.name(), workload, figure, value);
                }
            }
        }
        if let Some(go) = go {
            cfg.go_peers.run(cfg, report, workload, go, run);
        }
    }
}
