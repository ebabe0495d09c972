//! Watches: resuming from a resourceVersion, selectors, and kube-runtime's
//! watcher on top.

use std::collections::BTreeMap;

use futures_util::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_client::{Client, ResourceExt};
use kube_runtime::watcher;
use serde_json::json;

use super::{LIMIT, configmap};

/// An event as (type, name, `data.v`), bookmarks left out.
type Seen = (&'static str, String, Option<String>);

/// Reads `n` non-bookmark events from a watch, or panics after [`LIMIT`].
async fn next_events<S>(stream: &mut S, n: usize) -> Vec<Seen>
where
    S: Stream<Item = Result<WatchEvent<ConfigMap>, kube_client::Error>> + Unpin,
{
    next_objects(stream, n)
        .await
        .into_iter()
        .map(as_seen)
        .collect()
}

/// Reads `n` non-bookmark events from a watch as (type, object), or panics
/// after [`LIMIT`].
async fn next_objects<S>(stream: &mut S, n: usize) -> Vec<(&'static str, ConfigMap)>
where
    S: Stream<Item = Result<WatchEvent<ConfigMap>, kube_client::Error>> + Unpin,
{
    let mut seen = Vec::new();
    let read = async {
        while seen.len() < n {
            let event = stream
                .try_next()
                .await
                .expect("a watch event")
                .expect("the watch goes on");
            match event {
                WatchEvent::Added(cm) => seen.push(("ADDED", cm)),
                WatchEvent::Modified(cm) => seen.push(("MODIFIED", cm)),
                WatchEvent::Deleted(cm) => seen.push(("DELETED", cm)),
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            }
        }
    };
    if tokio::time::timeout(LIMIT, read).await.is_err() {
        panic!("timed out waiting for {n} watch events");
    }
    seen
}

/// An event as the checks compare it.
fn as_seen((ty, cm): (&'static str, ConfigMap)) -> Seen {
    let v = cm.data.as_ref().and_then(|d| d.get("v").cloned());
    (ty, cm.name_any(), v)
}

fn e(ty: &'static str, name: &str, v: Option<&str>) -> Seen {
    (ty, name.to_string(), v.map(str::to_string))
}

/// A watch from a list's resourceVersion sees exactly the changes made
/// after the list, in order.
pub async fn watch_from_a_resource_version(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    api.create(&pp, &configmap("watch-a", &[("v", "1")]))
        .await
        .unwrap();
    let list = api.list(&ListParams::default()).await.expect("list");
    let rv = list.metadata.resource_version.expect("a list version");

    api.create(&pp, &configmap("watch-b", &[("v", "1")]))
        .await
        .unwrap();
    api.patch(
        "watch-a",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    api.delete("watch-b", &DeleteParams::default())
        .await
        .unwrap();

    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .expect("watch")
        .boxed();
    let seen = next_events(&mut stream, 3).await;
    assert_eq!(
        seen,
        [
            e("ADDED", "watch-b", Some("1")),
            e("MODIFIED", "watch-a", Some("2")),
            e("DELETED", "watch-b", Some("1")),
        ]
    );
}

/// Through a label selector, an object that starts matching arrives as
/// `ADDED` and one that stops matching leaves as `DELETED`.
pub async fn watch_selectors_turn_transitions_into_added_and_deleted(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let rv = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("a list version");
    let mut stream = api
        .watch(
            &WatchParams::default().labels("watched=yes").timeout(60),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let pp = PostParams::default();
    let relabel = |value: &'static str, v: &'static str| {
        let api = api.clone();
        async move {
            api.patch(
                "transit",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { "watched": value } }, "data": { "v": v } }),
                ),
            )
            .await
            .expect("relabel")
            .resource_version()
            .expect("a resourceVersion")
        }
    };
    let mut cm = configmap("transit", &[("v", "1")]);
    cm.metadata.labels = Some(BTreeMap::from([("watched".into(), "no".into())]));
    api.create(&pp, &cm).await.unwrap();
    relabel("yes", "2").await;
    relabel("yes", "3").await;
    let left_at = relabel("no", "4").await;
    relabel("no", "5").await;
    relabel("yes", "6").await;
    api.delete("transit", &DeleteParams::default())
        .await
        .unwrap();
    let objects = next_objects(&mut stream, 5).await;
    // The object leaving the selector arrives as it last matched, at the
    // version of the change that made it leave.
    let (_, left) = &objects[2];
    assert_eq!(
        (
            left.labels().get("watched").map(String::as_str),
            left.resource_version()
        ),
        (Some("yes"), Some(left_at)),
        "the DELETED event of the object leaving the selector"
    );
    let seen: Vec<Seen> = objects.into_iter().map(as_seen).collect();
    assert_eq!(
        seen,
        [
            e("ADDED", "transit", Some("2")),
            e("MODIFIED", "transit", Some("3")),
            // Leaving the selector: its last matching state (data "3").
            e("DELETED", "transit", Some("3")),
            e("ADDED", "transit", Some("6")),
            e("DELETED", "transit", Some("6")),
        ]
    );
}

/// kube-runtime's `watcher` lists (`Init`, `InitApply`, `InitDone`), then
/// follows creations, changes and deletions.
pub async fn kube_runtime_watcher_follows_changes(client: Client, ns: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client, ns);
    let pp = PostParams::default();
    let mut cm = configmap("rt-a", &[("v", "1")]);
    cm.metadata.labels = Some(BTreeMap::from([("runtime".into(), "yes".into())]));
    api.create(&pp, &cm).await.unwrap();
    let mut events = watcher(
        api.clone(),
        watcher::Config::default()
            .labels("runtime=yes")
            .page_size(1),
    )
    .boxed();
    let mut next = async || {
        tokio::time::timeout(LIMIT, events.try_next())
            .await
            .expect("a watcher event in time")
            .expect("no watcher error")
            .expect("the watcher goes on")
    };
    assert!(matches!(next().await, watcher::Event::Init));
    match next().await {
        watcher::Event::InitApply(cm) => assert_eq!(cm.name_any(), "rt-a"),
        other => panic!("expected InitApply, got {other:?}"),
    }
    assert!(matches!(next().await, watcher::Event::InitDone));

    let mut b = configmap("rt-b", &[("v", "1")]);
    b.metadata.labels = cm.metadata.labels.clone();
    api.create(&pp, &b).await.unwrap();
    match next().await {
        watcher::Event::Apply(cm) => assert_eq!(cm.name_any(), "rt-b"),
        other => panic!("expected Apply, got {other:?}"),
    }
    api.delete("rt-a", &DeleteParams::default()).await.unwrap();
    match next().await {
        watcher::Event::Delete(cm) => assert_eq!(cm.name_any(), "rt-a"),
        other => panic!("expected Delete, got {other:?}"),
    }
}
