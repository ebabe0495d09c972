//! Split caches: the label that puts each object in its owner's cache, the
//! selector a replica watches its share with, and what the coordinator
//! writes.
//!
//! The label only decides which replica's cache an object is in; which
//! replica may reconcile it is still decided by the acknowledgements on
//! the Leases (see [`crate::shard`]). So a label that lags behind the
//! membership, or is wrong for a moment, delays a reconcile (the object is
//! missing from its owner's cache until it is relabelled) but never lets
//! two replicas reconcile one key.

use super::ShardConfig;
use super::ring::{Members, object_hash};

/// The prefix of every shard label's key; the group follows it.
pub const LABEL_PREFIX: &str = "shard.workqueue.tokio.rs/";

/// The field manager of the coordinator's label writes: the API server
/// records each object's shard label in a `managedFields` entry of this
/// manager.
///
/// A replica with a split cache removes that entry from the objects it
/// stores (and hands its reconciler): it records only the shard label,
/// and kept it would cost about 2 KB of memory per object (its `fieldsV1`
/// is a tree of maps), as much as a third of a small object's share. The
/// entry stays on the object in the API server; server-side apply and
/// every other manager's entries are untouched.
pub const LABEL_MANAGER: &str = "tokio-workqueue-shard-coordinator";

/// The key of group `group`'s shard label:
/// `shard.workqueue.tokio.rs/{group}`. Its value is the owner's identity.
///
/// ```
/// use tokio_workqueue_kube::shard::label_key;
///
/// assert_eq!(label_key("configmaps"), "shard.workqueue.tokio.rs/configmaps");
/// ```
#[must_use]
pub fn label_key(group: &str) -> String {
    format!("{LABEL_PREFIX}{group}")
}

/// The label selector of this replica's share with a split cache:
/// `shard.workqueue.tokio.rs/{group}={identity}`.
///
/// ```
/// use tokio_workqueue_kube::shard::{LabelRate, ShardConfig, selector};
///
/// let config = ShardConfig::new("cms", "default", "pod-a").split_cache(LabelRate::DEFAULT);
/// assert_eq!(selector(&config), "shard.workqueue.tokio.rs/cms=pod-a");
/// ```
#[must_use]
pub fn selector(config: &ShardConfig) -> String {
    format!("{}={}", label_key(config.group()), config.identity())
}

/// The shard label of `owner` in group `group`, as a (key, value) pair to
/// copy onto the children a reconciler creates or updates, or `None` if
/// `owner` has none yet.
///
/// With the label copied, the children's watch can be split too: give
/// [`Controller::owns`](crate::Controller::owns) a config selecting
/// [`selector`]`(config)`. The coordinator labels only the sharded kind,
/// so a child keeps its label until its owner's reconcile copies the new
/// one; an owner that moves is reconciled by its new replica after the
/// hand-over, which copies it then.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use tokio_workqueue_kube::shard::label_for;
///
/// let mut owner = ConfigMap::default();
/// assert_eq!(label_for(&owner, "cms"), None);
/// owner.metadata.labels = Some([("shard.workqueue.tokio.rs/cms".to_string(), "pod-a".to_string())].into());
/// assert_eq!(
///     label_for(&owner, "cms"),
///     Some(("shard.workqueue.tokio.rs/cms".to_string(), "pod-a".to_string()))
/// );
/// ```
#[must_use]
pub fn label_for<K: kube_client::Resource>(owner: &K, group: &str) -> Option<(String, String)> {
    let key = label_key(group);
    let value = owner.meta().labels.as_ref()?.get(&key)?.clone();
    Some((key, value))
}

/// Removes the coordinator's `managedFields` entry (see
/// [`LABEL_MANAGER`]) from `object`, if it has one.
pub(crate) fn forget_label_manager<K: kube_client::Resource>(object: &mut K) {
    let Some(fields) = &mut object.meta_mut().managed_fields else {
        return;
    };
    let before = fields.len();
    fields.retain(|f| f.manager.as_deref() != Some(LABEL_MANAGER));
    if fields.len() != before {
        // The entries are kept for as long as the object: no spare room.
        fields.shrink_to_fit();
    }
}

/// `own` added to the selector a watcher was given, if any: a replica with
/// a split cache watches what its user selected, of its own share.
pub(crate) fn narrow(given: Option<&str>, own: &str) -> String {
    match given.map(str::trim).filter(|g| !g.is_empty()) {
        Some(given) => format!("{given},{own}"),
        None => own.to_string(),
    }
}

/// What the coordinator writes on the object `namespace/name` whose shard
/// label is `current`: its owner under `members`, or `None` if the label
/// is right already or there is no member to give it to.
///
/// A label naming a member that left, one edited by hand, and a user's own
/// label under the same key are all overwritten: the key is this
/// library's.
pub(crate) fn relabel<'m>(
    members: &'m Members,
    namespace: Option<&str>,
    name: &str,
    current: Option<&str>,
) -> Option<&'m str> {
    super::protocol::relabel(members, object_hash(namespace, name), current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::owner;

    #[test]
    fn a_replica_narrows_the_selector_it_was_given() {
        assert_eq!(narrow(None, "s/g=a"), "s/g=a");
        assert_eq!(narrow(Some(""), "s/g=a"), "s/g=a");
        assert_eq!(narrow(Some("app=x"), "s/g=a"), "app=x,s/g=a");
        assert_eq!(narrow(Some("app in (x,y)"), "s/g=a"), "app in (x,y),s/g=a");
    }

    #[test]
    fn only_the_coordinator_s_managed_fields_entry_is_forgotten() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

        let entry = |manager: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            ..Default::default()
        };
        let mut cm = ConfigMap::default();
        forget_label_manager(&mut cm);
        assert_eq!(cm.metadata.managed_fields, None);
        cm.metadata.managed_fields = Some(vec![
            entry("kubectl"),
            entry(LABEL_MANAGER),
            entry("someone-else"),
        ]);
        forget_label_manager(&mut cm);
        let managers: Vec<_> = cm
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|f| f.manager.clone().unwrap())
            .collect();
        assert_eq!(managers, ["kubectl", "someone-else"]);
        // Nothing of ours: left as it was.
        forget_label_manager(&mut cm);
        assert_eq!(cm.metadata.managed_fields.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn objects_are_labelled_with_their_owner_and_only_when_it_differs() {
        let ids = ["a", "b", "c"];
        let members = Members::new(ids);
        for i in 0..300 {
            let name = format!("cm-{i}");
            let want = owner(&format!("default/{name}"), &ids).unwrap();
            assert_eq!(relabel(&members, Some("default"), &name, None), Some(want));
            assert_eq!(
                relabel(&members, Some("default"), &name, Some("gone")),
                Some(want)
            );
            assert_eq!(relabel(&members, Some("default"), &name, Some(want)), None);
            // A cluster-scoped object's key is its name.
            let want = owner(&name, &ids).unwrap();
            assert_eq!(relabel(&members, None, &name, Some("")), Some(want));
        }
        assert_eq!(
            relabel(&Members::default(), Some("default"), "x", None),
            None
        );
    }
}
