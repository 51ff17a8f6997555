//! Nanoseconds per decision for each algorithm, with the key's state hot in
//! cache: one key, the clock advancing 1 µs per decision, a limit high enough
//! that most requests are admitted (the common case), and a second run where
//! every request is refused (the retry-after path).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice::algorithm::{Algorithm, Cost, Limited, Period, Spec};

const BASE: u64 = 1_700_000_000_000_000_000;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for algorithm in Algorithm::ALL {
        // 1,000 per second at 1 decision per µs: after the first 1,000,
        // nearly every decision is refused; 10⁹/s admits every decision.
        for (label, limit, duration) in [
            ("admit", 1_000_000_000u64, 1_000_000_000u64),
            ("refuse", 1_000, 1_000_000_000),
        ] {
            // The log's limit is bounded (10,000 entries): admit 5,000 per
            // 5 ms instead, so its steady state holds 5,000 live entries.
            let (limit, duration) = match (algorithm, label) {
                (Algorithm::SlidingWindowLog, "admit") => (10_000, 5_000_000),
                _ => (limit, duration),
            };
            let spec = Spec::new(algorithm, limit, Period::Duration(duration), None).unwrap();
            let mut key = Limited::new(spec, BASE);
            let mut now = BASE;
            let req = Cost::hits(1);
            group.bench_function(format!("{}/{label}", algorithm.name()), |b| {
                b.iter(|| {
                    now += 1_000;
                    black_box(key.decide(black_box(&spec), req, now))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
