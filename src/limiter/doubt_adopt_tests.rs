//! The regions of doubt's unit tests, adoption's side: what a node that
//! did not see a loss (restarted, new, back from a burial) takes from its
//! peers' word, and what it leaves out. The helpers are `doubt_tests.rs`'s.
use super::tests::*;
use super::*;

/// b was away long enough to be buried: k, b's own in the ring it
/// knew, moved to c (replica d), and then c and d were lost together.
/// b's own region over its old ring holds the same losses as the one
/// its peers publish, so it would keep theirs off — and under its old
/// ring k is its own, never in doubt (a cold review's scenario).
/// Rejoined, b forgets its regions and adopts its peers'.
#[test]
fn a_rejoined_node_forgets_its_own_regions_and_adopts_its_peers() {
    let old = ring(&["a", "b", "c", "d", "e", "f"]);
    let without_b = ring(&["a", "c", "d", "e", "f"]);
    let k = key_where(&old, "b", "c", |k| {
        &*without_b.successor(k).unwrap().node_id == "d"
    });
    let survivor = Doubts::new(100 * S);
    change(&survivor, "a", &without_b, &live(&["e", "f"]), S);
    let word = survivor.published(S, &anyone());
    assert_eq!(word.len(), 1);

    let b = Doubts::new(100 * S);
    change(&b, "b", &old, &live(&["a", "e", "f"]), S);
    let now = ring(&["a", "b", "e", "f"]);
    let hears = live(&["a", "e", "f"]);
    assert_eq!(
        b.adopt(&word, &now, &hears, &heard("b", 1, 1), S),
        0,
        "kept off"
    );
    let mut ended = Ended::default();
    assert!(
        !b.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "the old ring says: its own"
    );

    b.forget();
    assert_eq!(b.adopt(&word, &now, &hears, &heard("b", 1, 1), S), 1);
    assert!(
        b.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "c and d held it last"
    );
}

/// Two of three lost together, one restarted while the other is
/// still down (`two-of-three-crash.json`): the survivor saw both go
/// and publishes it; the restarted node — the same id, a new
/// generation — adopts it, so a key it now owns whose holders of
/// record were both lost is in doubt there too, though its old
/// generation was one of them.
#[test]
fn a_restarted_node_adopts_the_region_a_survivor_publishes() {
    let survivor = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    change(&survivor, "c", &before, &live(&[]), 20 * S);
    let published = survivor.published(21 * S, &anyone());
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].remaining, std::time::Duration::from_secs(9));

    // a restarted as generation 2; its ring now: c and itself.
    let now = Arc::new(Ring::new([member("a", 2), member("c", 1)]));
    let k = key_where(&before, "a", "b", |k| {
        &*now.owner(k).unwrap().node_id == "a"
    });
    // a's keys stay a's (a ring change moves only the keys of members
    // gone or come): those whose replica c held are of record.
    let k_ac = key_of(&before, "a", "c");
    let restarted = Doubts::new(10 * S);
    assert_eq!(
        restarted.adopt(&published, &now, &live(&["c"]), &heard("a", 2, 2), 100 * S),
        1
    );
    let mut ended = Ended::default();
    assert!(
        restarted.in_doubt(&k, 101 * S, &mut ended, &anyone()),
        "a's old generation lost it"
    );
    assert!(
        !restarted.in_doubt(&k_ac, 101 * S, &mut ended, &anyone()),
        "c held it: of record"
    );
    // Adopted once: not again (from the same word, or after it ends).
    assert_eq!(
        restarted.adopt(&published, &now, &live(&["c"]), &heard("a", 2, 2), 102 * S),
        0
    );
    assert!(
        !restarted.in_doubt(&k, 109 * S, &mut ended, &anyone()),
        "the time left, from reading it"
    );
    assert_eq!(
        restarted.adopt(&published, &now, &live(&["c"]), &heard("a", 2, 2), 110 * S),
        0
    );
    assert_eq!(ended, Ended { taken: 1 });
}

/// A node that saw the change holds its own region and adopts none;
/// this process's own generation is never among the gone; one loss is
/// no region.
#[test]
fn a_region_is_adopted_only_where_none_covers_its_losses() {
    let before = ring(&["a", "b", "c", "d"]);
    let seen = Doubts::new(10 * S);
    change(&seen, "d", &before, &live(&["c"]), S);
    let word = seen.published(S, &anyone());
    assert_eq!(word.len(), 1);
    let other = Doubts::new(10 * S);
    change(&other, "c", &before, &live(&["d"]), S);
    assert_eq!(
        other.adopt(
            &word,
            &ring(&["c", "d"]),
            &live(&["d"]),
            &heard("c", 1, 1),
            S
        ),
        0
    );

    // A peer's word about members this node still hears (a suspicion
    // it does not share yet): nothing adopted — and nothing that would
    // keep its own region from opening once it loses them itself
    // (simulator seed 94: a word adopted, resolved at the next view,
    // and remembered, hid the real loss a moment later).
    let early = Doubts::new(10 * S);
    assert_eq!(
        early.adopt(
            &word,
            &before,
            &live(&["a", "b", "c"]),
            &heard("d", 1, 1),
            S
        ),
        0
    );
    change(&early, "d", &before, &live(&["c"]), 2 * S);
    assert!(early.any());

    let me_now = Doubts::new(10 * S);
    let mine = word_of(&[("a", 5), ("b", 1)], 5);
    // a's generation 5 is this process (born 5): one member gone.
    assert_eq!(
        me_now.adopt(
            &mine,
            &ring(&["a", "c"]),
            &live(&["c"]),
            &heard("a", 5, 5),
            S
        ),
        0
    );
    assert!(!me_now.any());
}

/// A region that ended (its grace passed, or an operator accepted the
/// best copies) does not come back: not from members still unburied
/// in the ring (two of three lost: no majority to bury them), not from
/// a peer still publishing it.
#[test]
fn an_ended_region_is_neither_reopened_nor_adopted_again() {
    let d = Doubts::new(10 * S);
    let ring3 = ring(&["a", "b", "c"]);
    let k = key_of(&ring3, "a", "b");
    // a and b suspected, never buried: the ring stays.
    change(&d, "c", &ring3, &live(&[]), S);
    let word = d.published(S, &anyone());
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 2 * S, &mut ended, &anyone()));
    assert!(
        !d.in_doubt(&k, 11 * S, &mut ended, &anyone()),
        "past the grace"
    );
    change(&d, "c", &ring3, &live(&[]), 12 * S);
    assert!(
        !d.in_doubt(&k, 12 * S, &mut ended, &anyone()),
        "not reopened"
    );
    assert_eq!(
        d.adopt(&word, &ring3, &live(&[]), &heard("c", 1, 1), 13 * S),
        0,
        "nor adopted"
    );

    let d = Doubts::new(10 * S);
    change(&d, "c", &ring3, &live(&[]), S);
    assert_eq!(d.accept_all().0, 1);
    change(&d, "c", &ring3, &live(&[]), 2 * S);
    assert!(
        !d.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "accepted stays accepted"
    );
}

/// A peer back from a pause publishes, from its minority, a region
/// naming every member it stopped hearing — this node among them, as
/// this process. Only the members this node does not hear make its
/// region (here a crashed c, and d, which it suspects for a moment), and
/// the keys it owns stay its own: before, the heard b stayed in the
/// region and this node was left out of the rebuilt ring, so a key of
/// its own whose place fell to b then c was refused as in doubt
/// (`tests/correlated_faults.rs` under CPU load: keys whose owner lived
/// answered unavailable).
#[test]
fn a_stale_word_puts_in_doubt_only_what_this_node_does_not_hear() {
    let before = ring(&["a", "b", "c", "d", "e"]);
    let without_a = ring(&["b", "c", "d", "e"]);
    let mine = key_where(&before, "a", "b", |k| {
        &*without_a.owner(k).unwrap().node_id == "b"
            && &*without_a.successor(k).unwrap().node_id == "c"
    });
    let of_c_and_d = key_of(&before, "c", "d");
    // e, back from a pause, heard nobody: it names everyone gone.
    let e = Doubts::new(100 * S);
    change(&e, "e", &before, &live(&[]), S);
    let word = e.published(S, &anyone());
    assert_eq!(word.len(), 1);
    assert_eq!(word[0].gone.len(), 4);

    let a = Doubts::new(100 * S);
    let hears = live(&["b", "e"]);
    assert_eq!(a.adopt(&word, &before, &hears, &heard("a", 1, 1), 2 * S), 1);
    let mut ended = Ended::default();
    assert!(
        !a.in_doubt(&mine, 3 * S, &mut ended, &anyone()),
        "a's own key"
    );
    assert!(
        a.in_doubt(&of_c_and_d, 3 * S, &mut ended, &anyone()),
        "neither holder heard here"
    );
    // Once: the same word again adopts nothing.
    assert_eq!(a.adopt(&word, &before, &hears, &heard("a", 1, 1), 4 * S), 0);
    // Heard all but c: nothing to adopt.
    let fresh = Doubts::new(100 * S);
    assert_eq!(
        fresh.adopt(
            &word,
            &before,
            &live(&["b", "d", "e"]),
            &heard("a", 1, 1),
            2 * S
        ),
        0
    );
}

/// b was paused, buried, and is back under a newer generation of the
/// same process; meanwhile k (a's, with b's replica) went to c as its
/// replica holder, and a and c were lost together. A peer's word still
/// names b at its old generation: b is left out of the rebuilt ring (its
/// keys moved off it), so k's holders of record are a and c — in doubt.
/// Kept in the ring, b stood as k's replica holder and answered it
/// exactly from its copy from before the pause (a cold review).
#[test]
fn a_node_named_at_an_older_generation_is_not_a_holder_of_record() {
    let before = ring(&["a", "b", "c", "d", "e"]);
    let without_b = ring(&["a", "c", "d", "e"]);
    let k = key_where(&before, "a", "b", |k| {
        &*without_b.successor(k).unwrap().node_id == "c"
    });
    let word = word_of(&[("a", 1), ("b", 1), ("c", 1)], 50);
    let now = ring(&["b", "d", "e"]);
    let b = Doubts::new(100 * S);
    let rejoined = heard("b", 1, 3);
    assert_eq!(b.adopt(&word, &now, &live(&["d", "e"]), &rejoined, S), 1);
    let mut ended = Ended::default();
    assert!(
        b.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "a and c held it last"
    );

    // Named at its generation now (never buried), b was in that ring
    // as it is: k's replica was its own.
    let never_away = Doubts::new(100 * S);
    let word_now = word_of(&[("a", 1), ("b", 3), ("c", 1)], 50);
    assert_eq!(
        never_away.adopt(&word_now, &now, &live(&["d", "e"]), &rejoined, S),
        1
    );
    assert!(
        !never_away.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "b held it"
    );
}

/// Simulator seed 1985: b's process died (generation 1) and the next
/// one (born 3) rejoined, taking b's keys by the transfer; a was lost
/// later, within the grace of b's burial, so c joined it to the region
/// it opened for b and publishes both. b saw a go as a member holding
/// current copies of what a left it (its transfer complete, a's word
/// that it caught up): the word's rebuilt ring over b's old process does
/// not put b's keys in doubt. Anything less — a loss seen while joining,
/// from its old process's entry, with a never having said it caught up,
/// a member only suspected then heard again, or the seen losses of a
/// process that rejoined since — leaves the word to take.
#[test]
fn a_loss_this_process_saw_holding_current_copies_is_not_read_over_its_old_process() {
    let before = Arc::new(Ring::new([member("a", 1), member("b", 1), member("c", 1)]));
    let with_new_b = Arc::new(Ring::new([member("a", 1), member("b", 3), member("c", 1)]));
    let now = Arc::new(Ring::new([member("b", 3), member("c", 1)]));
    // Owned by b (its old process, then this one), replica with a; and
    // the other way round.
    let k = key_of(&before, "b", "a");
    let k_ab = key_of(&before, "a", "b");
    let word = word_of(&[("b", 1), ("a", 1)], 9);
    let b = heard("b", 3, 3);
    let me_b = Me {
        id: "b",
        confirmed: &|_, _, _| true,
    };
    let changed = |d: &Doubts, previous: &Arc<Ring>, live: &[Heard], held: bool| {
        d.changed(
            &Change {
                me: "b",
                born: 3,
                held: &|_| held,
                previous,
                view: 0,
                live,
            },
            30 * S,
        );
    };
    let adopts = |d: &Doubts| d.adopt(&word, &now, &live(&["c"]), &b, 31 * S);
    let in_doubt = |d: &Doubts, k: &[u8]| d.in_doubt(k, 32 * S, &mut Ended::default(), &me_b);

    let held = Doubts::new(10 * S);
    changed(&held, &with_new_b, &live(&["c"]), true);
    assert_eq!(adopts(&held), 0);
    assert!(!in_doubt(&held, &k), "b owned k, current, when a went");
    assert!(!in_doubt(&held, &k_ab), "b held a's replica, told");

    // a never said b caught up (or b's transfer was not complete): the
    // copies at b may be older than what a and b's old process held.
    let untold = Doubts::new(10 * S);
    changed(&untold, &with_new_b, &live(&["c"]), false);
    assert_eq!(adopts(&untold), 1);
    assert!(in_doubt(&untold, &k));
    assert!(in_doubt(&untold, &k_ab));

    // Still joining: the ring it saw a lost from was its peers' alone.
    let joining = Doubts::new(10 * S);
    changed(
        &joining,
        &Arc::new(Ring::new([member("a", 1), member("c", 1)])),
        &live(&["c"]),
        true,
    );
    assert_eq!(adopts(&joining), 1);
    assert!(
        in_doubt(&joining, &k),
        "b's old process and a held k; b's new one took it from neither"
    );
    // So too with its old process's entry in the ring it saw a lost from.
    let old_entry = Doubts::new(10 * S);
    changed(&old_entry, &before, &live(&["c"]), true);
    assert_eq!(adopts(&old_entry), 1);
    assert!(in_doubt(&old_entry, &k));

    // a only suspected, then heard again as the process it was: no loss
    // seen; its real loss later (unseen here) is the word's.
    let suspected = Doubts::new(10 * S);
    changed(&suspected, &with_new_b, &live(&["c"]), true);
    changed(
        &suspected,
        &with_new_b,
        &[heard("a", 1, 1), heard("c", 1, 1)],
        true,
    );
    assert_eq!(adopts(&suspected), 1);
    assert!(in_doubt(&suspected, &k));

    // This process rejoined since (buried and back): the rings it saw
    // the loss in are forgotten with its regions.
    let rejoined = Doubts::new(10 * S);
    changed(&rejoined, &with_new_b, &live(&["c"]), true);
    rejoined.forget();
    assert_eq!(adopts(&rejoined), 1);
    assert!(in_doubt(&rejoined, &k));
}

/// The same with four members and one loss seen, one not: a (seen: it
/// told b it caught up) keeps its place in the rebuilt rings but is not
/// gone; d (never told b) is. Keys of b's old process and d stay in
/// doubt, those of b's old process and a do not, and keys of a and d
/// are in doubt under b's own region over the ring it saw both lost from.
#[test]
fn of_two_losses_after_the_rejoin_only_the_one_held_is_seen() {
    let before = Arc::new(Ring::new(["a", "b", "c", "d"].map(|id| member(id, 1))));
    let with_new_b = Arc::new(Ring::new([
        member("a", 1),
        member("b", 3),
        member("c", 1),
        member("d", 1),
    ]));
    let now = Arc::new(Ring::new([member("b", 3), member("c", 1)]));
    let d = Doubts::new(10 * S);
    d.changed(
        &Change {
            me: "b",
            born: 3,
            held: &|id| id == "a",
            previous: &with_new_b,
            view: 0,
            live: &live(&["c"]),
        },
        30 * S,
    );
    let word = word_of(&[("b", 1), ("a", 1), ("d", 1)], 9);
    assert_eq!(
        d.adopt(&word, &now, &live(&["c"]), &heard("b", 3, 3), 31 * S),
        1
    );
    let me_b = Me {
        id: "b",
        confirmed: &|_, _, _| true,
    };
    let in_doubt = |k: &[u8]| d.in_doubt(k, 32 * S, &mut Ended::default(), &me_b);
    assert!(
        in_doubt(&key_of(&before, "b", "d")),
        "d's loss is the word's"
    );
    assert!(!in_doubt(&key_of(&before, "b", "a")), "a left b its copies");
    assert!(in_doubt(&key_of(&before, "a", "d")), "b's own region");
    assert!(!in_doubt(&key_of(&before, "a", "c")), "c lives");
}

/// Simulator seed 937 of `--mix any`: e, k's replica holder under a
/// (ring `a..e`), was paused and replaced — in `a..d` k's holder is b —
/// then a and b crashed together. e, back as a new generation, still held
/// its copy from before its replacement. A new node n, adopting c's word
/// over `a..d`, rebuilt that ring from its own (c, d, e, n) and the
/// losses: e stood in it as k's holder of record, live, and n answered k
/// exactly from e's stale copy. The word names its ring: e, newer than
/// it, is left out, and the rebuild is the ring the fault began in.
#[test]
fn a_member_back_since_as_a_new_generation_is_no_holder_of_a_word_it_was_not_in() {
    let with_e = ring(&["a", "b", "c", "d", "e"]);
    let before = ring(&["a", "b", "c", "d"]);
    let now = Arc::new(Ring::new([
        member("c", 1),
        member("d", 1),
        member("e", 5),
        member("n", 6),
    ]));
    let k = key_where(&with_e, "a", "e", |k| {
        &*before.successor(k).unwrap().node_id == "b" && &*now.owner(k).unwrap().node_id == "n"
    });
    let survivor = Doubts::new(10 * S);
    change(&survivor, "c", &before, &live(&["d"]), S);
    let word = survivor.published(S, &anyone());
    assert_eq!(word[0].ring, (before.epoch(), 1), "the word names its ring");
    let hears = [heard("c", 1, 1), heard("d", 1, 1), heard("e", 1, 5)];
    let n = Doubts::new(10 * S);
    assert_eq!(n.adopt(&word, &now, &hears, &heard("n", 6, 6), S), 1);
    let mut ended = Ended::default();
    assert!(
        n.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "a and b held it last, both lost"
    );
    // The same word unnamed (an earlier release's) is rebuilt with e in it.
    let unnamed: Vec<PublishedDoubt> = word
        .iter()
        .map(|w| PublishedDoubt {
            ring: (0, 0),
            ..w.clone()
        })
        .collect();
    let trusting = Doubts::new(10 * S);
    assert_eq!(
        trusting.adopt(&unnamed, &now, &hears, &heard("n", 6, 6), S),
        1
    );
    assert!(!trusting.in_doubt(&k, 2 * S, &mut ended, &anyone()));

    // A rebuild that cannot come to the ring named — f was in it and left
    // cleanly since, so it stands nowhere now — is read from the losses
    // alone: every key a or b owned there is in doubt, k's sibling whose
    // holder was f too.
    let with_f = ring(&["a", "b", "c", "d", "f"]);
    let k_af = key_where(&with_f, "a", "f", |k| {
        &*now.owner(k).unwrap().node_id == "n"
    });
    let survivor_f = Doubts::new(10 * S);
    change(&survivor_f, "c", &with_f, &live(&["d", "f"]), S);
    let word_f = survivor_f.published(S, &anyone());
    let n_f = Doubts::new(10 * S);
    assert_eq!(n_f.adopt(&word_f, &now, &hears, &heard("n", 6, 6), S), 1);
    assert!(n_f.in_doubt(&k, 2 * S, &mut ended, &anyone()));
    assert!(
        n_f.in_doubt(&k_af, 2 * S, &mut ended, &anyone()),
        "the safe side: f's copy cannot be told from a newcomer's"
    );
    // A member of the word's losses heard back later (as the process it
    // was) stands nowhere in a region read from its losses: where it stood
    // is not known here, so it holds no key of record — every key stays
    // in doubt while two are still gone (a cold review; seed 937: such a
    // holder, back, had stood in a ring of the losses as k's holder).
    let word_3 = survivor_f.published(S, &anyone());
    let three: Vec<PublishedDoubt> = word_3
        .iter()
        .map(|w| PublishedDoubt {
            gone: [w.gone.clone(), vec![(Arc::from("e"), 1)]].concat(),
            ..w.clone()
        })
        .collect();
    let hears_no_e = [heard("c", 1, 1), heard("d", 1, 1)];
    let n_e = Doubts::new(10 * S);
    assert_eq!(
        n_e.adopt(&three, &now, &hears_no_e, &heard("n", 6, 6), S),
        1
    );
    let hears_e_back = [heard("c", 1, 1), heard("d", 1, 1), heard("e", 1, 5)];
    change(&n_e, "n", &now, &hears_e_back, S);
    assert!(
        n_e.in_doubt(&k, 2 * S, &mut ended, &anyone()),
        "a and b still gone"
    );
    assert_eq!(
        n_e.adopt(&three, &now, &hears_e_back, &heard("n", 6, 6), S),
        0,
        "held already: not adopted again on the next view"
    );
    assert!(
        !n_e.in_doubt(&k, 12 * S, &mut ended, &anyone()),
        "the grace"
    );
}

/// A node rejoined since (a new generation of the same process) that was
/// in the ring the word names is left out of the rebuild, as before: it
/// is tried in its place, at the generations its process had, only to
/// check the rest — which then stands, not the losses alone.
#[test]
fn a_rejoined_adopter_checks_the_rebuild_at_the_generation_it_had() {
    let before = ring(&["a", "b", "c", "d"]);
    let survivor = Doubts::new(10 * S);
    change(&survivor, "d", &before, &live(&["c"]), S);
    let word = survivor.published(S, &anyone());
    // c rejoined as generation 4 and forgot its regions.
    let now = Arc::new(Ring::new([member("c", 4), member("d", 1)]));
    let c = Doubts::new(10 * S);
    assert_eq!(c.adopt(&word, &now, &live(&["d"]), &heard("c", 1, 4), S), 1);
    let r = &c.regions()[0];
    assert_eq!(
        r.previous.epoch(),
        ring(&["a", "b", "d"]).epoch(),
        "c left out"
    );
}
