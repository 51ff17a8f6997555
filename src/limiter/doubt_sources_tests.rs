//! A transfer's source lost before it said `done` (`Doubts::sources_lost`):
//! which keys it puts in doubt, and what ends that.
use super::tests::{S, anyone, change, key_of, live, ring};
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

#[test]
fn keys_taken_since_the_last_complete_transfer_are_in_doubt_for_the_grace() {
    let settled = ring(&["a", "b", "c"]);
    let mine = key_of(&settled, "c", "a");
    let held = key_of(&settled, "a", "c");
    let taken = key_of(&settled, "a", "b");
    let d = Doubts::new(10 * S);
    d.sources_lost(&[("b".into(), 1)], settled.clone(), 0, 20 * S);
    let told = c_told_by_a();
    let mut ended = Ended::default();
    assert!(!d.in_doubt(&mine, 21 * S, &mut ended, &told), "owned there");
    assert!(
        !d.in_doubt(&held, 21 * S, &mut ended, &told),
        "its replica, held current there"
    );
    assert!(d.in_doubt(&taken, 21 * S, &mut ended, &told));
    assert!(d.in_doubt(&taken, 29 * S, &mut ended, &told));
    assert!(
        d.published(21 * S, &told).is_empty(),
        "its own reading: not published"
    );
    assert!(
        !d.in_doubt(&taken, 30 * S, &mut ended, &told),
        "past the grace"
    );
    assert_eq!(ended, Ended { taken: 1 });

    // A replica its owner never said it caught up with is no current copy.
    let d = Doubts::new(10 * S);
    d.sources_lost(&[("b".into(), 1)], settled.clone(), 0, 20 * S);
    let untold = c_untold();
    assert!(d.in_doubt(&held, 21 * S, &mut Ended::default(), &untold));
    assert!(!d.in_doubt(&mine, 21 * S, &mut Ended::default(), &untold));

    // A new process completed no transfer: every key it owns.
    let d = Doubts::new(10 * S);
    d.sources_lost(&[("b".into(), 1)], Arc::new(Ring::default()), 0, 20 * S);
    assert!(d.in_doubt(&mine, 21 * S, &mut Ended::default(), &told));
}

#[test]
fn a_source_heard_again_as_the_process_it_was_ends_the_doubt() {
    let settled = ring(&["a", "b", "c"]);
    let taken = key_of(&settled, "a", "b");
    let d = Doubts::new(10 * S);
    d.sources_lost(&[("b".into(), 1)], Arc::new(Ring::default()), 0, 20 * S);
    assert!(d.in_doubt(&taken, 21 * S, &mut Ended::default(), &anyone()));
    // Another loss elsewhere does not extend it; b back resolves it.
    change(&d, "c", &ring(&["b", "c"]), &live(&["b"]), 22 * S);
    assert!(!d.in_doubt(&taken, 22 * S, &mut Ended::default(), &anyone()));
    assert_eq!(d.figures(), (0, 0));
}
