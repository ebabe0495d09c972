//! Bad input: every public entry point with its edge values. Each row either
//! works or returns a clear error; none panics, hangs or overflows.
//!
//! The rows are one table, run by one test that prints it, so a reader sees
//! the whole contract at once: `cargo test --test bad_input -- --nocapture`.
//! Rows that need the clock run on a paused current-thread runtime of their
//! own; "no runtime" rows run outside any runtime.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_workqueue::limiter::{InvalidLimiter, RateLimiter};
use tokio_workqueue::{
    AddError, AddOpts, ExponentialBackoff, FastSlow, Lane, MAX_DELAY, MaxOf, Partitioned,
    TokenBucket, WithMaxWait, WorkQueue, default_controller_rate_limiter,
};

const SEC: Duration = Duration::from_secs(1);

enum Run {
    /// Outside any runtime.
    Plain(fn() -> String),
    /// On a paused current-thread runtime.
    Paused(fn() -> BoxFuture<'static, String>),
}

struct Row {
    call: &'static str,
    edge: &'static str,
    expect: &'static str,
    run: Run,
}

fn row(call: &'static str, edge: &'static str, expect: &'static str, run: Run) -> Row {
    Row {
        call,
        edge,
        expect,
        run,
    }
}

fn q() -> WorkQueue<u32> {
    WorkQueue::new()
}

fn shut() -> WorkQueue<u32> {
    let q = q();
    q.shutdown();
    q
}

/// Calls `f` `n` times and returns the last answer.
fn nth_call<T>(n: usize, mut f: impl FnMut() -> T) -> T {
    for _ in 1..n {
        f();
    }
    f()
}

/// Which parameter an `InvalidLimiter` names.
fn invalid<T>(r: Result<T, InvalidLimiter>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => {
            // A clear error: it names the limiter and the parameter, and
            // says why.
            assert!(!e.reason().is_empty());
            assert!(e.to_string().contains(e.parameter()), "{e}");
            format!("Err({}.{})", e.limiter(), e.parameter())
        }
    }
}

/// "ready now" if exactly one key is ready, else how many are.
fn ready_now(q: &WorkQueue<u32>) -> String {
    match q.len() {
        1 => "ready now".into(),
        n => format!("len {n}"),
    }
}

/// How long until the queue hands out a key, or "never" within `limit`.
async fn hand_out_after(q: &WorkQueue<u32>, limit: Duration) -> String {
    let start = Instant::now();
    match tokio::time::timeout(limit, q.get()).await {
        Ok(Some(item)) => format!("{} after {:?}", *item, start.elapsed()),
        Ok(None) => "None".into(),
        Err(_) => "never".into(),
    }
}

/// "clamped to MAX_DELAY" if key 1 comes out exactly `MAX_DELAY` from now.
async fn clamped(q: &WorkQueue<u32>) -> String {
    let out = hand_out_after(q, Duration::MAX).await;
    if out == format!("1 after {MAX_DELAY:?}") {
        "clamped to MAX_DELAY".into()
    } else {
        out
    }
}

fn rows() -> Vec<Row> {
    use Run::{Paused, Plain};
    vec![
        // Adds and delays.
        row(
            "add_after",
            "Duration::ZERO",
            "ready now",
            Paused(|| {
                async {
                    let q = q();
                    q.add_after(1, Duration::ZERO).unwrap();
                    ready_now(&q)
                }
                .boxed()
            }),
        ),
        row(
            "add_after",
            "1 ns (below the 1 ms tick)",
            "1 after 1ms",
            Paused(|| {
                async {
                    let q = q();
                    q.add_after(1, Duration::from_nanos(1)).unwrap();
                    hand_out_after(&q, SEC).await
                }
                .boxed()
            }),
        ),
        row(
            "add_after",
            "Duration::MAX",
            "clamped to MAX_DELAY",
            Paused(|| {
                async {
                    let q = q();
                    q.add_after(1, Duration::MAX).unwrap();
                    clamped(&q).await
                }
                .boxed()
            }),
        ),
        row(
            "add_after",
            "MAX_DELAY + 1 ns",
            "clamped to MAX_DELAY",
            Paused(|| {
                async {
                    let q = q();
                    q.add_after(1, MAX_DELAY + Duration::from_nanos(1)).unwrap();
                    clamped(&q).await
                }
                .boxed()
            }),
        ),
        row(
            "add_after",
            "no runtime, 1 s",
            "Err(NoRuntime)",
            Plain(|| format!("{:?}", q().add_after(1, SEC))),
        ),
        row(
            "add_after",
            "no runtime, zero",
            "Ok",
            Plain(|| {
                format!("{:?}", q().add_after(1, Duration::ZERO).map(|_| "ready"))
                    .replace("Ok(\"ready\")", "Ok")
            }),
        ),
        row(
            "add_with",
            "priority i32::MIN and i32::MAX",
            "MAX then MIN",
            Paused(|| {
                async {
                    let q = q();
                    q.add_with(1, AddOpts::default().priority(i32::MIN))
                        .unwrap();
                    q.add_with(2, AddOpts::default().priority(i32::MAX))
                        .unwrap();
                    let a = q.get().await.unwrap();
                    let b = q.get().await.unwrap();
                    match (a.priority(), b.priority()) {
                        (i32::MAX, i32::MIN) => "MAX then MIN".into(),
                        other => format!("{other:?}"),
                    }
                }
                .boxed()
            }),
        ),
        row(
            "add_with",
            "after(MAX), rate limited by a MAX limiter",
            "clamped to MAX_DELAY",
            Paused(|| {
                async {
                    let q: WorkQueue<u32> = WorkQueue::builder()
                        .rate_limiter(
                            ExponentialBackoff::new(Duration::MAX, Duration::MAX).unwrap(),
                        )
                        .build();
                    q.add_with(1, AddOpts::default().after(Duration::MAX).rate_limited())
                        .unwrap();
                    clamped(&q).await
                }
                .boxed()
            }),
        ),
        row(
            "add_rate_limited",
            "no runtime (default limiter delays)",
            "Err(NoRuntime), 0 failures counted",
            Plain(|| {
                let q = q();
                let err = q.add_rate_limited(1).unwrap_err();
                format!("Err({err:?}), {} failures counted", q.num_requeues(&1))
            }),
        ),
        row(
            "forget / num_requeues",
            "unknown key",
            "0",
            Plain(|| {
                let q = q();
                q.forget(&9);
                q.num_requeues(&9).to_string()
            }),
        ),
        row(
            "len / is_empty / snapshot",
            "new queue",
            "0 true 0 0 0",
            Plain(|| {
                let q = q();
                let s = q.snapshot();
                format!(
                    "{} {} {} {} {}",
                    q.len(),
                    q.is_empty(),
                    s.depth(),
                    s.in_flight,
                    s.waiting
                )
            }),
        ),
        // Leases.
        row(
            "requeue_after",
            "Duration::ZERO",
            "ready now",
            Paused(|| {
                async {
                    let q = q();
                    q.add(1).unwrap();
                    q.get()
                        .await
                        .unwrap()
                        .requeue_after(Duration::ZERO)
                        .unwrap();
                    ready_now(&q)
                }
                .boxed()
            }),
        ),
        row(
            "requeue_after",
            "Duration::MAX",
            "clamped to MAX_DELAY",
            Paused(|| {
                async {
                    let q = q();
                    q.add(1).unwrap();
                    q.get().await.unwrap().requeue_after(Duration::MAX).unwrap();
                    clamped(&q).await
                }
                .boxed()
            }),
        ),
        row(
            "requeue_after",
            "no runtime, 1 s",
            "Err(NoRuntime), ready now",
            Plain(|| {
                let q = q();
                q.add(1).unwrap();
                let item = futures::executor::block_on(q.get()).unwrap();
                let err = item.requeue_after(SEC).unwrap_err();
                let s = q.snapshot();
                // The key is not lost: back without its delay.
                assert_eq!((s.in_flight, s.waiting, q.len()), (0, 0, 1));
                format!("Err({err:?}), ready now")
            }),
        ),
        row(
            "requeue_rate_limited",
            "no runtime",
            "Err(NoRuntime), ready now",
            Plain(|| {
                let q = q();
                q.add(1).unwrap();
                let item = futures::executor::block_on(q.get()).unwrap();
                let err = item.requeue_rate_limited().unwrap_err();
                assert_eq!((q.snapshot().in_flight, q.len()), (0, 1));
                assert_eq!(q.num_requeues(&1), 0, "a refused requeue counted a failure");
                format!("Err({err:?}), ready now")
            }),
        ),
        // After shutdown.
        row(
            "add / add_after / add_to_lane / add_with",
            "after shutdown",
            "Err(ShuttingDown) x5",
            Paused(|| {
                async {
                    let q = shut();
                    let all = [
                        q.add(1),
                        q.add_after(1, Duration::ZERO),
                        q.add_after(1, SEC),
                        q.add_to_lane(1, Lane::Slow),
                        q.add_with(1, AddOpts::default().priority(3).after(SEC)),
                    ];
                    if all.iter().all(|r| *r == Err(AddError::ShuttingDown)) {
                        "Err(ShuttingDown) x5".into()
                    } else {
                        format!("{all:?}")
                    }
                }
                .boxed()
            }),
        ),
        row(
            "add_rate_limited",
            "after shutdown",
            "Err(ShuttingDown), no failure counted",
            Paused(|| {
                async {
                    let q = shut();
                    let r = q.add_rate_limited(1);
                    format!("{r:?}, {} failure counted", q.num_requeues(&1)).replace(
                        "Err(ShuttingDown), 0 failure counted",
                        "Err(ShuttingDown), no failure counted",
                    )
                }
                .boxed()
            }),
        ),
        row(
            "add_rate_limited",
            "after shutdown, no runtime",
            "Err(ShuttingDown)",
            Plain(|| format!("{:?}", shut().add_rate_limited(1))),
        ),
        row(
            "requeue / requeue_after / requeue_rate_limited",
            "after shutdown",
            "Err(ShuttingDown) x3, leases ended",
            Paused(|| {
                async {
                    let q = q();
                    for k in 0..3 {
                        q.add(k).unwrap();
                    }
                    let items = [
                        q.get().await.unwrap(),
                        q.get().await.unwrap(),
                        q.get().await.unwrap(),
                    ];
                    q.shutdown();
                    let [a, b, c] = items;
                    let all = [a.requeue(), b.requeue_after(SEC), c.requeue_rate_limited()];
                    assert_eq!(q.snapshot().in_flight, 0);
                    assert_eq!(q.num_requeues(&2), 0);
                    if all.iter().all(|r| *r == Err(AddError::ShuttingDown)) {
                        "Err(ShuttingDown) x3, leases ended".into()
                    } else {
                        format!("{all:?}")
                    }
                }
                .boxed()
            }),
        ),
        row(
            "get",
            "after shutdown, empty",
            "None",
            Paused(|| async { hand_out_after(&shut(), SEC).await }.boxed()),
        ),
        row(
            "get",
            "after shutdown, a key ready",
            "the key, then None",
            Paused(|| {
                async {
                    let q = q();
                    q.add(4).unwrap();
                    q.shutdown();
                    let first = hand_out_after(&q, SEC).await;
                    let second = hand_out_after(&q, SEC).await;
                    format!("{first}, then {second}").replace("4 after 0ns", "the key")
                }
                .boxed()
            }),
        ),
        row(
            "Stream::next",
            "after shutdown",
            "None",
            Paused(|| {
                async {
                    let mut s = shut();
                    format!("{:?}", s.next().await.map(|i| *i))
                }
                .boxed()
            }),
        ),
        row(
            "shutdown / shutdown_with_drain",
            "twice, on an unused queue",
            "both resolve",
            Paused(|| {
                async {
                    let q = q();
                    q.shutdown();
                    q.shutdown();
                    q.shutdown_with_drain().await;
                    q.shutdown_with_drain().await;
                    assert!(q.is_shutting_down());
                    "both resolve".into()
                }
                .boxed()
            }),
        ),
        // The builder.
        row(
            "Builder::starvation_bound",
            "Duration::ZERO",
            "strict ready-time FIFO",
            Paused(|| {
                async {
                    let q: WorkQueue<u32> = WorkQueue::builder()
                        .starvation_bound(Duration::ZERO)
                        .build();
                    q.add_with(1, AddOpts::default().priority(-5)).unwrap();
                    q.add_with(2, AddOpts::default().priority(5)).unwrap();
                    let order = [*q.get().await.unwrap(), *q.get().await.unwrap()];
                    if order == [1, 2] {
                        "strict ready-time FIFO".into()
                    } else {
                        format!("{order:?}")
                    }
                }
                .boxed()
            }),
        ),
        row(
            "Builder::starvation_bound",
            "Duration::MAX",
            "strict priority",
            Paused(|| {
                async {
                    let q: WorkQueue<u32> =
                        WorkQueue::builder().starvation_bound(Duration::MAX).build();
                    q.add_with(1, AddOpts::default().priority(-5)).unwrap();
                    tokio::time::advance(Duration::from_secs(1_000_000)).await;
                    q.add_with(2, AddOpts::default().priority(5)).unwrap();
                    let order = [*q.get().await.unwrap(), *q.get().await.unwrap()];
                    if order == [2, 1] {
                        "strict priority".into()
                    } else {
                        format!("{order:?}")
                    }
                }
                .boxed()
            }),
        ),
        row(
            "Builder::throttle",
            "TokenBucket at 1e-9/s, burst 1",
            "first now, second waits",
            Paused(|| {
                async {
                    let q: WorkQueue<u32> = WorkQueue::builder()
                        .throttle(TokenBucket::new(1e-9, 1).unwrap())
                        .build();
                    q.add(1).unwrap();
                    q.add(2).unwrap();
                    let first = hand_out_after(&q, SEC).await;
                    let second = hand_out_after(&q, Duration::from_secs(3600)).await;
                    format!("{first}, {second}")
                        .replace("1 after 0ns, never", "first now, second waits")
                }
                .boxed()
            }),
        ),
        row(
            "Builder::name",
            "empty and very long",
            "Ok",
            Plain(|| {
                let long = "x".repeat(1 << 16);
                let a: WorkQueue<u32> = WorkQueue::builder().name("").build();
                let b: WorkQueue<u32> = WorkQueue::builder().name(long.clone()).build();
                assert_eq!((a.name(), b.name()), ("", long.as_str()));
                "Ok".into()
            }),
        ),
        // Limiters.
        row(
            "ExponentialBackoff::new",
            "base 0",
            "Err(ExponentialBackoff.base)",
            Plain(|| invalid(ExponentialBackoff::<u32>::new(Duration::ZERO, SEC))),
        ),
        row(
            "ExponentialBackoff::new",
            "max < base",
            "Err(ExponentialBackoff.max)",
            Plain(|| invalid(ExponentialBackoff::<u32>::new(2 * SEC, SEC))),
        ),
        row(
            "ExponentialBackoff::when",
            "1 ns .. MAX, 200 failures",
            "saturates at MAX",
            Plain(|| {
                let l = ExponentialBackoff::new(Duration::from_nanos(1), Duration::MAX).unwrap();
                let last = nth_call(200, || l.when(&1u32));
                assert_eq!(l.num_requeues(&1), 200);
                if last == Duration::MAX {
                    "saturates at MAX".into()
                } else {
                    format!("{last:?}")
                }
            }),
        ),
        row(
            "FastSlow::new",
            "fast 0, slow 0, 0 fast attempts",
            "Ok, delay 0",
            Plain(|| {
                let l = FastSlow::new(Duration::ZERO, Duration::ZERO, 0).unwrap();
                format!("Ok, delay {:?}", l.when(&1u32)).replace("0ns", "0")
            }),
        ),
        row(
            "FastSlow::new",
            "slow < fast",
            "Err(FastSlow.slow)",
            Plain(|| invalid(FastSlow::<u32>::new(SEC, Duration::ZERO, 1))),
        ),
        row(
            "FastSlow::new",
            "MAX, MAX, u32::MAX attempts",
            "Ok",
            Plain(|| invalid(FastSlow::<u32>::new(Duration::MAX, Duration::MAX, u32::MAX))),
        ),
        row(
            "TokenBucket::new",
            "rate 0",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(0.0, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate -0.0",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(-0.0, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate -1",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(-1.0, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate NaN",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(f64::NAN, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate +inf",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(f64::INFINITY, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate -inf",
            "Err(TokenBucket.rate_per_sec)",
            Plain(|| invalid(TokenBucket::new(f64::NEG_INFINITY, 1))),
        ),
        row(
            "TokenBucket::new",
            "burst 0",
            "Err(TokenBucket.burst)",
            Plain(|| invalid(TokenBucket::new(1.0, 0))),
        ),
        row(
            "TokenBucket::new",
            "rate f64::MIN_POSITIVE",
            "Ok",
            Plain(|| invalid(TokenBucket::new(f64::MIN_POSITIVE, 1))),
        ),
        row(
            "TokenBucket::new",
            "rate f64::MAX, burst u32::MAX",
            "Ok, 1000 tokens at once",
            Plain(|| {
                let b = TokenBucket::new(f64::MAX, u32::MAX).unwrap();
                let ok = (0..1000).all(|_| b.try_acquire().is_ok());
                if ok {
                    "Ok, 1000 tokens at once".into()
                } else {
                    "ran dry".into()
                }
            }),
        ),
        row(
            "TokenBucket::acquire",
            "rate 1e-300 (paused time)",
            "first now, second waits",
            Paused(|| {
                async {
                    let b = TokenBucket::new(1e-300, 1).unwrap();
                    let first = tokio::time::timeout(SEC, b.acquire()).await.is_ok();
                    let second = tokio::time::timeout(Duration::from_secs(3600), b.acquire())
                        .await
                        .is_ok();
                    let wait = b.try_acquire().unwrap_err();
                    assert!(wait > Duration::from_secs(3600));
                    match (first, second) {
                        (true, false) => "first now, second waits".into(),
                        other => format!("{other:?}"),
                    }
                }
                .boxed()
            }),
        ),
        row(
            "TokenBucket::when",
            "rate 1e-300, 100 failures",
            "over a year, no panic",
            Plain(|| {
                let b = TokenBucket::new(1e-300, 1).unwrap();
                let last = nth_call(100, || RateLimiter::<u32>::when(&b, &1));
                if last > Duration::from_secs(365 * 24 * 3600) {
                    "over a year, no panic".into()
                } else {
                    format!("{last:?}")
                }
            }),
        ),
        row(
            "add_rate_limited",
            "TokenBucket at 1e-300/s",
            "clamped to MAX_DELAY",
            Paused(|| {
                async {
                    let q: WorkQueue<u32> = WorkQueue::builder()
                        .rate_limiter(TokenBucket::new(1e-300, 1).unwrap())
                        .build();
                    q.add_rate_limited(1).unwrap(); // the burst token: now
                    q.add_rate_limited(2).unwrap(); // eons away: clamped
                    let first = hand_out_after(&q, SEC).await;
                    let second = hand_out_after(&q, Duration::MAX).await;
                    if first == "1 after 0ns" && second == format!("2 after {MAX_DELAY:?}") {
                        "clamped to MAX_DELAY".into()
                    } else {
                        format!("{first}, {second}")
                    }
                }
                .boxed()
            }),
        ),
        row(
            "MaxOf::new",
            "no limiters",
            "delay 0",
            Plain(|| {
                let l = MaxOf::<u32>::new(Vec::new());
                assert!(l.is_empty());
                format!("delay {:?}", l.when(&1)).replace("0ns", "0")
            }),
        ),
        row(
            "WithMaxWait::new",
            "max wait 0",
            "delay 0",
            Plain(|| {
                let l =
                    WithMaxWait::new(ExponentialBackoff::new(SEC, SEC).unwrap(), Duration::ZERO);
                format!("delay {:?}", l.when(&1u32)).replace("0ns", "0")
            }),
        ),
        row(
            "WithMaxWait::new",
            "max wait MAX",
            "the inner delay",
            Plain(|| {
                let l = WithMaxWait::new(ExponentialBackoff::new(SEC, SEC).unwrap(), Duration::MAX);
                if l.when(&1u32) == SEC {
                    "the inner delay".into()
                } else {
                    "other".into()
                }
            }),
        ),
        row(
            "default_controller_rate_limiter",
            "10 000 failures of one key",
            "capped at 1000 s",
            Plain(|| {
                let l = default_controller_rate_limiter::<u32>();
                let last = nth_call(10_000, || l.when(&1));
                // The shared bucket's debt can exceed the per-key cap: the
                // larger of the two wins, and stays finite.
                if last >= 1000 * SEC && last < Duration::from_secs(1 << 40) {
                    "capped at 1000 s".into()
                } else {
                    format!("{last:?}")
                }
            }),
        ),
        // Partitions.
        row(
            "Partitioned::new",
            "n = 0",
            "Err(ZeroPartitions)",
            Plain(|| {
                format!(
                    "{:?}",
                    Partitioned::new(0, |k: &u32| *k as usize).map(|_| ())
                )
            }),
        ),
        row(
            "Partitioned::new",
            "partition fn returns usize::MAX, n = 7",
            "partition usize::MAX % 7",
            Plain(|| {
                let p = Partitioned::new(7, |_: &u32| usize::MAX).unwrap();
                p.add(1).unwrap();
                let i = p.partition_of(&1);
                if i == usize::MAX % 7 && p.depths()[i] == 1 {
                    "partition usize::MAX % 7".into()
                } else {
                    format!("partition {i}, depths {:?}", p.depths())
                }
            }),
        ),
        row(
            "Partitioned::add",
            "partition fn panics",
            "Ok(()), partition 0, 1 panic counted",
            Plain(|| {
                let p = Partitioned::builder(3, |_: &u32| -> usize { panic!("no node") })
                    .on_panic(|_| {})
                    .build()
                    .unwrap();
                let added = p.add(1);
                format!(
                    "{added:?}, partition {}, {} panic counted",
                    p.depths()
                        .iter()
                        .position(|&d| d == 1)
                        .unwrap_or(usize::MAX),
                    p.partition_fn_panics()
                )
            }),
        ),
        row(
            "Partitioned::add_after",
            "after shutdown",
            "Err(ShuttingDown)",
            Plain(|| {
                let p = Partitioned::new(2, |k: &u32| *k as usize).unwrap();
                p.shutdown();
                format!("{:?}", p.add_after(1, SEC))
            }),
        ),
        row(
            "Lane::from_priority",
            "i32::MIN / i32::MAX",
            "Slow / Fast",
            Plain(|| {
                format!(
                    "{:?} / {:?}",
                    Lane::from_priority(i32::MIN),
                    Lane::from_priority(i32::MAX)
                )
            }),
        ),
    ]
}

#[test]
fn every_entry_point_with_its_edge_values() {
    let mut failed = Vec::new();
    let mut table = String::new();
    for r in rows() {
        let got = match r.run {
            Run::Plain(f) => f(),
            Run::Paused(f) => tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
                .block_on(f()),
        };
        let mark = if got == r.expect { "ok" } else { "FAIL" };
        table.push_str(&format!(
            "{mark:4} | {:48} | {:44} | {got}\n",
            r.call, r.edge
        ));
        if got != r.expect {
            failed.push(format!(
                "{} with {}: expected {:?}, got {got:?}",
                r.call, r.edge, r.expect
            ));
        }
    }
    println!("{table}");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
