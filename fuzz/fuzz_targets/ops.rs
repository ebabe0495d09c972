//! Fuzz target: random operation sequences against the reference model.
//!
//! The driver and the model are the property tests' (`tests/support/`);
//! this file only turns fuzzer bytes into a `Config` (the ordering plugged
//! in among them) and an op sequence with the same ranges as the proptest
//! strategies in `tests/model.rs`.
#![no_main]

#[path = "../../tests/support/mod.rs"]
mod support;

use arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use support::driver::{Config, EndHow, Op, run};
use support::order_model::OrderingKind;

/// Keys 0..6, so that adds collide often.
const KEYS: u8 = 6;
/// Long enough to reach deep states, short enough to run fast.
const MAX_OPS: usize = 256;

#[derive(Debug)]
struct Input {
    cfg: Config,
    ops: Vec<Op>,
}

fn delay(u: &mut Unstructured<'_>) -> Result<u8> {
    Ok(if u.ratio(3, 5)? {
        0
    } else {
        u.int_in_range(1..=6)?
    })
}

fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    Ok(match u.int_in_range(0..=31u8)? {
        0..=9 => Op::Add {
            key: u.int_in_range(0..=KEYS - 1)?,
            priority: u.int_in_range(-2..=2)?,
            delay_ms: delay(u)?,
            rate_limited: u.ratio(1, 7)?,
        },
        10..=14 => Op::Get,
        15..=16 => Op::PollGets,
        17 => Op::DropGet(u.arbitrary()?),
        18..=19 => Op::StreamNext,
        20 => Op::DropStream,
        21..=25 => Op::End {
            lease: u.arbitrary()?,
            how: match u.int_in_range(0..=8u8)? {
                0..=1 => EndHow::Drop,
                2..=3 => EndHow::Done,
                4..=5 => EndHow::Requeue(0),
                6..=7 => EndHow::Requeue(u.int_in_range(1..=6)?),
                _ => EndHow::RequeueRateLimited,
            },
        },
        26 => Op::Forget(u.int_in_range(0..=KEYS - 1)?),
        27..=29 => Op::Advance(u.int_in_range(1..=5)?),
        30 => Op::Shutdown,
        _ => Op::Drain,
    })
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let starvation_bound_ms = match u.int_in_range(0..=5u8)? {
            0..=2 => None,
            3 => Some(0),
            _ => Some(u.int_in_range(1..=12)?),
        };
        let metrics = u.ratio(1, 3)?;
        // Every built-in ordering, the default most often.
        let ordering = match u.int_in_range(0..=8u8)? {
            i @ 0..=5 => OrderingKind::ALL[usize::from(i)],
            _ => OrderingKind::Priorities,
        };
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            ops.push(op(u)?);
        }
        Ok(Input {
            cfg: Config {
                starvation_bound_ms,
                metrics,
                ordering,
            },
            ops,
        })
    }
}

fuzz_target!(|input: Input| {
    run(input.cfg, &input.ops);
});
