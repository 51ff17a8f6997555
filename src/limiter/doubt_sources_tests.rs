//! A transfer's source lost before it said `done` (`Doubts::sources_lost`):
//! which keys it puts in doubt, and what ends that.
use super::held::MAX_TRAIL;
use super::tests::{S, anyone, change, key_of, key_where, live, ring};
use super::*;

/// `c`, told by `a` (and no one else) that it holds `a`'s replicas.
fn c_told_by_a() -> Me<'static> {
    Me {
        id: "c",
        confirmed: &|owner, _, _| owner == "a",
    }
}

/// `c`, told by no owner.
fn c_untold() -> Me<'static> {
    Me {
        id: "c",
        confirmed: &|_, _, _| false,
    }
}

fn lost_b(held: Held) -> Doubts {
    let d = Doubts::new(10 * S);
    d.sources_lost(&[("b".into(), 1)], held, 20 * S);
    d
}

fn in_doubt(d: &Doubts, k: &[u8], at: Nanos, me: &Me<'_>) -> bool {
    d.in_doubt(k, at, &mut Ended::default(), me)
}

#[test]
fn keys_not_held_current_that_the_source_may_have_held_are_in_doubt_for_the_grace() {
    let settled = ring(&["a", "b", "c", "d"]);
    let mine = key_of(&settled, "c", "a");
    let replica = key_of(&settled, "a", "c");
    let taken = key_of(&settled, "a", "b");
    // Neither b's nor c's: b never held it.
    let elsewhere = key_of(&settled, "a", "d");
    let d = lost_b(Held::complete(settled.clone(), 0));
    let told = c_told_by_a();
    assert!(!in_doubt(&d, &mine, 21 * S, &told), "owned there");
    assert!(
        !in_doubt(&d, &replica, 21 * S, &told),
        "its replica, held current there"
    );
    assert!(!in_doubt(&d, &elsewhere, 21 * S, &told), "b never held it");
    assert!(in_doubt(&d, &taken, 21 * S, &told));
    assert!(in_doubt(&d, &taken, 29 * S, &told));
    assert!(
        d.published(21 * S, &told).is_empty(),
        "its own reading: not published"
    );
    let mut ended = Ended::default();
    assert!(
        !d.in_doubt(&taken, 30 * S, &mut ended, &told),
        "past the grace"
    );
    assert_eq!(ended, Ended { taken: 1 }, "taken from its best copy");

    // A replica its owner never said it caught up with is no current copy
    // (of three, b held it but for c).
    let three = ring(&["a", "b", "c"]);
    let d = lost_b(Held::complete(three.clone(), 0));
    assert!(in_doubt(&d, &key_of(&three, "a", "c"), 21 * S, &c_untold()));
    assert!(!in_doubt(&d, &key_of(&three, "a", "c"), 21 * S, &told));
    assert!(!in_doubt(
        &d,
        &key_of(&three, "c", "a"),
        21 * S,
        &c_untold()
    ));
}

#[test]
fn a_new_process_holds_nothing_and_reads_the_rings_it_joined_through() {
    // n joined through {a, b, c}: what b owned or held there is in doubt.
    let before = ring(&["a", "b", "c"]);
    let held = Held::fresh(0).after(before.clone(), 1);
    let d = lost_b(held);
    let n = Me {
        id: "n",
        confirmed: &|_, _, _| true,
    };
    assert!(in_doubt(&d, &key_of(&before, "a", "b"), 21 * S, &n));
    assert!(in_doubt(&d, &key_of(&before, "b", "c"), 21 * S, &n));
    assert!(!in_doubt(&d, &key_of(&before, "c", "a"), 21 * S, &n));
}

#[test]
fn a_key_that_left_and_came_back_while_transfers_were_incomplete_is_not_current() {
    // c owned k in its last complete ring; d joined and owned it (c not
    // its holder: d is in c's zone), and c's transfers stayed incomplete
    // since.
    let zoned = |ids: &[(&str, &str)]| {
        Arc::new(Ring::new(ids.iter().map(|&(id, zone)| {
            let mut m = super::tests::member(id, 1);
            m.zone = Arc::from(zone);
            m
        })))
    };
    let settled = zoned(&[("a", "z2"), ("b", "z2"), ("c", "z1")]);
    let joined = zoned(&[("a", "z2"), ("b", "z2"), ("c", "z1"), ("d", "z1")]);
    let owner = |r: &Ring, k: &[u8]| r.owner(k).unwrap().node_id.to_string();
    let k = (0..10_000)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| owner(&settled, k) == "c" && owner(&joined, k) == "d")
        .expect("a key of c that d took");
    assert_ne!(&*joined.successor(&k).unwrap().node_id, "c");
    let held = Held::complete(settled.clone(), 0).after(joined, 1);
    assert!(in_doubt(&lost_b(held), &k, 21 * S, &c_told_by_a()));
    // Without d's ring between, c held it throughout.
    let held = Held::complete(settled, 0);
    assert!(!in_doubt(&lost_b(held), &k, 21 * S, &c_told_by_a()));
}

#[test]
fn a_holder_still_holder_needs_no_new_word() {
    // b owned k, c held it (told); b was buried after e joined, c owning
    // or holding k in every ring between: b died before it said anything
    // of them (a zone killed at once: its members buried one by one).
    let settled = ring(&["a", "b", "c", "d"]);
    let later = ring(&["a", "b", "c", "d", "e"]);
    let k = key_where(&settled, "b", "c", |k| {
        let holders = [later.owner(k), later.successor(k)];
        holders.iter().flatten().any(|m| &*m.node_id == "c")
    });
    let told_by_b = Me {
        id: "c",
        confirmed: &|owner, epoch, _| owner == "b" && epoch == settled.epoch(),
    };
    let held = Held::complete(settled.clone(), 0).after(later.clone(), 1);
    assert!(!in_doubt(&lost_b(held), &k, 21 * S, &told_by_b));
    // Never told in the ring it began in: not current.
    let held = Held::complete(settled.clone(), 0).after(later, 1);
    assert!(in_doubt(&lost_b(held), &k, 21 * S, &c_untold()));
}

#[test]
fn past_the_trail_every_key_is_in_doubt() {
    let settled = ring(&["a", "b", "c", "d"]);
    let mine = key_of(&settled, "c", "a");
    let mut held = Held::complete(settled.clone(), 0);
    for v in 0..=MAX_TRAIL as u64 {
        held = held.after(ring(&["a", "b", "c", "d", &format!("e{v}")]), v + 1);
    }
    assert!(in_doubt(&lost_b(held), &mine, 21 * S, &c_told_by_a()));
}

#[test]
fn after_a_rejoin_what_it_held_is_copies_and_the_rings_still_narrow() {
    // Of three, b held every key but c's own, c aside.
    let settled = ring(&["a", "b", "c"]);
    let mine = key_of(&settled, "c", "a");
    let d = lost_b(Held::complete(settled.clone(), 0));
    assert!(!in_doubt(&d, &mine, 21 * S, &c_told_by_a()));
    // Published nowhere, the region is kept; c's copy is current no more.
    d.forget();
    assert!(in_doubt(&d, &mine, 21 * S, &c_told_by_a()));
    // A source that never held a key of c's puts none in doubt still.
    let four = ring(&["a", "b", "c", "d"]);
    let elsewhere = key_where(&four, "c", "a", |k| {
        let members = four.members();
        let (owner, holder) = four.holders_without(k, |i| &*members[i].node_id == "c");
        [owner, holder]
            .into_iter()
            .flatten()
            .all(|i| &*members[i].node_id != "b")
    });
    let d = lost_b(Held::complete(four, 0));
    d.forget();
    assert!(!in_doubt(&d, &elsewhere, 21 * S, &c_told_by_a()));
}

#[test]
fn a_source_heard_again_as_the_process_it_was_ends_the_doubt() {
    let settled = ring(&["a", "b", "c"]);
    let taken = key_of(&settled, "a", "b");
    let d = lost_b(Held::fresh(0).after(settled.clone(), 1));
    assert!(in_doubt(&d, &taken, 21 * S, &anyone()));
    // Open, it keeps this node's rings from settling (`set_view`).
    assert!(d.sources_open());
    // Another loss elsewhere does not extend it; b back resolves it.
    change(&d, "c", &ring(&["b", "c"]), &live(&["b"]), 22 * S);
    assert!(!in_doubt(&d, &taken, 22 * S, &anyone()));
    assert!(!d.sources_open());
    assert_eq!(d.figures(), (0, 0));
}

#[test]
fn losses_an_operator_accepted_open_nothing() {
    let settled = ring(&["a", "b", "c"]);
    let taken = key_of(&settled, "a", "b");
    let d = Doubts::new(10 * S);
    change(&d, "c", &ring(&["a", "b", "c"]), &live(&["a"]), 20 * S);
    d.accept_all();
    d.sources_lost(&[("b".into(), 1)], Held::fresh(0), 21 * S);
    assert!(!in_doubt(&d, &taken, 22 * S, &anyone()));
}
