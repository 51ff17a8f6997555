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
//! So each member seen turning `leaving` keeps here the ring it left (the
//! ring before, on this node); a leaver buried before it said `done` to
//! this node's transfer is lost from that ring, as a crashed member is
//! from the ring it was in. Alone it covers no key (a region needs a key's
//! owner and holder both gone); with the key's other holder lost within
//! the grace, the key is in doubt until one is back. A leaver that said
//! `done` handed this node its keys; what it passed on as copies went to
//! the keys' next holders, as the leave's own retries see to.

use std::sync::{Arc, Mutex, MutexGuard};

use super::doubt::{Change, Heard};
use super::{Limiter, Topology};
use crate::cluster::membership::{ClusterView, Lifecycle};
use crate::cluster::ring::{Member, Ring};

/// Leavers remembered at most (oldest forgotten first): each is a member
/// that announced `leaving` and has not been buried yet.
const MAX_LEAVERS: usize = 64;

/// The rings members left, by id and generation.
#[derive(Debug, Default)]
pub(super) struct Leavers {
    /// A std Mutex: held for a scan of at most [`MAX_LEAVERS`], never
    /// across an await.
    rings: Mutex<Vec<(Arc<str>, u64, Arc<Ring>)>>,
}

impl Leavers {
    fn lock(&self) -> MutexGuard<'_, Vec<(Arc<str>, u64, Arc<Ring>)>> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `id` at `generation` announced `leaving`; `ring` is the last ring
    /// it was a member of here.
    fn note(&self, id: &Arc<str>, generation: u64, ring: &Arc<Ring>) {
        let mut rings = self.lock();
        if rings.iter().any(|(i, g, _)| i == id && *g == generation) {
            return;
        }
        if rings.len() >= MAX_LEAVERS {
            rings.remove(0);
        }
        rings.push((id.clone(), generation, ring.clone()));
    }

    /// The ring `id` at `generation` left, forgotten here.
    fn take(&self, id: &str, generation: u64) -> Option<Arc<Ring>> {
        let mut rings = self.lock();
        let at = rings
            .iter()
            .position(|(i, g, _)| &**i == id && *g == generation)?;
        Some(rings.remove(at).2)
    }

    /// Forget leavers no longer in the view (buried, or gone after
    /// saying `done`).
    fn retain(&self, view: &ClusterView) {
        self.lock().retain(|(id, g, _)| {
            view.members
                .iter()
                .any(|m| m.node_id == *id && m.generation == *g)
        });
    }

    fn clear(&self) {
        self.lock().clear();
    }
}

impl Limiter {
    /// On every view, after the ring's own losses were read: leavers this
    /// node's transfer still waited for (`unfinished`, read before this
    /// view pruned it) that are no longer among `holders` are lost from
    /// the ring they left; members newly `leaving` have that ring noted.
    /// `live`: the members that can hold counts now.
    pub(super) fn leavers_lost(
        &self,
        old: &Topology,
        view: &ClusterView,
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
        let me = self.shared.node_id.clone();
        let is = |m: &Member, id: &str, g: u64| &*m.node_id == id && m.generation == g;
        for (id, generation) in unfinished {
            let still = holders.iter().any(|m| is(m, id, *generation));
            // A member of the ring before is read as that ring's loss.
            let in_ring = old
                .ring
                .member(id)
                .is_some_and(|m| m.generation == *generation);
            if still || in_ring {
                continue;
            }
            let Some(ring) = leavers.take(id, *generation) else {
                continue;
            };
            tracing::warn!(
                member = %id,
                "a leaving member was lost before it handed this node its keys: a crash, for the regions of doubt"
            );
            let change = Change {
                me: &me,
                born: self.shared.born,
                // Not seen held: it never handed this node what it held.
                held: &|_| false,
                previous: &ring,
                live,
            };
            let ended = self.shared.doubts.changed(&change, self.now());
            self.doubts_ended(ended);
        }
        for m in &view.members {
            let was_in_ring = old
                .ring
                .member(&m.node_id)
                .is_some_and(|r| r.generation == m.generation);
            if m.state == Lifecycle::Leaving && was_in_ring && m.node_id != me {
                leavers.note(&m.node_id, m.generation, &old.ring);
            }
        }
        leavers.retain(view);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[&str]) -> Arc<Ring> {
        Arc::new(Ring::new(ids.iter().map(|id| Member {
            node_id: Arc::from(*id),
            generation: 1,
            grpc_addr: String::new(),
            protocol: crate::proto::PEER_PROTOCOL_VERSION,
            zone: Arc::from(""),
        })))
    }

    #[test]
    fn a_leaver_is_taken_once_by_id_and_generation() {
        let l = Leavers::default();
        let r = ring(&["a", "b"]);
        l.note(&Arc::from("a"), 1, &r);
        l.note(&Arc::from("a"), 1, &r);
        assert!(l.take("a", 2).is_none(), "another process of a");
        assert!(l.take("a", 1).is_some_and(|t| t.epoch() == r.epoch()));
        assert!(l.take("a", 1).is_none(), "taken once");
    }

    #[test]
    fn leavers_are_bounded() {
        let l = Leavers::default();
        let r = ring(&["a"]);
        for i in 0..(MAX_LEAVERS as u64 + 10) {
            l.note(&Arc::from("a"), i, &r);
        }
        assert_eq!(l.lock().len(), MAX_LEAVERS);
        assert!(l.take("a", 0).is_none(), "the oldest forgotten first");
        assert!(l.take("a", MAX_LEAVERS as u64 + 9).is_some());
    }
}
