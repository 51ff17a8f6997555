//! The store's byte budget (`limits.max_memory`): a running total of every
//! entry's [`Entry::footprint`], kept true by each change that can move it.
//!
//! `max_keys` alone does not bound memory: a sliding-window-log key holds
//! up to `max_log_entries` timestamps (160 KB at the default), so about
//! 6,500 such keys fill a GiB, and a replica doubles it. The total is one
//! atomic, changed only when a footprint changes (a key added or removed, a
//! log's queue reallocated, a report slot added) — never a scan on the hot
//! path. Over the budget, the same eviction hand as for `max_keys` takes
//! keys until both bounds hold.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::Store;
use super::entry::Entry;

/// Bytes in use and the bound on them.
#[derive(Debug)]
pub(super) struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub(super) fn new(max: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            max: max.max(1),
        }
    }

    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Whether `more` bytes would take the total past the bound.
    pub(super) fn over_with(&self, more: usize) -> bool {
        self.used().saturating_add(more) > self.max
    }

    pub(super) fn add(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// An entry's footprint went from `before` to `after`.
    fn resize(&self, before: usize, after: usize) {
        if after > before {
            self.add(after - before);
        } else if before > after {
            self.sub(before - after);
        }
    }
}

impl Store {
    /// Run `f` on an entry in the table, keeping the byte total true;
    /// returns what `f` returned and whether the entry grew (the caller
    /// then makes room, once it has let go of the entry's lock).
    #[inline(always)]
    pub(super) fn metered<R>(
        &self,
        key_len: usize,
        e: &mut Entry,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> (R, bool) {
        let before = e.footprint(key_len);
        let r = f(e);
        let after = e.footprint(key_len);
        self.budget.resize(before, after);
        (r, after > before)
    }

    /// A new entry is in the table.
    pub(super) fn charge(&self, key_len: usize, e: &Entry) {
        self.budget.add(e.footprint(key_len));
    }

    /// An entry left the table.
    pub(super) fn discharge(&self, key_len: usize, e: &Entry) {
        self.budget.sub(e.footprint(key_len));
    }

    /// An entry grew: evict (never the key just changed while its lock is
    /// held — the caller has let go of it) until the bytes are within the
    /// budget again.
    pub(super) fn after_growth(&self, grew: bool, now: crate::algorithm::Nanos) {
        if grew && self.budget.over_with(0) {
            self.make_room_for(now, 0);
        }
    }

    /// Bytes the keys in memory hold (the sum of their footprints), as
    /// kept by the running total.
    pub fn memory_used(&self) -> usize {
        self.budget.used()
    }

    /// The bound on [`Store::memory_used`] (`limits.max_memory`).
    pub fn max_memory(&self) -> usize {
        self.budget.max()
    }

    /// The sum of every entry's footprint, recomputed by a scan of the
    /// table: what the running total must equal. For tests and operators'
    /// checks, never the hot path.
    pub fn recount_memory(&self) -> usize {
        let mut sum = 0;
        self.map.for_each(|k, e| sum += e.footprint(k.len()));
        sum
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
