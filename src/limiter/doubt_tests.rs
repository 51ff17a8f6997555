//! The regions of doubt's unit tests: which keys a loss puts in doubt and
//! what ends it (a holder back, the grace, an operator). What a node
//! adopts from its peers' word is `doubt_adopt_tests.rs`'s; the helpers
//! here serve both.
use super::*;
use crate::cluster::ring::Member;

pub(super) const S: Nanos = 1_000_000_000;

pub(super) fn member(id: &str, generation: u64) -> Member {
    Member {
        node_id: id.into(),
        generation,
        grpc_addr: String::new(),
        protocol: crate::proto::PEER_PROTOCOL_VERSION,
        zone: Arc::from(""),
    }
}

pub(super) fn ring(ids: &[&str]) -> Arc<Ring> {
    Arc::new(Ring::new(ids.iter().map(|id| member(id, 1))))
}

/// A key of `ring` owned by `owner` whose replica is `replica`.
pub(super) fn key_of(ring: &Ring, owner: &str, replica: &str) -> Vec<u8> {
    key_where(ring, owner, replica, |_| true)
}

/// [`key_of`], also meeting `also`.
pub(super) fn key_where(
    ring: &Ring,
    owner: &str,
    replica: &str,
    also: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
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
pub(super) fn heard(id: &str, born: u64, generation: u64) -> Heard {
    Heard {
        node_id: id.into(),
        born,
        generation,
    }
}

pub(super) fn live(ids: &[&str]) -> Vec<Heard> {
    ids.iter().map(|id| heard(id, 1, 1)).collect()
}

/// A peer's word: one region with `gone` (id, generation) and `secs` left.
pub(super) fn word_of(gone: &[(&str, u64)], secs: u64) -> Vec<PublishedDoubt> {
    vec![PublishedDoubt {
        gone: gone.iter().map(|(id, g)| (Arc::from(*id), *g)).collect(),
        zones: Vec::new(),
        remaining: std::time::Duration::from_secs(secs),
        untold: Vec::new(),
        ring: (0, 0),
    }]
}

/// A node every owner said holds its replicas: the ring's word on holders
/// stands (an id in no ring).
pub(super) fn anyone() -> Me<'static> {
    Me {
        id: "",
        confirmed: &|_, _, _| true,
    }
}

/// `me` moves from `previous` to a view with `live` peers.
pub(super) fn change(
    d: &Doubts,
    me: &str,
    previous: &Arc<Ring>,
    live: &[Heard],
    at: Nanos,
) -> Ended {
    d.changed(
        &Change {
            me,
            born: 1,
            held: &|_| true,
            previous,
            view: 0,
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

/// The process back lost again before it handed this node its copies (a
/// holder told to leave while it rejoined, killed mid-leave:
/// `leavers.rs`): its keys are in doubt again, the grace from the new
/// loss. Another process of it is not the one the region lost.
#[test]
fn a_process_back_and_lost_again_puts_its_keys_in_doubt_again() {
    let d = Doubts::new(10 * S);
    let before = ring(&["a", "b", "c"]);
    let k = key_of(&before, "a", "b");
    change(&d, "c", &before, &live(&[]), S);
    let back = vec![heard("a", 2, 2), heard("b", 1, 3)];
    change(&d, "c", &ring(&["c"]), &back, 3 * S);
    let mut ended = Ended::default();
    assert!(
        !d.in_doubt(&k, 4 * S, &mut ended, &anyone()),
        "b's copy is back"
    );
    d.lost_again("b", 2..=3, 5 * S);
    assert!(
        !d.in_doubt(&k, 6 * S, &mut ended, &anyone()),
        "another process of b"
    );
    d.lost_again("b", 1..=3, 5 * S);
    assert!(d.in_doubt(&k, 6 * S, &mut ended, &anyone()));
    assert!(
        d.in_doubt(&k, 14 * S, &mut ended, &anyone()),
        "from the new loss"
    );
    assert!(!d.in_doubt(&k, 16 * S, &mut ended, &anyone()));
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

/// A node not in the ring before a change (new, or back as a new member)
/// read that ring from gossip as it first heard it — members replaced
/// already may stand in it (simulator seed 937 of `--mix any`: a holder
/// back from a ring the cluster left, its copy stale). Its region is over
/// the members lost alone: nothing while one is gone; once two are (one a
/// view later too), every key it owns is in doubt, the one a live member
/// held included. A member of that ring reads it as it is.
#[test]
fn a_node_not_in_the_ring_before_reads_its_losses_alone() {
    let guessed = ring(&["a", "b", "c", "d", "e"]);
    let without_a = ring(&["b", "c", "d", "e"]);
    let k_ae = key_of(&guessed, "a", "e");
    let k_cd = key_of(&guessed, "c", "d");
    let k_ab = key_of(&guessed, "a", "b");
    let newcomer = Doubts::new(10 * S);
    change(&newcomer, "n", &guessed, &live(&["b", "c", "d", "e"]), S);
    assert!(!newcomer.any(), "one loss covers nothing");
    change(&newcomer, "n", &without_a, &live(&["c", "d", "e"]), 2 * S);
    let mut ended = Ended::default();
    for k in [&k_ae, &k_cd, &k_ab] {
        assert!(newcomer.in_doubt(k, 3 * S, &mut ended, &anyone()));
    }
    assert!(
        !newcomer.in_doubt(&k_ab, 13 * S, &mut ended, &anyone()),
        "the grace runs from the later loss"
    );
    // Its guess is its own: no peer could rebuild it (each would guess
    // too, its whole keyspace in doubt).
    assert!(newcomer.published(3 * S, &anyone()).is_empty());
    // A member now, it reads its own rings: a later loss does not extend
    // the guess (an ordinary crash kept the whole keyspace in doubt).
    let joined = ring(&["c", "d", "e", "n"]);
    change(&newcomer, "n", &joined, &live(&["c", "e"]), 4 * S);
    assert!(!newcomer.in_doubt(&k_cd, 13 * S, &mut ended, &anyone()));
    let member = Doubts::new(10 * S);
    change(&member, "c", &guessed, &live(&["b", "d", "e"]), S);
    change(&member, "c", &without_a, &live(&["d", "e"]), 2 * S);
    assert!(member.in_doubt(&k_ab, 3 * S, &mut ended, &anyone()));
    assert!(
        !member.in_doubt(&k_ae, 3 * S, &mut ended, &anyone()),
        "e held it"
    );
    assert!(!member.in_doubt(&k_cd, 3 * S, &mut ended, &anyone()));
}
