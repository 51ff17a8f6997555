//! The orders the tiered tables keep beside their maps, so that making
//! room for a new key and keeping the figures look at a bounded number of
//! entries rather than the whole table (issue 18: a client flooding keys
//! ran an O(n) `retain` per key under the table's lock).
//!
//! Both are lazy: an entry is never searched for and removed when its key
//! moves on (a later deadline, a grant, an eviction); the table tells a
//! stale entry from a live one by what it holds, and drops it when it comes
//! up. Each entry comes up once, so the work is O(1) per push, amortized.
//! Stale entries that never come up (a key granted again and again within
//! one lifetime) are bounded by compaction: when a queue is more than
//! twice what it held after the last one (plus [`SLACK`]), the stale are
//! dropped — O(len), after at least len/2 pushes, so O(1) amortized too —
//! and it never holds more than about twice the live entries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::algorithm::Nanos;

/// Pushes allowed past twice the last compacted length before the next
/// compaction (so a small table does not compact at every push).
const SLACK: usize = 64;

/// Keys by deadline, earliest first.
#[derive(Debug)]
pub(super) struct Deadlines<K> {
    heap: BinaryHeap<Reverse<(Nanos, K)>>,
    compacted: usize,
}

impl<K: Ord> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
            compacted: 0,
        }
    }
}

impl<K: Ord> Deadlines<K> {
    /// Add `key` due at `at`; `live` tells entries still wanted, should a
    /// compaction be due. Returns the entries a compaction looked at.
    pub fn push(&mut self, at: Nanos, key: K, live: impl FnMut(Nanos, &K) -> bool) -> u64 {
        self.heap.push(Reverse((at, key)));
        self.compact_if_due(live)
    }

    /// The earliest entry, if it is due by `now`.
    pub fn pop_due(&mut self, now: Nanos) -> Option<(Nanos, K)> {
        if self.heap.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            self.heap.pop().map(|Reverse(e)| e)
        } else {
            None
        }
    }

    pub fn clear(&mut self) {
        self.heap.clear();
        self.compacted = 0;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    fn compact_if_due(&mut self, mut live: impl FnMut(Nanos, &K) -> bool) -> u64 {
        let len = self.heap.len();
        if len <= 2 * self.compacted + SLACK {
            return 0;
        }
        self.heap.retain(|Reverse((at, k))| live(*at, k));
        self.compacted = self.heap.len();
        len as u64
    }
}

/// Keys in the order they were pushed, each with a mark (what the table
/// checks it against).
#[derive(Debug)]
pub(super) struct Fifo<K> {
    queue: VecDeque<(u64, K)>,
    compacted: usize,
}

impl<K> Default for Fifo<K> {
    fn default() -> Self {
        Fifo {
            queue: VecDeque::new(),
            compacted: 0,
        }
    }
}

impl<K> Fifo<K> {
    /// Add `key` at the back; as [`Deadlines::push`].
    pub fn push(&mut self, mark: u64, key: K, live: impl FnMut(u64, &K) -> bool) -> u64 {
        self.queue.push_back((mark, key));
        self.compact_if_due(live)
    }

    pub fn pop(&mut self) -> Option<(u64, K)> {
        self.queue.pop_front()
    }

    pub fn clear(&mut self) {
        self.queue.clear();
        self.compacted = 0;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    fn compact_if_due(&mut self, mut live: impl FnMut(u64, &K) -> bool) -> u64 {
        let len = self.queue.len();
        if len <= 2 * self.compacted + SLACK {
            return 0;
        }
        self.queue.retain(|(mark, k)| live(*mark, k));
        self.compacted = self.queue.len();
        len as u64
    }
}
