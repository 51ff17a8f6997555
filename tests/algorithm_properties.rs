//! Properties every algorithm must keep, on generated traffic: GCRA equals
//! the token bucket, admissions stay within what the algorithm allows, merge
//! is a join, absorb equals deciding, a clock stepping back never refunds,
//! an algorithm change keeps consumption, and extreme inputs never panic.

mod reference;

use proptest::prelude::*;
use reference::traffic::{self, BASE, Op, Params};
use reference::{MPeriod, q};
use sluice::algorithm::{
    Algorithm, CalendarUnit, Cost, Limited, MAX_DURATION, Period, Spec, State,
};

/// Run decide/absorb ops on a key, returning the key and the times seen.
fn drive(p: &Params, ops: &[Op]) -> (Limited, u64) {
    let spec = p.spec();
    let mut now = BASE;
    let mut key = Limited::new(spec, now);
    let mut latest = now;
    for op in ops {
        match *op {
            Op::Decide {
                step,
                cost,
                drain,
                nodelay,
            } => {
                now = traffic::advance(now, step, p.span());
                let hits = traffic::hits(cost, spec.capacity());
                key.decide(
                    &spec,
                    Cost {
                        hits,
                        drain_over_limit: drain,
                        nodelay,
                    },
                    now,
                );
            }
            Op::Absorb { step, cost } => {
                now = traffic::advance(now, step, p.span());
                key.absorb(traffic::hits(cost, spec.capacity()), now);
            }
            Op::Change(_) => {}
        }
        latest = latest.max(now);
    }
    (key, latest)
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    proptest::sample::select(Algorithm::ALL.to_vec())
}

fn key_and_ops() -> impl Strategy<Value = (Params, Vec<Op>)> {
    any_algorithm().prop_flat_map(|a| (traffic::params(a), traffic::ops(a, true, false)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// When every admission's cost is a whole number of nanoseconds
    /// (the limit divides the duration), GCRA and the token bucket answer
    /// every request identically.
    #[test]
    fn gcra_equals_token_bucket_when_cost_is_whole_ns(
        limit in 1u64..=50,
        per in prop_oneof![Just(1u64), 1u64..=1_000, Just(1_200_000)],
        burst in proptest::option::of(1u64..=60),
        ops in traffic::ops(Algorithm::Gcra, false, false),
    ) {
        let d = limit * per;
        let tb = Spec::new(Algorithm::TokenBucket, limit, Period::Duration(d), burst).unwrap();
        let gc = Spec::new(Algorithm::Gcra, limit, Period::Duration(d), burst).unwrap();
        let (mut a, mut b) = (Limited::new(tb, BASE), Limited::new(gc, BASE));
        let mut now = BASE;
        for op in ops {
            if let Op::Decide { step, cost, drain, nodelay } = op {
                now = traffic::advance(now, step, d);
                let hits = traffic::hits(cost, tb.capacity());
                let req = Cost { hits, drain_over_limit: drain, nodelay };
                prop_assert_eq!(a.decide(&tb, req, now), b.decide(&gc, req, now));
            } else if let Op::Absorb { step, cost } = op {
                now = traffic::advance(now, step, d);
                let hits = traffic::hits(cost, tb.capacity());
                a.absorb(hits, now);
                b.absorb(hits, now);
            }
        }
    }

    /// Over any span, admitted hits stay within what the algorithm allows:
    /// `burst + rate × span` for buckets, `limit` per aligned window for
    /// the fixed window and the counter, `limit` per sliding duration for the log.
    #[test]
    fn admissions_stay_within_the_limit(
        (p, ops) in any_algorithm().prop_flat_map(|a| (traffic::params(a), traffic::ops(a, false, false))),
    ) {
        let spec = p.spec();
        let mut key = Limited::new(spec, BASE);
        let mut now = BASE;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for op in &ops {
            if let Op::Decide { step, cost, nodelay, .. } = *op {
                now = traffic::advance(now, step, p.span());
                let hits = traffic::hits(cost, spec.capacity());
                let req = Cost { hits, drain_over_limit: false, nodelay };
                if key.decide(&spec, req, now).allowed() && hits > 0 {
                    admitted.push((now, hits));
                }
            }
        }
        let m = p.mspec();
        let sum = |pred: &dyn Fn(u64) -> bool| -> u64 {
            admitted.iter().filter(|(t, _)| pred(*t)).map(|(_, h)| h).sum()
        };
        for &(ti, _) in &admitted {
            match p.algorithm {
                Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                    for &(tj, _) in admitted.iter().filter(|(tj, _)| *tj >= ti) {
                        let n = sum(&|t| t >= ti && t <= tj);
                        let allowed = q(m.capacity) + q(m.limit) * q(tj - ti) / q(m.d());
                        prop_assert!(q(n) <= allowed, "{n} hits in [{ti}, {tj}]");
                    }
                }
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
                    let w = m.window(ti);
                    let n = sum(&|t| t >= w.0 && t < w.1);
                    prop_assert!(n <= m.limit, "{n} hits in window {w:?}");
                }
                Algorithm::SlidingWindowLog => {
                    let n = sum(&|t| t <= ti && t + m.d() > ti);
                    prop_assert!(n <= m.limit, "{n} hits in the duration ending {ti}");
                }
            }
        }
    }

    /// merge is commutative, associative and idempotent.
    #[test]
    fn merge_is_a_join(
        (p, a, b, c) in any_algorithm().prop_flat_map(|al| (
            traffic::params(al),
            traffic::ops(al, true, false),
            traffic::ops(al, true, false),
            traffic::ops(al, true, false),
        )),
    ) {
        let spec = p.spec();
        let (a, b, c) = (drive(&p, &a).0, drive(&p, &b).0, drive(&p, &c).0);
        let (a, b, c) = (a.state(), b.state(), c.state());
        let join = |x: &State, y: &State| {
            let mut z = x.clone();
            z.merge(y, &spec);
            z
        };
        prop_assert_eq!(join(a, a), a.clone(), "idempotent");
        prop_assert_eq!(join(a, b), join(b, a), "commutative");
        prop_assert_eq!(join(&join(a, b), c), join(a, &join(b, c)), "associative");
        // The join is at least as consumed as either side.
        let t = a.last_update().max(b.last_update()).max(BASE);
        prop_assert!(join(a, b).consumed(&spec, t) >= a.consumed(&spec, t));
    }

    /// Absorbing a report of hits equals deciding those hits directly,
    /// whenever deciding would admit them.
    #[test]
    fn absorb_equals_deciding((p, ops) in key_and_ops(), hits in 1u64..=5, step in traffic::steps(true)) {
        let spec = p.spec();
        let (key, latest) = drive(&p, &ops);
        let at = traffic::advance(latest, step, p.span());
        let mut decided = key.clone();
        if decided.decide(&spec, Cost::hits(hits), at).allowed() {
            let mut absorbed = key.clone();
            absorbed.absorb(hits, at);
            prop_assert_eq!(absorbed.state(), decided.state());
        }
    }

    /// A clock that steps back never shows more room than the latest time did.
    #[test]
    fn clock_step_back_never_refunds((p, ops) in key_and_ops(), back in 1u64..=128) {
        let spec = p.spec();
        let (key, latest) = drive(&p, &ops);
        let earlier = latest.saturating_sub(p.span() * back / 64);
        let r_latest = key.state().remaining(&spec, latest);
        let r_earlier = key.state().remaining(&spec, earlier);
        prop_assert!(r_earlier <= r_latest, "{r_earlier} at {earlier} > {r_latest} at {latest}");
    }

    /// Changing a live key's algorithm keeps its consumption, in whole
    /// tokens rounded up (GCRA may round its nanosecond cost up further).
    #[test]
    fn algorithm_change_keeps_consumption(
        (p, ops) in key_and_ops(),
        to in any_algorithm().prop_flat_map(traffic::params),
    ) {
        let (from, to) = (p.spec(), to.spec());
        if from.limit() == 0 || to.limit() == 0 || from.algorithm() == to.algorithm() {
            return Ok(()); // deny-all keys hold no consumption; same algorithm is a limit change
        }
        let (key, latest) = drive(&p, &ops);
        let before = key.state().consumed(&from, latest);
        let mut moved = key.clone();
        moved.decide(&to, Cost::hits(0), latest);
        let after = moved.state().consumed(&to, latest);
        if to.algorithm() == Algorithm::Gcra {
            // A TAT past u64::MAX ns saturates ("never"), losing the excess.
            let saturated = moved.state().idle_after(&to) == u64::MAX;
            prop_assert!(after >= before || saturated, "{before} → {after}");
            if !saturated && to_duration(&to).is_multiple_of(to.limit()) {
                prop_assert_eq!(after, before);
            }
        } else {
            prop_assert_eq!(after, before);
        }
    }
}

fn to_duration(spec: &Spec) -> u64 {
    match spec.period() {
        Period::Duration(d) => d,
        Period::Calendar(_) => unreachable!("GCRA takes durations"),
    }
}

/// Limits, durations, costs and times at their extremes: no panic (overflow
/// checks are on in every profile), `remaining` within capacity, and every
/// refusal's retry-after exact wherever it is inside the clock's range.
#[test]
fn extremes_never_panic() {
    const YEAR: u64 = 365 * 24 * 3_600 * 1_000_000_000;
    let periods = [
        Period::Duration(1),
        Period::Duration(1_000_000),
        Period::Duration(YEAR),
        Period::Duration(MAX_DURATION),
        Period::Calendar(CalendarUnit::Year),
    ];
    let times = [0, 1, BASE, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    for algorithm in Algorithm::ALL {
        let limits: &[u64] = if algorithm == Algorithm::SlidingWindowLog {
            &[0, 1, 10_000]
        } else {
            &[0, 1, u64::from(u32::MAX), u64::MAX]
        };
        for &limit in limits {
            for period in periods {
                let bursts: &[Option<u64>] = if algorithm.is_bucket() {
                    &[None, Some(1), Some(u64::MAX)]
                } else {
                    &[None]
                };
                for &burst in bursts {
                    let Ok(spec) = Spec::new(algorithm, limit, period, burst) else {
                        continue;
                    };
                    exercise(&spec, &times);
                }
            }
        }
    }
}

fn exercise(spec: &Spec, times: &[u64]) {
    let costs = [0, 1, spec.limit(), spec.limit().saturating_add(1), u64::MAX];
    for &start in times {
        let mut key = Limited::new(*spec, start);
        for &t in times {
            for &hits in &costs {
                for drain in [false, true] {
                    let req = Cost {
                        hits,
                        drain_over_limit: drain,
                        nodelay: false,
                    };
                    let before = key.clone();
                    let d = key.decide(spec, req, t);
                    assert!(d.remaining <= spec.capacity(), "{spec:?} {d:?}");
                    if let Some(r) = d.retry_after {
                        let at = t.saturating_add(r);
                        if at < u64::MAX && !drain {
                            let mut probe = before.clone();
                            let ok = probe.decide(spec, Cost::hits(hits), at);
                            assert!(ok.allowed(), "{spec:?} at {t}+{r}: {ok:?}");
                        }
                    }
                }
            }
            key.absorb(u64::MAX, t);
            let mut merged = key.state().clone();
            merged.merge(&State::fresh(spec, t), spec);
            let _ = merged.consumed(spec, t);
            let _ = merged.idle_after(spec);
        }
    }
    // Conversions to every other extreme spec keep working.
    let other = Spec::new(Algorithm::TokenBucket, 1, Period::Duration(1), None).unwrap();
    let mut key = Limited::new(*spec, BASE);
    key.absorb(u64::MAX, BASE);
    key.decide(&other, Cost::hits(1), u64::MAX);
    let _ = MPeriod::Nanos(1);
}
