//! Eviction at `max_keys` or `max_memory`: a clock-like hand over the table's
//! slots takes the key closest to fresh from a small sample — a key used
//! since the hand last passed gets a second chance, and keys much fuller
//! than recent victims are passed over (up to a bound), so a flood of
//! nearly fresh keys is evicted before the warm keys it pushed along.

use std::sync::atomic::Ordering;

use super::Store;
use crate::algorithm::Nanos;

/// How many unreferenced keys the eviction hand compares per eviction.
const SAMPLE: usize = 8;
/// Keys much fuller than recent victims the hand may pass over per
/// eviction, looking for fresher ones (bounds an eviction's work).
const MAX_PASS: usize = 4_096;

impl Store {
    /// Evict until there is room for one more key, of `key_len` bytes.
    pub(super) fn make_room(&self, now: Nanos, key_len: usize) {
        self.make_room_for(
            now,
            super::entry::INLINE_BYTES + super::table::key_heap_bytes(key_len),
        );
    }

    /// Evict until there is room for one more key and `bytes` more bytes
    /// (0: until the keys and bytes in memory are within their bounds).
    pub(super) fn make_room_for(&self, now: Nanos, bytes: usize) {
        let more_keys = usize::from(bytes > 0);
        loop {
            let for_keys = self.len() + more_keys > self.max_keys;
            if !for_keys && !self.budget.over_with(bytes) {
                return;
            }
            if !self.evict_one(now) {
                return;
            }
            if !for_keys {
                self.stats.memory_evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One turn of the eviction hand. Returns false if nothing could be evicted.
    fn evict_one(&self, now: Nanos) -> bool {
        let mut hand = self.hand.lock().unwrap_or_else(|p| p.into_inner());
        let typical = self.typical_victim.load(Ordering::Relaxed);
        let much_fuller = typical.saturating_mul(2).max(typical + 1_000);
        let mut candidates: Vec<(u64, Nanos, Vec<u8>)> = Vec::with_capacity(SAMPLE);
        // Of the keys passed over, only the freshest is kept: it is the
        // victim if nothing near the usual turns up.
        let mut passed = 0;
        let mut freshest_passed: Option<(u64, Nanos, Vec<u8>)> = None;
        // Every key gets at most one second chance per turn, so the turn
        // ends: two laps of the table.
        let mut budget = 2 * self.map.places() + SAMPLE;
        while candidates.len() < SAMPLE && budget > 0 {
            budget -= 1;
            let seen = self.map.step(&mut hand, |k, e| {
                if e.take_reference() {
                    return None;
                }
                let fullness = e.keep_score(now);
                let pass = fullness > much_fuller && passed < MAX_PASS;
                let keep = !pass
                    || freshest_passed
                        .as_ref()
                        .is_none_or(|f| (fullness, e.last_seen()) < (f.0, f.1));
                Some((pass, keep.then(|| (fullness, e.last_seen(), k.to_vec()))))
            });
            match seen {
                Some(Some((true, better))) => {
                    passed += 1;
                    freshest_passed = better.or(freshest_passed);
                }
                Some(Some((false, Some(candidate)))) => candidates.push(candidate),
                _ => {} // a hole, or a second chance given
            }
        }
        drop(hand);
        // Nothing near the usual: the fullest keys are all there is.
        let victim = candidates.into_iter().min().or(freshest_passed);
        let Some((fullness, _, victim)) = victim else {
            return false;
        };
        self.typical_victim
            .store((typical * 7 + fullness) / 8, Ordering::Relaxed);
        if let Some(e) = self.map.remove(&victim) {
            self.discharge(victim.len(), &e);
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            if fullness > 0 {
                self.stats
                    .evictions_counting
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.top.forget(&victim, (e.hits(), e.refusals()));
        }
        true
    }
}
