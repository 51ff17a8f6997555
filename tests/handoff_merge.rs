//! Duplicated and reordered handoff batches (issue 6's table, row 4): the
//! copies of one key's lineage — replicas, handoff batches, pulls — arrive
//! at a new owner in any order, any number of times, with resets and lease
//! reports between them. Whatever arrives, the new owner decides every
//! later request exactly as the old owner would have (over-admission 0: no
//! roll-back, no double count, no undone reset), and every report the old
//! owner applied is a duplicate at the new one.

use proptest::prelude::*;
use sluice::algorithm::{Algorithm, Cost, Period, Spec};
use sluice::store::{Absorbed, Holding, Report, Store};

const BASE: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

#[derive(Clone, Debug)]
enum Op {
    Decide {
        hits: u64,
        after_ms: u64,
    },
    Report {
        edge: usize,
        hits: u64,
        after_ms: u64,
    },
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..6, 0u64..300).prop_map(|(hits, after_ms)| Op::Decide { hits, after_ms }),
        2 => (0usize..3, 1u64..6, 0u64..300)
            .prop_map(|(edge, hits, after_ms)| Op::Report { edge, hits, after_ms }),
        1 => Just(Op::Reset),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(400)
}

const EDGES: [&str; 3] = ["edge-a", "edge-b", "edge-c"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn copies_in_any_order_and_number_end_at_the_latest(
        algorithm in 0..Algorithm::ALL.len(),
        limit in 1u64..40,
        duration_ms in 50u64..3_000,
        ops in prop::collection::vec(op(), 1..40),
        duplicates in prop::collection::vec(any::<prop::sample::Index>(), 0..60),
        order in prop::collection::vec(any::<u64>(), 100),
    ) {
        let spec = Spec::new(
            Algorithm::ALL[algorithm],
            limit,
            Period::Duration(duration_ms * MS),
            None,
        )
        .unwrap();
        let key: &[u8] = b"merge\0key";
        let old = Store::new(16);
        let mut now = BASE;
        let mut seqs = [0u64; 3];
        let mut reports = Vec::new();
        // Every state the old owner went through: each one a batch that
        // might reach the new owner.
        let mut copies = Vec::new();
        for op in &ops {
            match *op {
                Op::Decide { hits, after_ms } => {
                    now += after_ms * MS;
                    old.decide(key, &spec, Cost::hits(hits), now);
                }
                Op::Report { edge, hits, after_ms } => {
                    now += after_ms * MS;
                    seqs[edge] += 1;
                    let r = Report {
                        edge: EDGES[edge],
                        seq: seqs[edge],
                        hits,
                        at: now,
                        reset_gen: None,
                    };
                    old.absorb_report(key, &spec, &r, None).unwrap();
                    reports.push(r);
                }
                Op::Reset => {
                    old.reset(key, now, None).unwrap();
                }
            }
            if let Some(s) = old.snapshot(key) {
                copies.push(s);
            }
        }
        prop_assume!(!copies.is_empty());
        // Every copy once, some again, shuffled.
        let mut arrivals: Vec<usize> = (0..copies.len())
            .chain(duplicates.iter().map(|i| i.index(copies.len())))
            .collect();
        let mut keyed: Vec<(u64, usize)> = arrivals
            .iter()
            .enumerate()
            .map(|(i, &c)| (order[i % order.len()] ^ i as u64, c))
            .collect();
        keyed.sort();
        arrivals = keyed.into_iter().map(|(_, c)| c).collect();
        let new = Store::new(16);
        for &c in &arrivals {
            new.merge(key, copies[c].clone(), now, Holding::Owned, None);
        }
        // The new owner has the lineage's latest generation and version...
        let (a, b) = (old.snapshot(key).unwrap(), new.snapshot(key).unwrap());
        prop_assert_eq!(a.reset_gen, b.reset_gen);
        prop_assert_eq!(a.version, b.version);
        prop_assert_eq!(a.spec, b.spec);
        // ...every report the old owner applied is a duplicate here...
        for &r in &reports {
            prop_assert_ne!(
                new.absorb_report(key, &spec, &r, None).unwrap(),
                Absorbed::Applied,
                "report {:?} counted twice", r
            );
        }
        // ...and it decides what follows exactly as the old owner would.
        let step = duration_ms * MS / 5;
        for i in 0..12u64 {
            let at = now + i * step / 2;
            let hits = 1 + i % 3;
            let want = old.decide(key, &spec, Cost::hits(hits), at);
            let got = new.decide(key, &spec, Cost::hits(hits), at);
            prop_assert_eq!(got, want, "decision {} at +{}ns after arrivals {:?}", i, at - now, arrivals);
        }
    }
}

/// A copy from before a reset never undoes it, even arriving last.
#[test]
fn a_late_copy_from_before_a_reset_is_ignored() {
    let spec = Spec::new(
        Algorithm::TokenBucket,
        10,
        Period::Duration(60_000 * MS),
        None,
    )
    .unwrap();
    let key: &[u8] = b"k";
    let old = Store::new(4);
    for _ in 0..10 {
        old.decide(key, &spec, Cost::hits(1), BASE);
    }
    let before_reset = old.snapshot(key).unwrap();
    old.reset(key, BASE, None).unwrap();
    old.decide(key, &spec, Cost::hits(1), BASE);
    let after_reset = old.snapshot(key).unwrap();
    let new = Store::new(4);
    new.merge(key, after_reset, BASE, Holding::Copy, None);
    new.merge(key, before_reset, BASE, Holding::Copy, None);
    let d = new.decide(key, &spec, Cost::hits(0), BASE);
    assert_eq!(d.remaining, 9, "the reset stands: {d:?}");
}
