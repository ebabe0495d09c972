//! The coordinator's watch of one kind: kube-runtime's metadata watcher,
//! with each object decoded to what the coordinator keeps of it, its key
//! and its shard label.
//!
//! Why not `metadata_watcher` itself: it decodes every object's whole
//! `ObjectMeta`, `managedFields` included (a tree of `serde_json::Value`s
//! per manager, a few hundred bytes of small allocations an object), to
//! keep two strings of it. At 30,000 objects that churn, which the
//! allocator keeps once freed, was most of what a coordinator held beyond
//! a member (benchmark C5). Here the server still sends metadata only
//! (`PartialObjectMetadata`), and serde skips every field but the name,
//! the namespace, the labels and the resourceVersion without allocating
//! for it.
//!
//! The protocol is the watcher's list-then-watch, event for event:
//! [`Event::Init`], an [`Event::InitApply`] per listed object (pages of
//! the config's `page_size`), [`Event::InitDone`], then a watch from the
//! list's resourceVersion with bookmarks, resumed from the last version
//! seen when it ends, and a re-list after a 410 Gone. An error is yielded
//! as the watcher yields it, and the next poll recovers; the caller backs
//! off between them. A config asking for streaming lists is listed in
//! pages all the same: the coordinator waits for the whole list before it
//! acts either way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use kube_client::Client;
use kube_client::core::params::{ListParams, VersionMatch, WatchParams};
use kube_client::core::{ObjectList, Request, WatchEvent};
use kube_runtime::watcher::{self, Event, ListSemantic};
use serde::Deserialize;

/// An object as the coordinator sees it: its key (`namespace/name`, or
/// `name` for a cluster-scoped object) and the value of its shard label.
pub(super) struct Seen {
    pub(super) key: Arc<str>,
    pub(super) label: Option<String>,
}

/// A kind's watch, as [`Seen`] objects.
pub(super) type SeenEvents = BoxStream<'static, Result<Event<Seen>, watcher::Error>>;

/// The metadata watch of the objects at `url` (a kind's path, in a
/// namespace or in all) that `wc` selects, reading the label `label_key`.
pub(super) fn seen_events(
    client: Client,
    url: &str,
    wc: watcher::Config,
    label_key: String,
) -> SeenEvents {
    let watch = Watch {
        client,
        request: Request::new(url),
        wc,
        label_key,
    };
    stream::unfold((watch, State::Empty), |(watch, state)| async move {
        let (event, state) = watch.step(state).await;
        Some((event, (watch, state)))
    })
    .boxed()
}

/// What is decoded of an object: the metadata fields below, nothing else.
#[derive(Clone, Deserialize)]
struct Lean {
    #[serde(default)]
    metadata: LeanMeta,
}

#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    #[serde(default)]
    name: String,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
}

/// Where the watch is.
enum State {
    /// Nothing listed yet, or a re-list is due.
    Empty,
    /// Listing: the rest of the page fetched, and the token of the next
    /// page (none: this was the last) or, once it is the last, the list's
    /// version.
    Page {
        token: Option<String>,
        items: std::vec::IntoIter<Lean>,
        version: Option<String>,
    },
    /// Listed, or a watch ended: a watch from `version` is due.
    Listed { version: String },
    /// Watching; `version` is the last one seen.
    Watching {
        version: String,
        events: BoxStream<'static, kube_client::Result<WatchEvent<Lean>>>,
    },
}

struct Watch {
    client: Client,
    request: Request,
    wc: watcher::Config,
    label_key: String,
}

/// How long past the server's watch timeout a silent watch is taken for
/// dead (kube-runtime's margin).
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The server's watch timeout when the config gives none (kube-runtime's).
const DEFAULT_TIMEOUT_SECS: u32 = 290;

impl Watch {
    /// The next event and the state after it.
    async fn step(&self, mut state: State) -> (Result<Event<Seen>, watcher::Error>, State) {
        loop {
            state = match state {
                State::Empty => {
                    let page = State::Page {
                        token: None,
                        items: Vec::new().into_iter(),
                        version: None,
                    };
                    return (Ok(Event::Init), page);
                }
                State::Page {
                    token,
                    mut items,
                    version,
                } => {
                    if let Some(object) = items.next() {
                        let seen = self.seen(object);
                        let page = State::Page {
                            token,
                            items,
                            version,
                        };
                        return (Ok(Event::InitApply(seen)), page);
                    }
                    if token.is_none()
                        && let Some(version) = version
                    {
                        return (Ok(Event::InitDone), State::Listed { version });
                    }
                    match self.list(token).await {
                        Ok(list) => {
                            let version = non_empty(list.metadata.resource_version);
                            let token = non_empty(list.metadata.continue_);
                            if version.is_none() && token.is_none() {
                                return (Err(watcher::Error::NoResourceVersion), State::Empty);
                            }
                            State::Page {
                                token,
                                items: list.items.into_iter(),
                                version,
                            }
                        }
                        Err(e) => return (Err(watcher::Error::InitialListFailed(e)), State::Empty),
                    }
                }
                State::Listed { version } => match self.watch(&version).await {
                    Ok(events) => State::Watching { version, events },
                    Err(e) => {
                        let error = watcher::Error::WatchStartFailed(e);
                        return (Err(error), State::Listed { version });
                    }
                },
                State::Watching {
                    version,
                    mut events,
                } => match self.next_within_timeout(&mut events).await {
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        return self.changed(object, Event::Apply, events);
                    }
                    Some(Ok(WatchEvent::Deleted(object))) => {
                        return self.changed(object, Event::Delete, events);
                    }
                    Some(Ok(WatchEvent::Bookmark(mark))) => State::Watching {
                        version: mark.metadata.resource_version,
                        events,
                    },
                    Some(Ok(WatchEvent::Error(status))) => {
                        // 410 Gone: the version is compacted away, so
                        // only a new list can catch up.
                        let next = if status.code == 410 {
                            State::Empty
                        } else {
                            State::Watching { version, events }
                        };
                        return (Err(watcher::Error::WatchError(status)), next);
                    }
                    Some(Err(e)) => {
                        let error = watcher::Error::WatchFailed(e);
                        return (Err(error), State::Watching { version, events });
                    }
                    None => State::Listed { version },
                },
            };
        }
    }

    /// A change the watch showed, as `event`, and the watch from its
    /// version on; a change without a version starts over with a list.
    fn changed(
        &self,
        object: Lean,
        event: fn(Seen) -> Event<Seen>,
        events: BoxStream<'static, kube_client::Result<WatchEvent<Lean>>>,
    ) -> (Result<Event<Seen>, watcher::Error>, State) {
        match non_empty(object.metadata.resource_version.clone()) {
            Some(version) => (
                Ok(event(self.seen(object))),
                State::Watching { version, events },
            ),
            None => (Err(watcher::Error::NoResourceVersion), State::Empty),
        }
    }

    async fn list(&self, token: Option<String>) -> kube_client::Result<ObjectList<Lean>> {
        let (resource_version, version_match) = match self.wc.list_semantic {
            ListSemantic::Any => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan)),
            ListSemantic::MostRecent => (None, None),
        };
        let params = ListParams {
            label_selector: self.wc.label_selector.clone(),
            field_selector: self.wc.field_selector.clone(),
            resource_version,
            version_match,
            limit: self.wc.page_size,
            continue_token: token,
            ..ListParams::default()
        };
        let mut request = self
            .request
            .list_metadata(&params)
            .map_err(kube_client::Error::BuildRequest)?;
        request.extensions_mut().insert("list_metadata");
        self.client.request(request).await
    }

    async fn watch(
        &self,
        version: &str,
    ) -> kube_client::Result<BoxStream<'static, kube_client::Result<WatchEvent<Lean>>>> {
        let params = WatchParams {
            label_selector: self.wc.label_selector.clone(),
            field_selector: self.wc.field_selector.clone(),
            timeout: self.wc.timeout,
            bookmarks: self.wc.bookmarks,
            send_initial_events: false,
        };
        let mut request = self
            .request
            .watch_metadata(&params, version)
            .map_err(kube_client::Error::BuildRequest)?;
        request.extensions_mut().insert("watch_metadata");
        Ok(self.client.request_events(request).await?.boxed())
    }

    /// The watch's next event, or `None` once it ended or fell silent for
    /// longer than the server would have kept it open.
    async fn next_within_timeout<T>(&self, events: &mut BoxStream<'static, T>) -> Option<T> {
        let secs = self.wc.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
        if secs == 0 {
            return events.next().await;
        }
        let idle = Duration::from_secs(secs.into()) + IDLE_MARGIN;
        tokio::time::timeout(idle, events.next())
            .await
            .ok()
            .flatten()
    }

    fn seen(&self, object: Lean) -> Seen {
        let LeanMeta {
            name,
            namespace,
            labels,
            ..
        } = object.metadata;
        let key = match namespace {
            Some(ns) => format!("{ns}/{name}").into(),
            None => name.into(),
        };
        let label = labels.and_then(|mut l| l.remove(&self.label_key));
        Seen { key, label }
    }
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::Api;
    use kube_client::api::{DeleteParams, Patch, PatchParams, PostParams};
    use kube_local_apiserver::LocalApiServer;
    use tokio::sync::mpsc;

    const LABEL: &str = "shard.workqueue.tokio.rs/g";

    /// An event as both watches can show it.
    #[derive(Debug, PartialEq)]
    enum Shown {
        Init,
        Listed(String, Option<String>),
        Done,
        Applied(String, Option<String>),
        Deleted(String, Option<String>),
        Failed,
    }

    fn shown(event: Result<Event<Seen>, watcher::Error>) -> Shown {
        match event {
            Ok(Event::Init) => Shown::Init,
            Ok(Event::InitApply(s)) => Shown::Listed(s.key.to_string(), s.label),
            Ok(Event::InitDone) => Shown::Done,
            Ok(Event::Apply(s)) => Shown::Applied(s.key.to_string(), s.label),
            Ok(Event::Delete(s)) => Shown::Deleted(s.key.to_string(), s.label),
            Err(_) => Shown::Failed,
        }
    }

    /// kube-runtime's metadata watcher, read as the coordinator read it
    /// before it had a watch of its own: the reference.
    fn reference(api: Api<ConfigMap>, wc: watcher::Config) -> SeenEvents {
        use kube_client::ResourceExt;
        #[allow(deprecated)]
        let events = watcher::metadata_watcher(api, wc);
        let seen = |meta: kube_client::core::PartialObjectMeta<ConfigMap>| {
            let key = format!("{}/{}", meta.namespace().unwrap(), meta.name_any());
            let label = meta.labels().get(LABEL).cloned();
            Seen {
                key: key.into(),
                label,
            }
        };
        events
            .map(move |event| {
                event.map(|e| match e {
                    Event::Init => Event::Init,
                    Event::InitApply(m) => Event::InitApply(seen(m)),
                    Event::InitDone => Event::InitDone,
                    Event::Apply(m) => Event::Apply(seen(m)),
                    Event::Delete(m) => Event::Delete(seen(m)),
                })
            })
            .boxed()
    }

    /// Polls `events` on a task of its own (so that its watch opens while
    /// the test waits), handing each on.
    fn follow(mut events: SeenEvents) -> mpsc::UnboundedReceiver<Shown> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if tx.send(shown(event)).is_err() {
                    return;
                }
            }
        });
        rx
    }

    async fn take(rx: &mut mpsc::UnboundedReceiver<Shown>, n: usize) -> Vec<Shown> {
        let mut got = Vec::new();
        while got.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
            got.push(
                next.expect("an event within 10 s")
                    .expect("the watch goes on"),
            );
        }
        got
    }

    /// Both watches show `expected` next.
    async fn both_show(
        lean: &mut mpsc::UnboundedReceiver<Shown>,
        reference: &mut mpsc::UnboundedReceiver<Shown>,
        expected: Vec<Shown>,
    ) {
        assert_eq!(take(lean, expected.len()).await, expected, "the lean watch");
        assert_eq!(
            take(reference, expected.len()).await,
            expected,
            "the reference"
        );
    }

    fn cm(name: &str, label: Option<&str>) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        if let Some(label) = label {
            cm.metadata.labels = Some([(LABEL.to_owned(), label.to_owned())].into());
        }
        // Metadata the lean decoding skips: it must not get in the way.
        cm.metadata.annotations = Some([("note".to_owned(), "x".repeat(2000))].into());
        cm.data = Some([("payload".to_owned(), "y".repeat(1000))].into());
        cm
    }

    fn labelled(label: Option<&str>) -> Patch<serde_json::Value> {
        Patch::Merge(serde_json::json!({ "metadata": { "labels": { LABEL: label } } }))
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    /// The lean watch shows, event for event, what kube-runtime's metadata
    /// watcher shows over the same history: a list in pages, changes of
    /// the label, deletes, a watch that ends (resumed without a re-list)
    /// and a compaction (a 410, then a re-list).
    #[tokio::test]
    async fn the_lean_watch_shows_what_the_metadata_watcher_shows() {
        let server = LocalApiServer::start().await;
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
        let pp = PostParams::default();
        for (name, label) in [("a", Some("m1")), ("b", None), ("c", Some("m2"))] {
            api.create(&pp, &cm(name, label)).await.unwrap();
        }
        let wc = watcher::Config::default().page_size(2);
        let url = api.resource_url().to_owned();
        let mut lean = follow(seen_events(
            server.client(),
            &url,
            wc.clone(),
            LABEL.to_owned(),
        ));
        let mut reference = follow(reference(api.clone(), wc));

        let listed = vec![
            Shown::Init,
            Shown::Listed("default/a".into(), some("m1")),
            Shown::Listed("default/b".into(), None),
            Shown::Listed("default/c".into(), some("m2")),
            Shown::Done,
        ];
        both_show(&mut lean, &mut reference, listed).await;
        assert!(server.wait_for_watches(2, Duration::from_secs(10)).await);

        let ps = PatchParams::default();
        api.patch("b", &ps, &labelled(Some("m1"))).await.unwrap();
        api.patch("a", &ps, &labelled(Some("m2"))).await.unwrap();
        api.patch("c", &ps, &labelled(None)).await.unwrap();
        api.delete("a", &DeleteParams::default()).await.unwrap();
        api.create(&pp, &cm("d", None)).await.unwrap();
        let changes = vec![
            Shown::Applied("default/b".into(), some("m1")),
            Shown::Applied("default/a".into(), some("m2")),
            Shown::Applied("default/c".into(), None),
            Shown::Deleted("default/a".into(), some("m2")),
            Shown::Applied("default/d".into(), None),
        ];
        both_show(&mut lean, &mut reference, changes).await;

        // A watch that ends is resumed where it was: no re-list.
        server.close_watches();
        assert!(server.wait_for_watches(2, Duration::from_secs(10)).await);
        api.patch("d", &ps, &labelled(Some("m2"))).await.unwrap();
        let resumed = vec![Shown::Applied("default/d".into(), some("m2"))];
        both_show(&mut lean, &mut reference, resumed).await;

        // A compacted version: the error, then the whole list again.
        server.expire_watches();
        let relisted = vec![
            Shown::Failed,
            Shown::Init,
            Shown::Listed("default/b".into(), some("m1")),
            Shown::Listed("default/c".into(), None),
            Shown::Listed("default/d".into(), some("m2")),
            Shown::Done,
        ];
        both_show(&mut lean, &mut reference, relisted).await;
    }
}
