//! The timer task takes new delays only from the shards that marked
//! themselves as having some, and only the first shard to mark itself since
//! the task's last round wakes it. These tests set delays in every shard from
//! two threads at once, from the moment the timer task starts (when no
//! shard has its waker yet), and after the task's first round, and check on
//! their own record that every delayed key comes out.

use std::collections::HashSet;
use std::time::Duration;

use tokio_workqueue::WorkQueue;

/// Keys each producer delays, and the producers.
const PER_PRODUCER: u32 = 5_000;
const PRODUCERS: u32 = 3;

/// Sets delays of 1 to 3 ms on distinct keys from `PRODUCERS` tasks of a
/// 2-worker runtime while one consumer takes them; returns the keys taken,
/// or the count taken when it gave up waiting (a lost delay).
fn delayed_keys_from_threads(rounds_apart: Option<Duration>) -> Result<HashSet<u32>, usize> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let queue = WorkQueue::<u32>::new();
        let consumer = {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut seen = HashSet::new();
                let total = (PER_PRODUCER * PRODUCERS) as usize;
                while seen.len() < total {
                    // Bounded: a delay the timer task never took would
                    // otherwise hang the test instead of failing it.
                    match tokio::time::timeout(Duration::from_secs(5), queue.get()).await {
                        Ok(Some(item)) => {
                            seen.insert(*item);
                        }
                        Ok(None) | Err(_) => return Err(seen.len()),
                    }
                }
                Ok(seen)
            })
        };
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for i in 0..PER_PRODUCER {
                        let key = p * PER_PRODUCER + i;
                        let delay = Duration::from_micros(u64::from(key % 3 + 1) * 1_000);
                        queue.add_after(key, delay).expect("open");
                        if let Some(pause) = rounds_apart
                            && i % 500 == 0
                        {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.expect("a producer");
        }
        consumer.await.expect("the consumer")
    })
}

#[test]
fn delays_set_in_every_shard_by_three_tasks_on_two_threads_all_come_out() {
    for _ in 0..5 {
        let seen = delayed_keys_from_threads(None).expect("every delayed key comes out");
        assert_eq!(seen.len(), (PER_PRODUCER * PRODUCERS) as usize);
    }
}

#[test]
fn delays_set_in_bursts_with_idle_timer_rounds_between_all_come_out() {
    // Pauses let the timer task finish its rounds and sleep, so the next
    // burst's first mark must wake it.
    for _ in 0..3 {
        let seen = delayed_keys_from_threads(Some(Duration::from_millis(3)))
            .expect("every delayed key comes out");
        assert_eq!(seen.len(), (PER_PRODUCER * PRODUCERS) as usize);
    }
}

/// After the task's first round (one delay, fired), delays in every shard
/// of a queue of 1 and of 64 shards (the last bit of the word included)
/// all come out.
#[test]
fn after_the_first_round_delays_in_every_shard_of_one_or_sixty_four_come_out() {
    for shards in [1, 64] {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let queue: WorkQueue<u32> = WorkQueue::builder().shards(shards).build();
            queue.add_after(u32::MAX, Duration::from_millis(1)).unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert_eq!(*queue.get().await.unwrap(), u32::MAX);
            let used: HashSet<usize> = (0..1_000u32).map(|k| queue.shard_of(&k)).collect();
            assert_eq!(used.len(), shards, "1,000 keys fall in every shard");
            for key in 0..1_000u32 {
                queue
                    .add_after(key, Duration::from_millis(u64::from(key % 7 + 1)))
                    .expect("open");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut out = Vec::new();
            tokio::task::coop::unconstrained(async {
                while let Some(item) = futures::FutureExt::now_or_never(queue.get()).flatten() {
                    out.push(*item);
                }
            })
            .await;
            assert_eq!(out.len(), 1_000, "{shards} shards");
        });
    }
}

/// The first round of the timer task leaves its waker with every shard: a
/// shard that gets its first delay long after the task started, with the
/// task asleep and no other shard marked, must be able to wake it.
#[tokio::test(start_paused = true)]
async fn a_shard_whose_first_delay_comes_after_the_timer_slept_wakes_it() {
    let queue: WorkQueue<u32> = WorkQueue::builder().shards(8).build();
    let first = 0u32;
    let later = (1..1_000)
        .find(|k| queue.shard_of(k) != queue.shard_of(&first))
        .expect("a key in another shard");
    queue.add_after(first, Duration::from_millis(5)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(*queue.get().await.unwrap(), first);
    // The wheel is empty now and the task sleeps with no deadline.
    queue.add_after(later, Duration::from_millis(5)).unwrap();
    let item = tokio::time::timeout(Duration::from_secs(1), queue.get())
        .await
        .expect("the later shard's delay fires");
    assert_eq!(*item.unwrap(), later);
}
