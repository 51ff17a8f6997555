//! GCRA (generic cell rate algorithm): a token bucket kept in one `u64`, the
//! theoretical arrival time (TAT).
//!
//! The emission interval is `T = duration / limit`; the key is "in debt" by
//! `TAT − now` nanoseconds, which is `(TAT − now) × limit / duration` tokens.
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | `tat`: epoch ns; `tat ≤ now` means a full bucket |
//! | admits `hits`   | iff `(max(tat, now) − now) × limit + hits × duration ≤ burst × duration` (exact, in u128) |
//! | on admission    | `tat = max(tat, now) + ⌈hits × duration / limit⌉` |
//! | remaining       | `⌊burst − debt⌋` with `debt = (tat − now) × limit / duration` |
//! | reset_at        | `max(tat, now)`: the bucket is full again at the TAT |
//! | retry_after     | `tat − ⌊(burst − hits) × duration / limit⌋ − now`, exact |
//! | peek (`hits=0`) | admitted, nothing consumed |
//! | drain           | on refusal, `tat = max(tat, now + ⌈burst × duration / limit⌉)` |
//! | limit change    | same limit and duration: the TAT is kept; same duration: the debt in fixed-point tokens is re-timed at the new rate; otherwise whole tokens, rounded up |
//! | merge           | the later TAT wins |
//! | absorb          | as an admission without the check (the TAT may run past the burst: debt) |
//! | clock step back | the debt `tat − now` grows: never a refund |
//!
//! **Exactness.** The admission test is exact, but the TAT is a whole number
//! of nanoseconds, so each admission's time cost `hits × duration / limit` is
//! rounded *up* to the next nanosecond. GCRA therefore admits exactly what
//! the token bucket admits whenever that cost is a whole number of ns (any
//! limit that divides the duration in ns, e.g. 100/min or 1000/s), and never
//! more in any case; otherwise each admission costs less than 1 ns of extra
//! refill (1 ns = `limit / duration` tokens). Keeping the fraction would need
//! more than one word of state — use the token bucket when that matters.
//! When `limit` exceeds the duration in ns (more than one token per ns),
//! `T < 1 ns` and nothing degenerates: no division by zero, no free
//! admissions, a burst of any size in one request is exact, and single hits
//! cost at least 1 ns each — capping one key at 10⁹ decisions per second,
//! far above what a node serves.

use super::arith::{ceil_div, div, sat64, wide};
use super::{Arithmetic, Nanos, Spec};

/// GCRA state: the theoretical arrival time in epoch nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    tat: Nanos,
}

impl Gcra {
    pub(crate) fn from_tat(tat: Nanos) -> Gcra {
        Gcra { tat }
    }

    pub fn tat(&self) -> Nanos {
        self.tat
    }

    fn debt(&self, t: Nanos) -> Nanos {
        self.tat.saturating_sub(t)
    }
}

/// Nanoseconds that `tokens` of refill take at the spec's rate, rounded up.
fn cost(tokens: u64, spec: &Spec) -> Nanos {
    match spec.limit() {
        0 => 0,
        l => sat64(ceil_div(wide(tokens, spec.duration()), u128::from(l))),
    }
}

impl Arithmetic for Gcra {
    fn fresh(_spec: &Spec, now: Nanos) -> Self {
        Gcra { tat: now }
    }

    fn settle(&mut self, _spec: &Spec, now: Nanos) -> Nanos {
        // GCRA keeps no last-update time: a clock stepping back only
        // increases the debt `tat − now`, which never refunds.
        now
    }

    fn fits(&self, spec: &Spec, hits: u64, t: Nanos) -> bool {
        let debt = wide(self.debt(t), spec.limit());
        debt.saturating_add(wide(hits, spec.duration())) <= wide(spec.capacity(), spec.duration())
    }

    fn take(&mut self, spec: &Spec, hits: u64, t: Nanos) {
        self.tat = self.tat.max(t).saturating_add(cost(hits, spec));
    }

    fn drain(&mut self, spec: &Spec, t: Nanos) {
        self.tat = self.tat.max(t.saturating_add(cost(spec.capacity(), spec)));
    }

    fn earliest(&self, spec: &Spec, hits: u64, _t: Nanos) -> Nanos {
        // (tat − t) × L + hits × D ≤ B × D  ⟺  t ≥ tat − (B − hits) × D / L.
        let slack = div(
            wide(spec.capacity() - hits, spec.duration()),
            u128::from(spec.limit()),
        );
        self.tat.saturating_sub(sat64(slack))
    }

    fn remaining(&self, spec: &Spec, t: Nanos) -> u64 {
        let cap = wide(spec.capacity(), spec.duration());
        let debt = wide(self.debt(t), spec.limit());
        sat64(div(cap.saturating_sub(debt), u128::from(spec.duration())))
    }

    fn reset_at(&self, _spec: &Spec, t: Nanos) -> Nanos {
        self.tat.max(t)
    }

    fn consumed(&self, spec: &Spec, t: Nanos) -> u64 {
        let debt = wide(self.debt(t), spec.limit());
        sat64(ceil_div(debt, u128::from(spec.duration())))
    }

    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        if old.limit() == new.limit() && old.duration() == new.duration() {
            return *self; // only the burst changed: same rate, same debt
        }
        if old.duration() == new.duration() && new.limit() > 0 {
            let units = wide(self.debt(t), old.limit());
            let debt = sat64(ceil_div(units, u128::from(new.limit())));
            return Gcra {
                tat: t.saturating_add(debt),
            };
        }
        Self::with_consumed(new, self.consumed(old, t), t)
    }

    fn merge(&mut self, other: &Self, _spec: &Spec) {
        self.tat = self.tat.max(other.tat);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, Cost, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn one_word_of_state() {
        assert_eq!(std::mem::size_of::<Gcra>(), 8);
    }

    #[test]
    fn matches_the_token_bucket_example() {
        let sp = Spec::new(Algorithm::Gcra, 10, Period::Duration(60 * S), None).unwrap();
        let mut st = State::fresh(&sp, 0);
        for _ in 0..10 {
            assert!(st.decide(&sp, Cost::hits(1), 0).allowed());
        }
        let d = st.decide(&sp, Cost::hits(1), 0);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        assert_eq!(d.retry_after, Some(6 * S));
        assert_eq!(d.reset_at, 60 * S);
        assert!(!st.decide(&sp, Cost::hits(1), 6 * S - 1).allowed());
        assert!(st.decide(&sp, Cost::hits(1), 6 * S).allowed());
    }

    #[test]
    fn limit_above_duration_in_ns_is_not_free() {
        // 4 × 10⁹ per millisecond: 4,000 tokens per nanosecond.
        let limit = 4_000_000_000;
        let sp = Spec::new(Algorithm::Gcra, limit, Period::Duration(1_000_000), None).unwrap();
        let mut st = State::fresh(&sp, 0);
        assert!(st.decide(&sp, Cost::hits(limit), 0).allowed());
        let d = st.decide(&sp, Cost::hits(4_000), 0);
        assert_eq!(d.retry_after, Some(1));
        assert!(st.decide(&sp, Cost::hits(4_000), 1).allowed());
        assert!(!st.decide(&sp, Cost::hits(1), 1).allowed());
    }
}
