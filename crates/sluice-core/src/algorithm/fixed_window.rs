//! Fixed window: at most `limit` hits per window; windows are aligned to the
//! epoch (`duration`) or to a UTC calendar unit (minute … year, ISO weeks).
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | the current window's start and its hit count |
//! | admits `hits`   | iff `count + hits ≤ limit` in the window containing `now` |
//! | remaining       | `limit − count` |
//! | reset_at        | the end of the current window |
//! | retry_after     | `window end − now`: the next window admits any `hits ≤ limit` |
//! | peek (`hits=0`) | admitted, nothing counted |
//! | drain           | on refusal, `count = limit` |
//! | limit change    | same period: the count is kept; otherwise whole hits consumed in the current window move to the new window containing `now` |
//! | merge           | the later window wins; in the same window, the larger count |
//! | absorb          | `count += hits` in the window of `max(at, window start)` (may exceed `limit`) |
//! | clock step back | `now` is raised to the window start: the current window never reopens an older one |
//!
//! Any aligned window admits at most `limit`; two adjacent windows can admit
//! `2 × limit` within one duration around their boundary (use a sliding
//! window when that matters).

use super::{Arithmetic, Nanos, Spec};

/// Fixed window state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    start: Nanos,
    count: u64,
}

impl FixedWindow {
    pub(crate) fn from_parts(start: Nanos, count: u64) -> FixedWindow {
        FixedWindow { start, count }
    }

    /// Start of the window the count belongs to.
    pub fn start(&self) -> Nanos {
        self.start
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

impl Arithmetic for FixedWindow {
    fn fresh(spec: &Spec, now: Nanos) -> Self {
        FixedWindow {
            start: spec.window(now).0,
            count: 0,
        }
    }

    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos {
        let t = now.max(self.start);
        let start = spec.window(t).0;
        if start != self.start {
            *self = FixedWindow { start, count: 0 };
        }
        t
    }

    fn fits(&self, spec: &Spec, hits: u64, _t: Nanos) -> bool {
        self.count.saturating_add(hits) <= spec.limit()
    }

    fn take(&mut self, _spec: &Spec, hits: u64, _t: Nanos) {
        self.count = self.count.saturating_add(hits);
    }

    fn drain(&mut self, spec: &Spec, _t: Nanos) {
        self.count = self.count.max(spec.limit());
    }

    fn earliest(&self, spec: &Spec, _hits: u64, t: Nanos) -> Nanos {
        spec.window(t).1
    }

    fn remaining(&self, spec: &Spec, _t: Nanos) -> u64 {
        spec.limit().saturating_sub(self.count)
    }

    fn reset_at(&self, spec: &Spec, _t: Nanos) -> Nanos {
        spec.window(self.start).1
    }

    fn consumed(&self, _spec: &Spec, _t: Nanos) -> u64 {
        self.count
    }

    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        if old.period() == new.period() {
            *self
        } else {
            Self::with_consumed(new, self.count, t)
        }
    }

    fn merge(&mut self, other: &Self, _spec: &Spec) {
        if (other.start, other.count) > (self.start, self.count) {
            *self = *other;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, CalendarUnit, Cost, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn windows_are_epoch_aligned() {
        let sp = Spec::new(Algorithm::FixedWindow, 2, Period::Duration(10 * S), None).unwrap();
        let mut st = State::fresh(&sp, 13 * S);
        assert!(st.decide(&sp, Cost::hits(2), 13 * S).allowed());
        let d = st.decide(&sp, Cost::hits(1), 15 * S);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        assert_eq!(d.retry_after, Some(5 * S));
        assert_eq!(d.reset_at, 20 * S);
        assert!(!st.decide(&sp, Cost::hits(1), 20 * S - 1).allowed());
        assert!(st.decide(&sp, Cost::hits(1), 20 * S).allowed());
    }

    #[test]
    fn calendar_month_resets_on_the_first() {
        let sp = Spec::new(
            Algorithm::FixedWindow,
            1,
            Period::Calendar(CalendarUnit::Month),
            None,
        )
        .unwrap();
        // 2024-02-29T12:00:00Z and 2024-03-01T00:00:00Z.
        let leap_day = 1_709_208_000 * S;
        let march = 1_709_251_200 * S;
        let mut st = State::fresh(&sp, leap_day);
        assert!(st.decide(&sp, Cost::hits(1), leap_day).allowed());
        let d = st.decide(&sp, Cost::hits(1), leap_day);
        assert_eq!(d.retry_after, Some(march - leap_day));
        assert!(st.decide(&sp, Cost::hits(1), march).allowed());
    }
}
