//! The regions of doubt's unit tests: which keys a loss puts in doubt,
//! what ends it (a holder back, the grace, an operator), and what a node
//! adopts from its peers' word.
use super::*;

const S: Nanos = 1_000_000_000;

fn member(id: &str, generation: u64) -> Member {
    Member {
        node_id: id.into(),
        generation,
        grpc_addr: String::new(),
        protocol: crate::proto::PEER_PROTOCOL_VERSION,
        zone: Arc::from(""),
    }
}

fn ring(ids: &[&str]) -> Arc<Ring> {
    Arc::new(Ring::new(ids.iter().map(|id| member(id, 1))))
}

/// A key of `ring` owned by `owner` whose replica is `replica`.
fn key_of(ring: &Ring, owner: &str, replica: &str) -> Vec<u8> {
    key_where(ring, owner, replica, |_| true)
}

/// [`key_of`], also meeting `also`.
fn key_where(ring: &Ring, owner: &str, replica: &str, also: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    (0..)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| {
            &*ring.owner(k).unwrap().node_id == owner
                && &*ring.successor(k).unwrap().node_id == replica
                && also(k)
        })
        .unwrap()
}

/// `id`, born at `born`, heard at `generation`.
fn heard(id: &str, born: u64, generation: u64) -> Heard {
    Heard {
        node_id: id.into(),
        born,
        generation,
    }
}

fn live(ids: &[&str]) -> Vec<Heard> {
    ids.iter().map(|id| heard(id, 1, 1)).collect()
}

/// A peer's word: one region with `gone` (id, generation) and `secs` left.
fn word_of(gone: &[(&str, u64)], secs: u64) -> Vec<PublishedDoubt> {
    vec![PublishedDoubt {
        gone: gone.iter().map(|(id, g)| (Arc::from(*id), *g)).collect(),
        zones: Vec::new(),
        remaining: std::time::Duration::from_secs(secs),
        untold: Vec::new(),
    }]
}

/// A node every owner said holds its replicas: the ring's word on holders
/// stands (an id in no ring).
fn anyone() -> Me<'static> {
    Me {
        id: "",
        confirmed: &|_, _| true,
    }
}

/// `me` moves from `previous` to a view with `live` peers.
fn change(d: &Doubts, me: &str, previous: &Arc<Ring>, live: &[Heard], at: Nanos) -> Ended {
    d.changed(
        &Change {
            me,
            born: 1,
            held: &|_| true,
            previous,
            live,
        },
        at,
    )
}

#[test]
fn owner_and_replica_holder_gone_puts_the_key_in_doubt_until_the_grace() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    let k = key_of(&before, "a", "b");
    change(&d, "c", &before, &live(&[]), 20 * S);
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 21 * S, &mut ended, &anyone()));
    assert!(
        d.in_doubt(&k, 29 * S, &mut ended, &anyone()),
        "burial does not end it"
    );
    assert_eq!(d.figures(), (1, 1));
    assert!(
        !d.in_doubt(&k, 30 * S, &mut ended, &anyone()),
        "past the grace"
    );
    assert_eq!(ended, Ended { taken: 1 });
    assert_eq!(d.figures(), (0, 0));
}

#[test]
fn one_loss_alone_puts_nothing_in_doubt_and_costs_one_load() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    change(&d, "b", &before, &live(&["c"]), S);
    assert!(
        !d.any(),
        "an owner's replica holder is another member, live"
    );
    let mut ended = Ended::default();
    for (o, r) in [("a", "b"), ("a", "c"), ("b", "a"), ("c", "a")] {
        assert!(!d.in_doubt(&key_of(&before, o, r), 2 * S, &mut ended, &anyone()));
    }
}

#[test]
fn an_owner_and_its_replica_holder_lost_a_view_apart_are_one_fault() {
    // a owns k, b holds its replica. b goes first (c is k's replica
    // holder now, d its owner-to-be's neighbour), then a, before it
    // re-replicated k to c: d, which owns k now, was neither.
    let d = Doubts::new(10 * S);
    let v0 = ring(&["a", "b", "c", "d"]);
    let owner_now = ring(&["c", "d"]);
    let k = key_where(&v0, "a", "b", |k| {
        &*owner_now.owner(k).unwrap().node_id == "d"
    });
    change(&d, "d", &v0, &live(&["a", "c"]), S);
    assert!(!d.any(), "b alone: nothing in doubt yet");
    let v1 = ring(&["a", "c", "d"]);
    change(&d, "d", &v1, &live(&["c"]), 2 * S);
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 3 * S, &mut ended, &anyone()));
}

#[test]
fn a_live_holder_of_record_settles_the_key_and_one_back_resolves_it() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    let k_ab = key_of(&before, "a", "b");
    let k_ac = key_of(&before, "a", "c");
    let k_bc = key_of(&before, "b", "c");
    change(&d, "c", &before, &live(&[]), S);
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k_ab, 2 * S, &mut ended, &anyone()));
    // c was a's or b's replica holder: its copy is of record.
    assert!(!d.in_doubt(&k_ac, 2 * S, &mut ended, &anyone()));
    assert!(!d.in_doubt(&k_bc, 2 * S, &mut ended, &anyone()));
    // a comes back (same generation: it was paused): one holder of
    // record answers, the key is settled.
    change(&d, "c", &ring(&["c"]), &live(&["a"]), 3 * S);
    assert!(!d.in_doubt(&k_ab, 4 * S, &mut ended, &anyone()));
    // b too: resolved, nothing taken from a best copy.
    change(&d, "c", &ring(&["a", "c"]), &live(&["a", "b"]), 5 * S);
    assert_eq!(d.figures(), (0, 0));
    assert_eq!(ended, Ended { taken: 0 });
}

#[test]
fn a_member_back_with_a_new_generation_does_not_resolve_it() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    let k = key_of(&before, "a", "b");
    change(&d, "c", &before, &live(&[]), S);
    let restarted = vec![heard("a", 2, 2), heard("b", 2, 2)];
    let mut ended = Ended::default();
    change(&d, "c", &ring(&["c"]), &restarted, 2 * S);
    assert!(
        d.in_doubt(&k, 3 * S, &mut ended, &anyone()),
        "its state was lost"
    );
    assert!(
        !d.in_doubt(&k, 11 * S, &mut ended, &anyone()),
        "past the grace"
    );
    assert_eq!(ended, Ended { taken: 1 });
}

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

/// A holder paused past its burial rejoins under a newer generation,
/// the same process (born at the generation that was lost): its copies
/// lived through the pause, so it is back as the holder of record.
#[test]
fn a_process_back_under_a_newer_generation_resolves_it() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    let k = key_of(&before, "a", "b");
    change(&d, "c", &before, &live(&[]), S);
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 2 * S, &mut ended, &anyone()));
    // a restarted (born anew); b rejoined (born at 1, now 3).
    let back = vec![heard("a", 2, 2), heard("b", 1, 3)];
    change(&d, "c", &ring(&["c"]), &back, 3 * S);
    assert!(
        !d.in_doubt(&k, 4 * S, &mut ended, &anyone()),
        "b's copy is back"
    );
    assert_eq!(d.figures(), (0, 0), "nothing in doubt, nothing counted");
    assert!(!d.in_doubt(&k, 12 * S, &mut ended, &anyone()));
    assert_eq!(ended, Ended { taken: 0 }, "nothing taken from a best copy");
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

/// Simulator seed 89, the keys' side: a (k's owner) went on deciding k
/// with d as its replica holder once b, its first one, was buried; then a
/// crashed, d was lost, and b came back as the process it was, with its
/// copy from before. Of the first ring's holders of k one is back, but k
/// was decided in the ring after b's loss, whose holders are both gone:
/// k stays in doubt — at the restarted owner, which adopted the region
/// before b's return, at a node that adopts it after, and at the node
/// that saw it all.
#[test]
fn a_holder_replaced_before_the_owner_went_does_not_end_the_doubt() {
    let v0 = ring(&["a", "b", "c", "d", "e"]);
    let v1 = ring(&["a", "c", "d", "e"]);
    let k = key_where(&v0, "a", "b", |k| &*v1.successor(k).unwrap().node_id == "d");
    // e saw it all: b lost, then a (within the grace).
    let survivor = Doubts::new(30 * S);
    change(&survivor, "e", &v0, &live(&["a", "c", "d"]), S);
    change(&survivor, "e", &v1, &live(&["c", "d"]), 2 * S);
    let word = survivor.published(3 * S, &anyone());
    let b_back = [heard("c", 1, 1), heard("e", 1, 1), heard("b", 1, 2)];
    let mut ended = Ended::default();

    // a restarted (born 5): it adopts the region while b is away, then
    // loses d, then hears b back.
    let me = heard("a", 5, 5);
    let a_now = |ids: &[&str]| {
        Arc::new(Ring::new(
            std::iter::once(member("a", 5)).chain(ids.iter().map(|id| member(id, 1))),
        ))
    };
    let restarted = Doubts::new(30 * S);
    let heard_then = live(&["c", "d", "e"]);
    assert_eq!(
        restarted.adopt(&word, &a_now(&["c", "d", "e"]), &heard_then, &me, 4 * S),
        1
    );
    assert!(
        restarted.in_doubt(&k, 4 * S, &mut ended, &anyone()),
        "a's old process lost it"
    );
    change(
        &restarted,
        "a",
        &a_now(&["c", "d", "e"]),
        &live(&["c", "e"]),
        5 * S,
    );
    assert!(restarted.in_doubt(&k, 6 * S, &mut ended, &anyone()));
    change(&restarted, "a", &a_now(&["c", "e"]), &b_back, 7 * S);
    assert!(
        restarted.in_doubt(&k, 8 * S, &mut ended, &anyone()),
        "b's copy is from before k's last decisions"
    );

    // e's own regions keep it in doubt through b's return too, and what
    // it publishes then names b (back) where it was lost.
    change(
        &survivor,
        "e",
        &ring(&["c", "d", "e"]),
        &live(&["c"]),
        5 * S,
    );
    change(
        &survivor,
        "e",
        &ring(&["c", "e"]),
        &[heard("c", 1, 1), heard("b", 1, 2)],
        7 * S,
    );
    let late_word = survivor.published(8 * S, &anyone());
    assert!(
        late_word
            .iter()
            .any(|p| p.gone.first() == Some(&(Arc::from("b"), 1)))
    );

    // A node adopting after b's return rebuilds the ring b was lost from.
    let late = Doubts::new(30 * S);
    let b_now = [heard("c", 1, 1), heard("b", 1, 2)];
    let ring_now = Arc::new(Ring::new([
        member("a", 5),
        member("b", 2),
        member("c", 1),
        member("e", 1),
    ]));
    // (The region naming b covers k; the later one alone would not: its
    // ring is rebuilt with b in it. Both, or the first alone.)
    assert!(late.adopt(&late_word, &ring_now, &b_now, &me, 9 * S) >= 1);
    assert!(late.in_doubt(&k, 10 * S, &mut ended, &anyone()));
    // A key whose holders after b's loss include a live member is not.
    let fine = key_where(&v0, "a", "b", |k| &*v1.successor(k).unwrap().node_id == "c");
    assert!(!late.in_doubt(&fine, 10 * S, &mut ended, &anyone()));
}

/// A loss that joins a region restarts its grace: the keys of the ring
/// before it came in doubt only with it.
#[test]
fn a_later_loss_restarts_the_grace() {
    let d = Doubts::new(10 * S);
    let v0 = ring(&["a", "b", "c", "d", "e"]);
    let v1 = ring(&["a", "c", "d", "e"]);
    let k = key_where(&v0, "a", "b", |k| &*v1.successor(k).unwrap().node_id == "d");
    change(&d, "e", &v0, &live(&["a", "c", "d"]), S);
    change(&d, "e", &v1, &live(&["c", "d"]), 2 * S);
    change(&d, "e", &ring(&["c", "d", "e"]), &live(&["c"]), 8 * S);
    let mut ended = Ended::default();
    assert!(
        d.in_doubt(&k, 17 * S, &mut ended, &anyone()),
        "10 s from d's loss, not b's"
    );
    assert!(!d.in_doubt(&k, 18 * S, &mut ended, &anyone()));
}

/// A key's doubt runs the grace from its second holder's loss: a later
/// loss that is none of its holders (a member of the ring, or one that
/// joined after it) keeps the region open for its own keys, not this
/// one's. And a region names each member once.
#[test]
fn an_unrelated_loss_does_not_lengthen_a_keys_doubt() {
    let d = Doubts::new(10 * S);
    let v0 = ring(&["a", "b", "c", "d", "e"]);
    let k = key_of(&v0, "a", "b");
    change(&d, "e", &v0, &live(&["c", "d"]), S);
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 10 * S, &mut ended, &anyone()));
    // c is lost at 6 s, and j (joined after v0) at 7 s.
    change(&d, "e", &ring(&["c", "d", "e"]), &live(&["d"]), 6 * S);
    change(&d, "e", &ring(&["d", "e", "j"]), &live(&["d"]), 7 * S);
    assert!(
        !d.in_doubt(&k, 11 * S, &mut ended, &anyone()),
        "10 s from b's loss"
    );
    // c and j are gone (each once), a and b too: the region goes on.
    let word = d.published(11 * S, &anyone());
    let named: Vec<&str> = word
        .iter()
        .flat_map(|p| p.gone.iter().map(|(id, _)| &**id))
        .collect();
    assert!(named.contains(&"c") && named.contains(&"j"), "{named:?}");
    for p in &word {
        let mut ids: Vec<&str> = p.gone.iter().map(|(id, _)| &**id).collect();
        ids.sort();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "one entry per id: {:?}", p.gone);
    }
}

/// A holder back and lost again puts its keys in doubt anew: the grace
/// runs from its last loss.
#[test]
fn a_holder_lost_again_restarts_its_keys_grace() {
    let d = Doubts::new(10 * S);
    let v0 = ring(&["a", "b", "c", "d", "e"]);
    let k = key_where(&v0, "a", "b", |k| {
        &*ring(&["c", "d", "e"]).owner(k).unwrap().node_id == "e"
    });
    change(&d, "e", &v0, &live(&["b", "c", "d"]), S);
    change(
        &d,
        "e",
        &ring(&["b", "c", "d", "e"]),
        &live(&["c", "d"]),
        3 * S,
    );
    let mut ended = Ended::default();
    assert!(d.in_doubt(&k, 4 * S, &mut ended, &anyone()));
    // a is back (the same process, rejoined), then lost again at 9 s.
    let a_back = [heard("a", 1, 2), heard("c", 1, 1), heard("d", 1, 1)];
    change(&d, "e", &ring(&["c", "d", "e"]), &a_back, 5 * S);
    assert!(
        !d.in_doubt(&k, 6 * S, &mut ended, &anyone()),
        "a holder of record is back"
    );
    let with_a = Arc::new(Ring::new([
        member("a", 2),
        member("c", 1),
        member("d", 1),
        member("e", 1),
    ]));
    change(&d, "e", &with_a, &live(&["c", "d"]), 9 * S);
    assert!(
        d.in_doubt(&k, 18 * S, &mut ended, &anyone()),
        "10 s from a's last loss"
    );
    assert!(!d.in_doubt(&k, 19 * S, &mut ended, &anyone()));
}

/// Six members in three zones of two: "a@z1" is a in zone z1.
fn zoned_ring(specs: &[&str]) -> Arc<Ring> {
    Arc::new(Ring::new(specs.iter().map(|s| {
        let (id, zone) = s.split_once('@').unwrap_or((s, ""));
        Member {
            zone: Arc::from(zone),
            ..member(id, 1)
        }
    })))
}

/// A whole zone lost at once: with replicas in another zone no key lost
/// both its holders, and none is in doubt — here and at a node that
/// adopts the region's word (the word carries the zones, so the adopter
/// rebuilds the ring that placed them). Zone-blind, the same loss puts
/// the keys the zone both owned and held in doubt.
#[test]
fn a_zone_lost_at_once_puts_no_key_in_doubt_when_replicas_span_zones() {
    let specs = ["a@z1", "b@z1", "c@z2", "d@z2", "e@z3", "f@z3"];
    let zoned = zoned_ring(&specs);
    let blind = ring(&["a", "b", "c", "d", "e", "f"]);
    let keys: Vec<Vec<u8>> = (0..3_000).map(|i| format!("k{i}").into_bytes()).collect();
    let lost_zone = |k: &Vec<u8>, r: &Ring| {
        let (o, h) = (r.owner(k).unwrap(), r.successor(k).unwrap());
        [&*o.node_id, &*h.node_id]
            .iter()
            .all(|id| ["c", "d"].contains(id))
    };
    assert!(keys.iter().all(|k| !lost_zone(k, &zoned)));
    let both_in_zone: Vec<&Vec<u8>> = keys.iter().filter(|k| lost_zone(k, &blind)).collect();
    assert!(both_in_zone.len() > 100, "{}", both_in_zone.len());

    let mut ended = Ended::default();
    let here = Doubts::new(10 * S);
    change(&here, "a", &zoned, &live(&["b", "e", "f"]), S);
    assert!(
        keys.iter()
            .all(|k| !here.in_doubt(k, 2 * S, &mut ended, &anyone()))
    );
    let word = here.published(S, &anyone());
    assert_eq!(word.len(), 1, "the region is published all the same");
    assert_eq!(&*word[0].zone_of("c"), "z2");

    // g joins after the loss and adopts the word.
    let now: Arc<Ring> = zoned_ring(&["a@z1", "b@z1", "e@z3", "f@z3", "g@z2"]);
    let hears = live(&["a", "b", "e", "f"]);
    let g = Doubts::new(10 * S);
    assert_eq!(g.adopt(&word, &now, &hears, &heard("g", 1, 1), S), 1);
    assert!(
        keys.iter()
            .all(|k| !g.in_doubt(k, 2 * S, &mut ended, &anyone()))
    );
    // The same word without its zones: the adopter's ring is zone-blind.
    let blind_word: Vec<PublishedDoubt> = word
        .iter()
        .map(|w| PublishedDoubt {
            zones: Vec::new(),
            ..w.clone()
        })
        .collect();
    let g = Doubts::new(10 * S);
    assert_eq!(g.adopt(&blind_word, &now, &hears, &heard("g", 1, 1), S), 1);
    assert!(
        keys.iter()
            .any(|k| g.in_doubt(k, 2 * S, &mut ended, &anyone()))
    );

    let blind_here = Doubts::new(10 * S);
    change(&blind_here, "a", &blind, &live(&["b", "e", "f"]), S);
    assert!(
        both_in_zone
            .iter()
            .all(|k| blind_here.in_doubt(k, 2 * S, &mut ended, &anyone()))
    );
}

/// A member that joined after a region's ring and was lost with it is
/// published with its zone too (read from the ring it was lost from), so
/// an adopter's rings place replicas by zone as the publisher's did.
#[test]
fn a_member_lost_after_joining_is_published_with_its_zone() {
    let d = Doubts::new(10 * S);
    let first = zoned_ring(&["a@z1", "b@z2", "c@z1", "d@z2"]);
    change(&d, "a", &first, &live(&["b", "d"]), S);
    let joined = zoned_ring(&["a@z1", "b@z2", "d@z2", "e@z3"]);
    change(&d, "a", &joined, &live(&["b"]), 2 * S);
    let word = d.published(2 * S, &anyone());
    let over_first = word
        .iter()
        .find(|w| w.gone.iter().any(|(id, _)| &**id == "c"))
        .expect("the region over the first ring is published");
    assert!(over_first.gone.iter().any(|(id, _)| &**id == "e"));
    for (id, zone) in [("c", "z1"), ("d", "z2"), ("e", "z3")] {
        assert_eq!(&*over_first.zone_of(id), zone, "{id}");
    }
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
        confirmed: &|_, _| true,
    };
    let changed = |d: &Doubts, previous: &Arc<Ring>, live: &[Heard], held: bool| {
        d.changed(
            &Change {
                me: "b",
                born: 3,
                held: &|_| held,
                previous,
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
        confirmed: &|_, _| true,
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
