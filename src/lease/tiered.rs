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
    /// Tokens the edge may spend without asking.
    pub amount: u64,
    /// Until then (after it, the edge asks again).
    pub expires: Nanos,
}

/// The allotments of one key.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    edges: HashMap<Arc<str>, Standing>,
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

    /// Edges holding an unexpired allotment.
    pub fn holders(&self, now: Nanos) -> usize {
        self.edges.values().filter(|s| s.expires > now).count()
    }

    /// `edge` reported `hits` spent: they leave its outstanding (the state
    /// absorbs them). Hits beyond what it holds (a report after release)
    /// change nothing here.
    pub fn reported(&mut self, edge: &str, hits: u64) {
        if let Some(s) = self.edges.get_mut(edge) {
            s.outstanding = s.outstanding.saturating_sub(hits);
        }
    }

    /// `edge` gives back `unused` tokens of its allotment (it asked again).
    pub fn give_back(&mut self, edge: &str, unused: u64) {
        if let Some(s) = self.edges.get_mut(edge) {
            s.outstanding = s.outstanding.saturating_sub(unused);
        }
    }

    /// Release allotments that expired more than `grace` ago; forget edges
    /// whose demand is older than `memory` too.
    pub fn release_expired(&mut self, now: Nanos, terms: &Terms) {
        self.edges.retain(|_, s| {
            let live = s.expires.saturating_add(terms.grace) > now;
            if !live {
                s.outstanding = 0;
            }
            live || s.seen.saturating_add(terms.memory) > now
        });
    }

    /// Grant `edge` its next allotment (what it did not spend of the last
    /// one given back first: [`Ledger::give_back`]). `remaining` is what the
    /// key's state leaves now (reported consumption only); `demand` the
    /// edge's hits per second; `n` the cluster size from gossip.
    pub fn grant(
        &mut self,
        edge: &str,
        demand: u64,
        remaining: u64,
        n: u64,
        now: Nanos,
        terms: &Terms,
    ) -> Grant {
        self.release_expired(now, terms);
        if !self.edges.contains_key(edge) && self.edges.len() >= terms.max_edges {
            return Grant {
                amount: 0,
                expires: now,
            };
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
        let amount = if demand == 0 {
            // Cold: a small first allotment, never a full bucket.
            free / (4 * n.max(1))
        } else {
            let want = mul_div(demand, u128::from(terms.ttl), NANOS_PER_SEC).max(1);
            // The free tokens are split among those who will want some of
            // them: this edge, the others heard from recently that hold
            // nothing now (those holding an allotment were served from an
            // earlier pool), and members of the cluster (N, from gossip)
            // not heard from yet, counted at the average — so the first to
            // ask after a refill takes its fraction, not all of it.
            let recent = |s: &Standing| s.seen.saturating_add(terms.memory) > now;
            let (mut total, mut known) = (u128::from(demand), 1u128);
            let mut all = u128::from(demand);
            for (e, s) in &self.edges {
                if &**e == edge || !recent(s) {
                    continue;
                }
                known += 1;
                all += u128::from(s.demand);
                if s.outstanding == 0 {
                    total += u128::from(s.demand);
                }
            }
            let unknown = u128::from(n).saturating_sub(known);
            total += unknown * all / known;
            let share = mul_div(free, u128::from(demand), total);
            want.min(share)
        };
        let expires = now.saturating_add(terms.ttl);
        let s = self.edges.entry(Arc::from(edge)).or_insert(Standing {
            outstanding: 0,
            demand,
            expires,
            seen: now,
            empty_until: 0,
        });
        s.outstanding = s.outstanding.saturating_add(amount);
        s.demand = demand;
        s.expires = expires;
        s.seen = now;
        if amount == 0 {
            s.empty_until = now.saturating_add(empty_wait(terms.ttl));
        }
        Grant { amount, expires }
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

/// An edge's allotment of one key, and its demand meter.
#[derive(Clone, Debug)]
struct Allotment {
    tokens: u64,
    expires: Nanos,
    /// The owner had nothing to grant: refuse here until then rather than
    /// send every refusal of an exhausted hot key across the network.
    empty_until: Nanos,
    /// The last grant's size, and whether its running low was signalled.
    last_grant: u64,
    low_signalled: bool,
    /// Hits seen in the current second, and the rate of the last full one.
    window_start: Nanos,
    window_hits: u64,
    rate: u64,
}

impl Allotment {
    /// Nothing to spend, no demand seen yet.
    fn empty(now: Nanos) -> Allotment {
        Allotment {
            tokens: 0,
            expires: now,
            empty_until: 0,
            last_grant: 0,
            low_signalled: false,
            window_start: now,
            window_hits: 0,
            rate: 0,
        }
    }

    /// Count `hits` of demand (admitted here or not) at `now`.
    fn see(&mut self, hits: u64, now: Nanos) {
        let second = NANOS_PER_SEC as u64;
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= second {
            // The last window's rate; a gap of more than a window is idle.
            self.rate = if elapsed >= 2 * second {
                0
            } else {
                self.window_hits
            };
            self.window_start = now;
            self.window_hits = 0;
        }
        self.window_hits = self.window_hits.saturating_add(hits);
    }

    /// Hits per second: the last full second's, or this one's so far if
    /// higher (so a burst is seen before its second ends), over at least
    /// 100 ms (one hit is not a rate of millions).
    fn demand(&self, now: Nanos) -> u64 {
        let elapsed = now
            .saturating_sub(self.window_start)
            .max(NANOS_PER_SEC as u64 / 10);
        let so_far = mul_div(self.window_hits, NANOS_PER_SEC, u128::from(elapsed));
        self.rate.max(so_far)
    }
}

/// What the edge should do with one tiered check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Admitted from the allotment, no hop; this many tokens are left.
    /// `low`: the allotment just fell below a quarter of its grant (report
    /// what was spent now, not at the next interval).
    Admitted { left: u64, low: bool },
    /// Refused here: the owner had nothing to grant a moment ago; ask again
    /// after this long.
    Refused { retry_after: Nanos },
    /// The allotment cannot cover it: ask the owner (the slow path), saying
    /// this demand and giving back this many unspent tokens.
    Ask { demand: u64, unused: u64 },
}

/// An edge's allotments, by encoded key; bounded (a key beyond the bound
/// always takes the slow path, which is exact).
#[derive(Debug, Default)]
pub struct Allotments {
    keys: HashMap<Arc<[u8]>, Allotment>,
    max_keys: usize,
}

impl Allotments {
    pub fn new(max_keys: usize) -> Allotments {
        Allotments {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
        }
    }

    /// Spend `hits` from the key's allotment if it covers them.
    pub fn spend(&mut self, key: &[u8], hits: u64, now: Nanos) -> Local {
        if !self.keys.contains_key(key) && self.keys.len() >= self.max_keys {
            self.keys.retain(|_, a| a.expires > now);
        }
        if !self.keys.contains_key(key) && self.keys.len() >= self.max_keys {
            return Local::Ask {
                demand: 0,
                unused: 0,
            };
        }
        let a = self
            .keys
            .entry(Arc::from(key))
            .or_insert_with(|| Allotment::empty(now));
        a.see(hits, now);
        if now < a.expires && a.tokens >= hits {
            a.tokens -= hits;
            let low = !a.low_signalled && a.tokens.saturating_mul(4) < a.last_grant;
            a.low_signalled |= low;
            return Local::Admitted {
                left: a.tokens,
                low,
            };
        }
        if now < a.empty_until {
            return Local::Refused {
                retry_after: a.empty_until - now,
            };
        }
        // Asking: what is left of this allotment goes back with the ask.
        let unused = if now < a.expires { a.tokens } else { 0 };
        a.tokens = 0;
        Local::Ask {
            demand: a.demand(now),
            unused,
        }
    }

    /// The owner's answer to an ask: the next allotment. Several asks for
    /// one key can be out at once (a batch of its checks); their grants add
    /// up — each ask already gave back what was left when it was made, so
    /// overwriting would lose tokens the owner still counts as promised.
    pub fn granted(&mut self, key: &[u8], grant: Grant, now: Nanos) {
        if let Some(a) = self.keys.get_mut(key) {
            if now >= a.expires {
                a.tokens = 0;
            }
            if grant.amount == 0 {
                a.empty_until = now.saturating_add(empty_wait(grant.expires.saturating_sub(now)));
                return;
            }
            a.empty_until = 0;
            a.last_grant = grant.amount;
            a.low_signalled = false;
            a.tokens = a.tokens.saturating_add(grant.amount);
            a.expires = a.expires.max(grant.expires);
        }
    }

    /// Drop every allotment's tokens (demand meters stay).
    pub fn forget(&mut self) {
        for a in self.keys.values_mut() {
            a.tokens = 0;
            a.empty_until = 0;
        }
    }

    /// Drop one key's allotment (an admin reset).
    pub fn forget_key(&mut self, key: &[u8]) {
        if let Some(a) = self.keys.get_mut(key) {
            a.tokens = 0;
            a.empty_until = 0;
        }
    }

    /// Tokens held in unexpired allotments (a gauge).
    pub fn held(&self, now: Nanos) -> u64 {
        self.keys
            .values()
            .filter(|a| a.expires > now)
            .fold(0u64, |sum, a| sum.saturating_add(a.tokens))
    }
}

/// `a × b / c` without overflow (`c > 0`), saturating at `u64::MAX`.
fn mul_div(a: u64, b: u128, c: u128) -> u64 {
    let v = u128::from(a) * b / c.max(1);
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;
    const TERMS: Terms = Terms {
        ttl: 100 * MS,
        grace: 300 * MS,
        max_edges: 8,
        memory: 1_000 * MS,
    };

    #[test]
    fn a_cold_edge_gets_a_small_first_allotment() {
        let mut l = Ledger::default();
        let g = l.grant("a", 0, 1_000, 3, 0, &TERMS);
        assert_eq!(g.amount, 1_000 / 12);
        assert_eq!(g.expires, 100 * MS);
        assert_eq!(l.reserved(0, &TERMS), 83);
    }

    #[test]
    fn shares_follow_demand() {
        let mut l = Ledger::default();
        // Demands 8,000/s and 2,000/s want 800 and 200 per 100 ms; the
        // state leaves 500 (grants are reservations, not consumption).
        // The other member (N = 2) is not heard from yet: counted at the
        // average, so quiet's share is half of 500; it wants only 200.
        let quiet = l.grant("quiet", 2_000, 500, 2, 0, &TERMS);
        assert_eq!(quiet.amount, 200);
        // Quiet holds its allotment (served from this pool): the 300
        // unreserved are busy's to take, up to its want.
        let busy = l.grant("busy", 8_000, 500, 2, 0, &TERMS);
        assert_eq!(busy.amount, 300);
        assert_eq!(l.reserved(0, &TERMS), 500);
        // Both spent and reported; 100 refilled. Busy asks first, while
        // quiet waits with nothing: busy's fraction is 8 / 10.
        l.reported("quiet", 200);
        l.reported("busy", 300);
        let busy = l.grant("busy", 8_000, 100, 2, MS, &TERMS);
        assert_eq!(busy.amount, 80);
        // Quiet then gets the rest: busy holds an allotment now.
        let quiet = l.grant("quiet", 2_000, 100, 2, MS, &TERMS);
        assert_eq!(quiet.amount, 20);
    }

    #[test]
    fn an_edge_told_nothing_waits_an_eighth_of_the_ttl() {
        let mut l = Ledger::default();
        assert_eq!(l.grant("a", 1_000, 0, 2, 0, &TERMS).amount, 0);
        assert!(l.waiting("a", 0));
        assert!(l.waiting("a", TERMS.ttl / 8 - 1));
        assert!(!l.waiting("a", TERMS.ttl / 8));
        assert!(!l.waiting("b", 0), "only the edge told nothing");
        // A grant with tokens does not make it wait.
        assert!(l.grant("b", 1_000, 100, 2, 0, &TERMS).amount > 0);
        assert!(!l.waiting("b", 0));
    }

    #[test]
    fn reports_and_returns_release_reservations() {
        let mut l = Ledger::default();
        let g = l.grant("a", 1_000, 10_000, 1, 0, &TERMS);
        assert_eq!(g.amount, 100);
        l.reported("a", 60);
        assert_eq!(l.reserved(MS, &TERMS), 40);
        // Asking again gives back the 40 it did not spend.
        l.give_back("a", 40);
        l.grant("a", 1_000, 10_000 - 60, 1, MS, &TERMS);
        assert_eq!(l.reserved(MS, &TERMS), 100);
        // Expired and past the grace: released.
        assert_eq!(l.reserved(MS + 400 * MS + 1, &TERMS), 0);
        l.release_expired(MS + 400 * MS + 1, &TERMS);
        assert_eq!(l.holders(MS + 400 * MS + 1), 0);
        // Its demand is remembered a while (for others' shares), then not.
        assert_eq!(l.edges.len(), 1);
        l.release_expired(2_000 * MS, &TERMS);
        assert!(l.edges.is_empty());
    }

    #[test]
    fn an_edge_spends_its_allotment_then_asks_with_its_demand() {
        let mut a = Allotments::new(10);
        // Cold: nothing to spend.
        assert_eq!(
            a.spend(b"k", 1, 0),
            Local::Ask {
                demand: 10,
                unused: 0
            }
        );
        a.granted(
            b"k",
            Grant {
                amount: 8,
                expires: 100 * MS,
            },
            0,
        );
        assert_eq!(
            a.spend(b"k", 5, MS),
            Local::Admitted {
                left: 3,
                low: false
            }
        );
        // Below a quarter of the grant: signalled once (report soon).
        assert_eq!(a.spend(b"k", 2, MS), Local::Admitted { left: 1, low: true });
        assert_eq!(
            a.spend(b"k", 0, MS),
            Local::Admitted {
                left: 1,
                low: false
            }
        );
        assert_eq!(a.held(MS), 1);
        // Not enough for 2: ask, giving back the 1 left.
        assert!(matches!(
            a.spend(b"k", 2, 2 * MS),
            Local::Ask { unused: 1, .. }
        ));
        // An expired allotment is not spent.
        a.granted(
            b"k",
            Grant {
                amount: 50,
                expires: 150 * MS,
            },
            2 * MS,
        );
        assert!(matches!(
            a.spend(b"k", 1, 150 * MS),
            Local::Ask { unused: 0, .. }
        ));
        // Nothing to grant: refused here for a while, then asks again.
        a.granted(
            b"k",
            Grant {
                amount: 0,
                expires: 230 * MS,
            },
            150 * MS,
        );
        assert_eq!(
            a.spend(b"k", 1, 151 * MS),
            Local::Refused {
                retry_after: 9 * MS
            }
        );
        assert!(matches!(a.spend(b"k", 1, 160 * MS), Local::Ask { .. }));
    }

    #[test]
    fn demand_is_hits_per_second() {
        let mut a = Allotments::new(10);
        for i in 0..100 {
            a.spend(b"k", 1, i * 10 * MS); // 100/s for one second
        }
        match a.spend(b"k", 1, 1_000 * MS) {
            Local::Ask { demand, .. } => assert_eq!(demand, 100),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn edges_beyond_the_bound_get_nothing() {
        let mut l = Ledger::default();
        for i in 0..TERMS.max_edges {
            l.grant(&format!("e{i}"), 10, 1_000_000, 8, 0, &TERMS);
        }
        assert_eq!(l.grant("late", 10, 1_000_000, 8, 0, &TERMS).amount, 0);
    }

    proptest! {
        /// Whatever the sequence of grants, reports and returns, the tokens
        /// reserved plus those reported never exceed what the state had:
        /// tiered mode never promises more than the limit leaves.
        #[test]
        fn never_promises_more_than_the_limit_leaves(
            limit in 0u64..100_000,
            ops in proptest::collection::vec((0usize..4, 0u64..50_000, 0u64..2_000, 0u64..30), 1..200),
        ) {
            let mut l = Ledger::default();
            let mut consumed = 0u64; // reported into the state
            // Per edge, as the edge sees it: tokens left, and until when.
            let mut held = [(0u64, 0u64); 4];
            let mut now = 0;
            for (edge, demand, spend, dt) in ops {
                now += dt * MS;
                let name = format!("e{edge}");
                if held[edge].1 <= now {
                    held[edge].0 = 0; // expired: the edge spends no more of it
                }
                if spend % 3 == 0 {
                    // Ask again, returning what is left.
                    l.give_back(&name, held[edge].0);
                    let g = l.grant(&name, demand, limit - consumed, 4, now, &TERMS);
                    held[edge] = (g.amount, g.expires);
                } else {
                    // Spend some of the allotment and report it at once.
                    let spent = spend.min(held[edge].0);
                    held[edge].0 -= spent;
                    consumed += spent;
                    l.reported(&name, spent);
                }
                prop_assert!(consumed + l.reserved(now, &TERMS) <= limit,
                    "consumed {} + reserved {} > limit {}", consumed, l.reserved(now, &TERMS), limit);
            }
        }
    }
}
