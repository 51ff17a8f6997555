//! The store's size and churn as Prometheus series, read at scrape time:
//! the store says what it counts; `metrics` only registers and renders.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::Store;

/// The store's size and churn, read at scrape time.
#[derive(Debug)]
pub struct StoreCollector(pub Arc<Store>);

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        let keys = ConstGauge::new(self.0.len() as i64);
        keys.encode(encoder.encode_descriptor(
            "sluice_keys",
            "Keys in memory",
            None,
            keys.metric_type(),
        )?)?;
        let memory = ConstGauge::new(i64::try_from(self.0.memory_used()).unwrap_or(i64::MAX));
        memory.encode(encoder.encode_descriptor(
            "sluice_memory_bytes",
            "Bytes the keys this node holds take (their footprints; bounded by 7/8 of limits.max_memory, the rest is for lease seeds)",
            None,
            memory.metric_type(),
        )?)?;
        let evictions = ConstCounter::new(stats.evictions.load(Ordering::Relaxed));
        evictions.encode(encoder.encode_descriptor(
            "sluice_evictions",
            "Keys evicted because the table was full (of keys or of bytes)",
            None,
            evictions.metric_type(),
        )?)?;
        let for_memory = ConstCounter::new(stats.memory_evictions.load(Ordering::Relaxed));
        for_memory.encode(encoder.encode_descriptor(
            "sluice_memory_evictions",
            "Of sluice_evictions, those made to stay within limits.max_memory",
            None,
            for_memory.metric_type(),
        )?)?;
        let counting = ConstCounter::new(stats.evictions_counting.load(Ordering::Relaxed));
        counting.encode(encoder.encode_descriptor(
            "sluice_evictions_counting",
            "Of sluice_evictions, keys that were not back to fresh: their counts are gone, their callers start again from a full limit",
            None,
            counting.metric_type(),
        )?)?;
        let expired = ConstCounter::new(stats.expired.load(Ordering::Relaxed));
        expired.encode(encoder.encode_descriptor(
            "sluice_expired",
            "Idle keys forgotten by the sweep (their state was back to fresh)",
            None,
            expired.metric_type(),
        )?)?;
        Ok(())
    }
}
