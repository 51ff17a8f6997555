//! Exact reference models of each algorithm, written apart from the
//! implementation: rational numbers (`BigRational`), full histories where the
//! implementation keeps a summary, calendar windows from `chrono`, and
//! retry-after found by searching the model's own admission predicate rather
//! than by a formula. The tests compare the implementation against these
//! decision by decision.
#![allow(dead_code)]

pub mod traffic;

use chrono::{DateTime, Datelike, Duration as ChronoDuration, NaiveDate, TimeZone, Utc};
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};
use sluice::algorithm::{Algorithm, CalendarUnit, Outcome};

pub type Q = BigRational;

pub fn q(v: u64) -> Q {
    Q::from_integer(BigInt::from(v))
}

fn to_u64(v: &Q) -> u64 {
    v.to_integer().to_u64().unwrap_or(u64::MAX)
}

pub fn floor(v: &Q) -> u64 {
    if v.is_negative() {
        0
    } else {
        to_u64(&v.floor())
    }
}

pub fn ceil(v: &Q) -> u64 {
    if v.is_negative() {
        0
    } else {
        to_u64(&v.ceil())
    }
}

/// The period of a model spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MPeriod {
    Nanos(u64),
    Calendar(CalendarUnit),
}

/// A limit as the models see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MSpec {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: MPeriod,
    /// burst for buckets (default limit), limit for windows; 0 if limit is 0.
    pub capacity: u64,
}

impl MSpec {
    pub fn d(&self) -> u64 {
        match self.period {
            MPeriod::Nanos(d) => d,
            MPeriod::Calendar(_) => panic!("only fixed windows take calendar periods"),
        }
    }

    /// `[start, end)` of the window containing `t`, computed with chrono.
    pub fn window(&self, t: u64) -> (u64, u64) {
        match self.period {
            MPeriod::Nanos(d) => {
                let s = t / d * d;
                (s, s.saturating_add(d))
            }
            MPeriod::Calendar(unit) => calendar_window(unit, t),
        }
    }
}

fn calendar_window(unit: CalendarUnit, t: u64) -> (u64, u64) {
    let dt: DateTime<Utc> = Utc.timestamp_nanos(t as i64);
    let date = dt.date_naive();
    let midnight = |d: NaiveDate| d.and_hms_opt(0, 0, 0).unwrap().and_utc();
    let (start, end) = match unit {
        CalendarUnit::Minute | CalendarUnit::Hour | CalendarUnit::Day => {
            let len = match unit {
                CalendarUnit::Minute => 60,
                CalendarUnit::Hour => 3_600,
                _ => 86_400,
            };
            let secs = dt.timestamp();
            let s = secs - secs.rem_euclid(len);
            (
                Utc.timestamp_opt(s, 0).unwrap(),
                Utc.timestamp_opt(s + len, 0).unwrap(),
            )
        }
        CalendarUnit::Week => {
            let monday =
                date - ChronoDuration::days(i64::from(date.weekday().num_days_from_monday()));
            (midnight(monday), midnight(monday + ChronoDuration::days(7)))
        }
        CalendarUnit::Month => {
            let first = NaiveDate::from_ymd_opt(date.year(), date.month(), 1).unwrap();
            let next = if date.month() == 12 {
                NaiveDate::from_ymd_opt(date.year() + 1, 1, 1)
            } else {
                NaiveDate::from_ymd_opt(date.year(), date.month() + 1, 1)
            }
            .unwrap();
            (midnight(first), midnight(next))
        }
        CalendarUnit::Year => (
            midnight(NaiveDate::from_ymd_opt(date.year(), 1, 1).unwrap()),
            midnight(NaiveDate::from_ymd_opt(date.year() + 1, 1, 1).unwrap()),
        ),
    };
    let ns = |d: DateTime<Utc>| u64::try_from(d.timestamp_nanos_opt().unwrap()).unwrap_or(0);
    (ns(start), ns(end))
}

/// What a model answers, field for field with `sluice::algorithm::Decision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Out {
    pub reason: Outcome,
    pub remaining: u64,
    pub reset_at: u64,
    pub retry_after: Option<u64>,
    pub delay: u64,
}

/// One algorithm's exact model.
pub trait Model: Clone {
    fn new(spec: &MSpec, now: u64) -> Self;
    /// Bring the model to `now` (never backwards) and return the effective time.
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64;
    /// Would `hits` be admitted at the settled time `t`?
    fn admits(&self, spec: &MSpec, hits: u64, t: u64) -> bool;
    fn consume(&mut self, spec: &MSpec, hits: u64, t: u64);
    fn drain(&mut self, spec: &MSpec, t: u64);
    fn remaining(&self, spec: &MSpec, t: u64) -> u64;
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64;
    fn delay(&self, _spec: &MSpec, _t: u64) -> u64 {
        0
    }
    /// The documented limit-change rule of this algorithm.
    fn change(&mut self, old: &MSpec, new: &MSpec, t: u64);
}

/// Decide with the common rules, finding retry-after by search.
pub fn decide<M: Model>(
    m: &mut M,
    spec: &MSpec,
    hits: u64,
    drain: bool,
    nodelay: bool,
    now: u64,
) -> Out {
    let t = m.settle(spec, now);
    let out = |m: &M, reason, retry_after, delay| Out {
        reason,
        remaining: m.remaining(spec, t),
        reset_at: m.reset_at(spec, t),
        retry_after,
        delay,
    };
    if hits == 0 {
        return out(m, Outcome::WithinLimit, None, 0);
    }
    if hits > spec.capacity {
        if drain {
            m.drain(spec, t);
        }
        return out(m, Outcome::CostExceedsCapacity, None, 0);
    }
    if m.admits(spec, hits, t) {
        let delay = if nodelay { 0 } else { m.delay(spec, t) };
        m.consume(spec, hits, t);
        return out(m, Outcome::WithinLimit, None, delay);
    }
    if drain {
        m.drain(spec, t);
    }
    let at = earliest(m, spec, hits, t);
    out(m, Outcome::LimitExceeded, Some(at - now), 0)
}

/// The first time at which the model admits `hits`, by exponential then
/// binary search over its own (monotone) admission predicate.
pub fn earliest<M: Model>(m: &M, spec: &MSpec, hits: u64, t: u64) -> u64 {
    let ok = |at: u64| {
        let mut c = m.clone();
        let at = c.settle(spec, at);
        c.admits(spec, hits, at)
    };
    let (mut lo, mut step) = (t, 1u64);
    let mut hi = loop {
        let probe = t.saturating_add(step);
        if ok(probe) || probe == u64::MAX {
            break probe;
        }
        lo = probe;
        step = step.saturating_mul(2);
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) { hi = mid } else { lo = mid }
    }
    if !ok(hi) {
        hi = u64::MAX;
    }
    hi
}

// ---------------------------------------------------------------- token bucket

/// Tokens as an exact rational; refills `limit / d` per ns up to capacity.
#[derive(Clone, Debug)]
pub struct TokenBucketModel {
    pub tokens: Q,
    pub last: u64,
}

impl Model for TokenBucketModel {
    fn new(spec: &MSpec, now: u64) -> Self {
        TokenBucketModel {
            tokens: q(spec.capacity),
            last: now,
        }
    }
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64 {
        let t = now.max(self.last);
        let refill = q(t - self.last) * q(spec.limit) / q(spec.d());
        let full = q(spec.capacity);
        let sum = &self.tokens + refill;
        self.tokens = if sum > full { full } else { sum };
        self.last = t;
        t
    }
    fn admits(&self, _spec: &MSpec, hits: u64, _t: u64) -> bool {
        self.tokens >= q(hits)
    }
    fn consume(&mut self, _spec: &MSpec, hits: u64, _t: u64) {
        self.tokens -= q(hits);
    }
    fn drain(&mut self, _spec: &MSpec, _t: u64) {
        if self.tokens.is_positive() {
            self.tokens = Q::zero();
        }
    }
    fn remaining(&self, _spec: &MSpec, _t: u64) -> u64 {
        floor(&self.tokens)
    }
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64 {
        if spec.limit == 0 {
            return t;
        }
        let missing = q(spec.capacity) - &self.tokens;
        t.saturating_add(ceil(&(missing * q(spec.d()) / q(spec.limit))))
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, _t: u64) {
        let used = q(old.capacity) - &self.tokens;
        let used = if old.d() == new.d() {
            used
        } else {
            used.ceil()
        };
        self.tokens = q(new.capacity) - used;
    }
}

// ---------------------------------------------------------------- leaky bucket

/// The queue level as an exact rational, draining `limit / d` per ns.
#[derive(Clone, Debug)]
pub struct LeakyBucketModel {
    pub level: Q,
    pub last: u64,
}

impl Model for LeakyBucketModel {
    fn new(_spec: &MSpec, now: u64) -> Self {
        LeakyBucketModel {
            level: Q::zero(),
            last: now,
        }
    }
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64 {
        let t = now.max(self.last);
        let leaked = q(t - self.last) * q(spec.limit) / q(spec.d());
        let rest = &self.level - leaked;
        self.level = if rest.is_negative() { Q::zero() } else { rest };
        self.last = t;
        t
    }
    fn admits(&self, spec: &MSpec, hits: u64, _t: u64) -> bool {
        &self.level + q(hits) <= q(spec.capacity)
    }
    fn consume(&mut self, _spec: &MSpec, hits: u64, _t: u64) {
        self.level += q(hits);
    }
    fn drain(&mut self, spec: &MSpec, _t: u64) {
        if self.level < q(spec.capacity) {
            self.level = q(spec.capacity);
        }
    }
    fn remaining(&self, spec: &MSpec, _t: u64) -> u64 {
        floor(&(q(spec.capacity) - &self.level))
    }
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64 {
        if spec.limit == 0 {
            return t;
        }
        t.saturating_add(ceil(&(&self.level * q(spec.d()) / q(spec.limit))))
    }
    fn delay(&self, spec: &MSpec, t: u64) -> u64 {
        self.reset_at(spec, t) - t
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, _t: u64) {
        if old.d() != new.d() {
            self.level = self.level.ceil();
        }
    }
}

// ------------------------------------------------------------------------ GCRA

/// Times saturate at u64::MAX ("never"), as in the implementation.
fn never_past_u64(t: Q) -> Q {
    if t > q(u64::MAX) { q(u64::MAX) } else { t }
}

/// Virtual scheduling (ITU-T I.371) in rationals, with the documented rule
/// that each admission advances the TAT by its cost rounded up to a whole ns.
#[derive(Clone, Debug)]
pub struct GcraModel {
    pub tat: Q,
}

impl GcraModel {
    fn interval(spec: &MSpec, hits: u64) -> Q {
        q(hits) * q(spec.d()) / q(spec.limit)
    }
    fn base(&self, t: u64) -> Q {
        if self.tat > q(t) {
            self.tat.clone()
        } else {
            q(t)
        }
    }
}

impl Model for GcraModel {
    fn new(_spec: &MSpec, now: u64) -> Self {
        GcraModel { tat: q(now) }
    }
    fn settle(&mut self, _spec: &MSpec, now: u64) -> u64 {
        now
    }
    fn admits(&self, spec: &MSpec, hits: u64, t: u64) -> bool {
        let tolerance = q(spec.capacity) * q(spec.d()) / q(spec.limit);
        self.base(t) + Self::interval(spec, hits) - q(t) <= tolerance
    }
    fn consume(&mut self, spec: &MSpec, hits: u64, t: u64) {
        if spec.limit > 0 {
            self.tat = never_past_u64(self.base(t) + Self::interval(spec, hits).ceil());
        }
    }
    fn drain(&mut self, spec: &MSpec, t: u64) {
        if spec.limit == 0 {
            return;
        }
        let full = q(t) + Self::interval(spec, spec.capacity).ceil();
        if full > self.tat {
            self.tat = full;
        }
    }
    fn remaining(&self, spec: &MSpec, t: u64) -> u64 {
        let debt = (self.base(t) - q(t)) * q(spec.limit) / q(spec.d());
        floor(&(q(spec.capacity) - debt))
    }
    fn reset_at(&self, _spec: &MSpec, t: u64) -> u64 {
        floor(&self.base(t))
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, t: u64) {
        if old.limit == new.limit && old.d() == new.d() {
            return;
        }
        let debt_ns = self.base(t) - q(t);
        let new_debt = if old.d() == new.d() {
            (debt_ns * q(old.limit) / q(new.limit)).ceil()
        } else {
            // Consumption moves as a u64 of whole tokens, saturating: a
            // clock far behind a fast GCRA's TAT can exceed it.
            let tokens = never_past_u64((debt_ns * q(old.limit) / q(old.d())).ceil());
            (tokens * q(new.d()) / q(new.limit)).ceil()
        };
        self.tat = never_past_u64(q(t) + new_debt);
    }
}

// ---------------------------------------------------------------- fixed window

/// Hit counts per window, for every window ever seen.
#[derive(Clone, Debug)]
pub struct FixedWindowModel {
    pub counts: std::collections::BTreeMap<u64, u64>,
    pub floor: u64,
}

impl FixedWindowModel {
    fn count(&self, spec: &MSpec, t: u64) -> u64 {
        *self.counts.get(&spec.window(t).0).unwrap_or(&0)
    }
}

impl Model for FixedWindowModel {
    fn new(spec: &MSpec, now: u64) -> Self {
        FixedWindowModel {
            counts: Default::default(),
            floor: spec.window(now).0,
        }
    }
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64 {
        let t = now.max(self.floor);
        self.floor = spec.window(t).0;
        t
    }
    fn admits(&self, spec: &MSpec, hits: u64, t: u64) -> bool {
        self.count(spec, t) + hits <= spec.limit
    }
    fn consume(&mut self, spec: &MSpec, hits: u64, t: u64) {
        *self.counts.entry(spec.window(t).0).or_default() += hits;
    }
    fn drain(&mut self, spec: &MSpec, t: u64) {
        let c = self.counts.entry(spec.window(t).0).or_default();
        *c = (*c).max(spec.limit);
    }
    fn remaining(&self, spec: &MSpec, t: u64) -> u64 {
        spec.limit.saturating_sub(self.count(spec, t))
    }
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64 {
        spec.window(t).1
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, t: u64) {
        if old.period != new.period {
            let used = self.count(old, t);
            self.counts.clear();
            self.counts.insert(new.window(t).0, used);
            self.floor = new.window(t).0;
        }
    }
}

// ------------------------------------------------------ sliding window counter

/// Counts per aligned window for all history; the estimate in rationals.
#[derive(Clone, Debug)]
pub struct SlidingCounterModel {
    pub counts: std::collections::BTreeMap<u64, u64>,
    pub floor: u64,
}

impl SlidingCounterModel {
    pub fn estimate(&self, spec: &MSpec, t: u64) -> Q {
        let d = spec.d();
        let w = t / d;
        let cur = *self.counts.get(&w).unwrap_or(&0);
        let prev = if w == 0 {
            0
        } else {
            *self.counts.get(&(w - 1)).unwrap_or(&0)
        };
        let elapsed = t - w * d;
        q(prev) * q(d - elapsed) / q(d) + q(cur)
    }
}

impl Model for SlidingCounterModel {
    fn new(spec: &MSpec, now: u64) -> Self {
        SlidingCounterModel {
            counts: Default::default(),
            floor: spec.window(now).0,
        }
    }
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64 {
        let t = now.max(self.floor);
        self.floor = spec.window(t).0;
        t
    }
    fn admits(&self, spec: &MSpec, hits: u64, t: u64) -> bool {
        self.estimate(spec, t) + q(hits) <= q(spec.limit)
    }
    fn consume(&mut self, spec: &MSpec, hits: u64, t: u64) {
        *self.counts.entry(t / spec.d()).or_default() += hits;
    }
    fn drain(&mut self, spec: &MSpec, t: u64) {
        let left = self.remaining(spec, t);
        self.consume(spec, left, t);
    }
    fn remaining(&self, spec: &MSpec, t: u64) -> u64 {
        floor(&(q(spec.limit) - self.estimate(spec, t)))
    }
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64 {
        // The first window end after which the estimate is 0 for good.
        let d = spec.d();
        let w = t / d;
        if *self.counts.get(&w).unwrap_or(&0) > 0 {
            (w + 2) * d
        } else if w > 0 && *self.counts.get(&(w - 1)).unwrap_or(&0) > 0 {
            (w + 1) * d
        } else {
            t
        }
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, t: u64) {
        if old.d() != new.d() {
            let used = ceil(&self.estimate(old, t));
            self.counts.clear();
            self.counts.insert(t / new.d(), used);
            self.floor = new.window(t).0;
        }
    }
}

// --------------------------------------------------------- sliding window log

/// One timestamp per admitted hit, never trimmed.
#[derive(Clone, Debug)]
pub struct SlidingLogModel {
    pub hits: Vec<u64>,
    pub floor: u64,
}

impl SlidingLogModel {
    pub fn live(&self, spec: &MSpec, t: u64) -> u64 {
        self.hits
            .iter()
            .filter(|&&ts| ts.saturating_add(spec.d()) > t)
            .count() as u64
    }
}

impl Model for SlidingLogModel {
    fn new(_spec: &MSpec, _now: u64) -> Self {
        SlidingLogModel {
            hits: Vec::new(),
            floor: 0,
        }
    }
    fn settle(&mut self, spec: &MSpec, now: u64) -> u64 {
        let newest = self.hits.iter().copied().max();
        let t = newest.map_or(now, |n| now.max(n));
        // Entries that have expired never count again; forgetting them
        // is what makes "newest" the newest live entry.
        self.hits.retain(|&ts| ts.saturating_add(spec.d()) > t);
        t
    }
    fn admits(&self, spec: &MSpec, hits: u64, t: u64) -> bool {
        self.live(spec, t) + hits <= spec.limit
    }
    fn consume(&mut self, spec: &MSpec, hits: u64, t: u64) {
        self.hits.extend(std::iter::repeat_n(t, hits as usize));
        self.fold(spec);
    }
    fn drain(&mut self, spec: &MSpec, t: u64) {
        let left = spec.limit.saturating_sub(self.live(spec, t));
        self.consume(spec, left, t);
    }
    fn remaining(&self, spec: &MSpec, t: u64) -> u64 {
        spec.limit.saturating_sub(self.live(spec, t))
    }
    fn reset_at(&self, spec: &MSpec, t: u64) -> u64 {
        self.hits
            .iter()
            .max()
            .map_or(t, |n| n.saturating_add(spec.d()))
    }
    fn change(&mut self, old: &MSpec, new: &MSpec, t: u64) {
        if old.d() == new.d() {
            self.fold(new);
        } else {
            let used = self.live(old, t);
            self.hits = vec![t; used as usize];
        }
    }
}

impl SlidingLogModel {
    /// The documented bound: more distinct instants than max(limit, 1)
    /// (reachable through reported consumption and limit cuts) move the
    /// oldest instant's hits to the next oldest.
    fn fold(&mut self, spec: &MSpec) {
        loop {
            let mut instants: Vec<u64> = self.hits.clone();
            instants.sort_unstable();
            instants.dedup();
            if instants.len() <= spec.limit.max(1) as usize {
                break;
            }
            let (oldest, next) = (instants[0], instants[1]);
            for ts in self.hits.iter_mut().filter(|ts| **ts == oldest) {
                *ts = next;
            }
        }
    }
}

/// Absorb = consume at the settled time, without a check.
pub fn absorb<M: Model>(m: &mut M, spec: &MSpec, hits: u64, at: u64) {
    if hits > 0 {
        let t = m.settle(spec, at);
        m.consume(spec, hits, t);
    }
}
