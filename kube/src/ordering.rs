//! Orderings for queues of Kubernetes object references.
//!
//! The queue's orderings ([`tokio_workqueue::ordering`]) work on any key;
//! this module adds the one a Kubernetes controller most often wants: fair
//! share across namespaces, so one namespace's flood of changes does not
//! hold up the others.

use kube_runtime::reflector::{Lookup, ObjectRef};
use tokio_workqueue::FairShare;

/// Fair share by namespace for queues of [`ObjectRef`]s: cluster-scoped
/// objects (no namespace) form one tenant of their own.
pub type ByNamespace<R> = FairShare<ObjectRef<R>, Option<String>>;

/// Fair share across the keys' namespaces, each of weight 1:
/// `FairShare::new(|key| key.namespace.clone())`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use tokio_workqueue::WorkQueue;
/// use tokio_workqueue_kube::ObjectRef;
/// use tokio_workqueue_kube::ordering::by_namespace;
///
/// let queue: WorkQueue<ObjectRef<ConfigMap>, _> = WorkQueue::builder()
///     .ordering(by_namespace())
///     .build();
/// # drop(queue);
/// ```
pub fn by_namespace<R>() -> ByNamespace<R>
where
    R: Lookup + ?Sized + 'static,
{
    FairShare::new(|key: &ObjectRef<R>| key.namespace.clone())
}
