//! The verbs: get, create, update, patch, delete and deletecollection, with
//! the rules of the apiserver's generic registry, one module a job.
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
//!
//! Modules: `create`, `update` (update, patch and the write both end in),
//! `rules` (what every update must obey, apart from storing it),
//! `delete` (one object, a collection, finalizers), `cascade` (what
//! deleting a Namespace or CRD sets off, and what storing or removing a
//! CRD changes in the served kinds), `strategy` (each built-in kind's own
//! rules), `crd` (a CRD's validation and status) and `backdoors` (the
//! writes `LocalApiServer` offers tests outside the API).

mod backdoors;
mod cascade;
mod crd;
mod create;
mod delete;
mod rules;
mod strategy;
mod update;

use std::sync::Arc;

use serde_json::Value;

use crate::kinds::KindSpec;
use crate::status::ApiError;
use crate::store::{ObjKey, Store};

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
    pub(crate) fn key(&self, kind: &KindSpec, ns: &str, name: &str) -> ObjKey {
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
}
