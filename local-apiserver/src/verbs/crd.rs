//! CustomResourceDefinitions: validation, and the status the apiextensions
//! controllers give an accepted one.

use serde_json::{Value, json};

use crate::kinds::{KindSpec, crd_resource};
use crate::meta::{meta_str, now};
use crate::status::{ApiError, FieldError};

/// The finalizer every CRD carries until its custom resources are gone.
pub(super) const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

pub(super) fn validate_crd(kind: &KindSpec, body: &Value) -> Result<(), ApiError> {
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
pub(super) fn crd_status(crd: &Value) -> Value {
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
