//! The controller's side of shards: start the membership, filter triggers
//! to this replica's keys, check each key again when it is handed out,
//! hold gained keys aside until they are cleared, acknowledge a view once
//! nothing lost in it is in flight, and fence.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_workqueue::Key;

use futures_util::FutureExt;
use futures_util::future;
use kube_client::Resource;
use kube_runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::at_end::AtEnd;
use super::split::StartCoordinator;
use super::watched::Watched;
use crate::shard::{
    Coordinating, Declared, HandOut, Joint, Member, Members, Shards, SharedMembership, Slot, View,
    object_hash,
};

/// The hash of the key string the shards use: `namespace/name`, or `name`.
fn hash_of<K: Resource>(key: &ObjectRef<K>) -> u64 {
    object_hash(key.namespace.as_deref(), &key.name)
}

/// Where a controller's shard membership comes from.
pub(crate) enum Joining {
    /// Its own Lease, renewed from its first poll and released when it is
    /// done.
    Own(Box<Shards>),
    /// Its manager's, shared with the manager's other controllers: the
    /// manager releases it after every controller is done.
    Shared(Arc<SharedMembership>),
}

/// The runner's shards.
pub(crate) struct Sharding<K: Resource>
where
    K::DynamicType: Eq + Hash,
{
    /// Until the first poll (starting needs a runtime).
    joining: Option<Joining>,
    /// Its own membership, if it has one.
    member: Option<Member>,
    /// Whether the membership is the manager's (its keys-owned gauge is
    /// then left unset).
    #[cfg(feature = "prometheus")]
    shared: bool,
    group: String,
    renew_deadline: Duration,
    grace: Duration,
    view: Arc<View>,
    watched: Option<Watched<Arc<View>>>,
    /// What this replica acknowledges, made by its controllers together.
    joint: Arc<Joint>,
    /// The joint's latest declaration: the membership writes it, and
    /// keys are handed out by it.
    declared: watch::Receiver<Declared>,
    /// This controller's part in the joint, from the first poll.
    slot: Option<Slot>,
    /// Fires when the last renewal runs out.
    fence: Option<Pin<Box<Sleep>>>,
    fenced: bool,
    /// Keys owned but not cleared yet.
    parked: HashSet<ObjectRef<K>>,
    /// Keys in flight, with what cancels them.
    running: HashMap<ObjectRef<K>, CancellationToken>,
    /// When reconciles of keys no longer ours (all, once fenced) are
    /// cancelled.
    cancel_at: Option<Pin<Box<Sleep>>>,
    leave: AtEnd,
    dyntype: K::DynamicType,
    /// With a split cache: the candidacy for coordinator.
    candidacy: Candidacy,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::shard::ShardMetrics>,
}

impl<K> Sharding<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Key,
{
    /// The membership's config must have been validated.
    pub(crate) fn new(joining: Joining, dyntype: K::DynamicType) -> Self {
        let config = match &joining {
            Joining::Own(shards) => shards.config(),
            Joining::Shared(shared) => shared.config(),
        };
        let joint = match &joining {
            Joining::Own(_) => Joint::new(false),
            Joining::Shared(shared) => shared.joint().clone(),
        };
        #[cfg(feature = "prometheus")]
        let gauges = match &joining {
            Joining::Own(shards) => shards.gauges().cloned(),
            Joining::Shared(shared) => shared.gauges().cloned(),
        };
        Sharding {
            group: config.group().to_string(),
            renew_deadline: config.renew_deadline(),
            grace: config.fencing_grace(),
            view: Arc::new(View::unknown(config.identity().into())),
            #[cfg(feature = "prometheus")]
            metrics: gauges,
            #[cfg(feature = "prometheus")]
            shared: matches!(joining, Joining::Shared(_)),
            joining: Some(joining),
            member: None,
            watched: None,
            declared: joint.subscribe(),
            joint,
            slot: None,
            fence: None,
            fenced: true,
            parked: HashSet::new(),
            running: HashMap::new(),
            cancel_at: None,
            leave: AtEnd::default(),
            dyntype,
            candidacy: Candidacy::None,
        }
    }

    /// Runs for the group's coordinator (a split cache) once the
    /// membership starts.
    pub(crate) fn coordinate(&mut self, start: StartCoordinator) {
        self.candidacy = Candidacy::Waiting(start);
    }

    /// Starts the membership on the first call; tells whether the view
    /// changed (then [`reshard`](Self::reshard)).
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        if let Some(joining) = self.joining.take() {
            self.join(joining);
        }
        if let Some(watched) = &mut self.watched {
            watched.poll(cx);
            let current = watched.receiver().borrow().clone();
            if !Arc::ptr_eq(&current, &self.view) {
                // Readiness for the old members no longer holds once keys
                // may be handed out under the new ones.
                if current.members != self.view.members
                    && let Some(slot) = &mut self.slot
                {
                    slot.withdraw();
                }
                self.view = current;
                changed = true;
                self.arm_fence();
            }
        }
        changed
    }

    /// Takes this controller's slot in the acknowledgement and follows the
    /// membership's view, starting the membership if it is its own.
    fn join(&mut self, joining: Joining) {
        let view = match joining {
            Joining::Own(shards) => {
                match (*shards).start(self.joint.subscribe()) {
                    Ok(member) => {
                        let view = member.view.clone();
                        self.member = Some(member);
                        view
                    }
                    // Validated when the controller was run: cannot happen.
                    Err(error) => {
                        tracing::error!(%error, "shards not started");
                        return;
                    }
                }
            }
            Joining::Shared(shared) => match shared.view() {
                Some(view) => view,
                // The manager left already: it is shutting down.
                None => return,
            },
        };
        self.slot = Some(self.joint.join());
        if let Candidacy::Waiting(start) = std::mem::take(&mut self.candidacy) {
            self.candidacy = Candidacy::Running(start(view.clone()));
        }
        self.watched = Some(Watched::new(view));
    }

    /// Runs the fence and the cancellation timers; call it after
    /// [`reshard`](Self::reshard), which may set them.
    pub(crate) fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if let Some(fence) = &mut self.fence
            && fence.as_mut().poll(cx).is_ready()
        {
            self.fence = None;
            self.set_fenced(true);
        }
        if let Some(cancel) = &mut self.cancel_at
            && cancel.as_mut().poll(cx).is_ready()
        {
            self.cancel_at = None;
            for (key, token) in &self.running {
                if self.fenced || !self.view.owns(hash_of(key)) {
                    token.cancel();
                }
            }
        }
    }

    /// Sets the fence timer from the view's last renewal.
    fn arm_fence(&mut self) {
        match self.view.renewed {
            Some(renewed) if Instant::now() < renewed + self.renew_deadline => {
                self.set_fenced(false);
                self.fence = Some(Box::pin(sleep_until(renewed + self.renew_deadline)));
            }
            _ => {
                self.fence = None;
                self.set_fenced(true);
            }
        }
    }

    fn set_fenced(&mut self, fenced: bool) {
        if fenced && !self.fenced {
            tracing::warn!(group = %self.group, "could not renew the shard lease by the renew deadline; fencing");
            self.arm_cancel();
        } else if !fenced && self.fenced {
            tracing::debug!(group = %self.group, "shard lease renewed");
        }
        self.fenced = fenced;
    }

    fn arm_cancel(&mut self) {
        if self.cancel_at.is_none() && !self.running.is_empty() {
            self.cancel_at = Some(Box::pin(sleep_until(Instant::now() + self.grace)));
        }
    }

    /// Whether no reconcile may start: the last renewal ran out.
    pub(crate) fn fenced(&self) -> bool {
        self.fenced
    }

    /// Whether `key` is this replica's to queue.
    pub(crate) fn owns(&self, key: &ObjectRef<K>) -> bool {
        self.view.owns(hash_of(key))
    }

    /// Whether this replica may act on its view now: not fenced, checked
    /// against the clock too, in case the timer has not run yet. (Whether
    /// a key may start is the view's [`View::may_start`].)
    fn fresh(&self) -> bool {
        !self.fenced
            && self
                .view
                .renewed
                .is_some_and(|r| Instant::now() < r + self.renew_deadline)
    }

    /// What to do with a key the queue handed out.
    pub(crate) fn check(&mut self, key: &ObjectRef<K>) -> Check {
        let hash = hash_of(key);
        let check = self
            .view
            .hand_out(&self.declared.borrow(), self.fresh(), hash);
        if check == HandOut::Parked {
            self.parked.insert(key.clone());
        }
        check
    }

    /// A reconcile of `key` starts: what ends it early.
    pub(crate) fn started(&mut self, key: &ObjectRef<K>) -> Option<ShardStop> {
        let view = self.watched.as_ref()?.receiver().clone();
        let token = CancellationToken::new();
        self.running.insert(key.clone(), token.clone());
        if let Some(slot) = &mut self.slot {
            slot.set_in_flight(true);
        }
        Some(ShardStop {
            token,
            view,
            renew_deadline: self.renew_deadline,
            grace: self.grace,
        })
    }

    /// A reconcile of `key` ended; acknowledges the view if that was the
    /// last lost key in flight.
    pub(crate) fn ended(&mut self, key: &ObjectRef<K>) {
        self.running.remove(key);
        if let Some(slot) = &mut self.slot {
            slot.set_in_flight(!self.running.is_empty());
        }
        self.declare();
    }

    /// Declares the current view ready for acknowledgement once nothing
    /// it takes from this controller is in flight; the replica
    /// acknowledges it once every controller on its membership has.
    fn declare(&mut self) {
        let Some(slot) = &mut self.slot else {
            return;
        };
        let next = self
            .view
            .declaration(&self.declared.borrow(), self.running.keys().map(hash_of));
        if let Some((_, members)) = next {
            tracing::debug!(?members, "ready to acknowledge the shard view");
            slot.ready(members);
        }
    }

    /// Works through a new view: parks the keys gained, drops parked keys
    /// lost, returns the parked keys now cleared (to queue at the low
    /// priority), arms the cancellation of lost keys in flight, and
    /// declares the view when it can.
    pub(crate) fn reshard(&mut self, old: &Members, store: &Store<K>) -> Resharded<K> {
        let view = self.view.clone();
        let me = &*view.me;
        let changed = *old != view.members;
        #[cfg(feature = "prometheus")]
        let gauges = self.metrics.is_some();
        #[cfg(not(feature = "prometheus"))]
        let gauges = false;
        // The store is looked through when the members changed (for the
        // keys gained), or to count the keys owned for the gauge; not on
        // every round otherwise.
        let mut owned = 0usize;
        if changed || gauges {
            for object in store.state() {
                let meta = object.meta();
                let name = meta.name.as_deref().unwrap_or_default();
                let hash = object_hash(meta.namespace.as_deref(), name);
                if view.members.gives(hash, me) {
                    owned += 1;
                    if changed && view.gained(old, hash) {
                        self.parked
                            .insert(super::triggers::key_of(&*object, self.dyntype.clone()));
                    }
                }
            }
        }
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.set(
                &self.group,
                view.members.len(),
                (!self.shared).then_some(owned),
            );
        }
        if changed {
            tracing::info!(group = %self.group, members = ?view.members, owned, "shard membership changed");
            if self.running.keys().any(|k| !view.owns(hash_of(k))) {
                self.arm_cancel();
            }
        }
        self.declare();
        let mut cleared = Vec::new();
        let mut lost = Vec::new();
        let fresh = self.fresh();
        let declared = self.declared.borrow().clone();
        for key in std::mem::take(&mut self.parked) {
            match view.hand_out(&declared, fresh, hash_of(&key)) {
                HandOut::NotOurs => lost.push(key),
                HandOut::Start => cleared.push(key),
                HandOut::Parked => {
                    self.parked.insert(key);
                }
            }
        }
        Resharded { cleared, lost }
    }

    /// The view's members now (to compare with the next).
    pub(crate) fn members(&self) -> Members {
        self.view.members.clone()
    }

    /// Leaves the group (once the controller is done): ready when the
    /// Lease is released or there was nothing to release.
    pub(crate) fn poll_leave(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.joining = None;
        // Done, so nothing is in flight: the other controllers on the
        // membership need not wait for this one any more. A shared
        // membership is the manager's to leave.
        self.slot = None;
        let (member, candidacy) = (&mut self.member, &mut self.candidacy);
        self.leave.poll(cx, || {
            let coordinating = match std::mem::take(candidacy) {
                Candidacy::Running(c) => Some(c),
                Candidacy::None | Candidacy::Waiting(_) => None,
            };
            member.take().map(|m| {
                async move {
                    // The coordinator's Lease first: the others then find
                    // one to take over as soon as this one is gone.
                    if let Some(c) = coordinating {
                        c.leave().await;
                    }
                    m.leave().await;
                }
                .boxed()
            })
        })
    }
}

/// A split cache's candidacy for its group's coordinator.
#[derive(Default)]
enum Candidacy {
    /// No split cache (or left already).
    #[default]
    None,
    /// To start with the membership, which gives it the view.
    Waiting(StartCoordinator),
    /// Running: its task stops when this is dropped, and releases the
    /// coordinator's Lease when left.
    Running(Coordinating),
}

/// What ends a reconcile of a sharded controller early: the hand-over of
/// its key (the runner cancels the token a grace after the view that
/// took the key away), or the fence, which runs in the reconcile's own
/// task so that it holds even while nobody polls the controller's stream:
/// a grace after the renew deadline of the last renewal the membership
/// published.
pub(crate) struct ShardStop {
    token: CancellationToken,
    view: watch::Receiver<Arc<View>>,
    renew_deadline: Duration,
    grace: Duration,
}

impl ShardStop {
    /// Completes when the reconcile must stop.
    pub(crate) async fn ended(self) {
        let ShardStop {
            token,
            mut view,
            renew_deadline,
            grace,
        } = self;
        let fence = async move {
            loop {
                let Some(renewed) = view.borrow_and_update().renewed else {
                    return;
                };
                let until = renewed + renew_deadline + grace;
                if Instant::now() >= until {
                    return;
                }
                let timer = std::pin::pin!(sleep_until(until));
                let changed = std::pin::pin!(view.changed());
                match future::select(timer, changed).await {
                    // Looked at again: a renewal may have come with it.
                    future::Either::Left(_) | future::Either::Right((Ok(()), _)) => {}
                    // The membership is gone: nothing renews any more.
                    future::Either::Right((Err(_), _)) => {
                        sleep_until(until).await;
                        return;
                    }
                }
            }
        };
        let cancelled = std::pin::pin!(token.cancelled_owned());
        let fence = std::pin::pin!(fence);
        future::select(cancelled, fence).await;
    }
}

/// Parked keys a new view settled.
pub(crate) struct Resharded<K: Resource> {
    /// Cleared: queue them.
    pub(crate) cleared: Vec<ObjectRef<K>>,
    /// Another replica's now: forget them.
    pub(crate) lost: Vec<ObjectRef<K>>,
}

/// What [`Sharding::check`] found: the protocol's [`HandOut`].
pub(crate) type Check = HandOut;
