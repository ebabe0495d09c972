//! The shard gauges, on `prometheus-client`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Gauges per shard group, labelled `name` (the group), as this
/// replica sees them:
///
/// * `workqueue_shard_members{name}`: the live members of the group,
///   this replica included while it renews its Lease;
/// * `workqueue_shard_keys_owned{name}`: the objects in the controller's
///   store that this replica owns under that membership. When the
///   controllers of a [`Manager`](crate::Manager) share one membership,
///   this gauge is left unset: each owns its own kind's objects, and one
///   series per group cannot tell them apart;
///
/// and one counter, with a split cache:
///
/// * `workqueue_shard_label_patches_total{name}`: the shard labels this
///   replica wrote while it was the group's coordinator.
///
/// Register it once, then give a clone to
/// [`Shards::metrics`](super::Shards::metrics):
///
/// ```
/// use prometheus_client::registry::Registry;
/// use tokio_workqueue_kube::shard::ShardMetrics;
///
/// let mut registry = Registry::default();
/// let metrics = ShardMetrics::new();
/// metrics.register(&mut registry);
/// assert_eq!(metrics.members("configmaps"), 0);
/// assert_eq!(metrics.keys_owned("configmaps"), 0);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"workqueue_shard_members{name="configmaps"} 0"#));
/// assert!(text.contains(r#"workqueue_shard_keys_owned{name="configmaps"} 0"#));
/// assert_eq!(metrics.label_patches("configmaps"), 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ShardMetrics {
    members: Family<Vec<(String, String)>, Gauge>,
    keys_owned: Family<Vec<(String, String)>, Gauge>,
    label_patches: Family<Vec<(String, String)>, Counter>,
}

impl ShardMetrics {
    /// Gauge families with no series yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers both gauge families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "workqueue_shard_members",
            "Live members of the shard group 'name' as this replica sees them.",
            self.members.clone(),
        );
        registry.register(
            "workqueue_shard_keys_owned",
            "Objects in the controller's store this replica owns in the shard group 'name'.",
            self.keys_owned.clone(),
        );
        registry.register(
            "workqueue_shard_label_patches",
            "Shard labels this replica wrote as the coordinator of the shard group 'name'.",
            self.label_patches.clone(),
        );
    }

    /// The label patches counter of group `name` (its series is made, at
    /// 0, if it was never reported).
    #[must_use]
    pub fn label_patches(&self, name: &str) -> u64 {
        self.label_patches.get_or_create(&label(name)).get()
    }

    /// Counts a label patch of group `name`.
    pub(crate) fn patched(&self, name: &str) {
        self.label_patches.get_or_create(&label(name)).inc();
    }

    /// The members gauge of group `name` (its series is made, at 0, if
    /// it was never reported).
    #[must_use]
    pub fn members(&self, name: &str) -> i64 {
        self.members.get_or_create(&label(name)).get()
    }

    /// The keys-owned gauge of group `name` (its series is made, at 0, if
    /// it was never reported).
    #[must_use]
    pub fn keys_owned(&self, name: &str) -> i64 {
        self.keys_owned.get_or_create(&label(name)).get()
    }

    /// Sets the gauges of group `name`; the keys owned only when given.
    pub(crate) fn set(&self, name: &str, members: usize, keys_owned: Option<usize>) {
        let label = label(name);
        self.members
            .get_or_create(&label)
            .set(i64::try_from(members).unwrap_or(i64::MAX));
        if let Some(keys_owned) = keys_owned {
            self.keys_owned
                .get_or_create(&label)
                .set(i64::try_from(keys_owned).unwrap_or(i64::MAX));
        }
    }
}

fn label(name: &str) -> Vec<(String, String)> {
    vec![("name".to_string(), name.to_string())]
}
