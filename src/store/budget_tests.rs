//! The byte budget's unit tests: the running total stays within
//! `max_memory` and equal to a recount, through growth, shrinking,
//! eviction, merges and removal.
use std::sync::atomic::Ordering;

use super::super::{Holding, Store, key};
use crate::algorithm::{Algorithm, Cost, Period, Spec};

const S: u64 = 1_000_000_000;

fn log(limit: u64) -> Spec {
    Spec::new(
        Algorithm::SlidingWindowLog,
        limit,
        Period::Duration(60 * S),
        None,
    )
    .unwrap()
}

/// The total is what a scan recomputes, and within the bound.
fn assert_true_and_bounded(store: &Store, when: &str) {
    let (used, recount) = (store.memory_used(), store.recount_memory());
    assert_eq!(used, recount, "{when}: running total vs recount");
    assert!(
        used <= store.max_memory(),
        "{when}: {used} bytes over the budget of {}",
        store.max_memory()
    );
}

#[test]
fn sliding_logs_are_evicted_to_stay_within_the_byte_budget() {
    // 40 keys of 500 logged hits each (a 512-slot queue, 8 KiB) need
    // ~330 KB; the budget is 100 KB and the key cap far away.
    let budget = 100_000;
    let store = Store::bounded(1_000_000, budget);
    let spec = log(1_000);
    let mut t = 0;
    for k in 0..40 {
        let key = key::encode("log", &k.to_string());
        for _ in 0..500 {
            t += 1; // one nanosecond apart: one log entry per hit
            assert!(store.decide(&key, &spec, Cost::hits(1), t).allowed());
            assert_true_and_bounded(&store, &format!("key {k} at {t}"));
        }
    }
    let evictions = store.stats().evictions.load(Ordering::Relaxed);
    assert!(evictions >= 25, "evicted {evictions} keys");
    assert_eq!(
        store.stats().memory_evictions.load(Ordering::Relaxed),
        evictions,
        "every eviction was for bytes (40 keys are far under max_keys)"
    );
    // What was evicted is what the key cap would evict: the keys closest
    // to fresh. The first ten filled the budget at 50% used each and all
    // stay; each later key was evicted while it grew (fresher than them).
    for k in 0..10 {
        let v = store.inspect(&key::encode("log", &k.to_string()), t);
        assert_eq!(v.map(|v| v.hits), Some(500), "key {k} kept whole");
    }
    assert!(store.len() <= 14, "{} keys", store.len());
}

#[test]
fn a_log_that_empties_gives_its_bytes_back() {
    let store = Store::bounded(1_000, 10_000_000);
    let spec = log(10_000);
    let key = key::encode("log", "k");
    for t in 1..=4_000 {
        store.decide(&key, &spec, Cost::hits(1), t);
    }
    let full = store.memory_used();
    assert!(full > 4_000 * 16, "{full} bytes for 4,000 entries");
    // A window later every entry has expired: the next hit prunes them
    // all and the queue shrinks (halved per decision while a quarter full).
    let later = 60 * S + 4_000;
    for i in 0..8 {
        store.decide(&key, &spec, Cost::hits(1), later + i);
        assert_true_and_bounded(&store, &format!("decision {i} after the window"));
    }
    assert!(
        store.memory_used() < full / 16,
        "{} bytes after emptying, {full} full",
        store.memory_used()
    );
}

#[test]
fn merged_copies_and_removals_are_counted() {
    let budget = 200_000;
    let source = Store::bounded(1_000, usize::MAX);
    let spec = log(2_000);
    let mut snapshots = Vec::new();
    for k in 0..20 {
        let key = key::encode("log", &k.to_string());
        for t in 1..=1_500 {
            source.decide(&key, &spec, Cost::hits(1), t);
        }
        snapshots.push((key.clone(), source.snapshot(&key).unwrap()));
    }
    // Replicas arriving at a node with a small budget: entries too.
    let replica = Store::bounded(1_000, budget);
    for (key, snap) in &snapshots {
        replica.merge(key, snap.clone(), 2_000, Holding::Copy, None);
        assert_true_and_bounded(&replica, "after a merge");
        // Merging again changes nothing.
        replica.merge(key, snap.clone(), 2_000, Holding::Copy, None);
        assert_true_and_bounded(&replica, "after a repeated merge");
    }
    assert!(replica.stats().memory_evictions.load(Ordering::Relaxed) > 0);
    for (key, _) in &snapshots {
        replica.remove(key);
    }
    assert_eq!(replica.memory_used(), 0, "every byte given back");
    assert!(replica.is_empty());
    // The sweep gives bytes back too.
    assert!(source.memory_used() > 20 * 1_500 * 16);
    assert_eq!(source.sweep(120 * S), 20);
    assert_eq!(source.memory_used(), 0);
}
