//! The top-key rankings: exact whenever counts are further apart than the
//! update granularity, bounded, and never showing a key the store dropped.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::{GRANULARITY, TopKeys};
use crate::algorithm::{Algorithm, Cost, Period, Spec};
use crate::store::{Store, TopBy, key};

/// Feed `order` (key indexes, one hit each) to a ranking of `k`; the keys
/// it reports, ranked by their exact counts as `Store::top` ranks them.
fn reported(k: usize, keys: usize, order: &[usize]) -> (Vec<usize>, usize) {
    let top = TopKeys::new(k);
    let names: Vec<Arc<[u8]>> = (0..keys)
        .map(|i| Arc::from(format!("k{i}").into_bytes()))
        .collect();
    let mut counts = vec![0u64; keys];
    for &i in order {
        let before = (counts[i], 0);
        counts[i] += 1;
        let after = (counts[i], 0);
        if top.due(before, after) {
            top.record(&names[i], before, after);
        }
    }
    let by_name: HashMap<_, _> = names.iter().cloned().zip(0..).collect();
    let candidates = top.candidates(TopBy::Hits);
    let held = candidates.len();
    let mut ranked: Vec<usize> = candidates.iter().map(|(n, _)| by_name[n]).collect();
    ranked.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
    ranked.truncate(k);
    (ranked, held)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Counts more than the granularity apart, hits arriving in any
    /// interleaving: the reported top k is the exact top k.
    #[test]
    fn top_k_is_exact_when_counts_are_apart(
        k in 1usize..6,
        gaps in proptest::collection::vec(GRANULARITY + 1..GRANULARITY + 40, 4..16),
        seed in any::<u64>(),
    ) {
        let counts: Vec<u64> = gaps.iter().scan(0, |c, g| { *c += g; Some(*c) }).collect();
        let mut order: Vec<usize> = counts
            .iter()
            .enumerate()
            .flat_map(|(i, &c)| std::iter::repeat_n(i, c as usize))
            .collect();
        // A deterministic shuffle from the seed (xorshift).
        let mut x = seed | 1;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (got, held) = reported(k, counts.len(), &order);
        let mut exact: Vec<usize> = (0..counts.len()).collect();
        exact.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
        exact.truncate(k);
        prop_assert_eq!(got, exact);
        prop_assert!(held <= 2 * k, "bounded: {} candidates", held);
    }
}

fn spec(limit: u64) -> Spec {
    Spec::new(
        Algorithm::TokenBucket,
        limit,
        Period::Duration(60_000_000_000),
        None,
    )
    .unwrap()
}

#[test]
fn a_removed_key_leaves_the_top() {
    let store = Store::new(10);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    for _ in 0..3 {
        store.decide(&a, &spec(1), Cost::hits(1), 0);
        store.decide(&b, &spec(1), Cost::hits(1), 0);
    }
    assert_eq!(store.top(TopBy::Refusals, 10, 0).len(), 2);
    store.remove(&a);
    let top = store.top(TopBy::Refusals, 10, 0);
    assert_eq!(top.len(), 1);
    assert_eq!(&*top[0].0, &b[..]);
    assert!(store.top.candidates(TopBy::Refusals).len() == 1);
}

#[test]
fn an_evicted_key_leaves_the_top_and_the_floor_holds_out_small_keys() {
    // Two keys fit; a third evicts one.
    let store = Store::new(2);
    let (a, b, c) = (
        key::encode("n", "a"),
        key::encode("n", "b"),
        key::encode("n", "c"),
    );
    for _ in 0..5 {
        store.decide(&a, &spec(100), Cost::hits(1), 0);
    }
    store.decide(&b, &spec(100), Cost::hits(1), 0);
    store.decide(&c, &spec(100), Cost::hits(1), 0);
    let top: Vec<_> = store.top(TopBy::Hits, 10, 0);
    assert_eq!(top.len(), 2, "the evicted key is not shown");
    for (k, _) in &top {
        assert!(store.contains(k));
    }
    assert!(store.top.candidates(TopBy::Hits).len() <= 2);
}

#[test]
fn a_key_below_a_full_ranking_costs_no_lock() {
    let top = TopKeys::new(1);
    let (a, b): (Arc<[u8]>, Arc<[u8]>) = (Arc::from(&b"a"[..]), Arc::from(&b"b"[..]));
    top.record(&a, (0, 0), (100, 0));
    top.record(&b, (0, 0), (90, 0));
    // Full (2 candidates), floor 90: a new key at 50 is not due.
    assert!(!top.due((0, 0), (50, 0)));
    // A candidate above the floor is due only across a multiple of 64.
    assert!(!top.due((100, 0), (101, 0)));
    assert!(top.due((127, 0), (128, 0)));
}
