//! A state's plain fields, for moving it between nodes (replicas, handoff,
//! pulls). The wire format lives with the peer protocol; this is the
//! algorithm's side of it: every state maps to its parts and back, and parts
//! that do not fit the spec's algorithm are refused, not guessed.

use super::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, Nanos, SlidingLog, SlidingWindow, Spec, State,
    TokenBucket,
};

/// The fields of a state, by algorithm family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateParts {
    /// Token and leaky buckets: fixed-point units used, at `last`.
    Meter {
        used: u128,
        last: Nanos,
    },
    Gcra {
        tat: Nanos,
    },
    FixedWindow {
        start: Nanos,
        count: u64,
    },
    SlidingWindowCounter {
        start: Nanos,
        prev: u64,
        curr: u64,
    },
    SlidingWindowLog {
        entries: Vec<(Nanos, u64)>,
    },
}

impl State {
    pub fn to_parts(&self) -> StateParts {
        match self {
            State::TokenBucket(m) => StateParts::Meter {
                used: m.used(),
                last: m.last(),
            },
            State::LeakyBucket(m) => StateParts::Meter {
                used: m.used(),
                last: m.last(),
            },
            State::Gcra(g) => StateParts::Gcra { tat: g.tat() },
            State::FixedWindow(w) => StateParts::FixedWindow {
                start: w.start(),
                count: w.count(),
            },
            State::SlidingWindowCounter(w) => {
                let (start, prev, curr) = w.parts();
                StateParts::SlidingWindowCounter { start, prev, curr }
            }
            State::SlidingWindowLog(l) => StateParts::SlidingWindowLog {
                entries: l.entries().collect(),
            },
        }
    }

    /// Rebuild a state of `spec`'s algorithm from its parts.
    pub fn from_parts(spec: &Spec, parts: StateParts) -> Result<State, String> {
        Ok(match (spec.algorithm(), parts) {
            (Algorithm::TokenBucket, StateParts::Meter { used, last }) => {
                State::TokenBucket(TokenBucket::from_parts(used, last))
            }
            (Algorithm::LeakyBucket, StateParts::Meter { used, last }) => {
                State::LeakyBucket(LeakyBucket::from_parts(used, last))
            }
            (Algorithm::Gcra, StateParts::Gcra { tat }) => State::Gcra(Gcra::from_tat(tat)),
            (Algorithm::FixedWindow, StateParts::FixedWindow { start, count }) => {
                State::FixedWindow(FixedWindow::from_parts(start, count))
            }
            (
                Algorithm::SlidingWindowCounter,
                StateParts::SlidingWindowCounter { start, prev, curr },
            ) => State::SlidingWindowCounter(SlidingWindow::from_parts(start, prev, curr)),
            (Algorithm::SlidingWindowLog, StateParts::SlidingWindowLog { entries }) => {
                State::SlidingWindowLog(Box::new(SlidingLog::from_entries(spec, entries)))
            }
            (algorithm, parts) => {
                return Err(format!(
                    "state: {parts:?} is not a {} state",
                    algorithm.name()
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Cost, Period};

    #[test]
    fn every_state_round_trips() {
        for algorithm in Algorithm::ALL {
            let spec = Spec::new(algorithm, 5, Period::Duration(1_000), None).unwrap();
            let mut state = State::fresh(&spec, 10);
            for t in [10, 11, 500] {
                state.decide(&spec, Cost::hits(2), t);
            }
            let back = State::from_parts(&spec, state.to_parts()).unwrap();
            assert_eq!(back, state, "{algorithm}");
        }
        let tb = Spec::new(Algorithm::TokenBucket, 5, Period::Duration(1_000), None).unwrap();
        assert!(State::from_parts(&tb, StateParts::Gcra { tat: 1 }).is_err());
    }
}
