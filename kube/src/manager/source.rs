//! One watch and one reflector store per distinct source, shared by every
//! controller of a [`Manager`](super::Manager) that uses it.
//!
//! A source is identified by what the API server would send: the object
//! type, the resource URL (kind and namespace) and the watch's label and
//! field selectors. Its task applies each event to the store first and
//! then hands it to every subscriber, so a subscriber that reacts to an
//! event reads the store at least as new as the event.
//!
//! Subscribers get a list (`Init`, one `InitApply` per object in the API
//! server's order, `InitDone`) only once it is complete, from the store
//! just swapped in, and a live
//! change as the store's own copy of the object. The store keeps a copy of
//! every object it is given (kube-runtime's `Writer` clones), so handing
//! subscribers the watch's decoded objects instead would keep a second
//! copy of each alive until every subscriber has taken it: during an
//! initial list, where subscribers fall behind, nearly a second cache.
//!
//! A subscriber that joins after the source started does not miss the
//! objects already listed: under the same lock that orders the live events
//! it is handed the store's contents as a list, then the live events that
//! follow. One that joins before the first list or while a list is in
//! progress gets that list at its end, as everyone does.
//!
//! A list goes down every subscriber's channel as one message, the same
//! one for all of them (the objects' handles in the API server's order),
//! and each [`Subscription`] unrolls it into `Init`, the `InitApply`s and
//! `InitDone` as it is read. Sent as events, a list of 10,000 objects cost
//! each subscriber 10,000 messages of the channel, an allocation each,
//! made at once when the list ended and freed as the controller caught up.

use std::any::{Any, TypeId};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_client::Resource;
use kube_runtime::reflector::store::Writer;
use kube_runtime::reflector::{Lookup, Store};
use kube_runtime::watcher::{self, Event};
use parking_lot::Mutex;

/// An event as a subscriber receives it: the object is shared, one copy
/// whatever the number of subscribers.
pub(crate) type SharedEvent<K> = Result<Event<SharedObject<K>>, watcher::Error>;

/// An event as the watch sends it.
type WatchEvent<K> = Result<Event<K>, watcher::Error>;

/// A list's objects in the API server's order, shared by every subscriber
/// it is sent to (the store's `Vec` as it is, not copied into a slice).
type Listed<K> = Arc<Vec<Arc<K>>>;

/// What goes down a subscriber's channel.
enum Fanned<K> {
    /// A live event (or a watch error).
    Event(SharedEvent<K>),
    /// A whole list, read as `Init`, one `InitApply` per object, `InitDone`.
    List(Listed<K>),
}

/// A subscriber's events: what the source sends it, with each list
/// unrolled into its events as they are read.
pub(crate) struct Subscription<K> {
    rx: UnboundedReceiver<Fanned<K>>,
    /// The list being read, and the next of its objects to hand out.
    list: Option<(Listed<K>, usize)>,
}

impl<K> futures_core::Stream for Subscription<K> {
    type Item = SharedEvent<K>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SharedEvent<K>>> {
        let this = &mut *self;
        if let Some((objects, next)) = &mut this.list {
            let event = match objects.get(*next) {
                Some(object) => {
                    *next += 1;
                    Event::InitApply(SharedObject(object.clone()))
                }
                None => {
                    this.list = None;
                    Event::InitDone
                }
            };
            return Poll::Ready(Some(Ok(event)));
        }
        Poll::Ready(match ready!(this.rx.poll_next_unpin(cx)) {
            None => None,
            Some(Fanned::Event(event)) => Some(event),
            Some(Fanned::List(objects)) => {
                this.list = Some((objects, 0));
                Some(Ok(Event::Init))
            }
        })
    }
}

/// An object every subscriber of a source shares, read through `Resource`
/// as the object itself (triggers only read it).
#[derive(Debug)]
pub(crate) struct SharedObject<K>(pub(crate) Arc<K>);

impl<K> Clone for SharedObject<K> {
    fn clone(&self) -> Self {
        SharedObject(self.0.clone())
    }
}

impl<K: Resource + Clone> Resource for SharedObject<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn metadata_api() -> bool {
        K::metadata_api()
    }
    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    /// Copies the object first if another subscriber shares it.
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        Arc::make_mut(&mut self.0).meta_mut()
    }
}

/// What the API server would send for one watch: the same identity means
/// one watch and one store.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct SourceId {
    pub(crate) type_id: TypeId,
    pub(crate) url: String,
    pub(crate) labels: Option<String>,
    pub(crate) fields: Option<String>,
}

impl fmt::Debug for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.url)?;
        if let Some(labels) = &self.labels {
            write!(f, " labels={labels}")?;
        }
        if let Some(fields) = &self.fields {
            write!(f, " fields={fields}")?;
        }
        Ok(())
    }
}

impl SourceId {
    pub(crate) fn new<T: 'static>(url: &str, wc: &watcher::Config) -> Self {
        SourceId {
            type_id: TypeId::of::<T>(),
            url: url.to_owned(),
            labels: wc.label_selector.clone(),
            fields: wc.field_selector.clone(),
        }
    }
}

/// One shared watch: its store, its subscribers, and the watch itself until
/// the manager starts it.
pub(crate) struct Source<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    dyntype: K::DynamicType,
    inner: Mutex<Inner<K>>,
}

struct Inner<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    subscribers: Vec<UnboundedSender<Fanned<K>>>,
    /// Taken when the source starts.
    pending: Option<Pending<K>>,
    /// Whether a list is in progress: its end replays the store to every
    /// subscriber.
    listing: bool,
    /// Whether a first list was applied (the store is complete).
    ready: bool,
}

struct Pending<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    events: futures_util::stream::BoxStream<'static, WatchEvent<K>>,
}

impl<K> Source<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// A source that will run `events` (a watcher) when the manager runs.
    pub(crate) fn new(
        events: impl futures_core::Stream<Item = WatchEvent<K>> + Send + 'static,
        dyntype: K::DynamicType,
    ) -> Self {
        let writer = Writer::<K>::new(dyntype.clone());
        Source {
            store: writer.as_reader(),
            dyntype,
            inner: Mutex::new(Inner {
                subscribers: Vec::new(),
                pending: Some(Pending {
                    writer,
                    events: events.boxed(),
                }),
                listing: false,
                ready: false,
            }),
        }
    }
}

impl<K> Source<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A stream of this source's events from now on, preceded by what it
    /// listed so far (see the module docs).
    pub(crate) fn subscribe(&self) -> Subscription<K> {
        let (tx, rx) = unbounded();
        let mut inner = self.inner.lock();
        // The store only changes under this lock, so the replay and the
        // live events that follow neither overlap nor leave a gap. During a
        // list, the list's end replays the store to every subscriber.
        if inner.ready && !inner.listing {
            replay(&listed(&self.store), &tx);
        }
        inner.subscribers.push(tx);
        Subscription { rx, list: None }
    }

    /// The future that runs the watch: apply, then fan out. `None` if it
    /// was started already.
    pub(crate) fn start(self: &Arc<Self>) -> Option<BoxFuture<'static, ()>> {
        let Pending { mut writer, events } = self.inner.lock().pending.take()?;
        let this = self.clone();
        Some(
            async move {
                let mut events = events;
                while let Some(event) = events.next().await {
                    let mut inner = this.inner.lock();
                    let event = match event {
                        Ok(event) => {
                            writer.apply_watcher_event(&event);
                            match event {
                                Event::Init => {
                                    inner.listing = true;
                                    continue;
                                }
                                // Handed over from the store at the list's end.
                                Event::InitApply(_) => continue,
                                Event::InitDone => {
                                    inner.listing = false;
                                    inner.ready = true;
                                    let objects = listed(&this.store);
                                    inner.subscribers.retain(|tx| replay(&objects, tx));
                                    continue;
                                }
                                Event::Apply(object) => {
                                    // The store's copy; the watch's is dropped here.
                                    let key = object.to_object_ref(this.dyntype.clone());
                                    let object =
                                        this.store.get(&key).unwrap_or_else(|| Arc::new(object));
                                    Ok(Event::Apply(SharedObject(object)))
                                }
                                Event::Delete(object) => {
                                    Ok(Event::Delete(SharedObject(Arc::new(object))))
                                }
                            }
                        }
                        Err(error) => Err(error),
                    };
                    inner.subscribers.retain(|tx| {
                        tx.unbounded_send(Fanned::Event(clone_event(&event)))
                            .is_ok()
                    });
                }
            }
            .boxed(),
        )
    }

    /// Whether a first list has been applied.
    pub(crate) fn is_ready(&self) -> bool {
        self.inner.lock().ready
    }
}

/// Sends the store's contents as one list; `false` if the subscriber is
/// gone.
fn replay<K>(objects: &Listed<K>, tx: &UnboundedSender<Fanned<K>>) -> bool {
    tx.unbounded_send(Fanned::List(objects.clone())).is_ok()
}

/// The store's objects in the order the API server lists them (by
/// namespace, then name), so that a list reaches subscribers, and their
/// first reconciles come, in the order a watch of their own would give.
fn listed<K: Lookup + Clone + 'static>(store: &Store<K>) -> Listed<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    let mut objects = store.state();
    objects.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
    Arc::new(objects)
}

fn clone_event<K>(event: &SharedEvent<K>) -> SharedEvent<K> {
    match event {
        Ok(event) => Ok(event.clone()),
        // watcher::Error is not Clone: subscribers see that an error
        // happened (the watcher retries on its own); the text is kept.
        Err(error) => Err(watcher::Error::WatchError(Box::new(
            kube_client::core::Status::failure(&error.to_string(), "SharedWatchError"),
        ))),
    }
}

/// Type-erased sources, by identity.
#[derive(Default)]
pub(crate) struct Sources {
    by_id: HashMap<SourceId, Arc<dyn Any + Send + Sync>>,
    /// Start futures and readiness checks, in creation order.
    started: Vec<Box<dyn AnySource>>,
}

/// What the manager asks of every source whatever its type.
pub(crate) trait AnySource: Send + Sync {
    fn id(&self) -> &SourceId;
    /// The watch's future, the first time.
    fn start(&self) -> Option<BoxFuture<'static, ()>>;
    /// Resolves once the first list was applied.
    fn ready(&self) -> BoxFuture<'static, ()>;
    /// `/readyz`'s check: what is missing, or `None`.
    fn readiness(&self) -> super::health::Check;
}

struct Typed<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    id: SourceId,
    source: Arc<Source<K>>,
}

impl<K> AnySource for Typed<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn id(&self) -> &SourceId {
        &self.id
    }
    fn start(&self) -> Option<BoxFuture<'static, ()>> {
        self.source.start()
    }
    fn ready(&self) -> BoxFuture<'static, ()> {
        let store = self.source.store();
        async move {
            // Err only if the writer was dropped: the watch ended, and the
            // manager is stopping anyway.
            let _ = store.wait_until_ready().await;
        }
        .boxed()
    }
    fn readiness(&self) -> super::health::Check {
        let source = self.source.clone();
        let id = format!("{:?}", self.id);
        Box::new(move || (!source.is_ready()).then(|| format!("cache {id} has not synced")))
    }
}

impl Sources {
    /// The source with `id`, made by `make` the first time.
    pub(crate) fn get_or_insert<K>(
        &mut self,
        id: SourceId,
        make: impl FnOnce() -> Source<K>,
    ) -> Arc<Source<K>>
    where
        K: Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        if let Some(existing) = self.by_id.get(&id) {
            return existing
                .clone()
                .downcast::<Source<K>>()
                .expect("a source's identity includes its type");
        }
        let source = Arc::new(make());
        self.by_id.insert(id.clone(), source.clone());
        self.started.push(Box::new(Typed {
            id,
            source: source.clone(),
        }));
        source
    }

    pub(crate) fn all(&self) -> &[Box<dyn AnySource>] {
        &self.started
    }
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.started.iter().map(|s| s.id()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_channel::mpsc;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::ResourceExt;
    use kube_runtime::reflector::ObjectRef;

    fn cm(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("default".into());
        cm
    }

    /// What a subscriber received so far, as short strings.
    fn drain(rx: &mut Subscription<ConfigMap>) -> Vec<String> {
        let mut seen = Vec::new();
        for event in received(rx) {
            seen.push(match event.unwrap() {
                Event::Init => "init".to_owned(),
                Event::InitApply(o) => format!("list {}", o.name_any()),
                Event::InitDone => "done".to_owned(),
                Event::Apply(o) => format!("apply {}", o.name_any()),
                Event::Delete(o) => format!("delete {}", o.name_any()),
            });
        }
        seen
    }

    /// The events a subscriber can read now.
    fn received(rx: &mut Subscription<ConfigMap>) -> Vec<SharedEvent<ConfigMap>> {
        std::iter::from_fn(|| rx.next().now_or_never().flatten()).collect()
    }

    /// A source fed by hand, and its running task.
    fn source() -> (
        Arc<Source<ConfigMap>>,
        mpsc::UnboundedSender<WatchEvent<ConfigMap>>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded();
        let source = Arc::new(Source::new(rx, ()));
        let task = tokio::spawn(source.start().unwrap());
        (source, tx, task)
    }

    async fn send(tx: &mpsc::UnboundedSender<WatchEvent<ConfigMap>>, event: Event<ConfigMap>) {
        tx.unbounded_send(Ok(event)).unwrap();
        // The source's task applies it before the test looks.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn early_late_and_mid_list_subscribers_all_see_every_object_once_listed() {
        let (source, tx, task) = source();
        let mut early = source.subscribe();
        assert!(source.start().is_none(), "a source starts once");
        send(&tx, Event::Init).await;
        send(&tx, Event::InitApply(cm("a"))).await;
        // Joins while the list is in progress: gets the whole list at its end.
        let mut mid = source.subscribe();
        send(&tx, Event::InitApply(cm("b"))).await;
        assert!(!source.is_ready());
        assert!(drain(&mut mid).is_empty());
        // Nobody gets a list before it is complete: the store hands it
        // over, so the watch's copies are not kept for subscribers.
        let got = received(&mut early);
        assert!(got.is_empty(), "{} events before the list ended", got.len());
        send(&tx, Event::InitDone).await;
        assert!(source.is_ready());
        // Joins after: the store as a list, then live events.
        let mut late = source.subscribe();
        send(&tx, Event::Apply(cm("c"))).await;

        // In the API server's order (by namespace and name), whatever the
        // store's.
        for rx in [&mut early, &mut mid, &mut late] {
            assert_eq!(drain(rx), ["init", "list a", "list b", "done", "apply c"]);
        }
        assert_eq!(source.store().state().len(), 3);
        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_list_reaches_subscribers_in_the_api_server_s_order() {
        let (source, tx, task) = source();
        let mut rx = source.subscribe();
        send(&tx, Event::Init).await;
        let names: Vec<String> = (0..40).map(|i| format!("cm-{i:02}")).collect();
        for name in names.iter().rev() {
            send(&tx, Event::InitApply(cm(name))).await;
        }
        send(&tx, Event::InitDone).await;
        let got = drain(&mut rx);
        let listed: Vec<String> = names.iter().map(|n| format!("list {n}")).collect();
        assert_eq!(got[1..got.len() - 1], listed);
        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test]
    async fn subscribers_share_the_store_s_copy_of_a_listed_or_changed_object() {
        let (source, tx, task) = source();
        let mut rx = source.subscribe();
        send(&tx, Event::Init).await;
        send(&tx, Event::InitApply(cm("a"))).await;
        send(&tx, Event::InitDone).await;
        send(&tx, Event::Apply(cm("b"))).await;
        let store = source.store();
        let mut shared = 0;
        for event in received(&mut rx) {
            if let Ok(Event::InitApply(o) | Event::Apply(o)) = event {
                let key = ObjectRef::from_obj(&*o.0);
                assert!(Arc::ptr_eq(&o.0, &store.get(&key).unwrap()), "{key} copied");
                shared += 1;
            }
        }
        assert_eq!(shared, 2);
        drop(tx);
        task.await.unwrap();
    }

    #[test]
    fn sources_are_one_per_identity() {
        let mut sources = Sources::default();
        let wc = watcher::Config::default();
        let id = |url: &str, wc: &watcher::Config| SourceId::new::<ConfigMap>(url, wc);
        let make = || Source::<ConfigMap>::new(futures_util::stream::empty(), ());
        let a = sources.get_or_insert(id("/api/v1/configmaps", &wc), make);
        let b = sources.get_or_insert(id("/api/v1/configmaps", &wc), make);
        assert!(Arc::ptr_eq(&a, &b));
        let labelled = wc.clone().labels("app=x");
        let c = sources.get_or_insert(id("/api/v1/configmaps", &labelled), make);
        let d = sources.get_or_insert(id("/api/v1/namespaces/x/configmaps", &wc), make);
        assert!(!Arc::ptr_eq(&a, &c) && !Arc::ptr_eq(&a, &d));
        assert_eq!(sources.all().len(), 3);
    }
}
