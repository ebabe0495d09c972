//! Soak test: many producers and consumers for a fixed time on the
//! multi-threaded runtime, with random cancellations, panics and requeues,
//! checked by an independent record.
//!
//! ```text
//! cargo run --release --example soak -- [SECONDS]   # default 60
//! ```
//!
//! Producers add keys from a fixed set of 10 000 with random priorities,
//! delays and rate limits. Consumers take keys with `get`, through a
//! `Stream`, or with a `get` raced against a tiny timeout or a `select!`
//! (so `get` futures are dropped mid-wait); they then finish, requeue
//! (now, after a delay, or rate-limited) or panic inside a spawned worker.
//!
//! The record is kept outside the queue: a per-key holder flag counts
//! overlapping leases, and per-key event numbers check that every key added
//! is handed out after its last add. At the end producers stop, requeues
//! stop, the queue quiesces (nothing ready, waiting or in flight) and the
//! record is compared; then the queue drains and shuts down.
//!
//! It reports operations done, keys lost and leases overlapping (both must
//! be 0: the exit code is 1 otherwise), and the resident memory at the
//! start, once the key set is stable (after a fifth of the run) and at the
//! end. Memory must not grow once the key set is stable: an end RSS more
//! than 25% (and 16 MiB) above the stable one also fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio_workqueue::{AddOpts, ExponentialBackoff, WorkItem, WorkQueue};

const KEYS: usize = 10_000;
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 8;

#[derive(Default)]
struct Counters {
    adds: AtomicU64,
    leases: AtomicU64,
    requeues: AtomicU64,
    panics: AtomicU64,
    cancelled: AtomicU64,
    overlaps: AtomicU64,
}

struct Record {
    keys: Vec<String>,
    clock: AtomicU64,
    /// Per key: event number taken just before its last add or requeue.
    last_add: Vec<AtomicU64>,
    /// Per key: event number of its last lease start.
    last_lease: Vec<AtomicU64>,
    held: Vec<AtomicBool>,
    n: Counters,
    stop_requeues: AtomicBool,
    seed: AtomicU64,
}

impl Record {
    fn new() -> Self {
        Record {
            keys: (0..KEYS)
                .map(|i| format!("default/object-{i:05}"))
                .collect(),
            clock: AtomicU64::new(1),
            last_add: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            last_lease: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            held: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            n: Counters::default(),
            stop_requeues: AtomicBool::new(false),
            seed: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn rng(&self) -> SmallRng {
        SmallRng::seed_from_u64(self.seed.fetch_add(0x9E37_79B9_7F4A_7C15, SeqCst))
    }

    fn index(key: &str) -> usize {
        key.rsplit('-').next().unwrap().parse().unwrap()
    }

    fn adding(&self, i: usize) {
        let t = self.clock.fetch_add(1, SeqCst);
        self.last_add[i].fetch_max(t, SeqCst);
    }

    fn lease_started(&self, i: usize) {
        if self.held[i].swap(true, SeqCst) {
            self.n.overlaps.fetch_add(1, SeqCst);
        }
        let t = self.clock.fetch_add(1, SeqCst);
        self.last_lease[i].fetch_max(t, SeqCst);
        self.n.leases.fetch_add(1, SeqCst);
    }

    fn lease_ending(&self, i: usize) {
        if !self.held[i].swap(false, SeqCst) {
            self.n.overlaps.fetch_add(1, SeqCst);
        }
    }

    fn lost(&self) -> usize {
        (0..KEYS)
            .filter(|&i| self.last_add[i].load(SeqCst) > self.last_lease[i].load(SeqCst))
            .count()
    }
}

/// Clears the holder flag before the lease declared before it ends, on every
/// path (unwinding included).
struct Holding<'a>(&'a Record, usize);
impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.lease_ending(self.1);
    }
}

/// Resident memory in bytes (Linux), or 0.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

async fn work(rec: Arc<Record>, item: WorkItem<String>, rng: &mut SmallRng) {
    let i = Record::index(item.key());
    rec.lease_started(i);
    let choice = rng.random_range(0..1000);
    if choice < 20 {
        let rec2 = rec.clone();
        let res = tokio::spawn(async move {
            let item = item;
            let _h = Holding(&rec2, i);
            tokio::task::yield_now().await;
            if !item.key().is_empty() {
                panic!("soak: a worker panics on purpose");
            }
        })
        .await;
        assert!(res.is_err());
        rec.n.panics.fetch_add(1, SeqCst);
        return;
    }
    let h = Holding(&rec, i);
    if rng.random_range(0..8) == 0 {
        tokio::task::yield_now().await;
    }
    let requeue = !rec.stop_requeues.load(SeqCst);
    drop(h);
    let outcome = match choice {
        20..=119 if requeue => {
            rec.adding(i);
            item.requeue()
        }
        120..=169 if requeue => {
            rec.adding(i);
            item.requeue_after(Duration::from_millis(rng.random_range(0..20) + 1))
        }
        170..=199 if requeue => {
            rec.adding(i);
            item.requeue_rate_limited()
        }
        _ => {
            item.forget();
            item.done();
            return;
        }
    };
    outcome.expect("requeue refused before shutdown");
    rec.n.requeues.fetch_add(1, SeqCst);
}

async fn consumer(q: WorkQueue<String>, rec: Arc<Record>) {
    let mut rng = rec.rng();
    let mut stream = q.clone();
    loop {
        let got = match rng.random_range(0..4) {
            0 => q.get().await,
            1 => stream.next().await,
            2 => {
                let tiny = Duration::from_micros(rng.random_range(0..500));
                match tokio::time::timeout(tiny, q.get()).await {
                    Ok(got) => got,
                    Err(_) => {
                        rec.n.cancelled.fetch_add(1, SeqCst);
                        continue;
                    }
                }
            }
            _ => {
                tokio::select! {
                    got = q.get() => got,
                    _ = tokio::task::yield_now() => {
                        rec.n.cancelled.fetch_add(1, SeqCst);
                        continue;
                    }
                }
            }
        };
        let Some(item) = got else { return };
        work(rec.clone(), item, &mut rng).await;
    }
}

async fn producer(q: WorkQueue<String>, rec: Arc<Record>, stop: Arc<AtomicBool>) {
    let mut rng = rec.rng();
    while !stop.load(SeqCst) {
        let i = rng.random_range(0..KEYS as u64) as usize;
        let opts = AddOpts::default().priority(rng.random_range(-1..=1));
        let opts = match rng.random_range(0..20) {
            0 | 1 => opts.after(Duration::from_millis(rng.random_range(0..50) + 1)),
            2 => opts.rate_limited(),
            _ => opts,
        };
        rec.adding(i);
        q.add_with(rec.keys[i].clone(), opts)
            .expect("add refused before shutdown");
        rec.n.adds.fetch_add(1, SeqCst);
        if rng.random_range(0..16) == 0 {
            tokio::task::yield_now().await;
        }
    }
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("SECONDS must be a number"))
        .unwrap_or(60.0);
    let run = Duration::from_secs_f64(secs);
    let rss_start = rss();
    std::panic::set_hook(Box::new(|info| {
        if !info.to_string().contains("on purpose") {
            eprintln!("{info}");
        }
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rec = Arc::new(Record::new());
    let started = Instant::now();
    let (rss_stable, rss_end, lost, snapshot) = rt.block_on(async {
        let q: WorkQueue<String> = WorkQueue::builder()
            .name("soak")
            .rate_limiter(
                ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(50))
                    .unwrap(),
            )
            .starvation_bound(Duration::from_secs(1))
            .build();
        let stop = Arc::new(AtomicBool::new(false));
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| tokio::spawn(consumer(q.clone(), rec.clone())))
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|_| tokio::spawn(producer(q.clone(), rec.clone(), stop.clone())))
            .collect();
        tokio::time::sleep(run / 5).await;
        let rss_stable = rss();
        let mut next_report = Duration::from_secs(10);
        while started.elapsed() < run {
            tokio::time::sleep(Duration::from_millis(50).min(run)).await;
            if started.elapsed() >= next_report {
                next_report += Duration::from_secs(10);
                eprintln!(
                    "soak: {:>4.0} s, {} leases, rss {}",
                    started.elapsed().as_secs_f64(),
                    rec.n.leases.load(SeqCst),
                    mib(rss())
                );
            }
        }
        let rss_end = rss();
        // Quiesce: no more adds or requeues, every delay runs out, every key
        // is handed out and finished.
        stop.store(true, SeqCst);
        for p in producers {
            p.await.unwrap();
        }
        rec.stop_requeues.store(true, SeqCst);
        let quiet = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let s = q.snapshot();
                if s.depth() == 0 && s.in_flight == 0 && s.waiting == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        let snapshot = q.snapshot();
        if quiet.is_err() {
            eprintln!("soak: the queue did not quiesce in 30 s: {snapshot:?}");
        }
        let lost = rec.lost();
        tokio::time::timeout(Duration::from_secs(30), q.shutdown_with_drain())
            .await
            .expect("drain did not finish");
        for c in consumers {
            c.await.unwrap();
        }
        (rss_stable, rss_end, lost, snapshot)
    });
    let n = &rec.n;
    let overlaps = n.overlaps.load(SeqCst);
    let ops = n.adds.load(SeqCst) + n.leases.load(SeqCst) + n.cancelled.load(SeqCst);
    let grew = rss_end > rss_stable + (rss_stable / 4).max(16 << 20);
    println!(
        "soak: {:.1} s, {} producers, {} consumers, {} keys",
        started.elapsed().as_secs_f64(),
        PRODUCERS,
        CONSUMERS,
        KEYS
    );
    println!(
        "soak: ops {ops} (adds {}, leases {}, requeues {}, worker panics {}, cancelled gets {})",
        n.adds.load(SeqCst),
        n.leases.load(SeqCst),
        n.requeues.load(SeqCst),
        n.panics.load(SeqCst),
        n.cancelled.load(SeqCst),
    );
    println!("soak: lost {lost}, overlapping {overlaps}");
    println!(
        "soak: rss start {}, stable {}, end {}{}",
        mib(rss_start),
        mib(rss_stable),
        mib(rss_end),
        if grew { " (GREW)" } else { "" }
    );
    let leftover = snapshot.depth() + snapshot.in_flight + snapshot.waiting;
    if lost != 0 || overlaps != 0 || grew || leftover != 0 {
        eprintln!("soak: FAILED (leftover after quiescence: {snapshot:?})");
        std::process::exit(1);
    }
    println!("soak: ok");
}
