//! Discovery documents (`/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/{group}`, `/apis/{group}/{version}`), built from the served
//! kinds, so kube-client's `Discovery::run` and `apiserver_version` work.
//! Aggregated discovery (`Discovery::run_aggregated`) is not served.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::kinds::Registry;

/// The Kubernetes version the server reports.
pub(crate) const MAJOR: &str = "1";
/// The minor version the server reports.
pub(crate) const MINOR: &str = "34";

/// The document at `segments` (the path split on `/`), if it is a discovery
/// path.
pub(crate) fn document(registry: &Registry, segments: &[&str]) -> Option<Value> {
    match segments {
        ["version"] => Some(json!({
            "major": MAJOR,
            "minor": MINOR,
            "gitVersion": format!("v{MAJOR}.{MINOR}.0-kube-local-apiserver"),
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "none (kube-local-apiserver is Rust)",
            "compiler": "rustc",
            "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        })),
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        })),
        ["apis"] => {
            let groups: Vec<Value> = groups(registry)
                .into_iter()
                .map(|(name, versions)| group_doc(&name, &versions))
                .collect();
            Some(json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups }))
        }
        ["apis", group] => {
            let versions = groups(registry).remove(*group)?;
            let mut doc = group_doc(group, &versions);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            Some(doc)
        }
        ["api", "v1"] => resource_list(registry, "", "v1"),
        ["apis", group, version] => resource_list(registry, group, version),
        _ => None,
    }
}

/// Served versions per non-core group.
fn groups(registry: &Registry) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in registry.all() {
        if k.group.is_empty() {
            continue;
        }
        let versions = out.entry(k.group.clone()).or_default();
        if !versions.contains(&k.version) {
            versions.push(k.version.clone());
        }
    }
    out
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v }))
        .collect();
    // Kubernetes prefers the highest stable version; the first is enough
    // for the versions served here.
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({ "name": name, "versions": vs, "preferredVersion": preferred })
}

fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for k in registry.all() {
        if k.group != group || k.version != version {
            continue;
        }
        resources.push(json!({
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": k.short_names,
        }));
        if k.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}
