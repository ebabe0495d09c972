//! Delayed adds on a tokio runtime built without `enable_time`: every entry
//! point that needs a timer refuses with `AddError::NoRuntime` instead of
//! saying `Ok` and leaving the key waiting forever (the queue's timer task
//! used to panic with "timers are disabled"), and a refused requeue keeps
//! its key.

use std::time::Duration;

use tokio_workqueue::{AddError, AddOpts, Partitioned, WorkQueue};

/// A runtime with no time driver, as `Builder::new_current_thread()` gives
/// unless `enable_time` (or `enable_all`) is called.
fn timeless() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

const DELAY: Duration = Duration::from_millis(1);

#[test]
fn add_after_is_refused() {
    timeless().block_on(async {
        let q = WorkQueue::new();
        assert_eq!(q.add_after("a", DELAY), Err(AddError::NoRuntime));
        assert_eq!(q.snapshot().waiting, 0, "nothing was left waiting");
        // Undelayed adds need no timer and still work.
        q.add_after("b", Duration::ZERO).unwrap();
        assert_eq!(q.len(), 1);
    });
}

#[test]
fn add_rate_limited_is_refused_and_counts_no_failure() {
    timeless().block_on(async {
        let q = WorkQueue::new();
        assert_eq!(q.add_rate_limited("a"), Err(AddError::NoRuntime));
        assert_eq!(q.num_requeues(&"a"), 0);
        assert_eq!(q.snapshot().waiting + q.len(), 0);
    });
}

#[test]
fn add_with_a_delay_or_a_rate_limit_is_refused() {
    timeless().block_on(async {
        let q = WorkQueue::new();
        assert_eq!(
            q.add_with("a", AddOpts::new().after(DELAY).priority(3)),
            Err(AddError::NoRuntime)
        );
        assert_eq!(
            q.add_with("b", AddOpts::new().rate_limited()),
            Err(AddError::NoRuntime)
        );
        assert_eq!(q.num_requeues(&"b"), 0);
        q.add_with("c", AddOpts::new().priority(3)).unwrap();
        assert_eq!(q.len(), 1);
    });
}

#[test]
fn requeue_after_is_refused_and_the_key_is_ready_now() {
    timeless().block_on(async {
        let q = WorkQueue::new();
        q.add_with("a", AddOpts::new().priority(7)).unwrap();
        let item = q.get().await.unwrap();
        assert_eq!(item.requeue_after(DELAY), Err(AddError::NoRuntime));
        // Not lost: back now, at the priority it was handed out with.
        let again = q.get().await.unwrap();
        assert_eq!((*again.key(), again.priority()), ("a", 7));
    });
}

#[test]
fn requeue_rate_limited_is_refused_and_the_key_is_ready_now() {
    timeless().block_on(async {
        let q = WorkQueue::new();
        q.add("a").unwrap();
        let item = q.get().await.unwrap();
        assert_eq!(item.requeue_rate_limited(), Err(AddError::NoRuntime));
        assert_eq!(q.num_requeues(&"a"), 0, "no failure counted");
        assert_eq!(*q.get().await.unwrap(), "a");
    });
}

#[test]
fn partitioned_delayed_adds_are_refused() {
    timeless().block_on(async {
        let q = Partitioned::new(2, |k: &u32| *k as usize).unwrap();
        assert_eq!(q.add_after(1, DELAY), Err(AddError::NoRuntime));
        assert_eq!(q.add_rate_limited(2), Err(AddError::NoRuntime));
        assert_eq!(
            q.add_with(3, AddOpts::new().after(DELAY)),
            Err(AddError::NoRuntime)
        );
        assert_eq!(q.len(), 0);
    });
}

/// The timer task, once started on a runtime with time, keeps serving the
/// queue; the check only runs when a task must be started.
#[test]
fn a_runtime_with_time_still_works_after_a_refusal() {
    let q = WorkQueue::new();
    timeless().block_on(async {
        assert_eq!(q.add_after("a", DELAY), Err(AddError::NoRuntime));
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        q.add_after("a", DELAY).unwrap();
        tokio::time::sleep(DELAY * 2).await;
        assert_eq!(*q.get().await.unwrap(), "a");
    });
}

/// A plain thread has no runtime: entering one's handle makes delayed adds
/// work there, as `AddError::NoRuntime`'s docs say.
#[test]
fn a_plain_thread_adds_delayed_keys_after_entering_a_handle() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    let q = WorkQueue::new();
    let handle = rt.handle().clone();
    let producer = q.clone();
    std::thread::spawn(move || {
        assert_eq!(producer.add_after("a", DELAY), Err(AddError::NoRuntime));
        let _guard = handle.enter();
        producer.add_after("a", DELAY).unwrap();
    })
    .join()
    .unwrap();
    rt.block_on(async {
        assert_eq!(*q.get().await.unwrap(), "a");
    });
}
