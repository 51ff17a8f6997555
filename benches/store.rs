//! The store under load: decisions per second for one hot key and for 1M
//! keys, with 1 and 2 threads, and the memory each key costs.
//!
//! Bytes per key are measured with a counting allocator (every byte the
//! store allocates, including the map's own tables) and printed before the
//! timings.

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
    // High enough that decisions are admitted (the common case).
    Spec::new(
        algorithm,
        1_000_000_000,
        Period::Duration(1_000_000_000),
        None,
    )
    .unwrap()
}

/// Typical keys: an API-key-like unique_key under one name.
fn key_bytes(i: usize) -> Vec<u8> {
    key::encode("requests_per_key", &format!("key-{i:012}"))
}

fn filled(algorithm: Algorithm) -> Store {
    let store = Store::new(KEYS);
    let s = spec(algorithm);
    for i in 0..KEYS {
        store.decide(&key_bytes(i), &s, Cost::hits(1), BASE);
    }
    store
}

fn bytes_per_key() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ] {
        let before = ALLOCATED.load(Ordering::Relaxed);
        let store = filled(algorithm);
        let after = ALLOCATED.load(Ordering::Relaxed);
        println!(
            "bytes per key at {KEYS} keys ({}, 28-byte unique keys): {}",
            algorithm.name(),
            (after - before) / store.len()
        );
    }
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
    let many = Arc::new(filled(Algorithm::TokenBucket));
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
