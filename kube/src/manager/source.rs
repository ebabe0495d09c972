//! One watch and one reflector store per distinct source, shared by every
//! controller of a [`Manager`](super::Manager) that uses it.
//!
//! A source is identified by what the API server would send: the object
//! type, the resource URL (kind and namespace) and the watch's label and
//! field selectors. Its task applies each event to the store first and
//! then hands it to every subscriber, so a subscriber that reacts to an
//! event reads the store at least as new as the event.
//!
//! A subscriber that joins after the source started does not miss the
//! objects already listed: under the same lock that orders the live events
//! it is handed the store's contents as a list (`Init`, one `InitApply` per
//! object, `InitDone`), or, while a list is in progress, that list's
//! objects so far, and then the live events that follow.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use kube_runtime::reflector::store::Writer;
use kube_runtime::reflector::{Lookup, Store};
use kube_runtime::watcher::{self, Event};
use parking_lot::Mutex;

/// An event as a subscriber receives it.
pub(crate) type SharedEvent<K> = Result<Event<K>, watcher::Error>;

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
    inner: Mutex<Inner<K>>,
}

struct Inner<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    subscribers: Vec<UnboundedSender<SharedEvent<K>>>,
    /// Taken when the source starts.
    pending: Option<Pending<K>>,
    /// The objects of the list in progress, for subscribers that join
    /// during it.
    listing: Option<Vec<K>>,
    /// Whether a first list was applied (the store is complete).
    ready: bool,
}

struct Pending<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    events: futures_util::stream::BoxStream<'static, SharedEvent<K>>,
}

impl<K> Source<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// A source that will run `events` (a watcher) when the manager runs.
    pub(crate) fn new(
        events: impl futures_core::Stream<Item = SharedEvent<K>> + Send + 'static,
        dyntype: K::DynamicType,
    ) -> Self {
        let writer = Writer::<K>::new(dyntype);
        Source {
            store: writer.as_reader(),
            inner: Mutex::new(Inner {
                subscribers: Vec::new(),
                pending: Some(Pending {
                    writer,
                    events: events.boxed(),
                }),
                listing: None,
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
    pub(crate) fn subscribe(&self) -> UnboundedReceiver<SharedEvent<K>> {
        let (tx, rx) = unbounded();
        let mut inner = self.inner.lock();
        // The store and `listing` only change under this lock, so the replay
        // and the live events that follow neither overlap nor leave a gap.
        if let Some(listed) = &inner.listing {
            let _ = tx.unbounded_send(Ok(Event::Init));
            for object in listed {
                let _ = tx.unbounded_send(Ok(Event::InitApply(object.clone())));
            }
        } else if inner.ready {
            let _ = tx.unbounded_send(Ok(Event::Init));
            for object in self.store.state() {
                let _ = tx.unbounded_send(Ok(Event::InitApply((*object).clone())));
            }
            let _ = tx.unbounded_send(Ok(Event::InitDone));
        }
        inner.subscribers.push(tx);
        rx
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
                    if let Ok(event) = &event {
                        writer.apply_watcher_event(event);
                        match event {
                            Event::Init => inner.listing = Some(Vec::new()),
                            Event::InitApply(object) => {
                                if let Some(listed) = &mut inner.listing {
                                    listed.push(object.clone());
                                }
                            }
                            Event::InitDone => {
                                inner.listing = None;
                                inner.ready = true;
                            }
                            Event::Apply(_) | Event::Delete(_) => {}
                        }
                    }
                    inner
                        .subscribers
                        .retain(|tx| tx.unbounded_send(clone_event(&event)).is_ok());
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

fn clone_event<K: Clone>(event: &SharedEvent<K>) -> SharedEvent<K> {
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
