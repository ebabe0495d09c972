//! W5 fairness under flood.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::harness::repeat;
use crate::report::Report;
use crate::settings::{Config, W5_AHEAD, W5_ITEM, W5_LOW, key_index, keys, runtime};
use crate::subjects::{Subject, Work};

/// W5 fairness under flood: one consumer at 50 us an item; 100 keys at
/// priority -100 at the start, then distinct priority-0 keys at twice the
/// consumer's rate for the window.
pub fn w5(cfg: &Config, report: &mut Report, window: Duration, subjects: &[&dyn Subject]) {
    let rate = 2.0 / W5_ITEM.as_secs_f64(); // keys per second
    let high_n = (rate * window.as_secs_f64()) as usize + 1000;
    repeat(cfg, report, "W5", subjects, |subject, _| {
        let mut low = keys(0..W5_LOW);
        let high = keys(W5_LOW..W5_LOW + high_n);
        let base = Instant::now();
        let waits: Arc<Vec<AtomicI64>> =
            Arc::new((0..W5_LOW).map(|_| AtomicI64::new(-1)).collect());
        let added_at: Arc<Vec<AtomicI64>> =
            Arc::new((0..W5_LOW).map(|_| AtomicI64::new(0)).collect());
        let window_end = Arc::new(AtomicI64::new(i64::MAX));
        let high_out = Arc::new(AtomicU64::new(0));
        let rt = runtime();
        rt.block_on(async {
            let (waits2, added_at2, window_end2, high_out2) = (
                waits.clone(),
                added_at.clone(),
                window_end.clone(),
                high_out.clone(),
            );
            let work: Work = Arc::new(move |k: &str| {
                let out = Instant::now();
                let at = (out - base).as_nanos() as i64;
                if at > window_end2.load(Ordering::Relaxed) {
                    return; // past the window: drain quickly
                }
                let i = key_index(k);
                if i < W5_LOW {
                    waits2[i].store(at - added_at2[i].load(Ordering::Relaxed), Ordering::Relaxed);
                } else {
                    high_out2.fetch_add(1, Ordering::Relaxed);
                }
                while out.elapsed() < W5_ITEM {
                    std::hint::spin_loop();
                }
            });
            let running = subject.start(1, work);
            let adder = running.adder;
            let producer = tokio::spawn(async move {
                let start = Instant::now();
                window_end.store(
                    ((start - base) + window).as_nanos() as i64,
                    Ordering::Relaxed,
                );
                let mut high = high.into_iter();
                let mut sent = 0usize;
                loop {
                    let elapsed = start.elapsed();
                    if elapsed >= window {
                        break;
                    }
                    // The flood runs W5_AHEAD ahead of the clock, so that a
                    // late wake-up of this task (the timer works in whole
                    // milliseconds, and the machine may be busy) does not
                    // leave the consumer without high-priority keys.
                    let due = ((elapsed + W5_AHEAD).as_secs_f64() * rate) as usize;
                    for k in high.by_ref().take(due.saturating_sub(sent)) {
                        adder.add_priority(k, 0);
                        sent += 1;
                    }
                    if sent > 0 && !low.is_empty() {
                        // The low keys go in at the start, with the first
                        // batch of the flood.
                        for (i, k) in std::mem::take(&mut low).into_iter().enumerate() {
                            added_at[i].store(
                                (Instant::now() - base).as_nanos() as i64,
                                Ordering::Relaxed,
                            );
                            adder.add_priority(k, -100);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            producer.await.expect("the producer");
        });
        drop(rt);
        let waits: Vec<i64> = waits.iter().map(|w| w.load(Ordering::Relaxed)).collect();
        let served = waits.iter().filter(|&&w| w >= 0).count();
        // A key never handed out waited at least the whole window.
        let longest = waits
            .iter()
            .map(|&w| if w < 0 { window.as_nanos() as i64 } else { w })
            .max()
            .unwrap_or(0);
        let high = high_out.load(Ordering::Relaxed) as f64;
        vec![
            ("low handed out (of 100)", served as f64),
            ("low max wait ms", longest as f64 / 1e6),
            ("high share %", 100.0 * high / (high + served as f64)),
        ]
    });
}
