//! The store under load: decisions per second for one hot key and for 1M
//! keys, with 1 and 2 threads, and the memory each key costs.
//!
//! Bytes per key are measured with a counting allocator (every byte the
//! store allocates, including the table's own arrays, by capacity) for each
//! algorithm at 1M and 10M keys, and printed before the timings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use sluice::algorithm::{Algorithm, Cost, Period, Spec};
use sluice::store::{Store, key};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new, Ordering::Relaxed);
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BASE: u64 = 1_700_000_000_000_000_000;
const KEYS: usize = 1_000_000;

fn spec(algorithm: Algorithm) -> Spec {
    // High enough that decisions are admitted (the common case); a log's
    // limit is bounded by its entries.
    let limit = match algorithm {
        Algorithm::SlidingWindowLog => 10_000,
        _ => 1_000_000_000,
    };
    Spec::new(algorithm, limit, Period::Duration(1_000_000_000), None).unwrap()
}

/// Typical keys: a 28-byte API-key-like unique_key under a short name
/// (39 bytes encoded: inline in the table's slot).
fn key_bytes(i: usize) -> Vec<u8> {
    key::encode("api", &format!("key-{i:024}"))
}

/// A key too long for the slot (52 bytes encoded): kept in a box.
fn long_key_bytes(i: usize) -> Vec<u8> {
    key::encode("requests_per_key", &format!("key-{i:024}"))
}

fn filled(algorithm: Algorithm, keys: usize, key: fn(usize) -> Vec<u8>) -> Store {
    let store = Store::new(keys);
    let s = spec(algorithm);
    for i in 0..keys {
        store.decide(&key(i), &s, Cost::hits(1), BASE);
    }
    store
}

/// Bytes allocated per key by a store filled with `keys` keys.
fn measure(algorithm: Algorithm, keys: usize, key: fn(usize) -> Vec<u8>) -> usize {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let store = filled(algorithm, keys, key);
    let after = ALLOCATED.load(Ordering::Relaxed);
    (after - before) / store.len()
}

fn bytes_per_key() {
    println!("bytes per key (28-byte unique keys, 39 bytes encoded):");
    println!("| algorithm | 1M keys | 10M keys |");
    println!("|---|---|---|");
    for algorithm in Algorithm::ALL {
        println!(
            "| {} | {} | {} |",
            algorithm.name(),
            measure(algorithm, KEYS, key_bytes),
            measure(algorithm, 10 * KEYS, key_bytes)
        );
    }
    println!(
        "token_bucket, 52-byte encoded keys (boxed), 1M keys: {}",
        measure(Algorithm::TokenBucket, KEYS, long_key_bytes)
    );
}

/// `threads` threads each run `iters / threads` decisions over `keys`.
fn run(store: &Arc<Store>, threads: usize, iters: u64, keys: &Arc<Vec<Vec<u8>>>) -> Duration {
    let s = spec(Algorithm::TokenBucket);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (store, keys) = (store.clone(), keys.clone());
            scope.spawn(move || {
                let mut i = t * 7_919;
                let mut now = BASE;
                for _ in 0..iters / threads as u64 {
                    i = (i + 104_729) % keys.len();
                    now += 1_000;
                    black_box(store.decide(&keys[i], &s, Cost::hits(1), now));
                }
            });
        }
    });
    started.elapsed()
}

fn main() {
    bytes_per_key();
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("store");
    group.throughput(Throughput::Elements(1));
    let hot = Arc::new(Store::new(KEYS));
    let hot_keys = Arc::new(vec![key_bytes(0)]);
    let many = Arc::new(filled(Algorithm::TokenBucket, KEYS, key_bytes));
    let many_keys = Arc::new((0..KEYS).map(key_bytes).collect::<Vec<_>>());
    for threads in [1, 2] {
        group.bench_function(format!("hot_key/{threads}_threads"), |b| {
            b.iter_custom(|iters| run(&hot, threads, iters, &hot_keys))
        });
        group.bench_function(format!("1M_keys/{threads}_threads"), |b| {
            b.iter_custom(|iters| run(&many, threads, iters, &many_keys))
        });
    }
    group.finish();
    c.final_summary();
}
