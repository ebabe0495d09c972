//! The verbs: get, create, update, patch, delete and deletecollection, with
//! the rules of the apiserver's generic registry.
//!
//! * create: `generateName`, 409 AlreadyExists, 404 for a missing namespace
//!   and 403 for a terminating one, 400 for a body with a resourceVersion;
//!   the server sets uid, creationTimestamp,
//!   resourceVersion and generation (1), and drops `.status` for kinds with
//!   the status subresource.
//! * update and patch: 409 Conflict when the body names a stale
//!   resourceVersion; uid, creationTimestamp and the deletion fields are the
//!   server's; `.status` changes only through `/status` (which changes
//!   nothing else) for kinds with the subresource; generation grows when
//!   anything outside metadata (and status) changes; a write that changes
//!   nothing is not a write (no new version, no event), as in etcd3's
//!   `GuaranteedUpdate`.
//! * delete: an object with finalizers gets `deletionTimestamp` (and
//!   `deletionGracePeriodSeconds: 0`, generation + 1) and a `MODIFIED`
//!   event; it is removed, with a `DELETED` event, by the write that takes
//!   its last finalizer away. No finalizer may be added once deletion has
//!   started (422). Deleting a Namespace empties it first (the namespace
//!   controller's job on a real cluster), deleting a CRD removes its custom
//!   resources first (the apiextensions cleanup controller's job).

use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use crate::kinds::{KindSpec, crd_resource};
use crate::meta::{
    finalizers, is_deleting, meta_mut, meta_str, now, resource_version, spec_differs, validate,
};
use crate::patch::{self, PatchType};
use crate::status::{ApiError, FieldError};
use crate::store::{ListOpts, ObjKey, Store};

/// The finalizer every CRD carries until its custom resources are gone.
const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Options of a PATCH.
#[derive(Debug, Clone, Default)]
pub(crate) struct PatchOpts {
    pub field_manager: Option<String>,
    pub dry_run: bool,
}

/// Options of a DELETE (query parameters and `DeleteOptions` body).
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

impl Store {
    fn key(&self, kind: &KindSpec, ns: &str, name: &str) -> ObjKey {
        ObjKey::new(
            &kind.resource(),
            if kind.namespaced { ns } else { "" },
            name,
        )
    }

    /// GET of one object.
    pub fn get(&self, kind: &KindSpec, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.object(&self.key(kind, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&kind.group, &kind.plural, name))
    }

    /// POST: creates an object in `ns` (ignored for cluster-scoped kinds).
    pub fn create(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        mut body: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        check_type(kind, &mut body)?;
        if resource_version(&body).is_some() {
            // A real kube-apiserver's etcd3 store refuses this with an error
            // its registry does not map to a 4xx: a 500 with no reason.
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let ns = if kind.namespaced { ns } else { "" };
        {
            let m = meta_mut(&mut body);
            match m.get("namespace").and_then(Value::as_str) {
                Some(given) if kind.namespaced && !given.is_empty() && given != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ if kind.namespaced => {
                    m.insert("namespace".into(), json!(ns));
                }
                _ => {
                    m.remove("namespace");
                }
            }
        }
        let name = match meta_str(&body, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta_str(&body, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => {
                    let prefix = prefix.to_string();
                    loop {
                        let candidate = format!("{prefix}{}", self.ids.suffix());
                        if self.object(&self.key(kind, ns, &candidate)).is_none() {
                            break candidate;
                        }
                    }
                }
                None => {
                    return Err(ApiError::invalid(
                        &kind.group,
                        &kind.kind,
                        "",
                        &[FieldError::required(
                            "metadata.name",
                            "name or generateName is required",
                        )],
                    ));
                }
            },
        };
        if let Some(crd) = self.terminating_crd_of(kind) {
            return Err(ApiError::method_not_allowed(&format!(
                "create not allowed while custom resource definition {crd} is terminating"
            )));
        }
        if kind.namespaced {
            match self.namespace(ns) {
                None => return Err(ApiError::not_found("", "namespaces", ns)),
                Some(n) if is_deleting(n) => {
                    return Err(ApiError::forbidden(
                        &kind.group,
                        &kind.plural,
                        &name,
                        &format!(
                            "unable to create new content in namespace {ns} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let uid = self.ids.uid();
        {
            let m = meta_mut(&mut body);
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now()));
            for system in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
                "managedFields",
                "generation",
            ] {
                m.remove(system);
            }
            if kind.generation {
                m.insert("generation".into(), json!(1));
            }
        }
        if kind.status_subresource
            && let Some(o) = body.as_object_mut()
        {
            o.remove("status");
        }
        prepare_create(kind, &mut body)?;
        validate(kind, &body)?;
        let key = self.key(kind, ns, &name);
        if self.object(&key).is_some() {
            return Err(ApiError::already_exists(&kind.group, &kind.plural, &name));
        }
        if dry_run {
            return Ok(Arc::new(body));
        }
        Ok(self.put(key, body))
    }

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
    fn write(
        &mut self,
        kind: &KindSpec,
        ns: &str,
        name: &str,
        mut new: Value,
        old: &Arc<Value>,
        status_only: bool,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        check_type(kind, &mut new)?;
        match meta_str(&new, "name") {
            Some(given) if given != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )));
            }
            _ => {}
        }
        if kind.namespaced
            && let Some(given) = meta_str(&new, "namespace")
            && !given.is_empty()
            && given != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if status_only {
            let status = new.get("status").cloned();
            new = (**old).clone();
            set_or_remove(&mut new, "status", status);
        } else if kind.status_subresource {
            set_or_remove(&mut new, "status", old.get("status").cloned());
        }
        let mut errors = Vec::new();
        {
            let om = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
            let m = meta_mut(&mut new);
            if let Some(uid) = m.get("uid").and_then(Value::as_str)
                && Some(uid) != om.get("uid").and_then(Value::as_str)
            {
                errors.push(FieldError::invalid(
                    "metadata.uid",
                    uid,
                    "field is immutable",
                ));
            }
            let from_old = |m: &mut serde_json::Map<String, Value>, field: &str| match om.get(field)
            {
                Some(v) => {
                    m.insert(field.to_string(), v.clone());
                }
                None => {
                    m.remove(field);
                }
            };
            if om.get("deletionTimestamp").is_none()
                && m.get("deletionTimestamp").is_some_and(|v| !v.is_null())
            {
                errors.push(FieldError::forbidden(
                    "metadata.deletionTimestamp",
                    "field is immutable; may only be set by deleting the object",
                ));
            }
            for field in [
                "uid",
                "namespace",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "generation",
                "managedFields",
            ] {
                from_old(m, field);
            }
            m.remove("selfLink");
            m.insert("name".into(), json!(name));
        }
        if is_deleting(old) {
            let before = finalizers(old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                errors.push(FieldError::forbidden(
                    "metadata.finalizers",
                    format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        if !errors.is_empty() {
            return Err(ApiError::invalid(&kind.group, &kind.kind, name, &errors));
        }
        prepare_update(kind, &mut new, old)?;
        validate(kind, &new)?;
        // Deployments also count annotation changes (they are copied to
        // their ReplicaSets), as the apps strategy does.
        let annotations_changed = kind.group == "apps"
            && kind.plural == "deployments"
            && new.pointer("/metadata/annotations") != old.pointer("/metadata/annotations");
        if kind.generation
            && (spec_differs(old, &new, kind.status_subresource) || annotations_changed)
        {
            let g = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
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

    /// Stores `object` and runs what follows a write (a CRD's kinds are
    /// served as it declares).
    pub fn put(&mut self, key: ObjKey, object: Value) -> Arc<Value> {
        let stored = self.commit_put(key.clone(), object);
        if is_crd_key(&key) {
            self.registry.sync_crd(&stored);
        }
        stored
    }

    /// Replaces the stored object without a version or an event (the state
    /// a removal then reports as the last one).
    /// Stores `new` (the settled form of `old`), or removes the object if
    /// nothing holds it any more (being deleted, no finalizers left).
    fn finish_or_put(&mut self, key: ObjKey, new: Value, old: &Value) {
        if ready_to_go(&new) {
            self.put_quietly(&key, new);
            self.remove(&key);
        } else if new != *old {
            self.put(key, new);
        }
    }

    fn put_quietly(&mut self, key: &ObjKey, object: Value) {
        self.objects.insert(key.clone(), Arc::new(object));
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
    fn start_cleanup(&mut self, key: &ObjKey, object: &Value) {
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

    /// Deletes by key with default options (finalizers respected).
    fn delete_by_key(&mut self, key: &ObjKey) {
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
    fn terminating_crd_of(&self, kind: &KindSpec) -> Option<String> {
        let name = format!("{}.{}", kind.plural, kind.group);
        self.terminating_crds.contains(&name).then_some(name)
    }

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
            let namespaces = self
                .registry
                .get("", "v1", "namespaces")
                .expect("namespaces are built in")
                .clone();
            self.create(
                &namespaces,
                "",
                json!({ "metadata": { "name": ns } }),
                false,
            )?;
        }
        let key = self.key(kind, &ns, &name);
        match self.object(&key).cloned() {
            Some(old) => {
                let mut body = body;
                if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let status = body.get("status").cloned();
                let mut written = self.write(kind, &ns, &name, body, &old, false, false)?;
                if kind.status_subresource && status.is_some() {
                    let mut with_status = (*written).clone();
                    set_or_remove(&mut with_status, "status", status);
                    written = self.write(kind, &ns, &name, with_status, &written, true, false)?;
                }
                Ok(written)
            }
            None => {
                let mut body = body;
                if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let status = body.get("status").cloned();
                let created = self.create(kind, &ns, body, false)?;
                if kind.status_subresource && status.is_some() {
                    let mut with_status = (*created).clone();
                    set_or_remove(&mut with_status, "status", status);
                    return self.write(kind, &ns, &name, with_status, &created, true, false);
                }
                Ok(created)
            }
        }
    }

    /// Creates the namespaces every cluster starts with.
    pub fn create_builtin_namespaces(&mut self) {
        let ns = self
            .registry
            .get("", "v1", "namespaces")
            .expect("namespaces are built in")
            .clone();
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            self.create(&ns, "", json!({ "metadata": { "name": name } }), false)
                .expect("a fresh server creates its namespaces");
        }
    }
}

fn is_namespace_key(key: &ObjKey) -> bool {
    key.group.is_empty() && key.plural == "namespaces"
}

fn is_crd_key(key: &ObjKey) -> bool {
    key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions"
}

fn namespace_key(name: &str) -> ObjKey {
    ObjKey {
        group: String::new(),
        plural: "namespaces".into(),
        namespace: String::new(),
        name: name.to_string(),
    }
}

fn crd_key(name: &str) -> ObjKey {
    ObjKey {
        group: "apiextensions.k8s.io".into(),
        plural: "customresourcedefinitions".into(),
        namespace: String::new(),
        name: name.to_string(),
    }
}

/// Deleting, and nothing holds it any more: no finalizers (and, for a
/// Namespace, no `spec.finalizers`).
/// Marks `object` as being deleted: `deletionTimestamp` now, no grace
/// period, and its generation bumped if it keeps one.
fn mark_deleting(object: &mut Value) {
    let m = meta_mut(object);
    m.insert("deletionTimestamp".into(), json!(now()));
    m.insert("deletionGracePeriodSeconds".into(), json!(0));
    if let Some(g) = m.get("generation").and_then(Value::as_i64)
        && g > 0
    {
        m.insert("generation".into(), json!(g + 1));
    }
}

fn ready_to_go(object: &Value) -> bool {
    is_deleting(object)
        && finalizers(object).is_empty()
        && object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

fn set_finalizers(object: &mut Value, list: &[String]) {
    let m = meta_mut(object);
    if list.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(list));
    }
}

fn set_or_remove(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(o) = object.as_object_mut() {
        match value {
            Some(v) => {
                o.insert(field.to_string(), v);
            }
            None => {
                o.remove(field);
            }
        }
    }
}

/// The body's `apiVersion` and `kind` must be the URL's (filled in if
/// missing); the body must be an object.
fn check_type(kind: &KindSpec, body: &mut Value) -> Result<(), ApiError> {
    let Some(o) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request is not a JSON object",
        ));
    };
    let api_version = kind.api_version();
    match o.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        _ => {
            o.insert("apiVersion".into(), json!(api_version));
        }
    }
    match o.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind.kind => Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            kind.kind
        ))),
        _ => {
            o.insert("kind".into(), json!(kind.kind));
            Ok(())
        }
    }
}

/// Kind-specific work on create.
fn prepare_create(kind: &KindSpec, body: &mut Value) -> Result<(), ApiError> {
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "namespaces") => {
            let name = meta_str(body, "name").unwrap_or_default().to_string();
            let m = meta_mut(body);
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
            if body.pointer("/spec/finalizers").is_none() {
                body["spec"] = json!({ "finalizers": ["kubernetes"] });
            }
            body["status"] = json!({ "phase": "Active" });
        }
        ("", "secrets") => secret_string_data(body),
        // The pod strategy starts every Pod Pending (its QoS class and
        // other defaults are not modelled).
        ("", "pods") => body["status"] = json!({ "phase": "Pending" }),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            validate_crd(kind, body)?;
            let mut f = finalizers(body);
            if !f.iter().any(|x| x == CRD_CLEANUP) {
                f.push(CRD_CLEANUP.to_string());
            }
            set_finalizers(body, &f);
            body["status"] = crd_status(body);
        }
        _ => {}
    }
    Ok(())
}

/// Kind-specific work on update.
fn prepare_update(kind: &KindSpec, body: &mut Value, old: &Value) -> Result<(), ApiError> {
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "secrets" | "configmaps") => {
            if kind.plural == "secrets" {
                secret_string_data(body);
            }
            if old.get("immutable").and_then(Value::as_bool) == Some(true) {
                let same = |f: &str| body.get(f) == old.get(f);
                if !same("data") || !same("binaryData") || !same("immutable") {
                    return Err(ApiError::invalid(
                        &kind.group,
                        &kind.kind,
                        meta_str(body, "name").unwrap_or_default(),
                        &[FieldError::forbidden(
                            "data",
                            "field is immutable when `immutable` is set",
                        )],
                    ));
                }
            }
        }
        ("", "namespaces") => {
            // The label is the server's; spec.finalizers go only through
            // the namespace's own cleanup.
            let name = meta_str(body, "name").unwrap_or_default().to_string();
            let m = meta_mut(body);
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
            set_or_remove(body, "spec", old.get("spec").cloned());
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            validate_crd(kind, body)?;
            let (a, b) = (crd_resource(body), crd_resource(old));
            if a != b {
                return Err(ApiError::invalid(
                    &kind.group,
                    &kind.kind,
                    meta_str(body, "name").unwrap_or_default(),
                    &[FieldError::invalid(
                        "spec",
                        "",
                        "the group and plural of a CRD are immutable",
                    )],
                ));
            }
            body["status"] = crd_status(body);
        }
        _ => {}
    }
    Ok(())
}

/// `stringData` is write-only: merged into `data` as base64.
fn secret_string_data(body: &mut Value) {
    let Some(o) = body.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(plain)) = o.remove("stringData") {
        let data = o.entry("data").or_insert_with(|| json!({}));
        if let Some(d) = data.as_object_mut() {
            for (k, v) in plain {
                let s = v.as_str().unwrap_or_default();
                d.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(s)),
                );
            }
        }
    }
    o.entry("type").or_insert_with(|| json!("Opaque"));
}

fn validate_crd(kind: &KindSpec, body: &Value) -> Result<(), ApiError> {
    let name = meta_str(body, "name").unwrap_or_default();
    let mut errors = Vec::new();
    match crd_resource(body) {
        Some((group, plural)) => {
            if group.is_empty() || !group.contains('.') {
                errors.push(FieldError::invalid(
                    "spec.group",
                    &group,
                    "should be a domain with at least one dot",
                ));
            }
            let expected = format!("{plural}.{group}");
            if name != expected {
                errors.push(FieldError::invalid(
                    "metadata.name",
                    name,
                    format!("must be spec.names.plural+\".\"+spec.group ({expected})"),
                ));
            }
        }
        None => errors.push(FieldError::required(
            "spec",
            "group and names.plural are required",
        )),
    }
    if body
        .pointer("/spec/names/kind")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        errors.push(FieldError::required("spec.names.kind", ""));
    }
    let versions = body
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if versions.is_empty() {
        errors.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    } else if storage != 1 {
        errors.push(FieldError::invalid(
            "spec.versions",
            &storage.to_string(),
            "must have exactly one version marked as storage version",
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&kind.group, &kind.kind, name, &errors))
    }
}

/// The status a CRD has once the apiextensions controllers accepted it:
/// names accepted, established.
fn crd_status(crd: &Value) -> Value {
    let mut names = crd
        .pointer("/spec/names")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if names.get("singular").is_none()
        && let Some(kind) = names.get("kind").and_then(Value::as_str)
    {
        names["singular"] = json!(kind.to_lowercase());
    }
    if names.get("listKind").is_none()
        && let Some(kind) = names.get("kind").and_then(Value::as_str)
    {
        names["listKind"] = json!(format!("{kind}List"));
    }
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let t = now();
    let condition = |ty: &str, reason: &str, message: &str| json!({ "type": ty, "status": "True", "lastTransitionTime": t, "reason": reason, "message": message });
    json!({
        "acceptedNames": names,
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": stored,
    })
}
