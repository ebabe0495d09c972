//! The server's state, as etcd and the watch cache hold it: every object by
//! (group, plural, namespace, name), one global resourceVersion counter,
//! the history of changes since the oldest version still served, and the
//! open watches.
//!
//! Everything sits behind one lock (the server's), so a write, its version
//! and the events it sends are one step: no watch can see changes out of
//! order or fall between a list and the watch that follows it. Reads and
//! writes (the verbs) are in `verbs/`; this module has what they share.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use crate::kinds::{KindSpec, Registry, Resource};
use crate::meta::Ids;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::watch::{Change, EventType, WatchSub};

/// How many changes the server remembers by default: a watch or an exact
/// list from a version older than the oldest remembered change gets 410.
pub(crate) const DEFAULT_HISTORY: usize = 200_000;

/// Where one object is stored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjKey {
    pub group: String,
    pub plural: String,
    /// `""` for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl ObjKey {
    pub fn new(resource: &Resource, namespace: &str, name: &str) -> ObjKey {
        ObjKey {
            group: resource.group.clone(),
            plural: resource.plural.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// The server's state.
#[derive(Debug)]
pub(crate) struct Store {
    pub registry: Registry,
    /// The last resourceVersion handed out.
    pub rv: u64,
    /// Watches and exact lists from a version below this one get 410: every
    /// change after it is in `history`.
    pub oldest_rv: u64,
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
    pub history: VecDeque<Arc<Change>>,
    pub history_limit: usize,
    pub watchers: Vec<WatchSub>,
    pub ids: Ids,
    /// Namespaces being deleted: emptied, then removed.
    pub terminating_namespaces: BTreeSet<String>,
    /// CRDs (by name) being deleted: their custom resources are removed,
    /// then the CRD.
    pub terminating_crds: BTreeSet<String>,
}

/// A list request's options.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListOpts {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

impl Store {
    pub fn new() -> Store {
        Store {
            registry: Registry::with_builtins(),
            rv: 0,
            oldest_rv: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: DEFAULT_HISTORY,
            watchers: Vec::new(),
            ids: Ids::new(),
            terminating_namespaces: BTreeSet::new(),
            terminating_crds: BTreeSet::new(),
        }
    }

    /// The object at `key`, if any.
    pub fn object(&self, key: &ObjKey) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }

    /// Stores `object` at `key` under a new resourceVersion, records the
    /// change and tells the watches. Returns the stored object.
    pub fn commit_put(&mut self, key: ObjKey, mut object: Value) -> Arc<Value> {
        self.rv += 1;
        crate::meta::meta_mut(&mut object)
            .insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        let object = Arc::new(object);
        let prev = self.objects.insert(key.clone(), object.clone());
        let ty = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(key, ty, object.clone(), prev);
        object
    }

    /// Removes the object at `key` under a new resourceVersion, records the
    /// change and tells the watches. Returns its last state.
    pub fn commit_delete(&mut self, key: &ObjKey) -> Option<Arc<Value>> {
        let prev = self.objects.remove(key)?;
        self.rv += 1;
        let mut last = (*prev).clone();
        crate::meta::meta_mut(&mut last)
            .insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        let last = Arc::new(last);
        self.record(key.clone(), EventType::Deleted, last.clone(), Some(prev));
        Some(last)
    }

    fn record(&mut self, key: ObjKey, ty: EventType, object: Arc<Value>, prev: Option<Arc<Value>>) {
        let change = Arc::new(Change {
            rv: self.rv,
            resource: Resource {
                group: key.group,
                plural: key.plural,
            },
            namespace: key.namespace,
            name: key.name,
            ty,
            object,
            prev,
        });
        self.notify(&change);
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.oldest_rv = old.rv;
            }
        }
    }

    fn notify(&mut self, change: &Change) {
        self.watchers.retain(|w| {
            if w.resource != change.resource {
                return !w.tx.is_closed();
            }
            w.send_change(change).unwrap_or_else(|| !w.tx.is_closed())
        });
    }

    /// Objects of `resource` (in `namespace`, or all), in key order, after
    /// `after` (a (namespace, name) position), as they are now.
    fn live_range<'a>(
        &'a self,
        resource: &'a Resource,
        namespace: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Value>)> + 'a {
        let start = match &after {
            Some((ns, name)) => Bound::Excluded(ObjKey::new(resource, ns, name)),
            None => Bound::Included(ObjKey::new(resource, namespace.unwrap_or(""), "")),
        };
        self.objects
            .range((start, Bound::Unbounded))
            .take_while(move |(k, _)| {
                k.group == resource.group
                    && k.plural == resource.plural
                    && namespace.is_none_or(|n| k.namespace == n)
            })
    }

    /// Objects of `resource` (in `namespace`, or all) as they were at `rv`,
    /// rebuilt from the history; 410 if that is older than the history.
    fn objects_at(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<BTreeMap<(String, String), Arc<Value>>, ApiError> {
        if rv < self.oldest_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.oldest_rv
            )));
        }
        let mut out: BTreeMap<(String, String), Arc<Value>> = self
            .live_range(resource, namespace, None)
            .map(|(k, v)| ((k.namespace.clone(), k.name.clone()), v.clone()))
            .collect();
        for change in self.history.iter().rev() {
            if change.rv <= rv {
                break;
            }
            if change.resource != *resource || namespace.is_some_and(|n| n != change.namespace) {
                continue;
            }
            let at = (change.namespace.clone(), change.name.clone());
            match &change.prev {
                None => {
                    out.remove(&at);
                }
                Some(prev) => {
                    out.insert(at, prev.clone());
                }
            }
        }
        Ok(out)
    }

    /// One page of a list of `kind` in `namespace` (or all), with the
    /// apiserver's resourceVersion semantics: unset or `0` is the latest
    /// state; a version with `resourceVersionMatch=Exact` (or with a `limit`
    /// and no match, as the apiserver reads it) is the state at exactly that
    /// version (410 once it is older than the history); `NotOlderThan` is
    /// the latest state (504 for a version the server has not reached).
    /// Continue tokens page through the state the first page was read at.
    pub fn list(
        &self,
        kind: &KindSpec,
        namespace: Option<&str>,
        opts: &ListOpts,
    ) -> Result<ListPage, ApiError> {
        let resource = kind.resource();
        let (at, after) = match &opts.continue_token {
            Some(token) => {
                if opts
                    .resource_version
                    .as_deref()
                    .is_some_and(|v| !v.is_empty())
                {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let (rv, after) = decode_continue(token)?;
                if rv < self.oldest_rv {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    ));
                }
                (rv, Some(after))
            }
            None => {
                let requested = parse_resource_version(opts.resource_version.as_deref())?;
                let exact = match opts.resource_version_match.as_deref() {
                    None | Some("") => opts.limit.is_some(),
                    Some("Exact") => true,
                    Some("NotOlderThan") => false,
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                        )));
                    }
                };
                if opts.resource_version_match.as_deref() == Some("Exact") && requested.is_none() {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch: Forbidden: resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"\" or \"0\"",
                    ));
                }
                match requested {
                    Some(v) if v > self.rv => {
                        return Err(too_large_version(v));
                    }
                    Some(v) if exact => (v, None),
                    _ => (self.rv, None),
                }
            }
        };
        let limit = opts.limit.filter(|l| *l > 0);
        let matches = |o: &Value| opts.labels.matches(o) && opts.fields.matches(o);
        let mut items = Vec::new();
        let mut last = None;
        let mut more = false;
        let mut remaining: u64 = 0;
        let mut push = |ns: &str, name: &str, o: &Arc<Value>| {
            if !matches(o) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                remaining += 1;
                return true;
            }
            items.push(o.clone());
            last = Some((ns.to_string(), name.to_string()));
            true
        };
        // The live state is the state at `at` unless this resource changed
        // since.
        let changed_since = self
            .history
            .iter()
            .rev()
            .take_while(|c| c.rv > at)
            .any(|c| c.resource == resource);
        if at >= self.oldest_rv && !changed_since {
            for (k, o) in self.live_range(&resource, namespace, after) {
                push(&k.namespace, &k.name, o);
            }
        } else {
            let state = self.objects_at(&resource, namespace, at)?;
            let start = match after {
                Some(a) => Bound::Excluded(a),
                None => Bound::Unbounded,
            };
            for ((ns, name), o) in state.range((start, Bound::Unbounded)) {
                push(ns, name, o);
            }
        }
        let continue_token = if more {
            last.map(|(ns, name)| encode_continue(at, &ns, &name))
        } else {
            None
        };
        let selectors =
            opts.labels != LabelSelector::default() || opts.fields != FieldSelector::default();
        Ok(ListPage {
            items,
            rv: at,
            remaining: (more && !selectors).then_some(remaining),
            continue_token,
        })
    }

    /// Opens a watch: replays what `sub` must see first and registers it,
    /// in one step. `from`: `None` for "the current state, as `ADDED`
    /// events" (resourceVersion unset or `0`), else the version to resume
    /// after. With `initial_events` the current state is sent and then a
    /// `BOOKMARK` marking its end (`sendInitialEvents=true`).
    pub fn watch(&mut self, sub: WatchSub, from: Option<u64>, initial_events: bool) {
        if let Some(v) = from
            && !initial_events
        {
            if v < self.oldest_rv {
                let gone = ApiError::expired(format!(
                    "too old resource version: {v} ({})",
                    self.oldest_rv
                ));
                sub.send_error_and_end(&gone.to_status());
                return;
            }
            for change in self.history.iter().filter(|c| c.rv > v) {
                if change.resource != sub.resource {
                    continue;
                }
                sub.send_change(change);
            }
        } else {
            let ns = sub.namespace.clone();
            for (k, o) in self.live_range(&sub.resource, ns.as_deref(), None) {
                if sub.sees(&k.namespace, o) {
                    sub.send_event(EventType::Added, o);
                }
            }
            if initial_events {
                sub.send_bookmark(self.rv, true);
            }
        }
        self.watchers.push(sub);
    }

    /// Sends a `BOOKMARK` at the current version to every watch that asked
    /// for bookmarks.
    pub fn bookmark(&mut self) {
        let rv = self.rv;
        self.watchers.retain(|w| {
            if w.bookmarks {
                w.send_bookmark(rv, false)
            } else {
                !w.tx.is_closed()
            }
        });
    }

    /// Forgets every version up to now: open watches get 410 and end.
    pub fn expire(&mut self) {
        self.oldest_rv = self.rv;
        self.history.clear();
        let gone = ApiError::expired(format!(
            "too old resource version: expired by the test at {}",
            self.rv
        ))
        .to_status();
        for w in self.watchers.drain(..) {
            w.send_error_and_end(&gone);
        }
    }

    /// Ends every open watch cleanly.
    pub fn close_watches(&mut self) {
        for w in self.watchers.drain(..) {
            let _ = w.tx.send(crate::watch::WatchMsg::End);
        }
    }

    /// How many watches are open (forgetting those whose client left).
    pub fn open_watches(&mut self) -> usize {
        self.watchers.retain(|w| !w.tx.is_closed());
        self.watchers.len()
    }

    /// Whether namespace `ns` exists.
    pub fn namespace(&self, ns: &str) -> Option<&Arc<Value>> {
        self.objects.get(&ObjKey {
            group: String::new(),
            plural: "namespaces".into(),
            namespace: String::new(),
            name: ns.to_string(),
        })
    }
}

/// A list's or watch's `resourceVersion` parameter: `None` for unset, `""`
/// or `"0"` (the latest state, "any version"), else the version (400 if it
/// is not an unsigned integer).
pub(crate) fn parse_resource_version(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some("") | Some("0") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be an unsigned integer"
            ))
        }),
    }
}

/// 504 for a resourceVersion the server has not reached (a real server
/// waits up to 3 s for it first).
fn too_large_version(v: u64) -> ApiError {
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {v}, current: less than that"),
    );
    e.details = Some(
        json!({ "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }], "retryAfterSeconds": 1 }),
    );
    e
}

/// A continue token: base64 of JSON with the list's version and the last
/// key returned, as the apiserver's tokens are.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let body = json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}") });
    base64::engine::general_purpose::URL_SAFE.encode(body.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?;
    let start = start.strip_suffix('\u{0}').ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns", "a.b");
        assert_eq!(
            decode_continue(&t).unwrap(),
            (42, ("ns".into(), "a.b".into()))
        );
        assert_eq!(decode_continue("nonsense!").unwrap_err().code, 400);
    }
}
