//! The rules a body obeys whatever its kind (it is a JSON object of the
//! URL's apiVersion and kind), and each built-in kind's own rules on create
//! and update, as its registry strategy in kube-apiserver has them.

use base64::Engine;
use serde_json::{Value, json};

use super::crd::{CRD_CLEANUP, crd_status, validate_crd};
use crate::kinds::{KindSpec, crd_resource};
use crate::meta::{finalizers, meta_mut, meta_str};
use crate::status::{ApiError, FieldError};

pub(super) fn set_finalizers(object: &mut Value, list: &[String]) {
    let m = meta_mut(object);
    if list.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), json!(list));
    }
}

pub(super) fn set_or_remove(object: &mut Value, field: &str, value: Option<Value>) {
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
pub(super) fn check_type(kind: &KindSpec, body: &mut Value) -> Result<(), ApiError> {
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
pub(super) fn prepare_create(kind: &KindSpec, body: &mut Value) -> Result<(), ApiError> {
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "namespaces") => {
            label_namespace_name(body);
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
pub(super) fn prepare_update(
    kind: &KindSpec,
    body: &mut Value,
    old: &Value,
) -> Result<(), ApiError> {
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
            label_namespace_name(body);
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

/// Every Namespace carries its name as the label
/// `kubernetes.io/metadata.name`, whatever a client writes there.
fn label_namespace_name(body: &mut Value) {
    let name = meta_str(body, "name").unwrap_or_default().to_string();
    let labels = meta_mut(body).entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
}

/// `stringData` is write-only: merged into `data` as base64.
pub(super) fn secret_string_data(body: &mut Value) {
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
