//! POST: a new object, with what the server sets on it.

use std::sync::Arc;

use serde_json::{Value, json};

use super::strategy::{check_type, prepare_create};
use crate::kinds::KindSpec;
use crate::meta::{is_deleting, meta_mut, meta_str, now, resource_version, validate};
use crate::status::{ApiError, FieldError};
use crate::store::Store;

impl Store {
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
}
