//! Leases: an allotment of a key's limit that an edge spends without asking
//! the owner (DESIGN §4). Fallback uses them when an owner is unreachable;
//! tiered mode spends them as allotments, whose owner-side ledger is
//! `tiered.rs`.
//!
//! **Sizing.** A lease is `1/N` of the limit: tokens start at
//! `min(limit, r + refill since t) / N` — `r` the last `remaining` the owner
//! told this edge, at `t` (0 for a key never seen) — refill at `rate / N`,
//! capacity `burst / N`. Rather than a second arithmetic, a lease is the
//! owner's state *as this edge last saw it* (seeded from `r` at `t` and
//! refilled by the algorithm itself) on which every hit costs `N`: `hits ≤
//! tokens / N` ⟺ `N × hits ≤ tokens`. The algorithms' exact fixed point keeps
//! fractions, so a limit of 1 split 3 ways is 1/3 of a token (which admits
//! nothing: a fleet-wide 1 cannot be split, and the lease says so).
//!
//! **Reports.** What an edge admits on a lease is reported to the key's
//! owner once it is reachable again, and the owner `absorb`s it. Each report
//! carries a sequence number from a counter that only grows (seeded from the
//! wall clock at boot, so a restarted edge continues above its old numbers —
//! and when the clock was behind then, the first owner to answer "duplicate"
//! to a report sent once says how far to jump: [`Leases::renumber`]); the
//! owner applies a report only if its number is above the last it applied
//! from that edge for that key. A report is retried, unchanged, until acknowledged —
//! never dropped, never counted twice. Hits admitted meanwhile wait for the
//! next report — but never for the key's next decision by an owner: an edge
//! delivers a key's unreported spending before it forwards that key again,
//! and an owner absorbs its own before it decides the key (else a new owner
//! after a failover decides on the count it took over and grants the
//! edges' lease spending a second time until the next report round).

pub use sluice_core::tiered;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::algorithm::{Cost, Decision, Nanos, Outcome, Spec};
use crate::store::{Seed, Store};

/// One report of lease consumption, as sent (and resent until acknowledged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub key: Arc<[u8]>,
    pub spec: Spec,
    pub seq: u64,
    pub hits: u64,
    pub at: Nanos,
    /// The key's reset generation these hits were spent under (an owner
    /// drops spending from before a reset); None when this edge never saw
    /// the key's generation (applied whatever it is).
    pub reset_gen: Option<u64>,
}

#[derive(Debug)]
struct Pending {
    spec: Spec,
    reset_gen: Option<u64>,
    /// Admitted since the report in flight was cut.
    unsent: u64,
    last_at: Nanos,
    /// Sent, not yet acknowledged: resent unchanged.
    in_flight: Option<Report>,
    /// How many times the report in flight was sent (see
    /// [`Leases::renumber`]).
    sendings: u32,
    /// The largest `N` a lease here spent at (each hit cost `N` tokens of
    /// the remembered answer); 1 for hits recorded without a lease.
    scale: u64,
    /// Some of the hits were admitted on a fallback lease (not a tiered
    /// allotment, which its owner holds as promised): an owner must hold
    /// them before it decides the key again.
    leased: bool,
}

impl Pending {
    /// Hits not yet acknowledged by the owner.
    fn hits(&self) -> u64 {
        self.unsent
            .saturating_add(self.in_flight.as_ref().map_or(0, |r| r.hits))
    }
}

/// What an edge keeps of its lease spending, under one lock.
#[derive(Default)]
struct Table {
    /// Unreported consumption by key.
    pending: HashMap<Arc<[u8]>, Pending>,
    /// Spending the owner acknowledged, in tokens (hits × `N`), kept for
    /// [`SETTLED_FOR`] after: an answer the owner gave before it absorbed
    /// the report can arrive after the acknowledgement (they travel on
    /// different calls), and if the key's remembered answer was evicted
    /// meanwhile, that stale answer alone would grant the spending again.
    /// Folded into any answer that re-creates the key meanwhile (a fresh
    /// answer too: counted twice, it refuses early for a moment, never
    /// admits twice). By key: `(tokens, until)`. Bounded: the oldest go
    /// first beyond `max_pending` keys.
    settled: HashMap<Arc<[u8]>, (u64, Nanos)>,
    /// `settled`'s keys, oldest first, each with the `until` it had when
    /// queued: one mark per key (a key settled again keeps its mark, which
    /// moves to the back when it reaches the front), so a steady stream of
    /// reports for few keys never crowds out the marks of others.
    order: VecDeque<(Arc<[u8]>, Nanos)>,
}

impl Table {
    /// Tokens this edge spent on `key` that the owner's answers may not
    /// hold: unacknowledged hits at their largest `N`, and recently
    /// acknowledged ones.
    fn unaccounted(&self, key: &[u8], now: Nanos) -> u64 {
        let pending = self
            .pending
            .get(key)
            .map_or(0, |p| p.hits().saturating_mul(p.scale));
        let settled = self
            .settled
            .get(key)
            .filter(|(_, until)| *until > now)
            .map_or(0, |(t, _)| *t);
        pending.saturating_add(settled)
    }

    fn settle(&mut self, key: &Arc<[u8]>, tokens: u64, now: Nanos, bound: usize) {
        let until = now.saturating_add(SETTLED_FOR);
        match self.settled.get_mut(key) {
            Some(e) => {
                let kept = if e.1 > now { e.0 } else { 0 };
                *e = (kept.saturating_add(tokens), until);
            }
            None => {
                self.settled.insert(key.clone(), (tokens, until));
                self.order.push_back((key.clone(), until));
            }
        }
        self.trim(now, bound);
    }

    /// Drop expired settled spending, and the oldest beyond `bound` keys.
    /// A front mark whose key was settled again since it was queued goes to
    /// the back with its new `until` (each settle moves a mark at most
    /// once: amortized O(1)); a mark whose key is gone (forgotten) leaves.
    fn trim(&mut self, now: Nanos, bound: usize) {
        while let Some((k, queued)) = self.order.front() {
            match self.settled.get(k).copied() {
                None => {}
                Some((_, until)) if until <= now || self.settled.len() > bound => {
                    self.settled.remove(k);
                }
                Some((_, until)) if until > *queued => {
                    if let Some((k, _)) = self.order.pop_front() {
                        self.order.push_back((k, until));
                    }
                    continue;
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
    }
}

/// How long acknowledged spending is still folded into a re-created
/// remembered answer: longer than any forward's wait (at most the
/// limiter's `MAX_BUDGET` or `cluster.forward_timeout`, itself at most
/// `config::MAX_FORWARD_TIMEOUT`, 10 s) and the answer's way back, so no
/// answer the owner gave before it absorbed a report arrives after
/// (asserted at compile time in `limiter/route.rs`).
pub const SETTLED_FOR: Nanos = 25_000_000_000;

/// An edge's leases and their unreported consumption. Cheap to clone.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Inner>,
}

struct Inner {
    /// Owners' states as this edge last saw them, spent at `N×` by leases.
    seen: Store,
    /// Unreported and recently settled consumption. A std Mutex: held for
    /// map operations and one decision on a remembered answer (never
    /// across an await), taken only by leases and the report flusher, and
    /// always before the remembered answers' shard locks — so nothing can
    /// be decided, observed or evicted between reading what is unreported
    /// and applying it.
    table: Mutex<Table>,
    /// How many of `table.pending`'s keys are `leased`, kept beside it (and
    /// changed under its lock) so that the owner's and the forward path's
    /// check for a key's unreported lease spending costs one atomic load,
    /// not the lock, while there is none — the rule outside faults, tiered
    /// mode's steady reports included.
    leased_keys: AtomicUsize,
    max_pending: usize,
    seq: AtomicU64,
    /// Woken when `table.pending` stops being empty: a quiet node's report
    /// task sleeps on it (see `server/tasks.rs`).
    begun: tokio::sync::Notify,
}

impl Leases {
    /// `max_keys` bounds both the keys remembered and the keys with
    /// unreported consumption, `max_memory` the bytes the remembered ones
    /// hold (a sliding log's seed holds its timestamps); `seq_base` should
    /// grow across restarts (the wall clock at boot, ns): where it does not
    /// (a clock behind), [`Leases::renumber`] catches up.
    pub fn new(max_keys: usize, max_memory: usize, seq_base: u64) -> Leases {
        Leases {
            inner: Arc::new(Inner {
                seen: Store::bounded(max_keys, max_memory).unranked(),
                table: Mutex::new(Table::default()),
                leased_keys: AtomicUsize::new(0),
                max_pending: max_keys.max(1),
                seq: AtomicU64::new(seq_base),
                begun: tokio::sync::Notify::new(),
            }),
        }
    }

    /// These (new) leases with their remembered answers hashed from
    /// `seed` (see [`Store::seeded`]): the simulator's replays.
    pub fn seeded(mut self, seed: u64) -> Leases {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            let seen = std::mem::replace(&mut inner.seen, Store::new(1));
            inner.seen = seen.seeded(seed);
        }
        self
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remember an owner's authoritative answer for `key` (under the key's
    /// reset generation `reset_gen`). It is merged with what this edge
    /// already spent on its lease and has not reported — the more consumed
    /// wins — so unreported spending is never granted a second time.
    ///
    /// The remembered answers are a cache bounded by keys and bytes, so a
    /// key with unreported spending can be evicted; the answer that
    /// re-creates it has that spending folded back in (at the largest `N`
    /// it was spent at, so never less than the lease consumed), and so has
    /// spending acknowledged since the key's last answer (see
    /// `Table::settled`).
    ///
    /// Always under the table's lock: an answer that skipped it could
    /// re-create an entry evicted after a lease spent on it, without that
    /// spending.
    pub fn observe(&self, key: &[u8], spec: &Spec, d: &Decision, reset_gen: u64, now: Nanos) {
        let mut table = self.table();
        table.trim(now, self.inner.max_pending);
        let unaccounted = table.unaccounted(key, now);
        self.inner
            .seen
            .observe(key, spec, d.remaining, reset_gen, now, unaccounted);
    }

    /// Forget what this edge knows of `key` and its unreported spending (an
    /// admin reset: that spending was before it).
    pub fn forget(&self, key: &[u8]) {
        let mut table = self.table();
        let gone = table.pending.remove(key);
        self.uncount(gone.as_ref());
        table.settled.remove(key);
        self.inner.seen.remove(key);
    }

    /// A pending key left the table (under its lock): one fewer `leased`.
    fn uncount(&self, gone: Option<&Pending>) {
        if gone.is_some_and(|p| p.leased) {
            self.inner.leased_keys.fetch_sub(1, Ordering::Release);
        }
    }

    /// The `remaining` the owner last told this edge, refilled since (and
    /// less what this edge's leases spent), if it saw the key at all.
    pub fn seen_remaining(&self, key: &[u8], now: Nanos) -> Option<u64> {
        self.inner.seen.remaining(key, now).map(|(_, r)| r)
    }

    /// Bytes the remembered keys hold ([`Store::memory_used`]).
    pub fn memory_used(&self) -> usize {
        self.inner.seen.memory_used()
    }

    /// Keys remembered (for metrics).
    pub fn remembered(&self) -> usize {
        self.inner.seen.len()
    }

    /// Decide on this edge's `1/n` lease. The answer's `remaining` is the
    /// lease's. A refusal because the table of unreported consumption is full
    /// keeps memory bounded without losing a count.
    pub fn decide(&self, key: &[u8], spec: &Spec, req: Cost, n: u64, now: Nanos) -> Decision {
        let n = n.max(1);
        let mut table = self.table();
        let full =
            table.pending.len() >= self.inner.max_pending && !table.pending.contains_key(key);
        let scaled = Cost {
            hits: if full {
                u64::MAX
            } else {
                req.hits.saturating_mul(n)
            },
            ..req
        };
        // A key never seen (or evicted) starts empty, less what this edge
        // already spent on it.
        let seed = Seed::Consumed(spec.capacity().saturating_add(table.unaccounted(key, now)));
        let mut d = self.inner.seen.decide_seeded(key, spec, scaled, now, seed);
        d.remaining /= n;
        if d.reason == Outcome::CostExceedsCapacity && req.hits <= spec.capacity() {
            // Within the limit's capacity but not the lease's: a refusal
            // with no exact time to retry, not an impossible request.
            d.reason = Outcome::LimitExceeded;
            d.retry_after = None;
        }
        if d.reason == Outcome::WithinLimit && req.hits > 0 {
            let p = self.queue(&mut table, key, spec, req.hits, n, now);
            if !p.leased {
                p.leased = true;
                self.inner.leased_keys.fetch_add(1, Ordering::Release);
            }
        }
        d
    }

    /// Queue `hits` admitted here for the next report to the key's owner
    /// (leases, and tiered mode's allotments). The table of unreported keys
    /// is bounded by the callers' admission checks; a key already queued
    /// always accumulates.
    pub fn record(&self, key: &[u8], spec: &Spec, hits: u64, now: Nanos) {
        let mut table = self.table();
        self.queue(&mut table, key, spec, hits, 1, now);
    }

    /// [`Leases::record`] for several keys at once, all or none: false,
    /// with nothing recorded, when the keys not yet queued would take the
    /// table past its bound. For spending this node did not admit itself
    /// (an app's report), whose keys no admission check of its own bounded.
    pub fn record_all(&self, items: &[(Vec<u8>, Spec, u64)], now: Nanos) -> bool {
        let mut table = self.table();
        let mut new: Vec<&[u8]> = items
            .iter()
            .map(|(k, _, _)| k.as_slice())
            .filter(|k| !table.pending.contains_key(*k))
            .collect();
        new.sort_unstable();
        new.dedup();
        if table.pending.len().saturating_add(new.len()) > self.inner.max_pending {
            return false;
        }
        for (key, spec, hits) in items {
            self.queue(&mut table, key, spec, *hits, 1, now);
        }
        true
    }

    /// [`Leases::record`], for hits that cost `scale` tokens each of the
    /// remembered answer; the key's entry, for the caller to mark.
    fn queue<'t>(
        &self,
        table: &'t mut Table,
        key: &[u8],
        spec: &Spec,
        hits: u64,
        scale: u64,
        now: Nanos,
    ) -> &'t mut Pending {
        // The generation this edge knows the key under, if it saw it. A
        // remembered answer created by a lease decision (the owner never
        // answered) says 0 without knowing: 0 is sent as unknown, which an
        // owner applies whatever its generation — spending from before a
        // reset counted (refusing early, never admitting twice) rather
        // than spending after one dropped.
        let reset_gen = self
            .inner
            .seen
            .contains(key)
            .then(|| self.inner.seen.reset_gen(key))
            .filter(|g| *g > 0);
        if table.pending.is_empty() {
            self.inner.begun.notify_one();
        }
        let p = table
            .pending
            .entry(Arc::from(key))
            .or_insert_with(|| Pending {
                spec: *spec,
                reset_gen,
                unsent: 0,
                last_at: now,
                in_flight: None,
                sendings: 0,
                scale: 1,
                leased: false,
            });
        p.scale = p.scale.max(scale);
        if reset_gen > p.reset_gen {
            // A newer generation: unsent spending from before the reset
            // would be dropped by the owner.
            if p.reset_gen.is_some() {
                p.unsent = 0;
            }
            p.reset_gen = reset_gen;
        }
        p.spec = *spec;
        p.unsent = p.unsent.saturating_add(hits);
        p.last_at = p.last_at.max(now);
        p
    }

    /// The reports to send now: each key's in-flight report, cutting a new
    /// one from unsent hits where none is in flight.
    pub fn reports(&self) -> Vec<Report> {
        self.table()
            .pending
            .iter_mut()
            .filter_map(|(key, p)| self.cut(key, p))
            .collect()
    }

    /// The report to send now for `key` alone, if this edge admitted hits
    /// on it on a fallback lease that the owner has not acknowledged: the
    /// one in flight, else one cut from the unsent hits, as
    /// [`Leases::reports`] would. An owner must hold them before it decides
    /// the key again (see `limiter/reports.rs`).
    pub fn report_for(&self, key: &[u8]) -> Option<Report> {
        if self.inner.leased_keys.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut table = self.table();
        let key = table.pending.get_key_value(key)?.0.clone();
        let p = table.pending.get_mut(&*key).filter(|p| p.leased)?;
        self.cut(&key, p)
    }

    /// A key's report: the one in flight, else a new one from its unsent
    /// hits (none when there are none).
    fn cut(&self, key: &Arc<[u8]>, p: &mut Pending) -> Option<Report> {
        if p.in_flight.is_none() && p.unsent > 0 {
            p.sendings = 0;
            p.in_flight = Some(Report {
                key: key.clone(),
                spec: p.spec,
                seq: self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1,
                hits: std::mem::take(&mut p.unsent),
                at: p.last_at,
                reset_gen: p.reset_gen,
            });
        }
        p.in_flight.clone()
    }

    /// These reports go to their owner now: each sending counts (see
    /// [`Leases::renumber`]).
    pub fn sending(&self, reports: &[Report]) {
        self.count_sendings(reports, |n| n.saturating_add(1));
    }

    /// Change the sendings of each of `reports` still in flight.
    fn count_sendings(&self, reports: &[Report], f: impl Fn(u32) -> u32) {
        let mut table = self.table();
        for report in reports {
            if let Some(p) = table.pending.get_mut(&report.key)
                && p.in_flight.as_ref().is_some_and(|r| r.seq == report.seq)
            {
                p.sendings = f(p.sendings);
            }
        }
    }

    /// These sendings of `reports` cannot have been applied (never sent:
    /// a breaker open, a queue full; or answered "retry", "not owner",
    /// refused): they do not count as sendings (see [`Leases::renumber`]).
    pub fn not_applied(&self, reports: &[Report]) {
        self.count_sendings(reports, |n| n.saturating_sub(1));
    }

    /// An owner answered `report` "duplicate": it applied up to `applied`
    /// from this edge for the key. If that answers the report's only
    /// sending, the report cannot have been applied before — this edge's
    /// numbering restarted below an earlier run's (its sequence base is
    /// the wall clock at boot, and the clock was behind then: an NTP step,
    /// a VM restored, a start before NTP synced). Acknowledged, its hits
    /// would be lost, and so would every later report's on keys this edge
    /// reported before. Instead the report, and every report cut from now
    /// on, is numbered above `applied`, and stays in flight to be sent
    /// again: returns true. Sent more than once (the duplicate is a
    /// retry's: an earlier sending was applied and its answer lost), or
    /// with no `applied` to go by (an owner before this rule): false —
    /// acknowledge it.
    pub fn renumber(&self, report: &Report, applied: u64) -> bool {
        let mut table = self.table();
        let Some(p) = table.pending.get_mut(&report.key) else {
            return false;
        };
        // Past half the number space is no run's numbering: an owner's
        // answer that absurd is not followed (the next number would wrap).
        if p.sendings != 1 || applied < report.seq || applied > u64::MAX / 2 {
            return false;
        }
        let Some(r) = p.in_flight.as_mut().filter(|r| r.seq == report.seq) else {
            return false;
        };
        self.inner.seq.fetch_max(applied, Ordering::Relaxed);
        r.seq = self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1;
        p.sendings = 0;
        tracing::warn!(
            applied,
            renumbered = r.seq,
            "a lease report was numbered below what its owner already applied from this node (its clock was behind when it started); renumbered"
        );
        true
    }

    /// The owner applied (or had already applied) this report, at `now`.
    pub fn acknowledge(&self, report: &Report, now: Nanos) {
        let mut table = self.table();
        let Some(p) = table.pending.get_mut(&report.key) else {
            return;
        };
        if p.in_flight.as_ref().is_none_or(|r| r.seq != report.seq) {
            return;
        }
        p.in_flight = None;
        let tokens = report.hits.saturating_mul(p.scale);
        if p.unsent == 0 {
            let gone = table.pending.remove(&report.key);
            self.uncount(gone.as_ref());
        }
        table.settle(&report.key, tokens, now, self.inner.max_pending);
    }

    /// Returns once spending waits to be reported where none did: the
    /// first key queued into an empty table wakes it (a permit is kept if
    /// nobody waits, so a wait may also return for an earlier one).
    pub async fn pending_begun(&self) {
        self.inner.begun.notified().await
    }

    /// No spending waits to be reported (none unsent, none in flight).
    pub fn nothing_pending(&self) -> bool {
        self.table().pending.is_empty()
    }

    /// Hits admitted on leases and not yet acknowledged by an owner.
    pub fn unreported(&self) -> u64 {
        self.table().pending.values().map(Pending::hits).sum()
    }
}

#[cfg(test)]
mod tests;
