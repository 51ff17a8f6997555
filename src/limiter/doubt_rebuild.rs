//! The ring a peer's region of doubt began in, as an adopter rebuilds it
//! from its own ring and the word's losses — and checks against the ring
//! the word names.

use std::sync::Arc;

use super::Heard;
use crate::cluster::membership::doubts::PublishedDoubt;
use crate::cluster::ring::{Member, Ring, epoch_of_ring};

/// The ring a peer's word `p` began in, rebuilt here: the members gone take
/// the places they had; the rest of this node's ring `ring` stands for the
/// rest of that ring. This node (`me`) is in it as this process only when
/// the word named it so (`named_me`), else left out: a new node id was not
/// there at all; named at an older generation of this process, its keys
/// moved off it meanwhile (kept in, it stood as the next holder of a key
/// whose later holders were lost, and answered it exactly from its copy
/// from before a pause — a cold review); one that was there and live saw
/// the change and holds its own region, or rejoined since and forgot it.
///
/// A member that joined (or rejoined, as a new generation) since stands in
/// that rebuild as if it had been there, and as a live holder of record it
/// hides keys whose real holders were both lost (simulator seed 937 of
/// `--mix any`: a paused replica holder, replaced and back as a new
/// generation, held a copy from before its replacement). So where the word
/// names its ring, members newer than that ring's newest are left out, and
/// the rebuild must come to the ring named — up to this node's own place,
/// tried at the generations its process had and the word names. One that
/// does not (a member that joined and left since; one back at its old
/// generation) is not rebuilt (`None`): the region is read from its losses
/// alone (`of_losses`, `Region::guess`) — every key this node owns is in
/// doubt while two are gone, for the grace: more doubt than the
/// publisher's, on the safe side, and only on a node that did not see the
/// change. A word that names no ring
/// (an earlier release's) is rebuilt as before.
pub(super) fn rebuild(
    ring: &Ring,
    p: &PublishedDoubt,
    lost: &[(Arc<str>, u64)],
    me: &Heard,
    named_me: bool,
) -> Option<Ring> {
    let (epoch, newest) = p.ring;
    let is_lost = |id: &Arc<str>| lost.iter().any(|(l, _)| l == id);
    let mine = ring
        .members()
        .iter()
        .filter(|m| named_me && m.node_id == me.node_id && !is_lost(&m.node_id));
    let others = ring.members().iter().filter(|m| {
        m.node_id != me.node_id && !is_lost(&m.node_id) && (epoch == 0 || m.generation <= newest)
    });
    let members: Vec<Member> = others
        .cloned()
        .chain(mine.cloned())
        .chain(as_members(p, lost))
        .collect();
    // Only epochs are compared (a ring is built once, for the answer).
    let matches =
        |extra: Option<Member>| epoch_of_ring(members.iter().cloned().chain(extra)) == epoch;
    if epoch == 0 || matches(None) {
        return Some(Ring::new(members));
    }
    // Left out, this node is tried in its place to check the rest.
    let me_then = ring.member(&me.node_id).cloned().unwrap_or_else(|| Member {
        node_id: me.node_id.clone(),
        zone: p.zone_of(&me.node_id),
        ..Member::default()
    });
    let named = p.gone.iter().filter(|(id, _)| *id == me.node_id);
    let mut generations: Vec<u64> = [me.born, me.generation]
        .into_iter()
        .chain(named.map(|(_, g)| *g))
        .collect();
    generations.sort_unstable();
    generations.dedup();
    let as_then = |generation| Member {
        generation,
        ..me_then.clone()
    };
    if !named_me && generations.into_iter().any(|g| matches(Some(as_then(g)))) {
        return Some(Ring::new(members));
    }
    tracing::debug!(
        ring = ?ring.members().iter().map(|m| (&*m.node_id, m.generation)).collect::<Vec<_>>(),
        "a peer's region of doubt not rebuilt: the ring it names is not this node's with its losses"
    );
    None
}

/// The ring of the members a word names gone here, alone: where a region
/// cannot be rebuilt, every key this node owns is in doubt under it while
/// two are gone (`Region::guess`). One heard back (as the process it was)
/// or seen lost by this process holding current copies is no loss here.
pub(super) fn of_losses(p: &PublishedDoubt, gone: &[(Arc<str>, u64)]) -> Ring {
    Ring::new(as_members(p, gone))
}

fn as_members(p: &PublishedDoubt, list: &[(Arc<str>, u64)]) -> Vec<Member> {
    list.iter()
        .map(|(id, g)| Member {
            node_id: id.clone(),
            generation: *g,
            zone: p.zone_of(id),
            ..Member::default()
        })
        .collect()
}
