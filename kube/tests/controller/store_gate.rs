//! The controller reconciles only what its reflector store holds: nothing
//! before the store's first list is complete, nothing whose object left the
//! store (reported as `ObjectNotFound`), and a deleted main object triggers
//! nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_runtime::watcher::Event;
use tokio_workqueue_kube::{Action, Controller};

use crate::common::*;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn nothing_is_reconciled_before_the_first_list_is_complete() {
    let record = Record::new();
    let (feed, controller) = fed();
    let store = controller.store();
    let stream = controller.run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);

    feed.init();
    for object in cms("listed", 3) {
        feed.init_apply(object);
    }
    advance(HOUR).await;
    assert_eq!(record.len(), 0, "reconciled before InitDone");
    assert!(run.reports().is_empty());
    assert!(store.state().is_empty(), "the store holds a half list");

    feed.init_done();
    advance(ms(10)).await;
    assert_eq!(record.starts(), ["listed-000", "listed-001", "listed-002"]);
    // Nothing reconciled before the list was complete: the first start is
    // when InitDone came.
    assert!(record.runs().iter().all(|r| r.start >= HOUR));
    assert_eq!(
        run.reports(),
        ["listed-000", "listed-001", "listed-002"]
            .map(|n| Reported::Ok(n.into(), Action::await_change()))
    );
}

#[tokio::test(start_paused = true)]
async fn changes_before_the_first_list_wait_for_it_too() {
    // A watcher that applies an object before its list is done (a reflector
    // fed by hand can): still nothing before InitDone.
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);

    feed.init();
    feed.init_apply(cm("a", "1"));
    feed.apply(cm("b", "1"));
    advance(HOUR).await;
    assert_eq!(record.len(), 0);

    feed.init_done();
    advance(ms(10)).await;
    assert_eq!(record.count("a"), 1);
    // `b` was applied to the store before the list replaced it, and the list
    // did not hold it: gone from the store, so not reconciled, reported.
    assert_eq!(record.count("b"), 0);
    assert!(run.reports().contains(&Reported::NotFound("b".into())));
}

#[tokio::test(start_paused = true)]
async fn objects_deleted_while_queued_are_reported_not_reconciled() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(1).run(
        record.reconciler(ms(10), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);

    let objects = cms("obj", 5);
    feed.list(objects.clone());
    // obj-000 is in flight, the other four queued.
    advance(ms(5)).await;
    assert_eq!(record.starts(), ["obj-000"]);
    feed.delete(objects[2].clone());
    feed.delete(objects[4].clone());
    // obj-000 in flight is deleted too: its reconcile finishes as it is.
    feed.delete(objects[0].clone());
    advance(HOUR).await;

    assert_eq!(record.starts(), ["obj-000", "obj-001", "obj-003"]);
    let reports = run.reports();
    assert_eq!(
        reports,
        [
            Reported::Ok("obj-000".into(), Action::await_change()),
            Reported::Ok("obj-001".into(), Action::await_change()),
            Reported::NotFound("obj-002".into()),
            Reported::Ok("obj-003".into(), Action::await_change()),
            Reported::NotFound("obj-004".into()),
        ]
    );
    // The stream goes on after reporting: a new object is reconciled.
    feed.apply(cm("late", "7"));
    advance(ms(20)).await;
    assert_eq!(record.count("late"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_requeued_object_deleted_meanwhile_is_reported_once_then_forgotten() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(1), |_, _| Ok(Action::requeue(Duration::from_secs(60)))),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(Duration::from_secs(30)).await;
    feed.delete(cm("a", "1"));
    advance(HOUR).await;
    assert_eq!(record.count("a"), 1);
    assert_eq!(
        run.reports(),
        [
            Reported::Ok("a".into(), Action::requeue(Duration::from_secs(60))),
            Reported::NotFound("a".into()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn deleting_a_main_object_triggers_nothing() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1"), cm("b", "1")]);
    advance(ms(10)).await;
    assert_eq!(record.len(), 2);

    feed.delete(cm("a", "2"));
    // A re-list that no longer shows `b` (its delete was missed): nothing
    // either, and no ObjectNotFound report.
    feed.list(Vec::new());
    advance(HOUR).await;
    assert_eq!(record.len(), 2);
    assert_eq!(run.reports().len(), 2, "{:?}", run.reports());
    assert!(run.reports().iter().all(|r| matches!(r, Reported::Ok(..))));
}

#[tokio::test(start_paused = true)]
async fn for_stream_waits_for_the_users_store() {
    // The user reflects into a store of their own and gives the controller
    // the objects: nothing is reconciled before that store is ready.
    let record = Record::new();
    let (reader, mut writer) = kube_runtime::reflector::store::<ConfigMap>();
    let (objects, object_stream) = sender();
    let stream = Controller::for_stream(object_stream, reader).run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        std::sync::Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);

    writer.apply_watcher_event(&Event::Init);
    for object in cms("obj", 3) {
        writer.apply_watcher_event(&Event::InitApply(object.clone()));
        objects.object(object);
    }
    advance(HOUR).await;
    assert_eq!(record.len(), 0);

    writer.apply_watcher_event(&Event::InitDone);
    advance(ms(10)).await;
    assert_eq!(record.starts(), ["obj-000", "obj-001", "obj-002"]);

    // An object the stream gives but the store does not hold: reported.
    objects.object(cm("stray", "1"));
    advance(ms(10)).await;
    assert_eq!(
        run.reports().last(),
        Some(&Reported::NotFound("stray".into()))
    );
}
