//! W3 delayed.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::{Counted, repeat, run_counted};
use crate::report::Report;
use crate::settings::{Config, key_index, keys};
use crate::subjects::Subject;

/// W3 delayed: 1 producer adds N keys with a delay of `(i % 1000) * 100 us`.
pub fn w3(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let n = cfg.n(100_000);
    let delay = |i: usize| Duration::from_micros((i % 1000) as u64 * 100);
    repeat(cfg, report, "W3", subjects, |subject, _| {
        let base = Instant::now();
        let nanos = move |t: Instant| (t - base).as_nanos() as i64;
        let added_at: Arc<Vec<AtomicI64>> = Arc::new((0..n).map(|_| AtomicI64::new(0)).collect());
        let late: Arc<Vec<AtomicI64>> = Arc::new((0..n).map(|_| AtomicI64::new(0)).collect());
        let (added_at2, late2) = (added_at.clone(), late.clone());
        let Counted {
            start,
            last_add,
            end,
            ..
        } = run_counted(
            subject,
            keys(0..n),
            move |a, i, k| {
                added_at[i].store(nanos(Instant::now()), Ordering::Relaxed);
                a.add_after(k, delay(i));
            },
            move |k| {
                let i = key_index(k);
                let due = added_at2[i].load(Ordering::Relaxed) + delay(i).as_nanos() as i64;
                late2[i].store(nanos(Instant::now()) - due, Ordering::Relaxed);
            },
        );
        let mut late: Vec<i64> = late.iter().map(|l| l.load(Ordering::Relaxed)).collect();
        late.sort_unstable();
        let ms = |ns: i64| ns as f64 / 1e6;
        let pct = |p: f64| ms(late[((late.len() - 1) as f64 * p).round() as usize]);
        vec![
            ("total ms", (end - start).as_secs_f64() * 1e3),
            // The last key due is added last: the total is about this plus
            // the longest delay plus its lateness.
            ("adds ms", (last_add - start).as_secs_f64() * 1e3),
            ("lateness p50 ms", pct(0.50)),
            ("lateness p99 ms", pct(0.99)),
            ("lateness max ms", ms(*late.last().expect("keys"))),
        ]
    });
}
