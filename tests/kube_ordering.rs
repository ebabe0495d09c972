//! The watcher adapter and the controller loop with an ordering plugged in:
//! fair share by namespace is one builder call, and a namespace that floods
//! the queue does not hold up the others' reconciles.
#![cfg(feature = "kube")]

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_runtime::watcher::Event;
use tokio_workqueue::kube::{Action, ObjectRef, WatchQueueExt, run_controller};
use tokio_workqueue::ordering::ByNamespace;
use tokio_workqueue::{FairShare, WorkQueue};

type Key = ObjectRef<ConfigMap>;

fn cm(ns: &str, name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some(ns.into());
    cm.metadata.resource_version = Some("1".into());
    cm
}

/// 200 changes in `flood`, then one in each of `a`, `b` and `c`, through the
/// watcher adapter; then one reconcile at a time. Returns the namespaces in
/// reconcile order.
async fn reconcile_order<O: tokio_workqueue::Ordering<Key>>(
    queue: WorkQueue<Key, O>,
) -> Vec<String> {
    let mut events: Vec<Event<ConfigMap>> = (0..200)
        .map(|i| Event::Apply(cm("flood", &format!("cm-{i}"))))
        .collect();
    events.extend(["a", "b", "c"].map(|ns| Event::Apply(cm(ns, "cm"))));
    let added = futures::stream::iter(events.into_iter().map(Ok))
        .enqueue(queue.clone())
        .count()
        .await;
    assert_eq!(added, 203);
    queue.shutdown(); // the controller ends once every key is reconciled
    run_controller(queue, 1, |key: Key| async move {
        let _ = key;
        Ok::<_, std::convert::Infallible>(Action::Done)
    })
    .map(|r| r.key.namespace.expect("namespaced"))
    .collect()
    .await
}

#[tokio::test]
async fn fair_share_by_namespace_ordering_lets_quiet_namespaces_through_a_flood() {
    let queue: WorkQueue<Key, ByNamespace<ConfigMap>> = WorkQueue::builder()
        .name("configmaps")
        .ordering(FairShare::by_namespace())
        .build();
    let order = reconcile_order(queue).await;
    assert_eq!(order.len(), 203);
    // One turn each: flood's first key, then a, b and c.
    assert_eq!(order[..4], ["flood", "a", "b", "c"]);
}

#[tokio::test]
async fn without_an_ordering_the_flood_goes_first() {
    let order = reconcile_order(WorkQueue::new()).await;
    assert!(order[..200].iter().all(|ns| ns == "flood"), "{order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_fair_share_ordering_keeps_requeues_in_their_namespace_turn() {
    // Reconciles of `flood` fail once and are requeued after 1 ms: even
    // then, `quiet`'s key is reconciled within the first round.
    let queue = WorkQueue::builder()
        .ordering(FairShare::by_namespace())
        .build();
    for i in 0..50 {
        queue
            .add(Key::new(&format!("cm-{i}")).within("flood"))
            .unwrap();
    }
    queue.add(Key::new("cm").within("quiet")).unwrap();
    let first: Vec<String> = run_controller(queue.clone(), 1, |key: Key| async move {
        let _ = key;
        Ok::<_, std::convert::Infallible>(Action::RequeueAfter(Duration::from_millis(1)))
    })
    .take(2)
    .map(|r| r.key.namespace.unwrap())
    .collect()
    .await;
    assert_eq!(first, ["flood", "quiet"]);
    queue.shutdown();
}
