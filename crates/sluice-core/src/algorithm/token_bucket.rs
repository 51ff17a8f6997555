//! Token bucket: refills continuously at `limit / duration` up to `burst`.
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | [`Meter`]: tokens used (fixed point, 1 token = `duration` units) and the time of the last update |
//! | admits `hits`   | iff `used + hits ≤ burst` after refilling to `now` |
//! | remaining       | `⌊burst − used⌋` whole tokens |
//! | reset_at        | when the bucket is full again: `now + ⌈used / rate⌉` |
//! | retry_after     | `⌈(used + hits − burst) / rate⌉`: the exact moment enough has refilled |
//! | peek (`hits=0`) | admitted, nothing consumed |
//! | drain           | on refusal, `used = burst` (remaining 0) |
//! | limit change    | same duration: `used` carries over exactly; otherwise whole tokens used, rounded up |
//! | merge           | both refilled to the later time, the larger `used` wins |
//! | absorb          | `used += hits` (may exceed `burst`: debt) |
//!
//! Refill is exact in the fixed point, so there is no rounding drift however
//! often a key is touched.

use super::meter::{Flow, Meter};
use super::{Nanos, Spec};

/// Token buckets never delay an admitted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refill {}

impl Flow for Refill {
    fn delay(_used: u128, _spec: &Spec) -> Nanos {
        0
    }
}

/// Token bucket state.
pub type TokenBucket = Meter<Refill>;

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, Cost, Decision, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    fn spec(limit: u64, dur: u64, burst: Option<u64>) -> Spec {
        Spec::new(Algorithm::TokenBucket, limit, Period::Duration(dur), burst).unwrap()
    }

    fn run(state: &mut State, spec: &Spec, hits: u64, now: Nanos) -> Decision {
        state.decide(spec, Cost::hits(hits), now)
    }

    #[test]
    fn refills_continuously_and_retries_exactly() {
        let sp = spec(10, 60 * S, None);
        let mut st = State::fresh(&sp, 0);
        for i in 0..10 {
            let d = run(&mut st, &sp, 1, 0);
            assert!(d.allowed());
            assert_eq!(d.remaining, 9 - i);
        }
        let d = run(&mut st, &sp, 1, 0);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        assert_eq!(d.retry_after, Some(6 * S));
        assert_eq!(d.reset_at, 60 * S);
        assert!(!run(&mut st, &sp, 1, 6 * S - 1).allowed());
        assert!(run(&mut st, &sp, 1, 6 * S).allowed());
    }

    #[test]
    fn burst_caps_the_bucket() {
        let sp = spec(1, S, Some(3));
        let mut st = State::fresh(&sp, 0);
        assert!(run(&mut st, &sp, 3, 100 * S).allowed());
        let d = run(&mut st, &sp, 4, 100 * S);
        assert_eq!(d.reason, Outcome::CostExceedsCapacity);
        assert_eq!(d.retry_after, None);
    }

    #[test]
    fn clock_step_back_never_refunds() {
        let sp = spec(1, S, None);
        let mut st = State::fresh(&sp, 10 * S);
        assert!(run(&mut st, &sp, 1, 10 * S).allowed());
        let d = run(&mut st, &sp, 1, 5 * S);
        assert!(!d.allowed());
        // Retry measured from the caller's clock: the bucket refills at 11 s.
        assert_eq!(d.retry_after, Some(6 * S));
    }
}
