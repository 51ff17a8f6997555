//! Tiered mode's owner-side ledger: demand-weighted allotments of one hot
//! key (issue 12; DESIGN §4, the same lease abstraction as the fallback).
//!
//! Edges spend allotments without asking and report what they spent
//! asynchronously; the owner's state counts only what was reported. So the
//! owner must also remember what it promised and has not yet heard about —
//! `reserved` — and never promise or admit more than the state leaves after
//! it: `consumed + reserved ≤ limit` is the invariant that makes tiered mode
//! as exact as forwarding, whatever the report lag.
//!
//! Per edge, `outstanding = granted − reported − returned`: a report moves
//! hits from outstanding into the state (the owner absorbs it, de-duplicated
//! by sequence number elsewhere); an edge asking again returns what it did
//! not spend of its previous allotment; an allotment that expired without a
//! word is released after a grace (its last reports may still be on the
//! way: they are absorbed anyway, the bound on late reports is the
//! over-admission this mode can show).
//!
//! Sizing: an edge is granted `min(want, share)` where `want` is what its
//! demand would spend within the allotment's lifetime and `share` is the
//! unreserved remainder split in proportion to the demand of every edge
//! holding an allotment (its own included). A cold edge (no demand measured
//! yet) gets a small first allotment, `free / (4·N)`, with `N` the cluster
//! size from gossip — never a full bucket.
//!
//! Pure arithmetic over an injected clock: no I/O, no locking.

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::Nanos;

mod allotment;
mod allotments;
mod ledgers;
mod queue;
mod subgrants;
pub use allotments::{Allotments, Live, Local, Taken};
pub use ledgers::Ledgers;
pub use subgrants::{Caps, SubGrants};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// One edge's standing with the owner for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Standing {
    /// Granted and not yet reported or returned.
    outstanding: u64,
    /// Hits per second the edge last said it sees (its demand).
    demand: u64,
    /// The current allotment may be spent until then.
    expires: Nanos,
    /// When it last asked (or, for the owner itself, decided): its demand
    /// counts in others' shares for `Terms::memory` after.
    seen: Nanos,
    /// Its last grant was empty: until then it refuses locally, and asks
    /// it already had in flight are refused here too ([`Ledger::waiting`]).
    empty_until: Nanos,
    /// The pace of its last grant (tokens per [`PACE_UNIT`]), held until
    /// `expires` plus the grace (its clock may start it a little late).
    pace: u64,
}

/// An edge told "nothing" waits an eighth of the allotment's `life` before
/// it asks again: tokens refill and others give back what they did not
/// spend, so look again soon (a quiet edge that waited long would find its
/// share taken by the busy ones that ask at every request). The owner's
/// ledger and the edge's allotment both keep this wait.
fn empty_wait(life: Nanos) -> Nanos {
    life / 8
}

/// What one grant decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Tokens the edge may spend without asking, now.
    pub amount: u64,
    /// Until then (after it, the edge asks again).
    pub expires: Nanos,
    /// Tokens more that come due evenly from the grant until `expires`
    /// (its share of the key's refill over that time: [`Pace`]).
    pub paced: u64,
}

impl Grant {
    /// Nothing to spend; ask again from `now`.
    pub fn none(now: Nanos) -> Grant {
        Grant {
            amount: 0,
            expires: now,
            paced: 0,
        }
    }
}

/// Pace grants are measured in tokens per this many nanoseconds (1,000 s):
/// a limit of one a minute still has a pace.
pub const PACE_UNIT: u128 = 1_000 * NANOS_PER_SEC;

/// The refill a grant may share out as a pace (issue 23).
///
/// On an exhausted key a grant can only pass on what refilled since the
/// last one, so an edge asked about once per admitted token: at 10× the
/// limit from three apps, most of the servers' time went on asks. A pace
/// is a share of the *rate* instead: tokens that come due at the edge
/// evenly over the allotment's life, so one ask covers a whole life of
/// refill. The paces of unexpired allotments never add up to more than
/// the key's refill rate, and what an edge was paced and has not reported
/// is reserved like any grant — so whatever comes due has refilled at the
/// owner by then: as exact as the bucket, with one ask per life per edge.
/// Only for keys that refill continuously (token bucket, GCRA, leaky
/// bucket); a window refills at its end and is granted as before. And only
/// while the bucket has room for a whole life of refill
/// ([`Pace::for_bucket`]): a full bucket drops its refill, and tokens
/// paced out of it would come due at the edges all the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pace {
    /// What the paces of all edges share, by demand (tokens per
    /// [`PACE_UNIT`]).
    pub rate: u64,
    /// Of it, what no other edge's unexpired allotment holds: this grant's
    /// pace is at most this.
    pub free: u64,
}

impl Pace {
    /// No pace: a window, or an edge that cannot vest.
    pub const NONE: Pace = Pace { rate: 0, free: 0 };

    /// A key refilling `rate` tokens per [`PACE_UNIT`]; the paces other
    /// edges hold are taken off it when granting ([`Ledger::grant_paced`]).
    pub fn all(rate: u64) -> Pace {
        Pace { rate, free: rate }
    }

    /// The pace a bucket refilling `rate` tokens per [`PACE_UNIT`] up to
    /// `capacity`, with `remaining` in it now, may share out for allotments
    /// living `life`: all of its rate when even a life of refill with
    /// nothing spent leaves it short of full, else none. Full, a bucket
    /// drops its refill; paced tokens would come due at the edges all the
    /// same, beyond what it holds. Short of full for every pace's life, it
    /// refills at least as fast as paces come due, so what an edge holds
    /// has refilled at the owner (a property test holds this).
    ///
    /// None either while the bucket `owes` tokens (consumption absorbed
    /// beyond it: promises folded in when the key moved, late reports):
    /// paces would spend its refill as fast as it comes and the debt would
    /// never be paid — admitting, over the run, what it owes beyond the
    /// limit.
    pub fn for_bucket(
        rate: u64,
        (remaining, owes): (u64, u64),
        capacity: u64,
        life: Nanos,
    ) -> Pace {
        if owes == 0 && remaining.saturating_add(Pace::tokens(rate, life)) <= capacity {
            Pace::all(rate)
        } else {
            Pace::NONE
        }
    }

    /// Paced tokens a pace of `rate` makes due over `span` nanoseconds.
    pub fn tokens(rate: u64, span: Nanos) -> u64 {
        mul_div(rate, u128::from(span), PACE_UNIT)
    }

    /// The pace that makes `tokens` due over `span` nanoseconds (rounded
    /// down: never faster than what was granted).
    pub fn rate_of(tokens: u64, span: Nanos) -> u64 {
        if span == 0 {
            return 0;
        }
        mul_div(tokens, PACE_UNIT, u128::from(span))
    }
}

/// The allotments of one key.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    edges: HashMap<Arc<str>, Standing>,
    /// The edges' `outstanding`, summed as they change (the table's
    /// gauge reads it; u128 never wraps).
    outstanding: u128,
    /// The latest expiry granted: while it is ahead, an edge holds an
    /// allotment (an edge is forgotten only after its expiry).
    last_expires: Nanos,
}

/// How grants are sized and kept.
#[derive(Clone, Copy, Debug)]
pub struct Terms {
    /// An allotment's lifetime.
    pub ttl: Nanos,
    /// After expiry, how long its unreported part stays reserved (late
    /// reports: a few report intervals).
    pub grace: Nanos,
    /// Edges remembered per key; beyond it a new edge gets nothing (it
    /// decides on the slow path, exactly).
    pub max_edges: usize,
    /// How long an edge's last demand counts in the others' shares.
    pub memory: Nanos,
}

impl Ledger {
    /// Tokens promised to edges and not yet reported, as of `now`.
    pub fn reserved(&self, now: Nanos, terms: &Terms) -> u64 {
        self.edges
            .values()
            .filter(|s| s.expires.saturating_add(terms.grace) > now)
            .fold(0u64, |sum, s| sum.saturating_add(s.outstanding))
    }

    /// What [`Ledger::give_back`] of `unused` by `edge` would take off
    /// [`Ledger::reserved`] at `now`: lets a decision count a give-back
    /// before applying it, so a decision retried (a stale ring) never gives
    /// the same tokens back twice.
    pub fn giving_back(&self, edge: &str, unused: u64, now: Nanos, terms: &Terms) -> u64 {
        self.edges
            .get(edge)
            .filter(|s| s.expires.saturating_add(terms.grace) > now)
            .map_or(0, |s| s.outstanding.min(unused))
    }

    /// Edges holding an unexpired allotment.
    pub fn holders(&self, now: Nanos) -> usize {
        self.edges.values().filter(|s| s.expires > now).count()
    }

    /// `edge` reported `hits` spent: they leave its outstanding (the state
    /// absorbs them). Hits beyond what it holds (a report after release)
    /// change nothing here.
    /// Returns how many of them it held outstanding.
    pub fn reported(&mut self, edge: &str, hits: u64) -> u64 {
        self.lessen(edge, hits)
    }

    /// `edge` gives back `unused` tokens of its allotment (it asked again);
    /// returns how many it held outstanding (what really comes back).
    pub fn give_back(&mut self, edge: &str, unused: u64) -> u64 {
        self.lessen(edge, unused)
    }

    fn lessen(&mut self, edge: &str, by: u64) -> u64 {
        let Some(s) = self.edges.get_mut(edge) else {
            return 0;
        };
        let cut = s.outstanding.min(by);
        s.outstanding -= cut;
        self.outstanding = self.outstanding.saturating_sub(u128::from(cut));
        cut
    }

    /// Release allotments that expired more than `grace` ago; forget edges
    /// whose demand is older than `memory` too. Returns the tokens released.
    pub fn release_expired(&mut self, now: Nanos, terms: &Terms) -> u64 {
        let total = &mut self.outstanding;
        let mut released = 0u64;
        self.edges.retain(|_, s| {
            let live = s.expires.saturating_add(terms.grace) > now;
            if !live {
                *total = total.saturating_sub(u128::from(s.outstanding));
                released = released.saturating_add(s.outstanding);
                s.outstanding = 0;
            }
            live || s.seen.saturating_add(terms.memory) > now
        });
        released
    }

    /// Take back what `edge` holds beyond `at_most` (it says it holds no
    /// more: what it was granted and never received, or lost); returns
    /// how much.
    pub fn hold_at_most(&mut self, edge: &str, at_most: u64) -> u64 {
        let held = self.edges.get(edge).map_or(0, |s| s.outstanding);
        self.lessen(edge, held.saturating_sub(at_most))
    }

    /// The edges with a standing here.
    pub fn edge_ids(&self) -> impl Iterator<Item = &Arc<str>> {
        self.edges.keys()
    }

    /// Whether `edge` has a standing here (granted, and not yet forgotten).
    pub fn knows(&self, edge: &str) -> bool {
        self.edges.contains_key(edge)
    }

    /// Edges remembered (holding an allotment, or recently heard from).
    pub fn edges(&self) -> usize {
        self.edges.len()
    }

    /// Every edge's recent demand, summed (hits per second).
    pub fn demand(&self, now: Nanos, terms: &Terms) -> u64 {
        self.edges
            .values()
            .filter(|s| s.seen.saturating_add(terms.memory) > now)
            .fold(0u64, |sum, s| sum.saturating_add(s.demand))
    }

    /// Grant `edge` its next allotment (what it did not spend of the last
    /// one given back first: [`Ledger::give_back`]). `remaining` is what the
    /// key's state leaves now (reported consumption only); `demand` the
    /// edge's hits per second; `n` the cluster size from gossip. No pace.
    pub fn grant(
        &mut self,
        edge: &str,
        demand: u64,
        remaining: u64,
        n: u64,
        now: Nanos,
        terms: &Terms,
    ) -> Grant {
        self.grant_paced(edge, demand, remaining, Some(Pace::NONE), n, now, terms)
    }

    /// The pace the other edges' allotments hold (tokens per
    /// [`PACE_UNIT`]): theirs until their expiry plus the grace.
    pub fn paces_of_others(&self, edge: &str, now: Nanos, terms: &Terms) -> u64 {
        self.edges
            .iter()
            .filter(|(e, s)| &***e != edge && s.expires.saturating_add(terms.grace) > now)
            .fold(0u64, |sum, (_, s)| sum.saturating_add(s.pace))
    }

    /// [`Ledger::grant`], with a share of `pace` by demand on top: tokens
    /// that come due at the edge over the allotment's life ([`Pace`]) —
    /// at most `pace.free`, and never more than the other edges' unexpired
    /// paces leave of `pace.rate`.
    ///
    /// `pace` is None for an ask sent while another of the edge's asks
    /// that may be paced is in flight ([`Allotments::ask_pace`]): it gets
    /// tokens only, and the edge's pace stays as it is. Some (even
    /// [`Pace::NONE`]) replaces the edge's pace with this grant's: the
    /// edge stopped its own when it asked, and at most one such ask of an
    /// edge is in flight — so, in whatever order grants arrive, the pace
    /// coming due at the edge is the one counted here.
    #[allow(clippy::too_many_arguments)]
    pub fn grant_paced(
        &mut self,
        edge: &str,
        demand: u64,
        remaining: u64,
        pace: Option<Pace>,
        n: u64,
        now: Nanos,
        terms: &Terms,
    ) -> Grant {
        let replaces = pace.is_some();
        let pace = pace.unwrap_or(Pace::NONE);
        self.release_expired(now, terms);
        if !self.edges.contains_key(edge) && self.edges.len() >= terms.max_edges {
            return Grant::none(now);
        }
        let others_reserved = self
            .edges
            .iter()
            .filter(|(e, s)| &***e != edge && s.expires.saturating_add(terms.grace) > now)
            .fold(0u64, |sum, (_, s)| sum.saturating_add(s.outstanding));
        let own_reserved = self.edges.get(edge).map_or(0, |s| s.outstanding);
        let free = remaining
            .saturating_sub(others_reserved)
            .saturating_sub(own_reserved);
        let (amount, rate) = if demand == 0 {
            // Cold: a small first allotment, never a full bucket.
            (free / (4 * n.max(1)), 0)
        } else {
            let want = mul_div(demand, u128::from(terms.ttl), NANOS_PER_SEC).max(1);
            // The free tokens are split among those who will want some of
            // them: this edge, the others heard from recently, and members
            // of the cluster (N, from gossip) not heard from yet, counted
            // at the average — so the first to ask after a refill takes its
            // fraction, not all of it. Those holding an allotment count
            // too: on an exhausted key every busy edge holds one (its
            // spending not yet reported), and leaving them out gave each
            // rarely-asking edge all of the refill — an app with 80% of the
            // demand got 44% (issue 23's bench); counted, 67%, and 75% in
            // the node-level uneven test.
            let recent = |s: &Standing| s.seen.saturating_add(terms.memory) > now;
            let (mut total, mut known) = (u128::from(demand), 1u128);
            let mut all = u128::from(demand);
            for (e, s) in &self.edges {
                if &**e == edge || !recent(s) {
                    continue;
                }
                known += 1;
                all += u128::from(s.demand);
                total += u128::from(s.demand);
            }
            let unknown = u128::from(n).saturating_sub(known);
            total += unknown * all / known;
            let share = mul_div(free, u128::from(demand), total);
            // The pace is split by the same demands: its share of the
            // rate, at most what its demand spends and what no other
            // edge holds.
            let others = self.paces_of_others(edge, now, terms);
            let rate = mul_div(pace.rate, u128::from(demand), total)
                .min(demand.saturating_mul(1_000))
                .min(pace.free)
                .min(pace.rate.saturating_sub(others));
            (want.min(share), rate)
        };
        let paced = Pace::tokens(rate, terms.ttl);
        let rate = if paced == 0 { 0 } else { rate };
        let expires = now.saturating_add(terms.ttl);
        let s = self.edges.entry(Arc::from(edge)).or_insert(Standing {
            outstanding: 0,
            demand,
            expires,
            seen: now,
            empty_until: 0,
            pace: 0,
        });
        let before = s.outstanding;
        s.outstanding = s.outstanding.saturating_add(amount).saturating_add(paced);
        self.outstanding += u128::from(s.outstanding - before);
        self.last_expires = self.last_expires.max(expires);
        s.demand = demand;
        s.expires = expires;
        s.seen = now;
        // The edge's pace is this grant's from now: an earlier grant's
        // stopped when the edge asked ([`Allotments::spend`]).
        if replaces {
            s.pace = rate;
        }
        // Told nothing: its asks already in flight are refused (`waiting`)
        // — unless this one could not be paced, so its paced sibling may
        // still be on the way.
        if amount == 0 && paced == 0 && replaces {
            s.empty_until = now.saturating_add(empty_wait(terms.ttl));
        }
        Grant {
            amount,
            expires,
            paced,
        }
    }

    /// Tokens outstanding with every edge, released or not: what
    /// [`Ledger::reserved`] says once [`Ledger::release_expired`] ran.
    pub(super) fn outstanding(&self) -> u128 {
        self.outstanding
    }

    /// Until then some edge holds an unexpired allotment.
    pub(super) fn last_expires(&self) -> Nanos {
        self.last_expires
    }

    /// After [`Ledger::release_expired`] at `now`: when time next changes
    /// what the ledger says — the earliest release of a reservation, or,
    /// with none, the end of the last allotment. None when idle.
    pub(super) fn next_change(&self, now: Nanos, terms: &Terms) -> Option<Nanos> {
        if self.outstanding > 0 {
            self.edges
                .values()
                .filter(|s| s.outstanding > 0)
                .map(|s| s.expires.saturating_add(terms.grace))
                .min()
        } else if self.last_expires > now {
            Some(self.last_expires)
        } else {
            None
        }
    }

    /// Whether `edge` was just told there is nothing for it: an ask of its
    /// that was already in flight is refused without a decision, as the
    /// edge refuses locally meanwhile. (An edge's asks overlap — its calls
    /// come faster than an ask's round trip — and each would otherwise be
    /// decided exactly: edges won more of each refill than the owner, which
    /// asks itself synchronously; seen 24% for the owner against 38% each
    /// for two edges of equal demand.)
    pub fn waiting(&self, edge: &str, now: Nanos) -> bool {
        self.edges.get(edge).is_some_and(|s| now < s.empty_until)
    }
}

/// `a × b / c` without overflow (`c > 0`), saturating at `u64::MAX`.
fn mul_div(a: u64, b: u128, c: u128) -> u64 {
    let v = u128::from(a) * b / c.max(1);
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod pace_tests;
#[cfg(test)]
mod tests;
