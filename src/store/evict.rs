//! Eviction at `max_keys` or `max_memory`: a clock-like hand over the keys in insertion
//! order takes the key closest to fresh from a small sample — a key used
//! since the hand last passed gets a second chance, and keys much fuller
//! than recent victims are passed over (up to a bound), so a flood of
//! nearly fresh keys is evicted before the warm keys it pushed along.

use std::collections::VecDeque;
use std::sync::Arc;
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
        self.make_room_for(now, super::entry::INLINE_BYTES + key_len);
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
        let mut queue = self.evict_queue();
        let typical = self.typical_victim.load(Ordering::Relaxed);
        let much_fuller = typical.saturating_mul(2).max(typical + 1_000);
        let mut candidates: Vec<(u64, Nanos, Arc<[u8]>)> = Vec::with_capacity(SAMPLE);
        let mut passed: Vec<(u64, Nanos, Arc<[u8]>)> = Vec::new();
        // Every key gets at most one second chance per turn, so the turn ends.
        let mut budget = 2 * queue.len() + SAMPLE;
        while candidates.len() < SAMPLE && budget > 0 {
            budget -= 1;
            let Some(key) = queue.pop_front() else { break };
            let Some(mut e) = self.map.get_mut(&key) else {
                continue; // removed by a sweep or an earlier eviction
            };
            if e.take_reference() {
                drop(e);
                queue.push_back(key);
                continue;
            }
            let fullness = e.fullness_ppm(now);
            let candidate = (fullness, e.last_seen(), key);
            if fullness > much_fuller && passed.len() < MAX_PASS {
                passed.push(candidate);
            } else {
                candidates.push(candidate);
            }
        }
        if candidates.is_empty() {
            // Nothing near the usual: the fullest keys are all there is.
            candidates = std::mem::take(&mut passed);
        }
        candidates.sort();
        let mut rest = candidates.into_iter();
        let Some((fullness, _, victim)) = rest.next() else {
            return false;
        };
        queue.extend(rest.map(|c| c.2));
        queue.extend(passed.into_iter().map(|c| c.2));
        drop(queue);
        self.typical_victim
            .store((typical * 7 + fullness) / 8, Ordering::Relaxed);
        if let Some((k, e)) = self.map.remove(&victim) {
            self.discharge(k.len(), &e);
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            if fullness > 0 {
                self.stats
                    .evictions_counting
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.top.forget(&k, (e.hits(), e.refusals()));
        }
        true
    }

    /// Drop queue slots of removed keys once they outnumber the live ones.
    pub(super) fn compact_evict_queue(&self) {
        let mut queue = self.evict_queue();
        if queue.len() > 2 * self.len() + 1024 {
            queue.retain(|k| self.map.contains_key(k));
        }
    }

    pub(super) fn evict_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<[u8]>>> {
        // A panic while holding it leaves a queue that is still a valid list.
        self.evict_queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
