//! W2 hot-keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::go_peers;
use crate::harness::repeat_with_go;
use crate::report::Report;
use crate::settings::{CONSUMERS, Config, W2_KEYS, W2_PRODUCERS, key_index, keys, runtime};
use crate::subjects::{Subject, Work};

/// W2 hot-keys: 4 producers, 1,000 keys, a yield every 100 adds.
pub fn w2(cfg: &Config, report: &mut Report, subjects: &[&dyn Subject]) {
    let per_producer = cfg.n(250_000);
    let adds = (per_producer * W2_PRODUCERS) as f64;
    let go = go_peers::Run {
        workload: "W2",
        n: per_producer * W2_PRODUCERS,
    };
    repeat_with_go(cfg, report, "W2", subjects, Some(go), |subject, verify| {
        let names = Arc::new(keys(0..W2_KEYS));
        // Verification: adds of each key so far, and the most a processing
        // of it saw; after the run both must agree for every key.
        let added: Arc<Vec<AtomicU64>> =
            Arc::new((0..W2_KEYS).map(|_| AtomicU64::new(0)).collect());
        let seen: Arc<Vec<AtomicU64>> = Arc::new((0..W2_KEYS).map(|_| AtomicU64::new(0)).collect());
        let rt = runtime();
        let (took, drain, processed) = rt.block_on(async {
            let (added2, seen2) = (added.clone(), seen.clone());
            let work: Work = if verify {
                Arc::new(move |k: &str| {
                    let i = key_index(k);
                    seen2[i].fetch_max(added2[i].load(Ordering::SeqCst), Ordering::SeqCst);
                })
            } else {
                Arc::new(|_: &str| {})
            };
            let running = subject.start(CONSUMERS, work);
            let producers: Vec<_> = (0..W2_PRODUCERS)
                .map(|p| {
                    let (adder, names, added) =
                        (running.adder.clone(), names.clone(), added.clone());
                    tokio::spawn(async move {
                        let start = Instant::now();
                        for j in 0..per_producer {
                            let i = (p * 7919 + j) % W2_KEYS;
                            if verify {
                                added[i].fetch_add(1, Ordering::SeqCst);
                            }
                            adder.add(names[i].clone());
                            if (j + 1) % 100 == 0 {
                                tokio::task::yield_now().await;
                            }
                        }
                        (start, Instant::now())
                    })
                })
                .collect();
            drop(running.adder);
            let mut start = None::<Instant>;
            let mut last_add = None::<Instant>;
            for p in producers {
                let (s, l) = p.await.expect("a producer");
                start = Some(start.map_or(s, |t| t.min(s)));
                last_add = Some(last_add.map_or(l, |t| t.max(l)));
            }
            let drained = running.drain.await;
            (
                drained.end - start.expect("producers"),
                drained
                    .end
                    .saturating_duration_since(last_add.expect("producers")),
                drained.processed,
            )
        });
        drop(rt);
        if verify {
            assert!(
                processed >= W2_KEYS as u64,
                "{}: W2 processed {processed} < 1000",
                subject.name()
            );
            for i in 0..W2_KEYS {
                let (a, s) = (
                    added[i].load(Ordering::SeqCst),
                    seen[i].load(Ordering::SeqCst),
                );
                assert_eq!(
                    a,
                    s,
                    "{}: W2 key {i} not processed after its last add",
                    subject.name()
                );
            }
        }
        vec![
            ("adds/s", adds / took.as_secs_f64()),
            ("processed/adds", processed as f64 / adds),
            // How long the queue took to empty once the adds were over.
            ("drain ms after last add", drain.as_secs_f64() * 1e3),
        ]
    });
}
