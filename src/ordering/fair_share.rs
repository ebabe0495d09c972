//! Fair share across tenants: round-robin within each priority level.
//!
//! Each priority level keeps a ring of its tenants that have keys ready, and
//! a cursor on the tenant whose turn it is. A tenant is a group of keys
//! (FIFO, linked through the keys' slots); with sub-groups, a tenant is
//! instead a ring of its sub-groups, each a FIFO of keys, served in turn.
//! A group is made when its first key arrives and forgotten when its last
//! one leaves, so a tenant with nothing queued is in no ring and no map.
//!
//! The per-key cost is the 12-byte entry in the key's slot (links and its
//! group), which fits in room the slot has anyway; the per-tenant cost is
//! one group record and one map entry while the tenant has keys ready.

use std::fmt;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::sync::Arc;

use hashbrown::HashMap;

use super::list::{Links, List, NIL, linked_through_field};
use super::{Handle, MAX_IDLE_LEVELS, Ordering, Queued};

/// A function from a key to one of its groups (tenant or sub-group).
type GroupFn<K, G> = Arc<dyn Fn(&K) -> G + Send + Sync>;

/// Within a priority level, keys are handed out round-robin across tenants,
/// FIFO within a tenant; higher priorities still go first.
///
/// A tenant is what `tenant(&key)` returns: for Kubernetes objects, their
/// namespace. When one tenant floods the queue, a key of another tenant
/// waits for at most one turn of every tenant that has keys ready at its
/// priority, not for the whole flood. This is controller-runtime's proposed
/// fairness (kubernetes-sigs/controller-runtime#3261), here with weights:
///
/// - [`weight`](Self::weight): a tenant of weight `w` gets up to `w` keys
///   handed out per turn (1 by default).
/// - [`then_by`](Self::then_by): a hierarchy. Within a tenant's turn, its
///   sub-groups (say, the namespaces of one cluster, when the tenant is the
///   cluster) take turns too, each FIFO.
///
/// A new tenant joins at the back of the round. A ready key added again
/// keeps its place unless its priority rises; then it moves to the back of
/// its tenant's keys at the new priority.
///
/// Cost: the tenant function runs under the queue's lock once per key made
/// ready (and per raise), and each push looks the tenant up in a hash map.
/// Nothing is kept per key beyond the slot every key has.
///
/// ```
/// use tokio_workqueue::{FairShare, WorkQueue};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Keys are "namespace/name"; the tenant is the namespace.
/// let queue = WorkQueue::builder()
///     .ordering(FairShare::new(|key: &String| {
///         key.split_once('/').map_or("", |(ns, _)| ns).to_string()
///     }))
///     .build();
/// for i in 0..1000 {
///     queue.add(format!("flood/{i}")).unwrap();
/// }
/// queue.add("quiet/one".to_string()).unwrap();
/// assert_eq!(queue.get().await.unwrap().key(), "flood/0");
/// assert_eq!(queue.get().await.unwrap().key(), "quiet/one"); // not 1000th
/// # }
/// ```
pub struct FairShare<K, T, S = ()> {
    tenant_of: GroupFn<K, T>,
    group_of: Option<GroupFn<K, S>>,
    weights: HashMap<T, u32>,
    /// Highest priority first.
    levels: Vec<Level>,
    /// Tenants and sub-groups, reused through a free list (linked by `next`).
    groups: Vec<Group<T, S>>,
    free: u32,
    /// The tenants with keys ready, by level and tenant.
    tenants: HashMap<(i32, T), u32>,
    /// The sub-groups with keys ready, by tenant group and sub-group.
    subgroups: HashMap<(u32, S), u32>,
    len: usize,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    priority: i32,
    /// The tenant whose turn it is (NIL when the level is empty); the ring
    /// of the level's tenants runs through it.
    cursor: u32,
    len: usize,
}

#[derive(Debug, Clone)]
struct Group<T, S> {
    /// The tenant of a sub-group; NIL for a tenant.
    parent: u32,
    /// Neighbours in its ring: its level's tenants, or its tenant's
    /// sub-groups.
    prev: u32,
    next: u32,
    /// A tenant with sub-groups: the sub-group whose turn it is.
    cursor: u32,
    /// A tenant without sub-groups, or a sub-group: its keys.
    keys: List,
    /// Keys ready beneath it.
    len: usize,
    /// A tenant: keys per turn, and keys taken in the current turn.
    weight: u32,
    served: u32,
    /// A tenant: its priority level.
    priority: i32,
    /// What it is found under, to forget it when it empties.
    name: Name<T, S>,
}

#[derive(Debug, Clone)]
enum Name<T, S> {
    Free,
    Tenant(T),
    Sub(S),
}

/// A ready key's place in a [`FairShare`]: its links in its group's list,
/// and its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShareEntry {
    links: Links,
    group: u32,
}

impl Default for FairShareEntry {
    fn default() -> Self {
        FairShareEntry {
            links: Links::default(),
            group: NIL,
        }
    }
}

linked_through_field!(FairShareEntry);

impl<K, T> FairShare<K, T>
where
    T: Hash + Eq + Clone + Send + 'static,
{
    /// Fair share across the tenants `tenant(&key)` returns, all of weight 1.
    ///
    /// The function runs under the queue's lock whenever a key becomes
    /// ready: keep it quick, and it must not panic (like every
    /// [`Ordering`]). A key's tenant is worked out each time the key becomes
    /// ready, so it may change from one time to the next.
    pub fn new(tenant: impl Fn(&K) -> T + Send + Sync + 'static) -> Self {
        FairShare {
            tenant_of: Arc::new(tenant),
            group_of: None,
            weights: HashMap::new(),
            levels: Vec::new(),
            groups: Vec::new(),
            free: NIL,
            tenants: HashMap::new(),
            subgroups: HashMap::new(),
            len: 0,
        }
    }

    /// Within each tenant's turn, its keys take turns by `group(&key)` too:
    /// one key of each of the tenant's sub-groups in turn, FIFO within a
    /// sub-group. For example the tenant is a cluster and the sub-group a
    /// namespace, so a busy cluster does not starve the others, and within
    /// a cluster a busy namespace does not starve its neighbours.
    pub fn then_by<S>(self, group: impl Fn(&K) -> S + Send + Sync + 'static) -> FairShare<K, T, S>
    where
        S: Hash + Eq + Clone + Send + 'static,
    {
        FairShare {
            tenant_of: self.tenant_of,
            group_of: Some(Arc::new(group)),
            weights: self.weights,
            levels: Vec::new(),
            groups: Vec::new(),
            free: NIL,
            tenants: HashMap::new(),
            subgroups: HashMap::new(),
            len: 0,
        }
    }
}

impl<K, T, S> FairShare<K, T, S>
where
    T: Hash + Eq + Clone + Send + 'static,
    S: Hash + Eq + Clone + Send + 'static,
{
    /// Gives `tenant` up to `weight` hand-outs per turn instead of one.
    pub fn weight(mut self, tenant: T, weight: NonZeroU32) -> Self {
        self.weights.insert(tenant, weight.get());
        self
    }

    fn level_index(&mut self, priority: i32) -> usize {
        match self.levels.iter().position(|l| l.priority <= priority) {
            Some(i) if self.levels[i].priority == priority => i,
            found => {
                if self.levels.len() >= MAX_IDLE_LEVELS && self.levels.iter().any(|l| l.len == 0) {
                    self.levels.retain(|l| l.len > 0);
                    return self.level_index(priority);
                }
                let i = found.unwrap_or(self.levels.len());
                self.levels.insert(
                    i,
                    Level {
                        priority,
                        cursor: NIL,
                        len: 0,
                    },
                );
                i
            }
        }
    }

    /// A fresh group record.
    fn alloc(&mut self, group: Group<T, S>) -> u32 {
        if self.free != NIL {
            let g = self.free;
            self.free = self.groups[g as usize].next;
            self.groups[g as usize] = group;
            return g;
        }
        let g = u32::try_from(self.groups.len())
            .ok()
            .filter(|&g| g != NIL)
            .expect("more than u32::MAX - 1 groups");
        self.groups.push(group);
        g
    }

    /// Forgets an emptied group, already out of its ring.
    fn release(&mut self, g: u32) {
        let group = &mut self.groups[g as usize];
        match std::mem::replace(&mut group.name, Name::Free) {
            Name::Tenant(t) => {
                self.tenants.remove(&(group.priority, t));
            }
            Name::Sub(s) => {
                self.subgroups.remove(&(group.parent, s));
            }
            Name::Free => unreachable!("releasing a free group"),
        }
        group.next = self.free;
        self.free = g;
    }

    /// Links `g` into the ring through `cursor`, just before it: the back of
    /// the round. Returns the ring's cursor.
    fn ring_insert(&mut self, cursor: u32, g: u32) -> u32 {
        if cursor == NIL {
            let group = &mut self.groups[g as usize];
            group.prev = g;
            group.next = g;
            return g;
        }
        let prev = self.groups[cursor as usize].prev;
        self.groups[g as usize].prev = prev;
        self.groups[g as usize].next = cursor;
        self.groups[prev as usize].next = g;
        self.groups[cursor as usize].prev = g;
        cursor
    }

    /// Takes `g` out of the ring through `cursor`; returns the ring's new
    /// cursor (the next group, if `g` had the turn).
    fn ring_remove(&mut self, cursor: u32, g: u32) -> u32 {
        let Group { prev, next, .. } = self.groups[g as usize];
        if next == g {
            return NIL;
        }
        self.groups[prev as usize].next = next;
        self.groups[next as usize].prev = prev;
        if cursor == g { next } else { cursor }
    }

    fn group(parent: u32, weight: u32, priority: i32, name: Name<T, S>) -> Group<T, S> {
        Group {
            parent,
            prev: NIL,
            next: NIL,
            cursor: NIL,
            keys: List::EMPTY,
            len: 0,
            weight,
            served: 0,
            priority,
            name,
        }
    }

    /// The tenant group of `tenant` at level `li`, made (at the back of the
    /// round) if it has no keys there yet.
    fn tenant_group(&mut self, li: usize, tenant: T) -> u32 {
        let priority = self.levels[li].priority;
        let name = (priority, tenant);
        if let Some(&g) = self.tenants.get(&name) {
            return g;
        }
        let weight = self.weights.get(&name.1).copied().unwrap_or(1);
        let group = Self::group(NIL, weight, priority, Name::Tenant(name.1.clone()));
        let g = self.alloc(group);
        self.tenants.insert(name, g);
        let cursor = self.ring_insert(self.levels[li].cursor, g);
        self.levels[li].cursor = cursor;
        g
    }

    /// The sub-group `sub` of tenant group `top`, made (at the back of the
    /// tenant's round) if it has no keys yet.
    fn sub_group(&mut self, top: u32, sub: S) -> u32 {
        let name = (top, sub);
        if let Some(&g) = self.subgroups.get(&name) {
            return g;
        }
        let priority = self.groups[top as usize].priority;
        let g = self.alloc(Self::group(top, 1, priority, Name::Sub(name.1.clone())));
        self.subgroups.insert(name, g);
        let cursor = self.ring_insert(self.groups[top as usize].cursor, g);
        self.groups[top as usize].cursor = cursor;
        g
    }

    /// Bookkeeping after a key left `leaf` (under tenant `top`, at level
    /// `li`): counts, emptied groups forgotten, and on a hand-out (`served`)
    /// the turn moved on.
    fn taken(&mut self, li: usize, top: u32, leaf: u32, served: bool) {
        self.len -= 1;
        self.levels[li].len -= 1;
        if leaf != top {
            self.groups[leaf as usize].len -= 1;
            let mut cursor = self.groups[top as usize].cursor;
            if self.groups[leaf as usize].len == 0 {
                cursor = self.ring_remove(cursor, leaf);
                self.release(leaf);
            } else if served && cursor == leaf {
                cursor = self.groups[leaf as usize].next;
            }
            self.groups[top as usize].cursor = cursor;
        }
        self.groups[top as usize].len -= 1;
        let mut cursor = self.levels[li].cursor;
        if self.groups[top as usize].len == 0 {
            cursor = self.ring_remove(cursor, top);
            self.release(top);
        } else if served {
            let tenant = &mut self.groups[top as usize];
            tenant.served += 1;
            if tenant.served >= tenant.weight {
                tenant.served = 0;
                if cursor == top {
                    cursor = tenant.next;
                }
            }
        }
        self.levels[li].cursor = cursor;
    }

    /// The tenant group a leaf belongs to.
    fn top_of(&self, leaf: u32) -> u32 {
        match self.groups[leaf as usize].parent {
            NIL => leaf,
            parent => parent,
        }
    }

    fn level_of(&self, priority: i32) -> usize {
        self.levels
            .iter()
            .position(|l| l.priority == priority)
            .expect("a tenant without its level")
    }
}

impl<K, T, S> Ordering<K> for FairShare<K, T, S>
where
    K: 'static,
    T: Hash + Eq + Clone + Send + 'static,
    S: Hash + Eq + Clone + Send + 'static,
{
    type Entry = FairShareEntry;

    fn push(&mut self, q: &mut Queued<'_, K, FairShareEntry>, key: Handle, priority: i32) {
        let li = self.level_index(priority);
        let tenant = (self.tenant_of)(q.key(key));
        let top = self.tenant_group(li, tenant);
        let leaf = match &self.group_of {
            Some(group_of) => {
                let sub = group_of(q.key(key));
                let leaf = self.sub_group(top, sub);
                self.groups[leaf as usize].len += 1;
                leaf
            }
            None => top,
        };
        self.groups[leaf as usize].keys.push_back(q, key);
        q.entry_mut(key).group = leaf;
        self.groups[top as usize].len += 1;
        self.levels[li].len += 1;
        self.len += 1;
    }

    fn pop(&mut self, q: &mut Queued<'_, K, FairShareEntry>) -> Option<Handle> {
        let li = self.levels.iter().position(|l| l.len > 0)?;
        let top = self.levels[li].cursor;
        let leaf = match self.group_of {
            Some(_) => self.groups[top as usize].cursor,
            None => top,
        };
        let key = self.groups[leaf as usize].keys.pop_front(q)?;
        self.taken(li, top, leaf, true);
        Some(key)
    }

    fn touch(&mut self, q: &mut Queued<'_, K, FairShareEntry>, key: Handle, was: i32, now: i32) {
        if now > was {
            self.remove(q, key);
            self.push(q, key, now);
        }
    }

    fn remove(&mut self, q: &mut Queued<'_, K, FairShareEntry>, key: Handle) {
        let leaf = q.entry(key).group;
        self.groups[leaf as usize].keys.unlink(q, key);
        let top = self.top_of(leaf);
        let li = self.level_of(self.groups[top as usize].priority);
        self.taken(li, top, leaf, false);
    }

    fn len(&self) -> usize {
        self.len
    }

    fn ready_by_priority(&self) -> Option<Vec<(i32, usize)>> {
        Some(
            self.levels
                .iter()
                .filter(|l| l.len > 0)
                .map(|l| (l.priority, l.len))
                .collect(),
        )
    }

    fn prefetch_next(&self, q: &Queued<'_, K, FairShareEntry>) -> Option<Handle> {
        let level = self.levels.iter().find(|l| l.len > 0)?;
        let mut leaf = level.cursor;
        if self.group_of.is_some() {
            leaf = self.groups[leaf as usize].cursor;
        }
        self.groups[leaf as usize].keys.peek_and_prefetch(q)
    }
}

impl<K, T: Clone, S: Clone> Clone for FairShare<K, T, S> {
    fn clone(&self) -> Self {
        FairShare {
            tenant_of: self.tenant_of.clone(),
            group_of: self.group_of.clone(),
            weights: self.weights.clone(),
            levels: self.levels.clone(),
            groups: self.groups.clone(),
            free: self.free,
            tenants: self.tenants.clone(),
            subgroups: self.subgroups.clone(),
            len: self.len,
        }
    }
}

impl<K, T, S> fmt::Debug for FairShare<K, T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairShare")
            .field("sub_groups", &self.group_of.is_some())
            .field("weighted_tenants", &self.weights.len())
            .field("active_tenants", &self.tenants.len())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
