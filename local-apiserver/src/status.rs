//! Failures as the API server reports them: a `Status` object with an HTTP
//! code, a machine-readable reason and details, so a `kube_client::Client`
//! turns every refusal into `kube_client::Error::Api` with the code and
//! reason a real kube-apiserver would give.
//!
//! The messages follow apimachinery's `k8s.io/apimachinery/pkg/api/errors`
//! wording, because tests (and people) match on them.

use serde_json::{Value, json};

/// A refused request: what the server answers instead of an object.
///
/// It serializes to a `meta/v1` `Status` with `status: Failure`; see
/// [`ApiError::to_status`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status code (`404`, `409`, ...).
    pub code: u16,
    /// The `reason` field (`NotFound`, `Conflict`, `AlreadyExists`, ...).
    pub reason: String,
    /// The human-readable `message`.
    pub message: String,
    /// The `details` field, when the reason has any.
    pub details: Option<Value>,
}

impl ApiError {
    /// An error with no details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// The `Status` object the server writes for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // A real kube-apiserver leaves `reason` out when it has none.
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// 404 NotFound for one object of `resource` (`configmaps`,
    /// `leases.coordination.k8s.io`).
    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", group_resource(group, plural)),
        )
        .with_details(details(group, plural, name))
    }

    /// 404 for a path that names no resource the server serves.
    pub(crate) fn no_such_resource() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// 409 AlreadyExists on create.
    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!(
                "{} \"{name}\" already exists",
                group_resource(group, plural)
            ),
        )
        .with_details(details(group, plural, name))
    }

    /// 409 Conflict: a stale resourceVersion (optimistic concurrency).
    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                group_resource(group, plural)
            ),
        )
        .with_details(details(group, plural, name))
    }

    /// The conflict every stale write gets.
    pub(crate) fn stale(group: &str, plural: &str, name: &str) -> ApiError {
        ApiError::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid, with one cause per field error.
    pub(crate) fn invalid(group: &str, kind: &str, name: &str, causes: &[FieldError]) -> ApiError {
        let summary: Vec<String> = causes.iter().map(FieldError::to_string).collect();
        let summary = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.to_string(), "field": c.field }))
            .collect();
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {summary}"),
        )
        .with_details(json!({ "name": name, "group": group, "kind": kind, "causes": causes }))
    }

    /// 500 with no reason, as a real kube-apiserver answers errors its
    /// registry does not map to a client error.
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "", message)
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 403 Forbidden.
    pub(crate) fn forbidden(group: &str, plural: &str, name: &str, why: &str) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {why}",
                group_resource(group, plural)
            ),
        )
        .with_details(details(group, plural, name))
    }

    /// 405 MethodNotAllowed.
    pub(crate) fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
        .with_details(json!({}))
    }

    /// 410 Gone (reason Expired): a resourceVersion older than the oldest
    /// the server still has.
    pub(crate) fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 415 UnsupportedMediaType.
    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message)
    }

    /// 413 RequestEntityTooLarge.
    pub(crate) fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(413, "RequestEntityTooLarge", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// One field's validation failure, as a 422's `details.causes` lists it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// The field path (`metadata.name`).
    pub field: String,
    /// What is wrong.
    pub detail: String,
    /// The offending value, when it is shown (`Invalid value: "x"`).
    pub value: Option<String>,
}

impl FieldError {
    pub fn invalid(field: &str, value: &str, detail: impl Into<String>) -> FieldError {
        FieldError {
            reason: "FieldValueInvalid",
            field: field.to_string(),
            detail: detail.into(),
            value: Some(value.to_string()),
        }
    }

    pub fn required(field: &str, detail: impl Into<String>) -> FieldError {
        FieldError {
            reason: "FieldValueRequired",
            field: field.to_string(),
            detail: detail.into(),
            value: None,
        }
    }

    pub fn forbidden(field: &str, detail: impl Into<String>) -> FieldError {
        FieldError {
            reason: "FieldValueForbidden",
            field: field.to_string(),
            detail: detail.into(),
            value: None,
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.reason, &self.value) {
            ("FieldValueInvalid", Some(v)) => {
                write!(f, "{}: Invalid value: {v:?}: {}", self.field, self.detail)
            }
            ("FieldValueRequired", _) => {
                write!(f, "{}: Required value: {}", self.field, self.detail)
            }
            ("FieldValueForbidden", _) => write!(f, "{}: Forbidden: {}", self.field, self.detail),
            _ => write!(f, "{}: {}", self.field, self.detail),
        }
    }
}

/// `plural` or `plural.group`, as messages name a resource.
pub(crate) fn group_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": plural });
    if !group.is_empty() {
        d["group"] = Value::String(group.to_string());
    }
    d
}
