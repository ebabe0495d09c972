//! Request counts by verb and resource, so a test can say "no GETs while
//! reconciling" or "exactly two lists of configmaps".
//!
//! A request is counted once its path names a served resource, before it is
//! handled (a refused request counts too, as in the apiserver's own
//! `apiserver_request_total`). Discovery requests (`/api`, `/apis`,
//! `/version`) are not counted.

use std::collections::BTreeMap;
use std::fmt;

/// The Kubernetes verb of a request, as RBAC and audit logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// `GET` of one object (or its status).
    Get,
    /// `GET` of a collection.
    List,
    /// `GET` of a collection with `watch=true`.
    Watch,
    /// `POST` to a collection.
    Create,
    /// `PUT` of one object (or its status).
    Update,
    /// `PATCH` of one object (or its status), server-side apply included.
    Patch,
    /// `DELETE` of one object.
    Delete,
    /// `DELETE` of a collection.
    DeleteCollection,
}

impl Verb {
    /// Every verb, in a fixed order.
    pub const ALL: [Verb; 8] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ];

    /// The lower-case name (`get`, `deletecollection`).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot of request counts: by verb and by resource.
///
/// Resources are named by their plural (`configmaps`, `leases`); a
/// subresource is named `plural/subresource` (`deployments/status`), so
/// `of(Verb::Update, "deployments")` does not count status updates. Two
/// kinds with one plural in different groups share a count (name them by
/// `plural.group`, as in [`RequestCounts::of_group`], to tell them apart).
///
/// ```
/// use kube_local_apiserver::{RequestCounts, Verb};
/// let counts = RequestCounts::default();
/// assert_eq!(counts.of(Verb::Get, "configmaps"), 0);
/// assert_eq!(counts.verb(Verb::List), 0);
/// assert_eq!(counts.total(), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// (verb, group, resource) -> count.
    counts: BTreeMap<(Verb, String, String), u64>,
}

impl RequestCounts {
    pub(crate) fn record(&mut self, verb: Verb, group: &str, resource: &str) {
        *self
            .counts
            .entry((verb, group.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    /// Requests with `verb` on `resource` (a plural such as `configmaps`, or
    /// `plural/status`), in any group.
    pub fn of(&self, verb: Verb, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|((v, _, r), _)| *v == verb && r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests with `verb` on `resource` in API group `group` (`""` for the
    /// core group).
    pub fn of_group(&self, verb: Verb, group: &str, resource: &str) -> u64 {
        self.counts
            .get(&(verb, group.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests with `verb`, on any resource.
    pub fn verb(&self, verb: Verb) -> u64 {
        self.counts
            .iter()
            .filter(|((v, ..), _)| *v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests of any verb on `resource` (as in [`of`](Self::of)).
    pub fn resource(&self, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|((_, _, r), _)| r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// All counted requests.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Every non-zero count: (verb, group, resource, count).
    pub fn iter(&self) -> impl Iterator<Item = (Verb, &str, &str, u64)> + '_ {
        self.counts
            .iter()
            .map(|((v, g, r), n)| (*v, g.as_str(), r.as_str(), *n))
    }

    /// Requests counted here and not in `earlier` (a snapshot taken before):
    /// what happened in between.
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let counts = self
            .counts
            .iter()
            .filter_map(|(k, n)| {
                let before = earlier.counts.get(k).copied().unwrap_or(0);
                (*n > before).then(|| (k.clone(), n - before))
            })
            .collect();
        RequestCounts { counts }
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (verb, group, resource, n) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            if group.is_empty() {
                write!(f, "{verb} {resource}: {n}")?;
            } else {
                write!(f, "{verb} {resource}.{group}: {n}")?;
            }
        }
        if first {
            f.write_str("no requests")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_verb_resource_and_group() {
        let mut c = RequestCounts::default();
        c.record(Verb::Get, "", "configmaps");
        c.record(Verb::Get, "", "configmaps");
        c.record(Verb::List, "", "configmaps");
        c.record(Verb::Update, "apps", "deployments/status");
        c.record(Verb::Get, "example.com", "configmaps");
        assert_eq!(c.of(Verb::Get, "configmaps"), 3);
        assert_eq!(c.of_group(Verb::Get, "", "configmaps"), 2);
        assert_eq!(c.of(Verb::Update, "deployments"), 0);
        assert_eq!(c.of(Verb::Update, "deployments/status"), 1);
        assert_eq!(c.verb(Verb::Get), 3);
        assert_eq!(c.resource("configmaps"), 4);
        assert_eq!(c.total(), 5);
        let before = c.clone();
        c.record(Verb::Watch, "", "configmaps");
        let diff = c.since(&before);
        assert_eq!(diff.total(), 1);
        assert_eq!(diff.of(Verb::Watch, "configmaps"), 1);
        assert_eq!(diff.to_string(), "watch configmaps: 1");
    }
}
