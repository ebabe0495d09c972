//! Multi-threaded stress: producers and consumers on a multi-thread runtime
//! for about two seconds, with an independent record that checks the two
//! guarantees that matter most under real concurrency:
//!
//! - stingy: no key is leased to two consumers at once (a per-key holder
//!   flag, set at lease start and cleared before the lease ends);
//! - nothing lost: at each quiescence point (producers paused, every delay
//!   run out, nothing ready and nothing in flight) every key has a lease that
//!   started after its last add returned.
//!
//! Consumers take keys with `get`, through a `Stream`, or with a `get` under
//! a tiny timeout (cancelled mid-wait); they requeue, requeue after a delay,
//! requeue rate-limited, or panic inside a spawned task (the lease ends on
//! unwind). Producers add with random priorities and delays.
//!
//! `STRESS_SECS` lengthens the run (default 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio_workqueue::{AddOpts, ExponentialBackoff, WorkItem, WorkQueue};

const KEYS: usize = 64;
const PRODUCERS: usize = 3;
const CONSUMERS: usize = 4;

/// The independent record.
struct Record {
    /// A global clock of events.
    clock: AtomicU64,
    /// Per key: the event number of the last add or requeue, taken just
    /// before the call: a lease that covers the add starts after the call
    /// took the queue's lock, so its number is larger. (Taken after the
    /// call, a consumer could record the covering lease first: a false
    /// alarm.)
    last_add: Vec<AtomicU64>,
    /// Per key: the event number of the last lease start.
    last_lease: Vec<AtomicU64>,
    /// Per key: whether a consumer holds it.
    held: Vec<AtomicBool>,
    overlaps: AtomicUsize,
    leases: AtomicUsize,
    panics: AtomicUsize,
    cancelled: AtomicUsize,
    /// Consumers stop requeueing while the test waits for quiescence.
    quiescing: AtomicBool,
    seed: AtomicU64,
}

impl Record {
    fn new() -> Self {
        let per_key = |v: u64| (0..KEYS).map(|_| AtomicU64::new(v)).collect();
        Record {
            clock: AtomicU64::new(1),
            last_add: per_key(0),
            last_lease: per_key(0),
            held: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            overlaps: AtomicUsize::new(0),
            leases: AtomicUsize::new(0),
            panics: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            quiescing: AtomicBool::new(false),
            seed: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn rng(&self) -> SmallRng {
        SmallRng::seed_from_u64(self.seed.fetch_add(0x9E37_79B9_7F4A_7C15, SeqCst))
    }

    fn added(&self, key: usize) {
        let t = self.clock.fetch_add(1, SeqCst);
        self.last_add[key].fetch_max(t, SeqCst);
    }

    fn lease_started(&self, key: usize) {
        if self.held[key].swap(true, SeqCst) {
            self.overlaps.fetch_add(1, SeqCst);
        }
        let t = self.clock.fetch_add(1, SeqCst);
        self.last_lease[key].fetch_max(t, SeqCst);
        self.leases.fetch_add(1, SeqCst);
    }

    fn lease_ending(&self, key: usize) {
        if !self.held[key].swap(false, SeqCst) {
            self.overlaps.fetch_add(1, SeqCst);
        }
    }
}

/// Clears the holder flag before the item it is declared after is dropped,
/// on every path, unwinding included.
struct Holding<'a>(&'a Record, usize);
impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.lease_ending(self.1);
    }
}

async fn work(rec: Arc<Record>, item: WorkItem<usize>, rng: &mut SmallRng) {
    let key = *item.key();
    rec.lease_started(key);
    let choice = rng.random_range(0..100);
    if choice < 5 {
        // A worker that panics while holding the lease: the lease ends on
        // unwind, in the spawned task.
        let rec2 = rec.clone();
        let res = tokio::spawn(async move {
            let item = item;
            let _h = Holding(&rec2, key);
            tokio::task::yield_now().await;
            if item.priority() < i32::MAX {
                panic!("worker panic (expected by the stress test)");
            }
        })
        .await;
        assert!(res.is_err());
        rec.panics.fetch_add(1, SeqCst);
        return;
    }
    let h = Holding(&rec, key);
    if rng.random_range(0..4) == 0 {
        tokio::task::yield_now().await;
    }
    let requeue = !rec.quiescing.load(SeqCst);
    drop(h);
    match choice {
        5..=14 if requeue => {
            rec.added(key);
            item.requeue().unwrap();
        }
        15..=19 if requeue => {
            rec.added(key);
            item.requeue_after(Duration::from_millis(rng.random_range(0..3) + 1))
                .unwrap();
        }
        20..=22 if requeue => {
            rec.added(key);
            item.requeue_rate_limited().unwrap();
        }
        _ => item.done(),
    }
}

async fn consumer(q: WorkQueue<usize>, rec: Arc<Record>) {
    let mut rng = rec.rng();
    let mut stream = q.clone();
    loop {
        let item = match rng.random_range(0..3) {
            0 => match q.get().await {
                Some(item) => item,
                None => return,
            },
            1 => match stream.next().await {
                Some(item) => item,
                None => return,
            },
            _ => {
                let tiny = Duration::from_micros(rng.random_range(0..200));
                match tokio::time::timeout(tiny, q.get()).await {
                    Ok(Some(item)) => item,
                    Ok(None) => return,
                    Err(_) => {
                        rec.cancelled.fetch_add(1, SeqCst);
                        continue;
                    }
                }
            }
        };
        work(rec.clone(), item, &mut rng).await;
    }
}

async fn producer(q: WorkQueue<usize>, rec: Arc<Record>, stop: Arc<AtomicBool>) {
    let mut rng = rec.rng();
    while !stop.load(SeqCst) {
        let key = rng.random_range(0..KEYS as u64) as usize;
        let opts = AddOpts::default().priority(rng.random_range(-1..=1));
        let opts = match rng.random_range(0..10) {
            0 => opts.after(Duration::from_millis(rng.random_range(0..3) + 1)),
            1 => opts.rate_limited(),
            _ => opts,
        };
        rec.added(key);
        q.add_with(key, opts).unwrap();
        if rng.random_range(0..8) == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Waits until nothing is ready, waiting or in flight.
async fn quiesce(q: &WorkQueue<usize>) {
    loop {
        let s = q.snapshot();
        if s.depth() == 0 && s.in_flight == 0 && s.waiting == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn producers_and_consumers_on_a_multi_thread_runtime() {
    let secs: f64 = std::env::var("STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let rounds = 4;
    let round = Duration::from_secs_f64(secs * 0.7 / rounds as f64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Quiet the expected worker panics.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if !info.to_string().contains("expected by the stress test") {
            eprintln!("{info}");
        }
    }));
    let (rec, q) = rt.block_on(async {
        let q: WorkQueue<usize> = WorkQueue::builder()
            .rate_limiter(
                ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(4))
                    .unwrap(),
            )
            .starvation_bound(Duration::from_millis(50))
            .build();
        let rec = Arc::new(Record::new());
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|_| tokio::spawn(consumer(q.clone(), rec.clone())))
            .collect();
        for r in 0..rounds {
            rec.quiescing.store(false, SeqCst);
            let stop = Arc::new(AtomicBool::new(false));
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|_| tokio::spawn(producer(q.clone(), rec.clone(), stop.clone())))
                .collect();
            tokio::time::sleep(round).await;
            stop.store(true, SeqCst);
            for p in producers {
                p.await.unwrap();
            }
            rec.quiescing.store(true, SeqCst);
            tokio::time::timeout(Duration::from_secs(10), quiesce(&q))
                .await
                .unwrap_or_else(|_| panic!("round {r}: no quiescence: {:?}", q.snapshot()));
            let lost: Vec<usize> = (0..KEYS)
                .filter(|&k| rec.last_add[k].load(SeqCst) > rec.last_lease[k].load(SeqCst))
                .collect();
            assert_eq!(
                lost,
                [] as [usize; 0],
                "round {r}: keys added but not processed"
            );
        }
        tokio::time::timeout(Duration::from_secs(10), q.shutdown_with_drain())
            .await
            .expect("drain");
        for c in consumers {
            c.await.unwrap();
        }
        (rec, q)
    });
    std::panic::set_hook(hook);
    let leases = rec.leases.load(SeqCst);
    eprintln!(
        "stress: {leases} leases, {} worker panics, {} cancelled gets, {} overlaps",
        rec.panics.load(SeqCst),
        rec.cancelled.load(SeqCst),
        rec.overlaps.load(SeqCst),
    );
    assert_eq!(
        rec.overlaps.load(SeqCst),
        0,
        "a key was leased twice at once"
    );
    assert!(leases > 1000, "too little work to mean anything: {leases}");
    assert!(q.is_empty() && q.snapshot().in_flight == 0);
}
