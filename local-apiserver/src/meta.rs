//! Object metadata rules: the fields the server owns (uid, timestamps,
//! resourceVersion, generation), validation of what clients send (names,
//! labels, annotations, finalizers, ownerReferences) and small accessors.

use serde_json::{Map, Value, json};

use crate::kinds::KindSpec;
use crate::selector::{is_dns_label, is_dns_subdomain, validate_label_key, validate_label_value};
use crate::status::{ApiError, FieldError};

/// `metadata` of an object, created empty if missing.
pub(crate) fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let o = object.as_object_mut().expect("an object");
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("an object")
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

/// `metadata.finalizers` (empty if none).
pub(crate) fn finalizers(object: &Value) -> Vec<String> {
    strings(object.pointer("/metadata/finalizers"))
}

/// The strings of a JSON array (empty if it is missing or not an array;
/// items that are not strings are skipped).
pub(crate) fn strings(array: Option<&Value>) -> Vec<String> {
    array
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether deletion has started (`metadata.deletionTimestamp` is set).
pub(crate) fn is_deleting(object: &Value) -> bool {
    object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The resourceVersion an object carries, if any (`None` for unset or "").
pub(crate) fn resource_version(object: &Value) -> Option<&str> {
    meta_str(object, "resourceVersion").filter(|s| !s.is_empty())
}

/// Now, as RFC 3339 with whole seconds (`2025-01-02T03:04:05Z`), as the
/// apiserver writes timestamps.
pub(crate) fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// A small deterministic-enough generator for uids and `generateName`
/// suffixes (SplitMix64): unique names matter, unpredictability does not.
#[derive(Debug)]
pub(crate) struct Ids {
    state: u64,
}

impl Ids {
    pub fn new() -> Ids {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let here = &nanos as *const u64 as u64;
        Ids {
            state: nanos ^ here.rotate_left(32),
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A random (version 4 layout) UUID.
    pub fn uid(&mut self) -> String {
        let (a, b) = (self.next(), self.next());
        let hex = format!("{a:016x}{b:016x}");
        format!(
            "{}-{}-4{}-{}{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            ["8", "9", "a", "b"][(b & 3) as usize],
            &hex[17..20],
            &hex[20..32]
        )
    }

    /// The 5-character suffix `generateName` gets (apimachinery's alphabet,
    /// without vowels and look-alikes).
    pub fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

/// Validates what a client may set in metadata, for `kind`. Names are DNS
/// subdomains (DNS labels for Namespaces and Services; `plural.group` for
/// CRDs).
pub(crate) fn validate(kind: &KindSpec, object: &Value) -> Result<(), ApiError> {
    let name = meta_str(object, "name").unwrap_or_default();
    let mut errors = Vec::new();
    let label_name =
        kind.group.is_empty() && (kind.plural == "namespaces" || kind.plural == "services");
    if label_name {
        if !is_dns_label(name) {
            errors.push(FieldError::invalid(
                "metadata.name",
                name,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            ));
        }
    } else if !is_dns_subdomain(name) {
        errors.push(FieldError::invalid(
            "metadata.name",
            name,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ));
    }
    if let Some(labels) = object.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(map) => {
                for (k, v) in map {
                    if let Err(e) = validate_label_key(k) {
                        errors.push(FieldError::invalid("metadata.labels", k, e));
                    }
                    match v.as_str() {
                        Some(v) => {
                            if let Err(e) = validate_label_value(v) {
                                errors.push(FieldError::invalid("metadata.labels", v, e));
                            }
                        }
                        None => errors.push(FieldError::invalid(
                            "metadata.labels",
                            &v.to_string(),
                            "label values must be strings",
                        )),
                    }
                }
            }
            None if labels.is_null() => {}
            None => errors.push(FieldError::invalid(
                "metadata.labels",
                &labels.to_string(),
                "must be a map of strings",
            )),
        }
    }
    if let Some(annotations) = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for (k, v) in annotations {
            if let Err(e) = validate_label_key(k) {
                errors.push(FieldError::invalid("metadata.annotations", k, e));
            }
            if !v.is_string() {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    &v.to_string(),
                    "annotation values must be strings",
                ));
            }
        }
    }
    if let Some(f) = object.pointer("/metadata/finalizers") {
        match f.as_array() {
            Some(list) => {
                for (i, v) in list.iter().enumerate() {
                    let field = format!("metadata.finalizers[{i}]");
                    match v.as_str() {
                        Some(s) if validate_label_key(s).is_ok() => {}
                        _ => errors.push(FieldError::invalid(
                            &field,
                            &v.to_string(),
                            "a finalizer must be a qualified name (an optional DNS subdomain prefix and '/', then a name)",
                        )),
                    }
                }
            }
            None if f.is_null() => {}
            None => errors.push(FieldError::invalid(
                "metadata.finalizers",
                &f.to_string(),
                "must be a list of strings",
            )),
        }
    }
    if let Some(refs) = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
    {
        let mut controllers = 0;
        for (i, r) in refs.iter().enumerate() {
            for field in ["apiVersion", "kind", "name", "uid"] {
                if r.get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    errors.push(FieldError::invalid(
                        &format!("metadata.ownerReferences[{i}].{field}"),
                        "",
                        format!("{field} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errors.push(FieldError::invalid(
                "metadata.ownerReferences",
                &controllers.to_string(),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&kind.group, &kind.kind, name, &errors))
    }
}

/// Whether two versions of an object differ outside `metadata` (and
/// outside `status` when `skip_status`): what bumps `generation`.
pub(crate) fn spec_differs(a: &Value, b: &Value, skip_status: bool) -> bool {
    let empty = Map::new();
    let a = a.as_object().unwrap_or(&empty);
    let b = b.as_object().unwrap_or(&empty);
    let skip = |k: &str| k == "metadata" || (skip_status && k == "status");
    a.iter().any(|(k, v)| !skip(k) && b.get(k) != Some(v))
        || b.keys().any(|k| !skip(k) && !a.contains_key(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_and_suffixes_look_like_the_real_ones() {
        let mut ids = Ids::new();
        let uid = ids.uid();
        assert_eq!(uid.len(), 36, "{uid}");
        assert_eq!(&uid[14..15], "4");
        assert_ne!(ids.uid(), uid);
        let s = ids.suffix();
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }

    #[test]
    fn timestamps_are_whole_seconds() {
        let t = now();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    }

    #[test]
    fn validation() {
        let cm = KindSpec::namespaced("", "v1", "ConfigMap", "configmaps");
        assert!(validate(&cm, &json!({ "metadata": { "name": "a.b-c" } })).is_ok());
        let err = validate(&cm, &json!({ "metadata": { "name": "Bad_Name" } })).unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
        assert!(err.message.contains("metadata.name"), "{}", err.message);
        let bad_label = json!({ "metadata": { "name": "a", "labels": { "k": "-v" } } });
        assert_eq!(validate(&cm, &bad_label).unwrap_err().code, 422);
        let two_controllers = json!({ "metadata": { "name": "a", "ownerReferences": [
            { "apiVersion": "v1", "kind": "X", "name": "x", "uid": "1", "controller": true },
            { "apiVersion": "v1", "kind": "Y", "name": "y", "uid": "2", "controller": true },
        ] } });
        assert_eq!(validate(&cm, &two_controllers).unwrap_err().code, 422);
        let ns = KindSpec::cluster("", "v1", "Namespace", "namespaces");
        assert!(validate(&ns, &json!({ "metadata": { "name": "a.b" } })).is_err());
    }

    #[test]
    fn spec_differs_ignores_metadata_and_optionally_status() {
        let a = json!({ "metadata": { "x": 1 }, "spec": { "n": 1 }, "status": { "s": 1 } });
        let b = json!({ "metadata": { "x": 2 }, "spec": { "n": 1 }, "status": { "s": 2 } });
        assert!(!spec_differs(&a, &b, true));
        assert!(spec_differs(&a, &b, false));
        let c = json!({ "metadata": {}, "spec": { "n": 2 } });
        assert!(spec_differs(&a, &c, true));
    }
}
