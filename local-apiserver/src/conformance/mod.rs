//! Behaviour checks for any Kubernetes API server, this one or a real
//! kube-apiserver: each is an `async fn` of a `kube_client::Client` and a
//! namespace that already exists, and panics (with what it saw) when the
//! server does not behave as Kubernetes does.
//!
//! They use only the API (no backdoors), create what they need inside the
//! namespace (the CRD check also creates a cluster-scoped CRD named after
//! the namespace, and deletes it), and allow for what a real cluster does
//! asynchronously (CRDs becoming established, namespaces emptied by the
//! namespace controller) by polling for up to [`LIMIT`].
//!
//! ```no_run
//! # async fn run(client: kube_client::Client) {
//! use kube_local_apiserver::conformance;
//! let ns = conformance::fresh_namespace(&client, "checks").await;
//! conformance::all(client, &ns).await;
//! # }
//! ```
//!
//! Available with the `conformance` feature.

mod custom;
mod deletion;
mod leases;
mod lists;
mod objects;
mod status;
mod watches;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube_client::api::{Api, ObjectMeta, PostParams};
use kube_client::{Client, Error};

pub use custom::{custom_resources_through_a_crd, widget_crd};
pub use deletion::{
    deletion_preconditions_conflict, deletion_waits_for_finalizers, finalizer_helper_flow,
    namespace_deletion_removes_its_objects,
};
pub use leases::{
    lease_patches_never_create_but_updates_do, leases_conflict_on_a_stale_resource_version,
};
pub use lists::{
    label_and_field_selectors, pagination_is_consistent, pods_by_their_own_field_selectors,
};
pub use objects::{
    create_get_replace_delete, immutable_configmaps_refuse_changes, metadata_only_requests,
    no_op_writes_make_no_new_version, owner_references_are_kept_and_validated,
    patches_of_every_type, replace_with_a_stale_resource_version_conflicts, secrets_string_data,
};
pub use status::status_subresource_on_deployments;
pub use watches::{
    kube_runtime_watcher_follows_changes, watch_from_a_resource_version,
    watch_selectors_turn_transitions_into_added_and_deleted,
};

/// How long a check waits for something a real cluster does
/// asynchronously.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Runs every check in `ns`, one after another, except
/// [`namespace_deletion_removes_its_objects`], which needs the namespace
/// controller of kube-controller-manager (a bare kube-apiserver and etcd,
/// as envtest runs, leave deleted namespaces `Terminating` for ever).
pub async fn all(client: Client, ns: &str) {
    create_get_replace_delete(client.clone(), ns).await;
    replace_with_a_stale_resource_version_conflicts(client.clone(), ns).await;
    no_op_writes_make_no_new_version(client.clone(), ns).await;
    patches_of_every_type(client.clone(), ns).await;
    owner_references_are_kept_and_validated(client.clone(), ns).await;
    metadata_only_requests(client.clone(), ns).await;
    secrets_string_data(client.clone(), ns).await;
    immutable_configmaps_refuse_changes(client.clone(), ns).await;
    pagination_is_consistent(client.clone(), ns).await;
    label_and_field_selectors(client.clone(), ns).await;
    pods_by_their_own_field_selectors(client.clone(), ns).await;
    watch_from_a_resource_version(client.clone(), ns).await;
    watch_selectors_turn_transitions_into_added_and_deleted(client.clone(), ns).await;
    kube_runtime_watcher_follows_changes(client.clone(), ns).await;
    deletion_waits_for_finalizers(client.clone(), ns).await;
    deletion_preconditions_conflict(client.clone(), ns).await;
    finalizer_helper_flow(client.clone(), ns).await;
    leases_conflict_on_a_stale_resource_version(client.clone(), ns).await;
    lease_patches_never_create_but_updates_do(client.clone(), ns).await;
    status_subresource_on_deployments(client.clone(), ns).await;
    custom_resources_through_a_crd(client, ns).await;
}

/// Creates a namespace named `prefix-` and five random characters
/// (`generateName`), and returns its name.
pub async fn fresh_namespace(client: &Client, prefix: &str) -> String {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let created = api
        .create(&PostParams::default(), &ns)
        .await
        .expect("create a namespace");
    created.metadata.name.expect("a generated name")
}

/// The HTTP code and reason of an API error, or a panic naming `what`.
pub(crate) fn api_error<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> (u16, String) {
    match result {
        Err(Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("{what}: expected an API error, got {other:?}"),
    }
}

/// Polls `check` until it returns `Some`, for up to [`LIMIT`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A ConfigMap named `name` with `data`.
pub(crate) fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}
