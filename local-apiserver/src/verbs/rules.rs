//! The rules of every update (PUT, PATCH, `/status`), whatever the kind,
//! as a function of the proposed and the stored object: the name and
//! namespace are the URL's; the metadata the server owns is kept from the
//! stored object; `.status` changes only through `/status`, which changes
//! nothing else; no finalizer may be added to an object being deleted;
//! generation grows when the spec (anything outside metadata and status)
//! changes. Storing the result is the caller's job.

use serde_json::{Value, json};

use super::strategy::{check_type, prepare_update, set_or_remove};
use crate::kinds::KindSpec;
use crate::meta::{finalizers, is_deleting, meta_mut, meta_str, spec_differs, validate};
use crate::status::{ApiError, FieldError};

/// `new` (a proposed update of `old`, or of its `/status` if
/// `status_only`) as the server would store it, or why it may not be.
pub(super) fn updated(
    kind: &KindSpec,
    ns: &str,
    name: &str,
    mut new: Value,
    old: &Value,
    status_only: bool,
) -> Result<Value, ApiError> {
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
        new = old.clone();
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
        let from_old = |m: &mut serde_json::Map<String, Value>, field: &str| match om.get(field) {
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
    if kind.generation && (spec_differs(old, &new, kind.status_subresource) || annotations_changed)
    {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    Ok(new)
}
