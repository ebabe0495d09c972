//! From kube-runtime watcher events to queue adds.

use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio_workqueue::Key;

use futures_core::Stream;
use kube_client::Resource;
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher::{self, Event};

use super::triage::{Cause, Triage};
use tokio_workqueue::ordering::{Ordering, Priorities};
use tokio_workqueue::{AddError, AddOpts, Lane, WorkQueue};

/// The priorities a [`WatchAdapter`] adds keys with, one per [`Cause`].
///
/// The default puts the initial list and unchanged re-deliveries in the slow
/// lane ([`Lane::Slow`], -100, the value controller-runtime hard-codes) and
/// changes and deletions in the fast lane (0), so a fresh change overtakes
/// the bulk of a (re-)list. Any values work; equal values turn prioritising
/// off ([`WatchPriorities::uniform`]).
///
/// ```
/// use tokio_workqueue_kube::WatchPriorities;
///
/// let p = WatchPriorities { initial_list: -10, ..WatchPriorities::default() };
/// assert_eq!((p.initial_list, p.unchanged, p.changed, p.deleted), (-10, -100, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchPriorities {
    /// Objects of the first list, before the first `InitDone`
    /// ([`Cause::InitialList`]).
    pub initial_list: i32,
    /// Objects delivered again with the `resourceVersion` they had last time,
    /// as by a re-list ([`Cause::Unchanged`]).
    pub unchanged: i32,
    /// Objects added or modified since they were last seen
    /// ([`Cause::Changed`]).
    pub changed: i32,
    /// Deleted objects, and objects a re-list no longer shows
    /// ([`Cause::Deleted`], [`Cause::MissingAfterRelist`]).
    pub deleted: i32,
}

impl Default for WatchPriorities {
    fn default() -> Self {
        WatchPriorities {
            initial_list: Lane::Slow.priority(),
            unchanged: Lane::Slow.priority(),
            changed: Lane::Fast.priority(),
            deleted: Lane::Fast.priority(),
        }
    }
}

impl WatchPriorities {
    /// The same priority for every cause: no event overtakes another.
    pub const fn uniform(priority: i32) -> Self {
        WatchPriorities {
            initial_list: priority,
            unchanged: priority,
            changed: priority,
            deleted: priority,
        }
    }

    /// The priority for `cause`.
    pub const fn for_cause(&self, cause: Cause) -> i32 {
        match cause {
            Cause::InitialList => self.initial_list,
            Cause::Unchanged => self.unchanged,
            Cause::Changed => self.changed,
            Cause::Deleted | Cause::MissingAfterRelist => self.deleted,
        }
    }
}

/// One key a [`WatchAdapter`] added to its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued<K> {
    /// The key.
    pub key: K,
    /// The priority it was added with.
    pub priority: i32,
    /// Why it was added.
    pub cause: Cause,
}

/// What a [`WatchAdapter`] reports instead of an [`Enqueued`] key.
#[derive(Debug)]
#[non_exhaustive]
pub enum EnqueueError<K> {
    /// The watcher failed (list, watch or an `ERROR` event). The watcher
    /// retries on its own (give it a backoff with
    /// [`WatchStreamExt::default_backoff`](kube_runtime::WatchStreamExt::default_backoff)),
    /// so the adapter's stream goes on.
    Watcher(watcher::Error),
    /// The queue refused `key`, because it is shutting down. The adapter's
    /// stream ends after reporting this.
    Refused {
        /// The key that was not added.
        key: K,
        /// Why.
        error: AddError,
        /// Why the key was to be added.
        cause: Cause,
    },
}

impl<K> fmt::Display for EnqueueError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnqueueError::Watcher(e) => write!(f, "watcher error: {e}"),
            EnqueueError::Refused { error, .. } => write!(f, "key not enqueued: {error}"),
        }
    }
}

impl<K: fmt::Debug> std::error::Error for EnqueueError<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EnqueueError::Watcher(e) => Some(e),
            EnqueueError::Refused { error, .. } => Some(error),
        }
    }
}

/// The default key function: the object's [`ObjectRef`].
pub type ObjectRefFn<T> = fn(&T) -> ObjectRef<T>;

/// Turns kube-runtime [`watcher`](kube_runtime::watcher()) events into queue
/// adds, choosing each key's priority from what the event means.
///
/// Each object is mapped to a key by a key function (by default its
/// [`ObjectRef`]: kind, namespace and name). The adapter remembers the last
/// `resourceVersion` of every object it has seen, so it can tell a real
/// change from a re-delivery:
///
/// | event | [`Cause`] | default priority |
/// | --- | --- | --- |
/// | `InitApply` during the first list | [`InitialList`](Cause::InitialList) | -100 |
/// | `InitApply` / `Apply`, same `resourceVersion` as last seen | [`Unchanged`](Cause::Unchanged) | -100 |
/// | `InitApply` after the first list / `Apply`, new object or new version | [`Changed`](Cause::Changed) | 0 |
/// | `Delete` | [`Deleted`](Cause::Deleted) | 0 |
/// | known object missing when a re-list ends (`InitDone`) | [`MissingAfterRelist`](Cause::MissingAfterRelist) | 0 |
///
/// Deletions are added like any other change: the reconciler finds the
/// object gone and decides what that means. `Init` and `InitDone` add
/// nothing themselves, except that `InitDone` reports the objects a re-list
/// no longer shows (unless [`relist_deletions(false)`](Self::relist_deletions)).
///
/// Use it as a stream adapter ([`watch`](Self::watch), or
/// [`WatchQueueExt::enqueue`] on the watcher stream), or feed events by hand
/// with [`handle`](Self::handle).
///
/// The queue may have any [`Ordering`]: for fair share across namespaces,
/// build it with `.ordering(by_namespace())`
/// ([`by_namespace`](crate::ordering::by_namespace)).
///
/// ```
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_runtime::watcher::Event;
/// use tokio_workqueue::WorkQueue;
/// use tokio_workqueue_kube::{Cause, WatchAdapter};
///
/// fn cm(name: &str, rv: &str) -> ConfigMap {
///     let mut cm = ConfigMap::default();
///     cm.metadata.name = Some(name.into());
///     cm.metadata.namespace = Some("default".into());
///     cm.metadata.resource_version = Some(rv.into());
///     cm
/// }
///
/// # tokio_test::block_on(async {
/// let queue = WorkQueue::new();
/// let events = futures::stream::iter([
///     Ok(Event::Init),
///     Ok(Event::InitApply(cm("a", "1"))),
///     Ok(Event::InitDone),
///     Ok(Event::Apply(cm("b", "2"))),
/// ]);
/// let causes: Vec<Cause> = WatchAdapter::new(queue.clone())
///     .watch(events)
///     .map(|added| added.unwrap().cause)
///     .collect()
///     .await;
/// assert_eq!(causes, [Cause::InitialList, Cause::Changed]);
/// // The fresh change comes out first.
/// assert_eq!(queue.get().await.unwrap().key().name, "b");
/// # });
/// ```
pub struct WatchAdapter<T, K = ObjectRef<T>, F = ObjectRefFn<T>, O: Ordering<K> = Priorities> {
    queue: WorkQueue<K, O>,
    key_fn: F,
    priorities: WatchPriorities,
    triage: Triage<K>,
    /// Results of the last event, not yet handed out.
    out: VecDeque<Result<Enqueued<K>, EnqueueError<K>>>,
    _object: PhantomData<fn(&T)>,
}

impl<T, K, F, O: Ordering<K>> fmt::Debug for WatchAdapter<T, K, F, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchAdapter")
            .field("priorities", &self.priorities)
            .field("triage", &self.triage)
            .finish_non_exhaustive()
    }
}

impl<T, O> WatchAdapter<T, ObjectRef<T>, ObjectRefFn<T>, O>
where
    T: Resource + 'static,
    T::DynamicType: Default + Clone + Eq + Hash + Send + Sync,
    O: Ordering<ObjectRef<T>>,
{
    /// An adapter that adds each object's [`ObjectRef`] to `queue`.
    pub fn new(queue: WorkQueue<ObjectRef<T>, O>) -> Self {
        WatchAdapter::with_key_fn(queue, ObjectRef::from_obj as ObjectRefFn<T>)
    }
}

impl<T, K, F, O> WatchAdapter<T, K, F, O>
where
    T: Resource,
    K: Key,
    F: FnMut(&T) -> K,
    O: Ordering<K>,
{
    /// An adapter that adds `key_fn(&object)` to `queue`.
    ///
    /// Several objects may map to one key (for example their namespace, or
    /// an owner): the key is added whenever any of them changes.
    pub fn with_key_fn(queue: WorkQueue<K, O>, key_fn: F) -> Self {
        WatchAdapter {
            queue,
            key_fn,
            priorities: WatchPriorities::default(),
            triage: Triage::new(),
            out: VecDeque::new(),
            _object: PhantomData,
        }
    }

    /// Sets the priorities keys are added with.
    pub fn priorities(mut self, priorities: WatchPriorities) -> Self {
        self.priorities = priorities;
        self
    }

    /// Whether objects that a re-list no longer shows are added as
    /// [`Cause::MissingAfterRelist`] when the list completes (on by default).
    pub fn relist_deletions(mut self, enabled: bool) -> Self {
        self.triage.relist_deletions(enabled);
        self
    }

    /// The queue keys are added to.
    pub fn queue(&self) -> &WorkQueue<K, O> {
        &self.queue
    }

    /// Handles one watcher event: adds what it calls for to the queue, and
    /// returns one result per key it tried to add (none for `Init`, one for
    /// an object, any number for `InitDone`).
    ///
    /// The adds happen here, whether or not the returned iterator is used.
    pub fn handle(
        &mut self,
        event: Event<T>,
    ) -> impl Iterator<Item = Result<Enqueued<K>, EnqueueError<K>>> + '_ {
        self.process(event);
        self.out.drain(..)
    }

    /// Adds everything from `events` to the queue, as a stream of what was
    /// added (see [`WatchQueueExt::enqueue`]).
    pub fn watch<S>(self, events: S) -> Enqueue<S, T, K, F, O>
    where
        S: Stream<Item = Result<Event<T>, watcher::Error>>,
    {
        Enqueue {
            events: Box::pin(events),
            adapter: self,
            refused: false,
            ended: false,
        }
    }

    fn process(&mut self, event: Event<T>) {
        let key_fn = &mut self.key_fn;
        let (queue, priorities, out) = (&self.queue, &self.priorities, &mut self.out);
        self.triage.event(event, key_fn, |key, cause| {
            add(queue, priorities, out, key, cause)
        });
    }
}

/// Adds `key` for `cause` with its priority, records the outcome in `out`,
/// and tells whether the queue took it.
fn add<K: Key, O: Ordering<K>>(
    queue: &WorkQueue<K, O>,
    priorities: &WatchPriorities,
    out: &mut VecDeque<Result<Enqueued<K>, EnqueueError<K>>>,
    key: K,
    cause: Cause,
) -> bool {
    let priority = priorities.for_cause(cause);
    match queue.add_with(key.clone(), AddOpts::default().priority(priority)) {
        Ok(()) => {
            out.push_back(Ok(Enqueued {
                key,
                priority,
                cause,
            }));
            true
        }
        Err(error) => {
            out.push_back(Err(EnqueueError::Refused { key, error, cause }));
            false
        }
    }
}
/// The stream returned by [`WatchAdapter::watch`] and
/// [`WatchQueueExt::enqueue`]: drives the watcher and adds its objects to the
/// queue, yielding each added key or error.
///
/// It yields watcher errors and goes on (the watcher recovers on its own),
/// and ends when the watcher stream ends or after yielding a key the queue
/// refused. If the queue is shutting down before an event is taken, it ends
/// without taking it. The adds happen only while the stream is polled, so
/// keep polling it (for example with `for_each` on a spawned task).
#[must_use = "streams do nothing unless polled"]
pub struct Enqueue<S, T, K = ObjectRef<T>, F = ObjectRefFn<T>, O: Ordering<K> = Priorities> {
    events: Pin<Box<S>>,
    adapter: WatchAdapter<T, K, F, O>,
    refused: bool,
    ended: bool,
}

impl<S, T, K, F, O: Ordering<K>> fmt::Debug for Enqueue<S, T, K, F, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enqueue")
            .field("adapter", &self.adapter)
            .field("refused", &self.refused)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<S, T, K, F, O: Ordering<K>> Enqueue<S, T, K, F, O> {
    /// The adapter, with what it has learnt of the objects so far.
    pub fn adapter(&self) -> &WatchAdapter<T, K, F, O> {
        &self.adapter
    }
}

impl<S, T, K, F, O> Stream for Enqueue<S, T, K, F, O>
where
    S: Stream<Item = Result<Event<T>, watcher::Error>>,
    T: Resource,
    K: Key,
    F: FnMut(&T) -> K,
    O: Ordering<K>,
{
    type Item = Result<Enqueued<K>, EnqueueError<K>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Every field is Unpin (the event stream is boxed).
        let this = self.get_mut();
        loop {
            if let Some(result) = this.adapter.out.pop_front() {
                if matches!(result, Err(EnqueueError::Refused { .. })) {
                    this.refused = true;
                }
                return Poll::Ready(Some(result));
            }
            if this.ended || this.refused || this.adapter.queue.is_shutting_down() {
                this.ended = true;
                return Poll::Ready(None);
            }
            match this.events.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(Err(error))) => {
                    return Poll::Ready(Some(Err(EnqueueError::Watcher(error))));
                }
                Poll::Ready(Some(Ok(event))) => this.adapter.process(event),
            }
        }
    }
}

impl<S, T, K, F, O: Ordering<K>> Unpin for Enqueue<S, T, K, F, O> {}

/// Adds [`enqueue`](Self::enqueue) to kube-runtime watcher streams.
pub trait WatchQueueExt<T>: Stream<Item = Result<Event<T>, watcher::Error>> + Sized {
    /// Adds every object this watcher reports to `queue` under its
    /// [`ObjectRef`], with the default [`WatchPriorities`]; see
    /// [`WatchAdapter`].
    ///
    /// ```no_run
    /// # async fn example(client: kube_client::Client) {
    /// use futures::StreamExt;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::Api;
    /// use kube_runtime::{WatchStreamExt, watcher};
    /// use tokio_workqueue::WorkQueue;
    /// use tokio_workqueue_kube::WatchQueueExt;
    ///
    /// let queue = WorkQueue::new();
    /// let api: Api<ConfigMap> = Api::all(client);
    /// let feeder = watcher(api, watcher::Config::default())
    ///     .default_backoff()
    ///     .enqueue(queue.clone())
    ///     .for_each(|added| async move {
    ///         if let Err(e) = added {
    ///             eprintln!("{e}");
    ///         }
    ///     });
    /// tokio::spawn(feeder);
    /// # }
    /// ```
    fn enqueue<O>(
        self,
        queue: WorkQueue<ObjectRef<T>, O>,
    ) -> Enqueue<Self, T, ObjectRef<T>, ObjectRefFn<T>, O>
    where
        T: Resource + 'static,
        T::DynamicType: Default + Clone + Eq + Hash + Send + Sync,
        O: Ordering<ObjectRef<T>>,
    {
        WatchAdapter::new(queue).watch(self)
    }

    /// Adds every object this watcher reports to the adapter's queue; see
    /// [`WatchAdapter`].
    fn enqueue_with<K, F, O>(self, adapter: WatchAdapter<T, K, F, O>) -> Enqueue<Self, T, K, F, O>
    where
        T: Resource,
        K: Key,
        F: FnMut(&T) -> K,
        O: Ordering<K>,
    {
        adapter.watch(self)
    }
}

impl<T, S> WatchQueueExt<T> for S where S: Stream<Item = Result<Event<T>, watcher::Error>> {}
