//! The four PATCH content types, applied to an object's JSON.
//!
//! * `application/merge-patch+json`: RFC 7386 (the `json-patch` crate's
//!   `merge`).
//! * `application/json-patch+json`: RFC 6902 (the `json-patch` crate), with
//!   one rule of the Go library the apiserver uses: `test` of a missing path
//!   against `null` passes (kube-runtime's `finalizer` helper relies on it
//!   when it adds the first finalizer). A failed operation is 422 Invalid; a
//!   body that is not a patch is 400.
//! * `application/strategic-merge-patch+json`: a merge patch whose lists are
//!   merged by their merge key where the built-in types declare one (see
//!   [`merge_key`]), with the `$patch: delete|replace`,
//!   `$deleteFromPrimitiveList/…` and `$setElementOrder/…` directives.
//!   Custom resources refuse it with 415, as on a real server.
//! * `application/apply-patch+yaml` (server-side apply, JSON bodies only):
//!   the configuration is merged into the live object like a strategic merge
//!   patch whose `null`s mean "no opinion". Field ownership is not modelled:
//!   no conflicts between managers, and fields a manager stops applying are
//!   not removed.

use json_patch::PatchOperation;
use serde_json::{Map, Value};

use crate::status::ApiError;

/// The patch content types the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    /// The type for a `Content-Type` header, or 415.
    pub fn from_content_type(ct: &str) -> Result<PatchType, ApiError> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
            ))),
        }
    }
}

/// RFC 7386 merge patch. The patch must be a JSON object.
pub(crate) fn merge_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "json: cannot unmarshal a merge patch that is not an object",
        ));
    }
    json_patch::merge(doc, patch);
    Ok(())
}

/// RFC 6902 JSON patch with the Go library's `test`-against-`null` rule.
pub(crate) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: Vec<PatchOperation> = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    let mut work = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        if let PatchOperation::Test(t) = op
            && t.value.is_null()
            && work.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(&mut work, std::slice::from_ref(op)).map_err(|e| {
            let what = match e.kind {
                json_patch::PatchErrorKind::TestFailed => {
                    format!("testing value {} failed: test failed", e.path.as_str())
                }
                _ => format!("operation {i} ({}) failed: {}", e.path.as_str(), e.kind),
            };
            ApiError::new(422, "Invalid", what)
        })?;
    }
    *doc = work;
    Ok(())
}

/// The merge key of a list field of the built-in kinds, by the field's
/// name (and, for `ports`, by what its items hold). `Some("")` marks a list
/// of primitives merged as a set (`finalizers`).
pub(crate) fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    match field {
        "finalizers" => Some(""),
        "ownerReferences" => Some("uid"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => Some("name"),
        "volumeMounts" | "volumeDevices" => Some("mountPath"),
        "conditions" => Some("type"),
        "hostAliases" => Some("ip"),
        "ports" => {
            if items.iter().any(|i| i.get("containerPort").is_some()) {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        _ => None,
    }
}

/// Strategic merge patch of `patch` into `doc` (both objects).
pub(crate) fn strategic_merge(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "strategic merge patch: the patch is not an object",
        ));
    }
    merge_map(doc, patch, false);
    Ok(())
}

/// Server-side apply of `config` onto the live object.
pub(crate) fn apply(doc: &mut Value, config: &Value) {
    merge_map(doc, config, true);
}

/// Merges the map `patch` into `doc`. With `apply`, `null` means no opinion
/// instead of "remove".
fn merge_map(doc: &mut Value, patch: &Value, apply: bool) {
    let Some(p) = patch.as_object() else {
        *doc = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = p.clone();
        replaced.remove("$patch");
        strip_directives(&mut replaced);
        *doc = Value::Object(replaced);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let target = doc.as_object_mut().expect("made an object");
    // Directives first: deletions from primitive lists.
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(list), Some(gone)) = (
                target.get_mut(field).and_then(Value::as_array_mut),
                v.as_array(),
            )
        {
            list.retain(|x| !gone.contains(x));
        }
    }
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null if apply => {}
            Value::Null => {
                target.remove(k);
            }
            Value::Object(_) => {
                let entry = target.entry(k.clone()).or_insert(Value::Null);
                merge_map(entry, v, apply);
            }
            Value::Array(items) => {
                let live = target.get(k).and_then(Value::as_array);
                let merged = match (live, merge_key(k, items)) {
                    (Some(live), Some(key)) => merge_list(live, items, key, apply),
                    _ => items.iter().map(without_directives).collect(),
                };
                target.insert(k.clone(), Value::Array(merged));
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
}

/// Merges a strategic patch's set of primitives into the live one in the
/// order apimachinery's strategic merge gives: each list keeps its own
/// order, and a live item not in the patch goes before a patch item only
/// when both are in the live list and it comes first there; otherwise the
/// patch's item goes first (so new items lead, and shared items anchor
/// the live items around them).
fn merge_ordered_set(live: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut from_patch: Vec<&Value> = Vec::new();
    for v in patch {
        if !from_patch.contains(&v) {
            from_patch.push(v);
        }
    }
    let live_only: Vec<&Value> = live.iter().filter(|v| !from_patch.contains(v)).collect();
    let live_at = |v: &Value| live.iter().position(|x| x == v);
    let (mut l, mut p) = (live_only.iter().peekable(), from_patch.iter().peekable());
    let mut out = Vec::with_capacity(live_only.len() + from_patch.len());
    loop {
        let take_live = match (l.peek(), p.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => matches!(
                (live_at(a), live_at(b)),
                (Some(i), Some(j)) if i < j
            ),
        };
        let next = if take_live { l.next() } else { p.next() };
        out.push((*next.expect("peeked")).clone());
    }
    out
}

/// Merges list `patch` into list `live` by `key` (`""`: a set of
/// primitives).
fn merge_list(live: &[Value], patch: &[Value], key: &str, apply: bool) -> Vec<Value> {
    if key.is_empty() && !apply {
        return merge_ordered_set(live, patch);
    }
    let mut out: Vec<Value> = live.to_vec();
    if key.is_empty() {
        for v in patch {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        return out;
    }
    for item in patch {
        let id = item.get(key);
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match out.iter().position(|x| id.is_some() && x.get(key) == id) {
            Some(at) if delete => {
                out.remove(at);
            }
            Some(at) => merge_map(&mut out[at], item, apply),
            None if delete => {}
            None => out.push(without_directives(item)),
        }
    }
    out
}

fn without_directives(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        strip_directives(m);
    }
    v
}

fn strip_directives(m: &mut Map<String, Value>) {
    m.retain(|k, _| !k.starts_with('$'));
    for v in m.values_mut() {
        match v {
            Value::Object(inner) => strip_directives(inner),
            Value::Array(items) => {
                for i in items {
                    if let Some(inner) = i.as_object_mut() {
                        strip_directives(inner);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patch_test_of_a_missing_path_against_null_passes() {
        let mut doc = json!({ "metadata": { "name": "a" } });
        let patch = json!([
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": ["x"] },
        ]);
        json_patch(&mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["x"]));
        // Now it exists: the same test fails, and nothing is changed.
        let before = doc.clone();
        let err = json_patch(&mut doc, &patch).unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
        assert_eq!(doc, before);
        assert_eq!(
            json_patch(&mut doc, &json!({"op": 1})).unwrap_err().code,
            400
        );
    }

    #[test]
    fn strategic_merge_by_key_and_directives() {
        let mut doc = json!({
            "metadata": { "finalizers": ["a"], "labels": { "x": "1", "y": "2" } },
            "spec": { "containers": [ { "name": "c1", "image": "i1" }, { "name": "c2", "image": "i2" } ],
                      "tolerations": [ { "key": "k" } ] },
        });
        let patch = json!({
            "metadata": { "finalizers": ["b"], "labels": { "y": null },
                          "$deleteFromPrimitiveList/finalizers": ["a"] },
            "spec": { "containers": [ { "name": "c2", "image": "i2b" }, { "name": "c1", "$patch": "delete" },
                                      { "name": "c3", "image": "i3" } ],
                      "tolerations": [ { "key": "other" } ],
                      "$setElementOrder/containers": [ { "name": "c2" } ] },
        });
        strategic_merge(&mut doc, &patch).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(doc["metadata"]["labels"], json!({ "x": "1" }));
        assert_eq!(
            doc["spec"]["containers"],
            json!([ { "name": "c2", "image": "i2b" }, { "name": "c3", "image": "i3" } ])
        );
        // No merge key: replaced.
        assert_eq!(doc["spec"]["tolerations"], json!([ { "key": "other" } ]));
        assert!(doc["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn apply_merges_and_ignores_nulls() {
        let mut doc =
            json!({ "data": { "a": "1", "b": "2" }, "metadata": { "finalizers": ["x"] } });
        apply(
            &mut doc,
            &json!({ "data": { "a": "9", "b": null }, "metadata": { "finalizers": ["y"] } }),
        );
        assert_eq!(doc["data"], json!({ "a": "9", "b": "2" }));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x", "y"]));
    }

    #[test]
    fn strategic_merge_orders_sets_as_apimachinery() {
        // The sequence seen on kube-apiserver v1.37.2.
        let mut doc = json!({ "metadata": { "finalizers": [] } });
        let steps = [
            (json!(["a.com/x", "a.com/z"]), json!(["a.com/x", "a.com/z"])),
            (json!(["a.com/y"]), json!(["a.com/y", "a.com/x", "a.com/z"])),
            (
                json!(["a.com/z", "a.com/w"]),
                json!(["a.com/y", "a.com/x", "a.com/z", "a.com/w"]),
            ),
            (
                json!(["a.com/x", "a.com/x"]),
                json!(["a.com/y", "a.com/x", "a.com/z", "a.com/w"]),
            ),
        ];
        for (patch, want) in steps {
            strategic_merge(&mut doc, &json!({ "metadata": { "finalizers": patch } })).unwrap();
            assert_eq!(doc["metadata"]["finalizers"], want, "after {patch}");
        }
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchType::Merge
        );
        assert_eq!(
            PatchType::from_content_type("application/json")
                .unwrap_err()
                .code,
            415
        );
    }
}
