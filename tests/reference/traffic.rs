//! Generated traffic for the algorithm tests: specs, and traces of requests
//! with costs, peeks, drains, limit changes, reports and clock steps back.

use proptest::prelude::*;
use sluice::algorithm::{Algorithm, CalendarUnit, Period, Spec};

use super::{MPeriod, MSpec};

/// An epoch time in late 2023, so calendar windows are realistic.
pub const BASE: u64 = 1_700_000_000_000_000_000;

/// Raw limit parameters, before validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: MPeriod,
    pub burst: Option<u64>,
}

impl Params {
    pub fn spec(&self) -> Spec {
        let period = match self.period {
            MPeriod::Nanos(d) => Period::Duration(d),
            MPeriod::Calendar(u) => Period::Calendar(u),
        };
        Spec::new(self.algorithm, self.limit, period, self.burst)
            .expect("generated specs are valid")
    }

    pub fn mspec(&self) -> MSpec {
        let capacity = if self.limit == 0 {
            0
        } else if self.algorithm.is_bucket() {
            self.burst.unwrap_or(self.limit)
        } else {
            self.limit
        };
        MSpec {
            algorithm: self.algorithm,
            limit: self.limit,
            period: self.period,
            capacity,
        }
    }

    /// A typical span of time for this spec, to scale clock steps.
    pub fn span(&self) -> u64 {
        match self.period {
            MPeriod::Nanos(d) => d,
            MPeriod::Calendar(CalendarUnit::Minute) => 60_000_000_000,
            MPeriod::Calendar(CalendarUnit::Hour) => 3_600_000_000_000,
            MPeriod::Calendar(_) => 86_400_000_000_000,
        }
    }
}

pub fn durations() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1u64),
        Just(7),
        Just(1_000),
        1u64..=2_000,
        Just(1_000_000),
        Just(999_999_937),
        Just(60_000_000_000),
    ]
}

pub fn limits(algorithm: Algorithm) -> BoxedStrategy<u64> {
    let small = prop_oneof![Just(0u64), Just(1), 1u64..=5, 1u64..=20];
    if algorithm == Algorithm::SlidingWindowLog {
        prop_oneof![4 => small, 1 => 20u64..=60].boxed()
    } else {
        prop_oneof![4 => small, 1 => 20u64..=2_000, 1 => Just(3_000_000_007)].boxed()
    }
}

pub fn params(algorithm: Algorithm) -> BoxedStrategy<Params> {
    let period = if algorithm == Algorithm::FixedWindow {
        prop_oneof![
            3 => durations().prop_map(MPeriod::Nanos),
            1 => prop_oneof![
                Just(CalendarUnit::Minute),
                Just(CalendarUnit::Hour),
                Just(CalendarUnit::Day),
                Just(CalendarUnit::Week),
                Just(CalendarUnit::Month),
                Just(CalendarUnit::Year),
            ]
            .prop_map(MPeriod::Calendar),
        ]
        .boxed()
    } else {
        durations().prop_map(MPeriod::Nanos).boxed()
    };
    let burst = if algorithm.is_bucket() {
        proptest::option::weighted(0.4, 1u64..=30).boxed()
    } else {
        Just(None).boxed()
    };
    (limits(algorithm), period, burst)
        .prop_map(move |(limit, period, burst)| Params {
            algorithm,
            limit,
            period,
            burst,
        })
        .boxed()
}

/// One step of a trace. Clock steps and costs are raw numbers scaled by the
/// current spec when the trace runs.
#[derive(Clone, Debug)]
pub enum Op {
    Decide {
        step: Step,
        cost: Cost,
        drain: bool,
        nodelay: bool,
    },
    Absorb {
        step: Step,
        cost: Cost,
    },
    Change(Params),
}

/// How far the clock moves before an op.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    Same,
    Tiny(u64),
    /// A fraction (in 1/64ths, up to 3 spans) of the spec's span.
    Span(u64),
    /// Backwards by a fraction (1/64ths, up to one span) of the span.
    Back(u64),
}

#[derive(Clone, Copy, Debug)]
pub enum Cost {
    One,
    Peek,
    /// `n % (capacity + 3)`: anything up to just above the capacity.
    Any(u64),
}

pub fn steps(allow_back: bool) -> BoxedStrategy<Step> {
    let forward = prop_oneof![
        2 => Just(Step::Same),
        2 => (1u64..=3).prop_map(Step::Tiny),
        5 => (1u64..=192).prop_map(Step::Span),
    ];
    if allow_back {
        prop_oneof![8 => forward, 1 => (1u64..=64).prop_map(Step::Back)].boxed()
    } else {
        forward.boxed()
    }
}

pub fn costs() -> impl Strategy<Value = Cost> {
    prop_oneof![5 => Just(Cost::One), 1 => Just(Cost::Peek), 3 => any::<u64>().prop_map(Cost::Any)]
}

pub fn ops(algorithm: Algorithm, allow_back: bool, changes: bool) -> BoxedStrategy<Vec<Op>> {
    let decide = (
        steps(allow_back),
        costs(),
        proptest::bool::weighted(0.15),
        any::<bool>(),
    )
        .prop_map(|(step, cost, drain, nodelay)| Op::Decide {
            step,
            cost,
            drain,
            nodelay,
        });
    let absorb = (steps(allow_back), costs()).prop_map(|(step, cost)| Op::Absorb { step, cost });
    let op = if changes {
        prop_oneof![12 => decide, 2 => absorb, 1 => params(algorithm).prop_map(Op::Change)].boxed()
    } else {
        prop_oneof![12 => decide, 2 => absorb].boxed()
    };
    proptest::collection::vec(op, 1..60).boxed()
}

/// Apply a clock step.
pub fn advance(now: u64, step: Step, span: u64) -> u64 {
    match step {
        Step::Same => now,
        Step::Tiny(n) => now + n,
        Step::Span(n) => now + (u128::from(span) * u128::from(n) / 64) as u64,
        Step::Back(n) => now.saturating_sub((u128::from(span) * u128::from(n) / 64) as u64),
    }
}

/// Resolve a cost against a capacity.
pub fn hits(cost: Cost, capacity: u64) -> u64 {
    match cost {
        Cost::One => 1,
        Cost::Peek => 0,
        Cost::Any(n) => n % (capacity.min(1 << 40) + 3),
    }
}
