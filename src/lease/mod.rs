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
//! boot time, so a restarted edge continues above its old numbers); the owner
//! applies a report only if its number is above the last it applied from that
//! edge for that key. A report is retried, unchanged, until acknowledged —
//! never dropped, never counted twice. Hits admitted meanwhile wait for the
//! next report.

pub mod tiered;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// The largest `N` a lease here spent at (each hit cost `N` tokens of
    /// the remembered answer); 1 for hits recorded without a lease.
    scale: u64,
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
    max_pending: usize,
    seq: AtomicU64,
}

impl Leases {
    /// `max_keys` bounds both the keys remembered and the keys with
    /// unreported consumption, `max_memory` the bytes the remembered ones
    /// hold (a sliding log's seed holds its timestamps); `seq_base` must
    /// grow across restarts (boot time in ns).
    pub fn new(max_keys: usize, max_memory: usize, seq_base: u64) -> Leases {
        Leases {
            inner: Arc::new(Inner {
                seen: Store::bounded(max_keys, max_memory).unranked(),
                table: Mutex::new(Table::default()),
                max_pending: max_keys.max(1),
                seq: AtomicU64::new(seq_base),
            }),
        }
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
        table.pending.remove(key);
        table.settled.remove(key);
        self.inner.seen.remove(key);
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
            self.queue(&mut table, key, spec, req.hits, n, now);
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

    /// [`Leases::record`], for hits that cost `scale` tokens each of the
    /// remembered answer.
    fn queue(&self, table: &mut Table, key: &[u8], spec: &Spec, hits: u64, scale: u64, now: Nanos) {
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
        let p = table
            .pending
            .entry(Arc::from(key))
            .or_insert_with(|| Pending {
                spec: *spec,
                reset_gen,
                unsent: 0,
                last_at: now,
                in_flight: None,
                scale: 1,
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
    }

    /// The reports to send now: each key's in-flight report, cutting a new
    /// one from unsent hits where none is in flight.
    pub fn reports(&self) -> Vec<Report> {
        self.table()
            .pending
            .iter_mut()
            .filter_map(|(key, p)| {
                if p.in_flight.is_none() && p.unsent > 0 {
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
            })
            .collect()
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
            table.pending.remove(&report.key);
        }
        table.settle(&report.key, tokens, now, self.inner.max_pending);
    }

    /// Hits admitted on leases and not yet acknowledged by an owner.
    pub fn unreported(&self) -> u64 {
        self.table().pending.values().map(Pending::hits).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Period};
    use crate::store::key;

    const S: u64 = 1_000_000_000;

    fn spec(limit: u64) -> Spec {
        Spec::new(
            Algorithm::TokenBucket,
            limit,
            Period::Duration(60 * S),
            None,
        )
        .unwrap()
    }

    fn admitted(l: &Leases, k: &[u8], sp: &Spec, n: u64, now: Nanos, tries: usize) -> usize {
        (0..tries)
            .filter(|_| l.decide(k, sp, Cost::hits(1), n, now).allowed())
            .count()
    }

    fn owner_said(remaining: u64) -> Decision {
        Decision {
            reason: Outcome::WithinLimit,
            limit: 90,
            remaining,
            reset_at: 0,
            retry_after: None,
            delay: 0,
        }
    }

    /// A remembered answer is a cache entry: evicted while its lease
    /// spending is unreported, the owner's next answer (which has not heard
    /// of that spending) re-creates it — with the spending folded back in,
    /// so the lease does not grant it a second time.
    #[test]
    fn an_evicted_answer_comes_back_with_its_unreported_spending() {
        let l = Leases::new(1, usize::MAX, 0);
        let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
        let sp = spec(90);
        l.observe(&a, &sp, &owner_said(30), 0, 0);
        assert_eq!(admitted(&l, &a, &sp, 3, 0, 6), 6, "6 of its share of 10");
        l.observe(&b, &sp, &owner_said(90), 0, 0);
        assert!(!l.inner.seen.contains(&a), "a evicted by the key bound");
        assert_eq!(l.unreported(), 6);
        // The owner still says 30 (the report has not reached it).
        l.observe(&a, &sp, &owner_said(30), 0, 0);
        assert_eq!(
            admitted(&l, &a, &sp, 3, 0, 10),
            4,
            "the share of 10 less the 6 already spent"
        );
    }

    /// An answer the owner gave before it absorbed a report can arrive
    /// after the report's acknowledgement (they travel on different calls),
    /// and several may be on their way; while any can still arrive
    /// ([`SETTLED_FOR`]), the acknowledged spending is folded into each
    /// answer that re-creates an evicted key.
    #[test]
    fn acknowledged_spending_survives_evictions_while_stale_answers_can_arrive() {
        let l = Leases::new(1, usize::MAX, 0);
        let (a, b) = (key::encode("n", "a"), key::encode("n", "b"));
        let sp = spec(90);
        l.observe(&a, &sp, &owner_said(30), 0, 0);
        assert_eq!(admitted(&l, &a, &sp, 3, 0, 6), 6);
        let sent = l.reports();
        l.acknowledge(&sent[0], 0);
        assert_eq!(l.unreported(), 0);
        // Two stale answers (from before the owner absorbed the 6), each
        // after an eviction.
        for _ in 0..2 {
            l.observe(&b, &sp, &owner_said(90), 0, 0);
            assert!(!l.inner.seen.contains(&a), "a evicted");
            l.observe(&a, &sp, &owner_said(30), 0, 0);
            assert_eq!(
                l.seen_remaining(&a, 0),
                Some(12),
                "30 less the 6 spent at N = 3"
            );
        }
        assert_eq!(admitted(&l, &a, &sp, 3, 0, 10), 4);
        // Past SETTLED_FOR no stale answer is on its way: evicted again,
        // the owner's own count (24: it holds the 6) is folded with only
        // the 4 spent since (unreported).
        let later = SETTLED_FOR + 1;
        l.observe(&b, &sp, &owner_said(90), 0, later);
        l.observe(&a, &sp, &owner_said(24), 0, later);
        assert_eq!(admitted(&l, &a, &sp, 3, later, 10), 4, "24 / 3 less the 4");
    }

    /// The settled spending of a key is kept its whole `SETTLED_FOR`
    /// however often other keys settle: one key reported again and again
    /// (tiered mode reports a hot key every round) keeps one mark, and
    /// never pushes a quiet key's spending out of a table with room for
    /// both. (With a mark per settle, bounded at 4 per key of room, the
    /// quiet key's spending went after 8 settles of the hot one.)
    #[test]
    fn a_hot_key_settling_often_never_crowds_out_a_quiet_one() {
        let (hot, quiet): (Arc<[u8]>, Arc<[u8]>) = (
            key::encode("n", "hot").into(),
            key::encode("n", "quiet").into(),
        );
        let mut t = Table::default();
        t.settle(&quiet, 5, 0, 2);
        for at in 1..=1_000 {
            t.settle(&hot, 1, at, 2);
        }
        assert_eq!(t.unaccounted(&quiet, 1_000), 5, "the quiet key's 5");
        assert_eq!(t.unaccounted(&hot, 1_000), 1_000);
        assert_eq!(t.order.len(), 2, "one mark per key");
        // Past its time the quiet key's spending goes; the hot key, settled
        // since, stays.
        t.trim(SETTLED_FOR + 1, 2);
        assert_eq!(t.unaccounted(&quiet, SETTLED_FOR + 1), 0);
        assert!(!t.settled.contains_key(&quiet), "gone from memory too");
        assert_eq!(t.unaccounted(&hot, SETTLED_FOR + 1), 1_000);
        // A third key in a table with room for two: the oldest goes.
        let third: Arc<[u8]> = key::encode("n", "third").into();
        t.settle(&quiet, 5, SETTLED_FOR + 2, 2);
        t.settle(&third, 7, SETTLED_FOR + 3, 2);
        assert_eq!(t.settled.len(), 2);
        assert_eq!(
            t.unaccounted(&hot, SETTLED_FOR + 3),
            0,
            "the oldest settled"
        );
        assert_eq!(t.unaccounted(&third, SETTLED_FOR + 3), 7);
    }

    /// A lease decision on a key the owner never answered for does not
    /// know its reset generation: its report says so (`None`, which an
    /// owner applies whatever its generation), not generation 0 (which an
    /// owner reset since would drop, losing the spending).
    #[test]
    fn a_report_for_a_key_never_answered_names_no_generation() {
        let l = Leases::new(100, usize::MAX, 0);
        let k = key::encode("n", "k");
        let sp = spec(90);
        assert_eq!(admitted(&l, &k, &sp, 3, 0, 1), 0, "starts empty");
        assert_eq!(admitted(&l, &k, &sp, 3, 2 * S, 1), 1, "refilled");
        assert_eq!(l.reports()[0].reset_gen, None);
    }

    /// The owners' answers an edge remembers are bounded by bytes too: a
    /// sliding log's seed holds timestamps, and `lease_max_keys` of them
    /// would be far more than their share of `limits.max_memory`.
    #[test]
    fn remembered_answers_stay_within_their_byte_budget() {
        const BUDGET: usize = 64 * 1024;
        let l = Leases::new(10_000, BUDGET, 0);
        let sp = Spec::new(
            Algorithm::SlidingWindowLog,
            1_000,
            Period::Duration(60 * S),
            None,
        )
        .unwrap();
        let spent = Decision {
            reason: Outcome::WithinLimit,
            limit: 1_000,
            remaining: 0,
            reset_at: 0,
            retry_after: None,
            delay: 0,
        };
        for i in 0..1_000 {
            let k = key::encode("log", &format!("k{i}"));
            l.observe(&k, &sp, &spent, 0, i);
            assert!(
                l.memory_used() <= BUDGET,
                "after {i} keys: {} bytes over {BUDGET}",
                l.memory_used()
            );
        }
        assert!(
            l.remembered() < 1_000,
            "evicted by bytes: {}",
            l.remembered()
        );
        assert!(l.memory_used() > BUDGET / 2, "and kept what fits");
    }

    #[test]
    fn a_lease_is_one_nth_of_what_the_owner_last_said() {
        let l = Leases::new(100, usize::MAX, 0);
        let k = key::encode("n", "k");
        let sp = spec(90);
        // The owner said 30 left at t=0: this edge's share is 10.
        let seen = Decision {
            reason: Outcome::WithinLimit,
            limit: 90,
            remaining: 30,
            reset_at: 0,
            retry_after: None,
            delay: 0,
        };
        l.observe(&k, &sp, &seen, 0, 0);
        assert_eq!(admitted(&l, &k, &sp, 3, 0, 20), 10);
        // It refills at rate/N: 90 per minute / 3 = 1 every 2 s.
        assert_eq!(admitted(&l, &k, &sp, 3, 2 * S, 5), 1);
    }

    #[test]
    fn a_key_never_seen_starts_empty_and_limit_one_cannot_be_split() {
        let l = Leases::new(100, usize::MAX, 0);
        let k = key::encode("n", "new");
        assert_eq!(admitted(&l, &k, &spec(90), 3, 0, 5), 0);
        assert_eq!(
            admitted(&l, &k, &spec(90), 3, 2 * S, 5),
            1,
            "refills from empty"
        );
        let one = key::encode("n", "one");
        let d = l.decide(&one, &spec(1), Cost::hits(1), 3, 600 * S);
        assert_eq!(
            d.reason,
            Outcome::LimitExceeded,
            "1/3 of a token never admits"
        );
    }

    #[test]
    fn reports_are_resent_unchanged_until_acknowledged() {
        let l = Leases::new(100, usize::MAX, 1_000);
        let k = key::encode("n", "k");
        let sp = spec(600);
        l.decide(&k, &sp, Cost::hits(0), 3, 0); // a peek reports nothing
        assert!(
            !l.decide(&k, &sp, Cost::hits(1), 3, 0).allowed(),
            "starts empty"
        );
        assert!(
            l.reports().is_empty(),
            "nothing admitted, nothing to report"
        );
        assert_eq!(admitted(&l, &k, &sp, 3, 300 * S, 4), 4);
        let first = l.reports();
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].seq, first[0].hits), (1_001, 4));
        // Admitted while the report is in flight: held for the next one.
        assert_eq!(admitted(&l, &k, &sp, 3, 300 * S, 2), 2);
        assert_eq!(l.reports(), first, "a retry is the same report");
        l.acknowledge(&first[0], 0);
        let second = l.reports();
        assert_eq!((second[0].seq, second[0].hits), (1_002, 2));
        assert_eq!(l.unreported(), 2);
        l.acknowledge(&second[0], 0);
        assert!(l.reports().is_empty());
        assert_eq!(l.unreported(), 0);
    }
}
