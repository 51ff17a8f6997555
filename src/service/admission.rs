//! Admission: the bounds a check call meets before any front end decides
//! it — the items in one call (`limits.max_batch`) and the node's calls in
//! progress (`limits.max_in_flight_checks`).
//!
//! One budget for the whole node: the v1 API, the Envoy front and the HTTP
//! check endpoint each hold a clone of one [`Admission`], so a node's
//! checks in progress are bounded whichever front they arrive by (a budget
//! per front would let a node run three times its bound). A call that finds
//! no room is answered at once, never queued: its caller may already have
//! given up, and a queue is the unbounded memory the bound exists to
//! prevent. How each front says "overloaded" or "too many" is its own
//! convention; what is counted, and when, is decided here once.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::threads::Threads;

/// The node's admission bounds, shared by every front end (clone it).
#[derive(Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    max_in_flight: usize,
    /// Places on the bulk lane (`bulk.rs`), a share of the calls in
    /// progress: its threads run at the lowest priority, so a lane starved
    /// by small calls must not hold every permit and have small calls
    /// refused too.
    bulk: Arc<Semaphore>,
    max_bulk: usize,
    /// Where the bulk lane's jobs run: its own threads, or inline (the
    /// simulator; see `crate::threads`).
    lane: Threads,
    max_batch: usize,
    metrics: Arc<Metrics>,
}

/// A check call in progress: holds its place in the budget until dropped,
/// and is counted in `sluice_checks_in_flight` for exactly that long (the
/// gauge rises and falls with the permits, so it reads the calls in
/// progress now, not at the last call's start).
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A call with more items than `limits.max_batch`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: at most {max} per call, got {got}")]
pub struct TooMany {
    /// The wire field holding the items (`requests`, `descriptors`).
    pub field: &'static str,
    pub max: usize,
    pub got: usize,
}

/// Every check call in progress: beyond `max` a call is refused at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "overloaded: {max} check calls in progress (limits.max_in_flight_checks); try again shortly"
)]
pub struct Overloaded {
    pub max: usize,
}

impl Admission {
    pub fn new(limits: &Limits, metrics: Arc<Metrics>) -> Admission {
        let max_in_flight = limits.max_in_flight_checks.max(1);
        let max_bulk = super::bulk::MAX_JOBS.min(max_in_flight);
        Admission {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            bulk: Arc::new(Semaphore::new(max_bulk)),
            max_bulk,
            lane: Threads::Own,
            max_batch: limits.max_batch,
            metrics,
        }
    }

    /// These bounds, with the bulk lane's jobs run where `threads` says.
    pub fn on(mut self, threads: Threads) -> Admission {
        self.lane = threads;
        self
    }

    /// Where the bulk lane's jobs run.
    pub fn lane(&self) -> Threads {
        self.lane
    }

    /// Refuse a call of more than `max_batch` items in `field`, counted as
    /// `sluice_resource_exhausted_total{resource=field}`.
    pub fn batch(&self, field: &'static str, items: usize) -> Result<(), TooMany> {
        if items <= self.max_batch {
            return Ok(());
        }
        self.metrics.resources.exhausted(field);
        Err(TooMany {
            field,
            max: self.max_batch,
            got: items,
        })
    }

    /// A place in the node's budget of check calls in progress, or — when
    /// none is left — the refusal, counted in
    /// `sluice_overloaded_checks_total` and as
    /// `sluice_resource_exhausted_total{resource="in_flight_checks"}`.
    pub fn admit(&self) -> Result<Admitted, Overloaded> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.metrics.in_flight.inc();
                Ok(Admitted {
                    _permit: permit,
                    gauge: self.metrics.in_flight.clone(),
                })
            }
            Err(_) => {
                self.metrics.overloaded.inc();
                self.metrics.resources.exhausted("in_flight_checks");
                Err(Overloaded {
                    max: self.max_in_flight,
                })
            }
        }
    }

    /// A place on the bulk lane for a call already admitted, or the
    /// refusal, counted in `sluice_overloaded_checks_total` and as
    /// `sluice_resource_exhausted_total{resource="bulk_lane"}`.
    pub fn admit_bulk(&self) -> Result<OwnedSemaphorePermit, Overloaded> {
        self.bulk.clone().try_acquire_owned().map_err(|_| {
            self.metrics.overloaded.inc();
            self.metrics.resources.exhausted("bulk_lane");
            Overloaded { max: self.max_bulk }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No store here: admission reads none of its series.
    #[derive(Debug)]
    struct NoStore;

    impl prometheus_client::collector::Collector for NoStore {
        fn encode(
            &self,
            _: prometheus_client::encoding::DescriptorEncoder,
        ) -> Result<(), std::fmt::Error> {
            Ok(())
        }
    }

    fn admission(max_in_flight_checks: usize, max_batch: usize) -> (Admission, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new(Box::new(NoStore), 10));
        let limits = Limits {
            max_in_flight_checks,
            max_batch,
            ..Limits::default()
        };
        (Admission::new(&limits, metrics.clone()), metrics)
    }

    #[test]
    fn one_budget_across_clones_and_the_gauge_follows_it() {
        let (a, m) = admission(2, 10);
        let (b, c) = (a.clone(), a.clone());
        let first = a.admit().unwrap();
        let second = b.admit().unwrap();
        assert_eq!(m.in_flight.get(), 2);
        // A third front's clone finds the budget spent.
        assert_eq!(c.admit().err(), Some(Overloaded { max: 2 }));
        assert_eq!(m.overloaded.get(), 1);
        assert_eq!(m.resources.exhausted_count("in_flight_checks"), 1);
        drop(first);
        assert_eq!(m.in_flight.get(), 1);
        let third = c.admit().unwrap();
        drop((second, third));
        assert_eq!(m.in_flight.get(), 0);
        assert_eq!(m.overloaded.get(), 1);
    }

    #[test]
    fn the_bulk_lane_holds_a_bounded_share_of_the_calls() {
        let (a, m) = admission(1_000, 10);
        let places: Vec<_> = (0..super::super::bulk::MAX_JOBS)
            .map(|_| a.admit_bulk().unwrap())
            .collect();
        assert!(a.admit_bulk().is_err());
        assert_eq!(m.resources.exhausted_count("bulk_lane"), 1);
        assert_eq!(m.overloaded.get(), 1);
        // Small calls are still admitted while the lane is full.
        assert!(a.admit().is_ok());
        drop(places);
        assert!(a.admit_bulk().is_ok());
        // Never more places than calls in progress.
        let (small, _) = admission(2, 10);
        let _places = (small.admit_bulk().unwrap(), small.admit_bulk().unwrap());
        assert_eq!(small.admit_bulk().err(), Some(Overloaded { max: 2 }));
    }

    #[test]
    fn a_batch_above_the_bound_names_its_field() {
        let (a, m) = admission(1, 3);
        assert_eq!(a.batch("descriptors", 3), Ok(()));
        let e = a.batch("descriptors", 4).unwrap_err();
        assert_eq!(e.to_string(), "descriptors: at most 3 per call, got 4");
        assert_eq!(m.resources.exhausted_count("descriptors"), 1);
        assert_eq!(m.resources.exhausted_count("requests"), 0);
    }
}
