//! Sliding window counter (Cloudflare's approximation): the previous aligned
//! window's count, weighted by how much of it still overlaps the sliding
//! window, plus the current window's count.
//!
//! With `e` = time elapsed in the current window and `D` the duration:
//! `estimate = prev × (D − e) / D + curr`.
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | current window start, `prev`, `curr` |
//! | admits `hits`   | iff `prev × (D − e) + (curr + hits) × D ≤ limit × D`: **no rounding** — the weighted count is compared as an exact rational |
//! | remaining       | `⌊limit − estimate⌋` (rounded down, so it never promises a hit that would be refused) |
//! | reset_at        | when the estimate reaches 0: end of the next window if `curr > 0`, else end of the current one if `prev > 0` |
//! | retry_after     | solved exactly: in this window, the first `e` with `prev × (D − e) ≤ (limit − curr − hits) × D`; if `curr + hits > limit`, the same equation in the next window with `prev = curr` |
//! | peek (`hits=0`) | admitted, nothing counted |
//! | drain           | on refusal, `curr += ⌊remaining⌋` (remaining becomes 0) |
//! | limit change    | same duration: counts kept; otherwise whole hits consumed go to the current window |
//! | merge           | both rolled to the later window, then the larger `prev` and the larger `curr` |
//! | absorb          | `curr += hits` in the window of `max(at, start)` |
//! | clock step back | `now` is raised to the window start |
//!
//! Accuracy: any aligned window admits at most `limit` (`curr ≤ limit`).
//! Against the exact sliding log, the estimate assumes the previous window's
//! hits were spread evenly over it. Under even traffic the two agree closely
//! (the `sliding_counter_vs_log` test measures and bounds the difference).
//! The adversarial worst case is the previous window's `limit` hits all at its
//! very end: the estimate decays linearly while the true count does not, so
//! near the end of the current window nearly `limit` more are admitted, and a
//! sliding span of one duration holds up to about `2 × limit`.

use super::arith::{ceil_div, div, sat64, wide};
use super::{Arithmetic, Nanos, Spec};

/// Sliding window counter state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    start: Nanos,
    prev: u64,
    curr: u64,
}

impl SlidingWindow {
    pub(crate) fn from_parts(start: Nanos, prev: u64, curr: u64) -> SlidingWindow {
        SlidingWindow { start, prev, curr }
    }

    /// `(start, prev, curr)`.
    pub fn parts(&self) -> (Nanos, u64, u64) {
        (self.start, self.prev, self.curr)
    }

    /// Start of the current aligned window.
    pub fn start(&self) -> Nanos {
        self.start
    }

    /// `prev × (D − e) + curr × D`: the estimate in units of 1/D hit.
    fn used(&self, spec: &Spec, t: Nanos) -> u128 {
        let d = spec.duration();
        let left = d - (t - self.start).min(d);
        wide(self.prev, left).saturating_add(wide(self.curr, d))
    }
}

impl Arithmetic for SlidingWindow {
    fn fresh(spec: &Spec, now: Nanos) -> Self {
        SlidingWindow {
            start: spec.window(now).0,
            prev: 0,
            curr: 0,
        }
    }

    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos {
        let t = now.max(self.start);
        let start = spec.window(t).0;
        if start != self.start {
            let adjacent = self.start.checked_add(spec.duration()) == Some(start);
            self.prev = if adjacent { self.curr } else { 0 };
            self.curr = 0;
            self.start = start;
        }
        t
    }

    fn fits(&self, spec: &Spec, hits: u64, t: Nanos) -> bool {
        self.used(spec, t)
            .saturating_add(wide(hits, spec.duration()))
            <= wide(spec.limit(), spec.duration())
    }

    fn take(&mut self, _spec: &Spec, hits: u64, _t: Nanos) {
        self.curr = self.curr.saturating_add(hits);
    }

    fn drain(&mut self, spec: &Spec, t: Nanos) {
        self.curr = self.curr.saturating_add(self.remaining(spec, t));
    }

    fn earliest(&self, spec: &Spec, hits: u64, _t: Nanos) -> Nanos {
        let d = spec.duration();
        let limit = spec.limit();
        // A window ending past u64::MAX ns is "never": no formula past it.
        let Some(next) = self.start.checked_add(d) else {
            return u64::MAX;
        };
        let need = u128::from(self.curr) + u128::from(hits);
        if need <= u128::from(limit) {
            // Fits in this window once enough of `prev` has slid out
            // (refused now, so prev > 0): prev × (D − e) ≤ room × D.
            let room = u128::from(limit) - need;
            let slack = (self.prev > 0).then(|| div(room * u128::from(d), u128::from(self.prev)));
            next - slack.map_or(d, |s| sat64(s).min(d))
        } else {
            // Only the next window can fit it, where `curr` becomes `prev`
            // (> limit − hits ≥ 0, so non-zero).
            let Some(after) = next.checked_add(d) else {
                return u64::MAX;
            };
            let slack = (self.curr > 0).then(|| div(wide(limit - hits, d), u128::from(self.curr)));
            after - slack.map_or(d, |s| sat64(s).min(d))
        }
    }

    fn remaining(&self, spec: &Spec, t: Nanos) -> u64 {
        let cap = wide(spec.limit(), spec.duration());
        sat64(div(
            cap.saturating_sub(self.used(spec, t)),
            u128::from(spec.duration()),
        ))
    }

    fn reset_at(&self, spec: &Spec, t: Nanos) -> Nanos {
        let d = spec.duration();
        if self.curr > 0 {
            self.start.saturating_add(d).saturating_add(d)
        } else if self.prev > 0 {
            self.start.saturating_add(d)
        } else {
            t
        }
    }

    fn consumed(&self, spec: &Spec, t: Nanos) -> u64 {
        sat64(ceil_div(self.used(spec, t), u128::from(spec.duration())))
    }

    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        if old.duration() == new.duration() {
            *self
        } else {
            Self::with_consumed(new, self.consumed(old, t), t)
        }
    }

    fn merge(&mut self, other: &Self, spec: &Spec) {
        let mut b = *other;
        let t = self.start.max(b.start);
        self.settle(spec, t);
        b.settle(spec, t);
        self.prev = self.prev.max(b.prev);
        self.curr = self.curr.max(b.curr);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, Cost, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn previous_window_slides_out_linearly() {
        let sp = Spec::new(
            Algorithm::SlidingWindowCounter,
            10,
            Period::Duration(10 * S),
            None,
        )
        .unwrap();
        let mut st = State::fresh(&sp, 0);
        assert!(st.decide(&sp, Cost::hits(10), 0).allowed());
        // At 15 s half of the previous window overlaps: estimate 5.
        let d = st.decide(&sp, Cost::hits(0), 15 * S);
        assert_eq!(d.remaining, 5);
        assert!(st.decide(&sp, Cost::hits(5), 15 * S).allowed());
        let d = st.decide(&sp, Cost::hits(1), 15 * S);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        // 10 × (10 − e)/10 + 5 + 1 ≤ 10  ⟺  e ≥ 6 s.
        assert_eq!(d.retry_after, Some(S));
        assert!(!st.decide(&sp, Cost::hits(1), 16 * S - 1).allowed());
        assert!(st.decide(&sp, Cost::hits(1), 16 * S).allowed());
    }
}
