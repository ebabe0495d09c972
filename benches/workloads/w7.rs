//! W7 tenant flood (orderings).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::harness::repeat;
use crate::report::Report;
use crate::settings::{Config, W7_ITEM, W7_PER_TENANT, W7_TENANTS, runtime};
use crate::subjects::{Subject, Work};

/// The index among the other tenants' keys of `key` (`ns-{t}/obj-{j}` with
/// `t` from 1), or `None` for the flooding tenant's.
pub fn w7_other(key: &str) -> Option<usize> {
    let (ns, obj) = key.split_once('/')?;
    let t: usize = ns.strip_prefix("ns-")?.parse().ok()?;
    let j: usize = obj.strip_prefix("obj-")?.parse().ok()?;
    (t >= 1).then(|| (t - 1) * W7_PER_TENANT + j)
}

/// W7 tenant flood: one consumer at 50 us an item; `ns-0` adds N keys, then
/// each of 9 other tenants adds 10. Figures for the other tenants' keys: the
/// most hand-outs from a key's add to its own hand-out (its own counted),
/// and the longest wait.
pub fn w7(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let flood = cfg.n(100_000);
    let others = W7_TENANTS * W7_PER_TENANT;
    repeat(cfg, report, "W7", subjects, |subject, _| {
        let flood_keys: Vec<String> = (0..flood).map(|i| format!("ns-0/obj-{i}")).collect();
        let other_keys: Vec<String> = (1..=W7_TENANTS)
            .flat_map(|t| (0..W7_PER_TENANT).map(move |j| format!("ns-{t}/obj-{j}")))
            .collect();
        let atomics = |n: usize| -> Arc<Vec<AtomicI64>> {
            Arc::new((0..n).map(|_| AtomicI64::new(-1)).collect())
        };
        let (add_seq, out_seq, add_at, out_at) = (
            atomics(others),
            atomics(others),
            atomics(others),
            atomics(others),
        );
        let handed = Arc::new(AtomicI64::new(0));
        let left = Arc::new(AtomicUsize::new(others));
        let all_out = Arc::new(Notify::new());
        let base = Instant::now();
        let nanos = move |t: Instant| (t - base).as_nanos() as i64;
        let rt = runtime();
        rt.block_on(async {
            let work: Work = {
                let (handed, left, all_out) = (handed.clone(), left.clone(), all_out.clone());
                let (out_seq, out_at) = (out_seq.clone(), out_at.clone());
                Arc::new(move |k: &str| {
                    let out = Instant::now();
                    let seq = handed.fetch_add(1, Ordering::SeqCst) + 1;
                    if left.load(Ordering::SeqCst) == 0 {
                        return; // every measured key is out: drain quickly
                    }
                    if let Some(i) = w7_other(k) {
                        out_seq[i].store(seq, Ordering::SeqCst);
                        out_at[i].store(nanos(out), Ordering::SeqCst);
                        if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                            all_out.notify_one();
                        }
                    }
                    while out.elapsed() < W7_ITEM {
                        std::hint::spin_loop();
                    }
                })
            };
            let running = subject.start(1, work);
            let adder = running.adder;
            let (handed, add_seq, add_at) = (handed.clone(), add_seq.clone(), add_at.clone());
            let producer = tokio::spawn(async move {
                for k in flood_keys {
                    adder.add(k);
                }
                for (i, k) in other_keys.into_iter().enumerate() {
                    // Read before the add: a hand-out during the add counts.
                    add_seq[i].store(handed.load(Ordering::SeqCst), Ordering::SeqCst);
                    add_at[i].store(nanos(Instant::now()), Ordering::SeqCst);
                    adder.add(k);
                }
            });
            producer.await.expect("the producer");
            all_out.notified().await;
        });
        drop(rt);
        let load = |v: &Arc<Vec<AtomicI64>>| -> Vec<i64> {
            v.iter().map(|a| a.load(Ordering::SeqCst)).collect()
        };
        let (add_seq, out_seq, add_at, out_at) =
            (load(&add_seq), load(&out_seq), load(&add_at), load(&out_at));
        let most_hand_outs = (0..others)
            .map(|i| out_seq[i] - add_seq[i])
            .max()
            .unwrap_or(0);
        let longest = (0..others)
            .map(|i| out_at[i] - add_at[i])
            .max()
            .unwrap_or(0);
        vec![
            ("others max hand-outs", most_hand_outs as f64),
            ("others max wait ms", longest as f64 / 1e6),
        ]
    });
}
