//! The runner's one replication gate: whether this replica reconciles at
//! all (a single replica), only while it leads (leader election), or only
//! its share of the keys (shards). The runner asks the gate its questions
//! and never looks at which kind of replication it has, so a new kind is
//! one more arm here, not more checks spread through the poll loop.

use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use kube_client::Resource;
use kube_runtime::reflector::{ObjectRef, Store};
use tokio_workqueue::Key;

use super::error::ControllerError;
use super::leadership::{Fence, Leadership};
pub(crate) use super::sharding::{Check, Resharded};
use super::sharding::{Joining, ShardStop, Sharding};
use crate::leader::LeaderElection;
use crate::shard::{Shards, SharedMembership};

/// A replication a manager runs for every controller it makes.
pub(crate) enum Shared {
    /// One leader election.
    Leader(Box<Leadership>),
    /// One shard membership.
    Shards(Arc<SharedMembership>),
}

/// How this replica shares the work with its peers.
pub(crate) enum Replication<K: Resource>
where
    K::DynamicType: Eq + Hash,
{
    /// Alone: every key is ours, at any time.
    Single,
    /// Reconciles start only while this replica leads.
    Leader(Box<Leadership>),
    /// Only this replica's keys are queued and reconciled.
    Shards(Box<Sharding<K>>),
}

impl<K> Replication<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Key,
{
    /// The gate for what the controller was configured with; its Lease
    /// config is validated here, so that starting it later cannot fail.
    ///
    /// `shared` is an election or a membership run for the controller by
    /// its manager; the controller's own election or shards, if any, take
    /// its place.
    pub(crate) fn new(
        leader: Option<LeaderElection>,
        shards: Option<Shards>,
        shared: Option<Shared>,
        dyntype: K::DynamicType,
    ) -> Result<Self, ControllerError> {
        match (leader, shards) {
            (None, None) => Ok(match shared {
                None => Replication::Single,
                Some(Shared::Leader(leader)) => Replication::Leader(leader),
                Some(Shared::Shards(membership)) => Replication::Shards(Box::new(Sharding::new(
                    Joining::Shared(membership),
                    dyntype,
                ))),
            }),
            (Some(_), Some(_)) => Err(ControllerError::LeaderElectionWithShards),
            (Some(election), None) => match election.config().validate() {
                Ok(()) => Ok(Replication::Leader(Box::new(Leadership::new(election)))),
                Err(e) => Err(ControllerError::InvalidLeaseConfig(e)),
            },
            (None, Some(shards)) => match shards.config().validate() {
                Ok(()) => Ok(Replication::Shards(Box::new(Sharding::new(
                    Joining::Own(Box::new(shards)),
                    dyntype,
                )))),
                Err(e) => Err(ControllerError::InvalidLeaseConfig(e)),
            },
        }
    }

    /// Runs for the group's coordinator with the membership (a split
    /// cache; only shards have one).
    pub(crate) fn coordinate(&mut self, start: super::split::StartCoordinator) {
        if let Replication::Shards(shards) = self {
            shards.coordinate(start);
        }
    }

    /// Starts the election or membership on the first call and follows
    /// it, with `cx` woken on a change. `Some` when the shard view
    /// changed: the keys it settled, for the runner to queue or forget.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, store: &Store<K>) -> Option<Resharded<K>> {
        match self {
            Replication::Single => None,
            Replication::Leader(leader) => {
                leader.poll(cx);
                None
            }
            Replication::Shards(shards) => {
                let old = shards.members();
                if !shards.poll(cx) {
                    shards.poll_timers(cx);
                    return None;
                }
                let resharded = shards.reshard(&old, store);
                // The view may have set the timers.
                shards.poll_timers(cx);
                Some(resharded)
            }
        }
    }

    /// Whether `key` is this replica's to queue; another replica's key
    /// has its owner's trigger.
    pub(crate) fn queues(&self, key: &ObjectRef<K>) -> bool {
        match self {
            Replication::Shards(shards) => shards.owns(key),
            Replication::Single | Replication::Leader(_) => true,
        }
    }

    /// Whether reconciles may start now. A follower, or a replica fenced
    /// because its last renewal ran out, keeps its keys queued for when it
    /// leads or renews again; they are another replica's to reconcile
    /// meanwhile.
    pub(crate) fn may_reconcile(&self) -> bool {
        match self {
            Replication::Single => true,
            Replication::Leader(leader) => leader.leading(),
            Replication::Shards(shards) => !shards.fenced(),
        }
    }

    /// What to do with a key the queue handed out.
    pub(crate) fn check(&mut self, key: &ObjectRef<K>) -> Check {
        match self {
            Replication::Shards(shards) => shards.check(key),
            Replication::Single | Replication::Leader(_) => Check::Start,
        }
    }

    /// A reconcile of `key` starts: what ends it early, to run inside its
    /// task (so it holds even while nobody polls the controller).
    pub(crate) fn started(&mut self, key: &ObjectRef<K>) -> Option<Stop> {
        match self {
            Replication::Single => None,
            Replication::Leader(leader) => leader.fence().map(Stop::Leader),
            Replication::Shards(shards) => shards.started(key).map(Stop::Shard),
        }
    }

    /// A reconcile of `key` ended (a view waiting on it may be
    /// acknowledged now).
    pub(crate) fn ended(&mut self, key: &ObjectRef<K>) {
        if let Replication::Shards(shards) = self {
            shards.ended(key);
        }
    }

    /// Hands this replica's Lease over once the controller is done, so the
    /// others take over at once instead of waiting for it to expire: ready
    /// when it is released, or there was nothing to release.
    pub(crate) fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Replication::Single => Poll::Ready(()),
            Replication::Leader(leader) => leader.poll_release(cx),
            Replication::Shards(shards) => shards.poll_leave(cx),
        }
    }
}

/// What ends a reconcile early, besides its timeout. The two kinds stay
/// apart because they end on different things: a leadership's term, or a
/// key's hand-over and the shard Lease's last renewal.
pub(crate) enum Stop {
    /// The leadership it started under ended a fencing grace ago.
    Leader(Fence),
    /// Its shard moved, or the replica fenced itself (see [`ShardStop`]).
    Shard(ShardStop),
}

impl Stop {
    /// Whether the reconcile may still begin: the leadership it was
    /// started under may have ended before its task ran.
    pub(crate) fn holds(&self) -> bool {
        match self {
            Stop::Leader(fence) => fence.holds(),
            Stop::Shard(_) => true,
        }
    }

    /// Completes when the reconcile must stop.
    pub(crate) async fn ended(self) {
        match self {
            Stop::Leader(fence) => fence.ended().await,
            Stop::Shard(shard) => shard.ended().await,
        }
    }
}
