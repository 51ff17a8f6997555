//! A per-peer circuit breaker.
//!
//! After `failures` consecutive failed calls the breaker opens: calls to
//! that peer fail at once (the edge falls back to a lease) instead of each
//! spending a deadline. After `cooldown` one call is let through as a probe
//! (half-open); its success closes the breaker, its failure opens it again.
//! Breakers, not gossip, decide that a peer is unreachable: gossip liveness is
//! transitive, gRPC reachability is not.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Whether a call may go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allow {
    Yes,
    /// The one call that tests a half-open breaker.
    Probe,
    No,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// The breaker's state, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    /// Its value in `sluice_breaker_state`: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::HalfOpen => 1,
            State::Open => 2,
        }
    }
}

#[derive(Debug)]
pub struct Breaker {
    /// A std Mutex: a few comparisons per call, never held across an await.
    phase: Mutex<Phase>,
    failures: u32,
    cooldown: Duration,
}

impl Breaker {
    pub fn new(failures: u32, cooldown: Duration) -> Breaker {
        Breaker {
            phase: Mutex::new(Phase::Closed { failures: 0 }),
            failures: failures.max(1),
            cooldown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn allow(&self) -> Allow {
        let mut phase = self.lock();
        match *phase {
            Phase::Closed { .. } => Allow::Yes,
            Phase::Open { until } if Instant::now() < until => Allow::No,
            Phase::Open { .. } | Phase::HalfOpen { probing: false } => {
                *phase = Phase::HalfOpen { probing: true };
                Allow::Probe
            }
            Phase::HalfOpen { probing: true } => Allow::No,
        }
    }

    /// The outcome of a call that went out.
    pub fn record(&self, success: bool) {
        let mut phase = self.lock();
        *phase = match (*phase, success) {
            (_, true) => Phase::Closed { failures: 0 },
            (Phase::Closed { failures }, false) if failures + 1 < self.failures => Phase::Closed {
                failures: failures + 1,
            },
            (_, false) => Phase::Open {
                until: Instant::now() + self.cooldown,
            },
        };
    }

    /// A call that went out was abandoned before its outcome was known
    /// (its caller stopped waiting): if it was the probe, let the next call
    /// probe instead. Counts as neither success nor failure.
    pub fn abandon(&self) {
        let mut phase = self.lock();
        if *phase == (Phase::HalfOpen { probing: true }) {
            *phase = Phase::HalfOpen { probing: false };
        }
    }

    pub fn state(&self) -> State {
        match *self.lock() {
            Phase::Closed { .. } => State::Closed,
            Phase::Open { .. } => State::Open,
            Phase::HalfOpen { .. } => State::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_probes_after_cooldown_closes_on_success() {
        let b = Breaker::new(3, Duration::from_millis(20));
        b.record(false);
        b.record(false);
        assert_eq!(b.allow(), Allow::Yes);
        b.record(true);
        for _ in 0..3 {
            b.record(false);
        }
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.allow(), Allow::No);
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.allow(), Allow::Probe);
        assert_eq!(b.allow(), Allow::No, "one probe at a time");
        b.record(false);
        assert_eq!(b.state(), State::Open, "a failed probe reopens");
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.allow(), Allow::Probe);
        b.record(true);
        assert_eq!(b.allow(), Allow::Yes);
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn an_abandoned_probe_frees_the_slot() {
        let b = Breaker::new(1, Duration::from_millis(1));
        b.record(false);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(b.allow(), Allow::Probe);
        assert_eq!(b.allow(), Allow::No, "one probe at a time");
        // The probe's caller gave up before it answered.
        b.abandon();
        assert_eq!(b.allow(), Allow::Probe, "the next call probes");
        b.record(true);
        assert_eq!(b.state(), State::Closed);
    }
}
