//! The local API server's behaviour checks (`kube_local_apiserver::conformance`)
//! against every selected backend: what passes on the local server must
//! pass on a real kube-apiserver too, or the local server is wrong (or the
//! difference is written down in /work/notes/apiserver-differences.md and
//! the local server's docs).

use kube_local_apiserver::conformance;
use kube_test_cluster::for_each_backend;

/// One `#[tokio::test]` per check, each on a fresh namespace per backend.
macro_rules! checks {
    ($($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            for_each_backend(stringify!($check), |ns| async move {
                conformance::$check(ns.client(), ns.name()).await;
            })
            .await;
        }
    )*};
}

checks!(
    create_get_replace_delete,
    replace_with_a_stale_resource_version_conflicts,
    no_op_writes_make_no_new_version,
    patches_of_every_type,
    owner_references_are_kept_and_validated,
    metadata_only_requests,
    secrets_string_data,
    pagination_is_consistent,
    label_and_field_selectors,
    watch_from_a_resource_version,
    watch_selectors_turn_transitions_into_added_and_deleted,
    kube_runtime_watcher_follows_changes,
    deletion_waits_for_finalizers,
    deletion_preconditions_conflict,
    finalizer_helper_flow,
    leases_conflict_on_a_stale_resource_version,
    status_subresource_on_deployments,
    custom_resources_through_a_crd,
    namespace_deletion_removes_its_objects,
);
