//! loom models of the queue's concurrency claims: every interleaving of two or
//! three threads adding, taking, ending leases and shutting down.
//!
//! Run with (a separate target directory keeps the normal build intact):
//!
//! ```text
//! RUSTFLAGS="--cfg tokio_workqueue_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_queue
//! ```
//!
//! Under that cfg the crate's mutex and `Notify` are loom's (see
//! `src/sync.rs`), and loom reports a deadlock for any `get` or drain that
//! would wait for ever: a lost wake-up fails the model.
//!
//! What is not here: timers and the clock. tokio's timer wheel, tokio-util's
//! `DelayQueue` and tokio's clock are not loom-aware, so these models use only
//! immediate adds and requeues. Delayed adds, `requeue_after`, rate-limited
//! adds, the starvation bound and the throttle are covered by the property
//! tests (`tests/model.rs`, on paused tokio time), the multi-threaded stress
//! test (`tests/stress.rs`) and the soak example (`examples/soak.rs`).
//!
//! The models that hand keys out run again with each built-in ordering
//! plugged in (`*_with_each_ordering`): the queue's guarantees must not
//! depend on it.
//!
//! The preemption bound defaults to 3, and to 2 for the one model of five
//! threads (override either with `LOOM_MAX_PREEMPTIONS`).
#![cfg(tokio_workqueue_loom)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll, Waker};

use loom::thread;
use tokio_workqueue::ordering::{Ordering, TwoLanes};
use tokio_workqueue::{AddError, AddOpts, FairShare, Fifo, WorkQueue};

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_with_preemptions(3, f);
}

/// [`model`] with another default preemption bound.
fn model_with_preemptions(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

fn queue() -> WorkQueue<u32> {
    WorkQueue::new()
}

fn fifo() -> WorkQueue<u32, Fifo> {
    WorkQueue::builder().ordering(Fifo::new()).build()
}

fn two_lanes() -> WorkQueue<u32, TwoLanes> {
    WorkQueue::builder().ordering(TwoLanes::new()).build()
}

fn fair_share() -> WorkQueue<u32, FairShare<u32, u32>> {
    WorkQueue::builder()
        .ordering(FairShare::new(|k: &u32| k % 2))
        .build()
}

/// Runs a model's body with each built-in ordering besides the default:
/// hand-outs go through the ordering, so its guarantees are checked again.
macro_rules! each_ordering {
    ($body:ident) => {{
        $body(fifo);
        $body(two_lanes);
        $body(fair_share);
    }};
}

/// Polls `fut` once with a waker that does nothing, as a `select!` that
/// abandons the branch would.
fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// A consumer parks in `get` while a producer adds: the consumer gets the key
/// whatever the interleaving (no lost wake-up).
#[test]
fn add_vs_get_no_lost_wake_up() {
    add_vs_get(queue);
}

#[test]
fn add_vs_get_no_lost_wake_up_with_each_ordering() {
    each_ordering!(add_vs_get);
}

fn add_vs_get<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        let consumer = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get()).map(|i| *i))
        };
        q.add(1).unwrap();
        assert_eq!(consumer.join().unwrap(), Some(1));
        assert!(q.is_empty());
    });
}

/// Two consumers, two keys, added by a third thread: each consumer gets one
/// key, the two keys are different, and neither consumer hangs.
#[test]
fn two_consumers_two_keys() {
    two_consumers(queue);
}

#[test]
fn two_consumers_two_keys_with_each_ordering() {
    each_ordering!(two_consumers);
}

fn two_consumers<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    two_consumers_of(queue, |_| (1, 2));
}

/// Two consumers get one each of the two keys `keys` picks for the queue,
/// added by a third thread.
fn two_consumers_of<O: Ordering<u32>>(
    queue: fn() -> WorkQueue<u32, O>,
    keys: fn(&WorkQueue<u32, O>) -> (u32, u32),
) {
    model(move || {
        let q = queue();
        let (a, b) = keys(&q);
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let item = loom::future::block_on(q.get()).unwrap();
                    *item
                })
            })
            .collect();
        let producer = {
            let q = q.clone();
            thread::spawn(move || {
                q.add(a).unwrap();
                q.add(b).unwrap();
            })
        };
        producer.join().unwrap();
        let mut got: Vec<u32> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, [a, b]);
    });
}

/// A key re-added while leased (by another thread, racing the lease end)
/// comes back exactly once, and never while the first lease is held.
#[test]
fn add_during_lease_comes_back_exactly_once() {
    add_during_lease(queue);
}

#[test]
fn add_during_lease_comes_back_exactly_once_with_each_ordering() {
    each_ordering!(add_during_lease);
}

fn add_during_lease<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        q.add(7).unwrap();
        let item = loom::future::block_on(q.get()).unwrap();
        let holders = StdArc::new(AtomicUsize::new(1));
        let ender = {
            let holders = holders.clone();
            thread::spawn(move || {
                holders.fetch_sub(1, SeqCst);
                item.done();
            })
        };
        let adder = {
            let q = q.clone();
            thread::spawn(move || q.add(7).unwrap())
        };
        // The second lease: whenever it is granted, the first has ended.
        let again = loom::future::block_on(q.get()).unwrap();
        assert_eq!(holders.fetch_add(1, SeqCst), 0, "two leases at once");
        assert_eq!(*again, 7);
        ender.join().unwrap();
        adder.join().unwrap();
        holders.fetch_sub(1, SeqCst);
        drop(again);
        assert_eq!(q.len(), 0, "handed out once for one add");
        q.shutdown();
        assert!(loom::future::block_on(q.get()).is_none());
    });
}

/// A requeue racing a plain add of the same key: one entry, not two.
#[test]
fn requeue_and_add_race_to_one_entry() {
    requeue_and_add(queue);
}

#[test]
fn requeue_and_add_race_to_one_entry_with_each_ordering() {
    each_ordering!(requeue_and_add);
}

fn requeue_and_add<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        q.add(3).unwrap();
        let item = loom::future::block_on(q.get()).unwrap();
        let requeuer = thread::spawn(move || item.requeue().unwrap());
        let adder = {
            let q = q.clone();
            thread::spawn(move || q.add(3).unwrap())
        };
        requeuer.join().unwrap();
        adder.join().unwrap();
        assert_eq!(q.len(), 1);
        let item = loom::future::block_on(q.get()).unwrap();
        assert_eq!(*item, 3);
        drop(item);
        assert!(q.is_empty());
    });
}

/// A consumer parked on an empty queue while another thread shuts it down:
/// `get` returns `None`, it does not hang.
#[test]
fn shutdown_wakes_a_parked_get() {
    model(|| {
        let q = queue();
        let consumer = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get()).is_none())
        };
        q.shutdown();
        assert!(consumer.join().unwrap());
        assert_eq!(q.add(1), Err(AddError::ShuttingDown));
    });
}

/// Shutdown racing an add and a parked consumer: the consumer gets the key
/// if the add was accepted, `None` otherwise; nothing hangs.
#[test]
fn shutdown_add_and_get_race() {
    shutdown_add_and_get(queue);
}

#[test]
fn shutdown_add_and_get_race_with_each_ordering() {
    each_ordering!(shutdown_add_and_get);
}

fn shutdown_add_and_get<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        let consumer = {
            let q = q.clone();
            thread::spawn(move || loom::future::block_on(q.get()).map(|i| *i))
        };
        let adder = {
            let q = q.clone();
            thread::spawn(move || q.add(1).is_ok())
        };
        q.shutdown();
        let accepted = adder.join().unwrap();
        let got = consumer.join().unwrap();
        assert_eq!(got.is_some(), accepted, "accepted key handed out, or none");
    });
}

/// `shutdown_with_drain` racing the end of the last lease: it resolves (no
/// hang), and only once the lease has ended.
#[test]
fn drain_vs_last_lease_end() {
    model(|| {
        let q = queue();
        q.add(1).unwrap();
        let item = loom::future::block_on(q.get()).unwrap();
        let ended = StdArc::new(AtomicUsize::new(0));
        let drainer = {
            let q = q.clone();
            let ended = ended.clone();
            thread::spawn(move || {
                loom::future::block_on(q.shutdown_with_drain());
                assert_eq!(ended.load(SeqCst), 1, "drained while a lease was held");
            })
        };
        ended.store(1, SeqCst);
        drop(item);
        drainer.join().unwrap();
    });
}

/// Draining waits for a ready key to be taken and its lease to end; a
/// consumer thread does both while the drain and a dirty re-add race.
#[test]
fn drain_waits_for_ready_and_dirty_keys() {
    drain_waits(queue);
}

#[test]
fn drain_waits_for_ready_and_dirty_keys_with_each_ordering() {
    each_ordering!(drain_waits);
}

fn drain_waits<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        q.add(1).unwrap();
        let item = loom::future::block_on(q.get()).unwrap();
        q.add(1).unwrap(); // dirty: owed after the lease, even past shutdown
        let handled = StdArc::new(AtomicUsize::new(0));
        let consumer = {
            let q = q.clone();
            let handled = handled.clone();
            thread::spawn(move || {
                drop(item);
                while let Some(again) = loom::future::block_on(q.get()) {
                    assert_eq!(*again, 1);
                    handled.fetch_add(1, SeqCst);
                }
            })
        };
        loom::future::block_on(q.shutdown_with_drain());
        assert_eq!(
            handled.load(SeqCst),
            1,
            "drain resolved before the re-add ran"
        );
        consumer.join().unwrap();
    });
}

/// Two consumers park; a key is added; one consumer abandons its `get` (a
/// `select!` that took another branch) without polling it again. The key is
/// not lost and the wake-up the abandoned `get` may have taken passes to the
/// other consumer, which gets the key instead of hanging.
#[test]
fn a_dropped_get_passes_its_wake_up_on() {
    dropped_get(queue);
}

#[test]
fn a_dropped_get_passes_its_wake_up_on_with_each_ordering() {
    each_ordering!(dropped_get);
}

fn dropped_get<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    model(move || {
        let q = queue();
        let quitter = {
            let q = q.clone();
            thread::spawn(move || {
                if let Some(item) = poll_once(q.get()) {
                    // It took the key before parking: it handles it, and
                    // adds another so the waiter still has one to get.
                    assert_eq!(*item.unwrap(), 1);
                    q.add(2).unwrap();
                }
            })
        };
        let waiter = {
            let q = q.clone();
            thread::spawn(move || *loom::future::block_on(q.get()).unwrap())
        };
        q.add(1).unwrap();
        quitter.join().unwrap();
        let got = waiter.join().unwrap();
        assert!(got == 1 || got == 2);
        assert!(q.is_empty());
    });
}

/// A stream consumer behaves as `get` does: it gets a key added by another
/// thread and ends once the queue is shut down.
#[test]
fn stream_consumer_gets_the_key_then_ends() {
    stream_consumer(queue);
}

#[test]
fn stream_consumer_gets_the_key_then_ends_with_each_ordering() {
    each_ordering!(stream_consumer);
}

fn stream_consumer<O: Ordering<u32>>(queue: fn() -> WorkQueue<u32, O>) {
    use futures::StreamExt;
    model(move || {
        let q = queue();
        let consumer = {
            let mut stream = q.clone();
            thread::spawn(move || {
                loom::future::block_on(async {
                    let mut seen = Vec::new();
                    while let Some(item) = stream.next().await {
                        seen.push(*item);
                    }
                    seen
                })
            })
        };
        q.add(5).unwrap();
        q.shutdown();
        let seen = consumer.join().unwrap();
        assert_eq!(seen, [5]);
    });
}

/// `closed()` racing `shutdown()` from another thread: it resolves (no hang),
/// and only after the shutdown, so a feeder that stops on it never sees an
/// add refused before it was told.
#[test]
fn closed_resolves_after_a_racing_shutdown() {
    model(|| {
        let q = queue();
        let feeder = {
            let q = q.clone();
            thread::spawn(move || {
                loom::future::block_on(q.closed());
                assert!(q.is_shutting_down());
                assert_eq!(q.add(1), Err(AddError::ShuttingDown));
            })
        };
        q.shutdown();
        feeder.join().unwrap();
    });
}

/// Parked consumers are counted so that adds wake only as many as there
/// are: a `get` and a stream dropped while parked, and a consumer woken
/// (which is uncounted by its next look), each uncount themselves exactly
/// once. Two consumers parked afterwards both get a key from two adds: a
/// count left too low would leave one of them asleep.
#[test]
fn dropped_and_woken_waits_uncount_themselves_once() {
    use futures::StreamExt;
    model(|| {
        let q = queue();
        assert!(poll_once(q.get()).is_none());
        let mut stream = q.clone();
        assert!(poll_once(stream.next()).is_none());
        drop(stream);
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || loom::future::block_on(q.get()).map(|i| *i))
            })
            .collect();
        q.add(1).unwrap();
        q.add(2).unwrap();
        let mut got: Vec<_> = consumers
            .into_iter()
            .map(|c| c.join().unwrap().unwrap())
            .collect();
        got.sort();
        assert_eq!(got, [1, 2]);
    });
}

/// A thread that takes two keys, in the order it gets them.
fn take_two(q: &WorkQueue<u32>) -> thread::JoinHandle<(u32, u32)> {
    let q = q.clone();
    thread::spawn(move || {
        loom::future::block_on(async {
            let first = *q.get().await.unwrap();
            let second = *q.get().await.unwrap();
            (first, second)
        })
    })
}

/// Two keys in different shards, added in order by one thread while another
/// takes them: the consumer gets them in the order they were added, whatever
/// the interleaving (both tickets are in one lane, in the order pushed),
/// and neither misses a wake-up (each shard's add wakes the sleeping consumer
/// through the sleeper count, not a lock they share).
#[test]
fn keys_in_two_shards_come_out_in_the_order_added() {
    model(move || {
        let q = queue();
        let a = 1;
        let b = (2..).find(|k| q.shard_of(k) != q.shard_of(&a)).unwrap();
        let consumer = take_two(&q);
        q.add(a).unwrap();
        q.add(b).unwrap();
        assert_eq!(consumer.join().unwrap(), (a, b));
    });
}

/// Two consumers, two keys in one shard, added by a third thread: the
/// second add pushes behind the first key's ticket, and must still wake
/// the second sleeping consumer. Each consumer gets one key; neither hangs.
#[test]
fn two_consumers_two_keys_in_one_shard() {
    two_consumers_of(queue, |q| {
        let b = (2..).find(|k| q.shard_of(k) == q.shard_of(&1)).unwrap();
        (1, b)
    });
}

/// Two producers add one key each to one shard while two consumers sleep:
/// the add that comes second, whichever it is, must still see the consumer
/// it has to wake (each publishes its ticket with a SeqCst store, see
/// `BackGuard::push`). Each consumer gets one key; neither hangs.
///
/// Five threads: explored with two preemptions unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise. With three, since the lanes
/// added the lanes' locks to every add and hand-out, it ran for more than
/// 40 minutes on a 2-core machine (the whole suite took 20 before), longer
/// than CI can give it.
#[test]
fn two_producers_of_one_shard_wake_two_consumers() {
    model_with_preemptions(2, move || {
        let q = queue();
        let b = (2..).find(|k| q.shard_of(k) == q.shard_of(&1)).unwrap();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || *loom::future::block_on(q.get()).unwrap())
            })
            .collect();
        let second = {
            let q = q.clone();
            thread::spawn(move || q.add(b).unwrap())
        };
        q.add(1).unwrap();
        second.join().unwrap();
        let mut got: Vec<u32> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, [1, b]);
    });
}

/// One thread adds a key at a high priority, then one at a low priority in
/// another shard (so another lane and another shard's lock), while another
/// thread takes keys: the high key goes out first whatever the interleaving
/// (a consumer that chose the low lane looks at the higher lanes again
/// before it pops, and the high ticket was pushed before the low one).
#[test]
fn a_higher_key_added_first_goes_out_first_across_lanes() {
    model(move || {
        let q = queue();
        let high = 1;
        let low = (2..).find(|k| q.shard_of(k) != q.shard_of(&high)).unwrap();
        let consumer = take_two(&q);
        q.add_with(high, AddOpts::new().priority(10)).unwrap();
        q.add_with(low, AddOpts::new().priority(0)).unwrap();
        assert_eq!(consumer.join().unwrap(), (high, low));
    });
}

/// A ready key raised to a higher lane while a consumer takes keys: a key
/// already at the higher priority, added before the raise, still goes out
/// before it, and the raised key goes out once (the ticket it left in its
/// old lane is skipped), or, raised during its lease, once more after it.
#[test]
fn a_raised_key_goes_out_once_behind_its_new_level() {
    model(move || {
        let q = queue();
        let raised = 1;
        let other = (2..)
            .find(|k| q.shard_of(k) != q.shard_of(&raised))
            .unwrap();
        q.add_with(raised, AddOpts::new().priority(0)).unwrap();
        q.add_with(other, AddOpts::new().priority(5)).unwrap();
        let consumer = take_two(&q);
        q.add_with(raised, AddOpts::new().priority(5)).unwrap();
        assert_eq!(consumer.join().unwrap(), (other, raised));
        // A raise that came while the key was leased comes back once, at
        // its priority; one that came while it was ready left a stale
        // ticket, which gives nothing.
        if let Some(again) = poll_once(q.get()) {
            let again = again.unwrap();
            assert_eq!((*again, again.priority()), (raised, 5));
        }
        assert_eq!(q.len(), 0);
    });
}
