//! Keys in doubt (issue 39): a copy is the truth only when it is provably
//! current.
//!
//! A key's *holders of record* are its owner and replica holder in the
//! view it was last decided in — for this node, the view before a change.
//! When a change takes away members (dead, not left: a leaver hands off),
//! each key this node now owns whose holders of record are all gone, and
//! of which this node was neither the owner nor the replica holder, is
//! **in doubt**: the copy this node holds
//! (or the empty count it would start) may be older than what the gone
//! holders admitted — an owner killed while its replica holder was paused,
//! two of three nodes lost at once, an older copy from a ring long gone.
//! Such a key is decided as if its owner were unreachable (per
//! `on_owner_unreachable`: `deny` refuses, `local_share` decides on a lease
//! share, never an exact answer) until a holder of record is back (its
//! state comes with the transfer, merged, then exact), or until
//! `cluster.in_doubt_grace` passes — burial alone does not end it — when
//! the best copy is taken and counted (`sluice_keys_taken_from_best_copy`).
//!
//! Losses that come one view apart are one fault: a member lost within a
//! region's grace joins it, so an owner lost in one view and its replica
//! holder in the next (or the new replica holder before the owner
//! re-replicated to it) still put the key in doubt at a third node.
//!
//! A node that just started knows no view before it, so it opens no
//! region for the losses before its start (a ring guessed from gossip's
//! tombstones put keys in doubt after ordinary restarts and joins). It
//! *adopts* the regions its peers publish instead (`doubts` gossip key,
//! `cluster/membership/doubts.rs`) when it holds none of its own over the
//! same losses: a node restarted while the other holder of its keys is
//! still down learns from the node that saw both go that those keys are
//! in doubt. The adopted region's ring before is rebuilt from this node's
//! ring and the gone members (positions depend on node ids alone); an
//! older generation of this node is gone like any other member — its
//! counts died with that process.
//!
//! The test is per key, over a few *regions* (one per change that took
//! members away, kept until resolved or past the grace), each a previous
//! ring and who of it is gone: a ring lookup or two per region, and one
//! atomic load while there is none — the rule outside faults.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::algorithm::Nanos;
use crate::cluster::membership::doubts::PublishedDoubt;
use crate::cluster::ring::Ring;

/// Keys remembered per region as decided in doubt (for the gauge and the
/// count of keys taken from a best copy); beyond it they are still in
/// doubt, only not counted one by one.
pub const MAX_COUNTED: usize = 100_000;

/// Regions kept at most: each is a change that took members away within
/// the grace. Beyond it the oldest is taken from its best copy early.
pub const MAX_REGIONS: usize = 64;

/// Regions remembered as adopted or ended here (so one is not opened or
/// adopted again: from a peer still publishing it, or over members still
/// unburied in the ring after it ended or an operator accepted it).
const MAX_DONE: usize = 64;

/// Members lost, by id and generation (sorted where compared).
type Losses = Vec<(Arc<str>, u64)>;

#[path = "doubt_region.rs"]
mod region;
use region::Region;

#[path = "doubt_rebuild.rs"]
mod rebuild;

#[path = "doubt_held.rs"]
mod held;
pub use held::Held;

#[path = "doubt_adopt.rs"]
mod adopt;
use rebuild::rebuild;

/// What a region's end came to, for the metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// Keys decided in doubt whose holders never came back: taken from
    /// the best copy.
    pub taken: u64,
}

/// This node, as the doubt test reads it.
pub struct Me<'a> {
    pub id: &'a str,
    /// Whether the owner named said this node holds every replica of its
    /// keys that the ring of the epoch given makes it the holder of
    /// (`caught_up.rs`), in a word that came once this node's view number
    /// was the one given or later: only then is it their holder of record
    /// there. (The same members make the same epoch again: a word from an
    /// earlier stretch of that ring is not about this one.)
    pub confirmed: &'a dyn Fn(&str, u64, u64) -> bool,
}

/// A change of view as [`Doubts::changed`] reads it.
pub struct Change<'a> {
    /// This node's id.
    pub me: &'a str,
    /// The generation this node's process started as: in `previous` at
    /// it or a newer one, it was a member there as this process.
    pub born: u64,
    /// Whether this process held current copies in `previous` of what a
    /// member of it (by id) left there: its transfer for that ring was
    /// complete (what it owned), and the member said it caught up with
    /// that ring (what it held of the member's) — in the ring is not
    /// enough: a node turns ready before either.
    pub held: &'a dyn Fn(&str) -> bool,
    /// The ring this node decided under before (empty right after start).
    pub previous: &'a Arc<Ring>,
    /// This node's view number when it adopted `previous` (the owners'
    /// words about that ring count from it).
    pub view: u64,
    /// Members that can hold counts now, this node aside.
    pub live: &'a [Heard],
}

/// A member this node hears, and every generation its process has been:
/// from `born` (the one it started as, gossiped) to `generation` (now).
///
/// A process that was away long enough to be buried (paused past
/// failure detection, cut off) rejoins under a newer generation, but it
/// is the same process: the copies it held lived through the rejoin, so
/// it is the holder of record it was. A restarted process is born anew
/// (its `born` is its new generation): its counts died with the old one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heard {
    pub node_id: Arc<str>,
    pub born: u64,
    pub generation: u64,
}

impl Heard {
    /// Whether this is the process that was `id` at `generation`.
    fn was(&self, id: &str, generation: u64) -> bool {
        &*self.node_id == id && (self.born..=self.generation).contains(&generation)
    }
}

/// This node's regions of doubt.
#[derive(Debug)]
pub struct Doubts {
    /// A std Mutex: held for a ring lookup per region, never across an
    /// await.
    regions: Mutex<Vec<Region>>,
    /// Whether a region can hold a key in doubt: the one load a decision
    /// pays outside correlated faults (a single loss opens a region that
    /// covers nothing until a second member goes).
    any: AtomicBool,
    grace: Nanos,
    /// The losses (sorted) of regions adopted or ended here, oldest
    /// first. Locked after `regions` when both are.
    done: Mutex<Vec<Losses>>,
    /// Members this process saw lost in a change of its own view (at most
    /// [`MAX_DONE`], oldest first): it read those losses in its own rings,
    /// so a peer's word naming them and this node's older process (lost
    /// before it started) does not rebuild them. Locked after `done`.
    seen: Mutex<Losses>,
}

impl Doubts {
    pub fn new(grace: Nanos) -> Doubts {
        Doubts {
            regions: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            grace,
            done: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Whether any region can hold a key in doubt (one atomic load).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn regions(&self) -> MutexGuard<'_, Vec<Region>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn done(&self) -> MutexGuard<'_, Vec<Losses>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn seen(&self) -> MutexGuard<'_, Losses> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `gone` (sorted) is within the losses of a region adopted or
    /// ended here.
    fn was_done(done: &[Losses], gone: &[(Arc<str>, u64)]) -> bool {
        done.iter().any(|d| gone.iter().all(|g| d.contains(g)))
    }

    /// Remember a region's losses as adopted or ended.
    fn remember(done: &mut Vec<Losses>, gone: &[(Arc<str>, u64)]) {
        let mut gone = gone.to_vec();
        gone.sort();
        if !done.contains(&gone) {
            if done.len() >= MAX_DONE {
                done.remove(0);
            }
            done.push(gone);
        }
    }

    /// A change of view. Members of the previous ring not live now (but
    /// this node) open a region, and join every region still open;
    /// members live again as the same process (the same generation, or a
    /// newer one it rejoined as: [`Heard`]) leave every region — their
    /// state comes with the transfer. Returns what the regions resolved
    /// or pushed out came to.
    pub fn changed(&self, c: &Change<'_>, now: Nanos) -> Ended {
        let is_live = |id: &str, generation: u64| c.live.iter().any(|m| m.was(id, generation));
        let gone: Vec<(Arc<str>, u64)> = c
            .previous
            .members()
            .iter()
            .filter(|m| &*m.node_id != c.me && !is_live(&m.node_id, m.generation))
            .map(|m| (m.node_id.clone(), m.generation))
            .collect();
        // Seen as a member (in the ring, as this process), not while
        // joining: a node that starts while a member is lost reads that
        // loss in no ring of its own, and takes the peers' word for it.
        // And only where this process held current copies of what the
        // member left there ([`Change::held`]). A member heard again as
        // the process it was is no loss (a suspicion): forgotten, so its
        // real loss later is read afresh.
        let member = c
            .previous
            .member(c.me)
            .is_some_and(|m| m.generation >= c.born);
        {
            let mut seen = self.seen();
            seen.retain(|(id, g)| !is_live(id, *g));
            for g in gone.iter().filter(|(id, _)| member && (c.held)(id)) {
                if !seen.contains(g) {
                    if seen.len() >= MAX_DONE {
                        seen.remove(0);
                    }
                    seen.push(g.clone());
                }
            }
        }
        let mut ended = Ended::default();
        let mut regions = self.regions();
        // A guessed region of this process's (one it opened over a ring it
        // was not in) takes the losses while it is still not a member;
        // once it is, its rings are its own, read as they are (a guessed
        // region taking every later loss kept the whole keyspace in doubt
        // through ordinary crashes: a cold review).
        let guessed_open = !member && regions.iter().any(Region::opened_guessed);
        for r in regions.iter_mut() {
            r.gone.retain(|(id, generation)| !is_live(id, *generation));
            if !(r.of_sources() || (member && r.opened_guessed())) {
                r.lose(&gone, Some(c.previous.as_ref()), c.view, now);
            }
            // A holder back leaves one member gone: no key is in doubt
            // under it now, and none decided in doubt was taken from a
            // best copy (it comes with the transfer).
            if !r.can_cover() {
                r.keys.clear();
                r.overflow = 0;
            }
        }
        // A region none of whose members is gone any more is resolved: the
        // holders of record are back, nothing was taken from a best copy.
        regions.retain(|r| !r.gone.is_empty());
        // A region over the same ring is already open (a suspect, then
        // buried; or the view changed for another reason): the losses
        // joined it above.
        let known = regions
            .iter()
            .any(|r| !r.of_sources() && r.previous.epoch() == c.previous.epoch());
        let mut sorted = gone.clone();
        sorted.sort();
        let ended_before = Self::was_done(&self.done(), &sorted);
        // Over a ring this process was not a member of (new, or back as a
        // new member), it read that ring from gossip as it first heard it:
        // members the cluster had buried already may stand in it, and the
        // rings the cluster went through since are not among its own
        // (simulator seed 937 of `--mix any`: a new node's first ring still
        // held an owner's earlier replica holder, paused and replaced
        // since; the owner and its new holder crashed, and the new node
        // read the old holder, back, as the holder of record and answered
        // exactly from its stale copy). Its region is over the ring of the
        // members lost alone, and covers once two are gone: every key one
        // of them owned there is in doubt — more than its peers' word
        // holds, never fewer (no peer may publish one: the survivor may be
        // this node alone).
        if !gone.is_empty() && !known && !ended_before && !guessed_open {
            let region = if member {
                Region::new(c.previous.clone(), gone, c.view, now, self.grace)
            } else {
                let lost = c.previous.members().iter().filter(|m| {
                    gone.iter()
                        .any(|(id, g)| *id == m.node_id && *g == m.generation)
                });
                let ring = Arc::new(Ring::new(lost.cloned()));
                Region::guessed(ring, gone, c.view, now, self.grace)
            };
            regions.push(region);
        }
        self.trim(&mut regions, &mut ended);
        self.any
            .store(regions.iter().any(Region::can_cover), Ordering::Release);
        drop(regions);
        ended
    }

    /// `id`'s process (its generations `process`) lost again before it
    /// handed this node what it held (a leaver buried before it said
    /// `done`): gone again in every region that lost it before and read it
    /// as back since.
    pub fn lost_again(&self, id: &str, process: std::ops::RangeInclusive<u64>, now: Nanos) {
        let mut regions = self.regions();
        for r in regions.iter_mut() {
            r.lost_again(id, &process, now);
        }
        self.any
            .store(regions.iter().any(Region::can_cover), Ordering::Release);
    }

    /// Members this node's transfer still waited for (`lost`: not
    /// leavers, whose loss `leavers.rs` reads) were lost before they said
    /// `done`: what they held of the keys this node did not hold current
    /// (`held`: since its last complete transfer) never came — a key's
    /// only current count may have been theirs (simulator seed 212 of
    /// `--mix any`: a new process owned a key whose owner had died and
    /// whose only other holder was dead but not yet buried; once that
    /// holder was buried the transfer was complete, and the key was
    /// decided as new). Each such key one of them may have held is in
    /// doubt for the grace from the loss, or until a lost member is heard
    /// again as the process it was (its state then comes with the
    /// transfer). Losses an operator accepted already open nothing.
    pub fn sources_lost(&self, lost: &[(Arc<str>, u64)], held: Held, now: Nanos) -> Ended {
        let mut gone = lost.to_vec();
        gone.sort();
        if gone.is_empty() || Self::was_done(&self.done(), &gone) {
            return Ended::default();
        }
        let ring = Arc::new(Ring::new(lost.iter().map(|(id, generation)| {
            crate::cluster::ring::Member {
                node_id: id.clone(),
                generation: *generation,
                ..Default::default()
            }
        })));
        let mut regions = self.regions();
        regions.push(Region::unfinished(held, ring, gone, now, self.grace));
        let mut ended = Ended::default();
        self.trim(&mut regions, &mut ended);
        self.any
            .store(regions.iter().any(Region::can_cover), Ordering::Release);
        ended
    }

    /// Whether a region over a transfer's lost sources is open.
    pub fn sources_open(&self) -> bool {
        self.regions().iter().any(Region::of_sources)
    }

    /// Past [`MAX_REGIONS`], the oldest regions end early (taken from
    /// their best copies).
    fn trim(&self, regions: &mut Vec<Region>, ended: &mut Ended) {
        while regions.len() > MAX_REGIONS {
            let r = regions.remove(0);
            ended.taken = ended.taken.saturating_add(r.counted());
            Self::remember(&mut self.done(), &r.gone);
        }
    }

    /// Forget every region (this node rejoined as a new member: see
    /// `Limiter::set_view`). What they held was not taken from a best
    /// copy here: the regions the peers publish carry it on.
    pub fn forget(&self) {
        // The rings its losses were seen in are gone with the regions —
        // but for those over a transfer's lost sources: no peer holds
        // them (they are never published), and what this node held is
        // copies now, so every key a source may have held stays in doubt
        // (a cold review).
        self.seen().clear();
        let mut regions = self.regions();
        regions.retain(Region::of_sources);
        for r in regions.iter_mut() {
            r.forget_held();
        }
        self.any
            .store(regions.iter().any(Region::can_cover), Ordering::Release);
    }

    /// This node's open regions that can hold a key in doubt, as it
    /// publishes them: who went, and the time left.
    pub fn published(&self, now: Nanos, me: &Me<'_>) -> Vec<PublishedDoubt> {
        let regions = self.regions();
        // A region this node guessed is its own: its ring is the losses
        // alone, which no peer can rebuild — published, every peer would
        // guess it too and hold its whole keyspace in doubt (a cold
        // review). Those that saw the losses publish them.
        let mut open: Vec<&Region> = regions
            .iter()
            .filter(|r| r.can_cover() && r.until > now && !r.private())
            .collect();
        // The most time left first: those are what a bound keeps.
        open.sort_by_key(|r| std::cmp::Reverse(r.until));
        open.iter()
            .map(|r| PublishedDoubt {
                // In the order lost, those back since included (an
                // adopter rebuilds the rings between the losses from it,
                // and leaves out whom it hears as that process).
                gone: r.published_losses(),
                zones: r.zones_of_losses(),
                remaining: std::time::Duration::from_nanos(r.until.saturating_sub(now)),
                untold: r.untold_pairs(me),
                ring: r.named,
            })
            .collect()
    }

    /// Whether `k`, which this node owns now, is in doubt at `now`. A key found
    /// in doubt is remembered for the counts. Regions past their grace end
    /// here (what they came to is added to `ended`).
    pub fn in_doubt(&self, k: &[u8], now: Nanos, ended: &mut Ended, me: &Me<'_>) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let mut regions = self.regions();
        self.expire(&mut regions, now, ended);
        let mut doubt = false;
        let mut hash = None;
        for r in regions.iter_mut() {
            if r.can_cover() && r.covers(k, now, me) {
                doubt = true;
                let h = *hash.get_or_insert_with(|| key_hash(k));
                if !r.keys.contains(&h) {
                    if r.keys.len() < MAX_COUNTED {
                        r.keys.insert(h);
                    } else {
                        r.overflow = r.overflow.saturating_add(1);
                    }
                }
                // Counted under the first region that covers it.
                break;
            }
        }
        doubt
    }

    /// End the regions past their grace at `now` (the reporter calls this
    /// each round, so a region ends though no key of it is asked about).
    pub fn settle(&self, now: Nanos) -> Ended {
        let mut ended = Ended::default();
        let mut regions = self.regions();
        self.expire(&mut regions, now, &mut ended);
        ended
    }

    fn expire(&self, regions: &mut Vec<Region>, now: Nanos, ended: &mut Ended) {
        let before = regions.len();
        let mut done = self.done();
        regions.retain(|r| {
            let keep = r.until > now;
            if !keep {
                ended.taken = ended.taken.saturating_add(r.counted());
                Self::remember(&mut done, &r.gone);
            }
            keep
        });
        if regions.len() != before {
            self.any
                .store(regions.iter().any(Region::can_cover), Ordering::Release);
        }
    }

    /// End every region now (an operator's word that the lost holders
    /// are not coming back): their keys are decided from the best copy
    /// from the next call on. Their losses are remembered as ended, so
    /// neither a peer's word nor members still unburied in the ring bring
    /// them back. Returns the regions that
    /// could hold keys in doubt, and what they came to.
    pub fn accept_all(&self) -> (usize, Ended) {
        let mut regions = self.regions();
        let mut done = self.done();
        let mut ended = Ended::default();
        let mut count = 0;
        for r in regions.drain(..) {
            count += usize::from(r.can_cover());
            ended.taken = ended.taken.saturating_add(r.counted());
            Self::remember(&mut done, &r.gone);
        }
        self.any.store(false, Ordering::Release);
        (count, ended)
    }

    /// Keys decided in doubt in the regions still open (the gauge), and
    /// the regions that can hold keys in doubt.
    pub fn figures(&self) -> (u64, usize) {
        let regions = self.regions();
        let open = regions.iter().filter(|r| r.can_cover()).count();
        (regions.iter().map(Region::counted).sum(), open)
    }
}

/// A key's 64-bit hash, for the counts (a collision only undercounts).
fn key_hash(k: &[u8]) -> u64 {
    use std::hash::Hasher;
    // Fixed keys: the same key hashes the same every time.
    let mut h = std::hash::DefaultHasher::new();
    h.write(k);
    h.finish()
}

#[path = "doubt_limiter.rs"]
mod limiter;

#[cfg(test)]
#[path = "doubt_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "doubt_adopt_tests.rs"]
mod adopt_tests;

#[cfg(test)]
#[path = "doubt_sources_tests.rs"]
mod sources_tests;
