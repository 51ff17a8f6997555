//! `Entry::footprint` against what the allocator really hands out.
//!
//! A counting global allocator (bytes allocated minus bytes freed, by the
//! layouts the program asks for) measures what inserting keys into a
//! `Store` costs, and the store's running total of footprints must be
//! within 10% of it — for every algorithm, for sliding logs with many
//! entries, and for keys with lease-report slots.
//!
//! What is excluded, and why: the table's slots. The table allocates them
//! in bulk, with spare capacity (its index doubles at 7/8 full, its slot
//! array by doubling), so per key it is not a measurable allocation. The
//! per-key measure is therefore taken on a store pre-sized for the keys
//! (`Store::presized`: the table allocates nothing while it fills) and
//! compared with the footprints less `INLINE_BYTES` (a slot with its key
//! inline, and the index's slot number: `size_of` figures). Short keys
//! then cost nothing more, and the measure says so; long keys are boxed,
//! and are measured too. The spec each case uses is shared before the
//! measure starts (a shared spec belongs to no key). The sliding-log case is also measured whole — table growth
//! included — where the logs dominate and the table's slack is within the
//! tolerance.
//!
//! Only the measuring thread's allocations are counted (a per-thread
//! counter). A process-wide counter also caught the test harness: libtest's
//! main thread records the running test (a map entry, a timeout queue —
//! ~900 bytes) after spawning its thread, and on a busy machine it got to
//! run in the middle of a measure (CI: "LeakyBucket: footprints 0 B,
//! measured 900 B"). The store allocates only on the deciding thread, so
//! the thread's own count is the whole of what it costs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice::algorithm::{Algorithm, Cost, Period, Spec};
use sluice::store::{INLINE_BYTES, Report, Store, key};

struct Counting;

thread_local! {
    /// Bytes this thread allocated less bytes it freed. Const-initialised
    /// and without a destructor: reading it never allocates (the allocator
    /// may not), and it stays readable while a thread exits.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    // `try_with` only fails for a thread-local being destroyed; this one
    // has no destructor, but an allocator must not panic either way.
    let _ = LIVE.try_with(|live| live.set(live.get() + bytes));
}

// SAFETY: every call is passed to `System` unchanged; only a thread-local
// counter is updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const S: u64 = 1_000_000_000;
const KEYS: usize = 2_000;

fn spec(algorithm: Algorithm, limit: u64) -> Spec {
    Spec::new(algorithm, limit, Period::Duration(60 * S), None).unwrap()
}

/// Bytes this thread allocated (less freed) while `f` runs.
fn growth(f: impl FnOnce()) -> isize {
    let before = LIVE.with(Cell::get);
    f();
    LIVE.with(Cell::get) - before
}

fn assert_within_10pct(what: &str, footprints: usize, measured: isize) {
    let (f, m) = (footprints as f64, measured as f64);
    println!("{what}: footprints {footprints} B, measured {measured} B");
    assert!(
        (f - m).abs() <= 0.10 * m,
        "{what}: footprints {footprints} B vs measured {measured} B"
    );
}

/// `KEYS` keys, each given `hits` decisions one nanosecond apart (and
/// reports from `edges` edges), into a pre-sized store: the heap bytes
/// measured against the footprints less their inline part.
fn per_key_heap(what: &str, spec: Spec, hits: u64, edges: &[&str], key_len: usize) {
    // Unranked: the top-key rankings hold their own copies of at most
    // 2 × 200 keys — a bound per store, not a cost per key.
    let store = Store::presized(usize::MAX, usize::MAX, 2 * KEYS).unranked();
    // Held to the end: the spec's shared copy is made before the measure.
    let shares_the_spec = Store::new(1);
    shares_the_spec.decide(b"warm", &spec, Cost::hits(1), 0);
    // Encoded before measuring: the caller's key buffers are not the store's.
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| key::encode(what, &format!("key-{i:0>key_len$}")))
        .collect();
    let measured = growth(|| {
        for k in &keys {
            for t in 1..=hits {
                assert!(store.decide(k, &spec, Cost::hits(1), t).allowed());
            }
            for (seq, &edge) in edges.iter().enumerate() {
                let report = Report {
                    edge,
                    seq: seq as u64 + 1,
                    hits: 1,
                    at: hits + 1,
                    reset_gen: None,
                };
                store.absorb_report(k, &spec, &report, None).unwrap();
            }
        }
    });
    assert_eq!(store.len(), KEYS);
    assert_eq!(store.memory_used(), store.recount_memory());
    let heap = store.memory_used() - KEYS * INLINE_BYTES;
    assert_within_10pct(what, heap, measured);
}

#[test]
fn footprints_match_what_the_allocator_hands_out() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ] {
        per_key_heap(&format!("{algorithm:?}"), spec(algorithm, 100), 3, &[], 6);
    }
    // Logs of 1,000 entries (a 1,024-slot queue each).
    per_key_heap(
        "log-1000",
        spec(Algorithm::SlidingWindowLog, 5_000),
        1_000,
        &[],
        6,
    );
    // Keys too long for their slot, each in a box of its own.
    per_key_heap("long", spec(Algorithm::Gcra, 100), 1, &[], 80);
    // Report slots: a boxed Vec of (edge id, seq) and an `Arc<str>` per edge.
    per_key_heap(
        "reports",
        spec(Algorithm::TokenBucket, 100),
        1,
        &["edge-node-a", "edge-node-b", "edge-node-c"],
        6,
    );

    // Whole, table growth included: 300 logs of 2,000 entries.
    let keys: Vec<Vec<u8>> = (0..300)
        .map(|i| key::encode("whole", &format!("key-{i:06}")))
        .collect();
    let log = spec(Algorithm::SlidingWindowLog, 5_000);
    let mut store = None;
    let measured = growth(|| {
        let s = Store::bounded(usize::MAX, usize::MAX);
        for k in &keys {
            for t in 1..=2_000 {
                s.decide(k, &log, Cost::hits(1), t);
            }
        }
        store = Some(s);
    });
    let store = store.unwrap();
    assert_eq!(store.memory_used(), store.recount_memory());
    assert_within_10pct("whole store of logs", store.memory_used(), measured);
}
