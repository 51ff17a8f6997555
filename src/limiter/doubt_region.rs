//! One region of doubt: a fault that took members away, the rings its keys
//! were decided in while it unfolded, and when each key's doubt ends.
//!
//! A fault rarely takes its members in one view: an owner's replica holder
//! is buried, the owner goes on deciding with a new holder, then the owner
//! and that holder go. Each key's holders of record are those of the last
//! ring it was decided in, so a region reads every ring it went through —
//! the ring before its first loss (`previous`), then that ring without each
//! later loss in turn. Positions depend on node ids alone, so those rings
//! are `previous` with members skipped (`Ring::holders_without`), never
//! rebuilt. A key is in doubt when, in any of them, its owner and replica
//! holder are both gone now; its doubt runs for the grace from the later
//! of their two losses (the key came in doubt with its second holder, not
//! with the region's first loss — simulator seed 89).

use std::collections::HashSet;
use std::sync::Arc;

use crate::algorithm::Nanos;
use crate::cluster::membership::doubts::{MAX_UNTOLD, RingName};
use crate::cluster::membership::view::MAX_TOMBSTONES;
use crate::cluster::ring::Ring;

/// One change that took members away.
#[derive(Debug)]
pub(super) struct Region {
    /// The ring before the change: whose keys were where.
    pub(super) previous: Arc<Ring>,
    /// The members of `previous` gone since, by id and generation (one
    /// entry per id) — those of the change, and any lost later within the
    /// grace (an owner lost in one view and its replica holder in the next
    /// are a pair).
    pub(super) gone: Vec<(Arc<str>, u64)>,
    /// The members of `previous` the region lost, back since or not, in
    /// the order lost (one entry per id): what it publishes.
    pub(super) lost: Vec<(Arc<str>, u64)>,
    /// The zones of members gone that joined after `previous` (its ring
    /// knows them not), by id: an adopter places replicas with them too.
    later_zones: Vec<(Arc<str>, Arc<str>)>,
    /// Per member of `previous` (by its index there): the step it was
    /// first lost in (the chain's shape), and when it was lost last (a
    /// member back and lost again puts its keys in doubt anew).
    step_of: Vec<Option<u16>>,
    lost_at: Vec<Nanos>,
    /// Per step (a loss of members of `previous` not lost before): how
    /// many members of `previous` the ring before it still had, and this
    /// node's view number when it adopted that ring (an owner's word that
    /// this node caught up with it counts from then: the same members make
    /// the same epoch again, and a word from an earlier stretch of it says
    /// nothing of this one). Adopted regions' steps: 0 (their rings are
    /// rebuilt, their epochs never named in a word).
    steps: Vec<(usize, u64)>,
    /// When the grace of the latest loss ends: the region ends.
    pub(super) until: Nanos,
    grace: Nanos,
    /// Keys decided in doubt under this region (hashed: a key's bytes are
    /// the caller's, up to `max_key_bytes`).
    pub(super) keys: HashSet<u64>,
    /// More keys than [`super::MAX_COUNTED`] were decided in doubt.
    pub(super) overflow: u64,
    /// `(holder, owner)` pairs a peer's word named untold (an adopted
    /// region): that holder is no holder of record of that owner's keys
    /// here, as this node is not of an owner that did not say so to it.
    untold: Vec<(Arc<str>, Arc<str>)>,
    /// Opened here (not adopted): its rings are the ones this node
    /// decided in, so the owners' words about them mean what they say —
    /// an adopted region's rings are rebuilt, their epochs never named.
    opened_here: bool,
    /// The ring before the first loss as the word names it: that of
    /// `previous` where opened here, the word's where adopted (whatever
    /// the rebuild came to: an adopter of this node's word checks its own
    /// rebuild against the ring the fault began in).
    pub(super) named: RingName,
    /// Opened by a node that was not in the ring before the change: its
    /// ring is the members lost alone, and it covers once two are gone
    /// (`Doubts::changed`).
    guessed: bool,
    /// When the latest member was lost (what a guessed region's doubt runs
    /// from: its later losses are in none of its ring's places).
    last_loss: Nanos,
    /// Opened by members this node's transfer still waited for, lost
    /// before they said `done` (`Limiter::sources_lost`): what this node
    /// held current then. A key it did not hold current, that a member
    /// gone may have held, is in doubt for the grace from the loss.
    sources: Option<super::Held>,
}

impl Region {
    /// A region opened here at `now` by the loss of `gone` (members of
    /// `previous`).
    pub(super) fn new(
        previous: Arc<Ring>,
        gone: Vec<(Arc<str>, u64)>,
        view: u64,
        now: Nanos,
        grace: Nanos,
    ) -> Region {
        let named = name_of(&previous);
        let mut r = Region {
            step_of: vec![None; previous.members().len()],
            lost_at: vec![0; previous.members().len()],
            previous,
            gone: Vec::new(),
            lost: Vec::new(),
            later_zones: Vec::new(),
            steps: Vec::new(),
            until: now.saturating_add(grace),
            grace,
            keys: HashSet::new(),
            overflow: 0,
            untold: Vec::new(),
            opened_here: true,
            named,
            guessed: false,
            last_loss: now,
            sources: None,
        };
        r.lose(&gone, None, view, now);
        r
    }

    /// A region opened by a node not in the ring before the change, over
    /// `lost`, the ring of the members lost (see `Doubts::changed`).
    pub(super) fn guessed(
        lost: Arc<Ring>,
        gone: Vec<(Arc<str>, u64)>,
        view: u64,
        now: Nanos,
        grace: Nanos,
    ) -> Region {
        let mut r = Region::new(lost, gone, view, now, grace);
        r.guess();
        r
    }

    /// Read from its losses alone (opened over a ring this node was not
    /// in, or adopted from a word whose ring it could not rebuild): no
    /// ring says where each key stood, so every key this node owns is in
    /// doubt while two of its members are gone, for the grace from the
    /// latest loss. A member back does not stand as a holder of record:
    /// where it stood is not known here (simulator seed 937 of `--mix
    /// any`: a holder paused and replaced, back, stood in a ring of the
    /// word's losses as the holder of a key whose later holders were both
    /// lost).
    pub(super) fn guess(&mut self) {
        self.guessed = true;
    }

    /// A region over what `lost` (members this node's transfer still
    /// waited for) may have held of the keys this node did not hold
    /// current (`held`: see [`Region::sources`]). Its ring is the members
    /// lost alone (nothing is read in it: it names the losses).
    pub(super) fn unfinished(
        held: super::Held,
        lost: Arc<Ring>,
        gone: Vec<(Arc<str>, u64)>,
        now: Nanos,
        grace: Nanos,
    ) -> Region {
        let mut r = Region::new(lost, gone, 0, now, grace);
        r.sources = Some(held);
        r
    }

    /// This node rejoined as a new member: what it held is copies now.
    pub(super) fn forget_held(&mut self) {
        if let Some(held) = self.sources.take() {
            self.sources = Some(held.copies_only());
        }
    }

    /// Guessed and opened here (not adopted): over a ring of this node's
    /// own guess, which it neither publishes nor extends once a member.
    pub(super) fn opened_guessed(&self) -> bool {
        self.guessed && self.opened_here
    }

    /// This node's own reading, not a peer's: a guess over a ring it was
    /// not in, or a transfer's source lost before `done`. Neither is
    /// published (no peer could read it as meant) nor extended by later
    /// losses once this node is a member.
    pub(super) fn private(&self) -> bool {
        self.opened_guessed() || self.of_sources()
    }

    /// Opened by a transfer's source lost before `done`.
    pub(super) fn of_sources(&self) -> bool {
        self.sources.is_some()
    }

    /// A region as a peer published it, ending at `until`: `lost` in the
    /// order lost (those back since included), `gone` those of them not
    /// heard here. The steps between its losses are not sent, so each loss
    /// is a step of its own (more rings only put more keys in doubt, never
    /// fewer), all as old as the time left says. `untold`: the holders the
    /// word named untold by an owner; `named`: the ring the word named.
    pub(super) fn adopted(
        previous: Arc<Ring>,
        gone: Vec<(Arc<str>, u64)>,
        lost: &[(Arc<str>, u64)],
        untold: &[(Arc<str>, Arc<str>)],
        named: RingName,
        until: Nanos,
        grace: Nanos,
    ) -> Region {
        let at = until.saturating_sub(grace);
        let mut r = Region::new(previous, Vec::new(), 0, at, grace);
        r.opened_here = false;
        r.named = named;
        for l in lost {
            r.lose(std::slice::from_ref(l), None, 0, at);
            // One with no place in the ring (read from the losses alone:
            // back, or seen here) is still of the word's losses: without
            // it the word was adopted again on every view (a cold review).
            if !r.lost.iter().any(|(id, _)| *id == l.0) {
                r.lost.push(l.clone());
            }
        }
        r.gone = gone;
        r.until = until;
        r.learn_untold(untold);
        r
    }

    /// Members lost at `now` join the region. Those of `previous` not lost
    /// before are a step (a ring of the chain begins before it); the
    /// region lasts the grace from any loss of a member of `previous` (one
    /// back and lost again too); a member that joined after `previous` was
    /// in none of its rings, and changes none (its zone, read in `from`,
    /// the ring it was lost from, is kept for what the region publishes).
    pub(super) fn lose(
        &mut self,
        gone: &[(Arc<str>, u64)],
        from: Option<&Ring>,
        view: u64,
        now: Nanos,
    ) {
        let mut step: Option<u16> = None;
        for g in gone {
            let newly = !self.gone.iter().any(|(id, _)| *id == g.0);
            if newly {
                self.gone.push(g.clone());
                self.last_loss = self.last_loss.max(now);
                if self.guessed {
                    self.until = self.until.max(now.saturating_add(self.grace));
                }
            }
            let Some(i) = self.index(&g.0) else {
                // The zone it had where it was lost last (a new process
                // may name another): replaced, not kept from the first.
                if let Some(m) = from.and_then(|r| r.member(&g.0)) {
                    self.later_zones.retain(|(id, _)| *id != g.0);
                    if !m.zone.is_empty() && self.later_zones.len() < MAX_TOMBSTONES {
                        self.later_zones.push((g.0.clone(), m.zone.clone()));
                    }
                }
                continue;
            };
            if newly {
                self.lost_at[i] = now;
                self.until = self.until.max(now.saturating_add(self.grace));
            }
            if self.step_of[i].is_some() || self.steps.len() >= usize::from(u16::MAX) {
                continue;
            }
            let s = *step.get_or_insert_with(|| {
                let left = self.step_of.iter().filter(|s| s.is_none()).count();
                self.steps.push((left, view));
                (self.steps.len() - 1) as u16
            });
            self.step_of[i] = Some(s);
            self.lost.push(g.clone());
        }
    }

    /// `id`, lost here before and back since as the same process (its
    /// generations `process`), is lost again at `now`: gone once more, its
    /// keys' doubt running the grace from now (no new step: the rings it
    /// went through are the ones read already).
    pub(super) fn lost_again(
        &mut self,
        id: &str,
        process: &std::ops::RangeInclusive<u64>,
        now: Nanos,
    ) {
        let Some(i) = self.index(id) else {
            return;
        };
        let m = &self.previous.members()[i];
        let back = self.step_of[i].is_some() && !self.gone.iter().any(|(g, _)| **g == *id);
        if back && process.contains(&m.generation) {
            let g = (m.node_id.clone(), m.generation);
            self.lose(&[g], None, 0, now);
        }
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.previous
            .members()
            .binary_search_by(|m| (*m.node_id).cmp(id))
            .ok()
    }

    /// Whether `k` (owned by this node now) is in doubt under this region
    /// at `now`: in a ring of the chain its owner and that owner's replica
    /// holder are both gone (so this node was neither, or was the holder
    /// before the owner said it held the owner's replicas: `me`), and the
    /// grace from the later of their losses has not passed.
    pub(super) fn covers(&self, k: &[u8], now: Nanos, me: &super::Me<'_>) -> bool {
        if let Some(held) = &self.sources {
            return !held.current(k, me)
                && held.may_have_held(k, &self.gone, me.id)
                && self.last_loss.saturating_add(self.grace) > now;
        }
        if self.guessed {
            return self.can_cover() && self.last_loss.saturating_add(self.grace) > now;
        }
        let members = self.previous.members();
        let me_at = self.index(me.id);
        // This node is never among the gone of a region it opened; of an
        // adopted one, only as an older generation (another process).
        let gone = |i: usize| self.gone.iter().any(|(id, _)| *id == members[i].node_id);
        let lost_at = |i: usize| self.lost_at[i];
        (0..self.steps.len()).any(|s| {
            // The ring before step `s`: without the members lost before it.
            let skipped = |i: usize| self.step_of[i].is_some_and(|t| usize::from(t) < s);
            let (left, since) = self.steps[s];
            let (owner, holder) = match left {
                0 => return false,
                // One member left: it owns every key, and has no successor
                // (no walk over the whole ring for it).
                1 => ((0..members.len()).find(|&i| !skipped(i)), None),
                _ => self.previous.holders_without(k, skipped),
            };
            let Some(owner) = owner else {
                return false;
            };
            // Named the key's replica holder, this node did not hold its
            // copy until the owner said so (`caught_up.rs`): whose copy
            // it was is read from the ring without it — the holder before,
            // or none (simulator seed 575 of `--mix any`).
            let ring_epoch = || match s {
                0 => self.previous.epoch(),
                _ => self.previous.epoch_without(skipped),
            };
            // (Named there at an older generation, gone — another process,
            // whose copies died with it — it is a holder lost as any.) A
            // peer's word may name another holder untold so (an adopted
            // region: simulator seed 816 of `--mix any`).
            let untold = |h: usize| {
                let (h_id, o_id) = (&members[h].node_id, &members[owner].node_id);
                if gone(h) {
                    return false;
                }
                if me_at == Some(h) {
                    return !said_by_its_protocol(&members[owner])
                        && !(me.confirmed)(o_id, ring_epoch(), since);
                }
                self.untold.iter().any(|(uh, uo)| uh == h_id && uo == o_id)
            };
            // A ring of the chain after the first whose holder was untold:
            // the copy stayed with the holder of the ring before, which
            // that ring's own step reads (a node lost, then the owner
            // before it told the next holder: the one lost first, back,
            // holds the copy — `tests/correlated_faults.rs`).
            if s > 0 && holder.is_some_and(untold) {
                return false;
            }
            // Of the first ring, each untold in turn: two joiners, neither
            // told, and the holder before them is the one whose copy
            // counts.
            let mut passed: Vec<usize> = Vec::new();
            let mut holder = holder;
            while let Some(h) = holder.filter(|&h| untold(h) && passed.len() < members.len()) {
                passed.push(h);
                holder = self
                    .previous
                    .holders_without(k, |i| skipped(i) || passed.contains(&i))
                    .1;
            }
            if !gone(owner) || holder.is_some_and(|h| !gone(h)) {
                return false;
            }
            let from = lost_at(owner).max(holder.map_or(0, lost_at));
            from.saturating_add(self.grace) > now
        })
    }

    /// Whether any key can be in doubt under it: an owner and its replica
    /// holder are two members, both gone (or the ring had one member, or
    /// two: the other may have been this node before its owner said it
    /// held its replicas).
    pub(super) fn can_cover(&self) -> bool {
        if self.sources.is_some() {
            return !self.gone.is_empty();
        }
        if self.guessed {
            // Or one gone whose holder a word named untold: where that
            // holder stood is not known here either.
            return self.gone.len() >= 2 || (!self.gone.is_empty() && !self.untold.is_empty());
        }
        self.gone.len() >= 2 || self.previous.members().len() <= 2 || !self.untold.is_empty()
    }

    /// Holders a peer's word named untold: kept only where the owner is a
    /// member this region lost and the holder one of its ring not gone
    /// (bounded).
    pub(super) fn learn_untold(&mut self, pairs: &[(Arc<str>, Arc<str>)]) {
        for p in pairs {
            let (holder, owner) = (&p.0, &p.1);
            let owner_lost = self.lost.iter().any(|(id, _)| id == owner);
            let holder_here = (self.guessed || self.index(holder).is_some())
                && !self.gone.iter().any(|(id, _)| id == holder)
                && holder != owner;
            if owner_lost
                && holder_here
                && self.untold.len() < MAX_UNTOLD
                && !self.untold.contains(p)
            {
                self.untold.push(p.clone());
            }
        }
    }

    /// What it publishes of untold holders: this node, where it opened the
    /// region, is a member of `previous` still, and an owner gone since
    /// did not say, for `previous`, that this node held its replicas
    /// (`me`); and the pairs a peer's word named. (Of an
    /// adopted region, only the word's: its rings are rebuilt, and no owner
    /// named their epochs — a node back from a burial that adopted its
    /// peers' region named itself untold, and kept keys in doubt it held
    /// the copies of: `tests/correlated_faults.rs`.)
    pub(super) fn untold_pairs(&self, me: &super::Me<'_>) -> Vec<(Arc<str>, Arc<str>)> {
        let members = self.previous.members();
        // This node's own first: it is their source; those a peer named
        // after, not this node (its own word is what it says of itself).
        let mut out = Vec::new();
        let mine = self
            .index(me.id)
            .filter(|&m| self.opened_here && self.step_of[m].is_none());
        if let Some(m) = mine {
            for (id, _) in &self.gone {
                let Some(o) = self.index(id) else { continue };
                if o == m || said_by_its_protocol(&members[o]) {
                    continue;
                }
                // Of the first ring only, as `covers` reads untold holders
                // (in a later ring the copy stayed with the holder before).
                let since = self.steps.first().map_or(0, |&(_, v)| v);
                let untold = !(me.confirmed)(id, self.previous.epoch(), since);
                let pair = (Arc::from(me.id), id.clone());
                if untold && !out.contains(&pair) {
                    out.push(pair);
                }
            }
        }
        for p in &self.untold {
            if *p.0 != *me.id && !out.contains(p) {
                out.push(p.clone());
            }
        }
        out.truncate(MAX_UNTOLD);
        out
    }

    pub(super) fn counted(&self) -> u64 {
        (self.keys.len() as u64).saturating_add(self.overflow)
    }

    /// The zones of the members it publishes that named one, by id.
    pub(super) fn zones_of_losses(&self) -> Vec<(Arc<str>, Arc<str>)> {
        self.lost
            .iter()
            .filter_map(|(id, _)| self.previous.member(id))
            .filter(|m| !m.zone.is_empty())
            .map(|m| (m.node_id.clone(), m.zone.clone()))
            .chain(self.later_zones.iter().cloned())
            .collect()
    }

    /// What this region publishes: the members it lost in the order lost
    /// (at the generation still gone, if gone), then those gone that
    /// joined after `previous`; one entry per id, at most
    /// [`MAX_TOMBSTONES`], members back since left out first.
    pub(super) fn published_losses(&self) -> Vec<(Arc<str>, u64)> {
        let is_gone = |id: &Arc<str>| self.gone.iter().find(|(g, _)| g == id);
        let mut list: Vec<(Arc<str>, u64)> = self
            .lost
            .iter()
            .map(|l| is_gone(&l.0).cloned().unwrap_or_else(|| l.clone()))
            .chain(
                self.gone
                    .iter()
                    .filter(|(id, _)| !self.lost.iter().any(|(l, _)| l == id))
                    .cloned(),
            )
            .collect();
        while list.len() > MAX_TOMBSTONES {
            match list.iter().rposition(|(id, _)| is_gone(id).is_none()) {
                Some(p) => {
                    list.remove(p);
                }
                None => list.truncate(MAX_TOMBSTONES),
            }
        }
        list
    }
}

/// How a word names `ring`: its epoch and its newest generation.
pub(super) fn name_of(ring: &Ring) -> RingName {
    let newest = ring.members().iter().map(|m| m.generation).max();
    (ring.epoch(), newest.unwrap_or(0))
}

/// Whether an owner's protocol has no word for caught up (protocol 2,
/// during a rolling upgrade): its replica holders stand as the ring names
/// them, as before the word. A member rebuilt from a peer's word (an
/// adopted region's loss) names no protocol: not excused.
pub(super) fn said_by_its_protocol(owner: &crate::cluster::ring::Member) -> bool {
    (1..3).contains(&owner.protocol)
}
