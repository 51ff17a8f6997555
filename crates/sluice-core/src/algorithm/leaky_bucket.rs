//! Leaky bucket (nginx `limit_req`): a queue draining at `limit / duration`
//! with room for `burst`; admitted requests are told how long to wait.
//!
//! | question        | answer |
//! |-----------------|--------|
//! | state           | [`Meter`]: the queue level (fixed point, 1 request = `duration` units) and the time of the last update |
//! | admits `hits`   | iff `level + hits ≤ burst` after draining to `now` |
//! | delay           | `⌈level_before / rate⌉`: the time for the queue ahead to drain, so admitted requests leave one emission interval apart; 0 with `nodelay` |
//! | nodelay         | admitted at once while the queue has room; the level still rises, so the *rate* is still enforced |
//! | remaining       | `⌊burst − level⌋` |
//! | reset_at        | when the queue is empty: `now + ⌈level / rate⌉` |
//! | retry_after     | `⌈(level + hits − burst) / rate⌉` |
//! | peek (`hits=0`) | admitted, nothing queued, no delay |
//! | drain           | on refusal, `level = burst` |
//! | limit change    | same duration: the level carries over exactly; otherwise whole requests, rounded up |
//! | merge           | both drained to the later time, the higher level wins |
//! | absorb          | `level += hits` (may exceed `burst`) |
//!
//! As a meter the leaky bucket admits exactly what the token bucket admits;
//! the difference is the `delay`, which shapes traffic instead of only
//! policing it. Unlike nginx, `burst` counts the request being served too,
//! so the default `burst = limit` admits `limit` requests at once.

use super::meter::{Flow, Meter, drain_time};
use super::{Nanos, Spec};

/// Leaky buckets delay each admitted request behind the queue ahead of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {}

impl Flow for Queue {
    fn delay(used: u128, spec: &Spec) -> Nanos {
        drain_time(used, spec)
    }
}

/// Leaky bucket state.
pub type LeakyBucket = Meter<Queue>;

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, Cost, Outcome, Period, State};
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn delays_space_admissions_one_interval_apart() {
        let sp = Spec::new(Algorithm::LeakyBucket, 10, Period::Duration(60 * S), None).unwrap();
        let mut st = State::fresh(&sp, 0);
        for i in 0..10 {
            let d = st.decide(&sp, Cost::hits(1), 0);
            assert!(d.allowed());
            assert_eq!(d.delay, i * 6 * S, "request {i}");
        }
        let d = st.decide(&sp, Cost::hits(1), 0);
        assert_eq!(d.reason, Outcome::LimitExceeded);
        assert_eq!(d.retry_after, Some(6 * S));
    }

    #[test]
    fn nodelay_admits_at_once_but_keeps_the_rate() {
        let sp = Spec::new(Algorithm::LeakyBucket, 2, Period::Duration(S), Some(4)).unwrap();
        let mut st = State::fresh(&sp, 0);
        let nodelay = Cost {
            hits: 1,
            drain_over_limit: false,
            nodelay: true,
        };
        for _ in 0..4 {
            let d = st.decide(&sp, nodelay, 0);
            assert!(d.allowed());
            assert_eq!(d.delay, 0);
        }
        let d = st.decide(&sp, nodelay, 0);
        assert_eq!(d.retry_after, Some(S / 2));
        assert!(st.decide(&sp, nodelay, S / 2).allowed());
    }
}
