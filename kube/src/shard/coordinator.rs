//! The coordinator of a group with split caches: the one member, elected
//! through a Lease of its own, that labels every object of the sharded
//! kind with its owner.
//!
//! Every member of the group runs for the coordinator's Lease. The one
//! that holds it watches the kind's metadata only (no object bodies, a few
//! hundred bytes an object) and queues each object whose label differs
//! from its owner under the member set its membership sees: new objects,
//! objects without the label or with a wrong one (edited by hand, or
//! naming a member that left), and, at each change of the member set,
//! every object that changes owner. A queue of its own (this crate's
//! `WorkQueue`: one entry per object however often it changed, a token
//! bucket for the rate, a per-object backoff for failures) feeds a few
//! writers, which look again before writing, so a write is never made for
//! a label that is right by then. Each write is a merge patch of the label
//! alone. Objects without a label go first: a new object is in no cache
//! until labelled, and must not wait behind the thousands of objects a
//! change of members moves (a quarter of them when a fourth member joins,
//! at 200 writes a second by default).
//!
//! A coordinator that loses its Lease stops writing when its elector says
//! so; writes it made late are harmless (the label only places the object
//! in a cache, and the next coordinator corrects any that is wrong). One
//! that dies is replaced when its Lease expires; objects created meanwhile
//! are labelled by the next one, and wait in no cache until then.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use kube_client::api::{Patch, PatchParams};
use kube_client::{Api, Resource, ResourceExt};

use kube_runtime::WatchStreamExt;
use kube_runtime::watcher::{self, Event};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tokio_workqueue::{AddOpts, TokenBucket, WorkQueue};

use super::ShardConfig;
use super::labels::{LABEL_MANAGER, label_key, relabel};
use super::protocol::View;
use super::ring::Members;
use crate::leader::LeaderElection;
use crate::lease::WallClock;

/// Counts the label writes a replica made as coordinator: for
/// [`Shards::label_patches`](super::Shards::label_patches) and, if given,
/// the shard metrics.
#[derive(Clone, Default)]
pub(crate) struct PatchCount(Arc<Patches>);

#[derive(Default)]
struct Patches {
    count: AtomicU64,
    #[cfg(feature = "prometheus")]
    metrics: Option<super::ShardMetrics>,
}

impl PatchCount {
    /// A count also reported in `metrics`.
    #[cfg(feature = "prometheus")]
    pub(crate) fn with_metrics(metrics: super::ShardMetrics) -> Self {
        PatchCount(Arc::new(Patches {
            count: AtomicU64::new(0),
            metrics: Some(metrics),
        }))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }

    fn add(&self, _group: &str) {
        self.0.count.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "prometheus")]
        if let Some(m) = &self.0.metrics {
            m.patched(_group);
        }
    }
}

/// How many label writes are in flight at once.
const WRITERS: usize = 4;

/// The queue priority of an object without a label (new, or its label
/// removed): before objects that move between members (priority 0).
const UNLABELLED: i32 = 1;

/// An object, as the controller keys it: `namespace/name`, or `name` for
/// a cluster-scoped one (neither part can hold a `/`). One allocation per
/// object: the coordinator keeps one for every object of the kind.
type ObjectKey = Arc<str>;

/// The namespace and name of `key`.
fn parts(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// Every object's current shard label (labels are interned: they are a
/// few member names), and the members to give objects to.
#[derive(Default)]
struct Book {
    labels: HashMap<ObjectKey, Option<Arc<str>>>,
    /// Every label value seen, once.
    values: std::collections::HashSet<Arc<str>>,
    members: Members,
}

impl Book {
    /// The owner to write on `key`, if its label is wrong.
    fn wrong(&self, key: &str) -> Option<&str> {
        self.wrong_and_unlabelled(key).map(|(owner, _)| owner)
    }

    /// The owner to write on `key`, if its label is wrong, and whether it
    /// has no label at all.
    fn wrong_and_unlabelled(&self, key: &str) -> Option<(&str, bool)> {
        let current = self.labels.get(key)?;
        let (ns, name) = parts(key);
        relabel(&self.members, ns, name, current.as_deref()).map(|o| (o, current.is_none()))
    }

    /// Queues `object` if its label is wrong: objects without a label
    /// first.
    fn queue_if_wrong(&self, object: &ObjectKey, queue: &WorkQueue<ObjectKey>) {
        let Some((_, unlabelled)) = self.wrong_and_unlabelled(object) else {
            return;
        };
        let priority = if unlabelled { UNLABELLED } else { 0 };
        // Refused only once the queue shuts down with the coordinator.
        let _ = queue.add_with(object.clone(), AddOpts::new().priority(priority));
    }

    /// Queues every object whose label is wrong (after the list, or under
    /// new members).
    fn queue_wrong(&self, queue: &WorkQueue<ObjectKey>) {
        for object in self.labels.keys() {
            self.queue_if_wrong(object, queue);
        }
    }

    /// `meta`'s key, and its label under `label_key` interned.
    fn entry<K: Resource>(
        &mut self,
        meta: &kube_client::core::PartialObjectMeta<K>,
        label_key: &str,
    ) -> (ObjectKey, Option<Arc<str>>) {
        let name = meta.name_any();
        let key: ObjectKey = match meta.namespace() {
            Some(ns) => format!("{ns}/{name}").into(),
            None => name.into(),
        };
        let label = meta.labels().get(label_key).map(|v| {
            if let Some(v) = self.values.get(v.as_str()) {
                return v.clone();
            }
            let v: Arc<str> = v.as_str().into();
            self.values.insert(v.clone());
            v
        });
        (key, label)
    }
}

/// A running candidacy: dropped, it stops at once (its Lease, if held,
/// expires as after a crash); [`leave`](Self::leave) releases the Lease.
pub(crate) struct Coordinating {
    task: AbortOnDropHandle<()>,
    stop: CancellationToken,
}

impl Coordinating {
    /// Stops labelling and releases the coordinator's Lease if held.
    pub(crate) async fn leave(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

/// A member's candidacy for its group's coordinator: started with the
/// membership, stopped (its task aborted) with the controller.
pub(crate) struct Coordinator<K: Resource> {
    api: Api<K>,
    /// The controller's selection, without its own share's label.
    wc: watcher::Config,
    dyntype: K::DynamicType,
    config: ShardConfig,
    clock: WallClock,
    patches: PatchCount,
}

impl<K> Coordinator<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
{
    /// A candidate watching and labelling the objects of `api` that `wc`
    /// selects (the controller's own API and selection, whatever its
    /// namespace) for `config`'s group; `patches` counts the label writes
    /// that succeeded.
    pub(crate) fn new(
        api: Api<K>,
        wc: watcher::Config,
        dyntype: K::DynamicType,
        config: ShardConfig,
        clock: WallClock,
        patches: PatchCount,
    ) -> Self {
        Coordinator {
            api,
            wc,
            dyntype,
            config,
            clock,
            patches,
        }
    }

    /// Runs for the coordinator's Lease on a task, giving objects to the
    /// members `view` shows while it holds it. The task stops when the
    /// handle is dropped (its Lease left to expire, as after a crash) or
    /// left (the Lease released).
    pub(crate) fn start(self, view: watch::Receiver<Arc<View>>) -> Coordinating {
        let stop = CancellationToken::new();
        Coordinating {
            task: AbortOnDropHandle::new(tokio::spawn(self.run(view, stop.clone()))),
            stop,
        }
    }

    async fn run(self, view: watch::Receiver<Arc<View>>, stop: CancellationToken) {
        let clock = self.clock.clone();
        let election = LeaderElection::new(
            self.api.clone().into_client(),
            self.config.coordinator_lease(),
        )
        .wall_clock(move || clock());
        let elector = match election.start() {
            Ok(elector) => elector,
            // Validated with the shard config: cannot happen.
            Err(error) => {
                tracing::error!(%error, "shard coordinator not started");
                return;
            }
        };
        let mut state = elector.state();
        let lead = async {
            loop {
                if state.wait_for(|s| s.is_leading()).await.is_err() {
                    return;
                }
                tracing::info!(group = self.config.group(), "coordinating the shard labels");
                tokio::select! {
                    () = self.label(view.clone()) => return,
                    _ = state.wait_for(|s| !s.is_leading()) => {
                        tracing::info!(group = self.config.group(), "no longer coordinating the shard labels");
                    }
                }
            }
        };
        tokio::select! {
            () = stop.cancelled() => {}
            () = lead => {}
        }
        // Released, so that the next coordinator need not wait a lease
        // duration.
        if let Err(error) = elector.release().await {
            tracing::warn!(%error, "shard coordinator: Lease not released");
        }
    }

    /// Merge-patches `object`'s metadata.
    async fn patch(
        &self,
        object: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube_client::Error> {
        // The controller's API may be of all namespaces: the object's own
        // namespace goes into the path.
        let (ns, name) = parts(object);
        let url = K::url_path(&self.dyntype, ns);
        let request = kube_client::core::Request::new(url)
            .patch_metadata(
                name,
                &PatchParams {
                    field_manager: Some(LABEL_MANAGER.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(patch),
            )
            .map_err(kube_client::Error::BuildRequest)?;
        // The answer is the object's metadata, managedFields and all: not
        // decoded (nothing of it is needed), which spares the coordinator
        // most of each write's allocations.
        self.api
            .clone()
            .into_client()
            .request::<serde::de::IgnoredAny>(request)
            .await
            .map(drop)
    }

    /// Labels objects for as long as it is polled (or until the membership
    /// goes away).
    async fn label(&self, mut view: watch::Receiver<Arc<View>>) {
        let rate = self.config.splits_cache().unwrap_or_default();
        let bucket = TokenBucket::new(rate.per_second, rate.burst)
            .expect("the label rate is validated with the shard config");
        let queue: WorkQueue<ObjectKey> = WorkQueue::builder().throttle(bucket).build();
        let book = Arc::new(Mutex::new(Book::default()));
        let key = label_key(self.config.group());

        let follow_members = {
            let (book, queue) = (book.clone(), queue.clone());
            async move {
                loop {
                    let members = view.borrow_and_update().members.clone();
                    {
                        let mut book = book.lock();
                        if book.members != members {
                            book.members = members;
                            book.queue_wrong(&queue);
                        }
                    }
                    if view.changed().await.is_err() {
                        return;
                    }
                }
            }
        };

        let follow_objects = {
            let (book, queue, key) = (book.clone(), queue.clone(), key.clone());
            let mut fresh: Option<HashMap<ObjectKey, Option<Arc<str>>>> = None;
            #[allow(deprecated)]
            let events = watcher::metadata_watcher(self.api.clone(), self.wc.clone());
            events.default_backoff().for_each(move |event| {
                let mut book = book.lock();
                match event {
                    Ok(Event::Init) => fresh = Some(HashMap::new()),
                    Ok(Event::InitApply(meta)) => {
                        let (object, label) = book.entry(&meta, &key);
                        fresh.get_or_insert_default().insert(object, label);
                    }
                    Ok(Event::InitDone) => {
                        book.labels = fresh.take().unwrap_or_default();
                        book.queue_wrong(&queue);
                    }
                    Ok(Event::Apply(meta)) => {
                        let (object, label) = book.entry(&meta, &key);
                        book.labels.insert(object.clone(), label);
                        book.queue_if_wrong(&object, &queue);
                    }
                    Ok(Event::Delete(meta)) => {
                        let (object, _) = book.entry(&meta, &key);
                        book.labels.remove(&object);
                    }
                    Err(error) => {
                        tracing::warn!(%error, "shard coordinator: watch failed; retrying");
                    }
                }
                futures_util::future::ready(())
            })
        };

        let write = queue.clone().for_each_concurrent(WRITERS, |item| {
            let book = book.clone();
            let key = key.clone();
            async move {
                let object = item.key().clone();
                // Looked at again now: the label may have been put right, or
                // the member set changed, since the object was queued.
                let Some(patch) = book
                    .lock()
                    .wrong(&object)
                    .map(|owner| serde_json::json!({ "metadata": { "labels": { key: owner } } }))
                else {
                    item.forget();
                    return;
                };
                match self.patch(&object, &patch).await {
                    Ok(_) => {
                        self.patches.add(self.config.group());
                        item.forget();
                    }
                    // Deleted since: its delete event takes it out of the book.
                    Err(kube_client::Error::Api(status)) if status.code == 404 => item.forget(),
                    Err(error) => {
                        tracing::warn!(%error, %object, "shard coordinator: label not written; retrying");
                        let _ = item.requeue_rate_limited();
                    }
                }
            }
        });

        tokio::select! {
            () = follow_members => {}
            () = follow_objects => {}
            () = write => {}
        }
        queue.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::owner;

    #[test]
    fn the_book_names_the_owner_of_each_wrongly_labelled_object() {
        assert_eq!(parts("default/cm-1"), (Some("default"), "cm-1"));
        assert_eq!(parts("node-1"), (None, "node-1"));
        let ids = ["a", "b", "c"];
        let mut book = Book {
            members: Members::new(ids),
            ..Book::default()
        };
        for key in ["default/cm-1", "default/cm-2", "node-1"] {
            book.labels.insert(key.into(), Some("gone".into()));
            let want = owner(key, &ids).unwrap();
            assert_eq!(book.wrong(key), Some(want));
            book.labels.insert(key.into(), Some(want.into()));
            assert_eq!(book.wrong(key), None);
        }
        // Not in the book (deleted): nothing to write.
        assert_eq!(book.wrong("default/elsewhere"), None);
    }

    #[tokio::test]
    async fn objects_without_a_label_are_written_before_objects_that_move() {
        use futures_util::StreamExt;

        let ids = ["a", "b", "c"];
        let mut book = Book {
            members: Members::new(ids),
            ..Book::default()
        };
        for i in 0..100 {
            book.labels
                .insert(format!("default/moving-{i}").into(), Some("gone".into()));
        }
        let right: ObjectKey = "default/right".into();
        let owner = owner(&right, &ids).unwrap();
        book.labels.insert(right.clone(), Some(owner.into()));
        let queue: WorkQueue<ObjectKey> = WorkQueue::new();
        book.queue_wrong(&queue);
        assert_eq!(queue.len(), 100, "a right label is not queued");
        let new: ObjectKey = "default/new".into();
        book.labels.insert(new.clone(), None);
        book.queue_if_wrong(&new, &queue);
        let mut queue = queue;
        let first = queue.next().await.expect("queued objects");
        assert_eq!(first.key(), &new);
        let second = queue.next().await.expect("queued objects");
        assert!(second.key().starts_with("default/moving-"));
    }
}
