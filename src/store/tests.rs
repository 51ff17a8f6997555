//! The store's unit tests.
use super::*;
use crate::algorithm::{Algorithm, Period};

const S: u64 = 1_000_000_000;

fn spec(limit: u64) -> Spec {
    Spec::new(
        Algorithm::TokenBucket,
        limit,
        Period::Duration(60 * S),
        None,
    )
    .unwrap()
}

#[test]
fn decides_atomically_per_key_and_counts() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    for _ in 0..3 {
        assert!(store.decide(&k, &spec(3), Request::hits(1), 0).allowed());
    }
    assert!(!store.decide(&k, &spec(3), Request::hits(1), 0).allowed());
    let v = store.inspect(&k, 0).unwrap();
    assert_eq!((v.hits, v.refusals, v.remaining), (4, 1, 0));
}

#[test]
fn peeks_and_deny_all_never_store() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    store.decide(&k, &spec(3), Request::hits(0), 0);
    store.decide(&k, &spec(0), Request::hits(1), 0);
    assert!(store.is_empty());
}

#[test]
fn sweep_forgets_only_fresh_states() {
    let store = Store::new(10);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    store.decide(&a, &spec(10), Request::hits(1), 0);
    store.decide(&b, &spec(10), Request::hits(10), 0);
    // 1 token refills in 6 s, 10 in 60 s.
    assert_eq!(store.sweep(6 * S - 1), 0);
    assert_eq!(store.sweep(6 * S), 1);
    assert!(store.inspect(&a, 6 * S).is_none());
    assert_eq!(store.sweep(60 * S), 1);
    assert!(store.is_empty());
    assert_eq!(store.stats().expired.load(Ordering::Relaxed), 2);
}

#[test]
fn evicts_the_key_closest_to_fresh_first() {
    let store = Store::new(3);
    let keys: Vec<_> = (0..3).map(|i| key::encode("n", &i.to_string())).collect();
    // Consumption 90%, 10%, 50% of a limit of 10.
    for (k, hits) in keys.iter().zip([9, 1, 5]) {
        store.decide(k, &spec(10), Request::hits(hits), 0);
    }
    // All referenced once: the hand gives each its second chance, then
    // evicts the least consumed.
    store.decide(&key::encode("n", "new"), &spec(10), Request::hits(1), 0);
    assert_eq!(store.len(), 3);
    assert!(store.inspect(&keys[1], 0).is_none(), "10% key evicted");
    assert!(store.inspect(&keys[0], 0).is_some());
    assert!(store.inspect(&keys[2], 0).is_some());
    assert_eq!(store.stats().evictions.load(Ordering::Relaxed), 1);
}

#[test]
fn a_cohort_of_warm_neighbours_outlives_a_flood_of_fresh_keys() {
    // 100 half-used keys inserted together, then 10,000 new keys at 10%
    // into a table of 1,000: the hand meets the cohort as neighbours,
    // yet evicts only flood keys.
    let store = Store::new(1_000);
    let warm: Vec<_> = (0..100).map(|i| key::encode("w", &i.to_string())).collect();
    for k in &warm {
        store.decide(k, &spec(10), Request::hits(5), 0);
    }
    for i in 0..10_000 {
        store.decide(
            &key::encode("f", &i.to_string()),
            &spec(10),
            Request::hits(1),
            0,
        );
    }
    assert_eq!(store.len(), 1_000);
    for k in &warm {
        assert!(store.inspect(k, 0).is_some(), "a warm key was evicted");
    }
}

#[test]
fn top_keys_rank_by_hits_and_refusals() {
    let store = Store::new(10);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    for _ in 0..5 {
        store.decide(&a, &spec(100), Request::hits(1), 0);
    }
    for _ in 0..3 {
        store.decide(&b, &spec(1), Request::hits(1), 0);
    }
    let top = store.top(TopBy::Hits, 1, 0);
    assert_eq!(top.len(), 1);
    assert_eq!(&*top[0].0, &a[..]);
    let top = store.top(TopBy::Refusals, 5, 0);
    assert_eq!(top.len(), 1, "a has no refusals");
    assert_eq!(&*top[0].0, &b[..]);
    assert_eq!(top[0].1.refusals, 2);
}

#[test]
fn a_copy_is_not_held_as_own_until_counted_here() {
    let store = Store::new(10);
    store.set_replicating(true);
    let k = key::encode("n", "k");
    let elsewhere = Store::new(10);
    elsewhere.decide(&k, &spec(5), Request::hits(2), 0);
    let theirs = elsewhere.snapshot(&k).unwrap();

    store.merge(&k, theirs.clone(), 0, false);
    assert!(!store.holds_own(&k), "a replica is a copy");
    store.decide(&k, &spec(5), Request::hits(1), 0);
    assert!(store.holds_own(&k), "counted here as owner");

    store.pull(&k, Arc::from("b"), 10);
    assert!(!store.holds_own(&k), "pulled away");
    store.merge(&k, theirs, 0, true);
    assert!(store.holds_own(&k), "handed back");
    assert_eq!(store.moved_to(&k, 0), None);

    let taken = store.take_changed(10);
    store.mark_copies(taken.states.iter().map(|(k, _)| k));
    assert!(!store.holds_own(&k), "handed off");

    store.decide(&k, &spec(5), Request::hits(1), 0);
    let taken = store.take_changed(10);
    store.decide(&k, &spec(5), Request::hits(1), 0);
    store.mark_copies(taken.states.iter().map(|(k, _)| k));
    assert!(
        store.holds_own(&k),
        "changed after its handed-off snapshot: still counted here"
    );
    assert_eq!(
        store.inspect(&k, 0).unwrap().remaining,
        0,
        "one lineage: 2 + 3"
    );
}
