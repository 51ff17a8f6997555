//! The lease table's own tests: eviction with unreported spending,
//! settled spending, the settled marks' bound, one key's report.

use super::*;
use crate::algorithm::{Algorithm, Period};
use crate::store::key;

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

fn admitted(l: &Leases, k: &[u8], sp: &Spec, n: u64, now: Nanos, tries: usize) -> usize {
    (0..tries)
        .filter(|_| l.decide(k, sp, Cost::hits(1), n, now).allowed())
        .count()
}

fn owner_said(remaining: u64) -> Decision {
    Decision {
        reason: Outcome::WithinLimit,
        limit: 90,
        remaining,
        reset_at: 0,
        retry_after: None,
        delay: 0,
    }
}

/// A remembered answer is a cache entry: evicted while its lease
/// spending is unreported, the owner's next answer (which has not heard
/// of that spending) re-creates it — with the spending folded back in,
/// so the lease does not grant it a second time.
#[test]
fn an_evicted_answer_comes_back_with_its_unreported_spending() {
    let l = Leases::new(1, usize::MAX, 0);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    let sp = spec(90);
    l.observe(&a, &sp, &owner_said(30), 0, 0);
    assert_eq!(admitted(&l, &a, &sp, 3, 0, 6), 6, "6 of its share of 10");
    l.observe(&b, &sp, &owner_said(90), 0, 0);
    assert!(!l.inner.seen.contains(&a), "a evicted by the key bound");
    assert_eq!(l.unreported(), 6);
    // The owner still says 30 (the report has not reached it).
    l.observe(&a, &sp, &owner_said(30), 0, 0);
    assert_eq!(
        admitted(&l, &a, &sp, 3, 0, 10),
        4,
        "the share of 10 less the 6 already spent"
    );
}

/// An answer the owner gave before it absorbed a report can arrive
/// after the report's acknowledgement (they travel on different calls),
/// and several may be on their way; while any can still arrive
/// ([`SETTLED_FOR`]), the acknowledged spending is folded into each
/// answer that re-creates an evicted key.
#[test]
fn acknowledged_spending_survives_evictions_while_stale_answers_can_arrive() {
    let l = Leases::new(1, usize::MAX, 0);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    let sp = spec(90);
    l.observe(&a, &sp, &owner_said(30), 0, 0);
    assert_eq!(admitted(&l, &a, &sp, 3, 0, 6), 6);
    let sent = l.reports();
    l.acknowledge(&sent[0], 0);
    assert_eq!(l.unreported(), 0);
    // Two stale answers (from before the owner absorbed the 6), each
    // after an eviction.
    for _ in 0..2 {
        l.observe(&b, &sp, &owner_said(90), 0, 0);
        assert!(!l.inner.seen.contains(&a), "a evicted");
        l.observe(&a, &sp, &owner_said(30), 0, 0);
        assert_eq!(
            l.seen_remaining(&a, 0),
            Some(12),
            "30 less the 6 spent at N = 3"
        );
    }
    assert_eq!(admitted(&l, &a, &sp, 3, 0, 10), 4);
    // Past SETTLED_FOR no stale answer is on its way: evicted again,
    // the owner's own count (24: it holds the 6) is folded with only
    // the 4 spent since (unreported).
    let later = SETTLED_FOR + 1;
    l.observe(&b, &sp, &owner_said(90), 0, later);
    l.observe(&a, &sp, &owner_said(24), 0, later);
    assert_eq!(admitted(&l, &a, &sp, 3, later, 10), 4, "24 / 3 less the 4");
}

/// The settled spending of a key is kept its whole `SETTLED_FOR`
/// however often other keys settle: one key reported again and again
/// (tiered mode reports a hot key every round) keeps one mark, and
/// never pushes a quiet key's spending out of a table with room for
/// both. (With a mark per settle, bounded at 4 per key of room, the
/// quiet key's spending went after 8 settles of the hot one.)
#[test]
fn a_hot_key_settling_often_never_crowds_out_a_quiet_one() {
    let (hot, quiet): (Arc<[u8]>, Arc<[u8]>) = (
        key::encode("n", "hot").into(),
        key::encode("n", "quiet").into(),
    );
    let mut t = Table::default();
    t.settle(&quiet, 5, 0, 2);
    for at in 1..=1_000 {
        t.settle(&hot, 1, at, 2);
    }
    assert_eq!(t.unaccounted(&quiet, 1_000), 5, "the quiet key's 5");
    assert_eq!(t.unaccounted(&hot, 1_000), 1_000);
    assert_eq!(t.order.len(), 2, "one mark per key");
    // Past its time the quiet key's spending goes; the hot key, settled
    // since, stays.
    t.trim(SETTLED_FOR + 1, 2);
    assert_eq!(t.unaccounted(&quiet, SETTLED_FOR + 1), 0);
    assert!(!t.settled.contains_key(&quiet), "gone from memory too");
    assert_eq!(t.unaccounted(&hot, SETTLED_FOR + 1), 1_000);
    // A third key in a table with room for two: the oldest goes.
    let third: Arc<[u8]> = key::encode("n", "third").into();
    t.settle(&quiet, 5, SETTLED_FOR + 2, 2);
    t.settle(&third, 7, SETTLED_FOR + 3, 2);
    assert_eq!(t.settled.len(), 2);
    assert_eq!(
        t.unaccounted(&hot, SETTLED_FOR + 3),
        0,
        "the oldest settled"
    );
    assert_eq!(t.unaccounted(&third, SETTLED_FOR + 3), 7);
}

/// A lease decision on a key the owner never answered for does not
/// know its reset generation: its report says so (`None`, which an
/// owner applies whatever its generation), not generation 0 (which an
/// owner reset since would drop, losing the spending).
#[test]
fn a_report_for_a_key_never_answered_names_no_generation() {
    let l = Leases::new(100, usize::MAX, 0);
    let k = key::encode("n", "k");
    let sp = spec(90);
    assert_eq!(admitted(&l, &k, &sp, 3, 0, 1), 0, "starts empty");
    assert_eq!(admitted(&l, &k, &sp, 3, 2 * S, 1), 1, "refilled");
    assert_eq!(l.reports()[0].reset_gen, None);
}

/// The owners' answers an edge remembers are bounded by bytes too: a
/// sliding log's seed holds timestamps, and `lease_max_keys` of them
/// would be far more than their share of `limits.max_memory`.
#[test]
fn remembered_answers_stay_within_their_byte_budget() {
    const BUDGET: usize = 64 * 1024;
    let l = Leases::new(10_000, BUDGET, 0);
    let sp = Spec::new(
        Algorithm::SlidingWindowLog,
        1_000,
        Period::Duration(60 * S),
        None,
    )
    .unwrap();
    let spent = Decision {
        reason: Outcome::WithinLimit,
        limit: 1_000,
        remaining: 0,
        reset_at: 0,
        retry_after: None,
        delay: 0,
    };
    for i in 0..1_000 {
        let k = key::encode("log", &format!("k{i}"));
        l.observe(&k, &sp, &spent, 0, i);
        assert!(
            l.memory_used() <= BUDGET,
            "after {i} keys: {} bytes over {BUDGET}",
            l.memory_used()
        );
    }
    assert!(
        l.remembered() < 1_000,
        "evicted by bytes: {}",
        l.remembered()
    );
    assert!(l.memory_used() > BUDGET / 2, "and kept what fits");
}

#[test]
fn a_lease_is_one_nth_of_what_the_owner_last_said() {
    let l = Leases::new(100, usize::MAX, 0);
    let k = key::encode("n", "k");
    let sp = spec(90);
    // The owner said 30 left at t=0: this edge's share is 10.
    let seen = Decision {
        reason: Outcome::WithinLimit,
        limit: 90,
        remaining: 30,
        reset_at: 0,
        retry_after: None,
        delay: 0,
    };
    l.observe(&k, &sp, &seen, 0, 0);
    assert_eq!(admitted(&l, &k, &sp, 3, 0, 20), 10);
    // It refills at rate/N: 90 per minute / 3 = 1 every 2 s.
    assert_eq!(admitted(&l, &k, &sp, 3, 2 * S, 5), 1);
}

#[test]
fn a_key_never_seen_starts_empty_and_limit_one_cannot_be_split() {
    let l = Leases::new(100, usize::MAX, 0);
    let k = key::encode("n", "new");
    assert_eq!(admitted(&l, &k, &spec(90), 3, 0, 5), 0);
    assert_eq!(
        admitted(&l, &k, &spec(90), 3, 2 * S, 5),
        1,
        "refills from empty"
    );
    let one = key::encode("n", "one");
    let d = l.decide(&one, &spec(1), Cost::hits(1), 3, 600 * S);
    assert_eq!(
        d.reason,
        Outcome::LimitExceeded,
        "1/3 of a token never admits"
    );
}

#[test]
fn reports_are_resent_unchanged_until_acknowledged() {
    let l = Leases::new(100, usize::MAX, 1_000);
    let k = key::encode("n", "k");
    let sp = spec(600);
    l.decide(&k, &sp, Cost::hits(0), 3, 0); // a peek reports nothing
    assert!(
        !l.decide(&k, &sp, Cost::hits(1), 3, 0).allowed(),
        "starts empty"
    );
    assert!(
        l.reports().is_empty(),
        "nothing admitted, nothing to report"
    );
    assert_eq!(admitted(&l, &k, &sp, 3, 300 * S, 4), 4);
    let first = l.reports();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].seq, first[0].hits), (1_001, 4));
    // Admitted while the report is in flight: held for the next one.
    assert_eq!(admitted(&l, &k, &sp, 3, 300 * S, 2), 2);
    assert_eq!(l.reports(), first, "a retry is the same report");
    l.acknowledge(&first[0], 0);
    let second = l.reports();
    assert_eq!((second[0].seq, second[0].hits), (1_002, 2));
    assert_eq!(l.unreported(), 2);
    l.acknowledge(&second[0], 0);
    assert!(l.reports().is_empty());
    assert_eq!(l.unreported(), 0);
}

/// Issue 39, item 2: an edge restarted with its wall clock behind its
/// previous run numbers its reports below what owners applied from it.
/// The first owner to answer "duplicate" to a report sent once says how
/// far to jump: the report is renumbered above it and resent, never taken
/// for applied — while a duplicate answering a resent report is a retry's,
/// and acknowledged.
#[test]
fn a_report_numbered_below_an_earlier_run_is_renumbered_not_dropped() {
    // This run's numbering starts at 1,000; an earlier run reached 50,000.
    let l = Leases::new(100, usize::MAX, 1_000);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    let sp = spec(600);
    assert!(
        !l.decide(&a, &sp, Cost::hits(1), 3, 0).allowed(),
        "starts empty"
    );
    assert_eq!(admitted(&l, &a, &sp, 3, 300 * S, 4), 4);
    let first = l.reports();
    assert_eq!(first[0].seq, 1_001);
    l.sending(&first);
    assert!(l.renumber(&first[0], 50_000), "sent once: renumbered");
    let again = l.reports();
    assert_eq!((again[0].seq, again[0].hits), (50_001, 4), "the same hits");
    assert_eq!(l.unreported(), 4, "nothing taken for applied");
    // Sent twice and answered "duplicate": an earlier sending was applied.
    l.sending(&again);
    l.sending(&again);
    assert!(!l.renumber(&again[0], 50_001));
    l.acknowledge(&again[0], 0);
    assert_eq!(l.unreported(), 0);
    // Every report cut from now on is above the jump.
    assert!(!l.decide(&b, &sp, Cost::hits(1), 3, 0).allowed());
    assert_eq!(admitted(&l, &b, &sp, 3, 300 * S, 1), 1);
    assert_eq!(l.reports()[0].seq, 50_002);
    // An owner that does not say what it applied (an older release): a
    // retry, as before.
    let next = l.reports();
    l.sending(&next);
    assert!(!l.renumber(&next[0], 0));
}

#[test]
fn sendings_that_could_not_have_been_applied_do_not_stop_a_renumber() {
    let l = Leases::new(100, usize::MAX, 1_000);
    let a = key::encode("n", "a");
    let sp = spec(600);
    assert!(!l.decide(&a, &sp, Cost::hits(1), 3, 0).allowed());
    assert_eq!(admitted(&l, &a, &sp, 3, 300 * S, 2), 2);
    let first = l.reports();
    // A breaker open, then an owner still taking the key over ("retry"):
    // neither sending reached a count.
    l.sending(&first);
    l.not_applied(&first);
    l.sending(&first);
    l.not_applied(&first);
    // The first that arrives is answered "duplicate" of an earlier run's.
    l.sending(&first);
    assert!(
        l.renumber(&first[0], 50_000),
        "the only sending that arrived"
    );
    assert_eq!(l.unreported(), 2, "its hits kept");
    // An absurd `applied` is not followed: the next number would wrap.
    let again = l.reports();
    l.sending(&again);
    assert!(!l.renumber(&again[0], u64::MAX));
}

/// One key's report, for an owner that must hold the key's spending before
/// it decides it: the report in flight first (unchanged, so the owner's
/// sequence check makes a second delivery harmless), then one of the hits
/// admitted since; nothing once all are acknowledged — and nothing for a
/// key with no spending while another key has some.
#[test]
fn one_keys_report_goes_in_flight_first_then_the_rest() {
    let l = Leases::new(8, usize::MAX, 0);
    let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
    let sp = spec(90);
    assert_eq!(l.report_for(&a), None);
    l.observe(&a, &sp, &owner_said(90), 0, 0);
    assert_eq!(admitted(&l, &a, &sp, 3, 0, 2), 2);
    let flushed = l.reports();
    assert_eq!(flushed[0].hits, 2);
    assert_eq!(admitted(&l, &a, &sp, 3, 0, 3), 3);
    assert_eq!(l.report_for(&b), None, "b spent nothing");
    let first = l.report_for(&a).expect("a has spending");
    assert_eq!(first, flushed[0], "the report in flight, unchanged");
    l.acknowledge(&first, 0);
    let second = l.report_for(&a).expect("3 hits since");
    assert_eq!((second.hits, second.seq > first.seq), (3, true));
    l.acknowledge(&second, 0);
    assert_eq!(l.report_for(&a), None);
    assert_eq!(l.inner.leased_keys.load(Ordering::Relaxed), 0);
    // A tiered allotment's hits are not lease spending: its owner holds
    // them as promised.
    l.record(&b, &sp, 4, 0);
    assert_eq!(l.report_for(&b), None);
    assert_eq!(l.unreported(), 4, "b's, reported with the next round");
}
