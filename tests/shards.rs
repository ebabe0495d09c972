//! A queue split into shards hands out one order, as a queue of one shard
//! does: the same keys in the same order, whatever the number of shards,
//! under concurrent producers, and for keys coming off delays.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::coop::unconstrained;
use tokio_workqueue::{AddOpts, FairShare, Partitioned, WorkQueue};

/// A small deterministic generator (xorshift), so runs repeat.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// Adds (some twice, some raised, some while leased) and hand-outs,
/// interleaved; returns every key handed out, with its priority, in order.
async fn hand_outs(shards: usize) -> Vec<(u32, i32)> {
    let q: WorkQueue<u32> = WorkQueue::builder().shards(shards).build();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    let mut leased = Vec::new();
    for _ in 0..20_000 {
        match rng.next(10) {
            0..=5 => {
                let key = rng.next(3_000) as u32;
                let priority = rng.next(4) as i32 - 1;
                q.add_with(key, AddOpts::default().priority(priority))
                    .unwrap();
            }
            6..=8 => {
                if let Some(item) = futures::FutureExt::now_or_never(q.get()).flatten() {
                    out.push((*item, item.priority()));
                    leased.push(item);
                }
            }
            _ => {
                // End a few leases, oldest first.
                let n = leased.len().min(rng.next(4) as usize);
                leased.drain(..n);
            }
        }
    }
    drop(leased);
    while let Some(item) = futures::FutureExt::now_or_never(q.get()).flatten() {
        out.push((*item, item.priority()));
    }
    out
}

#[tokio::test]
async fn every_number_of_shards_hands_out_the_same_keys_in_the_same_order() {
    // Unconstrained: the hand-outs polled once each would otherwise find the
    // task's co-operative budget spent after 128 keys.
    let one = unconstrained(hand_outs(1)).await;
    assert!(one.len() > 5_000, "the run hands out keys: {}", one.len());
    for shards in [2, 8, 64] {
        let many = unconstrained(hand_outs(shards)).await;
        let first_difference = one.iter().zip(&many).position(|(a, b)| a != b);
        assert_eq!(first_difference, None, "{shards} shards");
        assert_eq!(one.len(), many.len(), "{shards} shards");
    }
}

/// Two producers add their keys in order while one consumer takes them:
/// whatever shards their keys fall in, it sees each producer's keys in the
/// order that producer added them (an add that returned before another
/// started is handed out first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_producers_keys_come_out_in_the_order_it_added_them() {
    const N: u32 = 20_000;
    let q: WorkQueue<(u32, u32)> = WorkQueue::builder().shards(8).build();
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move {
                for seq in 0..N {
                    q.add((p, seq)).unwrap();
                    if seq % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let consumer = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut last: HashMap<u32, u32> = HashMap::new();
            for _ in 0..2 * N {
                let item = q.get().await.unwrap();
                let (p, seq) = *item;
                if let Some(&before) = last.get(&p) {
                    assert!(seq > before, "producer {p}: {seq} after {before}");
                }
                last.insert(p, seq);
            }
            last
        })
    };
    for p in producers {
        p.await.unwrap();
    }
    let last = consumer.await.unwrap();
    assert_eq!(last, HashMap::from([(0, N - 1), (1, N - 1)]));
}

/// Keys due at the same moment, in many shards, come out in the order their
/// delays were set; keys due earlier come out first.
#[tokio::test(start_paused = true)]
async fn delayed_keys_in_many_shards_come_out_by_deadline_then_in_the_order_set() {
    let q: WorkQueue<u32> = WorkQueue::builder().shards(8).build();
    let used: std::collections::HashSet<usize> = (0..300).map(|k| q.shard_of(&k)).collect();
    assert_eq!(used.len(), 8, "300 keys fall in every shard");
    for key in 0..300 {
        // Three deadlines, set in a mixed order.
        let ms = [30, 10, 20][key as usize % 3];
        q.add_after(key, Duration::from_millis(ms)).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    let mut out = Vec::new();
    // Unconstrained, as in the test above.
    unconstrained(async {
        while let Some(item) = futures::FutureExt::now_or_never(q.get()).flatten() {
            out.push(*item);
        }
    })
    .await;
    let by_deadline = |rest: u32| (0..300).filter(move |k| k % 3 == rest);
    let expected: Vec<u32> = by_deadline(1)
        .chain(by_deadline(2))
        .chain(by_deadline(0))
        .collect();
    assert_eq!(out, expected);
}

#[test]
fn a_queue_has_the_shards_asked_for_rounded_up_to_a_power_of_two_and_at_most_64() {
    let shards = |n| WorkQueue::<u32>::builder().shards(n).build().shards();
    assert_eq!(WorkQueue::<u32>::new().shards(), 64);
    assert_eq!(shards(0), 1);
    assert_eq!(shards(1), 1);
    assert_eq!(shards(3), 4);
    assert_eq!(shards(64), 64);
    assert_eq!(shards(1_000), 64);
}

#[test]
fn a_partition_has_8_shards_unless_told_otherwise() {
    let by_value = |key: &u32| *key as usize;
    let default = Partitioned::<u32>::new(3, by_value).unwrap();
    assert!((0..3).all(|i| default.queue(i).shards() == 8));
    let asked = WorkQueue::<u32>::builder()
        .shards(2)
        .partitioned(2, by_value)
        .build()
        .unwrap();
    assert!((0..2).all(|i| asked.queue(i).shards() == 2));
    let configured = Partitioned::<u32>::builder(2, by_value)
        .configure(|i, b| if i == 1 { b.shards(64) } else { b })
        .build()
        .unwrap();
    assert_eq!(configured.queue(0).shards(), 8);
    assert_eq!(configured.queue(1).shards(), 64);
}

#[test]
fn an_ordering_that_cannot_be_split_keeps_one_shard() {
    let fair: WorkQueue<u32, _> = WorkQueue::builder()
        .shards(8)
        .ordering(FairShare::new(|k: &u32| k % 4))
        .build();
    assert_eq!(fair.shards(), 1);
    let fifo: WorkQueue<u32, _> = WorkQueue::builder()
        .shards(8)
        .ordering(tokio_workqueue::Fifo::new())
        .build();
    assert_eq!(fifo.shards(), 1);
}
