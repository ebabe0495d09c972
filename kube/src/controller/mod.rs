//! [`Controller`]: kube-runtime's controller, on this crate's queue.

mod at_end;
mod error;
pub(crate) mod leadership;
#[cfg(feature = "prometheus")]
pub(crate) mod metrics;
mod reasons;
pub(crate) mod replication;
mod requeue_priority;
mod run;
mod settings;
mod sharding;
pub(crate) mod split;
mod strip;
mod triggers;
mod watched;

use std::fmt::{self, Debug};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{self, BoxFuture};
use futures_util::stream::SelectAll;
use futures_util::{FutureExt, StreamExt, TryFuture};
use kube_client::{Api, Resource};
use kube_runtime::controller::{Action, Config};
use kube_runtime::reflector::{ObjectRef, Store, reflector, store::Writer};
use kube_runtime::utils::Backoff;
use kube_runtime::watcher::{self, DefaultBackoff, Event, watcher};
use serde::de::DeserializeOwned;

pub use error::{ControllerError, RunResult};
pub use requeue_priority::set_requeue_priority;
pub use run::Runner;

use self::replication::Replication;
use self::run::{PartitionFn, Settings, Work};
use self::triggers::TriggerStream;
use crate::WatchPriorities;
use crate::leader::LeaderElection;
use crate::shard::Shards;
use crate::watch_backoff::WatchBackoff;
use tokio_workqueue::Builder;
use tokio_workqueue::ordering::{Ordering, Priorities};

/// How many reconciles run at once unless [`Controller::concurrency`] says
/// otherwise.
///
/// kube-runtime's default is unbounded, controller-runtime's is 1. Here the
/// default is finite so that keys wait in the queue, where priorities and
/// FIFO order them, instead of all starting at once; 16 keeps a controller
/// that mostly waits on the API server busy without flooding it.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// A controller for objects of kind `K`: kube-runtime's
/// [`Controller`](kube_runtime::Controller), with the same builder and the
/// same `run`, on a [`WorkQueue`](tokio_workqueue::WorkQueue).
///
/// Changing `use kube::runtime::Controller` to
/// `use tokio_workqueue_kube::Controller` is the whole migration: the
/// reconciler, the error policy, kube-runtime's `Action` and the code that
/// consumes the result stream stay as they are. What changes is what
/// happens between a watch event and a reconcile:
///
/// * reconciles read the object from the reflector store (never a GET) and
///   start only once the store's first list is complete;
/// * keys wait in the queue by priority: the initial list, re-lists,
///   unchanged re-deliveries, [`reconcile_all_on`](Self::reconcile_all_on)
///   and children's initial lists at the low priority, real changes at the
///   normal one ([`priorities`](Self::priorities)), so a change overtakes a
///   backlog; FIFO within a priority, even when every worker is busy;
/// * on error the key comes back after the larger of the error policy's
///   delay and the queue's per-key backoff, and a success forgets its
///   failures;
/// * a reconcile that panics or runs past
///   [`reconcile_timeout`](Self::reconcile_timeout) is an error for that key
///   only, reported on the stream;
/// * concurrency is finite by default ([`DEFAULT_CONCURRENCY`]), and the
///   queue's metrics, rate limiter, starvation bound, throttle and
///   partitions are all there ([`queue`](Self::queue),
///   [`partition_by`](Self::partition_by)).
///
/// See the [module docs](crate) for an example and for every
/// difference from kube-runtime.
pub struct Controller<K, O = Priorities>
where
    K: Clone + Resource + Debug + 'static,
    K::DynamicType: Eq + Hash,
{
    triggers: SelectAll<TriggerStream<K>>,
    trigger_backoff: Box<dyn Backoff + Send>,
    graceful: Vec<BoxFuture<'static, ()>>,
    forceful: Vec<BoxFuture<'static, ()>>,
    dyntype: K::DynamicType,
    reader: Store<K>,
    queue: Builder<ObjectRef<K>, O>,
    priorities: WatchPriorities,
    concurrency: usize,
    debounce: Duration,
    reconcile_timeout: Option<Duration>,
    partition: Option<(usize, PartitionFn<ObjectRef<K>>)>,
    leader: Option<LeaderElection>,
    shards: Option<Shards>,
    /// Set when a [`Manager`](crate::Manager) made this controller: its
    /// `owns` and `watches` sources are the manager's shared caches.
    manager: Option<Arc<crate::manager::Shared>>,
    /// Futures that must all resolve before the first reconcile, besides
    /// the main store's first list.
    gates: Vec<BoxFuture<'static, ()>>,
    /// Set by [`strip_managed_fields`](Controller::strip_managed_fields):
    /// the switch the main watcher's events are stripped by (`None` for
    /// [`for_stream`](Controller::for_stream), whose store the caller fills).
    strip: Option<strip::StripSwitch>,
    /// Set by [`new`](Controller::new): the main watcher's API, and the
    /// selector a split cache narrows it with before it starts.
    main_watch: Option<split::MainWatch<K>>,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::metrics::ControllerMetrics>,
}

impl<K, O> fmt::Debug for Controller<K, O>
where
    K: Clone + Resource + Debug + 'static,
    K::DynamicType: Eq + Hash + Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("dyntype", &self.dyntype)
            .field("triggers", &self.triggers.len())
            .field("queue", &self.queue)
            .field("priorities", &self.priorities)
            .field("concurrency", &self.concurrency)
            .field("debounce", &self.debounce)
            .field("reconcile_timeout", &self.reconcile_timeout)
            .field("partitions", &self.partition.as_ref().map(|(n, _)| *n))
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Send + Sync + Unpin + 'static,
{
    /// A controller for the objects of `main_api` that `wc` selects: a
    /// reflector store fed by a watcher, every object a key
    /// ([`ObjectRef<K>`]).
    #[must_use]
    pub fn new(main_api: Api<K>, wc: watcher::Config) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new_with(main_api, wc, Default::default())
    }

    /// [`new`](Self::new) for a dynamic type found through discovery.
    #[must_use]
    pub fn new_with(main_api: Api<K>, wc: watcher::Config, dyntype: K::DynamicType) -> Self {
        let writer = Writer::<K>::new(dyntype.clone());
        let (main_watch, events) = split::MainWatch::new(main_api, wc);
        let mut controller = Self::for_events_with(events, writer, dyntype);
        controller.main_watch = Some(main_watch);
        controller
    }

    /// A controller fed by watcher events you produce yourself (a watcher
    /// with your own setup, or events made by hand in a test): the
    /// controller reflects them into `writer` and reads its objects from
    /// `writer`'s store. Unlike [`for_stream`](Self::for_stream), the events
    /// tell the initial list and every re-list apart from changes.
    #[must_use]
    pub fn for_events(
        events: impl futures_core::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
        writer: Writer<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_events_with(events, writer, Default::default())
    }

    /// [`for_events`](Self::for_events) for a dynamic type.
    #[must_use]
    pub fn for_events_with(
        events: impl futures_core::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
        writer: Writer<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let reader = writer.as_reader();
        let switch = strip::StripSwitch::default();
        let events = switch.apply(events);
        let main = triggers::main_events(reflector(writer, events), dyntype.clone());
        let mut controller = Self::with_main(main, reader, dyntype);
        controller.strip = Some(switch);
        controller
    }

    /// A controller fed by a stream of `K` objects that you reflect into
    /// `reader` yourself (for example a shared or pre-filtered reflector).
    ///
    /// The objects the stream yields before `reader` is ready count as the
    /// initial list (low priority); after that an object counts as changed
    /// unless its `resourceVersion` is the one last seen.
    #[must_use]
    pub fn for_stream(
        trigger: impl futures_core::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_stream_with(trigger, reader, Default::default())
    }

    /// [`for_stream`](Self::for_stream) for a dynamic type.
    #[must_use]
    pub fn for_stream_with(
        trigger: impl futures_core::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        let main = triggers::main_objects(trigger, reader.clone(), dyntype.clone());
        Self::with_main(main, reader, dyntype)
    }

    /// kube-runtime's `for_shared_stream`: a controller fed by a stream of
    /// shared objects (kube-runtime's `ReflectHandle`, or any stream of
    /// `Arc<K>`) that you reflect into `reader` yourself. The same as
    /// [`for_stream`](Self::for_stream) otherwise. For caches shared between
    /// controllers without kube-runtime's unstable features, see
    /// [`Manager`](crate::Manager).
    #[must_use]
    pub fn for_shared_stream(
        trigger: impl futures_core::Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        Self::for_shared_stream_with(trigger, reader, Default::default())
    }

    /// [`for_shared_stream`](Self::for_shared_stream) for a dynamic type.
    #[must_use]
    pub fn for_shared_stream_with(
        trigger: impl futures_core::Stream<Item = Arc<K>> + Send + 'static,
        reader: Store<K>,
        dyntype: K::DynamicType,
    ) -> Self {
        Self::for_stream_with(trigger.map(|object| Ok(K::clone(&object))), reader, dyntype)
    }

    fn with_main(main: TriggerStream<K>, reader: Store<K>, dyntype: K::DynamicType) -> Self {
        let mut triggers = SelectAll::new();
        triggers.push(main);
        Controller {
            triggers,
            trigger_backoff: Box::<DefaultBackoff>::default(),
            graceful: Vec::new(),
            forceful: Vec::new(),
            dyntype,
            reader,
            queue: Builder::new(),
            priorities: WatchPriorities::default(),
            concurrency: DEFAULT_CONCURRENCY,
            debounce: Duration::ZERO,
            reconcile_timeout: None,
            partition: None,
            leader: None,
            shards: None,
            manager: None,
            gates: Vec::new(),
            strip: None,
            main_watch: None,
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }

    /// A controller of a [`Manager`](crate::Manager): fed by a subscription
    /// to a shared source, reading its shared store, reconciling once every
    /// cache of the manager synced, draining when the manager stops.
    pub(crate) fn for_shared(
        events: crate::manager::source::Subscription<K>,
        reader: Store<K>,
        manager: Arc<crate::manager::Shared>,
    ) -> Self
    where
        K::DynamicType: Default,
    {
        let dyntype = K::DynamicType::default();
        let key_type = dyntype.clone();
        let main = triggers::main_events_by(
            events,
            triggers::Lists::Complete,
            move |object: &crate::manager::source::SharedObject<K>| {
                triggers::key_of(&*object.0, key_type.clone())
            },
        );
        let mut controller = Self::with_main(main, reader, dyntype);
        controller.gates.push(manager.synced());
        controller.graceful.push(manager.stopping().boxed());
        controller.manager = Some(manager);
        controller
    }
}

impl<K, O> Controller<K, O>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Send + Sync + Unpin + 'static,
    O: Ordering<ObjectRef<K>>,
{
    /// Takes kube-runtime's own [`Config`]: its concurrency (0, kube-runtime's
    /// "unbounded", keeps this controller's finite default) and its debounce
    /// (each trigger's add is delayed by it; a key triggered again while
    /// waiting keeps its first time, so this is not kube-runtime's trailing
    /// debounce).
    ///
    /// # Panics
    ///
    /// If kube-runtime's `Config` no longer prints its fields as it does in
    /// kube-runtime 5 (the only way to read them): a test pins the format.
    #[must_use]
    pub fn with_config(mut self, config: Config) -> Self {
        let (debounce, concurrency) = settings::config_parts(&config)
            .unwrap_or_else(|text| panic!("cannot read kube-runtime's controller Config: {text}"));
        self.debounce = debounce;
        if concurrency > 0 {
            self.concurrency = usize::from(concurrency);
        }
        self
    }

    /// The backoff applied to watcher errors of every trigger (kube-runtime's
    /// default unless set: 800 ms doubling to 30 s, reset by the next event
    /// and after 2 minutes without an error).
    ///
    /// After an error the triggers are not polled until the backoff's next
    /// delay has passed, as in kube-runtime, with one exception: a watch
    /// that ends with `410 Gone` (its resourceVersion was compacted) re-lists
    /// at once, without waiting and without advancing the backoff, since the
    /// server did not fail; kube-runtime waits there too, which after a
    /// network outage added the backoff's next step (seconds) before the
    /// re-list. A re-list that fails is paced like any other failure.
    #[must_use]
    pub fn trigger_backoff(mut self, backoff: impl Backoff + 'static) -> Self {
        self.trigger_backoff = Box::new(backoff);
        self
    }

    /// The store the reconciler's objects come from.
    pub fn store(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Events of `Child` objects trigger their owners of kind `K` (by
    /// ownerReferences), watching metadata only, as kube-runtime does.
    #[must_use]
    pub fn owns<Child>(self, api: Api<Child>, wc: watcher::Config) -> Self
    where
        Child:
            Clone + Resource<DynamicType = ()> + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.owns_with(api, (), wc)
    }

    /// [`owns`](Self::owns) for a dynamic child type.
    #[must_use]
    pub fn owns_with<Child>(
        mut self,
        api: Api<Child>,
        dyntype: Child::DynamicType,
        wc: watcher::Config,
    ) -> Self
    where
        Child: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        Child::DynamicType: Debug + Eq + Hash + Clone + Send + Sync,
    {
        let owner_type = self.dyntype.clone();
        let trigger = match &self.manager {
            Some(manager) => {
                let events = manager
                    .metadata_source(api, wc, dyntype.clone())
                    .subscribe();
                triggers::related_events(events, dyntype, move |child: &_| {
                    triggers::owners::<K, _>(child, &owner_type)
                })
            }
            None => {
                #[allow(deprecated)]
                let events = kube_runtime::watcher::metadata_watcher(api, wc);
                triggers::related_events(events, dyntype, move |child: &_| {
                    triggers::owners::<K, _>(child, &owner_type)
                })
            }
        };
        self.triggers.push(trigger);
        self
    }

    /// Objects of a stream you watch yourself trigger their owners of kind
    /// `K`.
    #[must_use]
    pub fn owns_stream<Child>(
        self,
        trigger: impl futures_core::Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
    ) -> Self
    where
        Child: Resource<DynamicType = ()> + Send + 'static,
    {
        self.owns_stream_with(trigger, ())
    }

    /// [`owns_stream`](Self::owns_stream) for a dynamic child type.
    #[must_use]
    pub fn owns_stream_with<Child>(
        mut self,
        trigger: impl futures_core::Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
        dyntype: Child::DynamicType,
    ) -> Self
    where
        Child: Resource + Send + 'static,
        Child::DynamicType: Debug + Eq + Hash + Clone + Send,
    {
        let owner_type = self.dyntype.clone();
        self.triggers.push(triggers::related_objects(
            trigger,
            self.reader.clone(),
            dyntype,
            move |child| triggers::owners::<K, _>(child, &owner_type),
        ));
        self
    }

    /// kube-runtime's `owns_shared_stream`: shared `Child` objects trigger
    /// their owners of kind `K`. The same as [`owns_stream`](Self::owns_stream)
    /// otherwise.
    #[must_use]
    pub fn owns_shared_stream<Child>(
        self,
        trigger: impl futures_core::Stream<Item = Arc<Child>> + Send + 'static,
    ) -> Self
    where
        Child: Clone + Resource<DynamicType = ()> + Send + Sync + 'static,
    {
        self.owns_shared_stream_with(trigger, ())
    }

    /// [`owns_shared_stream`](Self::owns_shared_stream) for a dynamic child
    /// type.
    #[must_use]
    pub fn owns_shared_stream_with<Child>(
        self,
        trigger: impl futures_core::Stream<Item = Arc<Child>> + Send + 'static,
        dyntype: Child::DynamicType,
    ) -> Self
    where
        Child: Clone + Resource + Send + Sync + 'static,
        Child::DynamicType: Debug + Eq + Hash + Clone + Send,
    {
        self.owns_stream_with(trigger.map(|child| Ok(Child::clone(&child))), dyntype)
    }

    /// Events of `Other` objects trigger the keys `mapper` returns for them.
    #[must_use]
    pub fn watches<Other, I>(
        self,
        api: Api<Other>,
        wc: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        Other::DynamicType: Default + Debug + Clone + Eq + Hash + Send + Sync,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_with(api, Default::default(), wc, mapper)
    }

    /// [`watches`](Self::watches) for a dynamic type.
    #[must_use]
    pub fn watches_with<Other, I>(
        mut self,
        api: Api<Other>,
        dyntype: Other::DynamicType,
        wc: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
        Other::DynamicType: Debug + Clone + Eq + Hash + Send + Sync,
    {
        let trigger = match &self.manager {
            Some(manager) => {
                let events = manager.object_source(api, wc, dyntype.clone()).subscribe();
                let mapper = move |other: &crate::manager::source::SharedObject<Other>| {
                    mapper(Other::clone(&other.0))
                };
                triggers::related_events(events, dyntype, mapper)
            }
            None => {
                let mapper = move |other: &Other| mapper(other.clone());
                triggers::related_events(watcher(api, wc), dyntype, mapper)
            }
        };
        self.triggers.push(trigger);
        self
    }

    /// Objects of a stream you watch yourself trigger the keys `mapper`
    /// returns for them.
    #[must_use]
    pub fn watches_stream<Other, I>(
        self,
        trigger: impl futures_core::Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Default + Debug + Clone + Send,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_stream_with(trigger, mapper, Default::default())
    }

    /// [`watches_stream`](Self::watches_stream) for a dynamic type.
    #[must_use]
    pub fn watches_stream_with<Other, I>(
        mut self,
        trigger: impl futures_core::Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
        dyntype: Other::DynamicType,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Debug + Clone + Send,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.triggers.push(triggers::related_objects(
            trigger,
            self.reader.clone(),
            dyntype,
            move |other: &Other| mapper(other.clone()),
        ));
        self
    }

    /// kube-runtime's `watches_shared_stream`: shared `Other` objects
    /// trigger the keys `mapper` returns for them. The same as
    /// [`watches_stream`](Self::watches_stream) otherwise.
    #[must_use]
    pub fn watches_shared_stream<Other, I>(
        self,
        trigger: impl futures_core::Stream<Item = Arc<Other>> + Send + 'static,
        mapper: impl Fn(Arc<Other>) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        Other::DynamicType: Default + Debug + Clone + Send,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_shared_stream_with(trigger, mapper, Default::default())
    }

    /// [`watches_shared_stream`](Self::watches_shared_stream) for a dynamic
    /// type.
    #[must_use]
    pub fn watches_shared_stream_with<Other, I>(
        self,
        trigger: impl futures_core::Stream<Item = Arc<Other>> + Send + 'static,
        mapper: impl Fn(Arc<Other>) -> I + Sync + Send + 'static,
        dyntype: Other::DynamicType,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        Other::DynamicType: Debug + Clone + Send,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_stream_with(
            trigger.map(|other| Ok(Other::clone(&other))),
            move |other| mapper(Arc::new(other)),
            dyntype,
        )
    }

    /// Each item of `trigger` re-queues every object in the store, at the
    /// low priority (the [`WatchPriorities::unchanged`] one): a resync that
    /// never delays a real change.
    #[must_use]
    pub fn reconcile_all_on(
        mut self,
        trigger: impl futures_core::Stream<Item = ()> + Send + 'static,
    ) -> Self {
        let all = triggers::bulk(trigger, self.store(), self.dyntype.clone());
        self.triggers.push(all);
        self
    }

    /// Each key of `trigger` is queued, at the normal priority (the
    /// [`WatchPriorities::changed`] one).
    #[must_use]
    pub fn reconcile_on(
        mut self,
        trigger: impl futures_core::Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self {
        self.triggers.push(triggers::requested(trigger));
        self
    }

    /// When `trigger` completes, shut down gracefully: stop watching, drop
    /// the keys waiting on a delay, reconcile the keys already queued and
    /// those in flight, then end the stream.
    ///
    /// kube-runtime drops the queued keys instead; here a graceful shutdown
    /// drains them (a queued key is a change not yet acted on). Requeues
    /// asked for during the drain are refused and reported
    /// ([`ControllerError::RequeueRefused`]), beside the reconcile's own
    /// result (a success is still reported as `Ok`, as kube-runtime does).
    #[must_use]
    pub fn graceful_shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Self {
        self.graceful.push(trigger.boxed());
        self
    }

    /// When `trigger` completes, stop: start no more reconciles, let those in
    /// flight finish (their requeues are refused and reported), and end the
    /// stream. Queued keys are dropped.
    #[must_use]
    pub fn shutdown_on(
        mut self,
        trigger: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Self {
        self.forceful.push(trigger.boxed());
        self
    }

    /// The first Ctrl-C or SIGTERM starts a graceful shutdown
    /// ([`graceful_shutdown_on`](Self::graceful_shutdown_on)); a second one
    /// stops ([`shutdown_on`](Self::shutdown_on)).
    ///
    /// # Panics
    ///
    /// When run outside a tokio runtime with signal handling, or if the
    /// SIGTERM handler cannot be installed.
    #[must_use]
    pub fn shutdown_on_signal(mut self) -> Self {
        // Each waiter listens on its own: both see the first signal.
        self.graceful.push(
            async {
                shutdown_signal().await;
                tracing::info!("graceful shutdown requested; a second signal stops at once");
            }
            .boxed(),
        );
        self.forceful.push(
            async {
                shutdown_signal().await;
                shutdown_signal().await;
                tracing::info!("shutdown requested");
            }
            .boxed(),
        );
        self
    }

    /// Sets up the queue: its name (metrics), rate limiter (the per-key
    /// backoff of failed reconciles), metrics hook, starvation bound,
    /// throttle and ordering. Without it the queue is unnamed, with
    /// client-go's default controller rate limiter and the [`Priorities`]
    /// ordering.
    #[must_use]
    pub fn queue<P: Ordering<ObjectRef<K>>>(
        self,
        builder: Builder<ObjectRef<K>, P>,
    ) -> Controller<K, P> {
        self.with_queue(|_| builder)
    }

    /// Hands keys out in `ordering`'s order: for example fair share across
    /// namespaces, so one namespace's flood does not hold up the others:
    ///
    /// ```no_run
    /// # async fn example(client: kube_client::Client) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::Api;
    /// use kube_runtime::watcher;
    /// use tokio_workqueue_kube::Controller;
    /// use tokio_workqueue_kube::ordering::by_namespace;
    ///
    /// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .ordering(by_namespace());
    /// # drop(controller);
    /// # }
    /// ```
    ///
    /// Priorities still come first: the ordering decides within a priority
    /// (see [`tokio_workqueue::ordering`]).
    #[must_use]
    pub fn ordering<P: Ordering<ObjectRef<K>>>(self, ordering: P) -> Controller<K, P> {
        self.with_queue(|builder| builder.ordering(ordering))
    }

    fn with_queue<P: Ordering<ObjectRef<K>>>(
        self,
        queue: impl FnOnce(Builder<ObjectRef<K>, O>) -> Builder<ObjectRef<K>, P>,
    ) -> Controller<K, P> {
        Controller {
            triggers: self.triggers,
            trigger_backoff: self.trigger_backoff,
            graceful: self.graceful,
            forceful: self.forceful,
            dyntype: self.dyntype,
            reader: self.reader,
            queue: queue(self.queue),
            priorities: self.priorities,
            concurrency: self.concurrency,
            debounce: self.debounce,
            reconcile_timeout: self.reconcile_timeout,
            partition: self.partition,
            leader: self.leader,
            shards: self.shards,
            manager: self.manager,
            gates: self.gates,
            strip: self.strip,
            main_watch: self.main_watch,
            #[cfg(feature = "prometheus")]
            metrics: self.metrics,
        }
    }

    /// The priorities keys are queued with, by what their event meant.
    #[must_use]
    pub fn priorities(mut self, priorities: WatchPriorities) -> Self {
        self.priorities = priorities;
        self
    }

    /// Removes `metadata.managedFields` from every object of the main watcher
    /// before it enters the reflector store: controller-runtime's
    /// `cache.TransformStripManagedFields()`. The store then holds less
    /// (managedFields is often the largest part of a small object's
    /// metadata), and the reconciler's view changes accordingly: the object
    /// it is handed (and every object read from [`store`](Self::store)) has
    /// `managed_fields` set to `None`, whatever the API server holds. Fine for
    /// a reconciler that never reads managedFields, which is nearly every
    /// one: server-side apply and patches do not need it on the client.
    ///
    /// Applies to the watcher of [`new`](Self::new) and
    /// [`new_with`](Self::new_with) and to the events of
    /// [`for_events`](Self::for_events); [`for_stream`](Self::for_stream)'s
    /// store is filled by the caller, who strips there (for example
    /// `.modify(|o| o.managed_fields_mut().clear())` on the watcher stream),
    /// so there it changes nothing; nor does it for a
    /// [`Manager`](crate::Manager)'s controllers, whose caches are shared
    /// with others and kept whole. Related objects
    /// ([`owns`](Self::owns), [`watches`](Self::watches)) are not cached by
    /// the controller and are not affected.
    #[must_use]
    pub fn strip_managed_fields(self) -> Self {
        if let Some(switch) = &self.strip {
            switch.turn_on();
        }
        self
    }

    /// At most `n` reconciles at once (0 counts as 1). The default is
    /// [`DEFAULT_CONCURRENCY`].
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// A reconcile running longer than `timeout` is cancelled (dropped at its
    /// next `.await`) and counts as an error for its key: requeued through
    /// the rate limiter and reported as
    /// [`ControllerError::ReconcileTimedOut`]. A zero timeout cancels every
    /// reconcile that does not finish at its first poll.
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.reconcile_timeout = Some(timeout);
        self
    }

    /// Splits the queue into `n` partitions (0 counts as 1), key `k` going to
    /// partition `f(&k) % n`; each partition reconciles one key at a time,
    /// in queue order, so at most `n` reconciles run at once and the
    /// [`concurrency`](Self::concurrency) setting is not used. For keys that
    /// must not be reconciled side by side (all objects of one node). A
    /// panic in `f` sends the key to partition 0. The partitions report the
    /// queue's metrics together, under the queue's one name.
    #[must_use]
    pub fn partition_by(
        mut self,
        n: usize,
        f: impl Fn(&ObjectRef<K>) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.partition = Some((n.max(1), Arc::new(f)));
        self
    }

    /// Runs as one of several replicas, reconciling only while this one
    /// leads `election`'s Lease (see [`crate::leader`] for the rules
    /// and failure semantics).
    ///
    /// Every replica watches and keeps its store warm, and queues keys as
    /// usual; only the leader takes keys from the queue, so a new leader
    /// starts at once, without a re-list. When leadership ends (lost, or
    /// not renewed by the renew deadline), no reconcile starts any more and
    /// those in flight get [`LeaseConfig::fencing_grace`] (half of lease
    /// duration minus renew deadline) to finish before they are cancelled,
    /// reported as [`ControllerError::ReconcileFenced`] and their keys
    /// queued again. When the stream ends (a shutdown, or every trigger
    /// ended) the lease is released, so another replica takes over at its
    /// next try; a follower ends without reconciling its queued keys (they
    /// are the leader's). Dropping the stream releases nothing, as a crash.
    ///
    /// The elector starts at the stream's first poll. A config that breaks
    /// client-go's rules ([`LeaseConfig::validate`]) is reported as the
    /// stream's only item, [`ControllerError::InvalidLeaseConfig`] in the
    /// `QueueError` slot, and the stream ends; validate the config first to
    /// catch it earlier.
    ///
    /// ```no_run
    /// # async fn example(client: kube_client::Client) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::Api;
    /// use kube_runtime::watcher;
    /// use tokio_workqueue_kube::Controller;
    /// use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
    ///
    /// let config = LeaseConfig::new("configmap-controller", "default", "pod-a");
    /// config.validate().expect("client-go's timing rules");
    /// let controller = Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
    ///     .leader_election(LeaderElection::new(client, config));
    /// # drop(controller);
    /// # }
    /// ```
    ///
    /// [`LeaseConfig::fencing_grace`]: crate::leader::LeaseConfig::fencing_grace
    /// [`LeaseConfig::validate`]: crate::leader::LeaseConfig::validate
    #[must_use]
    pub fn leader_election(mut self, election: LeaderElection) -> Self {
        self.leader = Some(election);
        self
    }

    /// Runs as one member of a shard group: this replica queues and
    /// reconciles only the keys the group's membership gives it, and takes
    /// a key over from another replica only once that one acknowledged the
    /// change with nothing of the key in flight, or its Lease expired (see
    /// [`crate::shard`] for the protocol and failure semantics).
    ///
    /// Every replica watches every object and keeps its store warm, so a
    /// key gained needs no re-list; gained keys are queued at the priority
    /// of re-listed objects, behind live changes. A reconcile of a key this
    /// replica lost, or of any key once it could not renew its Lease by the
    /// renew deadline, gets [`ShardConfig::fencing_grace`] to finish before
    /// it is cancelled and reported as
    /// [`ControllerError::ReconcileFenced`]. When the stream ends (a
    /// shutdown, or every trigger ended) the replica releases its Lease, so
    /// the others take its keys at their next read; dropping the stream
    /// releases nothing, as a crash.
    ///
    /// The membership starts at the stream's first poll. A config that
    /// breaks the rules ([`ShardConfig::validate`]) is reported as the
    /// stream's only item, [`ControllerError::InvalidLeaseConfig`], and the
    /// stream ends; so does a controller given both shards and
    /// [`leader_election`](Self::leader_election)
    /// ([`ControllerError::LeaderElectionWithShards`]).
    ///
    /// ```no_run
    /// # async fn example(client: kube_client::Client) {
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_client::Api;
    /// use kube_runtime::watcher;
    /// use tokio_workqueue_kube::Controller;
    /// use tokio_workqueue_kube::shard::{ShardConfig, Shards};
    ///
    /// let config = ShardConfig::new("configmap-controller", "default", "pod-a");
    /// config.validate().expect("a valid shard config");
    /// let controller = Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
    ///     .shards(Shards::new(client, config));
    /// # drop(controller);
    /// # }
    /// ```
    ///
    /// [`ShardConfig::fencing_grace`]: crate::shard::ShardConfig::fencing_grace
    /// [`ShardConfig::validate`]: crate::shard::ShardConfig::validate
    #[must_use]
    pub fn shards(mut self, shards: Shards) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Records controller-runtime's controller metrics
    /// (`controller_runtime_reconcile_total` and the rest) in `metrics`,
    /// labelled with the queue's name. The queue's own `workqueue_*` families
    /// come from the metrics hook given to [`queue`](Self::queue).
    #[cfg(feature = "prometheus")]
    #[must_use]
    pub fn metrics(mut self, metrics: crate::metrics::ControllerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs the controller: a stream of kube-runtime's results, one per
    /// reconcile (and one per watcher error, object not found, panic,
    /// timeout or refused requeue). It must be polled for anything to happen; it ends after a
    /// shutdown, or when every trigger stream ended (then it drains as on a
    /// graceful shutdown).
    ///
    /// Must be polled inside a tokio runtime (reconciles run on spawned
    /// tasks). Dropping the stream aborts the reconciles in flight.
    pub fn run<ReconcilerFut, Ctx>(
        self,
        reconciler: impl FnMut(Arc<K>, Arc<Ctx>) -> ReconcilerFut,
        error_policy: impl Fn(Arc<K>, &ReconcilerFut::Error, Arc<Ctx>) -> Action,
        context: Arc<Ctx>,
    ) -> impl futures_core::Stream<Item = RunResult<K, ReconcilerFut::Error>>
    where
        ReconcilerFut: TryFuture<Ok = Action> + Send + 'static,
        ReconcilerFut::Error: std::error::Error + Send + 'static,
        Ctx: Send + Sync + 'static,
        // The partitions of `partition_by` each get a copy (every built-in
        // ordering is `Clone`).
        O: Clone,
    {
        // Before anything polls the main watcher: a split cache narrows it.
        let coordinator = split::narrow(
            self.shards.as_ref(),
            self.main_watch.as_ref(),
            &self.dyntype,
        );
        let builder = self.queue;
        #[cfg(feature = "prometheus")]
        let metrics = self.metrics.map(|m| m.recorder(builder.queue_name()));
        let one_at_a_time = self.partition.is_some();
        let (n, route) = self
            .partition
            .unwrap_or_else(|| (1, Arc::new(|_: &ObjectRef<K>| 0)));
        let queues = builder
            .partitioned(n, move |key: &ObjectRef<K>| route(key))
            .on_panic(|report| {
                tracing::error!(
                    panic.message = %report.message,
                    "partition function panicked; the key goes to partition 0"
                )
            })
            .build()
            .expect("partition_by counts 0 partitions as 1");
        let work = Work {
            queues,
            one_at_a_time,
        };
        let triggers = WatchBackoff::new(self.triggers, self.trigger_backoff).boxed();
        let any = |futures: Vec<BoxFuture<'static, ()>>| {
            (!futures.is_empty()).then(|| future::select_all(futures).map(|_| ()).boxed())
        };
        let settings = Settings {
            priorities: self.priorities,
            concurrency: self.concurrency,
            debounce: self.debounce,
            reconcile_timeout: self.reconcile_timeout,
            #[cfg(feature = "prometheus")]
            metrics,
        };
        let runner = Runner::new(
            triggers,
            work,
            self.reader,
            any(self.graceful),
            any(self.forceful),
            settings,
            reconciler,
            error_policy,
            context,
        );
        let runner = runner.gated(self.gates);
        let shared = self.manager.as_ref().and_then(|m| m.replication());
        let own = self.leader.is_some() || self.shards.is_some();
        let replication = coordinator.and_then(|coordinator| {
            if own && self.manager.as_ref().is_some_and(|m| m.splits_cache()) {
                return Err(ControllerError::OwnReplicationInSplitManager);
            }
            let mut replication =
                Replication::new(self.leader, self.shards, shared, self.dyntype.clone())?;
            if let Some(coordinator) = coordinator {
                replication.coordinate(coordinator);
            }
            Ok(replication)
        });
        match replication {
            Ok(replication) => runner.replicated(replication),
            Err(error) => runner.failed(error),
        }
    }
}

/// The first SIGTERM or SIGINT from now.
async fn shutdown_signal() {
    match crate::signals::shutdown_signal() {
        Ok(signal) => signal.await,
        Err(error) => panic!("cannot install the shutdown signal handlers: {error}"),
    }
}
