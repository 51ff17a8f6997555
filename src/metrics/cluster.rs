//! Forwarding and membership: what the cluster parts count, by peer
//! where it helps (peer ids come from the ring, not from clients).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Forwarding and membership.
#[derive(Debug)]
pub struct ClusterMetrics {
    /// Items sent to owners.
    pub forwarded_items: Counter,
    /// Items per forward RPC.
    pub batch_size: Histogram,
    /// Seconds per forward RPC.
    pub forward_latency: Histogram,
    /// The same forwards' total microseconds and count: the histogram's
    /// sum and count are not readable outside prometheus-client's tests,
    /// and the status page shows the mean over the last minute.
    pub forward_micros: AtomicU64,
    pub forward_count: AtomicU64,
    /// Failed forwards by peer and kind (timeout, rpc, queue_full, protocol).
    pub errors: Family<Vec<(&'static str, String)>, Counter>,
    /// Redirects answered by this node (rings briefly disagreeing).
    pub redirects: Counter,
    /// Peer connections opened afresh: calls on the old one went
    /// unanswered (`cluster/peers/link.rs`).
    pub connections_renewed: Counter,
    /// RPCs attempted, by peer (forwards, probes and reports).
    pub rpcs: Family<Vec<(&'static str, String)>, Counter>,
    /// Forwards refused at once because the peer's breaker was open.
    pub breaker_rejections: Counter,
    /// Breaker state by peer: 0 closed, 1 half-open, 2 open.
    pub breakers: Family<Vec<(&'static str, String)>, Gauge>,
    /// Each peer's clock minus this node's, in seconds, from its last
    /// forward answer (its `now` against the call's midpoint here).
    pub clock_offsets: Family<Vec<(&'static str, String)>, Gauge<f64, AtomicU64>>,
    /// Decisions made without the owner, by mode (lease, allow, deny).
    pub fallbacks: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Forwards decided without the owner because its answer did not come
    /// within the caller's budget (or came back expired): on a healthy
    /// cluster, fallbacks for want of time. (A dead owner's first few
    /// timeouts count here too, until its breaker opens.)
    pub late_forwards: Counter,
    /// Hits admitted on leases and not yet acknowledged by their owners.
    pub unreported: Gauge,
    /// Lease reports applied by this node as owner, and retries ignored.
    pub reports: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// 1 while this node sees fewer than a majority of N (every key on leases).
    pub minority: Gauge,
    /// 1 while this node answers as ready (`/readyz`, gRPC health).
    pub ready: Gauge,
    /// Forwarded items dropped on arrival, past their deadline.
    pub shed: Counter,
    /// States sent to replica holders.
    pub replicated: Counter,
    /// Keys changed and not yet sent to their replica holder (the lag, in keys).
    pub replication_pending: Gauge,
    /// Microseconds the last replication round took.
    pub replication_round: Gauge,
    /// Replication rounds finished, counted after the round's gauges are
    /// set: a reader that sees this pass a value read after a change, by
    /// two, knows the pending gauge it reads next comes from a round that
    /// started after the change.
    pub replication_rounds: Counter,
    /// Microseconds from the oldest change a round sent (or still holds,
    /// unsent) to the round's end: how far a replica is behind its owner.
    pub replication_lag: Gauge,
    /// States handed to a key's new owner (leaving, or after the ring moved
    /// keys away).
    pub handed_off: Counter,
    /// States taken by pulls during an ownership transfer, by result
    /// (state; mismatch and unreachable count calls).
    pub pulls: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Ownership transfer into this node: its view number, members by
    /// standing (pending, done, unreachable, legacy), members silent past
    /// `handoff_timeout`, whether every member is done, states received.
    pub transfer_view: Gauge,
    pub transfer_members: Family<Vec<(&'static str, &'static str)>, Gauge>,
    pub transfer_stalled: Gauge,
    pub transfer_complete: Gauge,
    pub transfer_received: Counter,
    /// States this node passed on to new owners (transfer pages).
    pub transfer_sent: Counter,
    /// Keys re-sent to a new replica holder after a ring change.
    pub rereplicated: Counter,
    /// Synchronous replication: decisions by whether the replica holder
    /// acknowledged them (`confirmed`) or not (`unconfirmed`: decided as if
    /// the owner were unreachable).
    pub sync_replicas: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Live members by lifecycle state.
    pub members: Family<Vec<(&'static str, &'static str)>, Gauge>,
    /// The ring epoch (low 63 bits), to compare across nodes.
    pub ring_epoch: Gauge,
    /// `N`, the cluster size that sizes shares.
    pub size: Gauge,
    /// Tiered mode: decisions by path (local_allotment, slow, fallback).
    pub tiered_decisions: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Tiered mode, as an owner: grants made, and tokens granted.
    pub tiered_grants: Counter,
    pub tiered_granted_tokens: Counter,
    /// Tiered mode: tokens this edge holds in allotments, and tokens this
    /// owner promised that edges have not reported yet (outstanding).
    pub tiered_held: Gauge,
    pub tiered_reserved: Gauge,
    /// Allotments inside apps: sub-grants made and tokens passed on, the
    /// tokens apps hold unreported, and app reports by acknowledgement.
    pub client_grants: Counter,
    pub client_granted_tokens: Counter,
    pub client_outstanding: Gauge,
    pub client_reports: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// Hits apps reported of keys this node holds no sub-grant of theirs
    /// for (granted before it restarted, or forgotten): booked all the
    /// same.
    pub client_unknown_spent: Counter,
    /// Keys in doubt (issue 39): decided in doubt in the regions still
    /// open, the regions, and keys taken from a best copy at a grace's end.
    pub keys_in_doubt: Gauge,
    pub doubt_regions: Gauge,
    pub taken_from_best_copy: Counter,
}

impl ClusterMetrics {
    pub(super) fn new() -> ClusterMetrics {
        ClusterMetrics {
            forwarded_items: Counter::default(),
            batch_size: Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]),
            forward_latency: Histogram::new([
                50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
            ]),
            forward_micros: AtomicU64::new(0),
            forward_count: AtomicU64::new(0),
            errors: Family::default(),
            redirects: Counter::default(),
            connections_renewed: Counter::default(),
            rpcs: Family::default(),
            breaker_rejections: Counter::default(),
            breakers: Family::default(),
            clock_offsets: Family::default(),
            fallbacks: Family::default(),
            late_forwards: Counter::default(),
            unreported: Gauge::default(),
            reports: Family::default(),
            minority: Gauge::default(),
            ready: Gauge::default(),
            shed: Counter::default(),
            replicated: Counter::default(),
            replication_pending: Gauge::default(),
            replication_round: Gauge::default(),
            replication_rounds: Counter::default(),
            replication_lag: Gauge::default(),
            handed_off: Counter::default(),
            pulls: Family::default(),
            transfer_view: Gauge::default(),
            transfer_members: Family::default(),
            transfer_stalled: Gauge::default(),
            transfer_complete: Gauge::default(),
            transfer_received: Counter::default(),
            transfer_sent: Counter::default(),
            rereplicated: Counter::default(),
            sync_replicas: Family::default(),
            members: Family::default(),
            ring_epoch: Gauge::default(),
            size: Gauge::default(),
            tiered_decisions: Family::default(),
            tiered_grants: Counter::default(),
            tiered_granted_tokens: Counter::default(),
            tiered_held: Gauge::default(),
            tiered_reserved: Gauge::default(),
            client_grants: Counter::default(),
            client_granted_tokens: Counter::default(),
            client_outstanding: Gauge::default(),
            client_reports: Family::default(),
            client_unknown_spent: Counter::default(),
            keys_in_doubt: Gauge::default(),
            doubt_regions: Gauge::default(),
            taken_from_best_copy: Counter::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "sluice_forwarded_items",
            "Items forwarded to their owner",
            self.forwarded_items.clone(),
        );
        registry.register(
            "sluice_forward_batch_size",
            "Items per forward RPC",
            self.batch_size.clone(),
        );
        registry.register(
            "sluice_forward_duration_seconds",
            "Time per forward RPC",
            self.forward_latency.clone(),
        );
        registry.register(
            "sluice_forward_errors",
            "Failed forwards, by peer and kind",
            self.errors.clone(),
        );
        registry.register(
            "sluice_redirects",
            "Forwarded items redirected to their owner",
            self.redirects.clone(),
        );
        registry.register(
            "sluice_peer_connections_renewed",
            "Peer connections opened afresh because calls on the old one went unanswered",
            self.connections_renewed.clone(),
        );
        registry.register(
            "sluice_cluster_members",
            "Live members by state",
            self.members.clone(),
        );
        registry.register(
            "sluice_transfer_view",
            "This node's number for its current view (one more per ring change)",
            self.transfer_view.clone(),
        );
        registry.register(
            "sluice_transfer_members",
            "Members in this node's ownership transfer for its view, by standing",
            self.transfer_members.clone(),
        );
        registry.register(
            "sluice_transfer_stalled_members",
            "Members that have not said done within handoff_timeout of the view",
            self.transfer_stalled.clone(),
        );
        registry.register(
            "sluice_transfer_complete",
            "1 once every live member said done for this node's view",
            self.transfer_complete.clone(),
        );
        registry.register(
            "sluice_transfer_received_states",
            "States received by this node in ownership transfers",
            self.transfer_received.clone(),
        );
        registry.register(
            "sluice_transfer_sent_states",
            "States this node passed on to their new owners",
            self.transfer_sent.clone(),
        );
        registry.register(
            "sluice_rereplicated_keys",
            "Keys re-sent to a new replica holder after a ring change",
            self.rereplicated.clone(),
        );
        registry.register(
            "sluice_sync_replica_decisions",
            "Decisions of keys with synchronous replication, by outcome (confirmed by the replica holder, or unconfirmed and decided as if the owner were unreachable)",
            self.sync_replicas.clone(),
        );
        registry.register(
            "sluice_ring_epoch",
            "The ring epoch (low 63 bits)",
            self.ring_epoch.clone(),
        );
        registry.register(
            "sluice_cluster_size",
            "N, the cluster size that sizes shares",
            self.size.clone(),
        );
        registry.register(
            "sluice_tiered_decisions",
            "Tiered-mode decisions by path: local_allotment (no hop), slow (the owner), fallback",
            self.tiered_decisions.clone(),
        );
        registry.register(
            "sluice_tiered_grants",
            "Allotments granted to edges (as an owner)",
            self.tiered_grants.clone(),
        );
        registry.register(
            "sluice_tiered_granted_tokens",
            "Tokens granted to edges in allotments (as an owner)",
            self.tiered_granted_tokens.clone(),
        );
        registry.register(
            "sluice_tiered_allotment_tokens",
            "Tokens this node holds in unexpired allotments (as an edge)",
            self.tiered_held.clone(),
        );
        registry.register(
            "sluice_tiered_outstanding_tokens",
            "Tokens promised to edges and not yet reported (as an owner)",
            self.tiered_reserved.clone(),
        );
        registry.register(
            "sluice_client_allotment_grants",
            "Sub-grants of this node's allotments to apps",
            self.client_grants.clone(),
        );
        registry.register(
            "sluice_client_allotment_granted_tokens",
            "Tokens passed on to apps in sub-grants",
            self.client_granted_tokens.clone(),
        );
        registry.register(
            "sluice_client_allotment_outstanding_tokens",
            "Tokens apps hold that they have not reported or given back",
            self.client_outstanding.clone(),
        );
        registry.register(
            "sluice_client_allotment_reports",
            "App spending reports, by acknowledgement (applied, duplicate, retry, invalid)",
            self.client_reports.clone(),
        );
        registry.register(
            "sluice_client_allotment_unknown_spent",
            "Hits apps reported of keys this node passed them no allotment of in this run (it restarted, or forgot the app), booked all the same",
            self.client_unknown_spent.clone(),
        );
        registry.register(
            "sluice_keys_in_doubt",
            "Keys this node owns whose holders of record are gone and whose copy here is not provably current, decided as if their owner were unreachable (asked about since)",
            self.keys_in_doubt.clone(),
        );
        registry.register(
            "sluice_doubt_regions",
            "Ring changes that took members away whose keys are still in doubt",
            self.doubt_regions.clone(),
        );
        registry.register(
            "sluice_keys_taken_from_best_copy",
            "Keys in doubt whose holders of record did not come back within cluster.in_doubt_grace: their best copy taken, what the gone holders admitted past it lost",
            self.taken_from_best_copy.clone(),
        );
        registry.register(
            "sluice_peer_rpcs",
            "RPCs attempted, by peer",
            self.rpcs.clone(),
        );
        registry.register(
            "sluice_breaker_rejections",
            "Forwards refused at once by an open breaker",
            self.breaker_rejections.clone(),
        );
        registry.register(
            "sluice_breaker_state",
            "Breaker by peer: 0 closed, 1 half-open, 2 open",
            self.breakers.clone(),
        );
        registry.register(
            "sluice_peer_clock_offset_seconds",
            "Each peer's clock minus this node's, from its last forward answer",
            self.clock_offsets.clone(),
        );
        registry.register(
            "sluice_late_forwards",
            "Forwards decided without the owner because its answer missed the caller's budget",
            self.late_forwards.clone(),
        );
        registry.register(
            "sluice_fallback_decisions",
            "Decisions made without the owner, by mode",
            self.fallbacks.clone(),
        );
        registry.register(
            "sluice_lease_unreported_hits",
            "Hits admitted on leases, not yet acknowledged by their owners",
            self.unreported.clone(),
        );
        registry.register(
            "sluice_lease_reports",
            "Lease reports received as owner, by outcome",
            self.reports.clone(),
        );
        registry.register(
            "sluice_minority",
            "1 while this node sees fewer than a majority of N",
            self.minority.clone(),
        );
        registry.register(
            "sluice_ready",
            "1 while this node answers as ready (/readyz and gRPC health say the same)",
            self.ready.clone(),
        );
        registry.register(
            "sluice_replicated_states",
            "States sent to replica holders",
            self.replicated.clone(),
        );
        registry.register(
            "sluice_replication_pending_keys",
            "Keys changed and not yet at their replica holder",
            self.replication_pending.clone(),
        );
        registry.register(
            "sluice_replication_round_microseconds",
            "Time the last replication round took",
            self.replication_round.clone(),
        );
        registry.register(
            "sluice_replication_rounds",
            "Replication rounds finished",
            self.replication_rounds.clone(),
        );
        registry.register(
            "sluice_replication_lag_microseconds",
            "How far replicas were behind their owner at the last replication round",
            self.replication_lag.clone(),
        );
        registry.register(
            "sluice_handed_off_states",
            "States handed to a key's new owner (leaving, or after a ring change)",
            self.handed_off.clone(),
        );
        registry.register(
            "sluice_pulls",
            "Pulls after a ring change, by result",
            self.pulls.clone(),
        );
        registry.register(
            "sluice_shed_forwards",
            "Forwarded items dropped on arrival, past their deadline",
            self.shed.clone(),
        );
    }

    pub fn forwarded(&self, items: usize, took: std::time::Duration) {
        self.forwarded_items.inc_by(items as u64);
        self.batch_size.observe(items as f64);
        self.forward_latency.observe(took.as_secs_f64());
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.forward_micros.fetch_add(micros, Ordering::Relaxed);
        self.forward_count.fetch_add(1, Ordering::Relaxed);
    }

    /// A peer's breaker: 0 closed, 1 half-open, 2 open (the breaker says
    /// which; see `cluster::breaker::State::gauge`).
    pub fn breaker_state(&self, peer: &str, v: i64) {
        self.breakers
            .get_or_create(&vec![("peer", peer.to_string())])
            .set(v);
    }

    pub fn clock_offset(&self, peer: &str, seconds: f64) {
        self.clock_offsets
            .get_or_create(&vec![("peer", peer.to_string())])
            .set(seconds);
    }

    /// A peer left: its last clock offset and breaker are no one's any
    /// more (a departed peer's open breaker would otherwise show forever).
    pub fn forget_peer(&self, peer: &str) {
        self.clock_offsets.remove(&vec![("peer", peer.to_string())]);
        self.breakers.remove(&vec![("peer", peer.to_string())]);
    }

    pub fn rpc_attempt(&self, peer: &str) {
        self.rpcs
            .get_or_create(&vec![("peer", peer.to_string())])
            .inc();
    }

    /// A synchronous decision's replica: `confirmed` or `unconfirmed`.
    pub fn sync_replica(&self, outcome: &'static str, n: u64) {
        self.sync_replicas
            .get_or_create(&vec![("outcome", outcome)])
            .inc_by(n);
    }

    pub fn fallback(&self, mode: &'static str) {
        self.fallbacks.get_or_create(&vec![("mode", mode)]).inc();
    }

    pub fn forward_error(&self, peer: &str, kind: &'static str) {
        self.errors
            .get_or_create(&vec![
                ("peer", peer.to_string()),
                ("kind", kind.to_string()),
            ])
            .inc();
    }
}
