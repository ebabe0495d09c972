//! What the controller reports beside the reconciler's own errors.

use std::fmt;
use std::time::Duration;

use kube_client::core::DynamicObject;
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;

use crate::leader::LeaseConfigError;
use tokio_workqueue::AddError;

/// The items of [`Controller::run`](super::Controller::run)'s stream:
/// kube-runtime's own result type, so code that consumes kube-runtime's
/// controller stream keeps working.
///
/// Reconciler errors arrive as kube-runtime's
/// [`ReconcilerFailed`](kube_runtime::controller::Error::ReconcilerFailed),
/// objects gone from the store as
/// [`ObjectNotFound`](kube_runtime::controller::Error::ObjectNotFound), and
/// everything else as
/// [`QueueError`](kube_runtime::controller::Error::QueueError) carrying a
/// [`ControllerError`].
pub type RunResult<K, E> = Result<
    (ObjectRef<K>, kube_runtime::controller::Action),
    kube_runtime::controller::Error<E, ControllerError>,
>;

/// What the controller reports that is not the reconciler's own error:
/// kube-runtime's `QueueError` slot of its error enum.
#[derive(Debug)]
#[non_exhaustive]
pub enum ControllerError {
    /// A watcher failed (list, watch or an `ERROR` event); it retries on its
    /// own after the trigger backoff.
    Watcher(watcher::Error),
    /// The reconcile panicked. Counted as an error for this object only: it
    /// is requeued through the rate limiter, and the other reconciles go on.
    ReconcilePanicked {
        /// The object being reconciled.
        object: Box<ObjectRef<DynamicObject>>,
        /// The panic's message.
        message: String,
    },
    /// The reconcile ran past the controller's
    /// [`reconcile_timeout`](super::Controller::reconcile_timeout) and was
    /// cancelled; it is requeued through the rate limiter.
    ReconcileTimedOut {
        /// The object being reconciled.
        object: Box<ObjectRef<DynamicObject>>,
        /// The timeout it passed.
        after: Duration,
    },
    /// A requeue was due but the queue refused it because the controller is
    /// shutting down: the object will not be reconciled again by this run.
    RequeueRefused {
        /// The object that was not requeued.
        object: Box<ObjectRef<DynamicObject>>,
        /// Why the queue refused it.
        error: AddError,
    },
    /// The reconciler's or error policy's `Action` could not be read (see
    /// the `kube` module docs): the object is requeued through the rate
    /// limiter instead, so it is not lost.
    UnreadableAction {
        /// The object whose action could not be read.
        object: Box<ObjectRef<DynamicObject>>,
        /// The action's `Debug` text.
        action: String,
    },
    /// The controller's [`LeaseConfig`](crate::leader::LeaseConfig)
    /// breaks client-go's rules: the controller reports this as the first
    /// item of its stream and ends without watching or reconciling.
    InvalidLeaseConfig(LeaseConfigError),
    /// This replica stopped leading while the reconcile ran, or (with
    /// shards) lost the key to another replica or could not renew its
    /// shard Lease, and the reconcile did not finish within the fencing
    /// grace, so it was cancelled. The key is queued again: for when this
    /// replica leads or renews again, and dropped when it comes out if
    /// another replica owns it now.
    ReconcileFenced {
        /// The object whose reconcile was cancelled.
        object: Box<ObjectRef<DynamicObject>>,
    },
    /// The controller was given both
    /// [`leader_election`](super::Controller::leader_election) and
    /// [`shards`](super::Controller::shards): one replica leads, or every
    /// replica takes a share, not both. Reported as the stream's only item.
    LeaderElectionWithShards,
    /// [`shards`](super::Controller::shards) with a split cache
    /// ([`ShardConfig::split_cache`](crate::shard::ShardConfig::split_cache))
    /// on a controller not made by [`Controller::new`](super::Controller::new):
    /// its watcher is given, so it cannot be narrowed to this replica's
    /// share. Reported as the stream's only item.
    SplitCacheWithoutWatcher,
    /// A controller made by a [`Manager`](crate::Manager) whose shards
    /// split the cache was given
    /// [`leader_election`](super::Controller::leader_election) or
    /// [`shards`](super::Controller::shards) of its own: its main cache is
    /// the manager's share of this replica, so it must follow the
    /// manager's membership. Reported as the stream's only item.
    OwnReplicationInSplitManager,
}

impl fmt::Display for ControllerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControllerError::Watcher(e) => write!(f, "watcher error: {e}"),
            ControllerError::ReconcilePanicked { object, message } => {
                write!(f, "reconcile of {object} panicked: {message}")
            }
            ControllerError::ReconcileTimedOut { object, after } => {
                write!(f, "reconcile of {object} timed out after {after:?}")
            }
            ControllerError::RequeueRefused { object, error } => {
                write!(f, "requeue of {object} refused: {error}")
            }
            ControllerError::UnreadableAction { object, action } => {
                write!(f, "could not read the action for {object}: {action}")
            }
            ControllerError::InvalidLeaseConfig(e) => write!(f, "leader election: {e}"),
            ControllerError::ReconcileFenced { object } => write!(
                f,
                "reconcile of {object} cancelled: this replica stopped leading or lost the key's shard"
            ),
            ControllerError::LeaderElectionWithShards => {
                f.write_str("a controller takes leader election or shards, not both")
            }
            ControllerError::SplitCacheWithoutWatcher => f.write_str(
                "a split cache narrows the controller's own watcher: make the controller with Controller::new",
            ),
            ControllerError::OwnReplicationInSplitManager => f.write_str(
                "a controller of a manager whose shards split the cache holds only the manager's share: it follows the manager's membership, not an election or shards of its own",
            ),
        }
    }
}

impl std::error::Error for ControllerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControllerError::Watcher(e) => Some(e),
            ControllerError::RequeueRefused { error, .. } => Some(error),
            ControllerError::InvalidLeaseConfig(error) => Some(error),
            _ => None,
        }
    }
}
