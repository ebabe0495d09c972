//! client-go's leader-election gauge, on `prometheus-client`.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `leader_election_master_status{name}`: 1 while this replica leads the
/// Lease `name`, 0 otherwise, as client-go reports it.
///
/// Register it once, then give a clone to each
/// [`LeaderElection::metrics`](super::LeaderElection::metrics):
///
/// ```
/// use prometheus_client::registry::Registry;
/// use tokio_workqueue_kube::leader::LeaderMetrics;
///
/// let mut registry = Registry::default();
/// let metrics = LeaderMetrics::new();
/// metrics.register(&mut registry);
/// // Not leading (yet): 0.
/// assert_eq!(metrics.status("my-controller"), 0);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"leader_election_master_status{name="my-controller"} 0"#));
/// ```
#[derive(Debug, Clone, Default)]
pub struct LeaderMetrics {
    status: Family<Vec<(String, String)>, Gauge>,
}

impl LeaderMetrics {
    /// A gauge family with no series yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the gauge family in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            self.status.clone(),
        );
    }

    /// The gauge's value for the Lease `name`; a Lease never reported gets
    /// its series, at 0.
    #[must_use]
    pub fn status(&self, name: &str) -> i64 {
        self.status.get_or_create(&label(name)).get()
    }

    pub(crate) fn set(&self, name: &str, leading: bool) {
        self.status
            .get_or_create(&label(name))
            .set(i64::from(leading));
    }
}

fn label(name: &str) -> Vec<(String, String)> {
    vec![("name".to_string(), name.to_string())]
}
