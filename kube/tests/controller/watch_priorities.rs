//! The watcher adapter's decisions, fed hand-made watcher events (no server):
//! which cause and priority each event gets, what a re-list reveals, and how
//! errors and refusals are surfaced.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_runtime::watcher::{self, Event};
use tokio_workqueue::{AddError, WorkQueue};
use tokio_workqueue_kube::{
    Cause, EnqueueError, Enqueued, ObjectRef, WatchAdapter, WatchPriorities, WatchQueueExt,
};

type Key = ObjectRef<ConfigMap>;

fn cm(ns: &str, name: &str, rv: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some(ns.into());
    cm.metadata.resource_version = Some(rv.into());
    cm
}

fn key(name: &str) -> Key {
    ObjectRef::new(name).within("default")
}

fn added(name: &str, priority: i32, cause: Cause) -> Enqueued<Key> {
    Enqueued {
        key: key(name),
        priority,
        cause,
    }
}

/// Runs `events` through a default adapter and returns what it added.
async fn enqueue_all(queue: &WorkQueue<Key>, events: Vec<Event<ConfigMap>>) -> Vec<Enqueued<Key>> {
    futures::stream::iter(events.into_iter().map(Ok))
        .enqueue(queue.clone())
        .map(|r| r.expect("no error"))
        .collect()
        .await
}

/// Takes every ready key from the queue: (name, priority) in hand-out order.
async fn drain(queue: &WorkQueue<Key>) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    while !queue.is_empty() {
        let item = queue.get().await.expect("a ready key");
        out.push((item.key().name.clone(), item.priority()));
        item.done();
    }
    out
}

#[tokio::test]
async fn initial_list_is_low_priority_and_changes_normal() {
    let queue = WorkQueue::new();
    let got = enqueue_all(
        &queue,
        vec![
            Event::Init,
            Event::InitApply(cm("default", "a", "1")),
            Event::InitApply(cm("default", "b", "2")),
            Event::InitDone,
            Event::Apply(cm("default", "c", "3")),
            Event::Apply(cm("default", "a", "4")),
        ],
    )
    .await;
    assert_eq!(
        got,
        [
            added("a", -100, Cause::InitialList),
            added("b", -100, Cause::InitialList),
            added("c", 0, Cause::Changed),
            added("a", 0, Cause::Changed),
        ]
    );
    // "a" was raised to the fast lane by its change; "b" waits behind both.
    assert_eq!(
        drain(&queue).await,
        [("c".into(), 0), ("a".into(), 0), ("b".into(), -100)]
    );
}

#[tokio::test]
async fn unchanged_redelivery_is_low_priority() {
    let queue = WorkQueue::new();
    let got = enqueue_all(
        &queue,
        vec![
            Event::Init,
            Event::InitDone,
            Event::Apply(cm("default", "a", "5")),
            Event::Apply(cm("default", "a", "5")),
        ],
    )
    .await;
    assert_eq!(
        got,
        [
            added("a", 0, Cause::Changed),
            added("a", -100, Cause::Unchanged)
        ]
    );
    // One entry, and the lower priority did not lower it.
    assert_eq!(drain(&queue).await, [("a".into(), 0)]);
}

#[tokio::test]
async fn relist_tells_unchanged_changed_new_and_missing_objects_apart() {
    let queue = WorkQueue::new();
    let events = vec![
        Event::Init,
        Event::InitApply(cm("default", "same", "1")),
        Event::InitApply(cm("default", "edited", "2")),
        Event::InitApply(cm("default", "gone", "3")),
        Event::InitDone,
        // The watch broke; the watcher lists again.
        Event::Init,
        Event::InitApply(cm("default", "same", "1")),
        Event::InitApply(cm("default", "edited", "7")),
        Event::InitApply(cm("default", "new", "8")),
        Event::InitDone,
    ];
    let got = enqueue_all(&queue, events).await;
    assert_eq!(
        got[3..],
        [
            added("same", -100, Cause::Unchanged),
            added("edited", 0, Cause::Changed),
            added("new", 0, Cause::Changed),
            added("gone", 0, Cause::MissingAfterRelist),
        ]
    );
}

#[tokio::test]
async fn relist_deletions_can_be_turned_off() {
    let queue = WorkQueue::new();
    let events = vec![
        Event::Init,
        Event::InitApply(cm("default", "gone", "3")),
        Event::InitDone,
        Event::Init,
        Event::InitDone,
        // Forgotten by the re-list: it counts as new when it comes back.
        Event::Apply(cm("default", "gone", "3")),
    ];
    let got: Vec<_> = futures::stream::iter(events.into_iter().map(Ok))
        .enqueue_with(WatchAdapter::new(queue.clone()).relist_deletions(false))
        .map(|r| r.unwrap())
        .collect()
        .await;
    assert_eq!(
        got,
        [
            added("gone", -100, Cause::InitialList),
            added("gone", 0, Cause::Changed)
        ]
    );
}

#[tokio::test]
async fn deletes_are_added_too() {
    let queue = WorkQueue::new();
    let got = enqueue_all(
        &queue,
        vec![
            Event::Init,
            Event::InitApply(cm("default", "a", "1")),
            Event::InitDone,
            Event::Delete(cm("default", "a", "2")),
            Event::Delete(cm("default", "never-seen", "3")),
        ],
    )
    .await;
    assert_eq!(
        got[1..],
        [
            added("a", 0, Cause::Deleted),
            added("never-seen", 0, Cause::Deleted)
        ]
    );
    // A re-delivery after the delete is news again.
    let mut adapter = WatchAdapter::new(queue.clone());
    let first: Vec<_> = adapter
        .handle(Event::Apply(cm("default", "x", "1")))
        .collect();
    adapter
        .handle(Event::Delete(cm("default", "x", "2")))
        .count();
    let again: Vec<_> = adapter
        .handle(Event::Apply(cm("default", "x", "1")))
        .collect();
    assert_eq!(first[0].as_ref().unwrap().cause, Cause::Changed);
    assert_eq!(again[0].as_ref().unwrap().cause, Cause::Changed);
}

#[tokio::test]
async fn priorities_are_configurable() {
    let queue = WorkQueue::new();
    let priorities = WatchPriorities {
        initial_list: -5,
        unchanged: -7,
        changed: 3,
        deleted: 9,
    };
    let mut adapter = WatchAdapter::new(queue.clone()).priorities(priorities);
    let mut causes = Vec::new();
    for event in [
        Event::Init,
        Event::InitApply(cm("default", "a", "1")),
        Event::InitDone,
        Event::Apply(cm("default", "b", "2")),
        Event::Apply(cm("default", "b", "2")),
        Event::Delete(cm("default", "c", "3")),
    ] {
        for r in adapter.handle(event) {
            let r = r.unwrap();
            causes.push((r.cause, r.priority));
        }
    }
    assert_eq!(
        causes,
        [
            (Cause::InitialList, -5),
            (Cause::Changed, 3),
            (Cause::Unchanged, -7),
            (Cause::Deleted, 9),
        ]
    );
    assert_eq!(
        drain(&queue).await,
        [("c".into(), 9), ("b".into(), 3), ("a".into(), -5)]
    );

    // Uniform priorities: plain FIFO.
    let queue = WorkQueue::new();
    let mut adapter = WatchAdapter::new(queue.clone()).priorities(WatchPriorities::uniform(0));
    for event in [
        Event::Init,
        Event::InitApply(cm("default", "a", "1")),
        Event::InitDone,
        Event::Apply(cm("default", "b", "2")),
    ] {
        adapter.handle(event).for_each(|r| assert!(r.is_ok()));
    }
    assert_eq!(drain(&queue).await, [("a".into(), 0), ("b".into(), 0)]);
}

#[tokio::test]
async fn key_function_may_map_many_objects_to_one_key() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let adapter = WatchAdapter::with_key_fn(queue.clone(), |cm: &ConfigMap| {
        cm.metadata.namespace.clone().unwrap_or_default()
    });
    let events = vec![
        Event::Init,
        Event::InitApply(cm("team-a", "x", "1")),
        Event::InitApply(cm("team-a", "y", "2")),
        Event::InitApply(cm("team-b", "x", "3")),
        Event::InitDone,
        // Same version of one object: unchanged, even though its key was
        // also added for another object since.
        Event::Apply(cm("team-a", "x", "1")),
        Event::Apply(cm("team-a", "y", "4")),
    ];
    let got: Vec<(String, Cause)> = futures::stream::iter(events.into_iter().map(Ok))
        .enqueue_with(adapter)
        .map(|r| {
            let r = r.unwrap();
            (r.key, r.cause)
        })
        .collect()
        .await;
    assert_eq!(
        got,
        [
            ("team-a".into(), Cause::InitialList),
            ("team-a".into(), Cause::InitialList),
            ("team-b".into(), Cause::InitialList),
            ("team-a".into(), Cause::Unchanged),
            ("team-a".into(), Cause::Changed),
        ]
    );
    assert_eq!(queue.len(), 2);
}

#[tokio::test]
async fn watcher_errors_are_surfaced_and_the_stream_goes_on() {
    let queue = WorkQueue::new();
    let events = vec![
        Err(watcher::Error::NoResourceVersion),
        Ok(Event::Apply(cm("default", "a", "1"))),
    ];
    let got: Vec<_> = futures::stream::iter(events)
        .enqueue(queue.clone())
        .collect()
        .await;
    assert_eq!(got.len(), 2);
    assert!(matches!(
        &got[0],
        Err(EnqueueError::Watcher(watcher::Error::NoResourceVersion))
    ));
    assert!(got[0].as_ref().unwrap_err().to_string().contains("watcher"));
    assert_eq!(got[1].as_ref().unwrap().key, key("a"));
}

#[tokio::test]
async fn refused_adds_are_reported_and_shutdown_ends_the_stream() {
    let queue: WorkQueue<Key> = WorkQueue::new();
    let mut adapter = WatchAdapter::new(queue.clone());
    queue.shutdown();
    // By hand: the refusal is reported with its key.
    let got: Vec<_> = adapter
        .handle(Event::Apply(cm("default", "a", "1")))
        .collect();
    match &got[..] {
        [
            Err(EnqueueError::Refused {
                key: k,
                error: AddError::ShuttingDown,
                cause: Cause::Changed,
            }),
        ] => assert_eq!(*k, key("a")),
        other => panic!("unexpected {other:?}"),
    }
    // Refused, so not remembered: the same version is still news.
    let again: Vec<_> = adapter
        .handle(Event::Apply(cm("default", "a", "1")))
        .collect();
    assert!(matches!(
        &again[..],
        [Err(EnqueueError::Refused {
            cause: Cause::Changed,
            ..
        })]
    ));

    // As a stream: a queue already shut down ends it before any event is
    // taken, so no event is consumed and dropped.
    let mut events = futures::stream::iter(vec![Ok(Event::Apply(cm("default", "b", "1")))]);
    let none: Vec<_> = (&mut events).enqueue(queue.clone()).collect().await;
    assert!(none.is_empty());
    assert_eq!(events.count().await, 1);

    // Shut down while the stream runs: it ends before taking another event.
    let queue: WorkQueue<Key> = WorkQueue::new();
    let mut events = futures::stream::iter(vec![
        Ok(Event::Apply(cm("default", "a", "1"))),
        Ok(Event::Apply(cm("default", "b", "2"))),
    ]);
    let mut stream = (&mut events).enqueue(queue.clone());
    assert_eq!(stream.next().await.unwrap().unwrap().key, key("a"));
    queue.shutdown();
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(events.count().await, 1);
}
