//! PUT and PATCH, and the write both end in: optimistic concurrency
//! (resourceVersion preconditions), create on update and server-side apply
//! of a missing object, the patch itself; then the update rules
//! (`rules.rs`) and storing the result, or removing the object if it was
//! being deleted and nothing holds it any more.

use std::sync::Arc;

use serde_json::{Value, json};

use super::PatchOpts;
use super::delete::ready_to_go;
use super::rules;
use crate::kinds::KindSpec;
use crate::meta::{meta_mut, meta_str, resource_version};
use crate::patch::{self, PatchType};
use crate::status::{ApiError, FieldError};
use crate::store::Store;

impl Store {
    /// PUT of an object (`status_only`: of its `/status`).
    pub fn update(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        name: &str,
        mut body: Value,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let old = match self.get(kind, ns, name) {
            Ok(old) => old,
            Err(e) if e.code == 404 && kind.create_on_update && !status_only => {
                if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    // As kube-apiserver: the uid is a precondition no
                    // missing object meets; the resourceVersion is ignored.
                    if let Some(uid) = meta.get("uid").and_then(Value::as_str) {
                        return Err(ApiError::conflict(
                            &kind.group,
                            &kind.plural,
                            name,
                            &format!(
                                "Precondition failed: UID in precondition: {uid}, UID in object meta: "
                            ),
                        ));
                    }
                    meta.remove("resourceVersion");
                }
                return self.create(kind, ns, body, dry_run);
            }
            Err(e) => return Err(e),
        };
        match resource_version(&body) {
            Some(rv) if Some(rv) != resource_version(&old) => {
                return Err(ApiError::stale(&kind.group, &kind.plural, name));
            }
            Some(_) => {}
            None if kind.unconditional_update => {}
            None => {
                return Err(ApiError::invalid(
                    &kind.group,
                    &kind.kind,
                    name,
                    &[FieldError::invalid(
                        "metadata.resourceVersion",
                        "0x0",
                        "must be specified for an update",
                    )],
                ));
            }
        }
        self.write(kind, ns, name, body, &old, status_only, dry_run)
    }

    /// PATCH of an object (`status_only`: of its `/status`). Returns the
    /// HTTP code (201 when server-side apply created the object) and the
    /// object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &Value,
        status_only: bool,
        opts: &PatchOpts,
    ) -> Result<(u16, Arc<Value>), ApiError> {
        if ptype == PatchType::Strategic && !kind.strategic_merge {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if ptype == PatchType::Apply {
            if opts.field_manager.as_deref().is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            for field in ["apiVersion", "kind"] {
                if body.get(field).and_then(Value::as_str).is_none() {
                    return Err(ApiError::bad_request(format!(
                        "invalid object type: {field} must be set in an apply configuration"
                    )));
                }
            }
            if let Some(given) = meta_str(body, "name")
                && given != name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )));
            }
        }
        let old = match self.get(kind, ns, name) {
            Ok(old) => old,
            Err(e) if ptype == PatchType::Apply && e.code == 404 && !status_only => {
                let mut config = body.clone();
                let m = meta_mut(&mut config);
                m.insert("name".into(), json!(name));
                m.remove("resourceVersion");
                return self
                    .create(kind, ns, config, opts.dry_run)
                    .map(|o| (201, o));
            }
            Err(e) => return Err(e),
        };
        let mut doc = (*old).clone();
        match ptype {
            PatchType::Merge => patch::merge_patch(&mut doc, body)?,
            PatchType::Json => patch::json_patch(&mut doc, body)?,
            PatchType::Strategic => patch::strategic_merge(&mut doc, body)?,
            PatchType::Apply => {
                if let Some(rv) = resource_version(body)
                    && Some(rv) != resource_version(&old)
                {
                    return Err(ApiError::stale(&kind.group, &kind.plural, name));
                }
                patch::apply(&mut doc, body);
            }
        }
        // A resourceVersion in the patch is a precondition.
        if resource_version(&doc) != resource_version(&old) && resource_version(&doc).is_some() {
            return Err(ApiError::stale(&kind.group, &kind.plural, name));
        }
        self.write(kind, ns, name, doc, &old, status_only, opts.dry_run)
            .map(|o| (200, o))
    }

    /// The common end of update and patch: `new` is the whole proposed
    /// object; the server's rules are applied and it is stored (or the
    /// object is removed, if it was being deleted and has no finalizers
    /// left).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        name: &str,
        new: Value,
        old: &Arc<Value>,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let new = rules::updated(kind, ns, name, new, old, status_only)?;
        if new == **old {
            return Ok(old.clone());
        }
        if dry_run {
            return Ok(Arc::new(new));
        }
        let key = self.key(kind, ns, name);
        if ready_to_go(&new) {
            self.put_quietly(&key, new);
            let last = self.remove(&key).expect("the object exists");
            self.settle();
            return Ok(last);
        }
        Ok(self.put(key, new))
    }
}
