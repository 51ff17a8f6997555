//! Tiered mode's arithmetic: the owner's ledger and the edge's allotments.

use super::*;
use proptest::prelude::*;

const MS: Nanos = 1_000_000;
const TERMS: Terms = Terms {
    ttl: 100 * MS,
    grace: 300 * MS,
    max_edges: 8,
    memory: 1_000 * MS,
};

#[test]
fn a_cold_edge_gets_a_small_first_allotment() {
    let mut l = Ledger::default();
    let g = l.grant("a", 0, 1_000, 3, 0, &TERMS);
    assert_eq!(g.amount, 1_000 / 12);
    assert_eq!(g.expires, 100 * MS);
    assert_eq!(l.reserved(0, &TERMS), 83);
}

#[test]
fn shares_follow_demand() {
    let mut l = Ledger::default();
    // Demands 8,000/s and 2,000/s want 800 and 200 per 100 ms; the
    // state leaves 500 (grants are reservations, not consumption).
    // The other member (N = 2) is not heard from yet: counted at the
    // average, so quiet's share is half of 500; it wants only 200.
    let quiet = l.grant("quiet", 2_000, 500, 2, 0, &TERMS);
    assert_eq!(quiet.amount, 200);
    // Quiet holds its allotment (served from this pool): the 300
    // unreserved are busy's to take, up to its want.
    let busy = l.grant("busy", 8_000, 500, 2, 0, &TERMS);
    assert_eq!(busy.amount, 300);
    assert_eq!(l.reserved(0, &TERMS), 500);
    // Both spent and reported; 100 refilled. Busy asks first, while
    // quiet waits with nothing: busy's fraction is 8 / 10.
    l.reported("quiet", 200);
    l.reported("busy", 300);
    let busy = l.grant("busy", 8_000, 100, 2, MS, &TERMS);
    assert_eq!(busy.amount, 80);
    // Quiet then gets the rest: busy holds an allotment now.
    let quiet = l.grant("quiet", 2_000, 100, 2, MS, &TERMS);
    assert_eq!(quiet.amount, 20);
}

#[test]
fn an_edge_told_nothing_waits_an_eighth_of_the_ttl() {
    let mut l = Ledger::default();
    assert_eq!(l.grant("a", 1_000, 0, 2, 0, &TERMS).amount, 0);
    assert!(l.waiting("a", 0));
    assert!(l.waiting("a", TERMS.ttl / 8 - 1));
    assert!(!l.waiting("a", TERMS.ttl / 8));
    assert!(!l.waiting("b", 0), "only the edge told nothing");
    // A grant with tokens does not make it wait.
    assert!(l.grant("b", 1_000, 100, 2, 0, &TERMS).amount > 0);
    assert!(!l.waiting("b", 0));
}

#[test]
fn reports_and_returns_release_reservations() {
    let mut l = Ledger::default();
    let g = l.grant("a", 1_000, 10_000, 1, 0, &TERMS);
    assert_eq!(g.amount, 100);
    l.reported("a", 60);
    assert_eq!(l.reserved(MS, &TERMS), 40);
    // Asking again gives back the 40 it did not spend.
    l.give_back("a", 40);
    l.grant("a", 1_000, 10_000 - 60, 1, MS, &TERMS);
    assert_eq!(l.reserved(MS, &TERMS), 100);
    // Expired and past the grace: released.
    assert_eq!(l.reserved(MS + 400 * MS + 1, &TERMS), 0);
    l.release_expired(MS + 400 * MS + 1, &TERMS);
    assert_eq!(l.holders(MS + 400 * MS + 1), 0);
    // Its demand is remembered a while (for others' shares), then not.
    assert_eq!(l.edges.len(), 1);
    l.release_expired(2_000 * MS, &TERMS);
    assert!(l.edges.is_empty());
}

#[test]
fn an_edge_spends_its_allotment_then_asks_with_its_demand() {
    let mut a = Allotments::new(10);
    // Cold: nothing to spend.
    assert_eq!(
        a.spend(b"k", 1, 0),
        Local::Ask {
            demand: 10,
            unused: 0
        }
    );
    a.granted(
        b"k",
        Grant {
            amount: 8,
            expires: 100 * MS,
        },
        0,
    );
    assert_eq!(
        a.spend(b"k", 5, MS),
        Local::Admitted {
            left: 3,
            low: false
        }
    );
    // Below a quarter of the grant: signalled once (report soon).
    assert_eq!(a.spend(b"k", 2, MS), Local::Admitted { left: 1, low: true });
    assert_eq!(
        a.spend(b"k", 0, MS),
        Local::Admitted {
            left: 1,
            low: false
        }
    );
    assert_eq!(a.held(MS), 1);
    // Not enough for 2: ask, giving back the 1 left.
    assert!(matches!(
        a.spend(b"k", 2, 2 * MS),
        Local::Ask { unused: 1, .. }
    ));
    // An expired allotment is not spent.
    a.granted(
        b"k",
        Grant {
            amount: 50,
            expires: 150 * MS,
        },
        2 * MS,
    );
    assert!(matches!(
        a.spend(b"k", 1, 150 * MS),
        Local::Ask { unused: 0, .. }
    ));
    // Nothing to grant: refused here for a while, then asks again.
    a.granted(
        b"k",
        Grant {
            amount: 0,
            expires: 230 * MS,
        },
        150 * MS,
    );
    assert_eq!(
        a.spend(b"k", 1, 151 * MS),
        Local::Refused {
            retry_after: 9 * MS
        }
    );
    assert!(matches!(a.spend(b"k", 1, 160 * MS), Local::Ask { .. }));
}

#[test]
fn demand_is_hits_per_second() {
    let mut a = Allotments::new(10);
    for i in 0..100 {
        a.spend(b"k", 1, i * 10 * MS); // 100/s for one second
    }
    match a.spend(b"k", 1, 1_000 * MS) {
        Local::Ask { demand, .. } => assert_eq!(demand, 100),
        other => panic!("{other:?}"),
    }
}

#[test]
fn edges_beyond_the_bound_get_nothing() {
    let mut l = Ledger::default();
    for i in 0..TERMS.max_edges {
        l.grant(&format!("e{i}"), 10, 1_000_000, 8, 0, &TERMS);
    }
    assert_eq!(l.grant("late", 10, 1_000_000, 8, 0, &TERMS).amount, 0);
}

proptest! {
    /// Whatever the sequence of grants, reports and returns, the tokens
    /// reserved plus those reported never exceed what the state had:
    /// tiered mode never promises more than the limit leaves.
    #[test]
    fn never_promises_more_than_the_limit_leaves(
        limit in 0u64..100_000,
        ops in proptest::collection::vec((0usize..4, 0u64..50_000, 0u64..2_000, 0u64..30), 1..200),
    ) {
        let mut l = Ledger::default();
        let mut consumed = 0u64; // reported into the state
        // Per edge, as the edge sees it: tokens left, and until when.
        let mut held = [(0u64, 0u64); 4];
        let mut now = 0;
        for (edge, demand, spend, dt) in ops {
            now += dt * MS;
            let name = format!("e{edge}");
            if held[edge].1 <= now {
                held[edge].0 = 0; // expired: the edge spends no more of it
            }
            if spend % 3 == 0 {
                // Ask again, returning what is left.
                l.give_back(&name, held[edge].0);
                let g = l.grant(&name, demand, limit - consumed, 4, now, &TERMS);
                held[edge] = (g.amount, g.expires);
            } else {
                // Spend some of the allotment and report it at once.
                let spent = spend.min(held[edge].0);
                held[edge].0 -= spent;
                consumed += spent;
                l.reported(&name, spent);
            }
            prop_assert!(consumed + l.reserved(now, &TERMS) <= limit,
                "consumed {} + reserved {} > limit {}", consumed, l.reserved(now, &TERMS), limit);
        }
    }
}
