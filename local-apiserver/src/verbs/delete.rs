//! DELETE of one object or a collection: preconditions, and finalizers
//! holding an object (marked as deleting) until the write that takes the
//! last one away.

use std::sync::Arc;

use serde_json::{Value, json};

use super::DeleteOpts;
use super::cascade::is_namespace_key;
use crate::kinds::KindSpec;
use crate::meta::{finalizers, is_deleting, meta_mut, meta_str, now, resource_version};
use crate::status::ApiError;
use crate::store::{ListOpts, ObjKey, Store};

impl Store {
    /// DELETE of one object.
    pub fn delete(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        let old = self.get(kind, ns, name)?;
        if let Some(uid) = &opts.uid
            && Some(uid.as_str()) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                &kind.group,
                &kind.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && Some(rv.as_str()) != resource_version(&old)
        {
            return Err(ApiError::conflict(
                &kind.group,
                &kind.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    resource_version(&old).unwrap_or_default()
                ),
            ));
        }
        let key = self.key(kind, ns, name);
        let is_namespace = is_namespace_key(&key);
        if !finalizers(&old).is_empty() || is_namespace {
            if is_deleting(&old) {
                return Ok(old);
            }
            let mut new = (*old).clone();
            mark_deleting(&mut new);
            if is_namespace {
                new["status"] = json!({ "phase": "Terminating" });
            }
            if opts.dry_run {
                return Ok(Arc::new(new));
            }
            let stored = self.put(key.clone(), new);
            self.start_cleanup(&key, &stored);
            self.settle();
            // The cleanup may already have removed it.
            return Ok(self.object(&key).cloned().unwrap_or(stored));
        }
        if opts.dry_run {
            return Ok(old);
        }
        let last = self.remove(&key).expect("the object exists");
        self.settle();
        Ok(last)
    }

    /// DELETE of a collection: deletes every object the selectors match,
    /// returning them.
    pub fn delete_collection(
        &mut self,
        kind: &KindSpec,
        ns: Option<&str>,
        list: &ListOpts,
        opts: &DeleteOpts,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let all = ListOpts {
            labels: list.labels.clone(),
            fields: list.fields.clone(),
            ..ListOpts::default()
        };
        let page = self.list(kind, ns, &all)?;
        let mut deleted = Vec::new();
        for o in page.items {
            let name = meta_str(&o, "name").unwrap_or_default().to_string();
            let namespace = meta_str(&o, "namespace").unwrap_or_default().to_string();
            match self.delete(kind, &namespace, &name, opts) {
                Ok(d) => deleted.push(d),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// Stores `new` (the settled form of `old`), or removes the object if
    /// nothing holds it any more (being deleted, no finalizers left).
    pub(super) fn finish_or_put(&mut self, key: ObjKey, new: Value, old: &Value) {
        if ready_to_go(&new) {
            self.put_quietly(&key, new);
            self.remove(&key);
        } else if new != *old {
            self.put(key, new);
        }
    }

    /// Replaces the stored object without a version or an event (the state
    /// a removal then reports as the last one).
    pub(super) fn put_quietly(&mut self, key: &ObjKey, object: Value) {
        self.objects.insert(key.clone(), Arc::new(object));
    }

    /// Deletes by key with default options (finalizers respected).
    pub(super) fn delete_by_key(&mut self, key: &ObjKey) {
        let Some(object) = self.object(key).cloned() else {
            return;
        };
        if !finalizers(&object).is_empty() {
            if is_deleting(&object) {
                return;
            }
            let mut new = (*object).clone();
            mark_deleting(&mut new);
            self.put(key.clone(), new);
        } else {
            self.remove(key);
        }
    }
}

/// Marks `object` as being deleted: `deletionTimestamp` now, no grace
/// period, and its generation bumped if it keeps one.
pub(super) fn mark_deleting(object: &mut Value) {
    let m = meta_mut(object);
    m.insert("deletionTimestamp".into(), json!(now()));
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
    if let Some(g) = m.get("generation").and_then(Value::as_i64)
        && g > 0
    {
        m.insert("generation".into(), json!(g + 1));
    }
}

/// Deleting, and nothing holds it any more: no finalizers (and, for a
/// Namespace, no `spec.finalizers`).
pub(super) fn ready_to_go(object: &Value) -> bool {
    is_deleting(object)
        && finalizers(object).is_empty()
        && object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}
