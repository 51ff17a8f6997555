//! Shrinking: a failing schedule, cut down to fewer faults that still fail.
//!
//! Delta debugging over the fault list (Zeller's ddmin, complements only):
//! try dropping halves, then quarters, … then single faults, keeping any
//! smaller schedule that still fails. Each try is a whole run — in a
//! process of its own (the caller's `fails`), since a run's determinism
//! is per process.

use crate::schedule::Schedule;

/// The smallest schedule found that `fails`, starting from `failing`
/// (which must fail). `fails` is asked at most `budget` times.
pub fn shrink(
    failing: &Schedule,
    budget: usize,
    mut fails: impl FnMut(&Schedule) -> bool,
) -> Schedule {
    let mut best = failing.clone();
    let mut chunks = 2usize;
    let mut asked = 0;
    while best.faults.len() > 1 && asked < budget {
        let n = best.faults.len();
        let size = n.div_ceil(chunks);
        let mut shrunk = false;
        for start in (0..n).step_by(size) {
            if asked >= budget {
                break;
            }
            let mut candidate = best.clone();
            candidate.faults.drain(start..(start + size).min(n));
            asked += 1;
            if fails(&candidate) {
                best = candidate;
                chunks = (chunks - 1).max(2);
                shrunk = true;
                break;
            }
        }
        if !shrunk {
            if size == 1 {
                break;
            }
            chunks = (chunks * 2).min(n);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Fault;

    #[test]
    fn shrinks_to_the_faults_that_matter() {
        let mut s = Schedule::generate(1, 60);
        s.faults = (0..10)
            .map(|i| Fault::ClockStep {
                node: 0,
                at: 10_000 + i,
                by: i as i64,
            })
            .collect();
        // Fails while steps 3 and 7 are both there.
        let has = |s: &Schedule, by: i64| {
            s.faults
                .iter()
                .any(|f| matches!(f, Fault::ClockStep { by: b, .. } if *b == by))
        };
        let out = shrink(&s, 100, |c| has(c, 3) && has(c, 7));
        assert_eq!(out.faults.len(), 2);
        assert!(has(&out, 3) && has(&out, 7));
    }
}
