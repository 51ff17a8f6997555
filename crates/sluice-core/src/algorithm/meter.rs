//! The fixed-point meter behind the token bucket and the leaky bucket.
//!
//! Both buckets are the same arithmetic seen from two sides: the token bucket
//! counts what has been *used* out of a capacity that refills; the leaky
//! bucket counts the *level* of a queue that drains. Either way the state is
//! one number that falls at a constant rate and rises with each admission.
//!
//! Fixed point: one token is `D` units (`D` = the duration in ns) and the
//! meter drains `L` units per nanosecond (`L` = the limit). Refill over any
//! whole number of nanoseconds is then exact — no rounding at all — and
//! `used` is an exact rational number of tokens, so a limit of 1 shared by 3
//! nodes (the lease of DESIGN §4) is representable. Only reported figures
//! round: `remaining` down, times up.
//!
//! `used` may exceed the capacity: consumption reported by other edges
//! ([`super::State::absorb`]) is debt the key pays back before admitting more.

use std::fmt::Debug;
use std::marker::PhantomData;

use super::arith::{ceil_div, div, sat64, wide};
use super::{Arithmetic, Nanos, Spec};

/// What distinguishes the two buckets built on the meter.
pub trait Flow: Clone + Debug + PartialEq + Eq {
    /// How long an admitted request waits, given the meter's units in use
    /// before it was admitted.
    fn delay(used: u128, spec: &Spec) -> Nanos;
}

/// Fixed-point consumption of a bucket: `used` units at time `last`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meter<F> {
    /// Units in use, as two halves: a `u128` field would align the whole
    /// state (and every store entry holding one) to 16 bytes.
    used: [u64; 2],
    last: Nanos,
    flow: PhantomData<F>,
}

impl<F> Meter<F> {
    pub(crate) fn from_parts(used: u128, last: Nanos) -> Self {
        Meter {
            used: split(used),
            last,
            flow: PhantomData,
        }
    }

    /// The time of the last update.
    pub fn last(&self) -> Nanos {
        self.last
    }

    /// Units in use (one token = `duration` units).
    pub fn used(&self) -> u128 {
        u128::from(self.used[0]) | (u128::from(self.used[1]) << 64)
    }

    fn set_used(&mut self, used: u128) {
        self.used = split(used);
    }
}

fn split(units: u128) -> [u64; 2] {
    [units as u64, (units >> 64) as u64]
}

/// Capacity in units.
fn cap(spec: &Spec) -> u128 {
    wide(spec.capacity(), spec.duration())
}

/// Nanoseconds for `units` to drain at `limit` units per ns, rounded up.
/// A zero limit never drains (only reachable for a deny-all spec).
pub(crate) fn drain_time(units: u128, spec: &Spec) -> Nanos {
    match spec.limit() {
        0 => 0,
        l => sat64(ceil_div(units, u128::from(l))),
    }
}

impl<F: Flow> Arithmetic for Meter<F> {
    fn fresh(_spec: &Spec, now: Nanos) -> Self {
        Meter {
            used: [0, 0],
            last: now,
            flow: PhantomData,
        }
    }

    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos {
        let t = now.max(self.last);
        // (t - last) × L is a product of two u64s: it fits in u128.
        let drained = wide(t - self.last, spec.limit());
        self.set_used(self.used().saturating_sub(drained));
        self.last = t;
        t
    }

    fn fits(&self, spec: &Spec, hits: u64, _t: Nanos) -> bool {
        self.used().saturating_add(wide(hits, spec.duration())) <= cap(spec)
    }

    fn take(&mut self, spec: &Spec, hits: u64, _t: Nanos) {
        self.set_used(self.used().saturating_add(wide(hits, spec.duration())));
    }

    fn drain(&mut self, spec: &Spec, _t: Nanos) {
        self.set_used(self.used().max(cap(spec)));
    }

    fn earliest(&self, spec: &Spec, hits: u64, t: Nanos) -> Nanos {
        let over = self.used().saturating_add(wide(hits, spec.duration())) - cap(spec);
        t.saturating_add(drain_time(over, spec))
    }

    fn remaining(&self, spec: &Spec, _t: Nanos) -> u64 {
        sat64(div(
            cap(spec).saturating_sub(self.used()),
            u128::from(spec.duration()),
        ))
    }

    fn reset_at(&self, spec: &Spec, t: Nanos) -> Nanos {
        t.saturating_add(drain_time(self.used(), spec))
    }

    fn delay(&self, spec: &Spec, _t: Nanos) -> Nanos {
        F::delay(self.used(), spec)
    }

    fn consumed(&self, spec: &Spec, _t: Nanos) -> u64 {
        sat64(ceil_div(self.used(), u128::from(spec.duration())))
    }

    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        if old.duration() == new.duration() {
            // Same unit: the exact fixed-point consumption carries over.
            Meter {
                used: self.used,
                last: t,
                flow: PhantomData,
            }
        } else {
            Self::with_consumed(new, self.consumed(old, t), t)
        }
    }

    fn merge(&mut self, other: &Self, spec: &Spec) {
        // Compare at the later of the two times; refill is monotone, so
        // "drain both to t, keep the larger" is a semilattice join.
        let mut b = other.clone();
        let t = self.last.max(b.last);
        self.settle(spec, t);
        b.settle(spec, t);
        self.set_used(self.used().max(b.used()));
    }
}
