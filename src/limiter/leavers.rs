//! Members lost in the middle of their leave: a crash, for the regions of
//! doubt.
//!
//! A leave opens no region of doubt (`doubt.rs`): a leaver hands off — its
//! new owners take its keys by the transfer, its copies go to the keys'
//! next holders — and only then exits. A leaver killed before that
//! handed off nothing, and it is out of every ring from the moment it
//! announced `leaving`, so its loss is in no ring change: its new owner
//! stopped waiting for it when it was buried and decided exact from the
//! copy it had, however old (simulator seed 2162 of `--mix any`: the
//! leaver owned the key, cut off from every peer 850 ms before the leave,
//! killed 145 ms into it, while the key's replica holder was paused past
//! failure detection; the new owner answered `remaining 81` after `0`).
//!
//! So each member seen turning `leaving` is noted here, with the ring it
//! left if it was in this node's ring before; a leaver buried before it
//! ever said `done` to a transfer of this node during its leave is lost:
//! - from that ring, as a crashed member is from the ring it was in. Alone
//!   it covers no key (a region needs a key's owner and holder both gone);
//!   with the key's other holder lost within the grace, the key is in
//!   doubt;
//! - and again from every region that lost it before and read it as back
//!   when it turned `leaving` (a holder paused past failure detection,
//!   rejoining, told to leave: in no ring of its own since — seed 2314's
//!   case — then killed before it handed its copies over).
//!
//! A leaver that said `done` handed this node its keys; what it passed on
//! as copies went to the keys' next holders, as the leave's own retries
//! see to. A protocol-2 leaver never says `done` (it pushes its keys): it
//! is not noted. A note is let go once its leaver is out of the view
//! (buried, or suspected a moment: a suspected leaver is no member) and
//! its loss was read or it handed its keys over — its ring as soon as
//! either is so — or when the bound pushes it out. A leaver heard again
//! after that is noted afresh, with no ring: its loss is read in the
//! regions only, and a `done` it gave in between is missed (doubt on the
//! safe side, within the grace).

use std::sync::{Arc, Mutex, MutexGuard};

use super::doubt::{Change, Heard};
use super::transfer::Standing;
use super::{Limiter, Topology};
use crate::cluster::membership::{ClusterView, Lifecycle};
use crate::cluster::ring::{Member, Ring};

/// Leavers remembered at most (oldest forgotten first).
const MAX_LEAVERS: usize = 64;

/// The ring a leaver left, and this node's view number when it adopted it.
type LeftRing = (Arc<Ring>, u64);

/// A member seen turning `leaving`.
#[derive(Debug)]
struct Left {
    id: Arc<str>,
    generation: u64,
    /// The generation its process started as (a rejoin is a newer one).
    born: u64,
    /// The ring it left here and this node's view number when it adopted
    /// that ring; `None`: it was in no ring of this node as this
    /// generation (it turned `leaving` from joining).
    ring: Option<LeftRing>,
    /// The first view of this node that knew it leaving: a `done` to a
    /// transfer of that view or later is its handoff.
    from_view: u64,
    /// It said `done` to a transfer of this node during its leave.
    done: bool,
    /// Its loss was read (its ring let go: a ring is ~16 bytes a point,
    /// 4,096 points a member).
    read: bool,
}

/// The members seen leaving, by id and generation.
#[derive(Debug, Default)]
pub(super) struct Leavers {
    /// A std Mutex: held for a scan of at most [`MAX_LEAVERS`], never
    /// across an await.
    notes: Mutex<Vec<Left>>,
}

impl Leavers {
    fn lock(&self) -> MutexGuard<'_, Vec<Left>> {
        self.notes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note a member seen `leaving` (once per id and generation).
    fn note(&self, left: Left) {
        let mut notes = self.lock();
        if notes
            .iter()
            .any(|l| l.id == left.id && l.generation == left.generation)
        {
            return;
        }
        if notes.len() >= MAX_LEAVERS {
            notes.remove(0);
        }
        notes.push(left);
    }

    /// `id` at `generation` said `done` to a transfer of view `view`.
    fn said_done(&self, id: &str, generation: u64, view: u64) {
        for l in self.lock().iter_mut() {
            if &*l.id == id && l.generation == generation && view >= l.from_view {
                l.done = true;
                l.ring = None;
            }
        }
    }

    /// Whether `id` at `generation` was seen leaving (its loss is read
    /// here, not as a transfer's source: `Limiter::sources_lost`).
    pub(super) fn noted(&self, id: &str, generation: u64) -> bool {
        self.lock()
            .iter()
            .any(|l| &*l.id == id && l.generation == generation)
    }

    /// The noted leaver `id` at `generation` that never said `done`: its
    /// process's first generation and the ring it left (taken: read once;
    /// a leaver heard again and lost again is gone again in the regions).
    fn lost(&self, id: &str, generation: u64) -> Option<(u64, Option<LeftRing>)> {
        let mut notes = self.lock();
        let l = notes
            .iter_mut()
            .find(|l| &*l.id == id && l.generation == generation && !l.done)?;
        l.read = true;
        Some((l.born, l.ring.take()))
    }

    /// Let go of the notes of leavers no longer in the view whose loss was
    /// read or that handed their keys over.
    fn settle(&self, view: &ClusterView) {
        self.lock().retain(|l| {
            let in_view = view
                .members
                .iter()
                .any(|m| m.node_id == l.id && m.generation == l.generation);
            in_view || !(l.done || l.read)
        });
    }

    fn clear(&self) {
        self.lock().clear();
    }
}

impl Limiter {
    /// On every view, before the transfer stops waiting for members gone
    /// (`Incoming::prune`): leavers the transfer still waited for
    /// (`unfinished`) that are no longer among `holders` and never said
    /// `done` during their leave are lost (see the module's doc); members
    /// newly `leaving` are noted. `number` is this view's number; `live`,
    /// the members that can hold counts now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn leavers_lost(
        &self,
        old: &Topology,
        view: &ClusterView,
        number: u64,
        unfinished: &[(Arc<str>, u64)],
        holders: &[Member],
        live: &[Heard],
        rejoined: bool,
    ) {
        let leavers = &self.shared.leavers;
        if rejoined {
            // Its regions were forgotten with the rings it decided in.
            leavers.clear();
            return;
        }
        for (id, p) in old.incoming.progress() {
            if p.standing == Standing::Done {
                leavers.said_done(&id, p.generation, old.incoming.view);
            }
        }
        let me = self.shared.node_id.clone();
        let now = self.now();
        for (id, generation) in unfinished {
            let still = holders
                .iter()
                .any(|m| m.node_id == *id && m.generation == *generation);
            if still {
                continue;
            }
            let Some((born, ring)) = leavers.lost(id, *generation) else {
                continue;
            };
            tracing::warn!(
                member = %id,
                "a leaving member was lost before it handed this node its keys: a crash, for the regions of doubt"
            );
            self.shared.doubts.lost_again(id, born..=*generation, now);
            if let Some((ring, adopted_in)) = ring {
                let change = Change {
                    me: &me,
                    born: self.shared.presence.born(),
                    // Not seen held: it never handed this node what it held.
                    held: &|_| false,
                    previous: &ring,
                    view: adopted_in,
                    live,
                };
                let ended = self.shared.doubts.changed(&change, now);
                self.doubts_ended(ended);
            }
        }
        for m in &view.members {
            // A protocol-2 leaver never says `done`: its loss is not read.
            if m.state != Lifecycle::Leaving || m.node_id == me || m.protocol < 3 {
                continue;
            }
            let in_ring = old
                .ring
                .member(&m.node_id)
                .is_some_and(|r| r.generation == m.generation);
            leavers.note(Left {
                id: m.node_id.clone(),
                generation: m.generation,
                born: m.born,
                ring: in_ring.then(|| (old.ring.clone(), old.ring_since)),
                from_view: number,
                done: false,
                read: false,
            });
        }
        leavers.settle(view);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left(id: &str, generation: u64, from_view: u64) -> Left {
        Left {
            id: Arc::from(id),
            generation,
            born: generation,
            ring: None,
            from_view,
            done: false,
            read: false,
        }
    }

    #[test]
    fn a_leaver_is_lost_until_it_said_done_during_its_leave() {
        let l = Leavers::default();
        l.note(left("a", 1, 5));
        assert!(l.lost("a", 2).is_none(), "another process of a");
        assert!(l.lost("a", 1).is_some());
        assert!(
            l.lost("a", 1).is_some_and(|(_, ring)| ring.is_none()),
            "a note outlives a lookup; its ring is read once"
        );
        l.said_done("a", 1, 4);
        assert!(
            l.lost("a", 1).is_some(),
            "done before its leave: not a handoff"
        );
        l.said_done("a", 1, 5);
        assert!(l.lost("a", 1).is_none(), "handed this node its keys");
    }

    #[test]
    fn leavers_are_bounded() {
        let l = Leavers::default();
        for i in 0..(MAX_LEAVERS as u64 + 10) {
            l.note(left("a", i, 0));
        }
        assert_eq!(l.lock().len(), MAX_LEAVERS);
        assert!(l.lost("a", 0).is_none(), "the oldest forgotten first");
        assert!(l.lost("a", MAX_LEAVERS as u64 + 9).is_some());
    }
}
