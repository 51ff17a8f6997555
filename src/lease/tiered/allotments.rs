//! The edge side of tiered mode: an allotment per key, spent without
//! asking the owner, and the demand meter that sizes the next one.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Grant, NANOS_PER_SEC, empty_wait, mul_div};
use crate::algorithm::Nanos;

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
    /// Allotments looked at to make room and to total the figures (the
    /// work a flood of keys costs; tests bound it).
    examined: u64,
}

impl Allotments {
    pub fn new(max_keys: usize) -> Allotments {
        Allotments {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
            examined: 0,
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
        if !self.keys.contains_key(key) && self.keys.len() >= self.max_keys {
            self.examined += self.keys.len() as u64;
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

    /// Allotments looked at so far to make room and total the figures.
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Tokens held in unexpired allotments (a gauge).
    pub fn held(&mut self, now: Nanos) -> u64 {
        self.examined += self.keys.len() as u64;
        self.keys
            .values()
            .filter(|a| a.expires > now)
            .fold(0u64, |sum, a| sum.saturating_add(a.tokens))
    }
}
