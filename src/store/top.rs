//! Top keys by hits and by refusals, kept as decisions are made.
//!
//! An operator's status page asks for the top keys every two seconds; a
//! scan of a table of millions of keys per refresh would cost more than
//! the decisions it reports on. So each ranking keeps a bounded set of
//! candidates (`2 × k`), fed from the decision path:
//!
//! - While the set is full, `floor` is the lowest count a candidate was
//!   recorded at. A key whose count is at or below it cannot get in: the
//!   decision pays one relaxed load and a compare, nothing else.
//! - A key above the floor takes the ranking's lock when its count crosses
//!   the floor or a multiple of [`GRANULARITY`] — about once per 64 of its
//!   hits, however many threads decide it — so a hot key does not
//!   serialize its decisions on one mutex.
//! - A recorded count lags the key's count by less than the granularity
//!   (plus one request's hits). Reads rank the candidates by the store's
//!   live counts, and drop the ones no longer in the store; so whenever the
//!   keys' counts are more than the granularity apart, the reported top `k`
//!   is the exact top `k` (`top_tests.rs` checks it by property).
//!
//! An evicted or removed key leaves the rankings; a sweep drops the
//! candidates the store no longer holds.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Entry, Hasher, Store, TopBy, View};
use crate::algorithm::Nanos;

/// A candidate's recorded count is refreshed when its count crosses a
/// multiple of this.
pub const GRANULARITY: u64 = 64;
/// Keys each ranking reports exactly (it keeps twice as many candidates).
pub const DEFAULT_K: usize = 100;

/// The two rankings of one store.
#[derive(Debug)]
pub struct TopKeys {
    hits: Ranking,
    refusals: Ranking,
}

/// A key's `(hits, refusals)` before and after a change.
pub type Counts = (u64, u64);

impl TopKeys {
    /// Rankings that report the top `k` exactly (`2 × k` candidates each).
    pub fn new(k: usize) -> TopKeys {
        TopKeys::with_hasher(k, Hasher::default)
    }

    /// [`TopKeys::new`], hashing with what `hasher` makes.
    pub fn with_hasher(k: usize, hasher: impl Fn() -> Hasher) -> TopKeys {
        TopKeys {
            hits: Ranking::new(2 * k.max(1), hasher()),
            refusals: Ranking::new(2 * k.max(1), hasher()),
        }
    }

    /// Whether these rankings keep anything ([`TopKeys::off`] keeps none).
    pub fn is_on(&self) -> bool {
        self.hits.capacity > 0
    }

    /// No rankings: nothing is ever due (a store nobody asks for its top
    /// keys, such as an edge's remembered answers).
    pub fn off() -> TopKeys {
        let off = || Ranking {
            floor: Floor(AtomicU64::new(u64::MAX)),
            candidates: Mutex::new(HashMap::with_hasher(Hasher::default())),
            capacity: 0,
        };
        TopKeys {
            hits: off(),
            refusals: off(),
        }
    }

    /// Whether a key whose counts went from `before` to `after` must be
    /// recorded (the hot path's whole cost when it need not: a relaxed
    /// load and a compare per ranking whose count changed).
    #[inline]
    pub fn due(&self, before: Counts, after: Counts) -> bool {
        self.hits.due(before.0, after.0) || self.refusals.due(before.1, after.1)
    }

    /// Record the key's counts in the rankings it is due in.
    pub fn record(&self, key: &[u8], before: Counts, after: Counts) {
        if self.hits.due(before.0, after.0) {
            self.hits.update(key, after.0);
        }
        if self.refusals.due(before.1, after.1) {
            self.refusals.update(key, after.1);
        }
    }

    /// A key left the store (evicted or removed) with these counts.
    pub fn forget(&self, key: &[u8], counts: Counts) {
        self.hits.forget(key, counts.0);
        self.refusals.forget(key, counts.1);
    }

    /// Keep only the candidates `keep` says are still in the store.
    pub fn retain(&self, keep: impl Fn(&[u8]) -> bool) {
        for ranking in [&self.hits, &self.refusals] {
            let gone: Vec<Arc<[u8]>> = ranking
                .candidates()
                .into_iter()
                .filter(|(k, _)| !keep(k))
                .map(|(k, _)| k)
                .collect();
            for k in gone {
                ranking.forget(&k, u64::MAX);
            }
        }
    }

    /// The candidates by `by` with their recorded counts (unordered).
    pub fn candidates(&self, by: TopBy) -> Vec<(Arc<[u8]>, u64)> {
        match by {
            TopBy::Hits => self.hits.candidates(),
            TopBy::Refusals => self.refusals.candidates(),
        }
    }
}

/// The floor on its own cache line: every decision reads it, and the
/// ranking's lock and map beside it are written under contention.
#[derive(Debug)]
#[repr(align(128))]
struct Floor(AtomicU64);

/// One ranking: at most `capacity` candidates and their recorded counts.
#[derive(Debug)]
struct Ranking {
    /// The lowest recorded count while the set is full; 0 while it is not.
    floor: Floor,
    candidates: Mutex<HashMap<Arc<[u8]>, u64, Hasher>>,
    capacity: usize,
}

impl Ranking {
    fn new(capacity: usize, hasher: Hasher) -> Ranking {
        Ranking {
            floor: Floor(AtomicU64::new(0)),
            candidates: Mutex::new(HashMap::with_capacity_and_hasher(capacity + 1, hasher)),
            capacity,
        }
    }

    #[inline]
    fn due(&self, before: u64, after: u64) -> bool {
        if after <= before {
            return false;
        }
        let floor = self.floor.0.load(Ordering::Relaxed);
        if after <= floor {
            return false;
        }
        // Crossed the floor (it may just have got in), or a multiple of
        // the granularity (its recorded count is refreshed).
        before <= floor || before / GRANULARITY != after / GRANULARITY
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<[u8]>, u64, Hasher>> {
        // A panic while holding it leaves a map that is still valid.
        self.candidates.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, key: &[u8], count: u64) {
        let mut set = self.lock();
        if let Some(c) = set.get_mut(key) {
            // Two threads may record one key out of order.
            *c = (*c).max(count);
        } else if set.len() < self.capacity {
            set.insert(Arc::from(key), count);
        } else {
            let Some((lowest, at)) = lowest(&set) else {
                return;
            };
            if count <= at {
                return;
            }
            set.remove(&lowest);
            set.insert(Arc::from(key), count);
        }
        self.refloor(&set);
    }

    /// Drop `key` if it is a candidate; `count`: its last count, so a key
    /// that cannot be one costs no lock.
    fn forget(&self, key: &[u8], count: u64) {
        if self.capacity == 0 || count == 0 || count < self.floor.0.load(Ordering::Relaxed) {
            return;
        }
        let mut set = self.lock();
        if set.remove(key).is_some() {
            self.refloor(&set);
        }
    }

    fn refloor(&self, set: &HashMap<Arc<[u8]>, u64, Hasher>) {
        let floor = match set.len() >= self.capacity {
            true => lowest(set).map_or(0, |(_, c)| c),
            false => 0,
        };
        // Stored only when it moves: a store makes every core re-fetch it.
        if self.floor.0.load(Ordering::Relaxed) != floor {
            self.floor.0.store(floor, Ordering::Relaxed);
        }
    }

    fn candidates(&self) -> Vec<(Arc<[u8]>, u64)> {
        self.lock().iter().map(|(k, c)| (k.clone(), *c)).collect()
    }
}

/// The candidate with the lowest recorded count (a scan of at most
/// `2 × k`: made only under the lock, at most once per granularity step).
fn lowest(set: &HashMap<Arc<[u8]>, u64, Hasher>) -> Option<(Arc<[u8]>, u64)> {
    set.iter()
        .min_by_key(|(_, c)| **c)
        .map(|(k, c)| (k.clone(), *c))
}

impl Store {
    /// The `n` keys with the most hits (or refusals), most first, among
    /// the keys this node counts (not copies of counts kept elsewhere):
    /// for `n` up to [`DEFAULT_K`] from the rankings' candidates, ranked by
    /// their live counts — no scan of the table; candidates no longer in
    /// memory, or only as copies (moved to another owner), leave the
    /// rankings as they are found, making room for keys counted here. A
    /// larger `n` is an operator's rare query, answered by a scan that
    /// keeps the best `n` (a view is built for those only).
    pub fn top(&self, by: TopBy, n: usize, now: Nanos) -> Vec<(Arc<[u8]>, View)> {
        let metric = |e: &Entry| match by {
            TopBy::Hits => e.hits(),
            TopBy::Refusals => e.refusals(),
        };
        // A min-heap of the best n so far, on (metric, key) for a stable order.
        let mut heap: BinaryHeap<Reverse<(u64, Arc<[u8]>)>> = BinaryHeap::new();
        let mut offer = |m: u64, k: &[u8]| {
            // Past the n-th best, a key is not even copied.
            let worst = heap.peek().map(|r| r.0.0);
            if m > 0 && (heap.len() < n || worst.is_some_and(|w| m >= w)) {
                heap.push(Reverse((m, Arc::from(k))));
                if heap.len() > n {
                    heap.pop();
                }
            }
        };
        if n > DEFAULT_K {
            self.map.for_each(|k, e| {
                if !e.is_copy() {
                    offer(metric(e), k);
                }
            });
        } else {
            let mut gone = Vec::new();
            for (k, _) in self.top.candidates(by) {
                match self.map.with(&k, |e| (!e.is_copy()).then(|| metric(e))) {
                    Some(Some(m)) => offer(m, &k),
                    _ => gone.push(k),
                }
            }
            for k in gone {
                self.top.forget(&k, (u64::MAX, u64::MAX));
            }
        }
        let mut best: Vec<(u64, Arc<[u8]>)> = heap.into_iter().map(|r| r.0).collect();
        best.sort_by(|a, b| b.cmp(a));
        best.into_iter()
            .filter_map(|(_, k)| {
                let v = self.map.with(&k, |e| e.view(now))?;
                Some((k, v))
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "top_tests.rs"]
mod tests;
