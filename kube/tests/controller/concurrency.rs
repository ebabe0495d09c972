//! How many reconciles run at once: `DEFAULT_CONCURRENCY` unless
//! `concurrency(n)` or kube-runtime's `Config` says otherwise, reached when
//! there are keys enough and never passed; with `partition_by`, one key at a
//! time per partition, in queue order, partitions side by side.

use std::sync::Arc;
use std::time::Duration;

use kube_runtime::controller::Config;
use tokio_workqueue_kube::{Action, Controller, DEFAULT_CONCURRENCY};

use crate::common::*;

/// Runs 50 keys of 10 ms each through `controller` and returns the most
/// that ran at once, checking that many started together at first.
async fn peak(
    controller: impl FnOnce(
        Controller<k8s_openapi::api::core::v1::ConfigMap>,
    ) -> Controller<k8s_openapi::api::core::v1::ConfigMap>,
) -> usize {
    let record = Record::new();
    let (feed, fed) = fed();
    let stream = controller(fed).run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 50));
    feed.close();
    let reports = run.finish().await;
    assert_eq!(reports.len(), 50);
    assert_eq!(record.len(), 50);
    let peak = record.max_concurrency();
    let at_once = record.runs().iter().filter(|r| r.start == ms(0)).count();
    assert_eq!(at_once, peak, "the first {peak} did not start together");
    peak
}

#[tokio::test(start_paused = true)]
async fn the_default_concurrency_is_reached_and_never_passed() {
    assert_eq!(DEFAULT_CONCURRENCY, 16);
    assert_eq!(peak(|c| c).await, DEFAULT_CONCURRENCY);
}

#[tokio::test(start_paused = true)]
async fn concurrency_sets_the_limit() {
    assert_eq!(peak(|c| c.concurrency(5)).await, 5);
    assert_eq!(peak(|c| c.concurrency(1)).await, 1);
    // Documented: 0 counts as 1.
    assert_eq!(peak(|c| c.concurrency(0)).await, 1);
    assert_eq!(peak(|c| c.concurrency(100)).await, 50);
}

#[tokio::test(start_paused = true)]
async fn kube_runtime_config_sets_the_concurrency() {
    assert_eq!(
        peak(|c| c.with_config(Config::default().concurrency(3))).await,
        3
    );
}

#[tokio::test(start_paused = true)]
async fn kube_runtime_config_with_concurrency_zero_keeps_the_default() {
    // Zero is kube-runtime's "unbounded"; here it keeps the finite default.
    assert_eq!(
        peak(|c| c.concurrency(4).with_config(Config::default())).await,
        4
    );
    assert_eq!(
        peak(|c| c.with_config(Config::default().concurrency(0))).await,
        DEFAULT_CONCURRENCY
    );
}

#[tokio::test(start_paused = true)]
async fn kube_runtime_config_debounce_delays_adds_and_the_first_time_wins() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller
        .with_config(Config::default().debounce(ms(100)))
        .run(
            record.reconciler(Duration::ZERO, |_, _| Ok(Action::await_change())),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(ms(1000)).await;
    feed.apply(cm("a", "2"));
    advance(ms(50)).await;
    feed.apply(cm("a", "3"));
    advance(ms(1000)).await;
    // The list 100 ms late; the two changes folded at the first one's time
    // (not kube-runtime's trailing debounce, which would wait for 1150 ms).
    assert_eq!(record.starts_of("a"), [ms(100), ms(1100)]);
    assert_eq!(record.runs_of("a")[1].rv.as_deref(), Some("3"));
}

#[tokio::test(start_paused = true)]
async fn partitions_reconcile_one_key_at_a_time_in_order_and_run_side_by_side() {
    let record = Record::new();
    let (feed, controller) = fed();
    let index = |name: &str| -> usize { name["obj-".len()..].parse().unwrap() };
    let stream = controller
        // Not used with partitions (documented).
        .concurrency(1)
        .partition_by(4, move |key| index(&key.name))
        .run(
            record.reconciler_with(
                move |name, _| ms(5 * (index(name) as u64 % 3 + 1)),
                |_, _| Ok(Action::await_change()),
            ),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 40));
    feed.close();
    let reports = run.finish().await;
    assert_eq!(reports.len(), 40);

    let runs = record.runs();
    assert_eq!(record.max_concurrency(), 4, "partitions side by side");
    assert_eq!(runs.iter().filter(|r| r.start == ms(0)).count(), 4);
    for partition in 0..4 {
        let mine: Vec<_> = runs
            .iter()
            .filter(|r| index(&r.name) % 4 == partition)
            .collect();
        let names: Vec<_> = mine.iter().map(|r| index(&r.name)).collect();
        let expected: Vec<_> = (0..40).filter(|i| i % 4 == partition).collect();
        assert_eq!(names, expected, "partition {partition} out of order");
        for pair in mine.windows(2) {
            assert_eq!(
                pair[0].end,
                Some(pair[1].start),
                "partition {partition}: one at a time, without gaps"
            );
        }
    }
}
