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
        assert!(store.decide(&k, &spec(3), Cost::hits(1), 0).allowed());
    }
    assert!(!store.decide(&k, &spec(3), Cost::hits(1), 0).allowed());
    let v = store.inspect(&k, 0).unwrap();
    assert_eq!((v.hits, v.refusals, v.remaining), (4, 1, 0));
}

#[test]
fn peeks_and_deny_all_never_store() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    store.decide(&k, &spec(3), Cost::hits(0), 0);
    store.decide(&k, &spec(0), Cost::hits(1), 0);
    assert!(store.is_empty());
}

#[test]
fn sweep_forgets_only_fresh_states() {
    let store = Store::new(10);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    store.decide(&a, &spec(10), Cost::hits(1), 0);
    store.decide(&b, &spec(10), Cost::hits(10), 0);
    // 1 token refills in 6 s, 10 in 60 s.
    assert_eq!(store.sweep(6 * S - 1), 0);
    assert_eq!(store.sweep(6 * S), 1);
    assert!(store.inspect(&a, 6 * S).is_none());
    assert_eq!(store.sweep(60 * S), 1);
    assert!(store.is_empty());
    assert_eq!(store.stats().expired.load(Ordering::Relaxed), 2);
}

#[test]
fn a_reset_key_is_remembered_though_its_state_is_fresh() {
    use crate::store::entry::RESET_MEMORY;
    let store = Store::new(10);
    let a = key::encode("n", "a");
    store.decide(&a, &spec(10), Cost::hits(10), 0);
    assert_eq!(store.reset(&a, S, None), Ok(true));
    // Fresh again, but the reset generation must outlive the reports and
    // replicas from before it: the sweeper keeps it.
    assert_eq!(store.sweep(2 * S), 0);
    assert_eq!(store.inspect(&a, 2 * S).unwrap().reset_gen, 1);
    assert_eq!(store.sweep(S + RESET_MEMORY - 1), 0);
    assert_eq!(store.sweep(S + RESET_MEMORY), 1);
}

/// Issue 39, item 8: a key reset moments ago is as fresh as a key can be,
/// yet it must not be evicted first — its reset generation is what keeps
/// copies from before the reset away.
#[test]
fn a_freshly_reset_key_is_not_evicted_first() {
    let store = Store::new(3);
    let keys: Vec<_> = (0..4).map(|i| key::encode("n", &i.to_string())).collect();
    store.decide(&keys[0], &spec(10), Cost::hits(10), 0);
    assert_eq!(store.reset(&keys[0], S, None), Ok(true));
    store.decide(&keys[1], &spec(10), Cost::hits(5), S);
    store.decide(&keys[2], &spec(10), Cost::hits(5), S);
    store.decide(&keys[3], &spec(10), Cost::hits(1), 2 * S);
    assert_eq!(store.len(), 3);
    assert_eq!(
        store.inspect(&keys[0], 2 * S).map(|i| i.reset_gen),
        Some(1),
        "the reset key stayed; a half-spent one went"
    );
}

#[test]
fn evicts_the_key_closest_to_fresh_first() {
    let store = Store::new(3);
    let keys: Vec<_> = (0..3).map(|i| key::encode("n", &i.to_string())).collect();
    // Consumption 90%, 10%, 50% of a limit of 10.
    for (k, hits) in keys.iter().zip([9, 1, 5]) {
        store.decide(k, &spec(10), Cost::hits(hits), 0);
    }
    // All referenced once: the hand gives each its second chance, then
    // evicts the least consumed.
    store.decide(&key::encode("n", "new"), &spec(10), Cost::hits(1), 0);
    assert_eq!(store.len(), 3);
    assert!(store.inspect(&keys[1], 0).is_none(), "10% key evicted");
    assert!(store.inspect(&keys[0], 0).is_some());
    assert!(store.inspect(&keys[2], 0).is_some());
    assert_eq!(store.stats().evictions.load(Ordering::Relaxed), 1);
}

/// An eviction says whether the key was still counting (its count is lost)
/// or back to fresh (nothing is): the alert on lost counts reads it.
#[test]
fn an_eviction_says_whether_the_key_was_still_counting() {
    let store = Store::new(1);
    let stats = || {
        let s = store.stats();
        (
            s.evictions.load(Ordering::Relaxed),
            s.evictions_counting.load(Ordering::Relaxed),
        )
    };
    // 1 of 10 spent; a token refills in 6 s.
    store.decide(&key::encode("n", "a"), &spec(10), Cost::hits(1), 0);
    store.decide(&key::encode("n", "b"), &spec(10), Cost::hits(1), S);
    assert_eq!(stats(), (1, 1), "a had not refilled: counting");
    store.decide(&key::encode("n", "c"), &spec(10), Cost::hits(1), 100 * S);
    assert_eq!(stats(), (2, 1), "b was back to fresh");
}

#[test]
fn a_cohort_of_warm_neighbours_outlives_a_flood_of_fresh_keys() {
    // 100 half-used keys inserted together, then 10,000 new keys at 10%
    // into a table of 1,000: the hand meets the cohort as neighbours,
    // yet evicts only flood keys.
    let store = Store::new(1_000);
    let warm: Vec<_> = (0..100).map(|i| key::encode("w", &i.to_string())).collect();
    for k in &warm {
        store.decide(k, &spec(10), Cost::hits(5), 0);
    }
    for i in 0..10_000 {
        store.decide(
            &key::encode("f", &i.to_string()),
            &spec(10),
            Cost::hits(1),
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
        store.decide(&a, &spec(100), Cost::hits(1), 0);
    }
    for _ in 0..3 {
        store.decide(&b, &spec(1), Cost::hits(1), 0);
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
    elsewhere.decide(&k, &spec(5), Cost::hits(2), 0);
    let theirs = elsewhere.snapshot(&k).unwrap();

    store.merge(&k, theirs.clone(), 0, Holding::Copy, None);
    assert!(!store.holds_own(&k), "a replica is a copy");
    store.decide(&k, &spec(5), Cost::hits(1), 0);
    assert!(store.holds_own(&k), "counted here as owner");
    store.merge(&k, theirs.clone(), 0, Holding::Copy, None);
    assert!(store.holds_own(&k), "a copy merged in leaves it owned");

    let (snap, was_own) = store.take(&k).unwrap();
    assert!(was_own);
    assert!(!store.holds_own(&k), "passed on: a copy in the same step");
    assert_eq!(
        snap,
        store.snapshot(&k).unwrap(),
        "the snapshot is the state"
    );
    assert!(!store.take(&k).unwrap().1, "taken again: it was a copy");
    store.merge(&k, theirs, 0, Holding::Owned, None);
    assert!(store.holds_own(&k), "handed back as a count");
    assert_eq!(
        store.inspect(&k, 0).unwrap().remaining,
        2,
        "one lineage: max(2, 3) consumed"
    );
    store.mark_all_copies();
    assert!(!store.holds_own(&k), "a rejoining node keeps only copies");
}

#[test]
fn a_newer_reset_merged_into_a_copy_leaves_it_a_copy() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    let owner = Store::new(10);
    owner.decide(&k, &spec(5), Cost::hits(4), 0);
    store.merge(&k, owner.snapshot(&k).unwrap(), 0, Holding::Copy, None);
    owner.reset(&k, 0, None).unwrap();
    store.merge(&k, owner.snapshot(&k).unwrap(), 0, Holding::Copy, None);
    assert!(
        !store.holds_own(&k),
        "the reset's state is still a copy here"
    );
    assert_eq!(store.inspect(&k, 0).unwrap().reset_gen, 1);
    assert_eq!(store.inspect(&k, 0).unwrap().remaining, 5);
}

fn view(v: u64) -> Option<Fence<'static>> {
    Some(Fence {
        view: v,
        present: &|| true,
    })
}

#[test]
fn the_fence_refuses_what_was_routed_under_an_older_view() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    let new = key::encode("n", "new");
    store.set_fence(1);
    let d = store.decide_fenced(&k, &spec(5), Cost::hits(1), 0, Seed::Fresh, view(1));
    assert!(d.unwrap().allowed());
    store.set_fence(2);
    for key in [&k, &new] {
        assert_eq!(
            store.decide_fenced(key, &spec(5), Cost::hits(1), 0, Seed::Fresh, view(1)),
            Err(Stale),
            "routed under view 1"
        );
    }
    assert!(!store.contains(&new), "nothing created by a stale decision");
    assert_eq!(
        store.inspect(&k, 0).unwrap().remaining,
        4,
        "nothing consumed"
    );
    let report = Report {
        edge: "e",
        seq: 1,
        hits: 2,
        at: 0,
        reset_gen: Some(0),
    };
    assert_eq!(
        store.absorb_report(&new, &spec(5), &report, view(1)),
        Err(Stale)
    );
    assert!(!store.contains(&new), "nothing created by a stale report");
    assert_eq!(
        store.absorb_report(&k, &spec(5), &report, view(2)),
        Ok(Absorbed::Applied)
    );
    assert_eq!(
        store.absorb_report(&k, &spec(5), &report, view(2)),
        Ok(Absorbed::Duplicate { applied: 1 })
    );
    assert_eq!(store.inspect(&k, 0).unwrap().remaining, 2);
    // A node that may have been away decides nothing, whatever its view.
    let away = Some(Fence {
        view: 2,
        present: &|| false,
    });
    assert_eq!(
        store.decide_fenced(&k, &spec(5), Cost::hits(1), 0, Seed::Fresh, away),
        Err(Stale)
    );
    assert_eq!(store.inspect(&k, 0).unwrap().remaining, 2);
}

#[test]
fn an_owned_merge_under_an_older_view_is_a_copy() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    let elsewhere = Store::new(10);
    elsewhere.decide(&k, &spec(5), Cost::hits(2), 0);
    store.set_fence(2);
    store.merge(
        &k,
        elsewhere.snapshot(&k).unwrap(),
        0,
        Holding::Owned,
        view(1),
    );
    assert!(!store.holds_own(&k), "the view changed meanwhile: a copy");
    store.merge(
        &k,
        elsewhere.snapshot(&k).unwrap(),
        0,
        Holding::Owned,
        view(2),
    );
    assert!(store.holds_own(&k));
}

#[test]
fn a_report_from_before_a_reset_is_dropped() {
    let store = Store::new(10);
    let k = key::encode("n", "k");
    store.decide(&k, &spec(5), Cost::hits(1), 0);
    store.reset(&k, 0, None).unwrap();
    let before = Report {
        edge: "e",
        seq: 1,
        hits: 3,
        at: 0,
        reset_gen: Some(0),
    };
    assert_eq!(
        store.absorb_report(&k, &spec(5), &before, None),
        Ok(Absorbed::BeforeReset)
    );
    assert_eq!(store.inspect(&k, 0).unwrap().remaining, 5);
    let after = Report {
        seq: 2,
        reset_gen: Some(1),
        ..before
    };
    assert_eq!(
        store.absorb_report(&k, &spec(5), &after, None),
        Ok(Absorbed::Applied)
    );
    assert_eq!(store.inspect(&k, 0).unwrap().remaining, 2);
}

#[test]
fn an_observed_answer_never_forgets_unreported_spending() {
    // An edge's lease view: it spent 6 of 10 locally (unreported); the
    // owner then answers with 8 left (it has not heard of those 6).
    let seen = Store::new(10);
    let k = key::encode("n", "k");
    seen.observe(&k, &spec(10), 10, 0, 0, 0);
    seen.decide(&k, &spec(10), Cost::hits(6), 0);
    seen.observe(&k, &spec(10), 8, 0, 0, 0);
    assert_eq!(seen.remaining(&k, 0).unwrap().1, 4, "more consumed wins");
    // A newer reset generation replaces it.
    seen.observe(&k, &spec(10), 9, 1, 0, 0);
    assert_eq!(seen.remaining(&k, 0).unwrap().1, 9);
    seen.observe(&k, &spec(10), 10, 0, 0, 0);
    assert_eq!(
        seen.remaining(&k, 0).unwrap().1,
        9,
        "an older generation is ignored"
    );
}

#[test]
fn the_store_reports_its_own_series() {
    use prometheus_client::registry::Registry;
    let store = std::sync::Arc::new(Store::new(10));
    store.decide(&key::encode("n", "a"), &spec(10), Cost::hits(1), 0);
    let store_bytes = store.memory_used();
    assert_eq!(store_bytes, store.recount_memory());
    assert!(store_bytes > std::mem::size_of::<Entry>(), "{store_bytes}");
    let mut registry = Registry::default();
    registry.register_collector(Box::new(crate::store::StoreCollector(store)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("sluice_keys 1"), "{text}");
    assert!(text.contains("sluice_evictions_total 0"), "{text}");
    assert!(text.contains("sluice_memory_evictions_total 0"), "{text}");
    assert!(
        text.contains(&format!("sluice_memory_bytes {}", store_bytes)),
        "{text}"
    );
}

#[test]
fn an_entry_stays_small() {
    // The table holds one entry per key and runs half empty past each
    // power of two: every byte here is about two per key (issue 21).
    assert_eq!(size_of::<crate::algorithm::State>(), 32);
    assert_eq!(size_of::<Entry>(), 88);
    // A slot (the entry and a key of up to 46 bytes inline) and the
    // index's slot number and control byte: the sizing figure of docs/src/benchmarks.md.
    assert_eq!(crate::store::INLINE_BYTES, 141);
}

#[test]
fn the_queue_mark_is_taken_past_once_every_change_before_it_was_taken() {
    let store = Store::new(100);
    store.set_replicating(true);
    let spec = spec(10);
    for k in [&b"a"[..], b"b", b"c"] {
        store.decide(k, &spec, Cost::hits(1), S);
    }
    let mark = store.queue_mark();
    assert_eq!(mark, 3);
    store.decide(b"d", &spec, Cost::hits(1), S);
    assert_eq!(store.take_changed(2).states.len(), 2);
    assert!(!store.taken_past(mark), "c waits");
    // A change to a key already waiting queues nothing new.
    store.decide(b"c", &spec, Cost::hits(1), 2 * S);
    assert_eq!(store.queue_mark(), 4);
    assert_eq!(store.take_changed(1).states.len(), 1);
    assert!(store.taken_past(mark));
    // Taken and queued again (a failed push): after the mark now.
    let taken = store.take_changed(10);
    store.requeue(
        taken.states.into_iter().map(|(k, _)| k),
        tokio::time::Instant::now(),
    );
    assert_eq!(store.queue_mark(), 5);
    assert!(!store.taken_past(store.queue_mark()));
}

/// A push fails while its key changed again (queued anew, stamped later):
/// the lag still counts from the failed push's oldest change until that
/// key is taken again — in the queue's oldest, and in the round that
/// takes it (simulator seed 504 of `--mix any`).
#[test]
fn a_failed_push_keeps_its_oldest_change_for_a_key_queued_again_meanwhile() {
    use tokio::time::{Duration, Instant};
    let store = Store::new(100);
    store.set_replicating(true);
    let spec = spec(10);
    store.decide(b"a", &spec, Cost::hits(1), S);
    let pushed = store.take_changed(10);
    // Its change, as old as a push that kept failing makes it.
    let first = Instant::now().checked_sub(Duration::from_secs(3)).unwrap();
    // Changed again while the push was out: queued, stamped now.
    store.decide(b"a", &spec, Cost::hits(1), 2 * S);
    store.decide(b"b", &spec, Cost::hits(1), 2 * S);
    assert!(store.oldest_changed().unwrap() > first);
    // The push failed: `a` is queued already and keeps its place.
    store.requeue(pushed.states.into_iter().map(|(k, _)| k), first);
    assert_eq!(store.changed_len(), 2);
    assert_eq!(store.oldest_changed(), Some(first), "not the newer stamp");
    let retry = store.take_changed(1);
    assert_eq!(retry.oldest, Some(first), "a round before the mark");
    assert_eq!(store.oldest_changed(), Some(first), "b not taken yet");
    let rest = store.take_changed(10);
    assert_eq!(rest.oldest, Some(first));
    // Taken past: the stamp is gone with its keys.
    assert_eq!(store.oldest_changed(), None);
    store.decide(b"c", &spec, Cost::hits(1), 3 * S);
    assert!(store.oldest_changed().unwrap() > first);
}

/// A key a failed push returned goes to the queue's back, behind changes
/// made while the push was out: the lag counts from its change, not the
/// front's, and the round that takes the two says so (a cold review:
/// reading the front, a second failed round lost the first one's stamp).
#[test]
fn a_failed_push_returned_to_the_back_keeps_its_stamp() {
    use tokio::time::{Duration, Instant};
    let store = Store::new(100);
    store.set_replicating(true);
    let spec = spec(10);
    store.decide(b"k", &spec, Cost::hits(1), S);
    let pushed = store.take_changed(10);
    let first = Instant::now().checked_sub(Duration::from_secs(3)).unwrap();
    store.decide(b"x", &spec, Cost::hits(1), 2 * S);
    store.requeue(pushed.states.into_iter().map(|(k, _)| k), first);
    assert_eq!(store.oldest_changed(), Some(first), "k waits behind x");
    let round = store.take_changed(10);
    assert_eq!(round.states.len(), 2);
    assert_eq!(round.oldest, Some(first));
    // That round failed too: its keys back with its oldest, still first.
    store.requeue(
        round.states.into_iter().map(|(k, _)| k),
        round.oldest.unwrap(),
    );
    assert_eq!(store.oldest_changed(), Some(first));
    assert_eq!(store.take_changed(10).oldest, Some(first));
    assert_eq!(
        store.oldest_changed(),
        None,
        "every key taken: nothing held"
    );
    // An empty requeue (a holdings scan's, every round) holds nothing.
    store.requeue(std::iter::empty(), first);
    assert_eq!(store.oldest_changed(), None);
    store.decide(b"y", &spec, Cost::hits(1), 3 * S);
    assert!(store.take_changed(10).oldest.unwrap() > first);
}
