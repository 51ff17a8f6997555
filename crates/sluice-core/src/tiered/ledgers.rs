//! The owner side of tiered mode as a table: the ledgers of every key this
//! node grants allotments of, bounded by `tiered_max_keys`.
//!
//! A ledger is kept while it matters: an edge holds an unexpired allotment
//! of the key, or promises are still reserved (within the grace). A new key
//! finding the table full takes the room of the ledger that fell idle
//! first; when none is idle it gets no ledger, and is decided exactly with
//! no grant (the slow path).
//!
//! A client can flood the owner with tiered keys, so nothing here scans the
//! table per key (issue 18): each ledger has one entry in `wakes`, at the
//! next moment time changes it — a reservation released after its grace,
//! or its last allotment ending — and a ledger found idle there joins
//! `idle`, the eviction order. Both are lazy orders ([`super::queue`]):
//! O(1) amortized per grant and per new key. The reserved-tokens gauge is
//! kept as ledgers change, rather than summed over the table at each report.
//! (Work within one ledger is over its edges: nodes of the cluster, at most
//! `Terms::max_edges`.)

use std::collections::HashMap;
use std::sync::Arc;

use super::queue::{Deadlines, Fifo};
use super::{Grant, Ledger, Pace, Terms};
use crate::algorithm::Nanos;

/// One key's ledger and its places in the table's orders.
#[derive(Debug)]
struct Slot {
    ledger: Ledger,
    /// Its current entry in `wakes` (None while idle).
    wake: Option<Nanos>,
    /// Its current entry in `idle` (None unless idle).
    idle: Option<u64>,
}

/// The ledgers of one owner, by encoded key.
#[derive(Debug)]
pub struct Ledgers {
    keys: HashMap<Arc<[u8]>, Slot>,
    max_keys: usize,
    terms: Terms,
    /// `(when, key)`: look at `key`'s ledger again then.
    wakes: Deadlines<Arc<[u8]>>,
    /// `(mark, key)`: ledgers found idle, in that order.
    idle: Fifo<Arc<[u8]>>,
    /// The next mark for `idle`.
    marks: u64,
    /// Tokens every ledger has outstanding (what `reserved` says once the
    /// reservations due have been released; u128 never wraps).
    reserved: u128,
    /// Ledgers looked at to make room and to keep the figures (the work a
    /// flood of keys costs; tests bound it).
    examined: u64,
}

impl Ledgers {
    pub fn new(max_keys: usize, terms: Terms) -> Ledgers {
        Ledgers {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
            terms,
            wakes: Deadlines::default(),
            idle: Fifo::default(),
            marks: 0,
            reserved: 0,
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
        self.wakes.clear();
        self.idle.clear();
        self.reserved = 0;
    }

    /// Forget `key`'s ledger, and return it.
    pub fn remove(&mut self, key: &[u8]) -> Option<Ledger> {
        let slot = self.keys.remove(key)?;
        self.reserved = self.reserved.saturating_sub(slot.ledger.outstanding());
        Some(slot.ledger)
    }

    /// Make sure `key` has a ledger, taking the room of the one that fell
    /// idle first if the table is full. False when there is no room: the
    /// key is decided with no ledger (nothing reserved, nothing granted).
    pub fn open(&mut self, key: &[u8], now: Nanos) -> bool {
        if self.keys.contains_key(key) {
            return true;
        }
        if self.keys.len() >= self.max_keys && !self.evict_one(now) {
            return false;
        }
        let slot = Slot {
            ledger: Ledger::default(),
            wake: None,
            idle: None,
        };
        self.keys.insert(Arc::from(key), slot);
        self.touch(key, now);
        true
    }

    /// Tokens `key`'s ledger has promised and not heard about, at `now`.
    pub fn reserved_of(&self, key: &[u8], now: Nanos) -> u64 {
        self.keys
            .get(key)
            .map_or(0, |s| s.ledger.reserved(now, &self.terms))
    }

    /// [`Ledgers::reserved_of`] as it will be once `edge` gives back
    /// `unused` ([`Ledger::giving_back`]), without giving it back yet.
    pub fn reserved_of_after(&self, key: &[u8], edge: &str, unused: u64, now: Nanos) -> u64 {
        self.keys.get(key).map_or(0, |s| {
            s.ledger
                .reserved(now, &self.terms)
                .saturating_sub(s.ledger.giving_back(edge, unused, now, &self.terms))
        })
    }

    /// Whether `edge` was just told there is nothing for it
    /// ([`Ledger::waiting`]).
    pub fn waiting(&self, key: &[u8], edge: &str, now: Nanos) -> bool {
        self.keys
            .get(key)
            .is_some_and(|s| s.ledger.waiting(edge, now))
    }

    /// `edge` gives back what it did not spend ([`Ledger::give_back`]).
    pub fn give_back(&mut self, key: &[u8], edge: &str, unused: u64) {
        self.lessen(key, |l| {
            l.give_back(edge, unused);
        });
    }

    /// `edge`'s report of `hits` was absorbed ([`Ledger::reported`]).
    pub fn reported(&mut self, key: &[u8], edge: &str, hits: u64) {
        self.lessen(key, |l| {
            l.reported(edge, hits);
        });
    }

    /// Grant `edge` its next allotment of `key` ([`Ledger::grant_paced`]);
    /// None when the key has no ledger ([`Ledgers::open`] found no room).
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &mut self,
        key: &[u8],
        edge: &str,
        demand: u64,
        remaining: u64,
        pace: Option<Pace>,
        n: u64,
        now: Nanos,
    ) -> Option<Grant> {
        let slot = self.keys.get_mut(key)?;
        let before = slot.ledger.outstanding();
        let g = slot
            .ledger
            .grant_paced(edge, demand, remaining, pace, n, now, &self.terms);
        self.reserved = self.reserved.saturating_sub(before) + slot.ledger.outstanding();
        self.touch(key, now);
        Some(g)
    }

    /// Tokens promised to edges and not yet reported, every key's, as of
    /// `now` (a gauge): the reservations due by `now` released first.
    pub fn reserved(&mut self, now: Nanos) -> u64 {
        self.settle(now);
        u64::try_from(self.reserved).unwrap_or(u64::MAX)
    }

    /// Ledgers looked at so far to make room and keep the figures.
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// A report or a give-back: outstanding tokens only go down, so the
    /// ledger's wake stays early enough. Once nothing is outstanding it is
    /// idle when its last allotment ends: look at it again then, not at the
    /// grace's end.
    fn lessen(&mut self, key: &[u8], f: impl FnOnce(&mut Ledger)) {
        let Some(k) = self.keys.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(slot) = self.keys.get_mut(key) else {
            return;
        };
        let before = slot.ledger.outstanding();
        f(&mut slot.ledger);
        let after = slot.ledger.outstanding();
        self.reserved = self.reserved.saturating_sub(before.saturating_sub(after));
        if before > 0 && after == 0 && slot.idle.is_none() {
            let at = slot.ledger.last_expires();
            if slot.wake != Some(at) {
                slot.wake = Some(at);
                self.push_wake(at, k);
            }
        }
    }

    /// Bring `key`'s ledger up to `now` (release what is due) and put it
    /// in the order it belongs to: `wakes` at its next change, or `idle`.
    fn touch(&mut self, key: &[u8], now: Nanos) {
        let Some(k) = self.keys.get_key_value(key).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(slot) = self.keys.get_mut(key) else {
            return;
        };
        let before = slot.ledger.outstanding();
        slot.ledger.release_expired(now, &self.terms);
        let released = before.saturating_sub(slot.ledger.outstanding());
        self.reserved = self.reserved.saturating_sub(released);
        match slot.ledger.next_change(now, &self.terms) {
            Some(at) => {
                slot.idle = None;
                if slot.wake != Some(at) {
                    slot.wake = Some(at);
                    self.push_wake(at, k);
                }
            }
            None => {
                slot.wake = None;
                if slot.idle.is_none() {
                    let mark = self.marks;
                    self.marks += 1;
                    slot.idle = Some(mark);
                    let keys = &self.keys;
                    self.examined += self.idle.push(mark, k, |mark, k| {
                        keys.get(k).is_some_and(|s| s.idle == Some(mark))
                    });
                }
            }
        }
    }

    fn push_wake(&mut self, at: Nanos, k: Arc<[u8]>) {
        let keys = &self.keys;
        self.examined += self.wakes.push(at, k, |at, k| {
            keys.get(k).is_some_and(|s| s.wake == Some(at))
        });
    }

    /// Look at every ledger whose wake is due by `now`.
    fn settle(&mut self, now: Nanos) {
        while let Some((at, k)) = self.wakes.pop_due(now) {
            self.examined += 1;
            if let Some(slot) = self.keys.get_mut(&k)
                && slot.wake == Some(at)
            {
                slot.wake = None;
                self.touch(&k, now);
            }
        }
    }

    /// Make room for one key: evict the ledger that fell idle first. False
    /// when none is idle (each still holds an allotment or reserves tokens).
    fn evict_one(&mut self, now: Nanos) -> bool {
        self.settle(now);
        while let Some((mark, k)) = self.idle.pop() {
            self.examined += 1;
            let current = |keys: &HashMap<Arc<[u8]>, Slot>| {
                keys.get(&k).is_some_and(|s| s.idle == Some(mark))
            };
            if !current(&self.keys) {
                continue;
            }
            // A grant since would have taken it out of `idle`; `touch`
            // checks at `now` all the same (a clock that stepped back),
            // moving it to `wakes` if it is not idle.
            self.touch(&k, now);
            if current(&self.keys) {
                self.remove(&k);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
impl Ledgers {
    /// Entries in `wakes` and `idle`, stale ones included.
    pub(super) fn queued(&self) -> (usize, usize) {
        (self.wakes.len(), self.idle.len())
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&Ledger> {
        self.keys.get(key).map(|s| &s.ledger)
    }

    /// What [`Ledgers::reserved`] must say, counted afresh.
    pub(super) fn reserved_recount(&self, now: Nanos) -> u64 {
        self.keys.values().fold(0u64, |sum, s| {
            sum.saturating_add(s.ledger.reserved(now, &self.terms))
        })
    }
}
