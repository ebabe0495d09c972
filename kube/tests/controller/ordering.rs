//! The watcher adapter and the `Controller` with an ordering plugged in:
//! fair share by namespace is one builder call, and a namespace that floods
//! the queue does not hold up the others' reconciles.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_runtime::reflector::store::Writer;
use kube_runtime::watcher::Event;
use tokio_workqueue::WorkQueue;
use tokio_workqueue_kube::ordering::{ByNamespace, by_namespace};
use tokio_workqueue_kube::{Action, Controller, ObjectRef, WatchQueueExt};

type Key = ObjectRef<ConfigMap>;

fn cm(ns: &str, name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some(ns.into());
    cm.metadata.resource_version = Some("1".into());
    cm
}

/// 200 objects in `flood`, then one in each of `a`, `b` and `c`.
fn flood_then_quiet() -> Vec<ConfigMap> {
    let mut objects: Vec<ConfigMap> = (0..200).map(|i| cm("flood", &format!("cm-{i}"))).collect();
    objects.extend(["a", "b", "c"].map(|ns| cm(ns, "cm")));
    objects
}

/// The objects as changes through the watcher adapter, then handed out one
/// at a time; the namespaces in hand-out order.
async fn adapter_order<O: tokio_workqueue::Ordering<Key>>(queue: WorkQueue<Key, O>) -> Vec<String> {
    let events = flood_then_quiet().into_iter().map(|o| Ok(Event::Apply(o)));
    let added = futures::stream::iter(events)
        .enqueue(queue.clone())
        .count()
        .await;
    assert_eq!(added, 203);
    queue.shutdown();
    let mut order = Vec::new();
    while let Some(item) = queue.get().await {
        order.push(item.key().namespace.clone().expect("namespaced"));
    }
    order
}

#[tokio::test]
async fn fair_share_by_namespace_ordering_lets_quiet_namespaces_through_a_flood() {
    let queue: WorkQueue<Key, ByNamespace<ConfigMap>> = WorkQueue::builder()
        .name("configmaps")
        .ordering(by_namespace())
        .build();
    let order = adapter_order(queue).await;
    assert_eq!(order.len(), 203);
    // One turn each: flood's first key, then a, b and c.
    assert_eq!(order[..4], ["flood", "a", "b", "c"]);
}

#[tokio::test]
async fn without_an_ordering_the_flood_goes_first() {
    let order = adapter_order(WorkQueue::new()).await;
    assert!(order[..200].iter().all(|ns| ns == "flood"), "{order:?}");
}

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

async fn noop(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Never> {
    Ok(Action::await_change())
}

fn policy(_: Arc<ConfigMap>, _: &Never, _: Arc<()>) -> Action {
    Action::await_change()
}

/// The objects as one list into a `Controller` with concurrency 1; the
/// namespaces in reconcile order.
async fn controller_order(fair: bool) -> Vec<String> {
    let mut events = vec![Ok(Event::Init)];
    events.extend(
        flood_then_quiet()
            .into_iter()
            .map(|o| Ok(Event::InitApply(o))),
    );
    events.push(Ok(Event::InitDone));
    let controller =
        Controller::for_events(futures::stream::iter(events), Writer::default()).concurrency(1);
    let namespace = |r: tokio_workqueue_kube::RunResult<ConfigMap, Never>| {
        r.expect("reconciled").0.namespace.expect("namespaced")
    };
    if fair {
        controller
            .ordering(by_namespace())
            .run(noop, policy, Arc::new(()))
            .map(namespace)
            .collect()
            .await
    } else {
        controller
            .run(noop, policy, Arc::new(()))
            .map(namespace)
            .collect()
            .await
    }
}

#[tokio::test]
async fn a_fair_share_controller_is_one_builder_call_ordering() {
    let order = controller_order(true).await;
    assert_eq!(order.len(), 203);
    assert_eq!(order[..4], ["flood", "a", "b", "c"]);
    let order = controller_order(false).await;
    assert!(order[..200].iter().all(|ns| ns == "flood"), "{order:?}");
}
