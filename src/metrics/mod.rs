//! Prometheus metrics, rendered in the text format on `/metrics`.
//!
//! Names come from clients, so per-name counters are capped: the first
//! `max_names` distinct names get their own series, the rest are counted
//! under `_other`. Per-name counters are plain atomics behind a `DashMap`
//! looked up by `&str`, so counting a decision allocates nothing.
//!
//! This file holds the registry, the per-name decision counters and the
//! rendering; `cluster.rs` what the cluster parts count, `resources.rs`
//! the configured bounds and what exceeding them refused. The store
//! registers its own series (`store::StoreCollector`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::verdict::Reason;

mod cluster;
mod resources;

pub use cluster::ClusterMetrics;
pub use resources::Resources;
use resources::ResourcesCollector;

/// The label value for names beyond the cap.
pub const OTHER: &str = "_other";

type PerReason = [AtomicU64; Reason::ALL.len()];

/// Decisions by limit name (capped) and reason.
#[derive(Debug)]
pub struct DecisionCounters {
    by_name: DashMap<Arc<str>, PerReason>,
    other: PerReason,
    max_names: usize,
}

impl DecisionCounters {
    fn new(max_names: usize) -> DecisionCounters {
        DecisionCounters {
            by_name: DashMap::new(),
            other: Default::default(),
            max_names,
        }
    }

    pub fn count(&self, name: &str, reason: Reason) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        if let Some(c) = self.by_name.get(name) {
            c[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.by_name.len() < self.max_names {
            let c = self.by_name.entry(Arc::from(name)).or_default();
            c[i].fetch_add(1, Ordering::Relaxed);
        } else {
            self.other[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count for one name and reason (for tests and the CLI).
    pub fn get(&self, name: &str, reason: Reason) -> u64 {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        match self.by_name.get(name) {
            Some(c) => c[i].load(Ordering::Relaxed),
            None if name == OTHER => self.other[i].load(Ordering::Relaxed),
            None => 0,
        }
    }
}

impl Collector for DecisionCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "sluice_decisions",
            "Decisions by limit (policy or request name, capped) and reason",
            None,
            MetricType::Counter,
        )?;
        let mut emit = |name: &str, counters: &PerReason| -> Result<(), std::fmt::Error> {
            for (reason, c) in Reason::ALL.iter().zip(counters) {
                let v = c.load(Ordering::Relaxed);
                if v == 0 {
                    continue;
                }
                let labels = [
                    ("limit", name),
                    ("status", reason.status().name()),
                    ("reason", reason.name()),
                ];
                ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
            }
            Ok(())
        };
        for item in self.by_name.iter() {
            emit(item.key(), item.value())?;
        }
        emit(OTHER, &self.other)
    }
}

/// Every metric of a node.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub decisions: Arc<DecisionCounters>,
    /// Seconds per `Check` call.
    pub check_latency: Histogram,
    /// Requests refused before deciding, by the field at fault.
    pub invalid: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Config reloads by result (ok / error).
    pub reloads: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Check calls in progress, every front end (saturation), and calls
    /// shed as overloaded.
    pub in_flight: Gauge,
    pub overloaded: Counter,
    /// `CheckStream` streams open, and calls that came on one.
    pub check_streams: Gauge,
    pub stream_calls: Counter,
    pub cluster: Arc<ClusterMetrics>,
    pub resources: Arc<Resources>,
}

impl Metrics {
    /// `store`: the store's own series, read at scrape time (the store
    /// registers what it counts; metrics knows no store).
    pub fn new(store: Box<dyn Collector>, max_names: usize) -> Metrics {
        let mut registry = Registry::default();
        let decisions = Arc::new(DecisionCounters::new(max_names));
        registry.register_collector(Box::new(decisions.clone()));
        registry.register_collector(store);
        let check_latency = Histogram::new([
            10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
            100e-3,
        ]);
        registry.register(
            "sluice_check_duration_seconds",
            "Time to answer one Check call, all its requests",
            check_latency.clone(),
        );
        let invalid = Family::default();
        registry.register(
            "sluice_invalid_requests",
            "Requests refused as invalid, by field",
            invalid.clone(),
        );
        let reloads = Family::default();
        registry.register(
            "sluice_config_reloads",
            "Config file reloads, by result",
            reloads.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "sluice_checks_in_flight",
            "Check calls in progress (v1, Envoy and HTTP together)",
            in_flight.clone(),
        );
        let overloaded = Counter::default();
        registry.register(
            "sluice_overloaded_checks",
            "Check calls shed at once, over max_in_flight_checks (any front)",
            overloaded.clone(),
        );
        let check_streams = Gauge::default();
        registry.register(
            "sluice_check_streams",
            "CheckStream streams open (each a client's long-lived stream of Check calls)",
            check_streams.clone(),
        );
        let stream_calls = Counter::default();
        registry.register(
            "sluice_check_stream_calls",
            "Check calls that came as CheckStream messages (also in the v1 call series)",
            stream_calls.clone(),
        );
        let cluster = Arc::new(ClusterMetrics::new());
        cluster.register(&mut registry);
        let resources = Arc::new(Resources::default());
        registry.register_collector(Box::new(ResourcesCollector(resources.clone())));
        Metrics {
            registry,
            decisions,
            check_latency,
            invalid,
            reloads,
            in_flight,
            overloaded,
            check_streams,
            stream_calls,
            cluster,
            resources,
        }
    }

    pub fn invalid(&self, field: &'static str) {
        self.invalid.get_or_create(&vec![("field", field)]).inc();
    }

    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&vec![("result", result)]).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beyond_the_cap_go_to_other() {
        /// No store in this test: the store's series are its own test's.
        #[derive(Debug)]
        struct NoStore;
        impl Collector for NoStore {
            fn encode(&self, _: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                Ok(())
            }
        }
        let m = Metrics::new(Box::new(NoStore), 2);
        for name in ["a", "b", "c", "d", "a"] {
            m.decisions.count(name, Reason::WithinLimit);
        }
        m.decisions.count("a", Reason::LimitExceeded);
        assert_eq!(m.decisions.get("a", Reason::WithinLimit), 2);
        assert_eq!(m.decisions.get(OTHER, Reason::WithinLimit), 2);
        let text = m.render();
        assert!(text.contains(
            "sluice_decisions_total{limit=\"a\",status=\"over_limit\",reason=\"limit_exceeded\"} 1"
        ), "{text}");
        assert!(text.contains("limit=\"_other\""), "{text}");
        assert!(!text.contains("limit=\"c\""), "{text}");
    }
}
