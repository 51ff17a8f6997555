//! The edge side of tiered mode: an allotment per key, spent without
//! asking the owner, and the demand meter that sizes the next one.

use std::collections::HashMap;
use std::sync::Arc;

use super::allotment::Allotment;
use super::queue::{Deadlines, Fifo};
use super::{Grant, Pace, empty_wait, mul_div};
use crate::algorithm::Nanos;

/// A key's unexpired allotment, as a node passing part of it on sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// Tokens in hand.
    pub tokens: u64,
    /// The pace still to come, tokens per [`super::PACE_UNIT`] (0: none).
    pub pace: u64,
    pub expires: Nanos,
}

/// What [`Allotments::take`] took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Tokens now.
    pub tokens: u64,
    /// Paced tokens for the sub-grant, due evenly until its end.
    pub paced: u64,
    /// Paced tokens no longer this edge's: `paced`, and what the same pace
    /// makes due after the sub-grant ends (to give back).
    pub lent: u64,
}

/// What the edge should do with one tiered check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Admitted from the allotment, no hop; this many tokens are left.
    /// `low`: the allotment just fell below a quarter of its grant (report
    /// what was spent now, not at the next interval). `expires`: when the
    /// allotment it was spent from ends (an app reports its spending by
    /// then).
    Admitted {
        left: u64,
        low: bool,
        expires: Nanos,
    },
    /// Refused here: the owner had nothing to grant a moment ago; ask again
    /// after this long.
    Refused { retry_after: Nanos },
    /// The allotment cannot cover it: ask the owner (the slow path), saying
    /// this demand and giving back this many unspent tokens. `pace`: this
    /// ask may be paced (its id, for [`Allotments::answered`] and
    /// [`Allotments::ask_done`]); None while another paced ask of the key
    /// is in flight.
    Ask {
        demand: u64,
        unused: u64,
        pace: Option<u64>,
    },
}

/// How long a paced ask is waited for at most, should its caller never
/// say it ended: a backstop (callers end every ask, answered or not).
const PACE_ASK_AT_MOST: Nanos = 10 * 1_000_000_000;

/// An edge's allotments, by encoded key; bounded (a key beyond the bound
/// always takes the slow path, which is exact).
///
/// A client can flood a node with tiered keys, so nothing here scans the
/// table per key: a new key finding it full takes the room of the
/// allotment that expired earliest, found in O(1) amortized through two
/// lazy orders ([`super::queue`]) — `expiring`, the allotments still
/// counted as held, by expiry; `expired`, those past it, earliest first.
/// The held-tokens gauge is kept as allotments change and expire, rather
/// than summed over the table at each report.
#[derive(Debug)]
pub struct Allotments {
    keys: HashMap<Arc<[u8]>, Allotment>,
    max_keys: usize,
    /// `(expires, key)` of every allotment counted in `held`.
    expiring: Deadlines<Arc<[u8]>>,
    /// `(expires, key)` of the allotments not counted: evicted first.
    expired: Fifo<Arc<[u8]>>,
    /// Tokens of the counted allotments (u128: a sum of u64s never wraps).
    held: u128,
    /// Entries looked at to make room and to keep the figures (the work a
    /// flood of keys costs; tests bound it).
    examined: u64,
    /// The last paced ask's id.
    next_ask: u64,
}

/// Whether `(at, k)` in `expiring` is current: `k` is counted until `at`.
fn is_counted(keys: &HashMap<Arc<[u8]>, Allotment>, at: Nanos, k: &[u8]) -> bool {
    keys.get(k).is_some_and(|a| a.counted && a.expires == at)
}

/// Whether `(at, k)` in `expired` is current: `k` expired at `at` and was
/// not granted since.
fn is_expired(keys: &HashMap<Arc<[u8]>, Allotment>, at: Nanos, k: &[u8]) -> bool {
    keys.get(k).is_some_and(|a| !a.counted && a.expires == at)
}

impl Allotments {
    pub fn new(max_keys: usize) -> Allotments {
        Allotments {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
            expiring: Deadlines::default(),
            expired: Fifo::default(),
            held: 0,
            examined: 0,
            next_ask: 0,
        }
    }

    /// Keys with an allotment (or a demand meter) here.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    /// Spend `hits` from the key's allotment if it covers them.
    pub fn spend(&mut self, key: &[u8], hits: u64, now: Nanos) -> Local {
        if !self.keys.contains_key(key) {
            if self.keys.len() >= self.max_keys && !self.evict_one(now) {
                return Local::Ask {
                    demand: 0,
                    unused: 0,
                    pace: None,
                };
            }
            // A new allotment holds nothing and is expired from the start:
            // not counted, and the next to go should the flood go on.
            let k: Arc<[u8]> = Arc::from(key);
            self.keys.insert(k.clone(), Allotment::empty(now));
            let keys = &self.keys;
            self.examined += self.expired.push(now, k, |at, k| is_expired(keys, at, k));
        }
        let Some(a) = self.keys.get_mut(key) else {
            return Local::Ask {
                demand: 0,
                unused: 0,
                pace: None,
            };
        };
        a.see(hits, now);
        let moved = a.come_due(now);
        if a.counted {
            self.held = self.held.saturating_add(u128::from(moved));
        }
        if now < a.expires && a.tokens >= hits {
            a.tokens -= hits;
            if a.counted {
                self.held = self.held.saturating_sub(u128::from(hits));
            }
            let low = !a.low_signalled && a.tokens.saturating_mul(4) < a.last_grant;
            a.low_signalled |= low;
            return Local::Admitted {
                left: a.tokens,
                low,
                expires: a.expires,
            };
        }
        if now < a.empty_until {
            return Local::Refused {
                retry_after: a.empty_until - now,
            };
        }
        // Paced: what it lacks comes due before the allotment ends — wait
        // for it here rather than ask (the others' paces hold the rest of
        // the refill: an ask would be told no more).
        if let Some(retry_after) = a.due_in(hits, now) {
            return Local::Refused { retry_after };
        }
        if now < a.lent_until && now < a.expires {
            return Local::Refused {
                retry_after: a.lent_until - now,
            };
        }
        // Asking: what is left of this allotment goes back with the ask —
        // expired or not. The grantor still counts expired tokens as
        // promised until its grace ends, and an edge that asks again within
        // it keeps its standing alive: tokens not given back here would stay
        // promised for as long as the edge keeps asking. (Giving back more
        // than the grantor still counts is harmless: it takes back at most
        // what is outstanding.)
        let mut unused = a.tokens.saturating_add(a.returned);
        a.returned = 0;
        if a.counted {
            self.held = self.held.saturating_sub(u128::from(a.tokens));
        }
        a.tokens = 0;
        // At most one paced ask of the key in flight: the grantor replaces
        // this edge's pace with each one's, so two answered out of order
        // would leave the edge on a pace the grantor no longer counts. A
        // paced ask stops the pace running here (what it has still to
        // bring goes back with it); another ask meanwhile leaves it
        // running, and the grantor's count of it, alone.
        let pace = if a.pace_ask == 0 || now >= a.pace_asked_until {
            unused = unused.saturating_add(a.not_due());
            a.paced = a.due;
            self.next_ask += 1;
            a.pace_ask = self.next_ask;
            a.pace_asked_until = now.saturating_add(PACE_ASK_AT_MOST);
            Some(a.pace_ask)
        } else {
            None
        };
        Local::Ask {
            demand: a.demand(now),
            unused,
            pace,
        }
    }

    /// The owner's answer to the ask whose `pace` [`Allotments::spend`]
    /// gave: the next allotment. A paced ask's pace replaces the last (and
    /// the ask has ended: [`Allotments::ask_done`]); another's grant is
    /// tokens only. Several asks for one key can be out at once (a batch
    /// of its checks); their tokens add up — each ask already gave back
    /// what was left when it was made, so overwriting would lose tokens
    /// the owner still counts as promised.
    pub fn answered(&mut self, key: &[u8], grant: Grant, pace: Option<u64>, now: Nanos) {
        self.answered_since(key, grant, pace, now, now);
    }

    /// [`Allotments::answered`], its paced tokens coming due from `since`
    /// (before `now`: an app's grant, lent by its node from a moment
    /// before its answer arrived; what came due meanwhile is in hand).
    pub fn answered_since(
        &mut self,
        key: &[u8],
        grant: Grant,
        pace: Option<u64>,
        since: Nanos,
        now: Nanos,
    ) {
        let ours = pace.is_some_and(|id| self.keys.get(key).is_some_and(|a| a.pace_ask == id));
        if ours {
            self.apply(key, grant, (true, since.min(now)), now);
            if let Some(id) = pace {
                self.ask_done(key, id);
            }
        } else {
            let grant = Grant { paced: 0, ..grant };
            self.apply(key, grant, (false, now), now);
        }
    }

    /// A grant applied as the answer to whatever paced ask is in flight,
    /// which ends (the request path says which ask: [`Allotments::answered`]).
    #[cfg(test)]
    pub(crate) fn granted(&mut self, key: &[u8], grant: Grant, now: Nanos) {
        self.apply(key, grant, (true, now), now);
        if let Some(a) = self.keys.get_mut(key) {
            a.pace_ask = 0;
        }
    }

    /// The paced ask `id` of `key` ended (answered, failed, or given up):
    /// another may be paced now. Its answer, if any, was applied before.
    pub fn ask_done(&mut self, key: &[u8], id: u64) {
        if let Some(a) = self.keys.get_mut(key)
            && a.pace_ask == id
        {
            a.pace_ask = 0;
        }
    }

    fn apply(
        &mut self,
        key: &[u8],
        grant: Grant,
        (replaces_pace, since): (bool, Nanos),
        now: Nanos,
    ) {
        let Some(k) = self.keys.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(a) = self.keys.get_mut(key) else {
            return;
        };
        if now >= a.expires {
            if a.counted {
                self.held = self.held.saturating_sub(u128::from(a.tokens));
            }
            a.tokens = 0;
        } else {
            let moved = a.come_due(now);
            if a.counted {
                self.held = self.held.saturating_add(u128::from(moved));
            }
        }
        if replaces_pace {
            // The grantor now counts this grant's pace for the edge. An
            // earlier one stopped when the edge asked; anything of it
            // still to come goes back (none, unless a caller granted
            // without asking).
            a.returned = a.returned.saturating_add(a.not_due());
            a.paced = 0;
            a.due = 0;
            if grant.paced > 0 {
                a.paced = grant.paced;
                a.pace_from = since;
                a.pace_until = grant.expires;
            }
        }
        if grant.amount == 0 && grant.paced == 0 {
            // Nothing: refuse here a while rather than ask again — unless
            // this answered an ask that could not be paced (its paced
            // sibling's answer is still to come).
            if replaces_pace {
                a.empty_until = now.saturating_add(empty_wait(grant.expires.saturating_sub(now)));
            }
            return;
        }
        a.empty_until = 0;
        a.last_grant = grant.amount;
        a.low_signalled = false;
        let before = if a.counted { a.tokens } else { 0 };
        a.tokens = a.tokens.saturating_add(grant.amount);
        self.held += u128::from(a.tokens - before);
        let expires = a.expires.max(grant.expires);
        // Counted from now until it expires: in `expiring` under its new
        // expiry (an entry under the old one is stale from here on).
        if !a.counted || expires != a.expires {
            a.counted = true;
            a.expires = expires;
            let keys = &self.keys;
            self.examined += self
                .expiring
                .push(expires, k, |at, k| is_counted(keys, at, k));
        }
    }

    /// The key's unexpired allotment (a node sizing what it can pass on
    /// to the apps it serves).
    pub fn live(&mut self, key: &[u8], now: Nanos) -> Option<Live> {
        let a = self.keys.get_mut(key).filter(|a| now < a.expires)?;
        let moved = a.come_due(now);
        if a.counted {
            self.held = self.held.saturating_add(u128::from(moved));
        }
        Some(Live {
            tokens: a.tokens,
            pace: Pace::rate_of(a.not_due(), a.pace_until.saturating_sub(now)),
            expires: a.expires,
        })
    }

    /// Take `amount` tokens, and `paced` tokens coming due evenly from now
    /// until `until`, out of the key's unexpired allotment without
    /// spending them (a node passing them on as a sub-grant: the app
    /// spends them and reports, or they come back through
    /// [`Allotments::keep`]: given back, never spent here again). The pace
    /// they need is taken for the rest of this allotment's pace: what it
    /// makes due after `until` is lent too (the caller keeps it to give
    /// back). Takes at most what it holds. While a pace passed on runs,
    /// this edge does not ask again.
    pub fn take(
        &mut self,
        key: &[u8],
        amount: u64,
        (paced, until): (u64, Nanos),
        now: Nanos,
    ) -> Taken {
        let none = Taken {
            tokens: 0,
            paced: 0,
            lent: 0,
        };
        let Some(a) = self.keys.get_mut(key).filter(|a| now < a.expires) else {
            return none;
        };
        let moved = a.come_due(now);
        if a.counted {
            self.held = self.held.saturating_add(u128::from(moved));
        }
        let took = a.tokens.min(amount);
        a.tokens -= took;
        if a.counted {
            self.held = self.held.saturating_sub(u128::from(took));
        }
        let left = a.pace_until.saturating_sub(now);
        let span = until.min(a.pace_until).saturating_sub(now);
        let not_due = a.not_due();
        if paced == 0 || span == 0 || not_due == 0 {
            return Taken {
                tokens: took,
                ..none
            };
        }
        // The pace `paced` over `span` needs, over all `left`: rounded up
        // (lent never slower than given); at most what is still to come,
        // and then what that gives over `span`, rounded down.
        let need = u128::from(paced) * u128::from(left);
        let need = u64::try_from(need.div_ceil(u128::from(span))).unwrap_or(u64::MAX);
        let (lent, given) = if need <= not_due {
            (need, paced)
        } else {
            (
                not_due,
                mul_div(not_due, u128::from(span), u128::from(left)),
            )
        };
        // What is left to come due, from now, less what was lent.
        a.paced = not_due - lent;
        a.due = 0;
        a.pace_from = now;
        a.lent_until = a.lent_until.max(until.min(a.pace_until));
        Taken {
            tokens: took,
            paced: given,
            lent,
        }
    }

    /// If the key's allotment ends within `within` of `now`, end it here:
    /// what it holds and what its pace would still make due are given back
    /// with the next ask, which is then sent at once. (A node whose
    /// sub-grants must end `within` before its own allotment: an app
    /// asking then would get nothing from it.) Whether it did.
    pub fn lapse_within(&mut self, key: &[u8], within: Nanos, now: Nanos) -> bool {
        let Some(a) = self
            .keys
            .get_mut(key)
            .filter(|a| now < a.expires && a.expires - now <= within && now >= a.lent_until)
        else {
            return false;
        };
        let moved = a.come_due(now);
        if a.counted {
            self.held = self.held.saturating_add(u128::from(moved));
            self.held = self.held.saturating_sub(u128::from(a.tokens));
        }
        a.returned = a
            .returned
            .saturating_add(a.tokens)
            .saturating_add(a.not_due());
        a.tokens = 0;
        a.paced = a.due;
        true
    }

    /// Tokens that came back unspent (taken out by [`Allotments::take`],
    /// or given back by an ask that was not sent): kept to give back to
    /// the grantor with the next ask, and never spent here — they may
    /// belong to an earlier grant than the live one, even to one a ring
    /// change dropped, whose grantor will not count them again. A key with
    /// no entry (evicted) has nothing to give them back with: its grantor
    /// releases them after its grace.
    pub fn keep(&mut self, key: &[u8], amount: u64) {
        if let Some(a) = self.keys.get_mut(key) {
            a.returned = a.returned.saturating_add(amount);
        }
    }

    /// Drop every allotment's tokens (demand meters stay). A ring change,
    /// not a request: the one walk over the table here.
    pub fn forget(&mut self) {
        for a in self.keys.values_mut() {
            a.tokens = 0;
            a.returned = 0;
            a.empty_until = 0;
            a.paced = 0;
            a.due = 0;
            a.lent_until = 0;
        }
        self.held = 0;
    }

    /// Drop one key's allotment (an admin reset).
    pub fn forget_key(&mut self, key: &[u8]) {
        if let Some(a) = self.keys.get_mut(key) {
            if a.counted {
                self.held = self.held.saturating_sub(u128::from(a.tokens));
            }
            a.tokens = 0;
            a.returned = 0;
            a.empty_until = 0;
            a.paced = 0;
            a.due = 0;
            a.lent_until = 0;
        }
    }

    /// Entries looked at so far to make room and keep the figures.
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Tokens held in unexpired allotments (a gauge).
    pub fn held(&mut self, now: Nanos) -> u64 {
        while self.settle_one(now) {}
        u64::try_from(self.held).unwrap_or(u64::MAX)
    }

    /// Stop counting the allotment that expired earliest, if one expired
    /// by `now` (its tokens are no longer held): it joins `expired`. False
    /// when none is due.
    fn settle_one(&mut self, now: Nanos) -> bool {
        let Some((at, k)) = self.expiring.pop_due(now) else {
            return false;
        };
        self.examined += 1;
        if let Some(a) = self.keys.get_mut(&k)
            && a.counted
            && a.expires == at
        {
            a.counted = false;
            self.held = self.held.saturating_sub(u128::from(a.tokens));
            let keys = &self.keys;
            self.examined += self.expired.push(at, k, |at, k| is_expired(keys, at, k));
        }
        true
    }

    /// Make room for one key: evict the allotment that expired earliest.
    /// False when every allotment is live (they hold tokens the owner
    /// counts as promised: the new key takes the slow path instead).
    fn evict_one(&mut self, now: Nanos) -> bool {
        while self.settle_one(now) {}
        while let Some((at, k)) = self.expired.pop() {
            self.examined += 1;
            if is_expired(&self.keys, at, &k) {
                self.keys.remove(&k);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
impl Allotments {
    /// Entries in `expiring` and `expired`, stale ones included.
    pub(super) fn queued(&self) -> (usize, usize) {
        (self.expiring.len(), self.expired.len())
    }

    /// What [`Allotments::held`] must say, counted afresh.
    pub(super) fn held_recount(&self, now: Nanos) -> u64 {
        self.keys
            .values()
            .filter(|a| a.expires > now)
            .fold(0u64, |sum, a| sum.saturating_add(a.tokens))
    }
}
