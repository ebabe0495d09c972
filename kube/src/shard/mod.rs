//! Shards across replicas on `coordination.k8s.io/v1` Leases (feature
//! `kube`): every replica reconciles its own share of the keys, and a key
//! moves between replicas only through a hand-over both sides agreed to.
//!
//! Give each replica's [`Controller`](crate::Controller)
//! [`shards`](crate::Controller::shards) with a [`Shards`] of the same
//! group. Every replica watches every object and keeps its store warm (so a
//! gained key needs no re-list), but queues and reconciles only its own.
//! Several controllers of one process share one membership through
//! [`Manager::shards`](crate::Manager::shards): one Lease per replica, whose
//! acknowledgement speaks for every controller (see below).
//!
//! # Membership
//!
//! Each replica holds a Lease of its own, `{group}-{identity}`, labelled
//! [`GROUP_LABEL`]`={group}`, and renews it every retry period, as a leader
//! renews its lease. The **members** are the group's Leases with a holder
//! whose record (its `resourceVersion`) changed within a lease duration,
//! measured, as for leader election, on the reading replica's own
//! monotonic clock since it last saw the record change; no `renewTime` is
//! ever compared with a clock, so clock skew changes nothing. A key belongs
//! to one member by rendezvous hashing ([`owner`]): when a member joins or
//! leaves, only about 1/n of the keys move.
//!
//! A member leaves in one of two ways, each a write to its Lease:
//!
//! * it **releases** its Lease when its controller stream ends (holder and
//!   acknowledgement cleared), and the others take its keys at their next
//!   read;
//! * or a reader that saw its Lease unchanged for a lease duration
//!   **expires** it: writes it as released with the `resourceVersion` it
//!   saw as a precondition. Only once that write succeeded is the member
//!   left out. A renewal that landed after the read makes the write fail
//!   (the member stays), and one that lands after it fails, so no member
//!   goes on acting on a renewal nobody saw.
//!
//! Renewals are merge patches carrying the `resourceVersion` read, so a
//! late one fails rather than overwrite a newer record, and never brings
//! back a deleted Lease (an update, `PUT`, of a missing Lease creates it on
//! kube-apiserver). A Lease that vanishes while it has a holder (someone
//! deleted it) stays a member, with its last acknowledgement, until it
//! expires as above (then a released Lease is created in its place). The
//! others delete a released Lease once unchanged for
//! [`ShardConfig::forget_after`].
//!
//! # Hand-over
//!
//! Views of the membership differ between replicas for a moment after a
//! change, so owning a key is not enough to start it. Each replica writes
//! on its own Lease, under [`ACK_ANNOTATION`], the member set it
//! **acknowledges**: a promise that it runs no key that set gives to
//! someone else. It acknowledges a new view only once nothing it loses in
//! that view is in flight. A replica starts key `k` only when
//!
//! 1. it owns `k` in its current view, and in every set it acknowledged
//!    that may still be on its Lease (a write whose answer was lost counts
//!    as written; a set declared but not yet written holds keys back until
//!    a read after its write), and
//! 2. every other live member's acknowledgement gives `k` to someone other
//!    than that member, read **after** our own acknowledgement was written.
//!
//! Two replicas cannot both pass: each writes its acknowledgement, then
//! reads the other's, so the later reader sees the earlier writer's claim
//! (the API server's reads are linearizable: a list without a
//! `resourceVersion` reads from etcd by quorum). A replica whose Lease
//! expired is not a member and its acknowledgement is ignored: it fenced
//! itself before that (below). So a gained key starts only after its
//! previous owner acknowledged the new membership with nothing of the key
//! in flight, or after the previous owner's Lease expired unrenewed.
//!
//! When several controllers share the membership (a manager's), "nothing
//! it loses in flight" must hold for each: every controller declares the
//! set it is ready for, and the replica acknowledges a set only once all
//! of them declared it. A controller's readiness is withdrawn the moment
//! it adopts a view with other members, before it hands anything out
//! under them, and a controller that stops with reconciles in flight
//! holds every later acknowledgement back (safe; its manager reports it
//! dead).
//!
//! Keys gained in a hand-over are queued at the priority of re-listed
//! objects ([`WatchPriorities::unchanged`], the slow lane by default), so a
//! membership change does not hold up live changes. Triggers for other
//! replicas' keys are dropped, and a key is checked again when the queue
//! hands it out: one no longer owned is dropped (its new owner reconciles
//! it), one owned but not yet cleared waits aside until it is.
//!
//! # Fencing
//!
//! As a leader: a replica that has not renewed its Lease within the renew
//! deadline of its last successful renewal's sending starts nothing, and
//! what it has in flight gets [`ShardConfig::fencing_grace`] to finish
//! before it is cancelled. The fence runs in each reconcile's own task, so
//! it holds even while nobody polls the controller's stream. A key lost in
//! a hand-over gets the same grace (the others wait for this replica's
//! acknowledgement, so that one only delays the hand-over).
//! Cancelled reconciles are reported as
//! [`ControllerError::ReconcileFenced`](crate::ControllerError::ReconcileFenced).
//!
//! # Split caches
//!
//! By default every replica watches every object of the sharded kind and
//! keeps all of them in its store. With
//! [`ShardConfig::split_cache`] a replica's store holds only its own
//! share, so its memory and its watch traffic fall as replicas are added:
//!
//! * every object carries the label [`label_key`]`(group)`, that is
//!   `shard.workqueue.tokio.rs/{group}`, whose value is its owner's
//!   identity. The members elect one of them **coordinator** through a
//!   Lease of its own ([`ShardConfig::coordinator_lease`],
//!   `{group}.coordinator`). The coordinator watches the kind's metadata
//!   only and writes the label (a merge patch of that label alone) on new
//!   objects, objects without it or with a wrong one (a member that left,
//!   a hand edit, a user's own label under that key: the key is this
//!   library's), and on the objects whose owner changes with the
//!   membership, at most as fast as the [`LabelRate`] allows (200 a second
//!   by default), objects without a label first (so a new object does not
//!   wait behind the objects a change of members moves), retrying failures
//!   with a per-object backoff. It writes as field manager
//!   [`LABEL_MANAGER`]. [`Shards::label_patches`] counts the writes a
//!   replica made;
//! * each replica's main watch gets the selector [`selector`]`(config)`
//!   added to the one it was given. An object relabelled away leaves its
//!   store (the API server sends it as deleted), one relabelled to it
//!   enters it (as added) and is queued if the replica owns it by then;
//!   otherwise the hand-over that gives it the key finds it in the store.
//!   The objects in the store, and those the reconciler gets, lack the
//!   `managedFields` entry of [`LABEL_MANAGER`]: it records only the
//!   label, and costs about 2 KB an object in memory.
//!
//! The label decides only which cache an object is in; the hand-over
//! above still decides who may start a key. A label behind the membership
//! (a coordinator slower than the replicas' views, or none alive for a
//! moment) delays the key's reconcile until the object reaches its new
//! owner's cache; it never lets two replicas run one key. A coordinator
//! that dies is replaced when its Lease expires (a lease duration), and
//! objects created meanwhile wait in no cache until the next one labels
//! them. A replica that shuts down gracefully releases the coordinator's
//! Lease before its own, so another member takes over at once; one whose
//! controller stream is dropped leaves it to expire.
//!
//! What a split cache needs: RBAC to `patch` the sharded kind and to
//! `get`, `create` and `update` the coordinator's Lease; identities that are
//! label values (at most 63 characters, which Pod names of Deployments
//! and StatefulSets are); a controller made with
//! [`Controller::new`](crate::Controller::new), whose own watcher it
//! narrows (a controller given its stream reports
//! [`ControllerError::SplitCacheWithoutWatcher`](crate::ControllerError::SplitCacheWithoutWatcher)),
//! or by a [`Manager`](crate::Manager) given the split membership with
//! [`Manager::shards`](crate::Manager::shards): there each controller's
//! main cache is the replica's share, and one coordinator (one Lease, one
//! rate, one queue, objects without a label first whatever their kind)
//! labels the main kinds of all the manager's controllers. An object's
//! owner depends only on its `namespace/name`, so a ConfigMap and a Secret
//! of one name go to the same replica, labelled alike.
//! What stays whole: the caches of `owns` and `watches` (their triggers
//! reach the owner's replica as before, and are dropped elsewhere) unless
//! the reconciler copies its object's label onto the children it makes
//! ([`label_for`]) and selects [`selector`]`(config)` in `owns`, and a
//! manager's [`store`](crate::Manager::store)s, which are whole watches of
//! what they select.
//!
//! # Failure semantics
//!
//! | what happens | result |
//! | --- | --- |
//! | a replica crashes (or its stream is dropped) | the others expire its Lease once they saw it unchanged for a lease duration and take its keys, at most lease duration + 2 retry periods after its last renewal |
//! | a replica is cut off from the API server | it fences by its renew deadline and cancels what it runs within the grace; the others take its keys a lease duration after they saw its last renewal; back online, it renews, rejoins, and gets its keys back by hand-over |
//! | a replica joins | it owns about 1/(n+1) of the keys; each starts once its previous owner acknowledged (after finishing, or cancelling after the grace, what it had of it in flight), a few retry periods |
//! | graceful shutdown (the stream ends) | the replica finishes its reconciles, then releases its Lease; the others take its keys at their next read |
//! | clocks skewed between replicas | no effect (expiry is measured locally) |
//! | the API server is unreachable for everyone | every replica fences; nothing runs until it is back |
//! | a paused process (GC, `SIGSTOP`) | as with leader election: a process paused for longer than lease duration minus renew deadline between its check and its action can act after others took over; keep reconciles idempotent |
//! | two replicas with one identity | they write one Lease and fight over it (409s); identities must be unique (the Pod name) |
//! | someone deletes a member's Lease | it stays a member until it expires; its holder makes a new Lease at its next renewal and joins again |
//! | the coordinator crashes (split cache) | its Lease expires a lease duration after its last renewal and another member takes over; until then new objects and objects changing owner wait outside every cache, and are reconciled once labelled |
//! | Leases of replicas that left | released Leases are deleted by the others once unchanged for [`ShardConfig::forget_after`] (four lease durations by default), with the version they saw as a precondition so a write in between wins; a replica back after that makes a new one |
//!
//! What was verified where: `tests/replicas/shards.rs` runs replicas in one
//! process against this repository's local API server
//! (`kube-local-apiserver`; lease 600 ms, renew deadline 400 ms, retry
//! 100 ms) and checks an independent record of every reconcile through
//! crashes (hand-over about 600 ms), a replica cut off and back (it stops
//! by about 500 ms, before anyone takes over), a replica joining (231 of
//! 1,000 keys moved), a replica cut off while nobody polls its stream, a
//! Lease deleted by hand and clocks 5 s off: these cases only there. With
//! split caches, the same file checks that each store holds exactly its
//! replica's share (against [`owner`]), through a crash of the coordinator
//! and a join, and that a label edited by hand is put back;
//! `tests/on_apiserver/shards.rs` checks the shares through a crash of the
//! coordinator on both servers (about 1.8 s to the survivors' new shares
//! with a 1.5 s lease there).
//! `tests/shard_model.rs` explores the protocol exhaustively at small
//! sizes with a model checker that decides through `shard::protocol`, the
//! functions this module runs, with split caches too (the labels, each
//! replica's cache and the coordinator's writes through
//! `protocol::relabel`). `tests/on_apiserver/shards.rs` runs the split, a crash
//! hand-over and a graceful shutdown on both that server and a real
//! kube-apiserver. The README's "Scale-out across replicas" lists what was
//! run by hand against a real cluster.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::Api;
//! use kube_runtime::watcher;
//! use futures::StreamExt;
//! use tokio_workqueue_kube::{Action, Controller};
//! use tokio_workqueue_kube::shard::{ShardConfig, Shards};
//!
//! # #[derive(Debug)] struct E; impl std::fmt::Display for E { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") } } impl std::error::Error for E {}
//! # async fn example(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let identity = std::env::var("POD_NAME")?;
//! let config = ShardConfig::new("configmap-controller", "default", identity);
//! config.validate()?;
//! Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
//!     .shards(Shards::new(client, config))
//!     .shutdown_on_signal()
//!     .run(
//!         |cm: Arc<ConfigMap>, _ctx: Arc<()>| async move { Ok::<_, E>(Action::await_change()) },
//!         |_, _, _| Action::await_change(),
//!         Arc::new(()),
//!     )
//!     .for_each(|_| async {})
//!     .await;
//! # Ok(())
//! # }
//! ```
//!
//! [`WatchPriorities::unchanged`]: crate::WatchPriorities::unchanged

mod config;
mod coordinator;
mod joint;
mod labels;
mod member;
#[cfg(feature = "prometheus")]
mod metrics;
#[doc(hidden)]
pub mod protocol;
mod ring;
mod seen_watch;

pub use config::{LabelRate, ShardConfig};
pub(crate) use coordinator::{Coordinating, Coordinator, Kind};
pub(crate) use joint::{Joint, Slot};
pub use labels::{LABEL_MANAGER, LABEL_PREFIX, label_for, label_key, selector};
pub(crate) use labels::{forget_label_manager, narrow};
pub use member::Shards;
pub(crate) use member::{Member, SharedMembership};
#[cfg(feature = "prometheus")]
pub use metrics::ShardMetrics;
pub(crate) use protocol::{Declared, HandOut, View};
pub use ring::owner;
pub(crate) use ring::{Members, object_hash};

/// The label on every Lease of a shard group; its value is the group.
pub const GROUP_LABEL: &str = "workqueue.tokio.rs/shard-group";

/// The annotation on a member's Lease holding the member set it
/// acknowledges, identities comma-separated.
pub const ACK_ANNOTATION: &str = "workqueue.tokio.rs/acknowledged-members";
