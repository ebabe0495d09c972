//! The hand-over rules of shards as pure functions, apart from the Lease
//! requests and the clocks: what a read makes of the group's Leases, what
//! may be on a replica's own Lease, when a view may be acknowledged, and
//! whether a key may start.
//!
//! The membership task (`member.rs`) and the controller
//! (`controller/sharding.rs`) decide through these and nothing else;
//! `tests/shard_model.rs` explores the protocol exhaustively by calling the
//! same functions, so the model check and the code cannot drift apart.
//! They are generic over the member set ([`Assignment`]): the crate uses
//! [`Members`] (rendezvous hashing of identities), the model a small bit
//! set whose owners come from that same hashing.
//!
//! Not a stable API: hidden from the documentation, public only for the
//! model check.

use std::borrow::Borrow;
use std::sync::Arc;

use tokio::time::Instant;

pub use super::ring::Members;

/// A member set as the hand-over rules see it: who it gives a key to.
pub trait Assignment {
    /// A key as the set scores it (the crate: the key's hash).
    type Key: Copy;
    /// A member's identity (the crate: `str`).
    type Id: ?Sized + PartialEq;

    /// The member this set gives `key` to (`None`: the set is empty).
    fn owner(&self, key: Self::Key) -> Option<&Self::Id>;

    /// Whether this set gives `key` to `id`.
    fn gives(&self, key: Self::Key, id: &Self::Id) -> bool {
        self.owner(key) == Some(id)
    }
}

impl Assignment for Members {
    type Key = u64;
    type Id = str;

    fn owner(&self, key: u64) -> Option<&str> {
        Members::owner(self, key)
    }
}

/// With split caches, what the coordinator writes on an object whose
/// shard label is `current`: its owner under `members`, or `None` if the
/// label names it already or the set is empty. Any other value (a member
/// that left, an edit by hand, a user's own label under the key) is
/// overwritten.
///
/// The label decides only which replica's cache holds the object; whether
/// a replica may start a key is still [`View::may_start`]'s alone.
pub fn relabel<'m, S: Assignment>(
    members: &'m S,
    key: S::Key,
    current: Option<&S::Id>,
) -> Option<&'m S::Id> {
    let owner = members.owner(key)?;
    (current != Some(owner)).then_some(owner)
}

/// A member set this replica is ready to acknowledge, numbered from 1 in
/// the order it was declared (0: nothing declared yet).
pub type Declared<S = Members> = (u64, S);

/// What this replica knows of its group after one round of renewing its
/// Lease and reading the group's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View<S = Members, I = Arc<str>> {
    /// This replica.
    pub me: I,
    /// The live members: those whose Lease record changed within a lease
    /// duration by our clock, and this replica once it has renewed.
    pub members: S,
    /// Every acknowledgement that may be on this replica's Lease: the one
    /// last written, and any whose write was sent but not confirmed.
    pub acked: Vec<S>,
    /// The acknowledgement on each other live member's Lease, read after
    /// every write in `acked` was sent.
    pub others: Vec<(I, S)>,
    /// When the last successful renewal was sent: this replica may act
    /// until a renew deadline after it.
    pub renewed: Option<Instant>,
    /// The number of the last declaration sent before the read: `acked`
    /// covers every declaration up to it.
    pub declared: u64,
}

/// What becomes of a key the queue hands out (or one parked, when a view
/// arrives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandOut {
    /// Reconcile it.
    Start,
    /// Another replica owns it now: drop it.
    NotOurs,
    /// Ours, but not cleared yet: it waits aside.
    Parked,
}

impl<S: Default, I> View<S, I> {
    /// Before the first round: no members, nothing acknowledged.
    pub fn unknown(me: I) -> Self {
        View {
            me,
            members: S::default(),
            acked: vec![S::default()],
            others: Vec::new(),
            renewed: None,
            declared: 0,
        }
    }
}

impl<S: Clone, I: Clone> View<S, I> {
    /// The view a read makes: `live` are the other members with the
    /// acknowledgement on each one's Lease (see [`judge`]); this replica is
    /// a member too when `counts_itself` (its last renewal was sent within
    /// a renew deadline of the read); `acks` is what may be on its own
    /// Lease.
    pub fn read(
        me: I,
        live: Vec<(I, S)>,
        counts_itself: bool,
        acks: &AckLog<S>,
        renewed: Option<Instant>,
    ) -> Self
    where
        S: FromIterator<I>,
    {
        let members = live
            .iter()
            .map(|(id, _)| id.clone())
            .chain(counts_itself.then(|| me.clone()))
            .collect();
        View {
            me,
            members,
            acked: acks.acked().to_vec(),
            others: live,
            renewed,
            declared: acks.sent(),
        }
    }
}

impl<S, I> View<S, I>
where
    S: Assignment,
    I: Borrow<S::Id>,
{
    /// Whether `key` is this replica's to queue.
    pub fn owns(&self, key: S::Key) -> bool {
        self.members.gives(key, self.me.borrow())
    }

    /// Whether `key` is this replica's in this view but was not under
    /// `old`: gained in a hand-over.
    pub fn gained(&self, old: &S, key: S::Key) -> bool {
        self.owns(key) && !old.gives(key, self.me.borrow())
    }

    /// Whether nobody else may run `key` now and this replica has said it
    /// may: every acknowledgement that may be on our Lease gives it to us,
    /// and no other live member's gives it to that member. (Whether we are
    /// fenced, and what we declared but have not written, are
    /// [`may_start`](Self::may_start)'s.)
    pub fn cleared(&self, key: S::Key) -> bool {
        self.owns(key)
            && self.acked.iter().all(|a| a.gives(key, self.me.borrow()))
            && self.others.iter().all(|(id, a)| !a.gives(key, id.borrow()))
    }

    /// Whether `key` may start now: `fresh` (not fenced, and the view's
    /// renewal still within the renew deadline by the caller's clock), the
    /// view has seen every declaration sent (so its acknowledgements cover
    /// all that may be on our Lease), the latest declaration `declared`
    /// gives it to us, and the view clears it.
    pub fn may_start(&self, declared: &Declared<S>, fresh: bool, key: S::Key) -> bool {
        fresh
            && self.declared == declared.0
            && declared.1.gives(key, self.me.borrow())
            && self.cleared(key)
    }

    /// What to do with `key` when the queue hands it out, or when a view
    /// arrives while it is parked.
    pub fn hand_out(&self, declared: &Declared<S>, fresh: bool, key: S::Key) -> HandOut {
        if !self.owns(key) {
            HandOut::NotOurs
        } else if self.may_start(declared, fresh, key) {
            HandOut::Start
        } else {
            HandOut::Parked
        }
    }

    /// The next declaration, after `declared`: this view's members, once
    /// nothing they take from this replica is `running`. `None` when the
    /// members are declared already, or a key they take away is still in
    /// flight.
    pub fn declaration(
        &self,
        declared: &Declared<S>,
        running: impl IntoIterator<Item = S::Key>,
    ) -> Option<Declared<S>>
    where
        S: Clone + PartialEq,
    {
        // Settled (the usual case): nothing to look through.
        if declared.1 == self.members {
            return None;
        }
        if running.into_iter().all(|k| self.owns(k)) {
            Some((declared.0 + 1, self.members.clone()))
        } else {
            None
        }
    }
}

/// What a read makes of another Lease of the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Held by another replica and changed within a lease duration: a
    /// member, with the acknowledgement on it.
    Live,
    /// Held by another replica but unchanged for a lease duration: the
    /// reader writes it as released at the version it saw, and the holder
    /// is a member still only if that write fails.
    Stale,
    /// Released (no holder, or ours under another name): not a member.
    Released,
}

/// A reader's [`Verdict`] on a Lease held by another replica or not
/// (`held_by_another`), whose record it has seen unchanged for a lease
/// duration or not (by its own clock, up to when it sent the read).
pub fn judge(held_by_another: bool, unchanged_for_a_lease_duration: bool) -> Verdict {
    match (held_by_another, unchanged_for_a_lease_duration) {
        (false, _) => Verdict::Released,
        (true, false) => Verdict::Live,
        (true, true) => Verdict::Stale,
    }
}

/// What may be on this replica's own Lease: every acknowledgement whose
/// write was sent and not confirmed, besides the last one confirmed, and
/// the number of the last declaration sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AckLog<S = Members> {
    sent: u64,
    acked: Vec<S>,
}

impl<S: Default> Default for AckLog<S> {
    /// Nothing written yet: the empty set, which gives nobody anything.
    fn default() -> Self {
        AckLog {
            sent: 0,
            acked: vec![S::default()],
        }
    }
}

impl<S> AckLog<S> {
    /// The number of the last declaration sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Every acknowledgement that may be on the Lease.
    pub fn acked(&self) -> &[S] {
        &self.acked
    }
}

impl<S: Clone + PartialEq> AckLog<S> {
    /// A renewal sends `declared`: from now on its set may be on the
    /// Lease, whatever becomes of the write (an answer lost on the way
    /// counts as written).
    pub fn sending(&mut self, declared: &Declared<S>) {
        if !self.acked.contains(&declared.1) {
            self.acked.push(declared.1.clone());
        }
        self.sent = declared.0;
    }

    /// The renewal that sent `set` was written: the Lease holds `set`
    /// alone. (Every write carries the resourceVersion it read, so one
    /// still on the wire from before fails rather than land after it.)
    pub fn written(&mut self, set: S) {
        self.acked = vec![set];
    }
}
