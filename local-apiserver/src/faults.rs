//! Fault injection: make chosen requests fail with a status code, or answer
//! late, for a number of times or until cleared.
//!
//! ```
//! use std::time::Duration;
//! use kube_local_apiserver::{Fault, Verb};
//! // The next two lease updates fail with 500 InternalError.
//! let fault = Fault::status(500).verb(Verb::Update).resource("leases").times(2);
//! // Every list answers half a second late.
//! let slow = Fault::delay(Duration::from_millis(500)).verb(Verb::List);
//! # let _ = (fault, slow);
//! ```

use std::time::Duration;

use crate::counts::Verb;
use crate::status::ApiError;

/// A fault to inject into matching requests (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    verb: Option<Verb>,
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    code: Option<u16>,
    delay: Option<Duration>,
    times: Option<usize>,
}

impl Fault {
    /// Matching requests fail with this HTTP code and the reason Kubernetes
    /// gives it (500 InternalError, 503 ServiceUnavailable, 429
    /// TooManyRequests, 504 Timeout, 409 Conflict, ...), without being
    /// carried out.
    pub fn status(code: u16) -> Fault {
        Fault {
            verb: None,
            resource: None,
            namespace: None,
            name: None,
            code: Some(code),
            delay: None,
            times: None,
        }
    }

    /// Matching requests are carried out `delay` late (after the delay, so
    /// they see the state of then). Watches are delayed before they open.
    pub fn delay(delay: Duration) -> Fault {
        Fault {
            code: None,
            delay: Some(delay),
            ..Fault::status(0)
        }
    }

    /// Only requests with this verb.
    pub fn verb(mut self, verb: Verb) -> Fault {
        self.verb = Some(verb);
        self
    }

    /// Only requests on this resource (a plural, or `plural/status`).
    pub fn resource(mut self, resource: &str) -> Fault {
        self.resource = Some(resource.to_string());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, namespace: &str) -> Fault {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Only requests naming this object.
    pub fn name(mut self, name: &str) -> Fault {
        self.name = Some(name.to_string());
        self
    }

    /// Only the next `n` matching requests (then the fault is gone).
    pub fn times(mut self, n: usize) -> Fault {
        self.times = Some(n);
        self
    }

    fn matches(&self, req: &RequestInfo<'_>) -> bool {
        self.verb.is_none_or(|v| v == req.verb)
            && self.resource.as_deref().is_none_or(|r| r == req.resource)
            && self
                .namespace
                .as_deref()
                .is_none_or(|n| Some(n) == req.namespace)
            && self.name.as_deref().is_none_or(|n| Some(n) == req.name)
    }
}

/// What a fault is matched against.
pub(crate) struct RequestInfo<'a> {
    pub verb: Verb,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// What the matching faults ask for.
#[derive(Debug, Default)]
pub(crate) struct Injected {
    pub delay: Option<Duration>,
    pub error: Option<ApiError>,
}

/// Applies the faults in `list` that match (using up counted ones).
pub(crate) fn check(list: &mut Vec<Fault>, req: &RequestInfo<'_>, out: &mut Injected) {
    for f in list.iter_mut() {
        if f.times == Some(0) || !f.matches(req) {
            continue;
        }
        if let Some(n) = f.times.as_mut() {
            *n -= 1;
        }
        if let Some(d) = f.delay {
            out.delay = Some(out.delay.unwrap_or_default() + d);
        }
        if let Some(code) = f.code
            && out.error.is_none()
        {
            out.error = Some(error_for(code));
        }
    }
    list.retain(|f| f.times != Some(0));
}

fn error_for(code: u16) -> ApiError {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    ApiError::new(code, reason, format!("injected fault: {code} {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_faults_run_out_and_filters_apply() {
        let mut list = vec![
            Fault::status(503)
                .verb(Verb::Update)
                .resource("leases")
                .times(2),
            Fault::delay(Duration::from_millis(5)).name("a"),
        ];
        let req = |verb, name| RequestInfo {
            verb,
            resource: "leases",
            namespace: Some("ns"),
            name,
        };
        let mut out = Injected::default();
        check(&mut list, &req(Verb::Get, Some("b")), &mut out);
        assert!(out.error.is_none() && out.delay.is_none());
        for _ in 0..2 {
            let mut out = Injected::default();
            check(&mut list, &req(Verb::Update, Some("a")), &mut out);
            assert_eq!(out.error.unwrap().code, 503);
            assert_eq!(out.delay, Some(Duration::from_millis(5)));
        }
        let mut out = Injected::default();
        check(&mut list, &req(Verb::Update, Some("a")), &mut out);
        assert!(out.error.is_none());
        assert_eq!(list.len(), 1);
    }
}
