//! Writes `LocalApiServer` offers tests outside the API: seeding objects,
//! losing one without an event, the namespaces every cluster starts with.

use std::sync::Arc;

use serde_json::{Value, json};

use super::strategy::set_or_remove;
use crate::kinds::KindSpec;
use crate::meta::meta_str;
use crate::status::ApiError;
use crate::store::{ObjKey, Store};

impl Store {
    /// Removes an object without any event, as if its `DELETED` event was
    /// lost. The version counter still moves, as it would have.
    pub fn forget(&mut self, key: &ObjKey) -> bool {
        let existed = self.objects.remove(key).is_some();
        if existed {
            self.rv += 1;
        }
        existed
    }

    /// Creates or (unconditionally) replaces an object.
    pub fn upsert(&mut self, kind: &KindSpec, body: Value) -> Result<Arc<Value>, ApiError> {
        let ns = meta_str(&body, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&body, "name").unwrap_or_default().to_string();
        if kind.namespaced && !ns.is_empty() && self.namespace(&ns).is_none() {
            let namespaces = self.namespace_kind();
            self.create(
                &namespaces,
                "",
                json!({ "metadata": { "name": ns } }),
                false,
            )?;
        }
        let key = self.key(kind, &ns, &name);
        let mut body = body;
        // A seeded object replaces whatever is there, whatever its version.
        if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        // Create and update drop `.status` for kinds with the subresource:
        // it is written through `/status` afterwards.
        let status = body.get("status").cloned();
        let written = match self.object(&key).cloned() {
            Some(old) => self.write(kind, &ns, &name, body, &old, false, false)?,
            None => self.create(kind, &ns, body, false)?,
        };
        if kind.status_subresource && status.is_some() {
            let mut with_status = (*written).clone();
            set_or_remove(&mut with_status, "status", status);
            return self.write(kind, &ns, &name, with_status, &written, true, false);
        }
        Ok(written)
    }

    /// Creates the namespaces every cluster starts with.
    pub fn create_builtin_namespaces(&mut self) {
        let ns = self.namespace_kind();
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            self.create(&ns, "", json!({ "metadata": { "name": name } }), false)
                .expect("a fresh server creates its namespaces");
        }
    }

    fn namespace_kind(&self) -> KindSpec {
        self.registry
            .get("", "v1", "namespaces")
            .expect("namespaces are built in")
            .clone()
    }
}
