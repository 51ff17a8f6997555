//! What the status page shows of each peer beyond its breaker: how long
//! forwards to it take lately, and how far behind the replicas this node
//! sends it are. Lock-free beside the peer's sender: a forward adds one
//! atomic update, a replication round one store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// No figure yet.
const NONE: u64 = u64::MAX;

/// One peer's figures.
#[derive(Debug)]
pub(super) struct Figures {
    /// Forward RPC durations (ns), exponentially weighted (the newest
    /// weighs 1/8): recent, with no window of samples to keep.
    forward_ns: AtomicU64,
    /// The last replication round to this peer (µs): from the oldest change
    /// the round carried to its confirmation (or its failure, after which
    /// the changes wait for the next round).
    replica_lag_us: AtomicU64,
}

impl Default for Figures {
    fn default() -> Figures {
        Figures {
            forward_ns: AtomicU64::new(NONE),
            replica_lag_us: AtomicU64::new(NONE),
        }
    }
}

/// A peer's figures as read, `None` where there is none yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerFigures {
    pub forward_latency: Option<Duration>,
    pub replication_lag: Option<Duration>,
}

impl Figures {
    pub(super) fn forwarded(&self, took: Duration) {
        let x = u64::try_from(took.as_nanos())
            .unwrap_or(NONE - 1)
            .min(NONE - 1);
        let _ = self
            .forward_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == NONE {
                    x
                } else {
                    old - old / 8 + x / 8
                })
            });
    }

    pub(super) fn replicated(&self, lag: Duration) {
        let us = u64::try_from(lag.as_micros())
            .unwrap_or(NONE - 1)
            .min(NONE - 1);
        self.replica_lag_us.store(us, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> PeerFigures {
        let get = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|v| *v != NONE);
        PeerFigures {
            forward_latency: get(&self.forward_ns).map(Duration::from_nanos),
            replication_lag: get(&self.replica_lag_us).map(Duration::from_micros),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_latency_follows_recent_calls_and_says_when_there_are_none() {
        let f = Figures::default();
        assert_eq!(f.read(), PeerFigures::default());
        f.forwarded(Duration::from_millis(8));
        assert_eq!(f.read().forward_latency, Some(Duration::from_millis(8)));
        // Eight times slower from now on: the mean moves an eighth of the
        // way per call, and most of it within 20 calls.
        for _ in 0..20 {
            f.forwarded(Duration::from_millis(64));
        }
        let now = f.read().forward_latency.unwrap();
        assert!(
            now > Duration::from_millis(55) && now < Duration::from_millis(64),
            "{now:?}"
        );
        f.replicated(Duration::from_micros(1_500));
        assert_eq!(f.read().replication_lag, Some(Duration::from_micros(1_500)));
    }
}
