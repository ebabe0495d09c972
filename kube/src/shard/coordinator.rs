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
use kube_client::{Api, Client, Resource};

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
use super::seen_watch::{SeenEvents, seen_events};
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

/// What the coordinator's queue holds: an object, and its kind's place
/// among the kinds labelled.
type Queued = (usize, ObjectKey);

/// The namespace and name of `key`.
fn parts(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

/// The path of a kind's objects in a namespace (`None`: cluster-scoped).
type UrlOf = Box<dyn Fn(Option<&str>) -> String + Send + Sync>;

/// A kind whose objects the coordinator labels: the objects one
/// controller's API and watcher config select. Its type is erased, so
/// that one coordinator (one election, one rate, one queue) labels every
/// kind a manager's controllers split.
pub(crate) struct Kind {
    url: UrlOf,
    /// Starts a metadata watch, reading the label under the key given.
    watch: Box<dyn Fn(&str) -> SeenEvents + Send + Sync>,
}

impl Kind {
    /// The objects of `api` that `wc` selects (the controller's own API
    /// and selection, whatever its namespace).
    pub(crate) fn new<K>(api: Api<K>, wc: watcher::Config, dyntype: K::DynamicType) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Clone + Send + Sync + 'static,
    {
        Kind {
            url: Box::new(move |ns| K::url_path(&dyntype, ns)),
            watch: Box::new(move |label_key| {
                let (client, url) = (api.clone().into_client(), api.resource_url());
                seen_events(client, url, wc.clone(), label_key.to_owned())
                    .default_backoff()
                    .boxed()
            }),
        }
    }
}

/// Every object's current shard label, kind by kind (labels are
/// interned: they are a few member names), and the members to give
/// objects to.
#[derive(Default)]
struct Book {
    /// One map per kind, in the coordinator's order.
    labels: Vec<HashMap<ObjectKey, Option<Arc<str>>>>,
    /// Every label value seen, once.
    values: std::collections::HashSet<Arc<str>>,
    members: Members,
}

impl Book {
    /// A book of `kinds` kinds, none listed yet.
    fn new(kinds: usize) -> Self {
        Book {
            labels: (0..kinds).map(|_| HashMap::new()).collect(),
            ..Book::default()
        }
    }

    /// The owner to write on `key` of `kind`, if its label is wrong.
    fn wrong(&self, kind: usize, key: &str) -> Option<&str> {
        self.wrong_and_unlabelled(kind, key).map(|(owner, _)| owner)
    }

    /// The owner to write on `key` of `kind`, if its label is wrong, and
    /// whether it has no label at all.
    fn wrong_and_unlabelled(&self, kind: usize, key: &str) -> Option<(&str, bool)> {
        let current = self.labels[kind].get(key)?;
        let (ns, name) = parts(key);
        relabel(&self.members, ns, name, current.as_deref()).map(|o| (o, current.is_none()))
    }

    /// Queues `object` of `kind` if its label is wrong: objects without a
    /// label first.
    fn queue_if_wrong(&self, kind: usize, object: &ObjectKey, queue: &WorkQueue<Queued>) {
        let Some((_, unlabelled)) = self.wrong_and_unlabelled(kind, object) else {
            return;
        };
        let priority = if unlabelled { UNLABELLED } else { 0 };
        // Refused only once the queue shuts down with the coordinator.
        let _ = queue.add_with((kind, object.clone()), AddOpts::new().priority(priority));
    }

    /// Queues every object of `kind` whose label is wrong (after its
    /// list).
    fn queue_wrong(&self, kind: usize, queue: &WorkQueue<Queued>) {
        for object in self.labels[kind].keys() {
            self.queue_if_wrong(kind, object, queue);
        }
    }

    /// Queues every object of every kind whose label is wrong (under new
    /// members).
    fn queue_all_wrong(&self, queue: &WorkQueue<Queued>) {
        for kind in 0..self.labels.len() {
            self.queue_wrong(kind, queue);
        }
    }

    /// `label`, interned.
    fn intern(&mut self, label: Option<String>) -> Option<Arc<str>> {
        let label = label?;
        if let Some(v) = self.values.get(label.as_str()) {
            return Some(v.clone());
        }
        let v: Arc<str> = label.into();
        self.values.insert(v.clone());
        Some(v)
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
/// membership, stopped (its task aborted) with the controller, or with
/// the manager whose controllers split their caches.
pub(crate) struct Coordinator {
    client: Client,
    /// What it labels: at least one kind.
    kinds: Vec<Kind>,
    config: ShardConfig,
    clock: WallClock,
    patches: PatchCount,
}

impl Coordinator {
    /// A candidate labelling the objects of `kinds` for `config`'s group
    /// through `client`; `patches` counts the label writes that
    /// succeeded.
    pub(crate) fn new(
        client: Client,
        kinds: Vec<Kind>,
        config: ShardConfig,
        clock: WallClock,
        patches: PatchCount,
    ) -> Self {
        Coordinator {
            client,
            kinds,
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
        let election = LeaderElection::new(self.client.clone(), self.config.coordinator_lease())
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

    /// Merge-patches the metadata of `object` of `kind`.
    async fn patch(
        &self,
        kind: usize,
        object: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube_client::Error> {
        // The controller's API may be of all namespaces: the object's own
        // namespace goes into the path.
        let (ns, name) = parts(object);
        let request = kube_client::core::Request::new((self.kinds[kind].url)(ns))
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
        self.client
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
        // One queue for every kind: one rate for all the writes, and
        // objects without a label go first whatever their kind.
        let queue: WorkQueue<Queued> = WorkQueue::builder().throttle(bucket).build();
        let book = Arc::new(Mutex::new(Book::new(self.kinds.len())));
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
                            book.queue_all_wrong(&queue);
                        }
                    }
                    if view.changed().await.is_err() {
                        return;
                    }
                }
            }
        };

        let follow_objects = {
            let (book, queue) = (book.clone(), queue.clone());
            // Each kind's list in progress, kept apart until it is whole.
            let mut fresh: Vec<Option<HashMap<ObjectKey, Option<Arc<str>>>>> =
                self.kinds.iter().map(|_| None).collect();
            let events = futures_util::stream::select_all(
                self.kinds
                    .iter()
                    .enumerate()
                    .map(|(kind, k)| (k.watch)(&key).map(move |event| (kind, event))),
            );
            events.for_each(move |(kind, event)| {
                let mut book = book.lock();
                match event {
                    Ok(Event::Init) => fresh[kind] = Some(HashMap::new()),
                    Ok(Event::InitApply(seen)) => {
                        let label = book.intern(seen.label);
                        fresh[kind].get_or_insert_default().insert(seen.key, label);
                    }
                    Ok(Event::InitDone) => {
                        book.labels[kind] = fresh[kind].take().unwrap_or_default();
                        book.queue_wrong(kind, &queue);
                    }
                    Ok(Event::Apply(seen)) => {
                        let label = book.intern(seen.label);
                        book.labels[kind].insert(seen.key.clone(), label);
                        book.queue_if_wrong(kind, &seen.key, &queue);
                    }
                    Ok(Event::Delete(seen)) => {
                        book.labels[kind].remove(&seen.key);
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
                let (kind, object) = item.key().clone();
                // Looked at again now: the label may have been put right, or
                // the member set changed, since the object was queued.
                let Some(patch) = book
                    .lock()
                    .wrong(kind, &object)
                    .map(|owner| serde_json::json!({ "metadata": { "labels": { key: owner } } }))
                else {
                    item.forget();
                    return;
                };
                match self.patch(kind, &object, &patch).await {
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
            ..Book::new(2)
        };
        for key in ["default/cm-1", "default/cm-2", "node-1"] {
            book.labels[1].insert(key.into(), Some("gone".into()));
            let want = owner(key, &ids).unwrap();
            assert_eq!(book.wrong(1, key), Some(want));
            // Kinds are apart: the same key of the other kind is not in the book.
            assert_eq!(book.wrong(0, key), None);
            book.labels[1].insert(key.into(), Some(want.into()));
            assert_eq!(book.wrong(1, key), None);
        }
        // Not in the book (deleted): nothing to write.
        assert_eq!(book.wrong(1, "default/elsewhere"), None);
    }

    #[tokio::test]
    async fn objects_without_a_label_are_written_before_objects_that_move_whatever_their_kind() {
        use futures_util::StreamExt;

        let ids = ["a", "b", "c"];
        let mut book = Book {
            members: Members::new(ids),
            ..Book::new(2)
        };
        for i in 0..100 {
            book.labels[0].insert(format!("default/moving-{i}").into(), Some("gone".into()));
        }
        let right: ObjectKey = "default/right".into();
        let owner = owner(&right, &ids).unwrap();
        book.labels[0].insert(right.clone(), Some(owner.into()));
        let queue: WorkQueue<Queued> = WorkQueue::new();
        book.queue_all_wrong(&queue);
        assert_eq!(queue.len(), 100, "a right label is not queued");
        let new: ObjectKey = "default/new".into();
        book.labels[1].insert(new.clone(), None);
        book.queue_if_wrong(1, &new, &queue);
        let mut queue = queue;
        let first = queue.next().await.expect("queued objects");
        assert_eq!(first.key(), &(1, new));
        let second = queue.next().await.expect("queued objects");
        assert_eq!(second.key().0, 0);
        assert!(second.key().1.starts_with("default/moving-"));
    }
}
