//! The in-memory table of limiter states.
//!
//! A sharded map from encoded key to [`Entry`] (`table.rs`): each decision
//! locks one shard for the few tens of nanoseconds the arithmetic takes, so
//! refill, check and consume are atomic per key without a global lock. A
//! lookup of an existing key allocates nothing (the key is encoded into a
//! per-thread buffer), nor does a new key with a short encoding (it is kept
//! inline in its slot).
//!
//! Bounds: at most `max_keys` entries, holding at most `max_memory` bytes
//! (`budget.rs`: each entry's footprint, kept as a running total). Idle keys — whose state has returned
//! to fresh, so forgetting them loses nothing — are removed by [`Store::sweep`].
//! When the table is full (of keys or of bytes), a new key evicts one: the eviction hand walks the
//! table's slots in order (a CLOCK), gives a key used since its last pass a
//! second chance, and among a sample of the others evicts the one closest to
//! a fresh state — a key at 99% of a monthly quota is the last to go.

mod budget;
mod collector;
mod entry;
mod evict;
pub mod key;
mod replication;
mod specs;
pub mod state_dir;
pub mod state_log;
mod table;
mod top;
mod types;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use table::{Found, Table};

pub use collector::StoreCollector;
pub use entry::{Entry, INLINE_BYTES, Snapshot, View};
use replication::ChangeQueue;
pub use replication::Changed;
pub use types::{Absorbed, Fence, Holding, Report, Seed, Stale, StoreStats, TopBy};

use crate::algorithm::{Cost, Decision, Nanos, Spec};

/// The table's and the rankings' hasher: keys come from clients, so it is
/// seeded randomly per process (flooding one bucket needs the seed);
/// foldhash is several times faster than std's SipHash on the 30–100-byte
/// keys Sluice sees. Seedable, so a simulation can fix the seed
/// ([`Store::hash_seeded`]) and replay the table's iteration order.
type Hasher = foldhash::fast::SeedableRandomState;

#[derive(Debug)]
pub struct Store {
    map: Table,
    /// Where the eviction hand stands in the table (`evict.rs`); a std
    /// `Mutex` because it is held for one turn of the hand, never across
    /// an await.
    hand: Mutex<table::Pos>,
    count: AtomicUsize,
    max_keys: usize,
    /// Bytes the entries hold, and `max_memory` (`budget.rs`).
    budget: budget::Budget,
    stats: StoreStats,
    /// Keys changed since the replicator last took them, each once. Only
    /// filled while `replicating`, so an unreplicated store never grows it.
    changed: Mutex<ChangeQueue>,
    /// Woken when the queue above stops being empty: an idle node's
    /// replicator sleeps on it instead of polling the queue every round.
    queued: tokio::sync::Notify,
    /// The view decisions must have been routed under (see
    /// [`Store::set_fence`]).
    fence: AtomicU64,
    replicating: std::sync::atomic::AtomicBool,
    /// Recent victims' fullness (ppm, a moving average): the eviction hand
    /// passes over keys much fuller than that. Keys of one age sit together
    /// in the eviction queue, so a sample of neighbours can be all warm keys; without
    /// this, a cohort of half-used keys would be evicted among themselves
    /// while a flood of nearly fresh keys waits further along.
    typical_victim: AtomicU64,
    /// Top keys by hits and by refusals, fed by decisions (`top.rs`).
    top: top::TopKeys,
}

impl Store {
    /// A store bounded by keys only (an edge's views of keys, tests).
    pub fn new(max_keys: usize) -> Store {
        Store::bounded(max_keys, usize::MAX)
    }

    /// A store of at most `max_keys` keys holding at most `max_memory`
    /// bytes (see [`Entry::footprint`]).
    pub fn bounded(max_keys: usize, max_memory: usize) -> Store {
        Store::presized(max_keys, max_memory, 0)
    }

    /// [`Store::bounded`], with the table allocated for
    /// `capacity` keys up front: no growth copies while it fills (and a
    /// measure of what entries allocate sees only the entries).
    pub fn presized(max_keys: usize, max_memory: usize, capacity: usize) -> Store {
        Store {
            map: Table::with_capacity(capacity),
            hand: Mutex::default(),
            count: AtomicUsize::new(0),
            max_keys: max_keys.max(1),
            budget: budget::Budget::new(max_memory),
            stats: StoreStats::default(),
            changed: Mutex::new(ChangeQueue::default()),
            queued: tokio::sync::Notify::new(),
            fence: AtomicU64::new(0),
            replicating: std::sync::atomic::AtomicBool::new(false),
            typical_victim: AtomicU64::new(0),
            top: top::TopKeys::new(top::DEFAULT_K),
        }
    }

    /// This (empty) store with its table and rankings hashed from `seed`,
    /// not a random seed, and its table in a fixed number of shards, not
    /// four per core: the deterministic simulator replays the same
    /// iteration orders (sweeps, transfers, replication rounds) on any
    /// machine. Production keeps the random seed.
    pub fn seeded(mut self, seed: u64) -> Store {
        debug_assert!(self.is_empty(), "reseeding a store that holds keys");
        let hasher = || Hasher::with_seed(seed, foldhash::SharedSeed::global_fixed());
        self.map = Table::with_shards(0, 8, hasher());
        if self.top.is_on() {
            self.top = top::TopKeys::with_hasher(top::DEFAULT_K, hasher);
        }
        self
    }

    /// This store keeps no top-key rankings (nobody asks it for its top
    /// keys): its decisions skip even the rankings' one load.
    pub fn unranked(mut self) -> Store {
        self.top = top::TopKeys::off();
        self
    }

    /// Keys in memory.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Decide one request for `key`, atomically.
    ///
    /// A peek or a deny-all spec on a key not in memory answers from a fresh
    /// state without storing anything: reads never grow the table.
    #[inline]
    pub fn decide(&self, key: &[u8], spec: &Spec, req: Cost, now: Nanos) -> Decision {
        self.decide_seeded(key, spec, req, now, Seed::Fresh)
    }

    /// [`Store::decide`], starting a key not in memory from `seed`.
    #[inline]
    pub fn decide_seeded(
        &self,
        key: &[u8],
        spec: &Spec,
        req: Cost,
        now: Nanos,
        seed: Seed,
    ) -> Decision {
        match self.decide_fenced(key, spec, req, now, seed, None) {
            Ok(d) => d,
            Err(Stale) => unreachable!("an unfenced decision is never stale"),
        }
    }

    /// The ownership barrier: from now on, decisions and reports routed
    /// under an older view than `view` change nothing (they are told
    /// [`Stale`] and route again). The check is made under the key's lock,
    /// so a decision routed before this node adopted a view either lands
    /// before a new owner takes the key's snapshot (and travels with it) or
    /// not at all — never after it, where it would be lost.
    pub fn set_fence(&self, view: u64) {
        self.fence.store(view, Ordering::SeqCst);
    }

    /// The view decisions must have been routed under now.
    pub fn fence(&self) -> u64 {
        self.fence.load(Ordering::SeqCst)
    }

    fn fenced(&self, fence: Option<Fence<'_>>) -> Result<(), Stale> {
        match fence {
            Some(f) if self.fence.load(Ordering::SeqCst) != f.view || !(f.present)() => Err(Stale),
            _ => Ok(()),
        }
    }

    /// Decide, starting a key not in memory from `seed`, as this node's own
    /// count (a copy decided on becomes this node's count: the caller owns
    /// the key and has taken what others held). `fence`: the view the
    /// decision was routed under (None: not a clustered decision).
    pub fn decide_fenced(
        &self,
        key: &[u8],
        spec: &Spec,
        req: Cost,
        now: Nanos,
        seed: Seed,
        fence: Option<Fence<'_>>,
    ) -> Result<Decision, Stale> {
        // The common case, a key in the table, is a method of its own: a
        // closure capturing seven values here made the compiler copy them
        // through the stack in halves and stall on the reload (a hot key's
        // decision went from 63 to 83 ns).
        let found = self
            .map
            .with_mut(key, |e| self.decide_entry(key, e, spec, req, now, fence));
        let (decision, grew) = match found {
            Some(done) => done?,
            None => return self.decide_absent(key, spec, req, now, seed, fence),
        };
        self.after_growth(grew, now);
        Ok(decision)
    }

    /// [`Store::decide_fenced`] for hits already promised (a tiered owner
    /// spending its own allotment): counted even if the state has nothing
    /// left — into debt, as an edge's report of the same spending would be
    /// — in the same lock step as the decision. After a key moves, its new
    /// owner's state may owe what the old one promised (counted as
    /// consumed, and counted again as edges report it); refusing the
    /// owner's own promised tokens then would leave the owner alone to pay
    /// it while every edge spends its full share (seen: the new owner
    /// admitted nothing for 3 s in the scale-out test).
    pub fn decide_promised(
        &self,
        key: &[u8],
        spec: &Spec,
        req: Cost,
        now: Nanos,
        fence: Option<Fence<'_>>,
    ) -> Result<Decision, Stale> {
        let found = self.map.with_mut(key, |e| {
            self.fenced(fence)?;
            let (decision, grew) = self.metered(key.len(), e, |e| {
                let mut d = e.decide(spec, req, now);
                if d.reason != crate::algorithm::Outcome::WithinLimit && req.hits <= spec.capacity()
                {
                    e.fold(req.hits, now);
                    d.reason = crate::algorithm::Outcome::WithinLimit;
                    d.remaining = 0;
                    d.retry_after = None;
                }
                d
            });
            if req.hits > 0 {
                self.changed(key, e);
            }
            Ok((decision, grew))
        });
        match found {
            Some(done) => {
                let (decision, grew) = done?;
                self.after_growth(grew, now);
                Ok(decision)
            }
            // Not here (evicted, or not yet taken over): a fresh count
            // decides, as for any check.
            None => self.decide_fenced(key, spec, req, now, Seed::Fresh, fence),
        }
    }

    /// [`Store::decide_fenced`] on a key in the table (found at once, or by
    /// the insert's lookup), under its shard's lock; and whether it grew.
    #[inline(always)]
    fn decide_entry(
        &self,
        key: &[u8],
        e: &mut Entry,
        spec: &Spec,
        req: Cost,
        now: Nanos,
        fence: Option<Fence<'_>>,
    ) -> Result<(Decision, bool), Stale> {
        self.fenced(fence)?;
        let before = counts(e);
        let (decision, grew) = self.metered(key.len(), e, |e| e.decide(spec, req, now));
        let after = counts(e);
        // Recorded under the shard's lock, so an eviction or removal
        // (which forgets the key after taking it out of the map) cannot
        // fall in between and leave a key that is gone in the rankings.
        if self.top.due(before, after) {
            self.top.record(key, before, after);
        }
        if req.hits > 0 {
            self.changed(key, e);
        }
        Ok((decision, grew))
    }

    /// [`Store::decide_fenced`] on a key not found in the table: answered
    /// from a fresh state, or inserted (unless another thread got there
    /// first).
    fn decide_absent(
        &self,
        key: &[u8],
        spec: &Spec,
        req: Cost,
        now: Nanos,
        seed: Seed,
        fence: Option<Fence<'_>>,
    ) -> Result<Decision, Stale> {
        let fresh = |spec: &Spec| match seed {
            Seed::Fresh => Entry::new(*spec, now),
            Seed::Consumed(tokens) => Entry::seeded(*spec, tokens, now),
        };
        if req.hits == 0 || spec.limit() == 0 {
            self.fenced(fence)?;
            return Ok(fresh(spec).decide(spec, req, now));
        }
        self.make_room(now, key.len());
        let (decision, grew) = self.map.entry(key, |found| match found {
            Found::Occupied(e) => self.decide_entry(key, e, spec, req, now, fence),
            Found::Vacant(v) => {
                self.fenced(fence)?;
                let mut e = fresh(spec);
                let before = counts(&e);
                let decision = e.decide(spec, req, now);
                self.changed(key, &mut e);
                self.charge(key.len(), &e);
                let after = counts(&e);
                self.inserted();
                v.insert(e);
                if self.top.due(before, after) {
                    self.top.record(key, before, after);
                }
                Ok((decision, true))
            }
        })?;
        self.after_growth(grew, now);
        Ok(decision)
    }

    /// A key goes into the table: counted before it is there (under its
    /// shard's lock), so an eviction that meets it never takes the count
    /// below the keys in the table.
    fn inserted(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Run `f` on the key's entry, creating it with `create` if missing.
    fn upsert<R>(
        &self,
        key: &[u8],
        now: Nanos,
        create: impl FnOnce() -> Entry,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> R {
        // `f` runs once, in whichever lock finds the key.
        let mut f = Some(f);
        let mut run = |e: &mut Entry| (f.take().expect("runs once"))(e);
        if let Some((r, grew)) = self
            .map
            .with_mut(key, |e| self.metered(key.len(), e, &mut run))
        {
            self.after_growth(grew, now);
            return r;
        }
        self.make_room(now, key.len());
        let (r, grew) = self.map.entry(key, |found| match found {
            Found::Occupied(e) => {
                let (r, grew) = self.metered(key.len(), e, &mut run);
                (r, grew)
            }
            Found::Vacant(v) => {
                let mut e = create();
                let r = run(&mut e);
                self.charge(key.len(), &e);
                self.inserted();
                v.insert(e);
                (r, true)
            }
        });
        self.after_growth(grew, now);
        r
    }

    /// Record an authoritative view of a key: `remaining` whole tokens left
    /// at `at` under `reset_gen` (what an owner answered, at an edge; see
    /// [`Entry::observe`]). `unreported` is what this edge spent on the
    /// key and has not yet reported, in tokens: folded into an entry this
    /// call creates — the owner's figure does not hold it, and an entry
    /// evicted meanwhile no longer does either (an existing entry already
    /// counted it when it was spent). Created and folded in one step, so no
    /// lease decides in between.
    pub fn observe(
        &self,
        key: &[u8],
        spec: &Spec,
        remaining: u64,
        reset_gen: u64,
        at: Nanos,
        unreported: u64,
    ) {
        let tokens = spec.capacity().saturating_sub(remaining);
        self.upsert(
            key,
            at,
            || {
                let mut e = Entry::seeded(*spec, tokens, at);
                e.observe(*spec, tokens, reset_gen, at);
                if unreported > 0 {
                    e.fold(unreported, at);
                }
                e
            },
            |e| e.observe(*spec, tokens, reset_gen, at),
        );
    }

    /// Apply an edge's report of lease spending, once per `(edge, seq)`, as
    /// this node's own count (see [`Store::decide_fenced`] for `fence`); a
    /// report from before the key's last reset is dropped.
    pub fn absorb_report(
        &self,
        key: &[u8],
        spec: &Spec,
        report: &Report<'_>,
        fence: Option<Fence<'_>>,
    ) -> Result<Absorbed, Stale> {
        let apply = |e: &mut Entry| {
            if report.reset_gen.is_some_and(|g| g < e.reset_gen()) {
                Absorbed::BeforeReset
            } else {
                match e.absorb_report(report.edge, report.seq, report.hits, report.at) {
                    Ok(()) => Absorbed::Applied,
                    Err(applied) => Absorbed::Duplicate { applied },
                }
            }
        };
        // A key in the table, found at once or by the insert's lookup.
        let absorb_existing = |e: &mut Entry| {
            self.fenced(fence)?;
            let (absorbed, grew) = self.metered(key.len(), e, apply);
            if absorbed == Absorbed::Applied {
                self.changed(key, e);
            }
            Ok((absorbed, grew))
        };
        if let Some(done) = self.map.with_mut(key, absorb_existing) {
            let (absorbed, grew) = done?;
            self.after_growth(grew, report.at);
            return Ok(absorbed);
        }
        self.make_room(report.at, key.len());
        let (absorbed, grew) = self.map.entry(key, |found| match found {
            Found::Occupied(e) => absorb_existing(e),
            Found::Vacant(v) => {
                self.fenced(fence)?;
                let mut e = Entry::new(*spec, report.at);
                let absorbed = apply(&mut e);
                self.changed(key, &mut e);
                self.charge(key.len(), &e);
                self.inserted();
                v.insert(e);
                Ok((absorbed, true))
            }
        })?;
        self.after_growth(grew, report.at);
        Ok(absorbed)
    }

    /// The key's reset generation (0 for a key not in memory).
    pub fn reset_gen(&self, key: &[u8]) -> u64 {
        self.map.with(key, |e| e.reset_gen()).unwrap_or(0)
    }

    /// Forget a key (an edge's view of it, after an admin reset).
    pub fn remove(&self, key: &[u8]) {
        if let Some(e) = self.map.remove(key) {
            self.discharge(key.len(), &e);
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.top.forget(key, counts(&e));
        }
    }

    /// Whole tokens the key has left at `now`, if it is in memory.
    pub fn remaining(&self, key: &[u8], now: Nanos) -> Option<(Spec, u64)> {
        self.map.with(key, |e| {
            let v = e.view(now);
            (v.spec, v.remaining)
        })
    }

    /// What the key owes at `now` ([`Entry::owed`]); 0 if not in memory.
    pub fn owed(&self, key: &[u8], now: Nanos) -> u64 {
        self.map.with(key, |e| e.owed(now)).unwrap_or(0)
    }

    /// The key's whole entry, to send to another node.
    pub fn snapshot(&self, key: &[u8]) -> Option<Snapshot> {
        self.map.with(key, |e| e.snapshot())
    }

    /// Merge another copy of a key's lineage (a replica, a handoff, a
    /// transferred or pulled state). `Holding::Owned` (a holder passed its
    /// own count to this node, the owner, in the view `fence` names): the
    /// entry is this node's count and is queued for its replica holder —
    /// unless the view changed meanwhile (another node may have taken the
    /// key from here since), when it merges as a copy. `Holding::Copy`: a
    /// new entry is a copy; an existing one stays what it was — a merge
    /// never makes a node the owner of a count it was not given.
    pub fn merge(
        &self,
        key: &[u8],
        snapshot: Snapshot,
        now: Nanos,
        holding: Holding,
        fence: Option<Fence<'_>>,
    ) {
        let owned = || holding == Holding::Owned && self.fenced(fence).is_ok();
        // The snapshot moves into whichever lock finds the key.
        let mut snapshot = Some(snapshot);
        let merge_existing = |e: &mut Entry, snapshot: Snapshot| {
            let ((), grew) = self.metered(key.len(), e, |e| e.merge(snapshot, now));
            if owned() {
                self.changed(key, e);
            } else if !e.is_copy() {
                // A copy merged into this node's own count may have raised
                // it (a late replica, a leaver's copy): its replica holder
                // must see it too, not wait for the key's next decision.
                self.changed_at(key, e, None);
            }
            grew
        };
        let existing = self.map.with_mut(key, |e| {
            merge_existing(e, snapshot.take().expect("merged once"))
        });
        if let Some(grew) = existing {
            self.after_growth(grew, now);
            return;
        }
        self.make_room(now, key.len());
        let grew = self.map.entry(key, |found| match found {
            Found::Occupied(e) => merge_existing(e, snapshot.take().expect("merged once")),
            Found::Vacant(v) => {
                let mut e = Entry::from_snapshot(snapshot.take().expect("merged once"), now);
                if owned() {
                    self.changed(key, &mut e);
                } else {
                    e.mark_copy();
                }
                self.charge(key.len(), &e);
                self.inserted();
                v.insert(e);
                true
            }
        });
        self.after_growth(grew, now);
    }

    /// Count `hits` promised away as consumed (tiered promises folded in
    /// before a key is passed on): added as they are, with no report slot —
    /// a fold is not a report that could be retried.
    pub fn fold(&self, key: &[u8], hits: u64, now: Nanos) {
        let grew = self.map.with_mut(key, |e| {
            let ((), grew) = self.metered(key.len(), e, |e| e.fold(hits, now));
            self.changed_at(key, e, None);
            grew
        });
        if let Some(grew) = grew {
            self.after_growth(grew, now);
        }
    }

    /// Pass a key's count on to its new owner: its snapshot, with the entry
    /// marked a copy in the same lock step (so nothing decided here can fall
    /// between the two), and whether it was this node's own count.
    pub fn take(&self, key: &[u8]) -> Option<(Snapshot, bool)> {
        self.map.with_mut(key, Entry::take)
    }

    /// Whether this node holds the key's count as its owner — not a
    /// replica, nor a copy left behind when the key moved away. A new owner
    /// takes a key from the others unless it does.
    pub fn holds_own(&self, key: &[u8]) -> bool {
        self.map.with(key, |e| !e.is_copy()).unwrap_or(false)
    }

    /// Every entry becomes a copy (this node rejoins as a new member: its
    /// counts are wherever the ring sent them while it was away).
    pub fn mark_all_copies(&self) {
        self.map.for_each_mut(Entry::mark_copy);
    }

    /// Every key in memory and whether it is a copy: the ownership
    /// transfer's one scan per view. Only the keys are copied under each
    /// shard's lock; the caller sorts them out afterwards.
    pub fn keys(&self) -> Vec<(Arc<[u8]>, bool)> {
        let mut keys = Vec::with_capacity(self.len());
        self.map
            .for_each(|k, e| keys.push((Arc::from(k), e.is_copy())));
        keys
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.map.contains(key)
    }

    /// Forget a key's consumption (an admin reset, at the key's owner):
    /// its reset generation grows, so every copy and report from before the
    /// reset is ignored wherever it arrives. Returns whether it existed.
    pub fn reset(&self, key: &[u8], now: Nanos, fence: Option<Fence<'_>>) -> Result<bool, Stale> {
        let reset = self.map.with_mut(key, |e| {
            self.fenced(fence)?;
            self.metered(key.len(), e, |e| e.reset(now));
            self.changed(key, e);
            Ok(())
        });
        match reset {
            Some(done) => done.map(|()| true),
            None => Ok(false),
        }
    }

    /// A key's spec and state, without consuming.
    pub fn inspect(&self, key: &[u8], now: Nanos) -> Option<View> {
        self.map.with(key, |e| e.view(now))
    }

    /// Remove every key whose state is back to fresh. Returns how many.
    pub fn sweep(&self, now: Nanos) -> usize {
        // Each removal is counted as it happens (under its shard's lock, as
        // an eviction's is), not once at the end: the sweep takes a while at
        // a million keys, and a count that lagged would have `make_room`
        // evict keys still counting for room the sweep had already made.
        let removed = self.map.retain(|k, e| {
            let keep = e.idle_after() > now;
            if !keep {
                self.discharge(k.len(), e);
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
        self.stats
            .expired
            .fetch_add(removed as u64, Ordering::Relaxed);
        if removed > 0 {
            self.top.retain(|k| self.map.contains(k));
        }
        removed
    }
}

/// An entry's `(hits, refusals)`, as the top-key rankings count them.
fn counts(e: &Entry) -> top::Counts {
    (e.hits(), e.refusals())
}

#[cfg(test)]
mod tests;
