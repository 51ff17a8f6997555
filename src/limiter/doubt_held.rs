//! What this process holds current, as a transfer's lost source reads it
//! (`Doubts::sources_lost`): the last ring whose transfer it completed,
//! and every ring it adopted since (while its transfers were incomplete).
//!
//! A key is held current only if this node held it in each of those
//! rings — as its owner, or as the replica holder its owner said caught
//! up: a key that left this node and came back while its transfers were
//! incomplete was decided elsewhere meanwhile (a cold review). And a lost
//! source could have held a key only where it was the key's owner or
//! replica holder, this node aside, in one of them — or anywhere, when
//! the rings are not all known (more than [`MAX_TRAIL`] of them).

use std::sync::Arc;

use super::Me;
use crate::cluster::ring::Ring;

/// Rings kept after the last complete transfer; past it, every key is
/// taken as neither held here nor known elsewhere (doubt on the safe
/// side).
pub const MAX_TRAIL: usize = 16;

/// The rings since this process's last complete transfer, each with this
/// node's view number when it adopted it (an owner's word that this node
/// caught up with a ring counts from then).
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// The last ring whose transfer this process completed; `None`: none
    /// is known (the trail overflowed, or this node rejoined while a
    /// source region was open).
    settled: Option<(Arc<Ring>, u64)>,
    /// The rings adopted since, oldest first.
    trail: Vec<(Arc<Ring>, u64)>,
    /// This node rejoined since: what it held is copies now, none current
    /// (the rings still say which keys a source may have held).
    copies: bool,
}

impl Held {
    /// A process that just started or rejoined: its transfer is complete
    /// over a ring in which it holds nothing.
    pub fn fresh(view: u64) -> Held {
        Held::complete(Arc::new(Ring::default()), view)
    }

    /// Its transfer for `ring` (adopted in view `since`) is complete.
    pub fn complete(ring: Arc<Ring>, since: u64) -> Held {
        Held {
            settled: Some((ring, since)),
            trail: Vec::new(),
            copies: false,
        }
    }

    /// Nothing held, nothing known of where keys stood.
    pub fn unknown() -> Held {
        Held::default()
    }

    /// The same rings, none of their keys held current (this node
    /// rejoined: `Doubts::forget`).
    pub fn copies_only(&self) -> Held {
        Held {
            copies: true,
            ..self.clone()
        }
    }

    /// It left `ring` (adopted in view `since`) with its transfer
    /// incomplete.
    pub fn after(&self, ring: Arc<Ring>, since: u64) -> Held {
        let same = |r: &(Arc<Ring>, u64)| r.0.epoch() == ring.epoch() && r.1 == since;
        if self.rings().last().is_some_and(same) {
            return self.clone();
        }
        if self.settled.is_none() || self.trail.len() >= MAX_TRAIL {
            return Held::unknown();
        }
        let mut next = self.clone();
        next.trail.push((ring, since));
        next
    }

    fn rings(&self) -> impl Iterator<Item = &(Arc<Ring>, u64)> {
        self.settled.iter().chain(self.trail.iter())
    }

    /// Whether this node held `k` current through every ring since its
    /// last complete transfer: there, as its owner or as the replica
    /// holder its owner said caught up; in each ring after, as its owner
    /// or its replica holder still — an owner that takes the key over
    /// from it, or that it holds the key for now, replicates to it what it
    /// decides, so no new word is needed while it was current before (a
    /// zone killed at once: its members are buried one by one, and the
    /// owner of the ring between says nothing of it, dead already:
    /// `tests/zone_faults.rs`).
    pub(super) fn current(&self, k: &[u8], me: &Me<'_>) -> bool {
        let Some((settled, since)) = self.settled.as_ref().filter(|_| !self.copies) else {
            return false;
        };
        let (owns, holds, owner) = part(settled, k, me.id);
        let told = || {
            owner.is_some_and(|o| {
                let o = &settled.members()[o];
                super::region::said_by_its_protocol(o)
                    || (me.confirmed)(&o.node_id, settled.epoch(), *since)
            })
        };
        (owns || (holds && told()))
            && self.trail.iter().all(|(ring, _)| {
                let (owns, holds, _) = part(ring, k, me.id);
                owns || holds
            })
    }

    /// Whether one of `lost` may have held `k`: its owner or replica
    /// holder, this node aside, in a ring since the last complete
    /// transfer — or any key, where those rings are not known.
    pub(super) fn may_have_held(&self, k: &[u8], lost: &[(Arc<str>, u64)], me: &str) -> bool {
        if self.settled.is_none() {
            return true;
        }
        self.rings().any(|(ring, _)| {
            let members = ring.members();
            let (owner, holder) = ring.holders_without(k, |i| *members[i].node_id == *me);
            [owner, holder]
                .into_iter()
                .flatten()
                .any(|i| lost.iter().any(|(id, _)| *id == members[i].node_id))
        })
    }
}

/// Whether `me` is `k`'s owner, and whether its replica holder, in `ring`;
/// and the owner's index there.
fn part(ring: &Ring, k: &[u8], me: &str) -> (bool, bool, Option<usize>) {
    let members = ring.members();
    let (owner, holder) = ring.holders_without(k, |_| false);
    let is_me = |i: Option<usize>| i.is_some_and(|i| *members[i].node_id == *me);
    (is_me(owner), is_me(holder), owner)
}
