//! A replica's membership: one task that renews this replica's Lease
//! (writing its acknowledgement on it) and reads the group's Leases, and
//! publishes what it saw as a [`View`].

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::Timestamp;
use kube_client::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube_client::{Api, Client};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::config::ShardConfig;
use super::coordinator::{Coordinating, Coordinator, Kind};
use super::joint::Joint;
use super::protocol::{AckLog, Declared, Verdict, View, judge};
use super::ring::Members;
use super::{ACK_ANNOTATION, GROUP_LABEL};
use crate::leader::LeaseConfigError;
use crate::lease::{self, Seen, WallClock, is_conflict};

/// A replica's membership in a shard group, not started yet: the Lease
/// API, the [`ShardConfig`], and the optional wall clock and gauges. Hand
/// it to [`Controller::shards`](crate::Controller::shards).
#[derive(Clone)]
pub struct Shards {
    api: Api<Lease>,
    config: ShardConfig,
    clock: WallClock,
    /// Label writes made as the group's coordinator (split caches).
    label_patches: super::coordinator::PatchCount,
    #[cfg(feature = "prometheus")]
    metrics: Option<super::ShardMetrics>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Shards {
    /// Membership in `config`'s group, through `client`.
    #[must_use]
    pub fn new(client: Client, config: ShardConfig) -> Self {
        Shards {
            api: Api::namespaced(client, config.namespace()),
            config,
            clock: Arc::new(Timestamp::now),
            label_patches: Default::default(),
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }

    /// Reads the `renewTime` written on the Lease from `clock` instead of
    /// the system clock. No member ever compares those times with a clock;
    /// the tests skew this one to show it.
    #[must_use]
    pub fn wall_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Reports the members seen and the keys owned in `metrics`.
    #[cfg(feature = "prometheus")]
    #[must_use]
    pub fn metrics(mut self, metrics: super::ShardMetrics) -> Self {
        // Before the membership starts, so nothing was counted yet.
        self.label_patches = super::coordinator::PatchCount::with_metrics(metrics.clone());
        self.metrics = Some(metrics);
        self
    }

    /// The membership's config.
    #[must_use]
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }

    /// The shard labels this replica wrote while it was its group's
    /// coordinator (with a split cache; clones of this `Shards` count
    /// together).
    #[must_use]
    pub fn label_patches(&self) -> u64 {
        self.label_patches.get()
    }

    pub(crate) fn label_patch_counter(&self) -> super::coordinator::PatchCount {
        self.label_patches.clone()
    }

    /// The wall clock its Leases' `renewTime` is read from.
    pub(crate) fn clock(&self) -> WallClock {
        self.clock.clone()
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn gauges(&self) -> Option<&super::ShardMetrics> {
        self.metrics.as_ref()
    }

    /// Starts renewing and reading on a task; `declared` is the member set
    /// this replica is ready to acknowledge, with its number.
    pub(crate) fn start(
        self,
        declared: watch::Receiver<Declared>,
    ) -> Result<Member, LeaseConfigError> {
        self.config.validate()?;
        let me: Arc<str> = self.config.identity().into();
        let (tx, rx) = watch::channel(Arc::new(View::unknown(me.clone())));
        let task = Task {
            api: self.api.clone(),
            config: self.config.clone(),
            clock: self.clock,
            me,
            declared,
            acks: AckLog::default(),
            own: None,
            observed: HashMap::new(),
            renewed: None,
            tx,
        };
        Ok(Member {
            view: rx,
            task: Some(tokio::spawn(task.run())),
            api: self.api,
            name: self.config.lease_name(),
            me: self.config.identity().to_string(),
        })
    }
}

/// A membership several controllers follow, a manager's: started by the
/// first that asks (or the manager), acknowledged through a [`Joint`] of
/// their declarations, and left once, after every controller. With a
/// split cache, the replica runs for the group's coordinator with it,
/// labelling every kind its controllers split ([`label`](Self::label)).
pub(crate) struct SharedMembership {
    joint: Arc<Joint>,
    config: ShardConfig,
    #[cfg(feature = "prometheus")]
    gauges: Option<super::ShardMetrics>,
    state: Mutex<Started>,
}

enum Started {
    /// Not started: the membership, and the kinds to label once it is.
    Not(Shards, Vec<Kind>),
    /// Running, with the candidacy for coordinator if the cache is split.
    Running(Member, Option<Coordinating>),
    Left,
}

impl SharedMembership {
    /// `shards`' config must have been validated.
    pub(crate) fn new(shards: Shards) -> Arc<Self> {
        Arc::new(SharedMembership {
            joint: Joint::new(true),
            config: shards.config.clone(),
            #[cfg(feature = "prometheus")]
            gauges: shards.metrics.clone(),
            state: Mutex::new(Started::Not(shards, Vec::new())),
        })
    }

    /// The membership's config.
    pub(crate) fn config(&self) -> &ShardConfig {
        &self.config
    }

    #[cfg(feature = "prometheus")]
    pub(crate) fn gauges(&self) -> Option<&super::ShardMetrics> {
        self.gauges.as_ref()
    }

    /// Adds `kind` to what this replica labels while it is the group's
    /// coordinator (a split cache). Kinds are added before the membership
    /// starts (a manager makes its controllers before it runs); one added
    /// later is not labelled, and that is logged.
    pub(crate) fn label(&self, kind: Kind) {
        match &mut *self.state.lock() {
            Started::Not(_, kinds) => kinds.push(kind),
            Started::Running(..) | Started::Left => tracing::error!(
                group = self.config.group(),
                "a controller with a split cache was made after its manager's shard membership \
                 started: its objects are not labelled by this replica"
            ),
        }
    }

    /// The view the membership publishes, starting it on the first call
    /// (within a runtime), with the candidacy for coordinator if any kind
    /// is to be labelled; `None` once it was left.
    pub(crate) fn view(&self) -> Option<watch::Receiver<Arc<View>>> {
        let mut state = self.state.lock();
        *state = match std::mem::replace(&mut *state, Started::Left) {
            Started::Not(shards, kinds) => {
                let coordinator = (!kinds.is_empty()).then(|| {
                    Coordinator::new(
                        shards.api.clone().into_client(),
                        kinds,
                        self.config.clone(),
                        shards.clock(),
                        shards.label_patch_counter(),
                    )
                });
                match shards.start(self.joint.subscribe()) {
                    Ok(member) => {
                        let coordinating = coordinator.map(|c| c.start(member.view.clone()));
                        Started::Running(member, coordinating)
                    }
                    // Validated when the manager was given it: cannot happen.
                    Err(error) => {
                        tracing::error!(%error, "shards not started");
                        Started::Left
                    }
                }
            }
            started => started,
        };
        match &*state {
            Started::Running(member, _) => Some(member.view.clone()),
            Started::Not(..) | Started::Left => None,
        }
    }

    /// The acknowledgement its controllers make together.
    pub(crate) fn joint(&self) -> &Arc<Joint> {
        &self.joint
    }

    /// Releases the coordinator's Lease, if held, then this replica's;
    /// call it once every controller is done.
    pub(crate) async fn leave(&self) {
        let (member, coordinating) = match std::mem::replace(&mut *self.state.lock(), Started::Left)
        {
            Started::Running(member, coordinating) => (member, coordinating),
            Started::Not(..) | Started::Left => return,
        };
        // The coordinator's Lease first: the others then find one to take
        // over as soon as this one is gone.
        if let Some(coordinating) = coordinating {
            coordinating.leave().await;
        }
        member.leave().await;
    }
}

/// A running membership: the task and the view it publishes.
pub(crate) struct Member {
    pub(crate) view: watch::Receiver<Arc<View>>,
    task: Option<JoinHandle<()>>,
    api: Api<Lease>,
    name: String,
    me: String,
}

impl Member {
    /// Stops the task and releases this replica's Lease (clears its holder
    /// and acknowledgement, as a released leader lease), so the others
    /// take its keys at their next read; they delete it later (see
    /// [`ShardConfig::forget_after`]). Call it only with nothing in flight.
    pub(crate) async fn leave(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        // A renewal the task had on the wire carries an older
        // resourceVersion: it cannot land after this write.
        let (api, name) = (&self.api, self.name.as_str());
        let left = lease::release(api, name, &self.me, |lease| {
            let patch = released(lease.metadata.resource_version.as_deref());
            async move { api.patch(name, &PatchParams::default(), &patch).await }
        })
        .await;
        match left {
            Ok(true) => tracing::info!(lease = %self.name, "left the shard group"),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%error, lease = %self.name, "could not release the shard lease; it will expire");
            }
        }
    }
}

/// A merge patch that releases a Lease if it is still at `version`: no
/// holder, nothing acknowledged.
fn released(version: Option<&str>) -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({
        "metadata": {
            "resourceVersion": version,
            "annotations": { ACK_ANNOTATION: "" },
        },
        "spec": { "holderIdentity": null },
    }))
}

impl Drop for Member {
    fn drop(&mut self) {
        // As a crash: the Lease stays and expires.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A Lease of the group as this replica last saw it, and when it saw its
/// record change.
#[derive(Clone)]
struct Observed {
    seen: Seen,
    holder: Option<Arc<str>>,
    ack: Members,
    /// When this replica last tried to delete it as stale.
    forgot: Option<Instant>,
}

struct Task {
    api: Api<Lease>,
    config: ShardConfig,
    clock: WallClock,
    me: Arc<str>,
    declared: watch::Receiver<Declared>,
    /// Every acknowledgement that may be on our Lease, and the number of
    /// the last declaration sent.
    acks: AckLog,
    /// Our Lease as last read or written (its resourceVersion is the one
    /// the next renewal writes with).
    own: Option<Lease>,
    observed: HashMap<String, Observed>,
    renewed: Option<Instant>,
    tx: watch::Sender<Arc<View>>,
}

impl Task {
    /// A new Lease of the group, named `name`, labelled with the group.
    fn blank(&self, name: String) -> Lease {
        let labels = [(GROUP_LABEL.to_string(), self.config.group().to_string())];
        let mut lease = lease::blank(name, self.config.namespace());
        lease.metadata.labels = Some(labels.into_iter().collect());
        lease
    }

    /// Our Lease as we write it: holder, times, label, acknowledgement.
    fn record(&self, lease: Option<Lease>, ack: &Members) -> Lease {
        let mut lease = lease.unwrap_or_else(|| self.blank(self.config.lease_name()));
        lease
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(GROUP_LABEL.to_string(), self.config.group().to_string());
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ACK_ANNOTATION.to_string(), ack.encode());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let duration = self.config.lease().lease_duration_seconds();
        lease::hold(spec, &self.me, &self.clock, duration);
        lease
    }

    /// Writes our Lease with what we declared. The declared set counts as
    /// possibly written from the moment the write is sent.
    ///
    /// An existing Lease is written with a merge patch carrying the
    /// resourceVersion read: a write that lands late fails instead of
    /// overwriting a newer record, and (unlike an update, which
    /// kube-apiserver may turn into a create) never brings back a Lease
    /// that was deleted.
    async fn renew(&mut self) -> Result<(), kube_client::Error> {
        let declared = self.declared.borrow_and_update().clone();
        self.acks.sending(&declared);
        let ack = declared.1;
        let name = self.config.lease_name();
        let current = match self.own.take() {
            Some(lease) => Some(lease),
            None => self.api.get_opt(&name).await?,
        };
        let written = match current {
            None => {
                self.api
                    .create(&PostParams::default(), &self.record(None, &ack))
                    .await
            }
            Some(lease) => {
                let record = self.record(Some(lease), &ack);
                self.api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&record))
                    .await
            }
        };
        let lease = written?;
        self.own = Some(lease);
        self.acks.written(ack);
        Ok(())
    }

    /// Ends the membership of a member this replica saw unchanged for a
    /// lease duration, by writing its Lease as released, on the condition
    /// that it is still the version seen (for a Lease that vanished: by
    /// creating a released one in its place). Only once that write
    /// succeeded is the member left out. A renewal of the member's that
    /// landed after our read makes the write fail, and the member stays; one
    /// that lands after the write fails on the member's side, so it cannot
    /// go on acting on a renewal nobody saw. It fenced itself before the
    /// lease duration ran out.
    async fn expire(&self, name: &str, seen: &Observed, vanished: bool) -> bool {
        let written = if vanished {
            let tombstone = self.blank(name.to_string());
            self.api
                .create(&PostParams::default(), &tombstone)
                .await
                .map(drop)
        } else {
            self.api
                .patch(
                    name,
                    &PatchParams::default(),
                    &released(seen.seen.version.as_deref()),
                )
                .await
                .map(drop)
        };
        match written {
            Ok(()) => {
                tracing::info!(lease = name, holder = ?seen.holder, "a shard member's lease expired; released it");
                true
            }
            Err(error) => {
                tracing::debug!(%error, lease = name, "could not release an expired shard lease; it stays a member");
                false
            }
        }
    }

    /// Reads the group's Leases and works out the live members and their
    /// acknowledgements.
    async fn read(&mut self) -> Result<View, kube_client::Error> {
        let selector = format!("{GROUP_LABEL}={}", self.config.group());
        // Ages are counted up to when the list was sent: the server may
        // have answered from a moment after that, never before.
        let sent = Instant::now();
        let leases = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let arrived = Instant::now();
        let lease_duration = self.config.lease_duration();
        let forget_after = self.config.forget_after();
        let own_name = self.config.lease_name();
        let mut previous = std::mem::take(&mut self.observed);
        let mut seen: Vec<(String, Observed, bool)> = Vec::new();
        for lease in leases {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            if name == own_name {
                // Our own record: the one the next renewal writes over.
                self.own = Some(lease);
                continue;
            }
            let (record, forgot) = match previous.remove(&name) {
                Some(o) if o.seen.is(&lease) => (o.seen, o.forgot),
                _ => (Seen::new(&lease, arrived), None),
            };
            let holder: Option<Arc<str>> = lease::holder(&lease).map(Into::into);
            let ack = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ACK_ANNOTATION))
                .map(|text| Members::decode(text))
                .unwrap_or_default();
            let observed = Observed {
                seen: record,
                holder,
                ack,
                forgot,
            };
            seen.push((name, observed, false));
        }
        // A Lease that vanished while it had a holder is still a member
        // until it expires as any other: its holder may not know yet.
        for (name, o) in previous {
            if o.holder.is_some() && name != own_name {
                seen.push((name, o, true));
            }
        }
        let mut live = Vec::new();
        for (name, mut o, vanished) in seen {
            let unchanged_for = o.seen.unchanged_for(sent);
            let held_by_another = o.holder.as_deref().is_some_and(|h| *h != *self.me);
            let verdict = judge(held_by_another, unchanged_for >= lease_duration);
            match (verdict, o.holder.clone()) {
                (Verdict::Live | Verdict::Stale, Some(holder)) => {
                    if verdict == Verdict::Live || !self.expire(&name, &o, vanished).await {
                        live.push((holder, o.ack.clone()));
                        self.observed.insert(name, o);
                    }
                    // Expired and released: the next read sees the record
                    // we wrote, as a Lease without a holder.
                }
                // Released (or ours under another name): not a member.
                // Deleted once unchanged for the forget-after time, tried
                // again a forget-after time later if it is still there.
                (Verdict::Released, _) | (_, None) => {
                    if !vanished {
                        if unchanged_for >= forget_after
                            && o.forgot
                                .is_none_or(|t| sent.saturating_duration_since(t) >= forget_after)
                        {
                            self.forget(&name, o.seen.version.clone());
                            o.forgot = Some(sent);
                        }
                        self.observed.insert(name, o);
                    }
                }
            }
        }
        let renew_deadline = self.config.renew_deadline();
        let counts_itself = self.renewed.is_some_and(|r| sent < r + renew_deadline);
        Ok(View::read(
            self.me.clone(),
            live,
            counts_itself,
            &self.acks,
            self.renewed,
        ))
    }

    /// Deletes a Lease nobody held or renewed for the forget-after time,
    /// on the condition that it is still the version we saw: a write that
    /// came in between wins. Every member may try; one succeeds. It runs on
    /// a task of its own, so it never holds up a round (and with it the
    /// renewals).
    fn forget(&self, name: &str, version: Option<String>) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: version,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let api = self.api.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            match api.delete(&name, &params).await {
                Ok(_) => tracing::info!(lease = %name, "deleted a shard lease nobody held"),
                Err(error) => {
                    tracing::debug!(%error, lease = %name, "did not delete a stale shard lease");
                }
            }
        });
    }

    async fn run(mut self) {
        let retry = self.config.retry_period();
        let renew_deadline = self.config.renew_deadline();
        loop {
            let sent = Instant::now();
            let wake = sent + retry;
            // Neither step may run past the time we could act for; a hung
            // request must not hold up the next round.
            let limit = sent + renew_deadline;
            match timeout_at(limit, self.renew()).await {
                Ok(Ok(())) => self.renewed = Some(sent),
                Ok(Err(error)) => {
                    // A conflict means our copy was stale: read it afresh.
                    self.own = None;
                    if is_conflict(&error) {
                        tracing::debug!("the shard lease changed under a renewal");
                    } else {
                        tracing::debug!(%error, "could not renew the shard lease");
                    }
                }
                Err(_) => {
                    self.own = None;
                    tracing::debug!("renewing the shard lease timed out");
                }
            }
            // Read only after the renewal: others' acknowledgements must
            // be read after ours was written (see the module docs).
            match timeout_at(limit, self.read()).await {
                Ok(Ok(view)) => {
                    tracing::trace!(members = ?view.members, "shard view");
                    self.tx.send_replace(Arc::new(view));
                }
                Ok(Err(error)) => tracing::debug!(%error, "could not read the shard group"),
                Err(_) => tracing::debug!("reading the shard group timed out"),
            }
            // Next round at the retry period, or at once when the
            // controller declares a new set to acknowledge.
            let mut declared = self.declared.clone();
            let tick = std::pin::pin!(sleep_until(wake));
            let changed = std::pin::pin!(declared.changed());
            if let future::Either::Right((Err(_), _)) = future::select(tick, changed).await {
                // The controller is gone.
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ring::key_hash;
    use super::*;

    fn view(me: &str, members: &[&str], acked: &[&[&str]], others: &[(&str, &[&str])]) -> View {
        View {
            me: me.into(),
            members: Members::new(members.iter().copied()),
            acked: acked
                .iter()
                .map(|a| Members::new(a.iter().copied()))
                .collect(),
            others: others
                .iter()
                .map(|(id, a)| ((*id).into(), Members::new(a.iter().copied())))
                .collect(),
            renewed: Some(Instant::now()),
            declared: 0,
        }
    }

    /// A key `members` gives to `to`.
    fn key_of(to: &str, members: &[&str]) -> u64 {
        let members = Members::new(members.iter().copied());
        (0..)
            .map(|i| key_hash(&format!("default/cm-{i}")))
            .find(|&k| members.gives(k, to))
            .unwrap()
    }

    #[test]
    fn a_settled_group_clears_each_owner_s_keys() {
        let all: &[&str] = &["a", "b", "c"];
        let k = key_of("a", all);
        let a = view("a", all, &[all], &[("b", all), ("c", all)]);
        assert!(a.owns(k) && a.cleared(k));
        let b = view("b", all, &[all], &[("a", all), ("c", all)]);
        assert!(!b.owns(k) && !b.cleared(k));
    }

    #[test]
    fn a_gained_key_waits_for_the_previous_owner_s_acknowledgement() {
        let before: &[&str] = &["a", "b"];
        let after: &[&str] = &["a", "b", "c"];
        // A key that moves from a to c when c joins.
        let k = (0..)
            .map(|i| key_hash(&format!("default/cm-{i}")))
            .find(|&k| {
                Members::new(before.iter().copied()).gives(k, "a")
                    && Members::new(after.iter().copied()).gives(k, "c")
            })
            .unwrap();
        // a has not acknowledged the join yet: c waits.
        let c = view("c", after, &[after], &[("a", before), ("b", before)]);
        assert!(c.owns(k) && !c.cleared(k));
        // Once a acknowledged, c may start it (b's old set gives it to a,
        // not to b, so b is no obstacle).
        let c = view("c", after, &[after], &[("a", after), ("b", before)]);
        assert!(c.cleared(k));
        // And a, still seeing the old set, may not start it once it read
        // c's acknowledgement.
        let a = view("a", before, &[before], &[("b", before), ("c", after)]);
        assert!(a.owns(k) && !a.cleared(k));
    }

    #[test]
    fn an_unconfirmed_acknowledgement_counts_as_written() {
        let two: &[&str] = &["a", "b"];
        let one: &[&str] = &["a"];
        let k = key_of("b", two);
        // a wrote "a alone" (it would own k) but the answer was lost, and
        // it sees b again: it may not start k on the strength of "a
        // alone", nor of the view.
        let a = view("a", one, &[two, one], &[]);
        assert!(a.owns(k));
        assert!(!a.cleared(k));
        // Nothing acknowledged yet (a new replica) clears nothing.
        let fresh = view("a", one, &[&[]], &[]);
        assert!(!fresh.cleared(k));
    }
}
