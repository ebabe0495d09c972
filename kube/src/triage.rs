//! Why an object turns up: telling an initial list, a re-delivery and a real
//! change apart.
//!
//! A watcher reports every object it lists, every change and every deletion,
//! but it does not say whether an object it lists again (after a restarted
//! watch or a `410 Gone`) changed meanwhile. [`Triage`] remembers each
//! object's last `resourceVersion` under a small key of the caller's choice
//! and gives every event a [`Cause`]; both the watcher adapter and the
//! controller choose priorities from it.

use std::collections::{HashMap, HashSet};
use std::fmt;

use kube_client::Resource;
use kube_runtime::watcher::Event;

/// Why a key was added: what the watch event meant for its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The object came with the watcher's first list (`InitApply` before the
    /// first `InitDone`).
    InitialList,
    /// The object came again (a re-list's `InitApply` or an `Apply`) with the
    /// `resourceVersion` it had last time.
    Unchanged,
    /// The object is new or its `resourceVersion` changed (`Apply`, or a
    /// re-list's `InitApply`).
    Changed,
    /// The object was deleted (`Delete`).
    Deleted,
    /// The object was known but a re-list did not show it: its delete event
    /// was missed while the watch was down.
    MissingAfterRelist,
}

impl Cause {
    /// Whether the object still exists after the event that had this cause.
    pub const fn object_exists(self) -> bool {
        !matches!(self, Cause::Deleted | Cause::MissingAfterRelist)
    }
}

/// The identity of a watched object: namespace and name.
type ObjectId = (Option<String>, String);

/// What is remembered of an object seen and not deleted since.
#[derive(Debug, Clone)]
struct Seen<Key> {
    key: Key,
    resource_version: Option<String>,
}

/// Gives each watch event a [`Cause`], remembering per object the key it was
/// reported under and its last `resourceVersion`.
///
/// `emit(key, cause)` is called once per object an event concerns and
/// answers whether the key was taken; an object whose key was refused is not
/// remembered, so it is treated as new next time.
pub(crate) struct Triage<Key> {
    seen: HashMap<ObjectId, Seen<Key>>,
    /// Objects listed since the last `Init`, while a list is in progress.
    listing: Option<HashSet<ObjectId>>,
    /// Whether a first list has completed.
    synced: bool,
    /// Whether objects a re-list no longer shows are reported.
    relist_deletions: bool,
}

impl<Key> fmt::Debug for Triage<Key> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Triage")
            .field("objects_seen", &self.seen.len())
            .field("listing", &self.listing.as_ref().map(HashSet::len))
            .field("synced", &self.synced)
            .field("relist_deletions", &self.relist_deletions)
            .finish()
    }
}

impl<Key> Triage<Key> {
    pub(crate) fn new() -> Self {
        Triage {
            seen: HashMap::new(),
            listing: None,
            synced: false,
            relist_deletions: true,
        }
    }

    pub(crate) fn relist_deletions(&mut self, enabled: bool) {
        self.relist_deletions = enabled;
    }
}

impl<Key: Clone + PartialEq> Triage<Key> {
    /// Handles one watcher event; `key_fn` maps a present object to its key.
    pub(crate) fn event<T: Resource>(
        &mut self,
        event: Event<T>,
        key_fn: impl FnOnce(&T) -> Key,
        mut emit: impl FnMut(Key, Cause) -> bool,
    ) {
        match event {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(object) => {
                let id = object_id(&object);
                self.listing
                    .get_or_insert_with(HashSet::new)
                    .insert(id.clone());
                let initial = !self.synced;
                self.apply(id, &object, initial, key_fn, emit);
            }
            Event::Apply(object) => self.object(&object, false, key_fn, emit),
            Event::Delete(object) => {
                let id = object_id(&object);
                let key = match self.seen.remove(&id) {
                    // The object may have moved keys since it was last seen;
                    // the key function looks at the object as it is now.
                    Some(seen) => seen.key,
                    None => key_fn(&object),
                };
                if let Some(listing) = &mut self.listing {
                    listing.remove(&id);
                }
                emit(key, Cause::Deleted);
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                if self.relist_deletions {
                    let missing: Vec<ObjectId> = self
                        .seen
                        .keys()
                        .filter(|id| !listed.contains(*id))
                        .cloned()
                        .collect();
                    for id in missing {
                        if let Some(seen) = self.seen.remove(&id) {
                            emit(seen.key, Cause::MissingAfterRelist);
                        }
                    }
                } else {
                    self.seen.retain(|id, _| listed.contains(id));
                }
                self.synced = true;
            }
        }
    }

    /// Handles a present object from a stream that carries objects, not
    /// events: `initial` says it belongs to the first list.
    pub(crate) fn object<T: Resource>(
        &mut self,
        object: &T,
        initial: bool,
        key_fn: impl FnOnce(&T) -> Key,
        emit: impl FnMut(Key, Cause) -> bool,
    ) {
        self.apply(object_id(object), object, initial, key_fn, emit);
    }

    fn apply<T: Resource>(
        &mut self,
        id: ObjectId,
        object: &T,
        initial: bool,
        key_fn: impl FnOnce(&T) -> Key,
        mut emit: impl FnMut(Key, Cause) -> bool,
    ) {
        let key = key_fn(object);
        let resource_version = object.meta().resource_version.clone();
        let same = self.seen.get(&id).is_some_and(|seen| {
            seen.key == key
                && resource_version.is_some()
                && seen.resource_version == resource_version
        });
        let cause = if initial {
            Cause::InitialList
        } else if same {
            Cause::Unchanged
        } else {
            Cause::Changed
        };
        if emit(key.clone(), cause) {
            self.seen.insert(
                id,
                Seen {
                    key,
                    resource_version,
                },
            );
        }
    }
}

fn object_id<T: Resource>(object: &T) -> ObjectId {
    let meta = object.meta();
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}
