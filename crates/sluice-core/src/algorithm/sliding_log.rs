//! Sliding window log: the exact count of hits admitted in the last
//! `duration`, kept as one entry per admission instant.
//!
//! A hit admitted at `ts` counts while `now < ts + duration`.
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | `(timestamp, hits)` entries, oldest first, and their total |
//! | admits `hits`   | iff `total + hits ≤ limit` after dropping expired entries |
//! | remaining       | `limit − total` |
//! | reset_at        | when the newest entry expires |
//! | retry_after     | when just enough of the oldest entries have expired: `tsₖ + duration − now` |
//! | peek (`hits=0`) | admitted, nothing logged |
//! | drain           | on refusal, log `limit − total` at `now` |
//! | limit change    | same duration: entries kept (folded to the new bound); otherwise whole hits consumed logged at `now` |
//! | merge           | per timestamp the larger count, entries older than one duration before the newest dropped (a join: commutative, associative, idempotent) |
//! | absorb          | log `hits` at `max(at, newest)` (the total may exceed `limit`) |
//! | clock step back | `now` is raised to the newest entry |
//!
//! **Memory.** One entry is 16 bytes (two `u64`), and hits admitted in the
//! same nanosecond share one entry. Admissions alone never make more than
//! `limit` entries (each is at least one hit). Reported consumption can, so a
//! key keeps at most `max(limit, 1)` entries: beyond that the oldest entry's
//! hits move to the next oldest. That changes no decision under the same
//! limit (while the moved hits would still have counted, the newest `limit`
//! entries already fill the limit) and only ever counts hits for longer,
//! never shorter. Worst case `16 × limit` bytes plus the `VecDeque` header:
//! 160 KB at the default bound of 10,000 — which is why `limit` is bounded
//! (`max_log_entries`) and why the sliding window counter exists.

use std::collections::VecDeque;

use super::arith::sat64;
use super::{Arithmetic, Nanos, Spec};

/// Queue capacity (entries) below which an emptied log keeps its allocation.
const SHRINK_ABOVE: usize = 64;

/// Sliding window log state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<(Nanos, u64)>,
    /// Sum of the entries' hits; u128 so it is exact for any entry count.
    total: u128,
}

impl SlidingLog {
    /// A log of `entries` (sorted by time here; equal times merged; folded
    /// to the spec's bound).
    pub(crate) fn from_entries(spec: &Spec, mut entries: Vec<(Nanos, u64)>) -> SlidingLog {
        entries.sort_unstable();
        let mut log = SlidingLog::default();
        for (ts, n) in entries {
            match log.entries.back_mut() {
                Some((last, m)) if *last == ts => *m = m.saturating_add(n),
                _ => log.entries.push_back((ts, n)),
            }
        }
        log.recount();
        log.fold(spec);
        log
    }

    /// The newest entry's timestamp.
    pub fn newest(&self) -> Option<Nanos> {
        self.entries.back().map(|e| e.0)
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (Nanos, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Bytes the log holds outside its struct: the queue's whole
    /// allocation (its capacity, not its length — what the allocator gave).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(Nanos, u64)>()
    }

    fn prune(&mut self, spec: &Spec, t: Nanos) {
        let d = spec.duration();
        while let Some(&(ts, n)) = self.entries.front() {
            if ts.saturating_add(d) > t {
                break;
            }
            self.entries.pop_front();
            self.total -= u128::from(n);
        }
        // A queue never gives memory back by itself: a key that once logged
        // 10,000 hits would hold 160 KB while logging one. Halve it once it
        // is a quarter full (amortised: a shrink follows at least as many
        // pops as it frees slots), so the store's byte budget sees the log
        // shrink as well as grow.
        let cap = self.entries.capacity();
        if cap > SHRINK_ABOVE && self.entries.len() < cap / 4 {
            self.entries.shrink_to(cap / 2);
        }
    }

    /// Keep at most `max(limit, 1)` entries by moving the oldest entry's hits
    /// to the next oldest (see Memory above).
    fn fold(&mut self, spec: &Spec) {
        let keep = usize::try_from(spec.limit().max(1)).unwrap_or(usize::MAX);
        if self.entries.len() <= keep {
            return;
        }
        while self.entries.len() > keep {
            if let Some((_, n)) = self.entries.pop_front()
                && let Some(next) = self.entries.front_mut()
            {
                next.1 = next.1.saturating_add(n);
            }
        }
        self.recount();
    }

    fn recount_after_add(&mut self, hits: u64) {
        match self.entries.back() {
            Some(&(_, n)) if n == u64::MAX => self.recount(),
            _ => self.total += u128::from(hits),
        }
    }

    fn recount(&mut self) {
        self.total = self.entries.iter().map(|e| u128::from(e.1)).sum();
    }
}

impl Arithmetic for SlidingLog {
    fn fresh(_spec: &Spec, _now: Nanos) -> Self {
        SlidingLog::default()
    }

    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos {
        let t = self.newest().map_or(now, |n| now.max(n));
        self.prune(spec, t);
        t
    }

    fn fits(&self, spec: &Spec, hits: u64, _t: Nanos) -> bool {
        self.total + u128::from(hits) <= u128::from(spec.limit())
    }

    fn take(&mut self, spec: &Spec, hits: u64, t: Nanos) {
        if hits == 0 {
            return;
        }
        match self.entries.back_mut() {
            Some((ts, n)) if *ts == t => *n = n.saturating_add(hits),
            _ => self.entries.push_back((t, hits)),
        }
        // An entry saturates at u64::MAX hits; recount keeps the total
        // equal to the entries in that corner too.
        self.recount_after_add(hits);
        self.fold(spec);
    }

    fn drain(&mut self, spec: &Spec, t: Nanos) {
        let left = sat64(u128::from(spec.limit()).saturating_sub(self.total));
        self.take(spec, left, t);
    }

    fn earliest(&self, spec: &Spec, hits: u64, t: Nanos) -> Nanos {
        // Refused: total + hits > limit. Expire the oldest entries until the
        // rest leave room; `hits ≤ limit` guarantees that happens.
        let need = self.total + u128::from(hits) - u128::from(spec.limit());
        let mut freed = 0u128;
        for &(ts, n) in &self.entries {
            freed += u128::from(n);
            if freed >= need {
                return ts.saturating_add(spec.duration());
            }
        }
        t
    }

    fn remaining(&self, spec: &Spec, _t: Nanos) -> u64 {
        sat64(u128::from(spec.limit()).saturating_sub(self.total))
    }

    fn reset_at(&self, spec: &Spec, t: Nanos) -> Nanos {
        self.newest()
            .map_or(t, |n| n.saturating_add(spec.duration()))
    }

    fn consumed(&self, _spec: &Spec, _t: Nanos) -> u64 {
        sat64(self.total)
    }

    /// What [`SlidingLog::settle`] would leave, without copying the queue:
    /// the total less the entries it would drop.
    fn consumed_at(&self, spec: &Spec, now: Nanos) -> u64 {
        let t = self.newest().map_or(now, |n| now.max(n));
        let d = spec.duration();
        let expired: u128 = self
            .entries
            .iter()
            .take_while(|&&(ts, _)| ts.saturating_add(d) <= t)
            .map(|&(_, n)| u128::from(n))
            .sum();
        sat64(self.total - expired)
    }

    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        if old.duration() == new.duration() {
            let mut s = self.clone();
            s.fold(new);
            s
        } else {
            Self::with_consumed(new, sat64(self.total), t)
        }
    }

    fn merge(&mut self, other: &Self, spec: &Spec) {
        let mut merged: VecDeque<(Nanos, u64)> =
            VecDeque::with_capacity(self.entries.len() + other.entries.len());
        let (mut a, mut b) = (
            self.entries.iter().peekable(),
            other.entries.iter().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&(ta, na)), Some(&&(tb, nb))) if ta == tb => {
                    a.next();
                    b.next();
                    (ta, na.max(nb))
                }
                (Some(&&x), Some(&&y)) => {
                    if x.0 < y.0 {
                        a.next();
                        x
                    } else {
                        b.next();
                        y
                    }
                }
                (Some(&&x), None) => {
                    a.next();
                    x
                }
                (None, Some(&&y)) => {
                    b.next();
                    y
                }
                (None, None) => break,
            };
            merged.push_back(next);
        }
        self.entries = merged;
        self.recount();
        if let Some(newest) = self.newest() {
            self.prune(spec, newest);
        }
        // No fold here: folding does not commute with the per-instant
        // maximum, and merge must be a join. A merged log holds at most the
        // entries of both inputs, all within one duration of the newest;
        // the next admission folds it back under the bound.
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, Cost, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn counts_exactly_over_the_last_duration() {
        let sp = Spec::new(
            Algorithm::SlidingWindowLog,
            3,
            Period::Duration(10 * S),
            None,
        )
        .unwrap();
        let mut st = State::fresh(&sp, 0);
        assert!(st.decide(&sp, Cost::hits(1), S).allowed());
        assert!(st.decide(&sp, Cost::hits(2), 4 * S).allowed());
        let d = st.decide(&sp, Cost::hits(2), 5 * S);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        // Needs both entries gone: the one at 4 s expires at 14 s.
        assert_eq!(d.retry_after, Some(9 * S));
        assert_eq!(st.decide(&sp, Cost::hits(1), 11 * S - 1).remaining, 0);
        assert_eq!(st.decide(&sp, Cost::hits(0), 11 * S).remaining, 1);
    }

    #[test]
    fn entries_stay_bounded_by_the_limit() {
        let sp = Spec::new(
            Algorithm::SlidingWindowLog,
            5,
            Period::Duration(10 * S),
            None,
        )
        .unwrap();
        let mut st = State::fresh(&sp, 0);
        for i in 0..100 {
            st.absorb(&sp, 1, i);
        }
        match &st {
            State::SlidingWindowLog(l) => assert_eq!(l.entries().count(), 5),
            _ => unreachable!(),
        }
    }

    /// `consumed_at` against settling a copy, for a log of `entries`
    /// under `limit` per `duration` seconds, asked at `now`.
    fn in_place_and_settled(
        entries: Vec<(Nanos, u64)>,
        limit: u64,
        duration: u64,
        now: Nanos,
    ) -> (u64, u64) {
        let sp = Spec::new(
            Algorithm::SlidingWindowLog,
            limit,
            Period::Duration(duration * S),
            None,
        )
        .unwrap();
        let log = SlidingLog::from_entries(&sp, entries);
        let mut copy = log.clone();
        let t = copy.settle(&sp, now);
        (log.consumed_at(&sp, now), copy.consumed(&sp, t))
    }

    proptest::proptest! {
        /// Eviction's in-place answer is what settling a copy gives, at
        /// any time: before, inside and past the entries' window.
        #[test]
        fn consumed_in_place_equals_settling_a_copy(
            entries in proptest::collection::vec((0u64..100, 1u64..=u64::MAX / 4), 0..40),
            limit in 1u64..=50,
            duration in 1u64..=60,
            now in 0u64..200,
        ) {
            let entries = entries.into_iter().map(|(t, n)| (t * S, n)).collect();
            let (in_place, settled) = in_place_and_settled(entries, limit, duration, now * S);
            proptest::prop_assert_eq!(in_place, settled);
        }

        /// The same at the edges: timestamps whose window end saturates at
        /// `u64::MAX`, entries of `u64::MAX` hits (a total past `u64`), and
        /// more entries than the limit (folded first).
        #[test]
        fn consumed_in_place_equals_settling_a_copy_at_the_edges(
            entries in proptest::collection::vec(
                (0u64..=100 * S, proptest::prop_oneof![1u64..=10, proptest::strategy::Just(u64::MAX)]),
                0..40,
            ),
            limit in 1u64..=8,
            duration in 1u64..=60,
            before_end in 0u64..=200 * S,
        ) {
            let entries = entries.into_iter().map(|(back, n)| (u64::MAX - back, n)).collect();
            let now = u64::MAX - before_end;
            let (in_place, settled) = in_place_and_settled(entries, limit, duration, now);
            proptest::prop_assert_eq!(in_place, settled);
        }
    }
}
