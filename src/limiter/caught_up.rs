//! Caught up: an owner's word to each member that it holds every replica
//! the owner's ring gives it — what makes a replica holder a key's holder
//! of record.
//!
//! A join names new replica holders at once (a new node, a restarted one,
//! one back after being buried), but a new holder holds nothing of a key
//! until the key's owner re-replicates to it. An owner lost before that
//! (paused, then buried; killed) left the new holder owning the key as its
//! holder of record — no doubt — from the copy it never received, while
//! the previous holder, the one that did hold it, was lost too
//! (simulator seed 575 of `--mix any`: a restarted leaver; seed 2 of
//! `--mix stalls`: a late joiner). So a holder counts as the holder of
//! record of an owner's keys in a ring only once that owner said so for
//! that ring (by its epoch, which names every member's generation);
//! before that, the doubt test reads the ring without it
//! (`Region::covers`): the previous holder's copy, or doubt. The word
//! names the ring, not only the holder: an owner back from a pause said
//! it of a ring it was not in (true, and empty), and a holder that took
//! it for the ring before owned a key it never held (seed 575 again).
//!
//! **The owner's side.** A holdings scan queues for replication every key
//! whose replica holder changed (or that this node took over) and takes a
//! mark of the queue. A replication round that has taken every change up
//! to the mark, with no push failing since, sent every member what it
//! holds of this node's keys in that view (changes made since are the
//! ordinary lag). Each member of the ring not told of it is then told
//! once, beside the others: a message per member per view change, as the
//! transfer's asks are. A failed push takes a new mark (its
//! keys were queued again before it). A member not told (its call failed)
//! is told after a later round: until then it costs only a doubt it need
//! not have had.
//!
//! **The holder's side.** The last rings each owner named, per owner —
//! kept after the owner is gone: the doubt test reads them exactly then (a
//! first try forgot a gone owner's word at the view that buried it, and
//! a zone's loss put keys whose holder lived in doubt). Bounded by
//! [`MAX_OWNERS`] ids, members' only; past it, non-members are forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::Limiter;
use crate::cluster::ring::Ring;

/// Owners remembered at most on the holder's side (node ids are stable
/// names: about the fleet's size).
const MAX_OWNERS: usize = 4_096;

/// Rings remembered per owner: a region of doubt reads the rings a fault
/// went through, each told in turn (and the words may arrive out of
/// order).
const RINGS_PER_OWNER: usize = 4;

/// How long after a word that did not arrive the replicator runs again to
/// say it (an idle node runs no round of its own).
const RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Per owner, `(epoch, view)`: a ring it said this node caught up with,
/// and this node's view number when the word came.
type Heard = HashMap<Arc<str>, Vec<(u64, u64)>>;

/// Both sides, in the limiter's shared state. Std mutexes: held for a map
/// lookup or update, never across an await.
#[derive(Debug, Default)]
pub(super) struct CatchUp {
    progress: Mutex<Progress>,
    /// Per owner, the rings it said this node caught up with (epochs),
    /// each with this node's view number when the word last came: a ring
    /// with the same members comes back with the same epoch, and a word
    /// from its earlier stretch says nothing of the later one.
    heard: Mutex<Heard>,
    /// A scan published a mark: the replicator runs a round for it though
    /// no change waits (a view that moved nothing still owes the word).
    pub(super) owed: tokio::sync::Notify,
}

/// The owner's side: how far its replication has caught up with its view.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// The view whose scan took the mark.
    view: u64,
    /// Whether the mark was taken again once the view's transfer was
    /// complete (what it merged is queued before it).
    transferred: bool,
    /// The queue mark still to be taken past; None: caught up.
    mark: Option<u64>,
    /// Members told, and of which ring (its epoch) in which view of this
    /// node (its scan's): the same members make the same epoch again, and
    /// a holder counts the word only for the stretch of the ring it came in
    /// (`confirmed_since`), so each stretch is told anew (a cold review: a
    /// ring that went and came back, told once, left the holder untold).
    told: HashMap<Arc<str>, (u64, u64)>,
}

impl Progress {
    /// A holdings scan for `view` queued its keys; the queue's mark now is
    /// `mark`.
    pub(super) fn scanned(&mut self, view: u64, mark: u64) {
        self.view = view;
        self.mark = Some(mark);
        self.transferred = false;
    }

    /// A replication round ended in `view` (the view it routed its keys
    /// in), with a push `failed` or not, and the view's transfer
    /// `transfer_done` or not; `mark_now` is the queue's mark after it,
    /// `taken_past` whether the replicator took every change before a
    /// mark. Returns whether this node is caught up with its view: the
    /// scan's keys and those its transfer brought (a cold review: counts
    /// taken back through the transfer after the scan, a rejoined owner's
    /// above all, came after the scan's mark) all sent.
    pub(super) fn round(
        &mut self,
        view: u64,
        failed: bool,
        transfer_done: bool,
        mark_now: u64,
        taken_past: impl Fn(u64) -> bool,
    ) -> bool {
        let Some(mark) = self.mark else {
            return self.view == view;
        };
        if failed {
            self.mark = Some(mark_now);
            return false;
        }
        if self.view != view || !transfer_done {
            return false;
        }
        let mark = if self.transferred {
            mark
        } else {
            self.transferred = true;
            self.mark = Some(mark_now);
            mark_now
        };
        if taken_past(mark) {
            self.mark = None;
            return true;
        }
        false
    }

    /// Members of `ring` (but `me`, and those too old to hear it) not told
    /// of it in this view, with its epoch; none if `me` is not in it (it
    /// owns nothing there). Forgets members it has left.
    pub(super) fn owed(&mut self, ring: &Ring, me: &str) -> Vec<(Arc<str>, u64)> {
        self.told_in(ring, me)
    }

    /// Count `owed` told (of this view).
    pub(super) fn tell(&mut self, owed: &[(Arc<str>, u64)]) {
        let view = self.view;
        self.told
            .extend(owed.iter().map(|(id, epoch)| (id.clone(), (*epoch, view))));
    }

    fn told_in(&mut self, ring: &Ring, me: &str) -> Vec<(Arc<str>, u64)> {
        self.told.retain(|id, _| ring.member(id).is_some());
        if ring.member(me).is_none() {
            return Vec::new();
        }
        let epoch = ring.epoch();
        ring.members()
            .iter()
            .filter(|m| &*m.node_id != me && m.protocol >= 3)
            .filter(|m| self.told.get(&m.node_id) != Some(&(epoch, self.view)))
            .map(|m| (m.node_id.clone(), epoch))
            .collect()
    }
}

impl CatchUp {
    pub(super) fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn heard(&self) -> MutexGuard<'_, Heard> {
        self.heard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `owner` said this node holds every replica of its keys
    /// that the ring `epoch` gives it, by a word that came once this
    /// node's view number was `view` or later: about the stretch of that
    /// ring since this node adopted it in view `view` (a word that came
    /// before, while this node was behind, is not counted — the safe side).
    pub(super) fn confirmed_since(&self, owner: &str, epoch: u64, view: u64) -> bool {
        self.heard()
            .get(owner)
            .is_some_and(|rings| rings.iter().any(|&(e, at)| e == epoch && at >= view))
    }
}

impl Limiter {
    /// A holdings scan for `view` queued its keys: catching up starts.
    pub(super) fn catch_up_from(&self, view: u64) {
        let mark = self.shared.store.queue_mark();
        self.shared.catch_up.progress().scanned(view, mark);
        self.shared.catch_up.owed.notify_one();
    }

    /// Returns once a scan owes its members the word (a replication round
    /// says it).
    pub async fn catch_up_owed(&self) {
        self.shared.catch_up.owed.notified().await
    }

    /// After a replication round that routed its keys in `t`: once caught
    /// up with that view, tell each member not yet told, beside each other
    /// and beside the rounds (a member that does not answer would hold a
    /// round up for a deadline). Each is counted told when sent, and
    /// untold again if the call fails — told after the next round, run
    /// [`RETRY`] later.
    pub(super) fn after_round(&self, t: &super::Topology, failed: bool) {
        let store = &self.shared.store;
        let owed = {
            let mut p = self.shared.catch_up.progress();
            let transfer_done = t.incoming.complete();
            let caught_up = p.round(
                t.holdings.view,
                failed,
                transfer_done,
                store.queue_mark(),
                |m| store.taken_past(m),
            );
            if !caught_up {
                return;
            }
            let owed = p.owed(&t.ring, &self.shared.node_id);
            p.tell(&owed);
            (owed, p.view)
        };
        let (owed, view) = owed;
        for (id, epoch) in owed {
            let limiter = self.clone();
            tokio::spawn(async move {
                let told = limiter.shared.peers.tell_caught_up(&id, epoch).await;
                if let Err(e) = told {
                    tracing::debug!(peer = %id, error = %e, "caught-up word not delivered; told after a later round");
                    {
                        let mut p = limiter.shared.catch_up.progress();
                        if p.told.get(&id) == Some(&(epoch, view)) {
                            p.told.remove(&id);
                        }
                    }
                    tokio::time::sleep(RETRY).await;
                    limiter.shared.catch_up.owed.notify_one();
                }
            });
        }
    }

    /// `owner` said this node holds every replica of its keys that the
    /// ring `epoch` gives it (a peer's Sync, from a member: see
    /// `service/peer.rs`). The last few rings said are kept.
    pub fn owner_caught_up(&self, owner: &str, epoch: u64) {
        let mut heard = self.shared.catch_up.heard();
        if heard.len() >= MAX_OWNERS && !heard.contains_key(owner) {
            heard.retain(|id, _| self.is_member(id));
            if heard.len() >= MAX_OWNERS {
                return;
            }
        }
        let view = self.shared.topology.load().view;
        let rings = heard.entry(Arc::from(owner)).or_default();
        rings.retain(|&(e, _)| e != epoch);
        if rings.len() >= RINGS_PER_OWNER {
            rings.remove(0);
        }
        rings.push((epoch, view));
    }

    /// The view's transfer is complete: what it merged is queued, and the
    /// replicator runs to send it and say so.
    pub(super) fn transfer_done(&self) {
        self.shared.catch_up.owed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::super::doubt::{Change, Doubts, Ended, Heard, Me};
    use super::*;
    use crate::algorithm::Nanos;
    use crate::cluster::ring::Member;

    fn ring(members: &[(&str, u64)]) -> Ring {
        Ring::new(members.iter().map(|&(id, generation)| Member {
            node_id: Arc::from(id),
            generation,
            protocol: 3,
            ..Member::default()
        }))
    }

    #[test]
    fn caught_up_once_the_mark_is_taken_past_with_no_push_failed() {
        let mut p = Progress::default();
        p.scanned(4, 10);
        let taken = |upto: u64| move |m: u64| upto >= m;
        assert!(
            !p.round(4, false, false, 12, taken(12)),
            "the transfer is not done"
        );
        // Done: the mark is taken again, after what the transfer merged.
        assert!(
            !p.round(4, false, true, 14, taken(12)),
            "a change before the mark waits"
        );
        assert!(p.round(4, false, true, 15, taken(14)));
        assert!(p.round(4, false, true, 15, taken(14)), "and stays so");
        assert!(
            !p.round(5, false, true, 15, taken(15)),
            "a newer view's scan is not published"
        );
    }

    #[test]
    fn a_failed_push_takes_a_new_mark() {
        let mut p = Progress::default();
        p.scanned(4, 10);
        assert!(!p.round(4, false, true, 10, |m| m <= 9));
        // The round took past the mark but a push failed: its keys were
        // queued again, before the new mark.
        assert!(!p.round(4, true, true, 15, |_| true));
        assert!(!p.round(4, false, true, 15, |m| m <= 14));
        assert!(p.round(4, false, true, 15, |m| m <= 15));
    }

    #[test]
    fn a_scan_of_another_view_is_not_taken_for_this_one() {
        let mut p = Progress::default();
        p.scanned(4, 10);
        assert!(!p.round(5, false, true, 10, |_| true));
    }

    #[test]
    fn each_member_is_owed_the_word_once_per_ring() {
        let mut p = Progress::default();
        let r = ring(&[("a", 1), ("b", 1), ("c", 1)]);
        let e = r.epoch();
        let owed = p.owed(&r, "a");
        assert_eq!(owed, vec![(Arc::from("b"), e), (Arc::from("c"), e)]);
        p.tell(&owed);
        assert!(p.owed(&r, "a").is_empty());
        // c restarted (a new generation) and d joined; b left: a new ring,
        // each member owed the word of it.
        let r = ring(&[("a", 1), ("c", 2), ("d", 1)]);
        let e = r.epoch();
        assert_eq!(
            p.owed(&r, "a"),
            vec![(Arc::from("c"), e), (Arc::from("d"), e)]
        );
        assert!(!p.told.contains_key("b"), "forgotten once out of the ring");
        // A ring this node is not in: it owns nothing there, and says so
        // to no one.
        assert!(p.owed(&ring(&[("c", 2), ("d", 1)]), "a").is_empty());
        // The first ring back (the same members, the same epoch) in a
        // later view: a new stretch of it, each member told again.
        let first = ring(&[("a", 1), ("b", 1), ("c", 1)]);
        let owed = p.owed(&first, "a");
        p.tell(&owed);
        assert!(p.owed(&first, "a").is_empty());
        p.scanned(9, 0);
        assert_eq!(p.owed(&first, "a").len(), 2, "told again in view 9");
    }

    /// A key owned by `owner` whose replica holder is `holder`.
    fn key_of(r: &Ring, owner: &str, holder: &str) -> Vec<u8> {
        (0..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| {
                &*r.owner(k).unwrap().node_id == owner
                    && &*r.successor(k).unwrap().node_id == holder
            })
            .unwrap()
    }

    fn live(ids: &[&str]) -> Vec<Heard> {
        ids.iter()
            .map(|id| Heard {
                node_id: Arc::from(*id),
                born: 1,
                generation: 1,
            })
            .collect()
    }

    /// `j` joined between `a` and `b` and the ring named it `k`'s replica
    /// holder (adopted at `j` in view 10); then `a` and `b` were lost
    /// together. Whether `k` is in doubt at `j`, with `a`'s word that `j`
    /// holds its replicas, come in the view given, or none.
    fn joiner_after_owner_and_holder_before_lost(word_in: Option<u64>) -> bool {
        const S: Nanos = 1_000_000_000;
        let with_j = Arc::new(ring(&[("a", 1), ("b", 1), ("c", 1), ("j", 1)]));
        let without_j = ring(&[("a", 1), ("b", 1), ("c", 1)]);
        let k = (0..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| {
                &*with_j.owner(k).unwrap().node_id == "a"
                    && &*with_j.successor(k).unwrap().node_id == "j"
                    && &*without_j.successor(k).unwrap().node_id == "b"
            })
            .unwrap();
        let d = Doubts::new(10 * S);
        let change = Change {
            me: "j",
            born: 1,
            held: &|_| true,
            previous: &with_j,
            view: 10,
            live: &live(&["c"]),
        };
        d.changed(&change, S);
        let me = Me {
            id: "j",
            confirmed: &|owner, epoch, since| {
                word_in.is_some_and(|v| v >= since) && owner == "a" && epoch == with_j.epoch()
            },
        };
        d.in_doubt(&k, 2 * S, &mut Ended::default(), &me)
    }

    #[test]
    fn a_holder_its_owner_never_told_is_no_holder_of_record() {
        assert!(
            joiner_after_owner_and_holder_before_lost(None),
            "j never held k: a and b, who did, are gone"
        );
        assert!(!joiner_after_owner_and_holder_before_lost(Some(12)));
        // A word about the same ring (the same members make the same
        // epoch again) from an earlier stretch of it, before j adopted it
        // this time: it says nothing of this stretch.
        assert!(joiner_after_owner_and_holder_before_lost(Some(5)));
    }

    #[test]
    fn of_two_members_the_one_left_untold_owns_nothing_as_holder_of_record() {
        const S: Nanos = 1_000_000_000;
        let two = Arc::new(ring(&[("o", 1), ("j", 1)]));
        let k = key_of(&two, "o", "j");
        let d = Doubts::new(10 * S);
        let change = Change {
            me: "j",
            born: 1,
            held: &|_| true,
            previous: &two,
            view: 0,
            live: &[],
        };
        d.changed(&change, S);
        let untold = Me {
            id: "j",
            confirmed: &|_, _, _| false,
        };
        let told = Me {
            id: "j",
            confirmed: &|_, _, _| true,
        };
        assert!(d.in_doubt(&k, 2 * S, &mut Ended::default(), &untold));
        assert!(!d.in_doubt(&k, 2 * S, &mut Ended::default(), &told));
    }

    #[test]
    fn a_node_that_adopts_a_region_hears_which_holder_was_untold() {
        // Simulator seed 816 of `--mix any`: of a two-member ring {o, j},
        // o crashed before it told j it caught up; n, a process started
        // since (the leaver back), owns o's keys now and adopts j's word.
        const S: Nanos = 1_000_000_000;
        let two = Arc::new(ring(&[("o", 1), ("j", 1)]));
        let k = key_of(&two, "o", "j");
        let now_ring = ring(&[("n", 2), ("o", 2), ("j", 1)]);
        let adopter = |confirmed: bool| {
            let j = Doubts::new(10 * S);
            j.changed(
                &Change {
                    me: "j",
                    born: 1,
                    held: &|_| true,
                    previous: &two,
                    view: 0,
                    live: &[],
                },
                S,
            );
            let j_me = Me {
                id: "j",
                confirmed: &|_, _, _| confirmed,
            };
            let word = j.published(S, &j_me);
            let n = Doubts::new(10 * S);
            let live = [
                Heard {
                    node_id: "j".into(),
                    born: 1,
                    generation: 1,
                },
                Heard {
                    node_id: "o".into(),
                    born: 2,
                    generation: 2,
                },
            ];
            let me_n = Heard {
                node_id: "n".into(),
                born: 2,
                generation: 2,
            };
            n.adopt(&word, &now_ring, &live, &me_n, S);
            let n_me = Me {
                id: "n",
                confirmed: &|_, _, _| false,
            };
            (word, n.in_doubt(&k, 2 * S, &mut Ended::default(), &n_me))
        };
        let (word, in_doubt) = adopter(false);
        assert_eq!(word[0].untold, vec![(Arc::from("j"), Arc::from("o"))]);
        assert!(
            in_doubt,
            "j never held k: its only holder of record is gone"
        );
        let (word, in_doubt) = adopter(true);
        assert!(word[0].untold.is_empty());
        assert!(!in_doubt, "j held k: its copy comes with the transfer");
    }

    #[test]
    fn a_holder_is_confirmed_for_the_last_rings_named_only() {
        let c = CatchUp::default();
        c.heard().insert(Arc::from("o"), vec![(5, 2), (7, 4)]);
        assert!(c.confirmed_since("o", 5, 0));
        assert!(c.confirmed_since("o", 7, 0));
        assert!(!c.confirmed_since("o", 3, 0), "another ring");
        assert!(!c.confirmed_since("p", 5, 0), "never told");
        // Since a view: the word for ring 5 came in view 2, so it says
        // nothing of that ring adopted again in view 6.
        assert!(c.confirmed_since("o", 5, 2));
        assert!(!c.confirmed_since("o", 5, 6));
        assert!(c.confirmed_since("o", 7, 4));
    }
}
