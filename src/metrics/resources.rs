//! Resource bounds: what is configured, what is in use, what was refused.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::Semaphore;

/// Resource bounds: each configured bound, the use of the ones that are
/// not counted elsewhere (open connections per listener), the work
/// refused for exceeding one (`RESOURCE_EXHAUSTED`, or a closed connection),
/// and the connections closed for being idle.
#[derive(Debug, Default)]
pub struct Resources {
    bounds: Mutex<Vec<(&'static str, u64)>>,
    listeners: Mutex<Vec<(&'static str, Arc<Semaphore>, usize)>>,
    /// The budget of message bytes being received (`service/inbound.rs`).
    inbound: Mutex<Option<(Arc<Semaphore>, usize)>>,
    exhausted: Family<Vec<(&'static str, &'static str)>, Counter>,
    idle_closed: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl Resources {
    /// Publish the configured bounds (`sluice_resource_limit{resource}`).
    pub fn set_bounds(&self, bounds: &[(&'static str, u64)]) {
        if let Ok(mut b) = self.bounds.lock() {
            *b = bounds.to_vec();
        }
    }

    /// A listener whose open connections are `max - available permits`.
    pub fn listener(&self, name: &'static str, permits: Arc<Semaphore>, max: usize) {
        if let Ok(mut l) = self.listeners.lock() {
            l.retain(|(n, _, _)| *n != name);
            l.push((name, permits, max));
        }
    }

    /// The budget of gRPC message bytes being received: in use is `max -
    /// available permits`.
    pub fn inbound(&self, permits: Arc<Semaphore>, max: usize) {
        if let Ok(mut i) = self.inbound.lock() {
            *i = Some((permits, max));
        }
    }

    /// Bytes of gRPC messages being received now.
    pub fn inbound_bytes(&self) -> u64 {
        self.inbound
            .lock()
            .ok()
            .and_then(|i| {
                i.as_ref()
                    .map(|(p, max)| max.saturating_sub(p.available_permits()))
            })
            .unwrap_or(0) as u64
    }

    /// Work refused because `resource` was at its bound.
    pub fn exhausted(&self, resource: &'static str) {
        self.exhausted
            .get_or_create(&vec![("resource", resource)])
            .inc();
    }

    /// A connection of `listener` closed after its idle timeout.
    pub fn idle_closed(&self, listener: &'static str) {
        self.idle_closed
            .get_or_create(&vec![("listener", listener)])
            .inc();
    }

    pub fn idle_closed_count(&self, listener: &'static str) -> u64 {
        self.idle_closed
            .get_or_create(&vec![("listener", listener)])
            .get()
    }

    pub fn exhausted_count(&self, resource: &'static str) -> u64 {
        self.exhausted
            .get_or_create(&vec![("resource", resource)])
            .get()
    }
}

#[derive(Debug)]
pub(super) struct ResourcesCollector(pub(super) Arc<Resources>);

impl Collector for ResourcesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = &self.0;
        let bounds = r.bounds.lock().map(|b| b.clone()).unwrap_or_default();
        let mut family = encoder.encode_descriptor(
            "sluice_resource_limit",
            "Configured resource bounds",
            None,
            MetricType::Gauge,
        )?;
        for (name, v) in bounds {
            let v = i64::try_from(v).unwrap_or(i64::MAX);
            ConstGauge::new(v).encode(family.encode_family(&[("resource", name)])?)?;
        }
        let listeners: Vec<_> = r
            .listeners
            .lock()
            .map(|l| {
                l.iter()
                    .map(|(n, p, max)| (*n, max.saturating_sub(p.available_permits())))
                    .collect()
            })
            .unwrap_or_default();
        let mut family = encoder.encode_descriptor(
            "sluice_connections",
            "Open connections, by listener",
            None,
            MetricType::Gauge,
        )?;
        for (name, open) in listeners {
            ConstGauge::new(open as i64).encode(family.encode_family(&[("listener", name)])?)?;
        }
        ConstGauge::new(i64::try_from(r.inbound_bytes()).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "sluice_inbound_bytes",
                "Bytes of gRPC messages being received, bounded by limits.max_inbound_bytes",
                None,
                MetricType::Gauge,
            )?,
        )?;
        r.exhausted.encode(encoder.encode_descriptor(
            "sluice_resource_exhausted",
            "Work refused at a resource bound, by resource",
            None,
            MetricType::Counter,
        )?)?;
        r.idle_closed.encode(encoder.encode_descriptor(
            "sluice_idle_connections_closed",
            "Connections closed after limits.idle_connection_timeout with no call, by listener",
            None,
            MetricType::Counter,
        )?)
    }
}
