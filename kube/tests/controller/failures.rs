//! A reconcile that panics (in its future or while making it) or runs past
//! `reconcile_timeout` is an error for its key only: reported on the stream,
//! requeued with the key's backoff, the other keys unaffected.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio_workqueue::{Builder, ExponentialBackoff, WorkQueue};
use tokio_workqueue_kube::Action;

use crate::common::*;

const HOUR: Duration = Duration::from_secs(3600);

fn backoff(base: Duration) -> Builder<Key> {
    WorkQueue::builder()
        .rate_limiter(ExponentialBackoff::new(base, Duration::from_secs(60)).unwrap())
}

fn others_once(record: &Record, run: &Collected) {
    for name in ["a", "b", "c"] {
        assert_eq!(record.count(name), 1, "{name}");
        let runs = record.runs_of(name);
        assert_eq!(runs[0].ended, Some(Ended::Finished), "{name}");
        assert!(
            run.reports()
                .contains(&Reported::Ok(name.into(), Action::await_change())),
            "{name}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_reconcile_future_is_an_error_for_that_key_only() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.queue(backoff(ms(100))).run(
        record.reconciler(ms(10), |name, attempt| {
            if name == "bad" && attempt < 3 {
                panic!("boom {attempt}");
            }
            Ok(Action::await_change())
        }),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(["a", "bad", "b", "c"].map(|n| cm(n, "1")));
    advance(HOUR).await;

    others_once(&record, &run);
    // Panicked after 10 ms of work, retried after 100 ms, then 200 ms.
    let bad = record.runs_of("bad");
    let starts: Vec<_> = bad.iter().map(|r| r.start).collect();
    let ended: Vec<_> = bad.iter().map(|r| r.ended).collect();
    assert_eq!(starts, [ms(0), ms(110), ms(320)]);
    assert_eq!(
        ended,
        [Ended::Panicked, Ended::Panicked, Ended::Finished].map(Some)
    );
    let reports: Vec<_> = run
        .timed_reports()
        .into_iter()
        .filter(|(_, r)| r.name() == Some("bad"))
        .collect();
    assert_eq!(
        reports,
        [
            (ms(10), Reported::Panicked("bad".into(), "boom 1".into())),
            (ms(120), Reported::Panicked("bad".into(), "boom 2".into())),
            (ms(330), Reported::Ok("bad".into(), Action::await_change())),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_panic_while_making_the_future_is_an_error_for_that_key_only() {
    let record = Record::new();
    let (feed, controller) = fed();
    let mut inner = record.reconciler(ms(10), |_, _| Ok(Action::await_change()));
    let panics = AtomicUsize::new(0);
    let reconciler = move |object: Arc<ConfigMap>, ctx: Arc<()>| {
        if name_of(&*object) == "bad" && panics.fetch_add(1, Ordering::SeqCst) < 2 {
            panic!("no future for you");
        }
        inner(object, ctx)
    };
    let stream = controller.queue(backoff(ms(100))).run(
        reconciler,
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(["a", "bad", "b", "c"].map(|n| cm(n, "1")));
    advance(HOUR).await;

    others_once(&record, &run);
    // Failed at once, retried after 100 ms, then 200 ms, then made a future.
    assert_eq!(record.starts_of("bad"), [ms(300)]);
    let reports: Vec<_> = run
        .timed_reports()
        .into_iter()
        .filter(|(_, r)| r.name() == Some("bad"))
        .collect();
    let panicked = Reported::Panicked("bad".into(), "no future for you".into());
    assert_eq!(
        reports,
        [
            (ms(0), panicked.clone()),
            (ms(100), panicked),
            (ms(310), Reported::Ok("bad".into(), Action::await_change())),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_past_the_timeout_is_cancelled_reported_and_requeued() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller
        .queue(backoff(ms(100)))
        .reconcile_timeout(ms(50))
        .run(
            record.reconciler_with(
                |name, attempt| {
                    if name == "slow" && attempt < 3 {
                        HOUR
                    } else {
                        ms(40)
                    }
                },
                |_, _| Ok(Action::await_change()),
            ),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let run = Collected::spawn(&record, stream);
    feed.list(["a", "slow", "b", "c"].map(|n| cm(n, "1")));
    advance(HOUR * 3).await;

    others_once(&record, &run);
    let slow = record.runs_of("slow");
    let spans: Vec<_> = slow.iter().map(|r| (r.start, r.end, r.ended)).collect();
    assert_eq!(
        spans,
        [
            // Cancelled (dropped) at 50 ms, back after 100 ms of backoff.
            (ms(0), Some(ms(50)), Some(Ended::Dropped)),
            (ms(150), Some(ms(200)), Some(Ended::Dropped)),
            (ms(400), Some(ms(440)), Some(Ended::Finished)),
        ]
    );
    let reports: Vec<_> = run
        .timed_reports()
        .into_iter()
        .filter(|(_, r)| r.name() == Some("slow"))
        .collect();
    assert_eq!(
        reports,
        [
            (ms(50), Reported::TimedOut("slow".into(), ms(50))),
            (ms(200), Reported::TimedOut("slow".into(), ms(50))),
            (ms(440), Reported::Ok("slow".into(), Action::await_change())),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_only_lets_reconciles_that_finish_at_once_through() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.reconcile_timeout(Duration::ZERO).run(
        record.reconciler_with(
            |name, _| {
                if name == "instant" {
                    Duration::ZERO
                } else {
                    ms(1)
                }
            },
            |_, _| Ok(Action::await_change()),
        ),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("instant", "1"), cm("waits", "1")]);
    advance(ms(2)).await;
    let reports = run.reports();
    assert!(
        reports.contains(&Reported::Ok("instant".into(), Action::await_change())),
        "{reports:?}"
    );
    assert!(
        reports.contains(&Reported::TimedOut("waits".into(), Duration::ZERO)),
        "{reports:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_watcher_error_is_reported_and_the_controller_goes_on() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(ms(10)).await;
    feed.error(kube_runtime::watcher::Error::NoResourceVersion);
    feed.apply(cm("b", "1"));
    // After the trigger backoff, the events behind the error are taken.
    advance(Duration::from_secs(60)).await;
    assert_eq!(record.starts(), ["a", "b"]);
    assert_eq!(
        run.reports()[1],
        Reported::Other(
            "event queue error: watcher error: no metadata.resourceVersion in watch result \
             (does resource support watch?)"
                .into()
        )
    );
}
