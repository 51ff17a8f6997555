//! Paced grants (issue 23): edges and owner over a simulated token bucket
//! — no report ever finds it short, paces follow demand, one paced ask in
//! flight keeps edge and owner agreed, a late edge gets its share.

use super::tests::{MS, TERMS};
use super::*;
use proptest::prelude::*;

/// A token bucket as the owner's state: `rate` tokens a second, `cap`
/// at most; in thousandths of a token, so refill is exact per millisecond.
struct Bucket {
    rate: u64,
    cap: u64,
    level: i128,
    at: Nanos,
}

impl Bucket {
    fn full(rate: u64, cap: u64) -> Bucket {
        Bucket {
            rate,
            cap,
            level: i128::from(cap) * 1_000,
            at: 0,
        }
    }

    fn refill(&mut self, now: Nanos) {
        let ms = i128::from((now - self.at) / MS);
        self.at += (now - self.at) / MS * MS;
        self.level = (self.level + ms * i128::from(self.rate)).min(i128::from(self.cap) * 1_000);
    }

    fn remaining(&mut self, now: Nanos) -> u64 {
        self.refill(now);
        u64::try_from(self.level.max(0) / 1_000).unwrap()
    }

    /// A report of `hits`: what the bucket had must cover them.
    fn consume(&mut self, hits: u64, now: Nanos) -> bool {
        self.refill(now);
        self.level -= i128::from(hits) * 1_000;
        self.level >= 0
    }

    /// The bucket's refill as a pace, if it has room for a life of it.
    fn pace(&mut self, now: Nanos) -> Pace {
        let remaining = self.remaining(now);
        let owes = u64::try_from((-self.level).max(0) / 1_000).unwrap();
        Pace::for_bucket(self.rate * 1_000, (remaining, owes), self.cap, TERMS.ttl)
    }
}

/// One edge's ask against the owner's ledger over `bucket`, answered at
/// once.
fn ask(
    l: &mut Ledger,
    a: &mut Allotments,
    bucket: &mut Bucket,
    edge: &str,
    (demand, unused, paced): (u64, u64, Option<u64>),
    now: Nanos,
) {
    l.give_back(edge, unused);
    let pace = bucket.pace(now);
    let remaining = bucket.remaining(now);
    let g = l.grant_paced(edge, demand, remaining, paced.map(|_| pace), 3, now, &TERMS);
    a.answered(b"k", g, paced, now);
}

#[test]
fn paced_tokens_come_due_evenly_and_are_waited_for_not_asked() {
    let mut a = Allotments::new(4);
    assert!(matches!(a.spend(b"k", 1, 0), Local::Ask { .. }));
    // 100 tokens paced over 100 ms: one a millisecond.
    a.granted(
        b"k",
        Grant {
            amount: 0,
            expires: 100 * MS,
            paced: 100,
        },
        0,
    );
    // Nothing due yet: refused here, told when the token comes due.
    assert_eq!(a.spend(b"k", 1, 0), Local::Refused { retry_after: MS });
    assert_eq!(
        a.spend(b"k", 1, MS),
        Local::Admitted {
            left: 0,
            low: false,
            expires: 100 * MS
        }
    );
    // Ten due by 11 ms; five spent in one check.
    assert_eq!(
        a.spend(b"k", 5, 11 * MS),
        Local::Admitted {
            left: 5,
            low: false,
            expires: 100 * MS
        }
    );
    assert_eq!(
        a.spend(b"k", 10, 11 * MS),
        Local::Refused {
            retry_after: 5 * MS
        }
    );
    // More than the pace brings before the end: ask, giving back the tokens
    // in hand and those not yet due.
    assert_eq!(
        a.spend(b"k", 500, 11 * MS),
        Local::Ask {
            // 1 + 1 + 1 + 5 + 10 + 500 hits seen by 11 ms, over 100 ms.
            demand: 5_180,
            unused: 5 + 89,
            pace: Some(2),
        }
    );
    // After the ask the pace is gone: nothing more comes due.
    assert!(matches!(
        a.spend(b"k", 1, 50 * MS),
        Local::Ask { unused: 0, .. }
    ));
}

#[test]
fn paces_are_shared_by_demand_and_never_exceed_the_rate() {
    let mut l = Ledger::default();
    // 1,000 tokens a second, exhausted: nothing to grant now, but the
    // refill is shared as paces. N = 2: the edge not heard from yet is
    // counted at the average.
    let rate = Pace::all(1_000_000);
    let busy = l.grant_paced("busy", 8_000, 0, Some(rate), 2, 0, &TERMS);
    assert_eq!(busy.amount, 0);
    // 8,000 of 16,000 counted: half the rate, 50 tokens over 100 ms.
    assert_eq!(busy.paced, 50);
    let quiet = l.grant_paced("quiet", 2_000, 0, Some(rate), 2, MS, &TERMS);
    // 2,000 of 10,000: a fifth of the rate.
    assert_eq!(quiet.paced, 20);
    assert_eq!(l.paces_of_others("nobody", MS, &TERMS), 700_000);
    // Asking again (giving back what had not come due), busy's pace is
    // replaced: 80% now, within what quiet leaves.
    l.give_back("busy", 50);
    let busy = l.grant_paced("busy", 8_000, 0, Some(rate), 2, 2 * MS, &TERMS);
    assert_eq!(busy.paced, 80);
    // A newcomer finds the rate taken: nothing until a pace lapses.
    let late = l.grant_paced("late", 8_000, 0, Some(rate), 2, 3 * MS, &TERMS);
    assert_eq!((late.amount, late.paced), (0, 0));
    // Paced tokens are reserved like any grant.
    assert_eq!(l.reserved(3 * MS, &TERMS), 100);
    // Past expiry and grace, the paces are free again.
    let later = 500 * MS;
    let late = l.grant_paced("late", 8_000, 0, Some(rate), 2, later, &TERMS);
    assert!(late.paced > 0);
}

#[test]
fn a_node_passes_on_part_of_its_pace() {
    let mut a = Allotments::new(4);
    a.spend(b"k", 1, 0);
    a.granted(
        b"k",
        Grant {
            amount: 10,
            expires: 100 * MS,
            paced: 100,
        },
        0,
    );
    let live = a.live(b"k", 0).unwrap();
    assert_eq!(
        (live.tokens, live.pace, live.expires),
        (10, 1_000_000, 100 * MS)
    );
    // 4 tokens, and 40 paced over 80 ms, go to an app: half the pace,
    // lent for the rest of the 100 ms (50 paced tokens leave).
    let t = a.take(b"k", 4, (40, 80 * MS), 0);
    assert_eq!((t.tokens, t.paced, t.lent), (4, 40, 50));
    let live = a.live(b"k", 50 * MS).unwrap();
    // 25 of the 50 left came due by half-time.
    assert_eq!((live.tokens, live.pace), (6 + 25, 500_000));
    // More pace than is left: what is left.
    let t = a.take(b"k", 0, (900, 80 * MS), 50 * MS);
    assert_eq!((t.tokens, t.paced, t.lent), (0, 15, 25));
    assert_eq!(a.live(b"k", 60 * MS).unwrap().pace, 0);
    // Its pace passed on runs until 80 ms: a check it cannot cover waits
    // rather than asks (the grantor would replace this node's pace while
    // the apps' still come due).
    assert_eq!(
        a.spend(b"k", 100, 60 * MS),
        Local::Refused {
            retry_after: 20 * MS
        }
    );
    // Within 20 ms of its end, after the pace passed on: ended here, and
    // the next check asks, giving back what it held.
    assert!(!a.lapse_within(b"k", 20 * MS, 70 * MS));
    assert!(a.lapse_within(b"k", 20 * MS, 80 * MS));
    assert!(matches!(
        a.spend(b"k", 1, 80 * MS),
        Local::Ask { unused: 31, .. }
    ));
}

/// Three edges paced off one exhausted bucket, demands 8:1:1 at ten times
/// its rate, each asking only when its allotment ends: no report ever
/// finds the bucket short (as exact as the bucket, instant by instant),
/// the busy edge gets its 80%, and asks are about one per edge per life —
/// not one per refilled token.
#[test]
fn paced_edges_stay_within_the_bucket_with_one_ask_per_life() {
    let mut l = Ledger::default();
    let mut bucket = Bucket::full(1_000, 1_000);
    let edges = ["busy", "q1", "q2"];
    let every = [MS / 8, MS, MS]; // 8,000/s, 1,000/s, 1,000/s
    let mut a: Vec<Allotments> = (0..3).map(|_| Allotments::new(4)).collect();
    let (mut admitted, mut asks) = ([0u64; 3], [0u64; 3]);
    let mut now = 0;
    let end = 10_000 * MS;
    while now < end {
        for i in 0..3 {
            if now % every[i] != 0 {
                continue;
            }
            match a[i].spend(b"k", 1, now) {
                Local::Admitted { .. } => {
                    admitted[i] += 1;
                    // Reported at once: the bucket must have had it.
                    assert!(bucket.consume(1, now), "{} over at {now}", edges[i]);
                    l.reported(edges[i], 1);
                }
                Local::Refused { .. } => {}
                Local::Ask {
                    demand,
                    unused,
                    pace,
                } => {
                    asks[i] += 1;
                    ask(
                        &mut l,
                        &mut a[i],
                        &mut bucket,
                        edges[i],
                        (demand, unused, pace),
                        now,
                    );
                }
            }
        }
        now += MS / 8;
    }
    let total: u64 = admitted.iter().sum();
    // The exact bucket: its capacity, then its rate.
    assert!(total <= 1_000 + 10_000, "{total}");
    assert!(total >= 10_000, "{total}: paces leave refill unused");
    let busy = admitted[0] * 100 / total;
    assert!((70..=90).contains(&busy), "busy {busy}%: {admitted:?}");
    // 100 ms lives over 10 s: about 100 asks each (an empty answer's
    // wait adds some while the paces settle).
    for (i, n) in asks.iter().enumerate() {
        assert!(*n <= 200, "{}: {n} asks", edges[i]);
    }
}

proptest! {
    /// Whatever the edges' demands and timing, paced allotments over a
    /// token bucket never let a report find the bucket short: whatever
    /// comes due at an edge has refilled at the owner.
    #[test]
    fn paced_allotments_never_outrun_the_bucket(
        rate in 1u64..5_000,
        cap in 1u64..5_000,
        ops in proptest::collection::vec((0usize..3, 0u64..20, 1u64..40), 1..300),
    ) {
        let mut l = Ledger::default();
        let mut bucket = Bucket::full(rate, cap);
        let mut a: Vec<Allotments> = (0..3).map(|_| Allotments::new(4)).collect();
        let mut now = 0;
        for (edge, dt, hits) in ops {
            now += dt * MS;
            let name = format!("e{edge}");
            match a[edge].spend(b"k", hits, now) {
                Local::Admitted { .. } => {
                    prop_assert!(bucket.consume(hits, now), "{} over at {}", name, now);
                    l.reported(&name, hits);
                }
                Local::Refused { .. } => {}
                Local::Ask {
                    demand,
                    unused,
                    pace,
                } => {
                    ask(&mut l, &mut a[edge], &mut bucket, &name, (demand, unused, pace), now);
                }
            }
        }
    }
}

/// An edge that joins once the others' paces hold the whole rate gets its
/// share within a few lives (theirs shrink as they ask again, counting its
/// demand), not nothing until they stop.
#[test]
fn a_late_edge_gets_its_pace_share() {
    let mut l = Ledger::default();
    let mut bucket = Bucket::full(200, 200);
    let mut a: Vec<Allotments> = (0..4).map(|_| Allotments::new(4)).collect();
    let mut admitted = [0u64; 4];
    let mut now = 0;
    let end = 5_000 * MS;
    while now < end {
        for i in 0..4 {
            // 500/s each; the fourth from 2 s on.
            if now % (2 * MS) != 0 || (i == 3 && now < 2_000 * MS) {
                continue;
            }
            let name = format!("e{i}");
            match a[i].spend(b"k", 1, now) {
                Local::Admitted { .. } => {
                    assert!(bucket.consume(1, now), "{name} over at {now}");
                    l.reported(&name, 1);
                    if now >= 3_000 * MS {
                        admitted[i] += 1;
                    }
                }
                Local::Refused { .. } => {}
                Local::Ask {
                    demand,
                    unused,
                    pace,
                } => {
                    ask(
                        &mut l,
                        &mut a[i],
                        &mut bucket,
                        &name,
                        (demand, unused, pace),
                        now,
                    );
                }
            }
        }
        now += MS;
    }
    // From 3 s on, each edge near a quarter of 400.
    assert!(admitted.iter().all(|&n| n >= 60), "{admitted:?}");
}

/// Two asks of one edge in flight: only the first may be paced, and
/// whichever answer arrives first, the pace coming due at the edge is the
/// one its grantor counts.
#[test]
fn one_paced_ask_in_flight_keeps_edge_and_grantor_agreed() {
    for reversed in [false, true] {
        let mut l = Ledger::default();
        let mut a = Allotments::new(4);
        let rate = Pace::all(1_000_000);
        let Local::Ask {
            demand,
            unused,
            pace: first_id,
        } = a.spend(b"k", 1, 0)
        else {
            panic!("asks");
        };
        assert!(first_id.is_some());
        // The second may not be paced while the first is out.
        let Local::Ask {
            pace: second_id, ..
        } = a.spend(b"k", 1, MS)
        else {
            panic!("asks");
        };
        assert_eq!(second_id, None);
        l.give_back("e", unused);
        let first = l.grant_paced("e", demand, 0, Some(rate), 1, MS, &TERMS);
        let second = l.grant_paced("e", demand, 0, None, 1, 2 * MS, &TERMS);
        assert!(first.paced > 0);
        assert_eq!(second.paced, 0);
        let counted = l.paces_of_others("nobody", 2 * MS, &TERMS);
        // Lives travel relative: each runs its ttl from its arrival.
        let (first, second) = (
            Grant {
                expires: first.expires + 3 * MS,
                ..first
            },
            Grant {
                expires: second.expires + 2 * MS,
                ..second
            },
        );
        if reversed {
            a.answered(b"k", second, second_id, 3 * MS);
            a.answered(b"k", first, first_id, 4 * MS);
        } else {
            a.answered(b"k", first, first_id, 3 * MS);
            a.answered(b"k", second, second_id, 4 * MS);
        }
        // What comes due at the edge is the counted pace, over the
        // grant's life: at most `counted` per PACE_UNIT.
        let live = a.live(b"k", 4 * MS).unwrap();
        assert!(live.pace <= counted, "{} > {counted}", live.pace);
        assert!(live.pace > 0);
        // Answered: the next ask may be paced again.
        assert!(matches!(
            a.spend(b"k", 1_000, 5 * MS),
            Local::Ask { pace: Some(_), .. }
        ));
    }
}

/// A paced ask that ends unanswered (failed, or its caller gone) lets the
/// next one be paced.
#[test]
fn a_paced_ask_ended_unanswered_frees_the_next() {
    let mut a = Allotments::new(4);
    let Local::Ask { pace: Some(id), .. } = a.spend(b"k", 1, 0) else {
        panic!("a paced ask");
    };
    assert!(matches!(
        a.spend(b"k", 1, MS),
        Local::Ask { pace: None, .. }
    ));
    a.ask_done(b"k", id);
    assert!(matches!(
        a.spend(b"k", 1, 2 * MS),
        Local::Ask { pace: Some(_), .. }
    ));
}

#[test]
fn a_bucket_that_owes_shares_no_pace() {
    let rate = 1_000_000;
    assert_eq!(
        Pace::for_bucket(rate, (0, 0), 1_000, 100 * MS),
        Pace::all(rate)
    );
    assert_eq!(Pace::for_bucket(rate, (0, 1), 1_000, 100 * MS), Pace::NONE);
    // No room for a life of refill: none either.
    assert_eq!(
        Pace::for_bucket(rate, (901, 0), 1_000, 100 * MS),
        Pace::NONE
    );
    assert_eq!(
        Pace::for_bucket(rate, (900, 0), 1_000, 100 * MS),
        Pace::all(rate)
    );
}
