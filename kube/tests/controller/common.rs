//! What the controller tests share: objects made by hand, a feeder of
//! watcher events, a record of every reconcile (when it started and ended,
//! how many ran at once) and a collector of the controller's result stream.
//!
//! Everything runs on paused tokio time: times are exact, and a test that
//! waits for "an hour" takes no real time.

#![allow(dead_code)] // a toolkit: not every helper is in use by a test

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_client::Resource;
use kube_runtime::watcher::{self, Event};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_workqueue_kube::{Action, ControllerError, Error, ObjectRef, RunResult};

/// The namespace every object made here lives in.
pub const NS: &str = "default";

/// A key of the controllers under test.
pub type Key = ObjectRef<ConfigMap>;

/// An item of the controllers' result stream.
pub type Item = RunResult<ConfigMap, TestError>;

/// What the test reconcilers answer.
pub type Answer = Result<Action, TestError>;

/// Milliseconds, for short assertions.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The key of the ConfigMap `name` in [`NS`].
pub fn key(name: &str) -> Key {
    ObjectRef::new(name).within(NS)
}

/// Builds an object of kind `T`: name, namespace, resourceVersion, labels
/// and ownerReferences.
pub struct ObjectBuilder<T>(T);

/// An object of kind `T` named `name` in [`NS`], at resourceVersion "1".
pub fn object<T: Resource + Default>(name: &str) -> ObjectBuilder<T> {
    let mut object = T::default();
    let meta = object.meta_mut();
    meta.name = Some(name.into());
    meta.namespace = Some(NS.into());
    meta.resource_version = Some("1".into());
    ObjectBuilder(object)
}

impl<T: Resource> ObjectBuilder<T> {
    /// Sets the resourceVersion.
    pub fn rv(mut self, rv: &str) -> Self {
        self.0.meta_mut().resource_version = Some(rv.into());
        self
    }

    /// Sets a label.
    pub fn label(mut self, name: &str, value: &str) -> Self {
        self.0
            .meta_mut()
            .labels
            .get_or_insert_with(Default::default)
            .insert(name.into(), value.into());
        self
    }

    /// Adds an ownerReference to the object `name` of kind `Owner`.
    pub fn owner<Owner: Resource<DynamicType = ()>>(mut self, name: &str) -> Self {
        self.0
            .meta_mut()
            .owner_references
            .get_or_insert_with(Vec::new)
            .push(OwnerReference {
                api_version: Owner::api_version(&()).into_owned(),
                kind: Owner::kind(&()).into_owned(),
                name: name.into(),
                uid: format!("uid-of-{name}"),
                controller: Some(true),
                ..OwnerReference::default()
            });
        self
    }

    pub fn build(self) -> T {
        self.0
    }
}

/// The ConfigMap `name` in [`NS`] at resourceVersion `rv`.
pub fn cm(name: &str, rv: &str) -> ConfigMap {
    object::<ConfigMap>(name).rv(rv).build()
}

/// `count` ConfigMaps named `{prefix}-000`, `{prefix}-001`, ... at
/// resourceVersion "1".
pub fn cms(prefix: &str, count: usize) -> Vec<ConfigMap> {
    (0..count)
        .map(|i| cm(&format!("{prefix}-{i:03}"), "1"))
        .collect()
}

/// The name of an object.
pub fn name_of<T: Resource>(object: &T) -> String {
    object.meta().name.clone().unwrap_or_default()
}

/// Sends watcher events to a controller made with
/// [`Controller::for_events`](tokio_workqueue_kube::Controller::for_events).
pub struct Feeder<T> {
    tx: UnboundedSender<Result<Event<T>, watcher::Error>>,
}

/// A feeder and the event stream to give the controller.
pub fn feeder<T>() -> (
    Feeder<T>,
    UnboundedReceiver<Result<Event<T>, watcher::Error>>,
) {
    let (tx, rx) = unbounded();
    (Feeder { tx }, rx)
}

impl<T> Feeder<T> {
    /// Sends `event`; after the controller stopped watching (dropped the
    /// stream) the event goes nowhere, as it would from a real watcher.
    pub fn send(&self, event: Event<T>) {
        let _ = self.tx.unbounded_send(Ok(event));
    }

    /// Whether the controller dropped the event stream (stopped watching).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    pub fn init(&self) {
        self.send(Event::Init);
    }

    pub fn init_apply(&self, object: T) {
        self.send(Event::InitApply(object));
    }

    pub fn init_done(&self) {
        self.send(Event::InitDone);
    }

    pub fn apply(&self, object: T) {
        self.send(Event::Apply(object));
    }

    pub fn delete(&self, object: T) {
        self.send(Event::Delete(object));
    }

    /// A watcher error.
    pub fn error(&self, error: watcher::Error) {
        let _ = self.tx.unbounded_send(Err(error));
    }

    /// A whole (re-)list: `Init`, one `InitApply` per object, `InitDone`.
    pub fn list(&self, objects: impl IntoIterator<Item = T>) {
        self.init();
        for object in objects {
            self.init_apply(object);
        }
        self.init_done();
    }

    /// Ends the event stream.
    pub fn close(self) {}
}

/// A controller on a watch the test feeds by hand (`feed`), with a store
/// of its own.
pub fn fed() -> (
    Feeder<ConfigMap>,
    tokio_workqueue_kube::Controller<ConfigMap>,
) {
    let (feed, events) = feeder();
    let controller = tokio_workqueue_kube::Controller::for_events(
        events,
        kube_runtime::reflector::store::Writer::default(),
    );
    (feed, controller)
}

/// Sends items to a stream given to `for_stream`, `owns_stream`,
/// `watches_stream`, `reconcile_on` or `reconcile_all_on`.
pub struct Sender<T>(UnboundedSender<T>);

/// A sender and the stream to give the controller.
pub fn sender<T>() -> (Sender<T>, UnboundedReceiver<T>) {
    let (tx, rx) = unbounded();
    (Sender(tx), rx)
}

impl<T> Sender<T> {
    /// Sends `item` (nowhere, once the controller dropped the stream).
    pub fn send(&self, item: T) {
        let _ = self.0.unbounded_send(item);
    }

    /// Whether the controller dropped the stream.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Ends the stream.
    pub fn close(self) {}
}

impl<T> Sender<Result<T, watcher::Error>> {
    /// Sends an object.
    pub fn object(&self, object: T) {
        self.send(Ok(object));
    }
}

/// The reconcilers' error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestError(pub String);

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "test error: {}", self.0)
    }
}

impl std::error::Error for TestError {}

/// A failed reconcile with message `what`.
pub fn fail(what: &str) -> Answer {
    Err(TestError(what.into()))
}

/// How a reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The reconcile future ran to its end.
    Finished,
    /// The reconcile panicked.
    Panicked,
    /// The reconcile future was dropped before its end (timeout, abort).
    Dropped,
}

/// One reconcile.
#[derive(Debug, Clone)]
pub struct Run {
    pub name: String,
    /// The resourceVersion of the object the reconcile was given.
    pub rv: Option<String>,
    /// Since the record was made.
    pub start: Duration,
    pub end: Option<Duration>,
    pub ended: Option<Ended>,
}

#[derive(Default)]
struct Inner {
    runs: Vec<Run>,
    running: HashMap<String, usize>,
    running_total: usize,
    max_per_key: HashMap<String, usize>,
    max_total: usize,
}

/// Every reconcile, in the order they started, and how many ran at once
/// (per key and overall). Cheap to clone: clones share the record.
#[derive(Clone)]
pub struct Record {
    epoch: Instant,
    inner: Arc<Mutex<Inner>>,
}

/// A reconcile in progress. [`finish`](Self::finish) ends it as finished;
/// dropped without it (the future was cancelled, or it panicked), it ends
/// as dropped.
pub struct Running {
    record: Record,
    index: usize,
    finished: bool,
}

impl Running {
    pub fn finish(mut self) {
        self.finished = true;
    }

    /// How many reconciles of this key started before this one.
    pub fn earlier(&self) -> usize {
        let inner = self.record.lock();
        let name = &inner.runs[self.index].name;
        inner.runs[..self.index]
            .iter()
            .filter(|r| &r.name == name)
            .count()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let end = self.record.now();
        let mut inner = self.record.lock();
        let run = &mut inner.runs[self.index];
        run.end = Some(end);
        run.ended = Some(if self.finished {
            Ended::Finished
        } else if std::thread::panicking() {
            Ended::Panicked
        } else {
            Ended::Dropped
        });
        let name = run.name.clone();
        *inner.running.get_mut(&name).expect("a running key") -= 1;
        inner.running_total -= 1;
    }
}

impl Record {
    /// An empty record; its times count from now.
    pub fn new() -> Self {
        Record {
            epoch: Instant::now(),
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The time since the record was made.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// The instant the record counts from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Records the start of a reconcile of `object`.
    pub fn begin(&self, object: &ConfigMap) -> Running {
        let start = self.now();
        let name = name_of(object);
        let mut inner = self.lock();
        let running = inner.running.entry(name.clone()).or_default();
        *running += 1;
        let running = *running;
        let max = inner.max_per_key.entry(name.clone()).or_default();
        *max = (*max).max(running);
        inner.running_total += 1;
        inner.max_total = inner.max_total.max(inner.running_total);
        inner.runs.push(Run {
            name,
            rv: object.metadata.resource_version.clone(),
            start,
            end: None,
            ended: None,
        });
        Running {
            record: self.clone(),
            index: inner.runs.len() - 1,
            finished: false,
        }
    }

    /// A reconciler (as `Controller::run` takes it) that records each
    /// reconcile, works for `work` of paused time, then answers
    /// `answer(name, attempt)`, `attempt` counting this key's reconciles
    /// from 1. `answer` may panic: the panic happens inside the future.
    pub fn reconciler<Ctx: Send + Sync + 'static>(
        &self,
        work: Duration,
        answer: impl Fn(&str, usize) -> Answer + Send + Sync + 'static,
    ) -> impl FnMut(Arc<ConfigMap>, Arc<Ctx>) -> BoxFuture<'static, Answer> + Send + 'static {
        self.reconciler_with(move |_, _| work, answer)
    }

    /// [`reconciler`](Self::reconciler) working for `work(name, attempt)`.
    pub fn reconciler_with<Ctx: Send + Sync + 'static>(
        &self,
        work: impl Fn(&str, usize) -> Duration + Send + Sync + 'static,
        answer: impl Fn(&str, usize) -> Answer + Send + Sync + 'static,
    ) -> impl FnMut(Arc<ConfigMap>, Arc<Ctx>) -> BoxFuture<'static, Answer> + Send + 'static {
        let record = self.clone();
        let work = Arc::new(work);
        let answer = Arc::new(answer);
        move |object: Arc<ConfigMap>, _ctx: Arc<Ctx>| {
            let running = record.begin(&object);
            let (work, answer) = (work.clone(), answer.clone());
            Box::pin(async move {
                let name = name_of(&*object);
                let attempt = running.earlier() + 1;
                let work = work(&name, attempt);
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                let result = answer(&name, attempt);
                running.finish();
                result
            })
        }
    }

    /// Every reconcile, in the order they started.
    pub fn runs(&self) -> Vec<Run> {
        self.lock().runs.clone()
    }

    /// The names reconciled, in the order they started.
    pub fn starts(&self) -> Vec<String> {
        self.lock().runs.iter().map(|r| r.name.clone()).collect()
    }

    /// How many reconciles started.
    pub fn len(&self) -> usize {
        self.lock().runs.len()
    }

    /// When each reconcile of `name` started.
    pub fn starts_of(&self, name: &str) -> Vec<Duration> {
        self.runs_of(name).iter().map(|r| r.start).collect()
    }

    /// The reconciles of `name`.
    pub fn runs_of(&self, name: &str) -> Vec<Run> {
        self.lock()
            .runs
            .iter()
            .filter(|r| r.name == name)
            .cloned()
            .collect()
    }

    /// How many reconciles of `name` started.
    pub fn count(&self, name: &str) -> usize {
        self.lock().runs.iter().filter(|r| r.name == name).count()
    }

    /// The most reconciles that ran at once.
    pub fn max_concurrency(&self) -> usize {
        self.lock().max_total
    }

    /// The most reconciles of one key that ran at once, over all keys.
    pub fn max_per_key(&self) -> usize {
        self.lock().max_per_key.values().copied().max().unwrap_or(0)
    }

    /// How many reconciles are running now.
    pub fn running(&self) -> usize {
        self.lock().running_total
    }
}

impl Default for Record {
    fn default() -> Self {
        Self::new()
    }
}

/// What the controller reported, simplified for assertions.
#[derive(Debug, Clone, PartialEq)]
pub enum Reported {
    /// `Ok((key, action))`.
    Ok(String, Action),
    /// `Err(ObjectNotFound(key))`.
    NotFound(String),
    /// `Err(ReconcilerFailed(error, key))`.
    Failed(String, TestError),
    /// `Err(QueueError(ReconcilePanicked))`.
    Panicked(String, String),
    /// `Err(QueueError(ReconcileTimedOut))`.
    TimedOut(String, Duration),
    /// `Err(QueueError(RequeueRefused))`.
    Refused(String),
    /// Anything else, as text.
    Other(String),
}

impl Reported {
    /// The name of the object the report is about, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Reported::Ok(n, _)
            | Reported::NotFound(n)
            | Reported::Failed(n, _)
            | Reported::Panicked(n, _)
            | Reported::TimedOut(n, _)
            | Reported::Refused(n) => Some(n),
            Reported::Other(_) => None,
        }
    }
}

/// Simplifies one item of the result stream, checking that every object
/// reference in it is a ConfigMap in [`NS`].
pub fn simplify(item: &Item) -> Reported {
    fn erased(object: &ObjectRef<kube_client::core::DynamicObject>) -> String {
        assert_eq!(object.dyntype.kind, "ConfigMap", "{object}");
        assert_eq!(object.namespace.as_deref(), Some(NS), "{object}");
        object.name.clone()
    }
    match item {
        Ok((key, action)) => {
            assert_eq!(key.namespace.as_deref(), Some(NS), "{key}");
            Reported::Ok(key.name.clone(), action.clone())
        }
        Err(Error::ObjectNotFound(object)) => Reported::NotFound(erased(object)),
        Err(Error::ReconcilerFailed(error, object)) => {
            Reported::Failed(erased(object), error.clone())
        }
        Err(Error::QueueError(ControllerError::ReconcilePanicked { object, message })) => {
            Reported::Panicked(erased(object), message.clone())
        }
        Err(Error::QueueError(ControllerError::ReconcileTimedOut { object, after })) => {
            Reported::TimedOut(erased(object), *after)
        }
        Err(Error::QueueError(ControllerError::RequeueRefused { object, .. })) => {
            Reported::Refused(erased(object))
        }
        Err(other) => Reported::Other(other.to_string()),
    }
}

#[derive(Default)]
struct Collection {
    items: Vec<(Duration, Reported)>,
    ended: Option<Duration>,
}

/// Polls a controller's result stream on a task of its own, keeping every
/// item with the time it came.
pub struct Collected {
    epoch: Instant,
    collection: Arc<Mutex<Collection>>,
    task: JoinHandle<()>,
}

impl Collected {
    /// Starts polling `stream`; times count from `record`'s epoch.
    pub fn spawn(
        record: &Record,
        stream: impl futures::Stream<Item = Item> + Send + 'static,
    ) -> Self {
        let epoch = record.epoch();
        let collection = Arc::new(Mutex::new(Collection::default()));
        let into = collection.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let reported = simplify(&item);
                into.lock().unwrap().items.push((epoch.elapsed(), reported));
            }
            into.lock().unwrap().ended = Some(epoch.elapsed());
        });
        Collected {
            epoch,
            collection,
            task,
        }
    }

    /// What was reported so far.
    pub fn reports(&self) -> Vec<Reported> {
        let c = self.collection.lock().unwrap();
        c.items.iter().map(|(_, r)| r.clone()).collect()
    }

    /// What was reported so far, with when.
    pub fn timed_reports(&self) -> Vec<(Duration, Reported)> {
        self.collection.lock().unwrap().items.clone()
    }

    /// When the stream ended, if it did.
    pub fn ended(&self) -> Option<Duration> {
        self.collection.lock().unwrap().ended
    }

    /// Waits (at most a day of paused time) for the stream to end and
    /// returns everything it reported.
    pub async fn finish(self) -> Vec<Reported> {
        let Collected {
            collection, task, ..
        } = self;
        within_a_day(task)
            .await
            .expect("the collecting task failed");
        let c = collection.lock().unwrap();
        assert!(c.ended.is_some());
        c.items.iter().map(|(_, r)| r.clone()).collect()
    }

    /// Drops the stream (aborting its task) and waits until it is gone.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// The instant times count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }
}

/// Waits for `future`, failing the test if it takes more than a day of
/// paused time (a controller that never ends, instead of a hung test).
pub async fn within_a_day<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(86_400), future)
        .await
        .expect("did not happen within a day (paused time)")
}

/// Lets paused time run for `d`: everything due meanwhile happens.
pub async fn advance(d: Duration) {
    tokio::time::sleep(d).await;
}

/// An error policy that always answers `action`.
pub fn policy<Ctx>(action: Action) -> impl Fn(Arc<ConfigMap>, &TestError, Arc<Ctx>) -> Action {
    move |_, _, _| action.clone()
}

/// The names `{prefix}-000`, `{prefix}-001`, ... for `range`, leaving out
/// the numbers in `except`: a list's expected order around the keys that
/// went ahead of it.
pub fn names(prefix: &str, range: std::ops::Range<usize>, except: &[usize]) -> Vec<String> {
    range
        .filter(|i| !except.contains(i))
        .map(|i| format!("{prefix}-{i:03}"))
        .collect()
}

/// A controller fed by hand-made events that reconciles one key at a time
/// (1 ms each, always succeeding, never requeued), recorded in `record`:
/// the feeder for its events and the collected stream.
pub fn one_at_a_time(record: &Record) -> (Feeder<ConfigMap>, Collected) {
    let (feed, controller) = fed();
    let stream = controller.concurrency(1).run(
        record.reconciler(ms(1), |_, _| Ok(Action::await_change())),
        policy(Action::await_change()),
        Arc::new(()),
    );
    (feed, Collected::spawn(record, stream))
}
