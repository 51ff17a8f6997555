//! The sliding window counter against the exact sliding log on the same
//! traffic: the error under even traffic (measured and bounded) and the
//! adversarial worst case (documented in `sliding_window.rs`).
//!
//! Run with `--nocapture` to see the measured figures.

use sluice::algorithm::{Algorithm, Cost, Limited, Period, Spec};

const S: u64 = 1_000_000_000;
const BASE: u64 = 1_700_000_000 * S;

/// splitmix64: a small deterministic generator, so the figures are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

struct Outcome {
    counter: u64,
    log: u64,
    disagreements: u64,
    requests: u64,
}

/// Offer `load × limit` requests per duration, evenly spaced with ±50%
/// jitter, for `windows` durations, to a counter and a log side by side.
fn even(limit: u64, load_pct: u64, windows: u64, seed: u64) -> Outcome {
    let d = 60 * S;
    let counter = Spec::new(
        Algorithm::SlidingWindowCounter,
        limit,
        Period::Duration(d),
        None,
    )
    .unwrap();
    let log = Spec::new(
        Algorithm::SlidingWindowLog,
        limit,
        Period::Duration(d),
        None,
    )
    .unwrap();
    let (mut c, mut l) = (Limited::new(counter, BASE), Limited::new(log, BASE));
    let mut rng = Rng(seed);
    let gap = d * 100 / (limit * load_pct);
    let mut now = BASE;
    let mut out = Outcome {
        counter: 0,
        log: 0,
        disagreements: 0,
        requests: 0,
    };
    while now < BASE + windows * d {
        now += gap / 2 + rng.next() % gap.max(1);
        let a = c.decide(&counter, Cost::hits(1), now).allowed();
        let b = l.decide(&log, Cost::hits(1), now).allowed();
        out.counter += u64::from(a);
        out.log += u64::from(b);
        out.disagreements += u64::from(a != b);
        out.requests += 1;
    }
    out
}

#[test]
fn counter_tracks_the_log_under_even_traffic() {
    println!("load  limit  requests  log-admitted  counter-admitted  error  disagreements");
    for load in [50, 90, 100, 110, 150, 300] {
        for limit in [10, 100, 1_000] {
            let o = even(limit, load, 50, load * 7919 + limit);
            let error = o.counter.abs_diff(o.log) as f64 / o.log as f64;
            let disagree = o.disagreements as f64 / o.requests as f64;
            println!(
                "{load:>3}%  {limit:>5}  {:>8}  {:>12}  {:>16}  {:>5.2}%  {:>5.2}%",
                o.requests,
                o.log,
                o.counter,
                error * 100.0,
                disagree * 100.0
            );
            // Under the limit both admit everything.
            if load <= 50 {
                assert_eq!(o.counter, o.requests);
                assert_eq!(o.log, o.requests);
            }
            // Even traffic: admitted totals within 5% of the exact log.
            // Even traffic: admitted totals within max(1%, 1/limit) of the
            // exact log (at small limits one hit is a large fraction).
            let bound = (1.0 / limit as f64).max(0.01);
            assert!(
                error <= bound,
                "load {load}% limit {limit}: error {error} > {bound}"
            );
        }
    }
}

/// The previous window's hits all at its very end: the counter believes they
/// are sliding out while they are all still inside the sliding duration.
#[test]
fn adversarial_burst_at_window_end_is_bounded_by_twice_the_limit() {
    let d = 60 * S;
    let limit = 100;
    let counter = Spec::new(
        Algorithm::SlidingWindowCounter,
        limit,
        Period::Duration(d),
        None,
    )
    .unwrap();
    let log = Spec::new(
        Algorithm::SlidingWindowLog,
        limit,
        Period::Duration(d),
        None,
    )
    .unwrap();
    let start = BASE - BASE % d + d;
    let (mut c, mut l) = (Limited::new(counter, start), Limited::new(log, start));
    // `limit` hits one nanosecond before the next window starts...
    let burst_at = start + d - 1;
    let mut in_span = (0, 0);
    for _ in 0..limit {
        in_span.0 += u64::from(c.decide(&counter, Cost::hits(1), burst_at).allowed());
        in_span.1 += u64::from(l.decide(&log, Cost::hits(1), burst_at).allowed());
    }
    // ...then one request per 100 ms until the burst leaves the sliding span.
    let mut now = burst_at;
    while now + S / 10 < burst_at + d {
        now += S / 10;
        in_span.0 += u64::from(c.decide(&counter, Cost::hits(1), now).allowed());
        in_span.1 += u64::from(l.decide(&log, Cost::hits(1), now).allowed());
    }
    println!(
        "one sliding duration: log admitted {}, counter admitted {}",
        in_span.1, in_span.0
    );
    assert_eq!(in_span.1, limit, "the log is exact");
    assert!(in_span.0 > limit, "the counter over-admits in this pattern");
    assert!(in_span.0 < 2 * limit, "but never reaches twice the limit");
}
