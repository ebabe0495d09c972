//! How long a cache line takes to go from one core to another and back,
//! measured right before a run, so a table says what the machine was like
//! when each subject ran.
//!
//! On the 2-vCPU VMs these benchmarks run on, the answer is not a constant
//! of the machine: the hypervisor moves the vCPUs between physical cores,
//! and a round trip was seen to go from about 90 ns to about 420 ns and
//! back within seconds (same VM, same minute). A queue whose items cross
//! between cores a few times each (every queue shared by producers and
//! consumers on two threads does) slows down with it several times over,
//! one that keeps most of its work on one core barely. A ratio between two
//! subjects means something only if both ran at about the same round trip;
//! the rows of this figure show whether they did.
//!
//! Two threads pass a counter back and forth on one cache line; with fewer
//! than two CPUs there is nothing to measure (each pass would be a context
//! switch) and the figure is left out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The figure beside each run: the round trip right before it.
pub const ROUND_TRIP: &str = "core round trip ns";

/// Runs `run` (one run of a subject, giving its figures) after measuring
/// the round trip, which joins its figures when there is one.
pub fn with_round_trip<E>(
    run: impl FnOnce() -> Result<Vec<(&'static str, f64)>, E>,
) -> Result<Vec<(&'static str, f64)>, E> {
    let round_trip = round_trip_ns();
    let mut figures = run()?;
    figures.extend(round_trip.map(|ns| (ROUND_TRIP, ns)));
    Ok(figures)
}

/// How far apart two round trips may be and still be one mode of the
/// machine: the fast and slow modes seen so far are 3-5x apart.
const ONE_MODE: f64 = 1.5;

/// Whether round trips `a` and `b` were measured in different modes.
pub fn modes_differ(a: f64, b: f64) -> bool {
    a.max(b) > ONE_MODE * a.min(b)
}

/// What a verdict on a ratio prints beside it: both sides' round trips,
/// and a warning when they ran in different modes.
pub fn beside(a: f64, b: f64) -> String {
    let warning = if modes_differ(a, b) {
        ": the sides ran in different modes"
    } else {
        ""
    };
    format!("; core round trip {a:.0} vs {b:.0} ns{warning}")
}

/// Round trips per measurement, in chunks of `CHUNK`, and the longest a
/// measurement may take (a loaded machine can deschedule the other thread).
const TRIPS: u64 = 20_000;
const CHUNK: u64 = 500;
const BOUND: Duration = Duration::from_millis(100);

/// A counter alone on its cache line.
#[repr(align(128))]
struct Line(AtomicU64);

/// Nanoseconds per core-to-core round trip, or `None` with fewer than two
/// CPUs or when the other thread did not answer within the bound.
pub fn round_trip_ns() -> Option<f64> {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    // Raised by the measuring side however it ends. A flag of its own, not
    // a value of `line`: the answering thread, descheduled between reading
    // a value and answering it for longer than `BOUND`, answers after the
    // other side has given up, and would overwrite such a value, then spin
    // forever while the other side waits to join it (the likeliest cause
    // of a 16-worker run's stall on two cores). On a line of its own, so
    // that looking at it does not move the counter's line.
    let done = Arc::new(Line(AtomicU64::new(0)));
    let other = {
        let (line, done) = (line.clone(), done.clone());
        std::thread::spawn(move || {
            // Answers each odd value with the next even one, until `done`.
            let mut expect = 1;
            loop {
                if done.0.load(Ordering::Acquire) != 0 {
                    return;
                }
                let v = line.0.load(Ordering::Acquire);
                if v == expect {
                    line.0.store(v + 1, Ordering::Release);
                    expect += 2;
                }
                std::hint::spin_loop();
            }
        })
    };
    // Timed in chunks, and the median chunk kept: a chunk in which either
    // thread was descheduled (another process, the last run's threads going
    // away) says nothing about the line's trip and is left out that way.
    let start = Instant::now();
    let mut chunks = Vec::with_capacity((TRIPS / CHUNK) as usize);
    let mut i = 0;
    'chunks: while i < TRIPS {
        let chunk = Instant::now();
        for _ in 0..CHUNK {
            line.0.store(2 * i + 1, Ordering::Release);
            let mut spins = 0u32;
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) && start.elapsed() > BOUND {
                    break 'chunks;
                }
                std::hint::spin_loop();
            }
            i += 1;
        }
        chunks.push(chunk.elapsed().as_nanos() as f64 / CHUNK as f64);
    }
    done.0.store(1, Ordering::Release);
    let _ = other.join();
    if i < TRIPS {
        return None;
    }
    chunks.sort_by(f64::total_cmp);
    Some(chunks[chunks.len() / 2])
}
