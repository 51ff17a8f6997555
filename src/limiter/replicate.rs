//! Replicas streamed to each key's successor, states pushed to a key's
//! new owner, and a leaving node's last push; the merge of states arriving
//! from peers.
//!
//! Every copy of a key travels whole (spec, `reset_gen`, version, state,
//! report slots) and is *merged* on arrival — the more consumed wins, an
//! older `reset_gen` loses — so a late, repeated or reordered copy never
//! rolls a key back, double-counts or undoes a reset. A pushed state is
//! held as a copy: only the ownership transfer (`transfer.rs`, whose
//! holders and askers agree on the ring) makes a node a key's owner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Limiter;
use crate::cluster::peers::{Outgoing, SyncKind, codec as wire};
use crate::cluster::ring::Ring;
use crate::store::{Holding, Snapshot};

/// What a leaving node handed off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    pub keys: usize,
    pub confirmed: usize,
}

/// Keys and their states on the way to one peer.
type Outbox = Vec<(Arc<[u8]>, Outgoing)>;

/// States per replication or handoff RPC, and the bytes one may reach (a
/// peer refuses a message above its 4 MiB bound).
const BATCH: usize = 500;
const BATCH_BYTES: usize = 1 << 20;

/// Split states into RPCs of at most [`BATCH`] states and about
/// [`BATCH_BYTES`] bytes (one state at least).
pub(super) fn chunk_by_bytes<T>(states: &[T], state: impl Fn(&T) -> &Outgoing) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, s) in states.iter().enumerate() {
        let size = state(s).size();
        if i > start && (i - start >= BATCH || bytes + size > BATCH_BYTES) {
            out.push(&states[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < states.len() {
        out.push(&states[start..]);
    }
    out
}

impl Limiter {
    /// Merge a copy of a key arriving from a peer (a replica from its
    /// owner, or a state pushed to its new owner): held as a copy.
    pub fn merge_snapshot(&self, key: &[u8], snapshot: Snapshot) {
        self.shared
            .store
            .merge(key, snapshot, self.now(), Holding::Copy, None);
    }

    /// Returns once a key changed here waits to be replicated or handed
    /// off (see [`crate::store::Store::changes_waiting`]).
    pub async fn changes_waiting(&self) {
        self.shared.store.changes_waiting().await
    }

    /// Keys waiting to be replicated or handed off.
    pub fn changes_pending(&self) -> usize {
        self.shared.store.changed_len()
    }

    /// Send the keys changed since the last round where they belong: for a
    /// key this node owns, to its replica holder (the key's successor on the
    /// ring); for a key it decided but no longer owns (the ring moved, or
    /// this node is leaving), to its new owner, as a handoff. Keys whose
    /// target did not confirm are queued again. Returns how many changed
    /// keys it took from the queue (sent, queued again, or dropped for
    /// having no target).
    pub async fn replicate(&self, max: usize) -> usize {
        let peers = &self.shared.peers;
        let started = Instant::now();
        let t = self.shared.topology.load_full();
        let taken = self.shared.store.take_changed(max);
        let took = taken.states.len();
        let (changed, oldest) = (taken.states, taken.oldest);
        let since = oldest.unwrap_or_else(Instant::now);
        let mut by_target: HashMap<(Arc<str>, SyncKind), Outbox> = HashMap::new();
        for (k, snapshot) in changed {
            let target = match t.ring.owner(&k) {
                Some(o) if o.node_id == self.shared.node_id => {
                    t.ring.successor(&k).map(|m| (m, SyncKind::Replica))
                }
                Some(o) => Some((o, SyncKind::Handoff)),
                None => None,
            };
            let Some((to, kind)) = target.filter(|(m, _)| m.protocol >= 2) else {
                continue;
            };
            if let Some(state) = wire::outgoing(&k, &snapshot) {
                by_target
                    .entry((to.node_id.clone(), kind))
                    .or_default()
                    .push((k, state));
            }
        }
        let metrics = &self.shared.metrics.cluster;
        // Each target's pushes go out beside the others': one that does not
        // answer holds up its own keys only, for one deadline — its chunks
        // after a failed one are queued again unsent (a cold review: a dead
        // peer's backlog, sent chunk after chunk, held every round up for a
        // deadline per chunk, and the healthy targets' keys with it).
        let pushes = by_target.into_iter().map(|((to, kind), states)| async move {
            let mut failed = false;
            for chunk in chunk_by_bytes(&states, |(_, s)| s) {
                let keys = || chunk.iter().map(|(k, _)| k.clone());
                if failed {
                    self.shared.store.requeue(keys(), since);
                    continue;
                }
                let batch: Vec<Outgoing> = chunk.iter().map(|(_, s)| s.clone()).collect();
                let pushed = peers.push_in_background(&to, kind, batch).await;
                if kind == SyncKind::Replica {
                    peers.replicated(&to, since.elapsed());
                }
                match pushed {
                    Ok(_) => {
                        let counter = match kind {
                            SyncKind::Replica => &metrics.replicated,
                            SyncKind::Handoff => &metrics.handed_off,
                        };
                        counter.inc_by(chunk.len() as u64);
                    }
                    Err(e) => {
                        tracing::debug!(peer = %to, error = %e, "replication failed; will retry");
                        self.shared.store.requeue(keys(), since);
                        failed = true;
                    }
                }
            }
            failed
        });
        let failed = futures::future::join_all(pushes).await.contains(&true);
        self.after_round(&t, failed);
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
        metrics.replication_rounds.inc();
        took
    }

    /// A leaving node passes on what it holds: each key it owns or holds
    /// the replica of in `ring` (its ring with it) is pushed, as a copy, to
    /// the key's replica holder in that ring without this node — beside
    /// each other, until `within` has passed. Called before the leave is
    /// announced, and again with the final states once its keys were
    /// handed off. Without it a leave left a key's count on one member
    /// until that member re-replicated to the new holder, and a leave opens
    /// no region of doubt: the member lost meanwhile took the count with
    /// it, and the new holder owned the key from nothing (simulator seed
    /// 455 of `--mix any`: the leaver's key went to its replica holder,
    /// cut off from the new holder and killed 201 ms later). The keys'
    /// owners are untouched: the transfer and [`Self::hand_off`] carry
    /// those. Only to the targets `only` names, if given. Returns the
    /// copies pushed and confirmed, and the targets that did not confirm
    /// all of theirs.
    pub async fn pass_on_copies(
        &self,
        ring: &Ring,
        within: Duration,
        only: Option<&[Arc<str>]>,
    ) -> (Handoff, Vec<Arc<str>>) {
        let me = &self.shared.node_id;
        let Some(me_at) = ring.members().iter().position(|m| m.node_id == *me) else {
            return (Handoff::default(), Vec::new());
        };
        let mut by_target: HashMap<Arc<str>, Vec<Outgoing>> = HashMap::new();
        for (k, _) in self.shared.store.keys() {
            let (owner, holder) = ring.holders_without(&k, |_| false);
            if owner != Some(me_at) && holder != Some(me_at) {
                continue;
            }
            let (_, next) = ring.holders_without(&k, |i| i == me_at);
            let Some(next) = next.map(|i| &ring.members()[i]) else {
                continue;
            };
            if next.protocol < 2 || only.is_some_and(|o| !o.contains(&next.node_id)) {
                continue;
            }
            let state = self.shared.store.snapshot(&k);
            if let Some(state) = state.and_then(|s| wire::outgoing(&k, &s)) {
                by_target
                    .entry(next.node_id.clone())
                    .or_default()
                    .push(state);
            }
        }
        let peers = &self.shared.peers;
        let report = std::sync::Mutex::new((Handoff::default(), Vec::new()));
        let pushes = by_target.iter().map(|(to, states)| {
            let report = &report;
            async move {
                for chunk in chunk_by_bytes(states, |s| s) {
                    let pushed = peers
                        .push_in_background(to, SyncKind::Replica, chunk.to_vec())
                        .await;
                    let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                    r.0.keys += chunk.len();
                    match pushed {
                        Ok(_) => r.0.confirmed += chunk.len(),
                        Err(e) => {
                            tracing::warn!(peer = %to, error = %e, "copies not passed on");
                            return;
                        }
                    }
                }
                // Every chunk confirmed.
                let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
                r.1.push(to.clone());
            }
        });
        let all = futures::future::join_all(pushes);
        if tokio::time::timeout(within, all).await.is_err() {
            tracing::warn!("passing copies on: deadline reached");
        }
        let (handoff, done) = report.into_inner().unwrap_or_else(|p| p.into_inner());
        let unconfirmed = by_target
            .into_keys()
            .filter(|t| !done.contains(t))
            .collect();
        (handoff, unconfirmed)
    }

    /// A leaving node's last act: push what its new owners did not take
    /// through the transfer (a protocol-2 owner never asks; another may not
    /// have finished within the grace), each key taken (marked a copy) as a
    /// page would be, and wait for each batch's confirmation until `within`
    /// has passed.
    pub async fn hand_off(&self, within: Duration) -> Handoff {
        let peers = &self.shared.peers;
        let deadline = Instant::now() + within;
        self.fold_promises_unless(|_| false);
        let holdings = self.shared.topology.load().holdings.clone();
        if !holdings.is_scanned() {
            // Its scan was abandoned (a view change during the leave) or
            // is still running: sort the store out now.
            self.scan_now(&holdings);
        }
        let mut report = Handoff::default();
        let metrics = &self.shared.metrics.cluster;
        for (owner, keys) in holdings.remaining().unwrap_or_default() {
            let states: Vec<Outgoing> = keys
                .iter()
                .filter_map(|k| {
                    let (snapshot, _) = self.shared.store.take(k)?;
                    wire::outgoing(k, &snapshot)
                })
                .collect();
            report.keys += states.len();
            for chunk in chunk_by_bytes(&states, |s| s) {
                if Instant::now() >= deadline {
                    tracing::warn!(
                        sent = report.confirmed,
                        of = report.keys,
                        "handoff deadline reached"
                    );
                    return report;
                }
                match peers
                    .push_states(&owner, SyncKind::Handoff, chunk.to_vec())
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
