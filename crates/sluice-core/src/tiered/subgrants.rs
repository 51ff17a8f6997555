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
//! in flight at a time).
//!
//! Pure arithmetic over an injected clock: no I/O, no locking.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Grant, Ledger, Terms};
use crate::algorithm::Nanos;

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
}

impl SubGrants {
    pub fn new(caps: Caps, terms: Terms, lead: Nanos) -> SubGrants {
        let terms = Terms {
            max_edges: caps.max_clients_per_key.max(1),
            ..terms
        };
        SubGrants {
            keys: HashMap::new(),
            clients: HashMap::new(),
            caps,
            terms,
            lead,
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

    /// Make sure `client` is remembered (making room by forgetting the
    /// client idle longest, if idle past `memory`). False when full.
    fn admit_client(&mut self, client: &str, now: Nanos) -> bool {
        if let Some(c) = self.clients.get_mut(client) {
            c.seen = now;
            return true;
        }
        if self.clients.len() >= self.caps.max_clients.max(1) {
            let idle = self
                .clients
                .iter()
                .filter(|(_, c)| c.seen.saturating_add(self.terms.memory) <= now && c.keys == 0)
                .min_by_key(|(_, c)| c.seen)
                .map(|(id, _)| id.clone());
            match idle {
                Some(id) => self.clients.remove(&id),
                None => return false,
            };
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
    pub fn reported(&mut self, key: &[u8], client: &str, hits: u64) {
        if let Some(l) = self.keys.get_mut(key) {
            l.reported(client, hits);
        }
    }

    /// Whether report `seq` of `client` is new: applied now (true), or a
    /// resend of one already applied (false). Numbers only grow: a client
    /// has one report in flight and cuts the next only once this one is
    /// acknowledged. A client the node does not know (it forgot it, or
    /// restarted) starts from this number.
    pub fn fresh(&mut self, client: &str, seq: u64, now: Nanos) -> bool {
        if !self.admit_client(client, now) {
            // Full of live clients: apply, and do not remember the number
            // (a resend would count twice; the count of clients that
            // ends here is bounded by `max_clients` live ones).
            return true;
        }
        let Some(c) = self.clients.get_mut(client) else {
            return true;
        };
        if seq <= c.last_seq {
            return false;
        }
        c.last_seq = seq;
        true
    }

    /// The client demand of `key` (hits per second), for the node's own
    /// ask to the owner.
    pub fn demand(&self, key: &[u8], now: Nanos) -> u64 {
        self.keys.get(key).map_or(0, |l| l.demand(now, &self.terms))
    }

    /// Grant `client` a share of `key` from the node's live allotment of
    /// it: `pool` tokens left, ending at `node_expires`. The caller takes
    /// the amount out of its allotment. `demand`: the client's hits per
    /// second. No grant (amount 0, ending now) past a bound, or when the
    /// node's allotment ends too soon to pass any on.
    pub fn grant(
        &mut self,
        key: &[u8],
        client: &str,
        demand: u64,
        pool: u64,
        node_expires: Nanos,
        now: Nanos,
    ) -> Grant {
        let none = Grant {
            amount: 0,
            expires: now,
        };
        let life = node_expires
            .saturating_sub(now)
            .saturating_sub(self.lead)
            .min(self.terms.ttl);
        // Less than an eighth of a full life left: not worth a round trip.
        if life < self.terms.ttl / 8 || !self.admit_client(client, now) {
            return none;
        }
        if !self.keys.contains_key(key) && self.keys.len() >= self.caps.max_keys.max(1) {
            self.sweep_idle(now);
            if self.keys.len() >= self.caps.max_keys.max(1) {
                return none;
            }
        }
        let ledger = self.keys.entry(Arc::from(key)).or_default();
        let new_here = !ledger.knows(client);
        let keys_held = self.clients.get(client).map_or(0, |c| c.keys);
        if new_here && keys_held >= self.caps.max_keys_per_client.max(1) {
            return none;
        }
        let terms = Terms {
            ttl: life,
            ..self.terms
        };
        // The pool is split among the clients by demand (the ledger's
        // share), none of it kept back: a node's own callers of the key are
        // the clients' asks, which spend from the node's next allotment.
        let remaining = pool.saturating_add(ledger.reserved(now, &terms));
        let g = ledger.grant(client, demand, remaining, 1, now, &terms);
        if new_here
            && ledger.knows(client)
            && let Some(c) = self.clients.get_mut(client)
        {
            c.keys += 1;
        }
        g
    }

    /// Release the sub-grants that lapsed past the grace unreported; drop
    /// ledgers with nothing left and recount each client's keys. Returns
    /// the tokens released per key: they go back to the node's allotment.
    /// A walk over every key: the caller runs it once per report interval.
    pub fn sweep(&mut self, now: Nanos) -> Vec<(Arc<[u8]>, u64)> {
        let mut released = Vec::new();
        for (k, l) in self.keys.iter_mut() {
            let r = l.release_expired(now, &self.terms);
            if r > 0 {
                released.push((k.clone(), r));
            }
        }
        self.sweep_idle(now);
        released
    }

    /// Drop ledgers that forgot every client; recount keys per client;
    /// forget clients idle past `memory` with no keys.
    fn sweep_idle(&mut self, now: Nanos) {
        self.keys.retain(|_, l| l.edges() > 0);
        for c in self.clients.values_mut() {
            c.keys = 0;
        }
        for l in self.keys.values() {
            for (id, c) in self.clients.iter_mut() {
                if l.knows(id) {
                    c.keys += 1;
                }
            }
        }
        let memory = self.terms.memory;
        self.clients
            .retain(|_, c| c.keys > 0 || c.seen.saturating_add(memory) > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

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
        let g = s.grant(b"k", "a", 1_000_000, 100, 250 * MS, 0);
        assert_eq!(g.amount, 100);
        assert_eq!(g.expires, 200 * MS);
        let g = s.grant(b"k", "a", 1_000_000, 100, 120 * MS, 10 * MS);
        assert_eq!(g.expires, 70 * MS, "the node's allotment ends at 120 ms");
        assert_eq!(s.grant(b"k", "a", 1_000, 100, 60 * MS, 10 * MS).amount, 0);
    }

    #[test]
    fn outstanding_is_granted_less_reported_and_returned_and_lapses_after_grace() {
        let mut s = subgrants();
        let g = s.grant(b"k", "a", 1_000_000, 100, 250 * MS, 0);
        assert_eq!(s.outstanding(0), g.amount);
        s.reported(b"k", "a", 10);
        assert_eq!(s.give_back(b"k", "a", 5), 5);
        assert_eq!(s.outstanding(0), g.amount - 15);
        // A give-back beyond what it holds returns only what it held.
        assert_eq!(s.give_back(b"k", "a", 1_000), g.amount - 15);
        let g2 = s.grant(b"k", "a", 1_000_000, 40, 250 * MS, 0);
        assert_eq!(g2.amount, 40);
        assert!(s.sweep(g2.expires + 149 * MS).is_empty());
        let released = s.sweep(g2.expires + 150 * MS);
        assert_eq!(released, vec![(Arc::from(&b"k"[..]), g2.amount)]);
        assert_eq!(s.outstanding(g2.expires + 150 * MS), 0);
    }

    #[test]
    fn a_report_number_applies_once() {
        let mut s = subgrants();
        assert!(s.fresh("a", 1, 0));
        assert!(!s.fresh("a", 1, MS));
        assert!(s.fresh("a", 2, MS));
        assert!(!s.fresh("a", 1, MS));
        assert!(s.fresh("b", 1, MS), "numbers are per client");
    }

    #[test]
    fn keys_per_client_clients_per_key_and_clients_are_bounded() {
        let mut s = subgrants();
        let pool = 1_000;
        assert!(s.grant(b"k1", "a", 100, pool, 250 * MS, 0).amount > 0);
        assert!(s.grant(b"k2", "a", 100, pool, 250 * MS, 0).amount > 0);
        assert_eq!(s.grant(b"k3", "a", 100, pool, 250 * MS, 0).amount, 0);
        assert!(s.grant(b"k1", "b", 100, pool, 250 * MS, 0).amount > 0);
        assert_eq!(s.grant(b"k1", "c", 100, pool, 250 * MS, 0).amount, 0);
        assert!(s.grant(b"k2", "c", 100, pool, 250 * MS, 0).amount > 0);
        // Three live clients: a fourth is refused until one goes idle.
        assert_eq!(s.grant(b"k4", "d", 100, pool, 250 * MS, 0).amount, 0);
        let later = 10_000 * MS;
        s.sweep(later);
        assert!(
            s.grant(b"k4", "d", 100, pool, later + 250 * MS, later)
                .amount
                > 0
        );
        assert!(s.clients() <= 3);
        assert!(s.len() <= 4);
    }

    #[test]
    fn demand_counts_every_recent_client() {
        let mut s = subgrants();
        s.grant(b"k", "a", 300, 1_000, 250 * MS, 0);
        s.grant(b"k", "b", 100, 1_000, 250 * MS, 0);
        assert_eq!(s.demand(b"k", MS), 400);
        assert_eq!(s.demand(b"k", 2_000 * MS), 0);
    }
}
