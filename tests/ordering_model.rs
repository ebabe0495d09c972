//! Each built-in ordering against a reference model of its order, with the
//! queue's own guarantees checked around it.
//!
//! The driver (`support/driver.rs`) runs the real queue, with the ordering
//! plugged in, beside the queue model (`support/model.rs`), whose order is
//! the ordering's reference model (`support/order_model.rs`: `Vec`s and
//! rings as `Vec`s, obviously right). After every step it checks that each
//! hand-out is the model's, and everything `tests/model.rs` checks for the
//! default ordering: de-duplication, one lease per key, delays, requeues,
//! the rate limiter, shutdown and drain, wake-ups, metrics, the starvation
//! bound (half the bound: oldest first, whatever the ordering), and at the
//! end that no key was lost.
//!
//! Two op languages per ordering: the queue model's own (6 keys, delays,
//! rate limits, shutdowns, dropped gets) and a wide one (24 keys, so fair
//! share has several keys per tenant and sub-group, and rings with many
//! members; immediate adds, gets, lease ends). `PROPTEST_CASES` sets the
//! number of cases (256 per test by default).

#[path = "support/strategies.rs"]
mod strategies;
mod support;

use proptest::prelude::*;
use strategies::{cases, config, end_how, narrow_op};
use support::driver::{Config, EndHow, Op, run};
use support::model::Key;
use support::order_model::OrderingKind;

/// Many keys, so that tenants and sub-groups hold several each: immediate
/// adds, gets and lease ends, and the clock (for the starvation bound).
fn wide_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..24 as Key, -1..=1i8).prop_map(|(key, priority)| Op::Add {
            key,
            priority,
            delay_ms: 0,
            rate_limited: false,
        }),
        7 => Just(Op::Get),
        1 => Just(Op::StreamNext),
        5 => (any::<u8>(), end_how()).prop_map(|(lease, how)| Op::End { lease, how }),
        1 => (1..=3u8).prop_map(Op::Advance),
    ]
}

/// The narrow language of `tests/model.rs` and the wide one, for `ordering`.
fn both_languages(ordering: OrderingKind) -> impl Strategy<Value = (Config, Vec<Op>)> {
    let narrow = prop::collection::vec(narrow_op(), 1..120);
    let wide = prop::collection::vec(wide_op(), 1..250);
    (config(ordering), prop_oneof![narrow, wide])
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(256),
        max_shrink_iters: 10_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn priorities_ordering_behaves_as_its_model((cfg, ops) in both_languages(OrderingKind::Priorities)) {
        run(cfg, &ops);
    }

    #[test]
    fn two_lanes_ordering_behaves_as_its_model((cfg, ops) in both_languages(OrderingKind::TwoLanes)) {
        run(cfg, &ops);
    }

    #[test]
    fn fifo_ordering_behaves_as_its_model((cfg, ops) in both_languages(OrderingKind::Fifo)) {
        run(cfg, &ops);
    }

    #[test]
    fn fair_share_ordering_behaves_as_its_model((cfg, ops) in both_languages(OrderingKind::FAIR)) {
        run(cfg, &ops);
    }

    #[test]
    fn weighted_fair_share_ordering_behaves_as_its_model(
        (cfg, ops) in both_languages(OrderingKind::FAIR_WEIGHTED)
    ) {
        run(cfg, &ops);
    }

    #[test]
    fn hierarchical_fair_share_ordering_behaves_as_its_model(
        (cfg, ops) in both_languages(OrderingKind::FAIR_HIERARCHY)
    ) {
        run(cfg, &ops);
    }
}

// Named scenarios: the expected orders written out, so that the reference
// models themselves are pinned to each ordering's claims. Each also runs the
// real queue against the model.

fn add(key: Key, priority: i8) -> Op {
    Op::Add {
        key,
        priority,
        delay_ms: 0,
        rate_limited: false,
    }
}

/// [`strategies::hand_outs`] for `ordering`, with metrics, with or without a
/// starvation bound.
fn hand_outs(ordering: OrderingKind, bound_ms: Option<u8>, ops: &[Op]) -> Vec<(Key, i32)> {
    strategies::hand_outs(
        Config {
            starvation_bound_ms: bound_ms,
            metrics: true,
            ordering,
        },
        ops,
    )
}

fn gets(n: usize) -> impl Iterator<Item = Op> {
    std::iter::repeat_n(Op::Get, n)
}

fn keys(out: &[(Key, i32)]) -> Vec<Key> {
    out.iter().map(|&(k, _)| k).collect()
}

#[test]
fn fifo_ordering_hands_out_in_ready_order_whatever_the_priority() {
    let ops: Vec<Op> = [add(1, -2), add(2, 2), add(3, 0), add(1, 5)]
        .into_iter()
        .chain(gets(3))
        .collect();
    // Key 1 keeps its place when raised, and reports its raised priority.
    assert_eq!(
        hand_outs(OrderingKind::Fifo, None, &ops),
        [(1, 5), (2, 2), (3, 0)]
    );
}

#[test]
fn two_lanes_ordering_is_fifo_within_a_lane_and_moves_keys_only_across_lanes() {
    let ops: Vec<Op> = [
        add(1, -100),
        add(2, 0),
        add(3, -5),
        add(4, 7),  // same lane as 2: behind it, whatever its priority
        add(3, -1), // raised within the slow lane: stays before 5
        add(5, -100),
        add(1, 0), // raised into the fast lane: to its back
    ]
    .into_iter()
    .chain(gets(5))
    .collect();
    assert_eq!(
        hand_outs(OrderingKind::TwoLanes, None, &ops),
        [(2, 0), (4, 7), (1, 0), (3, -1), (5, -100)]
    );
}

#[test]
fn fair_share_ordering_takes_turns_across_tenants_fifo_within_each() {
    // Tenant = key % 3. Tenant 0 floods first (0, 3, 6, 9, 12), then
    // tenants 1 and 2 arrive.
    let ops: Vec<Op> = [0, 3, 6, 9, 12, 1, 4, 2]
        .into_iter()
        .map(|k| add(k, 0))
        .chain(gets(8))
        .collect();
    assert_eq!(
        keys(&hand_outs(OrderingKind::FAIR, None, &ops)),
        [0, 1, 2, 3, 4, 6, 9, 12]
    );
}

#[test]
fn fair_share_ordering_is_within_a_priority_higher_priorities_first() {
    let ops: Vec<Op> = [add(0, 0), add(3, 0), add(1, 0), add(4, 1), add(6, 1)]
        .into_iter()
        .chain(gets(5))
        .collect();
    // Level 1 first (tenant 1's 4, then tenant 0's 6), then level 0 in turns.
    assert_eq!(
        keys(&hand_outs(OrderingKind::FAIR, None, &ops)),
        [4, 6, 0, 1, 3]
    );
}

#[test]
fn fair_share_ordering_gives_a_weighted_tenant_more_per_turn() {
    // Tenant 0 has weight 3 in FAIR_WEIGHTED.
    let ops: Vec<Op> = [0, 3, 6, 9, 12, 1, 4, 7]
        .into_iter()
        .map(|k| add(k, 0))
        .chain(gets(8))
        .collect();
    assert_eq!(
        keys(&hand_outs(OrderingKind::FAIR_WEIGHTED, None, &ops)),
        [0, 3, 6, 1, 9, 12, 4, 7]
    );
}

#[test]
fn fair_share_ordering_takes_turns_across_sub_groups_within_a_tenant() {
    // FAIR_HIERARCHY: tenant = key % 2 (tenant 0 weight 2), sub-group =
    // (key / 2) % 2. Tenant 0: sub-group 0 holds 0, 4, 8; sub-group 1 holds
    // 2, 6. Tenant 1: 1, 3, 5 (sub-groups 0, 1, 0).
    let ops: Vec<Op> = [0, 4, 8, 2, 6, 1, 3, 5]
        .into_iter()
        .map(|k| add(k, 0))
        .chain(gets(8))
        .collect();
    assert_eq!(
        keys(&hand_outs(OrderingKind::FAIR_HIERARCHY, None, &ops)),
        // Tenant 0 (two per turn, its sub-groups alternating), tenant 1
        // (one per turn, its sub-groups alternating), and so on.
        [0, 2, 1, 4, 6, 3, 8, 5]
    );
}

#[test]
fn fair_share_ordering_puts_a_raised_key_at_the_back_of_its_tenant_and_a_re_add_nowhere() {
    let ops: Vec<Op> = [
        add(0, 0),
        add(3, 0),
        add(6, 0),
        add(0, 0), // re-add: keeps its place
        add(3, 1), // raised: alone at level 1
        add(1, 0),
    ]
    .into_iter()
    .chain(gets(5))
    .collect();
    assert_eq!(
        hand_outs(OrderingKind::FAIR, None, &ops),
        [(3, 1), (0, 0), (1, 0), (6, 0)]
    );
}

#[test]
fn fair_share_ordering_forgets_an_emptied_tenant_and_a_returning_one_joins_at_the_back() {
    let ops: Vec<Op> = [
        add(1, 0),
        add(0, 0),
        add(3, 0),
        Op::Get, // 1: tenant 1 empties and leaves the round
        Op::End {
            lease: 0,
            how: EndHow::Done,
        },
        add(2, 0),
        add(4, 0), // tenant 1 again: behind tenant 2
        Op::Get,
        Op::Get,
        Op::Get,
        Op::Get,
    ]
    .to_vec();
    assert_eq!(
        keys(&hand_outs(OrderingKind::FAIR, None, &ops)),
        [1, 0, 2, 4, 3]
    );
}

#[test]
fn every_ordering_yields_to_the_starvation_bound() {
    // Key 1 waits at the lowest priority, behind keys each ordering puts
    // first; once it is half the bound (2 ms) old it goes first, whatever
    // the ordering says.
    for ordering in OrderingKind::ALL {
        let ops = [
            add(2, 2),
            add(1, -2),
            add(5, 2),
            add(8, 2),
            add(11, 2),
            Op::Get,
            Op::Advance(2),
            Op::Get,
            Op::Get,
        ];
        let out = hand_outs(ordering, Some(4), &ops);
        assert_eq!(out[0], (2, 2), "{ordering:?}: {out:?}");
        assert_eq!(out[1], (1, -2), "{ordering:?}: {out:?}");
        // Without the bound, only FIFO hands it out second (it is second in
        // ready order); the others keep it for last.
        let strict = hand_outs(ordering, None, &ops);
        let second = strict[1] == (1, -2);
        let at_all = strict.contains(&(1, -2));
        if ordering == OrderingKind::Fifo {
            assert!(second, "{strict:?}");
        } else {
            assert!(!at_all, "{ordering:?}: {strict:?}");
        }
    }
}
