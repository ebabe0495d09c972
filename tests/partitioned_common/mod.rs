//! A log of what partition tasks did, shared by the partition tests.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::Id;
use tokio::time::Instant;
use tokio_workqueue::Partitioned;

/// One key processed: which partition, which task, when.
#[derive(Debug, Clone)]
pub struct Run<K> {
    pub key: K,
    pub partition: usize,
    pub task: Id,
    /// Since the log was made.
    pub start: Duration,
    pub end: Option<Duration>,
}

/// A run in progress; dropping it ends the run.
pub struct Running<K: Clone + Eq + Hash> {
    log: Arc<Log<K>>,
    run: usize,
}

impl<K: Clone + Eq + Hash> Drop for Running<K> {
    fn drop(&mut self) {
        self.log.end(self.run);
    }
}

/// Runs in the order they started, and how many ran at once.
pub struct Log<K> {
    t0: Instant,
    inner: Mutex<Inner<K>>,
}

struct Inner<K> {
    runs: Vec<Run<K>>,
    active: HashMap<usize, usize>,
    max_active_per_partition: usize,
    active_total: usize,
    max_active_total: usize,
}

impl<K: Clone + Eq + Hash> Log<K> {
    pub fn new() -> Arc<Self> {
        Arc::new(Log {
            t0: Instant::now(),
            inner: Mutex::new(Inner {
                runs: Vec::new(),
                active: HashMap::new(),
                max_active_per_partition: 0,
                active_total: 0,
                max_active_total: 0,
            }),
        })
    }

    /// Records the start of `key` in `partition`; the run ends when the
    /// returned guard is dropped, a panic included.
    pub fn start(self: &Arc<Self>, key: K, partition: usize) -> Running<K> {
        let mut g = self.inner.lock().unwrap();
        let active = g.active.entry(partition).or_default();
        *active += 1;
        let active = *active;
        g.max_active_per_partition = g.max_active_per_partition.max(active);
        g.active_total += 1;
        g.max_active_total = g.max_active_total.max(g.active_total);
        g.runs.push(Run {
            key,
            partition,
            task: tokio::task::id(),
            start: self.t0.elapsed(),
            end: None,
        });
        Running {
            log: self.clone(),
            run: g.runs.len() - 1,
        }
    }

    fn end(&self, run: usize) {
        let mut g = self.inner.lock().unwrap();
        let partition = g.runs[run].partition;
        g.runs[run].end = Some(self.t0.elapsed());
        *g.active.get_mut(&partition).unwrap() -= 1;
        g.active_total -= 1;
    }

    pub fn runs(&self) -> Vec<Run<K>> {
        self.inner.lock().unwrap().runs.clone()
    }

    /// When each run of `key` started, in order.
    pub fn starts_of(&self, key: K) -> Vec<Duration> {
        self.runs()
            .into_iter()
            .filter(|r| r.key == key)
            .map(|r| r.start)
            .collect()
    }

    /// Keys of `partition` in the order they started.
    pub fn order(&self, partition: usize) -> Vec<K> {
        self.runs()
            .into_iter()
            .filter(|r| r.partition == partition)
            .map(|r| r.key)
            .collect()
    }

    /// Keys in the order they started, all partitions.
    pub fn keys(&self) -> Vec<K> {
        self.runs().into_iter().map(|r| r.key).collect()
    }

    /// When the last run of `partition` ended.
    pub fn last_end(&self, partition: usize) -> Option<Duration> {
        self.runs()
            .into_iter()
            .filter(|r| r.partition == partition)
            .filter_map(|r| r.end)
            .max()
    }

    /// The most runs of one partition seen at once.
    pub fn max_active_per_partition(&self) -> usize {
        self.inner.lock().unwrap().max_active_per_partition
    }

    /// The most runs seen at once, all partitions.
    pub fn max_active_total(&self) -> usize {
        self.inner.lock().unwrap().max_active_total
    }
}

/// Runs `queue` with a reconcile that logs each key and sleeps `work(key)`
/// (on tokio's clock) before ending its lease.
pub fn run_logged<K>(
    queue: &Partitioned<K>,
    log: &Arc<Log<K>>,
    work: impl Fn(&K) -> Duration + Send + Sync + 'static,
) -> tokio_workqueue::PartitionHandle<K>
where
    K: tokio_workqueue::Key,
{
    let (q, log) = (queue.clone(), log.clone());
    let work = Arc::new(work);
    queue.run(move |item| {
        let (q, log, work) = (q.clone(), log.clone(), work.clone());
        async move {
            let run = log.start(item.key().clone(), q.partition_of(item.key()));
            tokio::time::sleep(work(item.key())).await;
            drop(run);
            item.done();
        }
    })
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
