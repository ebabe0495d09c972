//! From watch events and user streams to requests to reconcile a key.
//!
//! Every source of a reconcile (the main watcher, children, other kinds,
//! bulk and explicit triggers) becomes a stream of [`Trigger`]s that says
//! which key, what the event meant for it (its [`Source`], from which the
//! runner picks a priority) and kube-runtime's [`ReconcileReason`] for the
//! tracing span.

use std::hash::Hash;
use tokio_workqueue::Key;

use futures_util::FutureExt;
use futures_util::stream::{self, BoxStream, StreamExt};
use kube_client::Resource;
use kube_client::core::DynamicObject;
use kube_runtime::controller::ReconcileReason;
use kube_runtime::reflector::{ObjectRef, Store};
use kube_runtime::watcher::{self, Event};

use crate::WatchPriorities;
use crate::triage::{Cause, Triage};

/// Where a request to reconcile came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A watch event of the main kind or of a related one.
    Watch(Cause),
    /// `reconcile_all_on`: every object again, nothing known to have changed.
    Bulk,
    /// `reconcile_on`: a key the user asked for.
    Requested,
}

impl Source {
    /// The priority a key from this source is added with.
    pub(crate) fn priority(self, priorities: &WatchPriorities) -> i32 {
        match self {
            Source::Watch(cause) => priorities.for_cause(cause),
            Source::Bulk => priorities.unchanged,
            Source::Requested => priorities.changed,
        }
    }
}

/// The key an object of the main kind is queued under: its namespace and
/// name (and kind, for dynamic types).
///
/// kube-runtime's keys also carry the object's `resourceVersion` and `uid`
/// (`ObjectRef::extra`), which take no part in a key's equality or hash, are
/// stale once the object changes, and cost two allocations for every queued
/// key, every controller: each controller holds a key per object while the
/// initial list waits for its first reconcile, and those small allocations
/// are freed in between the cache's objects, where the allocator keeps
/// them resident (`examples/manager_memory.rs`). So this crate's keys
/// leave them out; the object in the store has both.
pub(crate) fn key_of<K>(object: &K, dyntype: K::DynamicType) -> ObjectRef<K>
where
    K: Resource,
    K::DynamicType: Eq + Hash + Clone,
{
    let meta = object.meta();
    let key = ObjectRef::new_with(meta.name.as_deref().unwrap_or_default(), dyntype);
    match meta.namespace.as_deref() {
        Some(namespace) => key.within(namespace),
        None => key,
    }
}

/// A request to reconcile `key`.
pub(crate) struct Trigger<K: Resource> {
    pub(crate) key: ObjectRef<K>,
    pub(crate) source: Source,
    pub(crate) reason: ReconcileReason,
}

pub(crate) type TriggerStream<K> = BoxStream<'static, Result<Trigger<K>, watcher::Error>>;

/// Whether a store's first list is still in progress: asked of the store
/// until it says no, which it never takes back.
struct Listing<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    done: bool,
}

impl<K> Listing<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn new(store: Store<K>) -> Self {
        Listing { store, done: false }
    }

    fn in_progress(&mut self) -> bool {
        if !self.done {
            self.done = self.store.wait_until_ready().now_or_never().is_some();
        }
        !self.done
    }
}

/// Each item of `items` becomes the triggers `triage` pushes for it; a
/// watcher error passes through as it is.
fn per_item<K, T, S, F>(items: S, mut triage: F) -> TriggerStream<K>
where
    K: Resource + 'static,
    K::DynamicType: Send + 'static,
    S: futures_core::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    F: FnMut(T, &mut Vec<Result<Trigger<K>, watcher::Error>>) + Send + 'static,
{
    items
        .flat_map(move |item| {
            let mut out = Vec::new();
            match item {
                Ok(item) => triage(item, &mut out),
                Err(error) => out.push(Err(error)),
            }
            stream::iter(out)
        })
        .boxed()
}

/// The main kind's events: every present object triggers its own key.
/// Deleted objects trigger nothing, as in kube-runtime: a key whose object
/// has left the store is not reconciled.
///
/// The objects of a list (the first one or a re-list) trigger when the list
/// completes, not as they arrive: the reflector swaps a list into the store
/// only at `InitDone`, so a key handed out earlier would be reconciled
/// against the object as it was before the list, and a change the list
/// brought would be missed.
///
/// The first list is held too, although the runner hands out no key before
/// the store's first list is complete: a replica of a sharded controller
/// decides which keys are its own as they are queued, and learns its share
/// of the keys that were listed before it knew its members from the store,
/// so the first list's keys must not reach it before the store has them.
/// A manager's shared source sends a list only once its store has all of
/// it ([`Lists::Complete`]), and its lists are not held.
pub(crate) fn main_events<K, S>(events: S, dyntype: K::DynamicType) -> TriggerStream<K>
where
    K: Resource + Send + 'static,
    K::DynamicType: Key,
    S: futures_core::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    main_events_by(events, Lists::Streamed, move |object: &K| {
        key_of(object, dyntype.clone())
    })
}

/// When a main source's lists reach its triggers, relative to its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lists {
    /// As the watch lists them, before the store has them (a reflector swaps
    /// a list in at `InitDone`): a list's triggers are held to its end.
    Streamed,
    /// Once the store has the whole list (a manager's shared source): its
    /// triggers go on as they are read, and each controller holds no
    /// second list of its own (128 bytes per object) until the end.
    Complete,
}

/// [`main_events`] of objects of any type `T` (a manager's shared objects)
/// whose key `key_of` tells, from a source whose lists come as `lists` says.
pub(crate) fn main_events_by<K, T, S, F>(events: S, lists: Lists, key_of: F) -> TriggerStream<K>
where
    K: Resource + Send + 'static,
    K::DynamicType: Key,
    T: Resource + Send + 'static,
    S: futures_core::Stream<Item = Result<Event<T>, watcher::Error>> + Send + 'static,
    F: Fn(&T) -> ObjectRef<K> + Send + 'static,
{
    let mut triage = Triage::<ObjectRef<K>>::new();
    // A main object's key is its own reference.
    triage.keys_from_objects();
    // Triggers of the list in progress, held until its `InitDone`.
    let mut listed: Option<Vec<Result<Trigger<K>, watcher::Error>>> = None;
    per_item(events, move |event, out| {
        let (starts, ends) = match &event {
            Event::Init => (true, false),
            Event::InitDone => (false, true),
            _ => (false, false),
        };
        if starts && lists == Lists::Streamed {
            listed = Some(Vec::new());
        }
        let held = matches!(event, Event::InitApply(_));
        let sink = match (&mut listed, held) {
            (Some(listed), true) => listed,
            _ => &mut *out,
        };
        triage.event(event, &key_of, |key, cause| {
            if cause.object_exists() {
                sink.push(Ok(Trigger {
                    key,
                    source: Source::Watch(cause),
                    reason: ReconcileReason::ObjectUpdated,
                }));
            }
            true
        });
        if ends {
            out.extend(listed.take().unwrap_or_default());
        }
    })
}

/// A user's stream of main objects (`for_stream`): objects seen before
/// `store` is ready belong to the initial list.
pub(crate) fn main_objects<K, S>(
    objects: S,
    store: Store<K>,
    dyntype: K::DynamicType,
) -> TriggerStream<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Key,
    S: futures_core::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
{
    let mut triage = Triage::<ObjectRef<K>>::new();
    triage.keys_from_objects();
    let mut listing = Listing::new(store);
    objects
        .map(move |object| {
            object.map(|object| {
                let mut trigger = None;
                triage.object(
                    &object,
                    listing.in_progress(),
                    |object| key_of(object, dyntype.clone()),
                    |key, cause| {
                        trigger = Some(Trigger {
                            key,
                            source: Source::Watch(cause),
                            reason: ReconcileReason::ObjectUpdated,
                        });
                        true
                    },
                );
                trigger.expect("triage reports every present object")
            })
        })
        .boxed()
}

/// The keys a related object triggers, with the object's own reference.
type Related<K> = (Vec<ObjectRef<K>>, ObjectRef<DynamicObject>);

/// Events of a related kind (children, or anything with a mapper): each
/// event triggers the keys `mapper` finds for the object, deletions too.
pub(crate) fn related_events<K, O, S, M, I>(
    events: S,
    dyntype: O::DynamicType,
    mapper: M,
) -> TriggerStream<K>
where
    K: Resource + 'static,
    K::DynamicType: Key,
    O: Resource + Send + 'static,
    O::DynamicType: Clone + Send + 'static,
    S: futures_core::Stream<Item = Result<Event<O>, watcher::Error>> + Send + 'static,
    M: Fn(&O) -> I + Send + 'static,
    I: IntoIterator<Item = ObjectRef<K>>,
{
    let mut triage = Triage::<Related<K>>::new();
    per_item(events, move |event, out| {
        triage.event(
            event,
            |object| related(object, &dyntype, &mapper),
            |(keys, object), cause| {
                push_related(out, keys, &object, cause);
                true
            },
        )
    })
}

/// A user's stream of related objects (`owns_stream`, `watches_stream`):
/// objects first seen before the main store is ready count as listed.
pub(crate) fn related_objects<K, O, S, M, I>(
    objects: S,
    main_store: Store<K>,
    dyntype: O::DynamicType,
    mapper: M,
) -> TriggerStream<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Key,
    O: Resource + Send + 'static,
    O::DynamicType: Clone + Send + 'static,
    S: futures_core::Stream<Item = Result<O, watcher::Error>> + Send + 'static,
    M: Fn(&O) -> I + Send + 'static,
    I: IntoIterator<Item = ObjectRef<K>>,
{
    let mut triage = Triage::<Related<K>>::new();
    let mut listing = Listing::new(main_store);
    per_item(objects, move |object, out| {
        triage.object(
            &object,
            listing.in_progress(),
            |object| related(object, &dyntype, &mapper),
            |(keys, object), cause| {
                push_related(out, keys, &object, cause);
                true
            },
        )
    })
}

fn related<K, O, M, I>(object: &O, dyntype: &O::DynamicType, mapper: &M) -> Related<K>
where
    K: Resource,
    O: Resource,
    O::DynamicType: Clone,
    M: Fn(&O) -> I,
    I: IntoIterator<Item = ObjectRef<K>>,
{
    (
        mapper(object).into_iter().collect(),
        ObjectRef::from_obj_with(object, dyntype.clone()).erase(),
    )
}

fn push_related<K: Resource>(
    out: &mut Vec<Result<Trigger<K>, watcher::Error>>,
    keys: Vec<ObjectRef<K>>,
    object: &ObjectRef<DynamicObject>,
    cause: Cause,
) {
    out.extend(keys.into_iter().map(|key| {
        Ok(Trigger {
            key,
            source: Source::Watch(cause),
            reason: ReconcileReason::RelatedObjectUpdated {
                obj_ref: Box::new(object.clone()),
            },
        })
    }));
}

/// The owners of kind `K` named in `child`'s ownerReferences, as
/// kube-runtime's `trigger_owners` finds them, keyed as [`key_of`] keys
/// an object: without the owner's `uid`, which kube-runtime's reference
/// carries.
pub(crate) fn owners<K, C>(child: &C, owner_type: &K::DynamicType) -> Vec<ObjectRef<K>>
where
    K: Resource,
    K::DynamicType: Clone,
    C: Resource,
{
    let meta = child.meta();
    meta.owner_references
        .iter()
        .flatten()
        .filter_map(|owner| {
            let mut key =
                ObjectRef::from_owner_ref(meta.namespace.as_deref(), owner, owner_type.clone())?;
            key.extra = Default::default();
            Some(key)
        })
        .collect()
}

/// `reconcile_all_on`: each signal triggers every object in the store.
pub(crate) fn bulk<K, S>(signals: S, store: Store<K>, dyntype: K::DynamicType) -> TriggerStream<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Key,
    S: futures_core::Stream<Item = ()> + Send + 'static,
{
    signals
        .flat_map(move |()| {
            let dyntype = dyntype.clone();
            stream::iter(store.state().into_iter().map(move |object| {
                Ok(Trigger {
                    key: key_of(&*object, dyntype.clone()),
                    source: Source::Bulk,
                    reason: ReconcileReason::BulkReconcile,
                })
            }))
        })
        .boxed()
}

/// `reconcile_on`: the keys given.
pub(crate) fn requested<K, S>(keys: S) -> TriggerStream<K>
where
    K: Resource + 'static,
    K::DynamicType: Send + 'static,
    S: futures_core::Stream<Item = ObjectRef<K>> + Send + 'static,
{
    keys.map(|key| {
        Ok(Trigger {
            key,
            source: Source::Requested,
            reason: ReconcileReason::Unknown,
        })
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube_client::api::ObjectMeta;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// The keys `events` trigger, in order, from a source whose lists come
    /// as `lists` says.
    fn keys_triggered(lists: Lists, events: Vec<Event<ConfigMap>>) -> Vec<String> {
        let events = stream::iter(events.into_iter().map(Ok));
        let triggers = main_events_by(events, lists, |o: &ConfigMap| key_of(o, ()));
        // Every stream here is ready at once.
        triggers
            .collect::<Vec<_>>()
            .now_or_never()
            .expect("a stream of ready events")
            .into_iter()
            .map(|t| t.unwrap().key.name)
            .collect()
    }

    #[test]
    fn a_list_is_held_to_its_end_unless_the_store_has_it_already() {
        let unfinished = || {
            vec![
                Event::Init,
                Event::InitApply(cm("a")),
                Event::InitApply(cm("b")),
            ]
        };
        // A watch's list: the store has it only at `InitDone`.
        assert!(keys_triggered(Lists::Streamed, unfinished()).is_empty());
        let mut done = unfinished();
        done.push(Event::InitDone);
        assert_eq!(keys_triggered(Lists::Streamed, done.clone()), ["a", "b"]);
        // A manager's shared source: the list comes once the store has it.
        assert_eq!(keys_triggered(Lists::Complete, unfinished()), ["a", "b"]);
        assert_eq!(keys_triggered(Lists::Complete, done), ["a", "b"]);
    }

    #[test]
    fn keys_carry_namespace_and_name_only() {
        let meta = ObjectMeta {
            name: Some("a".into()),
            namespace: Some("ns".into()),
            resource_version: Some("7".into()),
            uid: Some("0c6b2a4e".into()),
            ..ObjectMeta::default()
        };
        let key = key_of(
            &ConfigMap {
                metadata: meta.clone(),
                ..ConfigMap::default()
            },
            (),
        );
        assert_eq!(key.name, "a");
        assert_eq!(key.namespace.as_deref(), Some("ns"));
        assert_eq!(key.extra.resource_version, None);
        assert_eq!(key.extra.uid, None);
        let cluster_scoped = key_of(
            &Namespace {
                metadata: ObjectMeta {
                    namespace: None,
                    ..meta
                },
                ..Namespace::default()
            },
            (),
        );
        assert_eq!(cluster_scoped.namespace, None);
        assert_eq!(cluster_scoped, ObjectRef::<Namespace>::new("a"));
        // A key from a child's owner reference is the same: no `uid`.
        let child = ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: "a".into(),
                    uid: "0c6b2a4e".into(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let owners = owners::<ConfigMap, _>(&child, &());
        assert_eq!(owners, [key]);
        assert_eq!(owners[0].extra.uid, None);
    }
}
