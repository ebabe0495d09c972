//! What the server serves: one [`KindSpec`] per (group, version, plural),
//! the built-in kinds every server starts with, and the kinds a
//! CustomResourceDefinition declares.
//!
//! Objects are stored per *resource* (group and plural), not per version, as
//! in etcd: a custom resource served in two versions is one object, read in
//! either (with no conversion beyond its `apiVersion`, as a CRD's `None`
//! conversion strategy does).

use std::collections::BTreeMap;

use serde_json::Value;

/// One kind the server serves: its group, version, names, scope and
/// subresources.
///
/// ```
/// use kube_local_apiserver::KindSpec;
/// let widgets = KindSpec::namespaced("example.com", "v1", "Widget", "widgets")
///     .with_status_subresource();
/// assert_eq!(widgets.api_version(), "example.com/v1");
/// assert!(widgets.namespaced && widgets.status_subresource);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindSpec {
    /// API group, `""` for the core group.
    pub group: String,
    /// Version (`v1`).
    pub version: String,
    /// Kind (`ConfigMap`).
    pub kind: String,
    /// Plural resource name, the one in URLs (`configmaps`).
    pub plural: String,
    /// Singular name (lower-case kind by default), for discovery.
    pub singular: String,
    /// Short names, for discovery.
    pub short_names: Vec<String>,
    /// Namespaced (`true`) or cluster-scoped.
    pub namespaced: bool,
    /// Has a `/status` subresource: writes to the object ignore `.status`,
    /// writes to `/status` change only `.status`.
    pub status_subresource: bool,
    /// Keeps `metadata.generation`: 1 on create, +1 on every change outside
    /// `metadata` (and outside `.status` with the status subresource), +1
    /// when deletion starts. Custom resources, Deployments and Pods do;
    /// ConfigMaps, Secrets, Leases and Namespaces do not.
    pub generation: bool,
    /// Updates (`PUT`) without `metadata.resourceVersion` are accepted
    /// (unconditional). Most built-in kinds allow it; Leases, CRDs and
    /// custom resources do not (422), as on a real server.
    pub unconditional_update: bool,
    /// Field selectors accepted beyond `metadata.name` and
    /// `metadata.namespace` (`spec.nodeName` for Pods, a CRD's
    /// `selectableFields`), as dotted paths into the object.
    pub selectable_fields: Vec<String>,
    /// Accepts strategic merge patches. Built-in kinds do; custom resources
    /// answer 415, as on a real server.
    pub strategic_merge: bool,
    /// An update (`PUT`) of a missing object creates it, whatever
    /// resourceVersion it carries, as kube-apiserver's registry does for
    /// kinds that allow create on update (Leases among them).
    pub create_on_update: bool,
}

impl KindSpec {
    fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> KindSpec {
        KindSpec {
            group: group.to_string(),
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            namespaced,
            status_subresource: false,
            generation: false,
            unconditional_update: true,
            selectable_fields: Vec::new(),
            strategic_merge: true,
            create_on_update: false,
        }
    }

    /// A namespaced kind with no subresources and no generation, updates
    /// allowed without a resourceVersion.
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> KindSpec {
        KindSpec::new(group, version, kind, plural, true)
    }

    /// A cluster-scoped kind, otherwise as [`namespaced`](Self::namespaced).
    pub fn cluster(group: &str, version: &str, kind: &str, plural: &str) -> KindSpec {
        KindSpec::new(group, version, kind, plural, false)
    }

    /// With the `/status` subresource.
    pub fn with_status_subresource(mut self) -> KindSpec {
        self.status_subresource = true;
        self
    }

    /// Keeping `metadata.generation`.
    pub fn with_generation(mut self) -> KindSpec {
        self.generation = true;
        self
    }

    /// Refusing updates without `metadata.resourceVersion` (as custom
    /// resources do).
    pub fn without_unconditional_update(mut self) -> KindSpec {
        self.unconditional_update = false;
        self
    }

    /// Creating a missing object on update (as Leases do).
    pub fn with_create_on_update(mut self) -> KindSpec {
        self.create_on_update = true;
        self
    }

    /// Refusing strategic merge patches with 415 (as custom resources do).
    pub fn without_strategic_merge(mut self) -> KindSpec {
        self.strategic_merge = false;
        self
    }

    /// Accepting field selectors on these dotted paths too.
    pub fn with_selectable_fields<I, S>(mut self, fields: I) -> KindSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.selectable_fields
            .extend(fields.into_iter().map(Into::into));
        self
    }

    /// With these short names (for discovery).
    pub fn with_short_names<I, S>(mut self, names: I) -> KindSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.short_names.extend(names.into_iter().map(Into::into));
        self
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource key objects of this kind are stored under.
    pub(crate) fn resource(&self) -> Resource {
        Resource {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }
}

/// Where objects of one kind are stored: its group and plural.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Resource {
    pub group: String,
    pub plural: String,
}

/// Every kind served, by (group, version, plural).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    kinds: BTreeMap<(String, String, String), KindSpec>,
}

impl Registry {
    /// A registry with the built-in kinds.
    pub fn with_builtins() -> Registry {
        let mut r = Registry::default();
        for k in builtins() {
            r.register(k);
        }
        r
    }

    pub fn register(&mut self, kind: KindSpec) {
        self.kinds.insert(
            (
                kind.group.clone(),
                kind.version.clone(),
                kind.plural.clone(),
            ),
            kind,
        );
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&KindSpec> {
        self.kinds
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// The kind with this `apiVersion` and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&KindSpec> {
        let (group, version) = split_api_version(api_version);
        self.kinds
            .values()
            .find(|k| k.group == group && k.version == version && k.kind == kind)
    }

    /// Removes every version of `group`/`plural` (a deleted CRD).
    pub fn unregister(&mut self, group: &str, plural: &str) {
        self.kinds
            .retain(|(g, _, p), _| !(g == group && p == plural));
    }

    pub fn all(&self) -> impl Iterator<Item = &KindSpec> {
        self.kinds.values()
    }

    /// Serves what a CustomResourceDefinition declares now (its served
    /// versions), in place of what it declared before.
    pub fn sync_crd(&mut self, crd: &Value) {
        let Some((group, plural)) = crd_resource(crd) else {
            return;
        };
        self.unregister(&group, &plural);
        for k in crd_kinds(crd) {
            self.register(k);
        }
    }
}

/// `(group, version)` of an `apiVersion`.
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// The group and plural a CRD defines.
pub(crate) fn crd_resource(crd: &Value) -> Option<(String, String)> {
    let spec = crd.get("spec")?;
    let group = spec.get("group")?.as_str()?.to_string();
    let plural = spec.get("names")?.get("plural")?.as_str()?.to_string();
    Some((group, plural))
}

/// The served kinds of a CRD.
pub(crate) fn crd_kinds(crd: &Value) -> Vec<KindSpec> {
    let Some(spec) = crd.get("spec") else {
        return Vec::new();
    };
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    let group = s(spec.get("group"));
    let names = spec.get("names").cloned().unwrap_or(Value::Null);
    let kind = s(names.get("kind"));
    let plural = s(names.get("plural"));
    let singular = match s(names.get("singular")) {
        x if x.is_empty() => kind.to_lowercase(),
        x => x,
    };
    let short_names = crate::meta::strings(names.get("shortNames"));
    let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
    let mut kinds = Vec::new();
    for v in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = s(v.get("name"));
        let mut k = KindSpec::new(&group, &version, &kind, &plural, namespaced)
            .with_generation()
            .without_unconditional_update()
            .without_strategic_merge()
            .with_short_names(short_names.clone());
        k.singular = singular.clone();
        if v.pointer("/subresources/status").is_some() {
            k.status_subresource = true;
        }
        let selectable = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
            .map(|p| p.trim_start_matches('.').to_string());
        k.selectable_fields.extend(selectable);
        kinds.push(k);
    }
    kinds
}

fn builtins() -> Vec<KindSpec> {
    let pod_fields = [
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ];
    let event_fields = [
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ];
    let apps = |kind: &str, plural: &str| {
        KindSpec::namespaced("apps", "v1", kind, plural)
            .with_status_subresource()
            .with_generation()
    };
    vec![
        KindSpec::namespaced("", "v1", "ConfigMap", "configmaps").with_short_names(["cm"]),
        KindSpec::namespaced("", "v1", "Secret", "secrets").with_selectable_fields(["type"]),
        KindSpec::namespaced("", "v1", "Pod", "pods")
            .with_status_subresource()
            .with_generation()
            .with_short_names(["po"])
            .with_selectable_fields(pod_fields),
        KindSpec::namespaced("", "v1", "Service", "services")
            .with_status_subresource()
            .with_short_names(["svc"]),
        KindSpec::namespaced("", "v1", "ServiceAccount", "serviceaccounts")
            .with_short_names(["sa"]),
        KindSpec::namespaced("", "v1", "Endpoints", "endpoints").with_short_names(["ep"]),
        KindSpec::namespaced("", "v1", "Event", "events")
            .with_short_names(["ev"])
            .with_selectable_fields(event_fields),
        KindSpec::cluster("", "v1", "Namespace", "namespaces")
            .with_status_subresource()
            .with_short_names(["ns"])
            .with_selectable_fields(["status.phase"]),
        KindSpec::cluster("", "v1", "Node", "nodes")
            .with_status_subresource()
            .with_short_names(["no"])
            .with_selectable_fields(["spec.unschedulable"]),
        // Leases refuse updates without a resourceVersion, as CRDs and
        // custom resources do: leader election depends on it. An update of
        // a missing Lease creates it (kube-apiserver's Lease strategy
        // allows create on update).
        KindSpec::namespaced("coordination.k8s.io", "v1", "Lease", "leases")
            .without_unconditional_update()
            .with_create_on_update(),
        KindSpec::namespaced("events.k8s.io", "v1", "Event", "events").with_short_names(["ev"]),
        apps("Deployment", "deployments").with_short_names(["deploy"]),
        apps("ReplicaSet", "replicasets").with_short_names(["rs"]),
        apps("StatefulSet", "statefulsets").with_short_names(["sts"]),
        apps("DaemonSet", "daemonsets").with_short_names(["ds"]),
        KindSpec::namespaced("batch", "v1", "Job", "jobs")
            .with_status_subresource()
            .with_generation(),
        KindSpec::cluster(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        )
        .with_status_subresource()
        .with_generation()
        .without_unconditional_update()
        .with_short_names(["crd", "crds"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_crd_registers_its_served_versions() {
        let crd = json!({
            "spec": {
                "group": "example.com",
                "names": { "kind": "Widget", "plural": "widgets" },
                "scope": "Cluster",
                "versions": [
                    { "name": "v1", "served": true, "storage": true,
                      "subresources": { "status": {} },
                      "selectableFields": [{ "jsonPath": ".spec.color" }] },
                    { "name": "v1beta1", "served": false, "storage": false },
                ],
            }
        });
        let mut r = Registry::default();
        r.sync_crd(&crd);
        let k = r.get("example.com", "v1", "widgets").unwrap();
        assert!(!k.namespaced && k.status_subresource && k.generation);
        assert!(!k.unconditional_update);
        assert_eq!(k.singular, "widget");
        assert_eq!(k.selectable_fields, ["spec.color"]);
        assert!(r.get("example.com", "v1beta1", "widgets").is_none());
        r.unregister("example.com", "widgets");
        assert!(r.get("example.com", "v1", "widgets").is_none());
    }
}
