//! One acknowledgement for several controllers: what a replica writes on
//! its Lease when the controllers of a [`Manager`](crate::Manager) share
//! one shard membership.
//!
//! A replica's acknowledgement promises that it runs no key the set gives
//! to someone else. With one controller, that controller makes the promise
//! when nothing it loses is in flight ([`View::declaration`]). With several
//! on one Lease, the promise is the replica's, so it holds only when every
//! controller can make it: each controller has a [`Slot`] saying the set
//! it is ready to acknowledge, and the joint declares a set (numbered, as
//! one controller's declarations are) only when every slot names that set.
//!
//! A slot is emptied the moment its controller adopts a view with other
//! members, before anything is handed out under it: a controller whose
//! members moved on may start keys the older set takes away, so its
//! readiness for that set no longer holds. A controller readies its slot again once nothing it loses
//! in its new view is in flight. With one slot, the joint declares exactly
//! what that controller declares, so a lone controller behaves as it did
//! before the joint existed.
//!
//! # Why one controller's argument still holds
//!
//! The model check (`tests/shard_model.rs`) explores the protocol with a
//! joint of two controllers per replica too (each taking views in steps of
//! its own), and finds a key on two replicas at once if the joint declares
//! what one controller alone is ready for. The argument, for any number of
//! controllers: a joint adds no case of its own, because each controller
//! keeps the invariant the single-controller protocol rests on:
//! *whenever the replica's latest declaration is `S`, the controller runs
//! nothing that `S` gives to someone else.*
//!
//! - When the joint declares `S`, every slot names `S`: each controller
//!   readied it with nothing in flight that `S` takes away, and its view's
//!   members have been `S` since (a change of members empties the slot).
//! - After that, a controller starts a key only if its view owns it **and**
//!   the latest declaration gives it to this replica
//!   ([`View::may_start`](super::View::may_start)); a key `S` gives to
//!   someone else therefore never starts while `S` is the latest, whatever
//!   view the controller has moved on to.
//!
//! With one controller the joint declares the moment the controller is
//! ready, as before; with several, later, when the last one is ready, and
//! by then the first ones' readiness still holds by the two points above.
//! The replica's acknowledgement of `S` therefore speaks for every
//! controller, and the rest of the argument (write, then read the others'
//! acknowledgements) is the single-controller one.
//!
//! A slot dropped with keys still in flight stays behind, empty: the joint
//! then declares nothing more, which is safe (no gained key starts anywhere
//! before its owner here acknowledges) and visible (the manager's health
//! reports the controller that died). A slot dropped with nothing in flight
//! leaves.
//!
//! [`View::declaration`]: super::View::declaration

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::protocol::Declared;
use super::ring::Members;

/// The declarations of every controller on one membership; see the
/// [module docs](self).
pub(crate) struct Joint {
    /// Each slot's set, `None` when it is not ready; `None` slots of the
    /// vector are free.
    slots: Mutex<Vec<Option<Option<Members>>>>,
    declared: watch::Sender<Declared>,
    /// Whether several controllers share it (a manager's), so that a slot
    /// left with keys in flight holds the others back.
    shared: bool,
}

impl Joint {
    /// A joint with no slot yet: it declares nothing until one joins.
    /// `shared`: a manager's, for several controllers.
    pub(crate) fn new(shared: bool) -> Arc<Self> {
        Arc::new(Joint {
            slots: Mutex::new(Vec::new()),
            declared: watch::Sender::new((0, Members::default())),
            shared,
        })
    }

    /// The latest declaration, as it changes: what the membership writes
    /// on the Lease, and what a controller hands keys out by.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Declared> {
        self.declared.subscribe()
    }

    /// A slot for one more controller, not ready for anything yet.
    pub(crate) fn join(self: &Arc<Self>) -> Slot {
        let mut slots = self.slots.lock();
        let index = match slots.iter().position(Option::is_none) {
            Some(free) => {
                slots[free] = Some(None);
                free
            }
            None => {
                slots.push(Some(None));
                slots.len() - 1
            }
        };
        Slot {
            joint: self.clone(),
            index,
            in_flight: false,
        }
    }

    /// Declares the set every slot is ready for, if they agree on one that
    /// is not declared yet. Called with the slots locked, so two settles
    /// cannot interleave their reads and their declaration.
    fn settle(&self, slots: &[Option<Option<Members>>]) {
        let mut taken = slots.iter().flatten();
        let Some(Some(first)) = taken.next() else {
            return;
        };
        if !taken.all(|slot| slot.as_ref() == Some(first)) {
            return;
        }
        self.declared.send_if_modified(|(number, set)| {
            if set == first {
                return false;
            }
            *number += 1;
            *set = first.clone();
            true
        });
    }
}

/// One controller's part in a [`Joint`]: the set it is ready to
/// acknowledge. It leaves the joint when dropped (see the module docs for
/// a slot dropped with keys in flight).
pub(crate) struct Slot {
    joint: Arc<Joint>,
    index: usize,
    /// Whether the controller had keys in flight when last told.
    in_flight: bool,
}

impl Slot {
    /// The controller adopted a new view: it is ready for nothing until
    /// it says so again.
    pub(crate) fn withdraw(&mut self) {
        let mut slots = self.joint.slots.lock();
        slots[self.index] = Some(None);
    }

    /// The controller is ready to acknowledge `set`: nothing it loses
    /// under it is in flight, and it starts only keys `set` gives it.
    pub(crate) fn ready(&mut self, set: Members) {
        let mut slots = self.joint.slots.lock();
        slots[self.index] = Some(Some(set));
        self.joint.settle(&slots);
    }

    /// Whether the controller has keys in flight, for the case it drops
    /// the slot without ending them.
    pub(crate) fn set_in_flight(&mut self, in_flight: bool) {
        self.in_flight = in_flight;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = self.joint.slots.lock();
        if self.in_flight {
            // Only a shared joint holds others back; a lone controller's
            // membership went with it.
            if self.joint.shared {
                tracing::error!(
                    "a sharded controller stopped with reconciles in flight; this replica \
                     acknowledges no new shard membership until it restarts"
                );
            }
            slots[self.index] = Some(None);
            return;
        }
        slots[self.index] = None;
        self.joint.settle(&slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(joint: &Joint) -> Declared {
        joint.subscribe().borrow().clone()
    }

    fn set(ids: &[&str]) -> Members {
        ids.iter().map(|id| Arc::<str>::from(*id)).collect()
    }

    #[test]
    fn one_slot_declares_what_it_is_ready_for() {
        let joint = Joint::new(true);
        let mut slot = joint.join();
        assert_eq!(declared(&joint).0, 0);
        slot.ready(set(&["a"]));
        assert_eq!(declared(&joint), (1, set(&["a"])));
        // Ready again for the same set: nothing new.
        slot.withdraw();
        slot.ready(set(&["a"]));
        assert_eq!(declared(&joint), (1, set(&["a"])));
        slot.ready(set(&["a", "b"]));
        assert_eq!(declared(&joint), (2, set(&["a", "b"])));
    }

    #[test]
    fn several_slots_declare_only_a_set_they_all_are_ready_for() {
        let joint = Joint::new(true);
        let mut first = joint.join();
        let mut second = joint.join();
        first.ready(set(&["a", "b"]));
        assert_eq!(declared(&joint).0, 0, "the second is not ready yet");
        second.ready(set(&["a"]));
        assert_eq!(declared(&joint).0, 0, "they disagree");
        second.ready(set(&["a", "b"]));
        assert_eq!(declared(&joint), (1, set(&["a", "b"])));
        // A new view: the first withdraws, so the second's readiness for a
        // newer set does not declare it alone.
        first.withdraw();
        second.ready(set(&["a", "b", "c"]));
        assert_eq!(declared(&joint).0, 1);
        first.ready(set(&["a", "b", "c"]));
        assert_eq!(declared(&joint), (2, set(&["a", "b", "c"])));
    }

    #[test]
    fn a_slot_that_leaves_with_nothing_in_flight_no_longer_holds_the_others_back() {
        let joint = Joint::new(true);
        let mut first = joint.join();
        let second = joint.join();
        first.ready(set(&["a"]));
        assert_eq!(declared(&joint).0, 0);
        drop(second);
        assert_eq!(declared(&joint), (1, set(&["a"])));
        // Its place is reused.
        let mut third = joint.join();
        first.ready(set(&["a", "b"]));
        assert_eq!(declared(&joint).0, 1);
        third.ready(set(&["a", "b"]));
        assert_eq!(declared(&joint).0, 2);
    }

    #[test]
    fn a_slot_dropped_with_keys_in_flight_holds_every_later_declaration_back() {
        let joint = Joint::new(true);
        let mut first = joint.join();
        let mut second = joint.join();
        second.set_in_flight(true);
        drop(second);
        first.ready(set(&["a"]));
        assert_eq!(declared(&joint).0, 0);
    }

    #[test]
    fn an_empty_joint_declares_nothing() {
        let joint = Joint::new(true);
        drop(joint.join());
        assert_eq!(declared(&joint), (0, Members::default()));
    }
}
