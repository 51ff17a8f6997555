//! The owner side of tiered mode as a table: the ledgers of every key this
//! node grants allotments of, bounded by `tiered_max_keys`.
//!
//! A ledger is kept while it matters: an edge holds an unexpired allotment
//! of the key, or promises are still reserved (within the grace). A new key
//! finding the table full takes the room of a ledger that no longer
//! matters; when there is none it gets no ledger, and is decided exactly
//! with no grant (the slow path).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Grant, Ledger, Terms};
use crate::algorithm::Nanos;

/// The ledgers of one owner, by encoded key.
#[derive(Debug)]
pub struct Ledgers {
    keys: HashMap<Arc<[u8]>, Ledger>,
    max_keys: usize,
    terms: Terms,
    /// Ledgers looked at to make room and to total the figures (the work
    /// a flood of keys costs; tests bound it).
    examined: u64,
}

impl Ledgers {
    pub fn new(max_keys: usize, terms: Terms) -> Ledgers {
        Ledgers {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
            terms,
            examined: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }

    /// Every key with a ledger.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<[u8]>> {
        self.keys.keys()
    }

    /// Forget every ledger.
    pub fn clear(&mut self) {
        self.keys.clear();
    }

    /// Forget `key`'s ledger, and return it.
    pub fn remove(&mut self, key: &[u8]) -> Option<Ledger> {
        self.keys.remove(key)
    }

    /// Make sure `key` has a ledger, taking the room of one that no longer
    /// matters if the table is full. False when there is no room: the key
    /// is decided with no ledger (nothing reserved, nothing granted).
    pub fn open(&mut self, key: &[u8], now: Nanos) -> bool {
        if self.keys.contains_key(key) {
            return true;
        }
        if self.keys.len() >= self.max_keys {
            let terms = self.terms;
            self.examined += self.keys.len() as u64;
            self.keys.retain(|_, l| {
                l.release_expired(now, &terms);
                l.holders(now) > 0 || l.reserved(now, &terms) > 0
            });
        }
        if self.keys.len() >= self.max_keys {
            return false;
        }
        self.keys.insert(Arc::from(key), Ledger::default());
        true
    }

    /// Tokens `key`'s ledger has promised and not heard about, at `now`.
    pub fn reserved_of(&self, key: &[u8], now: Nanos) -> u64 {
        self.keys
            .get(key)
            .map_or(0, |l| l.reserved(now, &self.terms))
    }

    /// Whether `edge` was just told there is nothing for it
    /// ([`Ledger::waiting`]).
    pub fn waiting(&self, key: &[u8], edge: &str, now: Nanos) -> bool {
        self.keys.get(key).is_some_and(|l| l.waiting(edge, now))
    }

    /// `edge` gives back what it did not spend ([`Ledger::give_back`]).
    pub fn give_back(&mut self, key: &[u8], edge: &str, unused: u64) {
        if let Some(l) = self.keys.get_mut(key) {
            l.give_back(edge, unused);
        }
    }

    /// `edge`'s report of `hits` was absorbed ([`Ledger::reported`]).
    pub fn reported(&mut self, key: &[u8], edge: &str, hits: u64) {
        if let Some(l) = self.keys.get_mut(key) {
            l.reported(edge, hits);
        }
    }

    /// Grant `edge` its next allotment of `key` ([`Ledger::grant`]); None
    /// when the key has no ledger ([`Ledgers::open`] found no room).
    pub fn grant(
        &mut self,
        key: &[u8],
        edge: &str,
        demand: u64,
        remaining: u64,
        n: u64,
        now: Nanos,
    ) -> Option<Grant> {
        let terms = self.terms;
        let l = self.keys.get_mut(key)?;
        Some(l.grant(edge, demand, remaining, n, now, &terms))
    }

    /// Tokens promised to edges and not yet reported, every key's, as of
    /// `now` (a gauge).
    pub fn reserved(&mut self, now: Nanos) -> u64 {
        self.examined += self.keys.len() as u64;
        self.keys.values().fold(0u64, |sum, l| {
            sum.saturating_add(l.reserved(now, &self.terms))
        })
    }

    /// Ledgers looked at so far to make room and total the figures.
    pub fn examined(&self) -> u64 {
        self.examined
    }
}
