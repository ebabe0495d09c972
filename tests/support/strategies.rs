//! What `tests/model.rs` and `tests/ordering_model.rs` share beyond the
//! driver and the model: the random op language of the queue model, the
//! config strategy, the case count, and the replay of a named scenario
//! through the model. (Kept out of `support/mod.rs`, which the fuzz target
//! also includes, because it needs proptest.)

use proptest::prelude::*;

use super::support::driver::{Config, EndHow, Op, run};
use super::support::model::{Backoff, End, Key, Model};
use super::support::order_model::OrderingKind;

/// How a lease ends.
pub fn end_how() -> impl Strategy<Value = EndHow> {
    prop_oneof![
        2 => Just(EndHow::Drop),
        2 => Just(EndHow::Done),
        2 => Just(EndHow::Requeue(0)),
        2 => (1..=6u8).prop_map(EndHow::Requeue),
        1 => Just(EndHow::RequeueRateLimited),
    ]
}

/// The queue model's language: 6 keys, delays, rate limits, dropped gets,
/// streams, shutdowns and drains.
pub fn narrow_op() -> impl Strategy<Value = Op> {
    let key = 0..6 as Key;
    let delay = prop_oneof![3 => Just(0u8), 2 => 1..=6u8];
    prop_oneof![
        10 => (key.clone(), -2..=2i8, delay, prop::bool::weighted(0.15)).prop_map(
            |(key, priority, delay_ms, rate_limited)| Op::Add {
                key,
                priority,
                delay_ms,
                rate_limited,
            }
        ),
        5 => Just(Op::Get),
        2 => Just(Op::PollGets),
        1 => any::<u8>().prop_map(Op::DropGet),
        2 => Just(Op::StreamNext),
        1 => Just(Op::DropStream),
        5 => (any::<u8>(), end_how()).prop_map(|(lease, how)| Op::End { lease, how }),
        1 => key.prop_map(Op::Forget),
        3 => (1..=5u8).prop_map(Op::Advance),
        1 => Just(Op::Shutdown),
        1 => Just(Op::Drain),
    ]
}

/// A starvation bound (none, zero or a few milliseconds) and metrics on or
/// off, for `ordering`.
pub fn config(ordering: OrderingKind) -> impl Strategy<Value = Config> {
    let bound = prop_oneof![
        3 => Just(None),
        1 => Just(Some(0u8)),
        2 => (1..=12u8).prop_map(Some),
    ];
    (bound, prop::bool::weighted(0.3)).prop_map(move |(starvation_bound_ms, metrics)| Config {
        starvation_bound_ms,
        metrics,
        ordering,
    })
}

/// `PROPTEST_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `ops` through the real queue against the model (the driver checks
/// they agree step by step), then returns the model's hand-outs (key,
/// priority) in order. Scenarios use adds, gets, lease ends and clock
/// moves.
pub fn hand_outs(cfg: Config, ops: &[Op]) -> Vec<(Key, i32)> {
    run(cfg, ops);
    let mut m = Model::new(
        cfg.starvation_bound_ms.map(u64::from),
        Backoff::new(1, 4),
        cfg.ordering,
    );
    let mut leased: Vec<Key> = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        match *op {
            Op::Add {
                key,
                priority,
                delay_ms,
                rate_limited,
            } => {
                let _ = m.add(key, priority.into(), delay_ms.into(), rate_limited);
            }
            Op::Get => {
                if let Some((k, p)) = m.pop() {
                    out.push((k, p));
                    leased.push(k);
                }
            }
            Op::End { lease, how } => {
                let k = leased.remove(usize::from(lease) % leased.len());
                let end = match how {
                    EndHow::Drop | EndHow::Done => End::Done,
                    EndHow::Requeue(ms) => End::Requeue(ms.into()),
                    EndHow::RequeueRateLimited => End::RequeueRateLimited,
                };
                let _ = m.finish(k, end);
            }
            Op::Advance(ms) => (0..ms).for_each(|_| m.tick()),
            _ => unimplemented!("scenario op {op:?}"),
        }
    }
    out
}
