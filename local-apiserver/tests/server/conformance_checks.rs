//! The conformance checks (`kube_local_apiserver::conformance`) against
//! this server: each on a fresh server, in a fresh namespace, through a
//! real `kube_client::Client`.

use kube_local_apiserver::LocalApiServer;
use kube_local_apiserver::conformance;

macro_rules! check {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let server = LocalApiServer::start().await;
            let client = server.client();
            let ns = conformance::fresh_namespace(&client, "check").await;
            conformance::$name(client, &ns).await;
        }
    };
}

check!(create_get_replace_delete);
check!(replace_with_a_stale_resource_version_conflicts);
check!(no_op_writes_make_no_new_version);
check!(patches_of_every_type);
check!(owner_references_are_kept_and_validated);
check!(metadata_only_requests);
check!(secrets_string_data);
check!(immutable_configmaps_refuse_changes);
check!(pods_by_their_own_field_selectors);
check!(pagination_is_consistent);
check!(label_and_field_selectors);
check!(watch_from_a_resource_version);
check!(watch_selectors_turn_transitions_into_added_and_deleted);
check!(kube_runtime_watcher_follows_changes);
check!(deletion_waits_for_finalizers);
check!(deletion_preconditions_conflict);
check!(finalizer_helper_flow);
check!(leases_conflict_on_a_stale_resource_version);
check!(lease_patches_never_create_but_updates_do);
check!(status_subresource_on_deployments);
check!(custom_resources_through_a_crd);
check!(namespace_deletion_removes_its_objects);

/// All of them in one namespace, one after another, as a real-cluster run
/// would do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_checks_in_one_namespace() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let ns = conformance::fresh_namespace(&client, "all").await;
    conformance::all(client, &ns).await;
}
