//! What follows a deletion or a write beyond the object itself: a
//! Namespace being deleted empties itself, then goes; a CRD being deleted
//! removes its custom resources, then goes; storing or removing a CRD
//! changes the kinds the server serves.

use std::sync::Arc;

use serde_json::Value;

use super::crd::CRD_CLEANUP;
use super::strategy::set_finalizers;
use crate::kinds::{KindSpec, crd_resource};
use crate::meta::finalizers;
use crate::store::{ObjKey, Store};

impl Store {
    /// Stores `object` and runs what follows a write (a CRD's kinds are
    /// served as it declares).
    pub fn put(&mut self, key: ObjKey, object: Value) -> Arc<Value> {
        let stored = self.commit_put(key.clone(), object);
        if is_crd_key(&key) {
            self.registry.sync_crd(&stored);
        }
        stored
    }

    /// Removes an object and runs what follows (a CRD's kinds stop being
    /// served, and their watches end).
    pub fn remove(&mut self, key: &ObjKey) -> Option<Arc<Value>> {
        let last = self.commit_delete(key)?;
        if is_crd_key(key)
            && let Some((group, plural)) = crd_resource(&last)
        {
            self.registry.unregister(&group, &plural);
            self.watchers.retain(|w| {
                let gone = w.resource.group == group && w.resource.plural == plural;
                if gone {
                    let _ = w.tx.send(crate::watch::WatchMsg::End);
                }
                !gone
            });
            self.terminating_crds.remove(&key.name);
        }
        if is_namespace_key(key) {
            self.terminating_namespaces.remove(&key.name);
        }
        Some(last)
    }

    /// Starts what a deletion of a Namespace or CRD sets off: deleting what
    /// it contains.
    pub(super) fn start_cleanup(&mut self, key: &ObjKey, object: &Value) {
        let contained: Vec<ObjKey> = if is_namespace_key(key) {
            self.terminating_namespaces.insert(key.name.clone());
            self.objects
                .keys()
                .filter(|k| !k.namespace.is_empty() && k.namespace == key.name)
                .cloned()
                .collect()
        } else if is_crd_key(key) {
            self.terminating_crds.insert(key.name.clone());
            let Some((group, plural)) = crd_resource(object) else {
                return;
            };
            self.objects
                .keys()
                .filter(|k| k.group == group && k.plural == plural)
                .cloned()
                .collect()
        } else {
            return;
        };
        for k in contained {
            self.delete_by_key(&k);
        }
    }

    /// Finishes deletions waiting on contents: a terminating namespace that
    /// is empty loses its `kubernetes` finalizer (and goes, if it has no
    /// others), a terminating CRD without custom resources loses its
    /// cleanup finalizer (likewise).
    pub fn settle(&mut self) {
        loop {
            let mut progress = false;
            for ns in self.terminating_namespaces.clone() {
                let key = namespace_key(&ns);
                let Some(object) = self.object(&key).cloned() else {
                    self.terminating_namespaces.remove(&ns);
                    continue;
                };
                if self.objects.keys().any(|k| k.namespace == ns) {
                    continue;
                }
                self.terminating_namespaces.remove(&ns);
                progress = true;
                let mut new = (*object).clone();
                if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("finalizers");
                }
                self.finish_or_put(key, new, &object);
            }
            for crd in self.terminating_crds.clone() {
                let key = crd_key(&crd);
                let Some(object) = self.object(&key).cloned() else {
                    self.terminating_crds.remove(&crd);
                    continue;
                };
                let Some((group, plural)) = crd_resource(&object) else {
                    self.terminating_crds.remove(&crd);
                    continue;
                };
                if self
                    .objects
                    .keys()
                    .any(|k| k.group == group && k.plural == plural)
                {
                    continue;
                }
                self.terminating_crds.remove(&crd);
                progress = true;
                let mut new = (*object).clone();
                let left: Vec<String> = finalizers(&new)
                    .into_iter()
                    .filter(|f| f != CRD_CLEANUP)
                    .collect();
                set_finalizers(&mut new, &left);
                self.finish_or_put(key, new, &object);
            }
            if !progress {
                break;
            }
        }
    }

    /// The CRD (by name) that defines `kind`, if it is being deleted.
    pub(super) fn terminating_crd_of(&self, kind: &KindSpec) -> Option<String> {
        let name = format!("{}.{}", kind.plural, kind.group);
        self.terminating_crds.contains(&name).then_some(name)
    }
}

pub(super) fn is_namespace_key(key: &ObjKey) -> bool {
    key.group.is_empty() && key.plural == "namespaces"
}

pub(super) fn is_crd_key(key: &ObjKey) -> bool {
    key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions"
}

pub(super) fn namespace_key(name: &str) -> ObjKey {
    ObjKey {
        group: String::new(),
        plural: "namespaces".into(),
        namespace: String::new(),
        name: name.to_string(),
    }
}

pub(super) fn crd_key(name: &str) -> ObjKey {
    ObjKey {
        group: "apiextensions.k8s.io".into(),
        plural: "customresourcedefinitions".into(),
        namespace: String::new(),
        name: name.to_string(),
    }
}
