//! Counts that survive a change of owner: replicas streamed to each key's
//! successor, a leaving node's handoff, and the merge of states arriving
//! from peers.
//!
//! Every copy of a key travels whole (spec, `reset_gen`, version, state,
//! report slots) and is *merged* on arrival — the more consumed wins, an
//! older `reset_gen` loses — so a late, repeated or reordered copy never
//! rolls a key back, double-counts or undoes a reset.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Limiter;
use crate::cluster::wire;
use crate::proto::peer as pb;
use crate::store::{Snapshot, key};

/// What a leaving node handed off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    pub keys: usize,
    pub confirmed: usize,
}

/// Keys and their states on the way to one peer.
type Outbox = Vec<(Arc<[u8]>, pb::KeyState)>;

/// How long a pulled key is sent to its puller: long enough for every ring
/// to see the new owner (gossip converges in seconds), short enough that a
/// puller that dies at once costs little.
const MOVED_FOR: u64 = 5_000_000_000;

/// States per replication or handoff RPC.
const BATCH: usize = 500;

impl Limiter {
    /// Merge a copy of a key arriving from a peer. A replica is held for
    /// its owner; a handoff makes this node the owner, so what it merged is
    /// replicated onwards.
    pub fn merge_snapshot(&self, key: &[u8], snapshot: Snapshot, kind: pb::SyncKind) {
        let owned = kind != pb::SyncKind::Replica;
        self.shared.store.merge(key, snapshot, self.now(), owned);
    }

    /// This node's states for these keys, pulled by their new owner `by`
    /// (None where it has none). Each key pulled is marked as moved: for a
    /// while this node sends its callers to `by` rather than deciding it,
    /// while the rings converge.
    pub fn pulled_by(&self, by: &str, keys: &[(String, String)]) -> Vec<Option<pb::KeyState>> {
        let by: Arc<str> = Arc::from(by);
        let until = self
            .now()
            .saturating_add(MOVED_FOR.min(self.shared.settings.ownership_grace));
        keys.iter()
            .map(|(name, unique_key)| {
                let k = key::encode(name, unique_key);
                self.fold_promises(&k);
                let s = self.shared.store.pull(&k, by.clone(), until)?;
                wire::snapshot_to_wire(&k, &s)
            })
            .collect()
    }

    /// Send the keys changed since the last round where they belong: for a
    /// key this node owns, to its replica holder (the key's successor on the
    /// ring); for a key it decided but no longer owns (the ring moved, or
    /// this node is leaving), to its new owner, as a handoff. Keys whose
    /// target did not confirm are queued again. Returns states sent.
    pub async fn replicate(&self, max: usize) -> usize {
        let Some(peers) = &self.shared.peers else {
            return 0;
        };
        let started = Instant::now();
        let t = self.shared.topology.load_full();
        let taken = self.shared.store.take_changed(max);
        let (changed, oldest) = (taken.states, taken.oldest);
        let since = oldest.unwrap_or_else(Instant::now);
        let mut by_target: HashMap<(Arc<str>, pb::SyncKind), Outbox> = HashMap::new();
        for (k, snapshot) in changed {
            let target = match t.ring.owner(&k) {
                Some(o) if o.node_id == self.shared.node_id => {
                    t.ring.successor(&k).map(|m| (m, pb::SyncKind::Replica))
                }
                Some(o) => Some((o, pb::SyncKind::Handoff)),
                None => None,
            };
            let Some((to, kind)) = target.filter(|(m, _)| m.protocol >= 2) else {
                continue;
            };
            if let Some(state) = wire::snapshot_to_wire(&k, &snapshot) {
                by_target
                    .entry((to.node_id.clone(), kind))
                    .or_default()
                    .push((k, state));
            }
        }
        let metrics = &self.shared.metrics.cluster;
        let mut sent = 0;
        for ((to, kind), states) in by_target {
            for chunk in states.chunks(BATCH) {
                let batch = chunk.iter().map(|(_, s)| s.clone()).collect();
                match peers.sync_states(&to, kind, batch).await {
                    Ok(_) => {
                        sent += chunk.len();
                        let counter = match kind {
                            pb::SyncKind::Replica => &metrics.replicated,
                            _ => {
                                // Its new owner counts on from here.
                                self.shared.store.mark_copies(chunk.iter().map(|(k, _)| k));
                                &metrics.handed_off
                            }
                        };
                        counter.inc_by(chunk.len() as u64);
                    }
                    Err(e) => {
                        tracing::debug!(peer = %to, error = %e, "replication failed; will retry");
                        self.shared
                            .store
                            .requeue(chunk.iter().map(|(k, _)| k.clone()), since);
                    }
                }
            }
        }
        metrics
            .replication_pending
            .set(self.shared.store.changed_len() as i64);
        metrics
            .replication_round
            .set(started.elapsed().as_micros() as i64);
        // The lag: from the oldest change this round carried, or the oldest
        // still waiting (a failed round's requeued keys), to now.
        let oldest = match (oldest, self.shared.store.oldest_changed()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        metrics
            .replication_lag
            .set(oldest.map_or(0, |at| at.elapsed().as_micros() as i64));
        sent
    }

    /// A leaving node's last act: send every key it holds to its owner in
    /// the ring without this node, and wait for each batch's confirmation
    /// until `within` has passed.
    pub async fn hand_off(&self, within: Duration) -> Handoff {
        let Some(peers) = &self.shared.peers else {
            return Handoff::default();
        };
        if self.shared.settings.protocol < 2 {
            return Handoff::default();
        }
        let deadline = Instant::now() + within;
        self.fold_promises_unless(|_| false);
        let t = self.shared.topology.load_full();
        let mut by_owner: HashMap<Arc<str>, Vec<pb::KeyState>> = HashMap::new();
        let mut report = Handoff::default();
        for (k, snapshot) in self.shared.store.snapshots() {
            let Some(owner) = t
                .ring
                .owner(&k)
                .filter(|m| m.node_id != self.shared.node_id && m.protocol >= 2)
            else {
                continue;
            };
            if let Some(state) = wire::snapshot_to_wire(&k, &snapshot) {
                report.keys += 1;
                by_owner
                    .entry(owner.node_id.clone())
                    .or_default()
                    .push(state);
            }
        }
        let metrics = &self.shared.metrics.cluster;
        for (owner, states) in by_owner {
            for chunk in states.chunks(BATCH) {
                if Instant::now() >= deadline {
                    tracing::warn!(
                        sent = report.confirmed,
                        of = report.keys,
                        "handoff deadline reached"
                    );
                    return report;
                }
                match peers
                    .sync_states(&owner, pb::SyncKind::Handoff, chunk.to_vec())
                    .await
                {
                    Ok(_) => {
                        report.confirmed += chunk.len();
                        metrics.handed_off.inc_by(chunk.len() as u64);
                    }
                    Err(e) => {
                        tracing::warn!(peer = %owner, error = %e, "handoff batch not confirmed")
                    }
                }
            }
        }
        report
    }
}
