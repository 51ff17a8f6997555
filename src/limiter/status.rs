//! What the status page shows, gathered in one place: the members as this
//! node sees them (with its breaker for each peer), `N` and minority, the
//! ownership transfer's progress, replication lag, decision rates over the
//! last minute and the top keys. Plain data, serialized as the `/status`
//! JSON; the service layer only authenticates and serves it.

use serde::Serialize;

use super::Limiter;
use crate::cluster::breaker::State as BreakerState;
use crate::cluster::membership::ClusterView;
use crate::store::TopBy;

pub use super::rates::RateSummary;

/// One node's view of the cluster and of its own work.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub node_id: String,
    pub version: &'static str,
    pub ring_epoch: u64,
    /// Every member names a zone and there are two or more: each key's
    /// replica is in another zone than its owner.
    pub replicas_span_zones: bool,
    /// This node's view number (one more per ring change).
    pub view: u64,
    /// `N`: the remembered cluster size shares and leases are sized by.
    pub cluster_size: usize,
    /// Members this node must see to be in the majority.
    pub majority: usize,
    /// Seeing fewer than a majority of `N`: every key on leases.
    pub minority: bool,
    pub members: Vec<MemberStatus>,
    pub transfer: TransferView,
    /// How far this node's replicas were behind at the last round (µs).
    pub replication_lag_us: i64,
    /// Changes waiting to be replicated.
    pub replication_pending: i64,
    pub rates: RateSummary,
    pub keys_in_memory: usize,
    pub top_by_hits: Vec<TopKey>,
    pub top_by_refusals: Vec<TopKey>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub node_id: String,
    pub is_self: bool,
    pub state: &'static str,
    pub generation: u64,
    pub in_ring: bool,
    /// This node's failure detector declares the member dead and no
    /// majority has buried it yet: it keeps its place in the ring, not
    /// its vote in the minority rule; this node votes for its burial
    /// while it is ready and neither fenced nor deaf.
    pub suspected: bool,
    /// Its zone (`cluster.zone`), if it names one.
    pub zone: Option<String>,
    /// Percent of the hash space this member owns.
    pub ring_share_pct: f64,
    pub protocol: u32,
    pub version: String,
    pub grpc_addr: String,
    /// This node's breaker for the member (None: itself, or no calls yet).
    pub breaker: Option<&'static str>,
    /// How long this node's forwards to the member take lately (an
    /// exponentially weighted mean, ms; None: no forwards yet).
    pub forward_latency_ms: Option<f64>,
    /// How far behind the replicas this node sends the member were at the
    /// last round (ms; None: none sent yet).
    pub replication_lag_ms: Option<f64>,
}

/// The transfer of keys to this node after its last ring change.
#[derive(Clone, Debug, Serialize)]
pub struct TransferView {
    pub view: u64,
    pub complete: bool,
    pub sources: Vec<TransferSource>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TransferSource {
    pub node_id: String,
    /// pending, done, unreachable, legacy — or stalled (silent past
    /// `handoff_timeout`).
    pub standing: &'static str,
    pub received: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopKey {
    pub name: String,
    pub key: String,
    pub hits: u64,
    pub refusals: u64,
    pub remaining: u64,
    pub limit: u64,
}

fn breaker_name(s: BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "closed",
        BreakerState::HalfOpen => "half-open",
        BreakerState::Open => "open",
    }
}

impl Limiter {
    /// In a minority: `N`, the cluster size this node remembers and sees
    /// no majority of (every key on leases); `None` otherwise. Cheap: what
    /// `/readyz` says beside ready.
    pub fn minority_of(&self) -> Option<u64> {
        let t = self.shared.topology.load();
        t.minority.then_some(t.size)
    }

    /// Sample the decision and forward totals (once a second; see
    /// `rates.rs`).
    pub fn sample_rates(&self) {
        self.shared.rates.sample(self.forwards());
    }

    fn forwards(&self) -> (f64, u64) {
        let m = &self.shared.metrics.cluster;
        let micros = m.forward_micros.load(std::sync::atomic::Ordering::Relaxed);
        (
            micros as f64 / 1e6,
            m.forward_count.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The status page's data under `view`, with the top `n` keys.
    pub fn status(&self, view: &ClusterView, n: usize) -> NodeStatus {
        let t = self.shared.topology.load_full();
        let shares: std::collections::HashMap<_, _> = view.ring.shares().into_iter().collect();
        let peers: std::collections::HashMap<_, _> = self
            .shared
            .peers
            .standing()
            .into_iter()
            .map(|(id, breaker, figures)| (id, (breaker, figures)))
            .collect();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let members = view
            .members
            .iter()
            .map(|m| (m, peers.get(&m.node_id)))
            .map(|(m, peer)| MemberStatus {
                node_id: m.node_id.to_string(),
                is_self: m.node_id == view.self_id,
                state: m.state.name(),
                generation: m.generation,
                in_ring: view.ring.member(&m.node_id).is_some(),
                suspected: m.suspected,
                zone: (!m.zone.is_empty()).then(|| m.zone.to_string()),
                ring_share_pct: shares.get(&m.node_id).copied().unwrap_or(0.0) * 100.0,
                protocol: m.protocol,
                version: m.version.clone(),
                grpc_addr: m.grpc_addr.clone(),
                breaker: peer.map(|(b, _)| breaker_name(*b)),
                forward_latency_ms: peer.and_then(|(_, f)| f.forward_latency.map(ms)),
                replication_lag_ms: peer.and_then(|(_, f)| f.replication_lag.map(ms)),
            })
            .collect();
        let transfer = self.transfer_status();
        let transfer = TransferView {
            view: transfer.view,
            complete: transfer.complete,
            sources: transfer
                .members
                .into_iter()
                .map(|(id, p, stalled)| TransferSource {
                    node_id: id.to_string(),
                    standing: if stalled {
                        "stalled"
                    } else {
                        p.standing.name()
                    },
                    received: p.received,
                })
                .collect(),
        };
        let m = &self.shared.metrics.cluster;
        let top = |by| {
            self.top(by, n)
                .into_iter()
                .map(|(name, key, v)| TopKey {
                    name,
                    key,
                    hits: v.hits,
                    refusals: v.refusals,
                    remaining: v.remaining,
                    limit: v.spec.limit(),
                })
                .collect()
        };
        NodeStatus {
            node_id: view.self_id.to_string(),
            version: env!("CARGO_PKG_VERSION"),
            ring_epoch: view.ring.epoch(),
            replicas_span_zones: view.ring.spans_zones(),
            view: t.view,
            cluster_size: t.size as usize,
            majority: t.size as usize / 2 + 1,
            minority: t.minority,
            members,
            transfer,
            replication_lag_us: m.replication_lag.get(),
            replication_pending: m.replication_pending.get(),
            rates: self.shared.rates.summary(self.forwards()),
            keys_in_memory: self.shared.store.len(),
            top_by_hits: top(TopBy::Hits),
            top_by_refusals: top(TopBy::Refusals),
        }
    }
}
