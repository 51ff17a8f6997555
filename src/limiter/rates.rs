//! Decision rates over the last minute, by status and by path, for the
//! status page.
//!
//! A decision adds one to a running total (one relaxed `fetch_add` on its
//! thread's stripe, where the batch's verdicts are final); a background task samples the totals
//! once a second into a ring of 61 samples. A rate is the difference
//! between now and the oldest sample over the time between them: no scan
//! and no lock per decision, and a reader costs a copy of two samples. The
//! forward latency histogram's sum and count are sampled alongside, so the
//! page shows the mean forward latency over the same minute.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

use serde::Serialize;

use super::types::{Path, Status};

const STATUSES: [Status; 3] = [Status::UnderLimit, Status::OverLimit, Status::Unavailable];
const PATHS: [Path; 4] = [
    Path::Owner,
    Path::LocalAllotment,
    Path::Slow,
    Path::Fallback,
];
const CELLS: usize = STATUSES.len() * PATHS.len();
/// Samples kept: a minute between the oldest and the newest.
const SAMPLES: usize = 61;

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    totals: [u64; CELLS],
    /// The forward latency histogram's (sum in seconds, count).
    forwards: (f64, u64),
}

/// Stripes of the running totals: a decision adds to its thread's stripe,
/// so cores deciding at once do not write one cache line; a sample sums
/// them.
const STRIPES: usize = 16;

/// One stripe of totals, on cache lines of its own.
#[repr(align(128))]
struct Stripe([AtomicU64; CELLS]);

thread_local! {
    /// This thread's stripe, handed out round-robin at its first decision.
    static STRIPE: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        (NEXT.fetch_add(1, Ordering::Relaxed) as usize) % STRIPES
    };
}

/// Running totals and their once-a-second samples.
pub struct Rates {
    totals: [Stripe; STRIPES],
    samples: Mutex<VecDeque<Sample>>,
}

/// Decisions per second over the window, and the mean forward latency.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RateSummary {
    /// Seconds the rates are over (up to 60; less just after start).
    pub window_s: f64,
    pub by_status: Vec<(&'static str, f64)>,
    pub by_path: Vec<(&'static str, f64)>,
    pub total_per_s: f64,
    /// Mean time of a forward batch to its owner, over the window (None:
    /// no forwards in it).
    pub forward_latency_ms: Option<f64>,
    pub forwards_per_s: f64,
}

fn cell(status: Status, path: Path) -> usize {
    let s = STATUSES.iter().position(|x| *x == status).unwrap_or(0);
    let p = PATHS.iter().position(|x| *x == path).unwrap_or(0);
    s * PATHS.len() + p
}

impl Rates {
    pub fn new() -> Rates {
        Rates {
            totals: std::array::from_fn(|_| Stripe(std::array::from_fn(|_| AtomicU64::new(0)))),
            samples: Mutex::new(VecDeque::with_capacity(SAMPLES + 1)),
        }
    }

    /// Count one decision.
    #[inline]
    pub fn count(&self, status: Status, path: Path) {
        let stripe = STRIPE.with(|s| *s);
        self.totals[stripe].0[cell(status, path)].fetch_add(1, Ordering::Relaxed);
    }

    fn now(&self, forwards: (f64, u64)) -> Sample {
        Sample {
            at: Instant::now(),
            totals: std::array::from_fn(|i| {
                self.totals
                    .iter()
                    .map(|s| s.0[i].load(Ordering::Relaxed))
                    .sum()
            }),
            forwards,
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take this second's sample (the background task, once a second).
    pub fn sample(&self, forwards: (f64, u64)) {
        let s = self.now(forwards);
        let mut samples = self.samples();
        samples.push_back(s);
        while samples.len() > SAMPLES {
            samples.pop_front();
        }
    }

    /// The rates from the oldest sample to now.
    pub fn summary(&self, forwards: (f64, u64)) -> RateSummary {
        let now = self.now(forwards);
        let Some(oldest) = self.samples().front().copied() else {
            return RateSummary::default();
        };
        let secs = now.at.duration_since(oldest.at).as_secs_f64().max(1e-3);
        let delta = |i: usize| now.totals[i].saturating_sub(oldest.totals[i]) as f64;
        let by_status = STATUSES
            .iter()
            .enumerate()
            .map(|(s, st)| {
                let n: f64 = (0..PATHS.len()).map(|p| delta(s * PATHS.len() + p)).sum();
                (st.name(), n / secs)
            })
            .collect();
        let by_path = PATHS
            .iter()
            .enumerate()
            .map(|(p, path)| {
                let n: f64 = (0..STATUSES.len())
                    .map(|s| delta(s * PATHS.len() + p))
                    .sum();
                (path.name(), n / secs)
            })
            .collect();
        let forwards = now.forwards.1.saturating_sub(oldest.forwards.1);
        RateSummary {
            window_s: secs,
            by_status,
            by_path,
            total_per_s: (0..CELLS).map(delta).sum::<f64>() / secs,
            forward_latency_ms: (forwards > 0)
                .then(|| (now.forwards.0 - oldest.forwards.0).max(0.0) * 1e3 / forwards as f64),
            forwards_per_s: forwards as f64 / secs,
        }
    }
}

impl Default for Rates {
    fn default() -> Self {
        Rates::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_differences_since_the_oldest_sample() {
        let r = Rates::new();
        assert_eq!(r.summary((0.0, 0)).total_per_s, 0.0, "no sample yet");
        r.sample((0.0, 0));
        for _ in 0..3 {
            r.count(Status::OverLimit, Path::Owner);
        }
        r.count(Status::UnderLimit, Path::Fallback);
        let s = r.summary((0.5, 2));
        let get = |v: &[(&str, f64)], k: &str| v.iter().find(|(n, _)| *n == k).unwrap().1;
        assert!(get(&s.by_status, "over_limit") > 0.0);
        assert!(get(&s.by_path, "fallback") > 0.0);
        assert_eq!(get(&s.by_path, "slow"), 0.0);
        let ratio = get(&s.by_status, "over_limit") / get(&s.by_status, "under_limit");
        assert!((ratio - 3.0).abs() < 1e-9);
        assert!((s.forward_latency_ms.unwrap() - 250.0).abs() < 1e-6);
    }
}
