//! A reference model of the queue's semantics (DESIGN.md 1-9), written to be
//! obviously right rather than fast: one `Vec` of entries, searched linearly.
//! Which ready key goes next is up to a reference order
//! (`order_model.rs`), told what the queue tells its ordering; the starvation
//! bound, which takes the oldest key out of turn, is the queue's own.
//!
//! Time is whole milliseconds since the queue was made. The model knows no
//! tokio: the driver (`driver.rs`) runs the real queue next to it and
//! compares every answer.

use std::time::Duration;

use super::order_model::{OrderModel, OrderingKind};

/// Keys are small numbers, so that adds collide often.
pub type Key = u8;

/// Why the model refused an add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuttingDown;

/// Where one key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Ready to be handed out; its place in the order is the order
    /// model's. `age_seq` and `ready_at` say when it became ready (kept on a
    /// raise).
    Ready {
        priority: i32,
        age_seq: u64,
        ready_at: u64,
    },
    /// Waiting on a delay. `timer_seq` is the order the delay was set in:
    /// keys due in the same millisecond become ready in that order.
    Waiting {
        priority: i32,
        deadline: u64,
        timer_seq: u64,
    },
    /// Leased, handed out with `handed`.
    Leased { handed: i32 },
    /// Leased and added again: ready with `priority` when the lease ends.
    LeasedDirty { handed: i32, priority: i32 },
    /// Leased and added again with a delay.
    LeasedWaiting {
        handed: i32,
        priority: i32,
        deadline: u64,
        timer_seq: u64,
    },
}

/// How a lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Done,
    /// Add again after this many ms (0: now), at the handed-out priority.
    Requeue(u64),
    /// Add again after the rate limiter's delay, at the handed-out priority.
    RequeueRateLimited,
}

/// The model's rate limiter: per-key exponential backoff, `base << n`
/// milliseconds capped at `max`, as `ExponentialBackoff::new(base, max)`.
#[derive(Debug, Clone)]
pub struct Backoff {
    pub base_ms: u64,
    pub max_ms: u64,
    failures: Vec<(Key, u32)>,
}

impl Backoff {
    pub fn new(base_ms: u64, max_ms: u64) -> Self {
        Backoff {
            base_ms,
            max_ms,
            failures: Vec::new(),
        }
    }

    /// Records a failure and returns the delay in ms.
    pub fn when(&mut self, key: Key) -> u64 {
        let n = match self.failures.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => {
                *n += 1;
                *n - 1
            }
            None => {
                self.failures.push((key, 1));
                0
            }
        };
        self.base_ms
            .checked_shl(n)
            .filter(|d| *d >> n == self.base_ms)
            .map_or(self.max_ms, |d| d.min(self.max_ms))
    }

    pub fn forget(&mut self, key: Key) {
        self.failures.retain(|(k, _)| *k != key);
    }

    pub fn num_requeues(&self, key: Key) -> u32 {
        self.failures
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0, |(_, n)| *n)
    }
}

/// The reference queue.
#[derive(Debug, Clone)]
pub struct Model {
    /// Every key the queue knows, in no particular order.
    pub entries: Vec<(Key, Entry)>,
    pub now: u64,
    /// Serve keys ready at least this long first, oldest first (half the
    /// starvation bound).
    pub promote_after: Option<Duration>,
    pub shutdown: bool,
    pub limiter: Backoff,
    /// Which ready key goes next, bound aside.
    pub order: OrderModel,
    seq: u64,
    /// What a metrics hook should have been told: keys that joined the set
    /// waiting to be processed (client-go's adds), accepted rate-limited
    /// adds and requeues, and the total time hand-outs had waited ready.
    pub adds: u64,
    pub retries: u64,
    pub waited_ms: u64,
}

impl Model {
    pub fn new(starvation_bound_ms: Option<u64>, limiter: Backoff, ordering: OrderingKind) -> Self {
        Model {
            entries: Vec::new(),
            now: 0,
            promote_after: starvation_bound_ms.map(|b| Duration::from_millis(b) / 2),
            shutdown: false,
            limiter,
            order: ordering.model(),
            seq: 0,
            adds: 0,
            retries: 0,
            waited_ms: 0,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn find(&self, key: Key) -> Option<usize> {
        self.entries.iter().position(|(k, _)| *k == key)
    }

    /// `key` becomes ready: the order model is told.
    fn ready(&mut self, key: Key, priority: i32) -> Entry {
        let age_seq = self.next_seq();
        self.order.push(key, priority);
        Entry::Ready {
            priority,
            age_seq,
            ready_at: self.now,
        }
    }

    /// `add_with(key, priority(p).after(delay_ms ms))`, rate limited if
    /// asked (the delay is then the larger of the two).
    pub fn add(
        &mut self,
        key: Key,
        priority: i32,
        delay_ms: u64,
        rate_limited: bool,
    ) -> Result<(), ShuttingDown> {
        if self.shutdown {
            return Err(ShuttingDown);
        }
        let mut delay = delay_ms;
        if rate_limited {
            delay = delay.max(self.limiter.when(key));
        }
        self.merge(key, priority, delay);
        self.retries += u64::from(rate_limited);
        Ok(())
    }

    /// One more add of `key`, counted as an add for metrics when it makes
    /// the key pending (ready, or due once its lease ends) where it was not.
    fn merge(&mut self, key: Key, priority: i32, delay: u64) {
        let pending =
            |e: Option<Entry>| matches!(e, Some(Entry::Ready { .. } | Entry::LeasedDirty { .. }));
        let before = pending(self.entry(key));
        self.merge_entry(key, priority, delay);
        if !before && pending(self.entry(key)) {
            self.adds += 1;
        }
    }

    /// One more add of `key` (semantics 2, 3 and 4).
    fn merge_entry(&mut self, key: Key, priority: i32, delay: u64) {
        let deadline = self.now + delay;
        let Some(i) = self.find(key) else {
            let entry = if delay == 0 {
                self.ready(key, priority)
            } else {
                Entry::Waiting {
                    priority,
                    deadline,
                    timer_seq: self.next_seq(),
                }
            };
            self.entries.push((key, entry));
            return;
        };
        let new = match self.entries[i].1 {
            // A ready key: a higher priority raises it, keeping its age;
            // whether it moves is the order's (told of every such add).
            Entry::Ready {
                priority: old,
                age_seq,
                ready_at,
            } => {
                self.order.touch(key, old, old.max(priority));
                Entry::Ready {
                    priority: old.max(priority),
                    age_seq,
                    ready_at,
                }
            }
            // Waiting: an immediate add makes it ready now (the timer is
            // dropped); a delayed one keeps the earlier deadline. The higher
            // priority wins either way.
            Entry::Waiting {
                priority: old,
                deadline: d,
                timer_seq,
            } => {
                if delay == 0 {
                    self.ready(key, old.max(priority))
                } else {
                    Entry::Waiting {
                        priority: old.max(priority),
                        deadline: d.min(deadline),
                        timer_seq,
                    }
                }
            }
            // Leased: remembered for when the lease ends, at this add's
            // priority (the handed-out one does not carry over).
            Entry::Leased { handed } => {
                if delay == 0 {
                    Entry::LeasedDirty { handed, priority }
                } else {
                    Entry::LeasedWaiting {
                        handed,
                        priority,
                        deadline,
                        timer_seq: self.next_seq(),
                    }
                }
            }
            Entry::LeasedDirty {
                handed,
                priority: old,
            } => Entry::LeasedDirty {
                handed,
                priority: old.max(priority),
            },
            Entry::LeasedWaiting {
                handed,
                priority: old,
                deadline: d,
                timer_seq,
            } => {
                if delay == 0 {
                    Entry::LeasedDirty {
                        handed,
                        priority: old.max(priority),
                    }
                } else {
                    Entry::LeasedWaiting {
                        handed,
                        priority: old.max(priority),
                        deadline: d.min(deadline),
                        timer_seq,
                    }
                }
            }
        };
        self.entries[i].1 = new;
    }

    /// Moves the clock on by one millisecond; keys due then become ready in
    /// (deadline, order their delay was set) order.
    pub fn tick(&mut self) {
        self.now += 1;
        let mut due: Vec<(u64, u64, Key)> = self
            .entries
            .iter()
            .filter_map(|&(k, e)| match e {
                Entry::Waiting {
                    deadline,
                    timer_seq,
                    ..
                }
                | Entry::LeasedWaiting {
                    deadline,
                    timer_seq,
                    ..
                } if deadline <= self.now => Some((deadline, timer_seq, k)),
                _ => None,
            })
            .collect();
        due.sort();
        for (_, _, key) in due {
            self.adds += 1;
            let i = self.find(key).unwrap();
            self.entries[i].1 = match self.entries[i].1 {
                Entry::Waiting { priority, .. } => self.ready(key, priority),
                Entry::LeasedWaiting {
                    handed, priority, ..
                } => Entry::LeasedDirty { handed, priority },
                _ => unreachable!(),
            };
        }
    }

    /// The next key to hand out and its priority, leased.
    ///
    /// With a starvation bound, the key ready longest goes first if it has
    /// waited at least half the bound; otherwise the one the order model
    /// hands out.
    pub fn pop(&mut self) -> Option<(Key, i32)> {
        let ready: Vec<(Key, u64, u64)> = self
            .entries
            .iter()
            .filter_map(|&(k, e)| match e {
                Entry::Ready {
                    age_seq, ready_at, ..
                } => Some((k, age_seq, ready_at)),
                _ => None,
            })
            .collect();
        assert_eq!(self.order.len(), ready.len(), "order model: {self:?}");
        let &(oldest, _, oldest_ready_at) = ready.iter().min_by_key(|r| r.1)?;
        let promoted = self
            .promote_after
            .is_some_and(|age| Duration::from_millis(self.now - oldest_ready_at) >= age);
        let key = if promoted {
            self.order.remove(oldest);
            oldest
        } else {
            self.order
                .pop()
                .expect("the order model holds the ready keys")
        };
        let i = self.find(key).unwrap();
        let Entry::Ready {
            priority, ready_at, ..
        } = self.entries[i].1
        else {
            panic!("order model handed out {key}, which is not ready: {self:?}");
        };
        self.waited_ms += self.now - ready_at;
        self.entries[i].1 = Entry::Leased { handed: priority };
        Some((key, priority))
    }

    /// Ends the lease on `key`, adding it again first if `end` says so. A
    /// requeue after shutdown is refused, and the lease still ends.
    pub fn finish(&mut self, key: Key, end: End) -> Result<(), ShuttingDown> {
        let i = self.find(key).expect("finishing an unknown key");
        let handed = match self.entries[i].1 {
            Entry::Leased { handed }
            | Entry::LeasedDirty { handed, .. }
            | Entry::LeasedWaiting { handed, .. } => handed,
            e => panic!("finishing {key}, which is not leased: {e:?}"),
        };
        let mut outcome = Ok(());
        match end {
            End::Done => {}
            _ if self.shutdown => outcome = Err(ShuttingDown),
            End::Requeue(delay) => self.merge(key, handed, delay),
            End::RequeueRateLimited => {
                let delay = self.limiter.when(key);
                self.merge(key, handed, delay);
                self.retries += 1;
            }
        }
        let i = self.find(key).unwrap();
        match self.entries[i].1 {
            Entry::Leased { .. } => {
                self.entries.remove(i);
            }
            Entry::LeasedDirty { priority, .. } => self.entries[i].1 = self.ready(key, priority),
            Entry::LeasedWaiting {
                priority,
                deadline,
                timer_seq,
                ..
            } => {
                self.entries[i].1 = Entry::Waiting {
                    priority,
                    deadline,
                    timer_seq,
                }
            }
            e => unreachable!("{e:?}"),
        }
        outcome
    }

    /// Refuses adds from now on and drops every delay: waiting keys are
    /// forgotten, leased ones stay leased (not dirty).
    pub fn shutdown(&mut self) {
        self.shutdown = true;
        self.entries
            .retain(|(_, e)| !matches!(e, Entry::Waiting { .. }));
        for (_, e) in &mut self.entries {
            if let Entry::LeasedWaiting { handed, .. } = *e {
                *e = Entry::Leased { handed };
            }
        }
    }

    fn count(&self, f: impl Fn(&Entry) -> bool) -> usize {
        self.entries.iter().filter(|(_, e)| f(e)).count()
    }

    pub fn ready_len(&self) -> usize {
        self.count(|e| matches!(e, Entry::Ready { .. }))
    }

    /// Leased keys, dirty or not.
    pub fn leased(&self) -> usize {
        self.count(|e| {
            matches!(
                e,
                Entry::Leased { .. } | Entry::LeasedDirty { .. } | Entry::LeasedWaiting { .. }
            )
        })
    }

    /// Keys waiting on a delay, leased or not.
    pub fn waiting(&self) -> usize {
        self.count(|e| matches!(e, Entry::Waiting { .. } | Entry::LeasedWaiting { .. }))
    }

    pub fn dirty(&self) -> usize {
        self.count(|e| matches!(e, Entry::LeasedDirty { .. }))
    }

    /// Ready keys per priority, highest first.
    pub fn ready_by_priority(&self) -> Vec<(i32, usize)> {
        let mut levels: Vec<(i32, usize)> = Vec::new();
        for (_, e) in &self.entries {
            if let Entry::Ready { priority, .. } = *e {
                match levels.iter_mut().find(|(p, _)| *p == priority) {
                    Some((_, n)) => *n += 1,
                    None => levels.push((priority, 1)),
                }
            }
        }
        levels.sort_by_key(|&(p, _)| std::cmp::Reverse(p));
        levels
    }

    /// Shut down and nothing more to hand out: `get` returns `None`.
    pub fn closed(&self) -> bool {
        self.shutdown && self.ready_len() == 0 && self.dirty() == 0
    }

    /// Shut down, nothing ready and nothing leased: a drain resolves.
    pub fn drained(&self) -> bool {
        self.shutdown && self.ready_len() == 0 && self.leased() == 0
    }

    /// The entry of `key`, if the queue knows it.
    pub fn entry(&self, key: Key) -> Option<Entry> {
        self.find(key).map(|i| self.entries[i].1)
    }
}
