//! Reference models of the built-in orderings: which ready key goes next.
//!
//! Each is written to be obviously right rather than fast: `Vec`s searched
//! and shifted, a ring as a `Vec` with the index of whose turn it is. The
//! queue model (`model.rs`) tells its order model the same four things the
//! queue tells its `Ordering` (push, pop, touch, remove), so the driver
//! checks the real ordering's every hand-out against these.

use super::model::Key;

/// Which ordering a run plugs in, and the reference model of its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderingKind {
    /// `Priorities` (the default): highest level first, FIFO within one.
    Priorities,
    /// `TwoLanes`: priority 0 and up before the rest, FIFO within a lane.
    TwoLanes,
    /// `Fifo`: ready order, priorities ignored.
    Fifo,
    /// `FairShare` with tenant `key % tenants`; tenant 0 gets `weight0`
    /// hand-outs per turn; with `subgroups`, tenants are split further by
    /// `(key / tenants) % subgroups`.
    FairShare {
        tenants: u8,
        weight0: u8,
        subgroups: Option<u8>,
    },
}

impl OrderingKind {
    /// The fair-share cases the tests run.
    pub const FAIR: OrderingKind = OrderingKind::FairShare {
        tenants: 3,
        weight0: 1,
        subgroups: None,
    };
    pub const FAIR_WEIGHTED: OrderingKind = OrderingKind::FairShare {
        tenants: 3,
        weight0: 3,
        subgroups: None,
    };
    pub const FAIR_HIERARCHY: OrderingKind = OrderingKind::FairShare {
        tenants: 2,
        weight0: 2,
        subgroups: Some(2),
    };

    /// Every built-in ordering, fair share in its three forms.
    pub const ALL: [OrderingKind; 6] = [
        OrderingKind::Priorities,
        OrderingKind::TwoLanes,
        OrderingKind::Fifo,
        OrderingKind::FAIR,
        OrderingKind::FAIR_WEIGHTED,
        OrderingKind::FAIR_HIERARCHY,
    ];

    pub fn model(self) -> OrderModel {
        match self {
            OrderingKind::Priorities => OrderModel::Levels(RefLevels::new(false)),
            OrderingKind::TwoLanes => OrderModel::Levels(RefLevels::new(true)),
            OrderingKind::Fifo => OrderModel::Fifo(Vec::new()),
            OrderingKind::FairShare {
                tenants,
                weight0,
                subgroups,
            } => OrderModel::Fair(RefFair {
                tenants,
                weight0,
                subgroups,
                levels: Vec::new(),
            }),
        }
    }
}

/// The lane of a priority, as `Lane::from_priority`: 0 fast, -100 slow.
pub fn lane(priority: i32) -> i32 {
    if priority >= 0 { 0 } else { -100 }
}

/// A reference order.
#[derive(Debug, Clone)]
pub enum OrderModel {
    Levels(RefLevels),
    /// Keys in the order they became ready.
    Fifo(Vec<Key>),
    Fair(RefFair),
}

impl OrderModel {
    pub fn push(&mut self, key: Key, priority: i32) {
        match self {
            OrderModel::Levels(m) => m.push(key, priority),
            OrderModel::Fifo(keys) => keys.push(key),
            OrderModel::Fair(m) => m.push(key, priority),
        }
    }

    pub fn pop(&mut self) -> Option<Key> {
        match self {
            OrderModel::Levels(m) => m.pop(),
            OrderModel::Fifo(keys) => (!keys.is_empty()).then(|| keys.remove(0)),
            OrderModel::Fair(m) => m.pop(),
        }
    }

    /// A ready key added again; its priority went from `was` to `now`.
    pub fn touch(&mut self, key: Key, was: i32, now: i32) {
        match self {
            OrderModel::Levels(m) => m.touch(key, was, now),
            OrderModel::Fifo(_) => {}
            OrderModel::Fair(m) => {
                if now > was {
                    m.remove(key);
                    m.push(key, now);
                }
            }
        }
    }

    /// The starvation bound took `key` out of turn.
    pub fn remove(&mut self, key: Key) {
        match self {
            OrderModel::Levels(m) => m.keys.retain(|k| k.0 != key),
            OrderModel::Fifo(keys) => keys.retain(|k| *k != key),
            OrderModel::Fair(m) => m.remove(key),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            OrderModel::Levels(m) => m.keys.len(),
            OrderModel::Fifo(keys) => keys.len(),
            OrderModel::Fair(m) => m
                .levels
                .iter()
                .flat_map(|l| &l.1.ring)
                .flat_map(|t| &t.subs)
                .map(|s| s.keys.len())
                .sum(),
        }
    }
}

/// Priority levels (or two lanes), FIFO within each.
#[derive(Debug, Clone)]
pub struct RefLevels {
    lanes: bool,
    /// (key, level, order joined the level).
    keys: Vec<(Key, i32, u64)>,
    seq: u64,
}

impl RefLevels {
    fn new(lanes: bool) -> Self {
        RefLevels {
            lanes,
            keys: Vec::new(),
            seq: 0,
        }
    }

    fn level(&self, priority: i32) -> i32 {
        if self.lanes { lane(priority) } else { priority }
    }

    fn push(&mut self, key: Key, priority: i32) {
        self.seq += 1;
        self.keys.push((key, self.level(priority), self.seq));
    }

    fn pop(&mut self) -> Option<Key> {
        let i = (0..self.keys.len())
            .max_by_key(|&i| (self.keys[i].1, std::cmp::Reverse(self.keys[i].2)))?;
        Some(self.keys.remove(i).0)
    }

    /// A key moves to the back of its new level when its level rises.
    fn touch(&mut self, key: Key, was: i32, now: i32) {
        let (from, to) = (self.level(was), self.level(now));
        if to > from {
            self.seq += 1;
            let seq = self.seq;
            let k = self.keys.iter_mut().find(|k| k.0 == key).unwrap();
            *k = (key, to, seq);
        }
    }
}

/// Fair share: per priority level, a ring of tenants, each a ring of
/// sub-groups (one, without sub-groups), each a FIFO of keys.
#[derive(Debug, Clone)]
pub struct RefFair {
    tenants: u8,
    weight0: u8,
    subgroups: Option<u8>,
    /// (priority, level), any order.
    levels: Vec<(i32, RefRing)>,
}

/// A level's tenants: `ring[turn]` has the turn; the ring goes on in
/// index order and wraps.
#[derive(Debug, Clone, Default)]
pub struct RefRing {
    ring: Vec<RefTenant>,
    turn: usize,
}

#[derive(Debug, Clone)]
pub struct RefTenant {
    id: Key,
    /// Keys handed out in this turn.
    served: u32,
    subs: Vec<RefSub>,
    turn: usize,
}

#[derive(Debug, Clone)]
pub struct RefSub {
    id: Key,
    keys: Vec<Key>,
}

impl RefFair {
    fn tenant(&self, key: Key) -> Key {
        key % self.tenants
    }

    fn sub(&self, key: Key) -> Key {
        self.subgroups.map_or(0, |n| (key / self.tenants) % n)
    }

    fn weight(&self, tenant: Key) -> u32 {
        if tenant == 0 { self.weight0.into() } else { 1 }
    }

    fn push(&mut self, key: Key, priority: i32) {
        let (tid, sid) = (self.tenant(key), self.sub(key));
        let li = match self.levels.iter().position(|l| l.0 == priority) {
            Some(i) => i,
            None => {
                self.levels.push((priority, RefRing::default()));
                self.levels.len() - 1
            }
        };
        let ring = &mut self.levels[li].1;
        // A new tenant joins at the back of the round: just before the one
        // whose turn it is.
        let ti = match ring.ring.iter().position(|t| t.id == tid) {
            Some(i) => i,
            None => {
                let at = ring.turn.min(ring.ring.len());
                ring.ring.insert(
                    at,
                    RefTenant {
                        id: tid,
                        served: 0,
                        subs: Vec::new(),
                        turn: 0,
                    },
                );
                if ring.ring.len() > 1 {
                    ring.turn += 1;
                }
                at
            }
        };
        let tenant = &mut ring.ring[ti];
        let si = match tenant.subs.iter().position(|s| s.id == sid) {
            Some(i) => i,
            None => {
                let at = tenant.turn.min(tenant.subs.len());
                tenant.subs.insert(
                    at,
                    RefSub {
                        id: sid,
                        keys: Vec::new(),
                    },
                );
                if tenant.subs.len() > 1 {
                    tenant.turn += 1;
                }
                at
            }
        };
        tenant.subs[si].keys.push(key);
    }

    fn pop(&mut self) -> Option<Key> {
        let li = (0..self.levels.len())
            .filter(|&i| !self.levels[i].1.ring.is_empty())
            .max_by_key(|&i| self.levels[i].0)?;
        let ti = self.levels[li].1.turn;
        let weight = self.weight(self.levels[li].1.ring[ti].id);
        let ring = &mut self.levels[li].1;
        let tenant = &mut ring.ring[ti];
        let si = tenant.turn;
        let key = tenant.subs[si].keys.remove(0);
        // The next sub-group's turn (the emptied one leaves the ring, which
        // puts the next one at its index).
        if tenant.subs[si].keys.is_empty() {
            tenant.subs.remove(si);
        } else {
            tenant.turn += 1;
        }
        if tenant.turn >= tenant.subs.len() {
            tenant.turn = 0;
        }
        tenant.served += 1;
        if tenant.subs.is_empty() {
            ring.ring.remove(ti);
        } else if tenant.served >= weight {
            tenant.served = 0;
            ring.turn += 1;
        }
        if ring.turn >= ring.ring.len() {
            ring.turn = 0;
        }
        Some(key)
    }

    fn remove(&mut self, key: Key) {
        for (_, ring) in &mut self.levels {
            for ti in 0..ring.ring.len() {
                let tenant = &mut ring.ring[ti];
                for si in 0..tenant.subs.len() {
                    let sub = &mut tenant.subs[si];
                    let Some(ki) = sub.keys.iter().position(|k| *k == key) else {
                        continue;
                    };
                    sub.keys.remove(ki);
                    if sub.keys.is_empty() {
                        tenant.subs.remove(si);
                        if si < tenant.turn {
                            tenant.turn -= 1;
                        }
                        if tenant.turn >= tenant.subs.len() {
                            tenant.turn = 0;
                        }
                    }
                    if tenant.subs.is_empty() {
                        ring.ring.remove(ti);
                        if ti < ring.turn {
                            ring.turn -= 1;
                        }
                        if ring.turn >= ring.ring.len() {
                            ring.turn = 0;
                        }
                    }
                    return;
                }
            }
        }
        panic!("order model: removing {key}, which it does not hold");
    }
}
