//! A node's sub-grants to the apps it serves (issue 23): tiered mode one
//! step further out, so an app decides a hot key in process.
//!
//! The node holds an allotment of the key from its owner; it passes part
//! of it on to an app (a *client*, named by the id it chose at start) and
//! reports the app's spending to the owner under its own id. The owner's
//! ledger still counts nodes, not app processes (which come and go by the
//! thousand and would grow every entry's report slots and snapshots).
//!
//! Per key this is the owner's [`Ledger`] with clients for edges — the same
//! demand-weighted sizing, the same `outstanding = granted − reported −
//! returned`, the same release after a grace — over a pool that is the
//! node's own allotment: tokens granted to a client are taken out of it
//! (they are not the node's to spend), and come back to it when the client
//! gives them back or its grant lapses silent past the grace.
//!
//! Bounds, all a client controls: keys with sub-grants, clients, clients
//! per key (the ledger's `max_edges`), keys per client. A sub-grant is at
//! most the client's demand over its life, and its demand's share of what
//! the node holds; it ends before the node's own
//! allotment does by a client report interval, so the app's last report
//! can reach the node — and the node's the owner — within the owner's
//! grace.
//!
//! Reports from a client are numbered; [`SubGrants::fresh`] applies each
//! number once (a client resends a report unchanged until acknowledged, one
//! in flight at a time) — while the node remembers the client: for
//! [`CLIENT_MEMORY`] after it was last heard from, and not across a restart
//! of the node. A resend the node no longer recognises counts twice
//! (refusing too much, never admitting too much).
//!
//! What comes back — given back by a client, or released after the grace —
//! is never spent by the node: it goes back to the owner with the node's
//! next ask ([`super::Allotments::keep`]), since it may belong to an
//! allotment the owner has since released.
//!
//! Work is bounded per call: no request walks the table. The periodic
//! [`SubGrants::sweep`] walks every standing once.
//!
//! Pure arithmetic over an injected clock: no I/O, no locking.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Grant, Ledger, Live, Pace, Terms};
use crate::algorithm::Nanos;

/// How long a client the node has not heard from is remembered (its
/// report number: a resend of an applied report within it is recognised).
pub const CLIENT_MEMORY: Nanos = 60 * 1_000_000_000;

/// Standings (a client's sub-grant record of one key) held at most, over
/// every key: the memory bound `max_clients × max_keys_per_client` alone
/// would not give.
pub const MAX_STANDINGS: usize = 1_000_000;

/// How long a client's standing in a key outlives its last grant (and its
/// demand counts in the split): its reports of that key are counted only
/// while it stands, and a report held up (a slow node, a lost
/// acknowledgement resent) must still find it.
pub const STANDING_MEMORY: Nanos = 10 * 1_000_000_000;

/// How much a node hands out to apps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Keys with sub-grants on this node.
    pub max_keys: usize,
    /// Clients remembered (their report numbers and key counts).
    pub max_clients: usize,
    /// Keys one client may hold sub-grants of.
    pub max_keys_per_client: usize,
    /// Clients holding sub-grants of one key.
    pub max_clients_per_key: usize,
}

/// What the node remembers of one client.
#[derive(Clone, Copy, Debug)]
struct Client {
    /// The last report number applied (0: none yet).
    last_seq: u64,
    /// Keys it has a standing in (a ceiling: recounted at each sweep).
    keys: usize,
    /// When it last asked or reported.
    seen: Nanos,
}

/// Every sub-grant of one node.
#[derive(Debug)]
pub struct SubGrants {
    keys: HashMap<Arc<[u8]>, Ledger>,
    clients: HashMap<Arc<str>, Client>,
    caps: Caps,
    /// `ttl`: a sub-grant's longest life; `grace`: how long a lapsed one
    /// stays reserved for its late reports; `memory`: how long a client's
    /// demand counts, and how long an idle client's report number is kept
    /// (retries of an applied report must find it).
    terms: Terms,
    /// How long before the node's own allotment ends a sub-grant must end.
    lead: Nanos,
    /// Standings over every key (a ceiling: recounted at each sweep).
    standings: usize,
}

impl SubGrants {
    pub fn new(caps: Caps, terms: Terms, lead: Nanos) -> SubGrants {
        let terms = Terms {
            max_edges: caps.max_clients_per_key.max(1),
            memory: terms.memory.max(STANDING_MEMORY),
            ..terms
        };
        SubGrants {
            keys: HashMap::new(),
            clients: HashMap::new(),
            caps,
            terms,
            lead,
            standings: 0,
        }
    }

    /// Keys with a ledger here.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Clients remembered.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Tokens granted to clients and not yet reported or returned.
    pub fn outstanding(&self, now: Nanos) -> u64 {
        self.keys.values().fold(0u64, |sum, l| {
            sum.saturating_add(l.reserved(now, &self.terms))
        })
    }

    /// Make sure `client` is remembered. False when the table is full of
    /// clients heard from within [`CLIENT_MEMORY`] (the sweep forgets the
    /// others; nothing here walks the table).
    fn admit_client(&mut self, client: &str, now: Nanos) -> bool {
        if let Some(c) = self.clients.get_mut(client) {
            c.seen = now;
            return true;
        }
        if self.clients.len() >= self.caps.max_clients.max(1) {
            return false;
        }
        self.clients.insert(
            Arc::from(client),
            Client {
                last_seq: 0,
                keys: 0,
                seen: now,
            },
        );
        true
    }

    /// `client` gives back `unused` tokens of `key`: returns how many it
    /// held outstanding (what goes back into the node's allotment).
    pub fn give_back(&mut self, key: &[u8], client: &str, unused: u64) -> u64 {
        self.keys
            .get_mut(key)
            .map_or(0, |l| l.give_back(client, unused))
    }

    /// `client` reported `hits` of `key` spent (its report applied once).
    /// False when it holds no standing for the key (never granted it here,
    /// long forgotten, or granted by this node's run before a restart):
    /// the caller still books the spending as its own — it was spent — and
    /// only its standing here is untouched.
    pub fn reported(&mut self, key: &[u8], client: &str, hits: u64) -> bool {
        match self.keys.get_mut(key) {
            Some(l) if l.knows(client) => {
                l.reported(client, hits);
                true
            }
            _ => false,
        }
    }

    /// `client` says it holds nothing of `key` beyond `unreported` spent
    /// hits (asking again, having given back what it did not spend): the
    /// rest of its outstanding — grants it never received (an ask dropped
    /// at its deadline after the node granted), or lost — comes back now
    /// instead of staying promised for as long as it keeps asking.
    pub fn holds_at_most(&mut self, key: &[u8], client: &str, unreported: u64) -> u64 {
        self.keys
            .get_mut(key)
            .map_or(0, |l| l.hold_at_most(client, unreported))
    }

    /// Whether report `seq` of `client` is new: Some(true) to apply it
    /// now (then [`SubGrants::applied`] once it is booked), Some(false)
    /// for a resend of one already applied. Numbers only grow: a client
    /// has one report in flight and cuts the next only once this one is
    /// acknowledged. A client the node does not know (forgotten, or the
    /// node restarted) starts from this number. None when the table of
    /// clients is full: not applied, so the client resends it later.
    pub fn fresh(&mut self, client: &str, seq: u64, now: Nanos) -> Option<bool> {
        if !self.admit_client(client, now) {
            return None;
        }
        let c = self.clients.get(client)?;
        Some(seq > c.last_seq)
    }

    /// Report `seq` of `client` was booked: a resend of it is a duplicate.
    /// Separate from [`SubGrants::fresh`] so that a report the node could
    /// not book (its table of spending full) is not remembered as applied.
    pub fn applied(&mut self, client: &str, seq: u64) {
        if let Some(c) = self.clients.get_mut(client) {
            c.last_seq = c.last_seq.max(seq);
        }
    }

    /// The client demand of `key` (hits per second), for the node's own
    /// ask to the owner.
    pub fn demand(&self, key: &[u8], now: Nanos) -> u64 {
        self.keys.get(key).map_or(0, |l| l.demand(now, &self.terms))
    }

    /// Grant `client` a share of `key` from the node's live allotment of
    /// it (`pool`: its tokens and pace). The caller takes the amount and
    /// the pace out of its allotment. `paced`: the client asked for a pace
    /// (it has no other ask of the key in flight; an older client does
    /// not, and gets tokens only). `demand`: the client's hits per
    /// second. No grant (nothing, ending now) past a bound, or when the
    /// node's allotment ends too soon to pass any on. Also returns the
    /// tokens of this key's lapsed sub-grants released on the way (the
    /// caller gives them back, as the sweep's).
    pub fn grant(
        &mut self,
        key: &[u8],
        client: &str,
        demand: u64,
        (pool, paced): (Live, bool),
        now: Nanos,
    ) -> (Grant, u64) {
        let none = Grant::none(now);
        let node_expires = pool.expires;
        let life = node_expires
            .saturating_sub(now)
            .saturating_sub(self.lead)
            .min(self.terms.ttl);
        // Less than an eighth of a full life left: not worth a round trip.
        if life < self.terms.ttl / 8 || !self.admit_client(client, now) {
            return (none, 0);
        }
        if !self.keys.contains_key(key) && self.keys.len() >= self.caps.max_keys.max(1) {
            return (none, 0);
        }
        let ledger = self.keys.entry(Arc::from(key)).or_default();
        let released = ledger.release_expired(now, &self.terms);
        let new_here = !ledger.knows(client);
        let keys_held = self.clients.get(client).map_or(0, |c| c.keys);
        if new_here
            && (keys_held >= self.caps.max_keys_per_client.max(1)
                || self.standings >= MAX_STANDINGS)
        {
            return (none, released);
        }
        let terms = Terms {
            ttl: life,
            ..self.terms
        };
        // The pool is split among the clients by demand (the ledger's
        // share), none of it kept back: a node's own callers of the key are
        // the clients' asks, which spend from the node's next allotment.
        let remaining = pool.tokens.saturating_add(ledger.reserved(now, &terms));
        // The pace likewise: what the node has left of its own is free,
        // and the clients' paces taken from it count in the split.
        let others = ledger.paces_of_others(client, now, &terms);
        let pace = paced.then_some(Pace {
            rate: pool.pace.saturating_add(others),
            free: pool.pace,
        });
        let g = ledger.grant_paced(client, demand, remaining, pace, 1, now, &terms);
        if new_here && ledger.knows(client) {
            self.standings += 1;
            if let Some(c) = self.clients.get_mut(client) {
                c.keys += 1;
            }
        }
        (g, released)
    }

    /// Release the sub-grants that lapsed past the grace unreported; drop
    /// ledgers with nothing left, recount each client's keys, forget
    /// clients with none that were not heard from within
    /// [`CLIENT_MEMORY`]. Returns the tokens released per key: they go
    /// back to the owner ([`super::Allotments::keep`]). One walk over every
    /// standing: the caller runs it once per report interval.
    pub fn sweep(&mut self, now: Nanos) -> Vec<(Arc<[u8]>, u64)> {
        let mut released = Vec::new();
        for (k, l) in self.keys.iter_mut() {
            let r = l.release_expired(now, &self.terms);
            if r > 0 {
                released.push((k.clone(), r));
            }
        }
        self.keys.retain(|_, l| l.edges() > 0);
        for c in self.clients.values_mut() {
            c.keys = 0;
        }
        let mut standings = 0;
        for l in self.keys.values() {
            for id in l.edge_ids() {
                standings += 1;
                if let Some(c) = self.clients.get_mut(id) {
                    c.keys += 1;
                }
            }
        }
        self.standings = standings;
        self.clients
            .retain(|_, c| c.keys > 0 || c.seen.saturating_add(CLIENT_MEMORY) > now);
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// A node's live allotment of `tokens` with no pace, until `expires`.
    fn pool(tokens: u64, expires: Nanos) -> Live {
        Live {
            tokens,
            pace: 0,
            expires,
        }
    }

    fn subgrants() -> SubGrants {
        SubGrants::new(
            Caps {
                max_keys: 4,
                max_clients: 3,
                max_keys_per_client: 2,
                max_clients_per_key: 2,
            },
            Terms {
                ttl: 200 * MS,
                grace: 150 * MS,
                max_edges: 0,
                memory: 1_000 * MS,
            },
            50 * MS,
        )
    }

    #[test]
    fn a_grant_is_at_most_the_pool_and_ends_before_the_node_allotment() {
        let mut s = subgrants();
        let (g, _) = s.grant(b"k", "a", 1_000_000, (pool(100, 250 * MS), true), 0);
        assert_eq!(g.amount, 100);
        assert_eq!(g.expires, 200 * MS);
        let (g, _) = s.grant(b"k", "a", 1_000_000, (pool(100, 120 * MS), true), 10 * MS);
        assert_eq!(g.expires, 70 * MS, "the node's allotment ends at 120 ms");
        assert_eq!(
            s.grant(b"k", "a", 1_000, (pool(100, 60 * MS), true), 10 * MS)
                .0
                .amount,
            0
        );
    }

    #[test]
    fn outstanding_is_granted_less_reported_and_returned_and_lapses_after_grace() {
        let mut s = subgrants();
        let (g, _) = s.grant(b"k", "a", 1_000_000, (pool(100, 250 * MS), true), 0);
        assert_eq!(s.outstanding(0), g.amount);
        assert!(s.reported(b"k", "a", 10));
        assert!(!s.reported(b"k", "b", 10), "b holds nothing of k");
        assert_eq!(s.give_back(b"k", "a", 5), 5);
        assert_eq!(s.outstanding(0), g.amount - 15);
        // A give-back beyond what it holds returns only what it held.
        assert_eq!(s.give_back(b"k", "a", 1_000), g.amount - 15);
        let (g2, _) = s.grant(b"k", "a", 1_000_000, (pool(40, 250 * MS), true), 0);
        assert_eq!(g2.amount, 40);
        assert!(s.sweep(g2.expires + 149 * MS).is_empty());
        let released = s.sweep(g2.expires + 150 * MS);
        assert_eq!(released, vec![(Arc::from(&b"k"[..]), g2.amount)]);
        assert_eq!(s.outstanding(g2.expires + 150 * MS), 0);
    }

    #[test]
    fn a_report_number_applies_once() {
        let mut s = subgrants();
        let apply = |s: &mut SubGrants, c: &str, seq: u64, now: Nanos| {
            let fresh = s.fresh(c, seq, now);
            if fresh == Some(true) {
                s.applied(c, seq);
            }
            fresh
        };
        assert_eq!(apply(&mut s, "a", 1, 0), Some(true));
        assert_eq!(apply(&mut s, "a", 1, MS), Some(false));
        // Found new but not booked (no `applied`): still new when resent.
        assert_eq!(s.fresh("a", 2, MS), Some(true));
        assert_eq!(apply(&mut s, "a", 2, MS), Some(true));
        assert_eq!(apply(&mut s, "a", 1, MS), Some(false));
        assert_eq!(
            apply(&mut s, "b", 1, MS),
            Some(true),
            "numbers are per client"
        );
        assert_eq!(apply(&mut s, "c", 1, MS), Some(true));
        // Three clients remembered: a fourth's report is not applied (it
        // is resent), rather than applied with no number kept.
        assert_eq!(apply(&mut s, "d", 1, MS), None);
        // Forgotten once idle past the memory: room again.
        s.sweep(CLIENT_MEMORY + 2 * MS);
        assert_eq!(apply(&mut s, "d", 1, CLIENT_MEMORY + 2 * MS), Some(true));
    }

    #[test]
    fn keys_per_client_clients_per_key_and_clients_are_bounded() {
        let mut s = subgrants();
        let amount = |s: &mut SubGrants, k: &[u8], c: &str, at: Nanos| {
            s.grant(k, c, 100, (pool(1_000, at + 250 * MS), true), at)
                .0
                .amount
        };
        assert!(amount(&mut s, b"k1", "a", 0) > 0);
        assert!(amount(&mut s, b"k2", "a", 0) > 0);
        assert_eq!(amount(&mut s, b"k3", "a", 0), 0, "two keys per client");
        assert!(amount(&mut s, b"k1", "b", 0) > 0);
        assert_eq!(amount(&mut s, b"k1", "c", 0), 0, "two clients per key");
        assert!(amount(&mut s, b"k2", "c", 0) > 0);
        // Three live clients: a fourth is refused until one is forgotten.
        assert_eq!(amount(&mut s, b"k4", "d", 0), 0);
        let later = CLIENT_MEMORY + 10_000 * MS;
        s.sweep(later);
        assert!(amount(&mut s, b"k4", "d", later) > 0);
        assert!(s.clients() <= 3);
        assert!(s.len() <= 4);
    }

    #[test]
    fn a_client_holding_less_than_it_was_granted_gives_the_rest_back() {
        let mut s = subgrants();
        let (g, _) = s.grant(b"k", "a", 1_000_000, (pool(100, 250 * MS), true), 0);
        // Its answer was lost: it holds nothing, 3 spent and unreported.
        assert_eq!(s.holds_at_most(b"k", "a", 3), g.amount - 3);
        assert_eq!(s.outstanding(0), 3);
    }

    #[test]
    fn a_lapsed_sub_grant_released_by_a_grant_is_returned() {
        let mut s = subgrants();
        let (g, _) = s.grant(b"k", "a", 1_000_000, (pool(100, 250 * MS), true), 0);
        let later = g.expires + 150 * MS;
        let (_, released) = s.grant(b"k", "b", 1_000, (pool(10, later + 250 * MS), true), later);
        assert_eq!(released, g.amount, "a's lapsed tokens, not lost");
    }

    #[test]
    fn demand_counts_every_recent_client() {
        let mut s = subgrants();
        s.grant(b"k", "a", 300, (pool(1_000, 250 * MS), true), 0);
        s.grant(b"k", "b", 100, (pool(1_000, 250 * MS), true), 0);
        assert_eq!(s.demand(b"k", MS), 400);
        assert_eq!(
            s.demand(b"k", STANDING_MEMORY),
            0,
            "demand counts while a client stands"
        );
    }
}
