//! Why an object turns up: telling an initial list, a re-delivery and a real
//! change apart.
//!
//! A watcher reports every object it lists, every change and every deletion,
//! but it does not say whether an object it lists again (after a restarted
//! watch or a `410 Gone`) changed meanwhile. [`Triage`] remembers each
//! object's last `resourceVersion` under a small key of the caller's choice
//! and gives every event a [`Cause`]; both the watcher adapter and the
//! controller choose priorities from it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
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

/// The identity of a watched object, namespace and name in one allocation
/// (`namespace NUL name`, or the name alone for a cluster-scoped object:
/// Kubernetes names and namespaces never hold a NUL).
type ObjectId = Box<str>;

/// An object's last `resourceVersion`. Kubernetes calls it opaque, but the
/// API server's are decimal etcd revisions: those are kept as a number (no
/// allocation), anything else as text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    Absent,
    Number(u64),
    Text(Box<str>),
}

impl Version {
    fn of(rv: Option<&str>) -> Self {
        match rv {
            None => Version::Absent,
            // Only canonical decimals (no sign, no leading zero) are kept
            // as numbers, so two different strings never compare equal;
            // told apart without formatting the number back (every watch
            // event comes through here).
            Some(rv) => match rv.parse::<u64>() {
                Ok(n) if canonical_decimal(rv) => Version::Number(n),
                _ => Version::Text(rv.into()),
            },
        }
    }

    /// Whether an object with this version is the same as one with `other`:
    /// never when either has none.
    fn same_as(&self, other: &Version) -> bool {
        !matches!(self, Version::Absent) && self == other
    }
}

/// What is remembered of an object seen and not deleted since: the key it
/// was reported under (unless keys are made from the objects themselves,
/// when the object at hand gives it again), and its version.
#[derive(Debug, Clone)]
struct Seen<Key> {
    /// Boxed: a map entry stays two words and a version where there is no
    /// key to keep (a key is several strings wide).
    key: Option<Box<Key>>,
    version: Version,
    /// The number of the last list that showed the object.
    list: u32,
}

/// Gives each watch event a [`Cause`], remembering per object the key it was
/// reported under and its last `resourceVersion`.
///
/// `emit(key, cause)` is called once per object an event concerns and
/// answers whether the key was taken; an object whose key was refused is not
/// remembered, so it is treated as new next time.
///
/// It holds an entry per object for as long as the watch runs, in every
/// controller: an entry is kept small (the identity in one allocation, a
/// numeric version inline, and no key at all where the key is the object's
/// own reference).
pub(crate) struct Triage<Key> {
    seen: HashMap<ObjectId, Seen<Key>>,
    /// The number of the latest list (each `Init` starts the next); an
    /// object it showed carries that number in its entry. A mark in the
    /// entry rather than a set of the listed objects' identities, which
    /// cost a copy of each identity, an allocation, for every list.
    list: u32,
    /// Whether a list is in progress (between `Init` and `InitDone`).
    listing: bool,
    /// Whether a first list has completed.
    synced: bool,
    /// Whether objects a re-list no longer shows are reported.
    relist_deletions: bool,
    /// Whether an object's key is made from the object alone, so that it
    /// need not be remembered.
    keys_from_objects: bool,
}

impl<Key> fmt::Debug for Triage<Key> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Triage")
            .field("objects_seen", &self.seen.len())
            .field("listing", &self.listing)
            .field("synced", &self.synced)
            .field("relist_deletions", &self.relist_deletions)
            .finish()
    }
}

impl<Key> Triage<Key> {
    pub(crate) fn new() -> Self {
        Triage {
            seen: HashMap::new(),
            list: 0,
            listing: false,
            synced: false,
            relist_deletions: true,
            keys_from_objects: false,
        }
    }

    pub(crate) fn relist_deletions(&mut self, enabled: bool) {
        debug_assert!(
            !(enabled && self.keys_from_objects),
            "a re-list's deletions are reported by remembered keys"
        );
        self.relist_deletions = enabled;
    }

    /// The key function gives each object the same key for as long as it
    /// exists (its own reference): keys are not remembered, and the object
    /// of a deletion gives its key again. A re-list's missing objects, which
    /// come with no object, are then not reported.
    pub(crate) fn keys_from_objects(&mut self) {
        self.relist_deletions = false;
        self.keys_from_objects = true;
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
            Event::Init => self.start_list(),
            Event::InitApply(object) => {
                if !self.listing {
                    self.start_list();
                }
                let initial = !self.synced;
                self.apply(object_id(&object), &object, initial, true, key_fn, emit);
            }
            Event::Apply(object) => self.object(&object, false, key_fn, emit),
            Event::Delete(object) => {
                let id = object_id(&object);
                let key = match self.seen.remove(&id).and_then(|seen| seen.key) {
                    // The object may have moved keys since it was last seen;
                    // the key function looks at the object as it is now.
                    Some(key) => *key,
                    None => key_fn(&object),
                };
                emit(key, Cause::Deleted);
            }
            Event::InitDone => {
                // A list's end without its start (never from a watcher)
                // showed nothing.
                let list = std::mem::take(&mut self.listing).then_some(self.list);
                // What the list did not show is forgotten, and reported
                // where its key is remembered (and asked for).
                let report = self.relist_deletions;
                for (_, gone) in self.seen.extract_if(|_, seen| Some(seen.list) != list) {
                    if let (true, Some(key)) = (report, gone.key) {
                        emit(*key, Cause::MissingAfterRelist);
                    }
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
        self.apply(object_id(object), object, initial, false, key_fn, emit);
    }

    /// Starts a list: the objects it shows are marked with its number.
    fn start_list(&mut self) {
        self.list = self.list.wrapping_add(1).max(1);
        self.listing = true;
    }

    /// `listed`: the object came with the list in progress, which marks it
    /// (even when its key is refused, so that it is not taken for missing).
    fn apply<T: Resource>(
        &mut self,
        id: ObjectId,
        object: &T,
        initial: bool,
        listed: bool,
        key_fn: impl FnOnce(&T) -> Key,
        mut emit: impl FnMut(Key, Cause) -> bool,
    ) {
        let key = key_fn(object);
        let version = Version::of(object.meta().resource_version.as_deref());
        let kept = (!self.keys_from_objects).then(|| Box::new(key.clone()));
        // One lookup per event: the entry is read, then written or marked.
        let mut entry = self.seen.entry(id);
        let before = match &mut entry {
            Entry::Occupied(seen) => Some(seen.get_mut()),
            Entry::Vacant(_) => None,
        };
        let same = before.as_ref().is_some_and(|seen| {
            seen.key.as_ref().is_none_or(|k| **k == key) && seen.version.same_as(&version)
        });
        let list = match (listed, before) {
            (true, Some(seen)) => {
                seen.list = self.list;
                self.list
            }
            (true, None) => self.list,
            (false, before) => before.map_or(0, |seen| seen.list),
        };
        let cause = if initial {
            Cause::InitialList
        } else if same {
            Cause::Unchanged
        } else {
            Cause::Changed
        };
        if emit(key, cause) {
            entry.insert_entry(Seen {
                key: kept,
                version,
                list,
            });
        }
    }
}

/// Whether `s` is how a `u64` prints: digits only, no leading zero.
fn canonical_decimal(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit()) && (s.len() == 1 || !s.starts_with('0'))
}

fn object_id<T: Resource>(object: &T) -> ObjectId {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => [ns.as_str(), "\0", name].concat().into_boxed_str(),
        None => name.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    fn cm(ns: Option<&str>, name: &str, rv: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: ns.map(Into::into),
                name: Some(name.into()),
                resource_version: rv.map(Into::into),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// The causes `triage` gives `events`, with the keys (object names).
    fn causes(triage: &mut Triage<String>, events: Vec<Event<ConfigMap>>) -> Vec<(String, Cause)> {
        let mut out = Vec::new();
        for e in events {
            triage.event(
                e,
                |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default(),
                |k, c| {
                    out.push((k, c));
                    true
                },
            );
        }
        out
    }

    fn names(v: &[(String, Cause)]) -> Vec<(&str, Cause)> {
        v.iter().map(|(k, c)| (k.as_str(), *c)).collect()
    }

    #[test]
    fn versions_compare_as_the_strings_they_came_from() {
        assert_eq!(Version::of(Some("12")), Version::Number(12));
        assert!(Version::of(Some("12")).same_as(&Version::of(Some("12"))));
        assert!(!Version::of(Some("012")).same_as(&Version::of(Some("12"))));
        assert!(!Version::of(Some("+12")).same_as(&Version::of(Some("12"))));
        assert_eq!(Version::of(Some("0")), Version::Number(0));
        assert!(!Version::of(Some("12")).same_as(&Version::of(Some("13"))));
        assert!(Version::of(Some("abc")).same_as(&Version::of(Some("abc"))));
        assert!(!Version::of(None).same_as(&Version::of(None)));
    }

    #[test]
    fn identities_tell_namespaces_and_cluster_scope_apart() {
        let ids = [
            object_id(&cm(Some("a"), "b", None)),
            object_id(&cm(Some("ab"), "", None)),
            object_id(&cm(None, "ab", None)),
            object_id(&cm(Some(""), "ab", None)),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    fn relist_of(objects: Vec<ConfigMap>) -> Vec<Event<ConfigMap>> {
        let mut events = vec![Event::Init];
        events.extend(objects.into_iter().map(Event::InitApply));
        events.push(Event::InitDone);
        events
    }

    #[test]
    fn a_relist_tells_unchanged_changed_and_missing_objects_apart() {
        for keys_from_objects in [false, true] {
            let mut t = Triage::new();
            if keys_from_objects {
                t.keys_from_objects();
            }
            let first = causes(
                &mut t,
                relist_of(vec![
                    cm(Some("ns"), "same", Some("5")),
                    cm(Some("ns"), "edited", Some("6")),
                    cm(Some("ns"), "gone", Some("7")),
                ]),
            );
            assert!(first.iter().all(|(_, c)| *c == Cause::InitialList));
            let again = causes(
                &mut t,
                relist_of(vec![
                    cm(Some("ns"), "same", Some("5")),
                    cm(Some("ns"), "edited", Some("9")),
                ]),
            );
            let mut want = vec![("same", Cause::Unchanged), ("edited", Cause::Changed)];
            if !keys_from_objects {
                // Only a remembered key can report an object that came with
                // no event of its own.
                want.push(("gone", Cause::MissingAfterRelist));
            }
            assert_eq!(
                names(&again),
                want,
                "keys_from_objects: {keys_from_objects}"
            );
        }
    }

    #[test]
    fn an_object_a_relist_no_longer_shows_is_forgotten() {
        let mut t = Triage::new();
        t.keys_from_objects();
        causes(&mut t, relist_of(vec![cm(Some("ns"), "gone", Some("7"))]));
        causes(&mut t, relist_of(vec![]));
        // Back with the version it had: new to the triage, so changed.
        let back = causes(
            &mut t,
            vec![Event::Apply(cm(Some("ns"), "gone", Some("7")))],
        );
        assert_eq!(names(&back), [("gone", Cause::Changed)]);
    }

    #[test]
    fn an_object_listed_with_its_key_refused_is_not_missing() {
        let mut t = Triage::new();
        causes(&mut t, relist_of(vec![cm(Some("ns"), "a", Some("1"))]));
        // A re-list shows it, but its key is refused (the queue is shutting
        // down): still known, and not reported missing at the list's end.
        let mut reported = Vec::new();
        for event in relist_of(vec![cm(Some("ns"), "a", Some("2"))]) {
            t.event(
                event,
                |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default(),
                |k, c| {
                    reported.push((k, c));
                    false
                },
            );
        }
        assert_eq!(names(&reported), [("a", Cause::Changed)]);
        // Kept with the version it had before the refused event.
        let again = causes(&mut t, relist_of(vec![cm(Some("ns"), "a", Some("1"))]));
        assert_eq!(names(&again), [("a", Cause::Unchanged)]);
        let gone = causes(&mut t, relist_of(vec![]));
        assert_eq!(names(&gone), [("a", Cause::MissingAfterRelist)]);
    }

    #[test]
    fn a_deletion_is_reported_under_its_key_in_both_modes() {
        for keys_from_objects in [false, true] {
            let mut t = Triage::new();
            if keys_from_objects {
                t.keys_from_objects();
            }
            let got = causes(
                &mut t,
                vec![
                    Event::Apply(cm(Some("ns"), "a", Some("1"))),
                    Event::Apply(cm(Some("ns"), "a", Some("1"))),
                    Event::Delete(cm(Some("ns"), "a", Some("2"))),
                    Event::Apply(cm(Some("ns"), "a", Some("3"))),
                ],
            );
            assert_eq!(
                names(&got),
                [
                    ("a", Cause::Changed),
                    ("a", Cause::Unchanged),
                    ("a", Cause::Deleted),
                    ("a", Cause::Changed),
                ]
            );
        }
    }
}
