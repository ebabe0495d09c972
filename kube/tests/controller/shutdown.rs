//! How a controller stops: a graceful shutdown drains the queued keys, a
//! shutdown does not; either way no new trigger is taken, what is in flight
//! finishes and the stream ends. The stream also ends when every trigger
//! stream did, and dropping it aborts the reconciles in flight.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
use tokio_workqueue_kube::Action;

use crate::common::*;

const HOUR: Duration = Duration::from_secs(3600);

/// A future the test completes with `fire`.
fn signal() -> (oneshot::Sender<()>, impl Future<Output = ()> + Send + Sync) {
    let (fire, fired) = oneshot::channel();
    (fire, async move {
        let _ = fired.await;
    })
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_drains_the_queued_keys_and_takes_no_new_triggers() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (stop, stopped) = signal();
    let stream = controller.concurrency(1).graceful_shutdown_on(stopped).run(
        record.reconciler(ms(10), |_, _| Ok(Action::requeue(HOUR))),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 5));
    // obj-000 done (and waiting an hour for its requeue), obj-001 in flight,
    // three queued.
    advance(ms(15)).await;
    stop.send(()).unwrap();
    // After the signal: nothing new is taken.
    feed.apply(cm("late", "1"));
    feed.apply(cm("obj-000", "2"));
    let reports = run.finish().await;

    assert!(feed.is_closed(), "still watching after a shutdown");
    assert_eq!(
        record.starts(),
        ["obj-000", "obj-001", "obj-002", "obj-003", "obj-004"]
    );
    assert!(
        record
            .runs()
            .iter()
            .all(|r| r.ended == Some(Ended::Finished))
    );
    // The requeue asked for before the shutdown was taken; those asked for
    // while draining were refused and reported, each beside its success.
    let mut expected = vec![Reported::Ok("obj-000".into(), Action::requeue(HOUR))];
    for i in 1..5 {
        let name = format!("obj-{i:03}");
        expected.push(Reported::Refused(name.clone()));
        expected.push(Reported::Ok(name, Action::requeue(HOUR)));
    }
    assert_eq!(reports, expected);
    // The stream ended when the last queued key was done; the delayed
    // obj-000 was dropped.
    assert_eq!(record.runs().last().unwrap().end, Some(ms(50)));
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_reports_an_error_whose_retry_it_refuses() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (stop, stopped) = signal();
    let stream = controller.graceful_shutdown_on(stopped).run(
        record.reconciler(ms(10), |_, _| fail("no")),
        policy(Action::requeue(ms(1))),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(ms(5)).await;
    stop.send(()).unwrap();
    let reports = run.finish().await;
    assert_eq!(record.count("a"), 1);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(reports.contains(&Reported::Refused("a".into())));
    assert!(reports.contains(&Reported::Failed("a".into(), TestError("no".into()))));
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_what_is_in_flight_and_drops_the_queue() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (stop, stopped) = signal();
    let stream = controller.concurrency(2).shutdown_on(stopped).run(
        record.reconciler_with(
            |name, _| if name == "obj-002" { ms(30) } else { ms(10) },
            |name, _| {
                if name == "obj-003" {
                    Ok(Action::requeue(ms(1)))
                } else {
                    Ok(Action::await_change())
                }
            },
        ),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 10));
    // 000 and 001 done; 002 (until 40 ms) and 003 (until 20 ms) in flight.
    advance(ms(15)).await;
    stop.send(()).unwrap();
    feed.apply(cm("late", "1"));
    let reports = run.finish().await;

    assert!(feed.is_closed());
    assert_eq!(
        record.starts(),
        ["obj-000", "obj-001", "obj-002", "obj-003"]
    );
    assert!(
        record
            .runs()
            .iter()
            .all(|r| r.ended == Some(Ended::Finished))
    );
    let mut first_two = reports[..2].to_vec();
    first_two.sort_by_key(|r| r.name().map(String::from));
    assert_eq!(
        first_two,
        [
            Reported::Ok("obj-000".into(), Action::await_change()),
            Reported::Ok("obj-001".into(), Action::await_change()),
        ]
    );
    assert_eq!(
        reports[2..],
        [
            // In flight: finished, its requeue refused.
            Reported::Refused("obj-003".into()),
            Reported::Ok("obj-003".into(), Action::requeue(ms(1))),
            Reported::Ok("obj-002".into(), Action::await_change()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_stream_drains_and_ends_when_every_trigger_stream_ended() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (requests, requested) = sender();
    let stream = controller.concurrency(1).reconcile_on(requested).run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 5));
    feed.close();
    // One trigger stream is still open: the controller goes on.
    advance(HOUR).await;
    assert_eq!(run.ended(), None);
    assert_eq!(record.len(), 5);

    requests.send(key("obj-001"));
    requests.send(key("obj-003"));
    requests.close();
    let reports = run.finish().await;
    // The last keys were reconciled before the end.
    assert_eq!(record.len(), 7);
    assert_eq!(record.starts()[5..], ["obj-001", "obj-003"]);
    assert_eq!(reports.len(), 7);
}

#[tokio::test(start_paused = true)]
async fn a_list_then_the_end_of_the_watch_reconciles_the_whole_list() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(1).run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list(cms("obj", 5));
    feed.close();
    let reports = run.finish().await;
    assert_eq!(reports.len(), 5);
    assert_eq!(record.len(), 5);
    assert_eq!(record.runs().last().unwrap().end, Some(ms(50)));
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_before_the_first_list_ends_the_stream_at_once() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (stop, stopped) = signal();
    let stream = controller.graceful_shutdown_on(stopped).run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.init();
    feed.init_apply(cm("a", "1"));
    advance(ms(5)).await;
    stop.send(()).unwrap();
    let reports = run.finish().await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(record.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_aborts_the_reconciles_in_flight() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(HOUR, |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1"), cm("b", "1")]);
    advance(ms(5)).await;
    assert_eq!(record.running(), 2);
    run.abort().await;
    advance(ms(1)).await;

    assert_eq!(record.running(), 0);
    for r in record.runs() {
        assert_eq!(r.ended, Some(Ended::Dropped), "{r:?}");
        assert_eq!(r.end, Some(ms(5)), "{r:?}");
    }
    assert!(feed.is_closed());
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_ends_before_its_first_list_ends_the_stream_without_reports() {
    // The listed keys were queued but never in a complete store: they are
    // not reported as missing, nor reconciled.
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.init();
    feed.init_apply(cm("a", "1"));
    feed.init_apply(cm("b", "1"));
    feed.close();
    let reports = run.finish().await;
    assert!(reports.is_empty(), "{reports:?}");
    assert_eq!(record.len(), 0);
}
