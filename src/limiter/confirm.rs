//! Synchronous replication: an owner answers a key exactly only once the
//! key's replica holder has acknowledged a copy that holds the decision.
//!
//! Asynchronous replication (`replicate.rs`) sends a key's changes within
//! the replication lag, and a crash of the owner loses what it admitted in
//! that lag — or longer, when the holder was stalled or its link lossy and
//! the owner went on answering (the simulator's
//! `stalled-holder-then-stalled-owner`). A key with `replication = "sync"`
//! trades a peer round trip per decision for losing nothing: the owner
//! decides (the hits are counted here at once, under the key's lock), sends
//! the key's whole state as it is *after* the decision to its replica
//! holder (whose copy the key's next owner takes when this node is gone —
//! the holder itself without zones, another node by the transfer with
//! them), and
//! answers exactly only when that send is acknowledged. Every decision is
//! confirmed — reads too, since an exact read shows a remaining that a
//! failover must not move back up.
//!
//! An unconfirmed decision is not an answer: the key is decided as if its
//! owner were unreachable (`on_owner_unreachable`: `deny` refuses), and
//! its hits stay counted here (counted, never lost: the safe side — an
//! owner that answers nothing exact cannot be rolled back). Several keys of
//! one batch going to one holder share one `Sync` call. A handler dropped
//! mid-confirmation leaves the hits counted and the copy on its way with
//! the asynchronous rounds: nothing half-done.

use std::collections::HashMap;
use std::sync::Arc;

use super::replicate::chunk_by_bytes;
use super::{Forwarded, ForwardedItem, Limiter, Replication, Resolved, Topology, Verdict};
use crate::algorithm::Decision;
use crate::cluster::peers::{Outgoing, SyncKind, codec as wire};
use crate::store::{Stale, key};

/// A decision made here as the key's owner: answered, or (synchronous
/// replication) waiting for its replica holder's acknowledgement.
pub(super) enum Here {
    Answered(Verdict),
    Confirm(Decision),
}

/// Items of a batch decided here, waiting for their replicas.
pub(super) type Held<'a> = Vec<(usize, Resolved<'a>, Decision)>;

impl Limiter {
    /// Decide `r` here as its owner; a synchronous key's decision is held
    /// for [`Limiter::answer_confirmed`].
    pub(super) fn decide_here_or_hold(
        &self,
        r: &Resolved<'_>,
        t: &Topology,
    ) -> Result<Here, Stale> {
        if !r.sync {
            return self.decide_here(r, t).map(Here::Answered);
        }
        let now = self.now();
        key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.decide_owned(k, &r.spec, r.check.request, t, now)
        })
        .map(Here::Confirm)
    }

    /// Answer held decisions once their replicas are acknowledged (until
    /// `deadline`): exactly, or as if the owner were unreachable.
    pub(super) async fn answer_confirmed(
        &self,
        held: Held<'_>,
        deadline: tokio::time::Instant,
    ) -> Vec<(usize, Verdict)> {
        if held.is_empty() {
            return Vec::new();
        }
        let keys: Vec<Vec<u8>> = held
            .iter()
            .map(|(_, r, _)| key::encode(&r.check.name, &r.check.unique_key))
            .collect();
        let acked = self.confirm_replicas(&keys, deadline).await;
        let t = self.shared.topology.load_full();
        held.into_iter()
            .zip(acked)
            .map(|((i, r, decision), ok)| {
                let v = if ok {
                    self.verdict(&r, decision, self.self_id(), false)
                } else {
                    self.fallback(&r, &t, t.minority)
                };
                (i, v)
            })
            .collect()
    }

    /// Decide one item here, confirmed if it is synchronous; `None` if the
    /// view moved under it.
    pub(super) async fn decide_here_confirmed(
        &self,
        r: &Resolved<'_>,
        t: &Topology,
        deadline: tokio::time::Instant,
    ) -> Option<Verdict> {
        match self.decide_here_or_hold(r, t).ok()? {
            Here::Answered(v) => Some(v),
            Here::Confirm(decision) => {
                let k = key::encode(&r.check.name, &r.check.unique_key);
                let ok = self.confirm_replicas(&[k], deadline).await[0];
                Some(if ok {
                    self.verdict(r, decision, self.self_id(), false)
                } else {
                    let t = self.shared.topology.load_full();
                    self.fallback(r, &t, t.minority)
                })
            }
        }
    }

    /// An owner's side of a forwarded batch: every synchronous item it
    /// decided exactly waits for its replica (until `deadline`); one not
    /// acknowledged is answered `Unavailable` (the edge decides it as if
    /// the owner were unreachable; its hits stay counted here).
    pub(super) async fn confirm_forwarded(
        &self,
        items: &[ForwardedItem],
        out: &mut [Option<Forwarded>],
        deadline: tokio::time::Instant,
    ) {
        let held: Vec<usize> = (0..items.len())
            .filter(|&i| {
                items[i].check.replication == Some(Replication::Sync)
                    && matches!(
                        out[i],
                        Some(Forwarded::Decided {
                            approximate: false,
                            grant: None,
                            ..
                        })
                    )
            })
            .collect();
        if held.is_empty() {
            return;
        }
        let keys: Vec<Vec<u8>> = held
            .iter()
            .map(|&i| key::encode(&items[i].check.name, &items[i].check.unique_key))
            .collect();
        let acked = self.confirm_replicas(&keys, deadline).await;
        for (i, ok) in held.into_iter().zip(acked) {
            if !ok {
                out[i] = Some(Forwarded::Unavailable);
            }
        }
    }
    /// Send each key's state now (encoded keys this node decided as owner)
    /// to its replica holder under the current view, one call per holder,
    /// waiting until `deadline`; whether each key's copy is acknowledged.
    /// A key this node no longer owns, or whose holder cannot take a copy,
    /// is not. With no other member there is no replica to wait for: a lone
    /// node's keys are acknowledged at once (nothing survives its crash
    /// anyway).
    pub(super) async fn confirm_replicas(
        &self,
        keys: &[Vec<u8>],
        deadline: tokio::time::Instant,
    ) -> Vec<bool> {
        let mut acked = vec![false; keys.len()];
        if keys.is_empty() {
            return acked;
        }
        let t = self.shared.topology.load_full();
        let mut by_holder: HashMap<Arc<str>, Vec<(usize, Outgoing)>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            match holder_of(&t, k, &self.shared.node_id) {
                Holder::NotOwner => {}
                Holder::Alone => acked[i] = true,
                Holder::Peer(to) => {
                    let Some(state) = self
                        .shared
                        .store
                        .snapshot(k)
                        .and_then(|s| wire::outgoing(k, &s))
                    else {
                        continue;
                    };
                    by_holder.entry(to).or_default().push((i, state));
                }
            }
        }
        // One call per holder, split as replication splits (a peer refuses
        // a message past its bounds): a key is acknowledged with its call.
        let peers = &self.shared.peers;
        let calls = by_holder.iter().flat_map(|(to, states)| {
            chunk_by_bytes(states, |(_, s)| s)
                .into_iter()
                .map(move |chunk| async move {
                    let batch: Vec<Outgoing> = chunk.iter().map(|(_, s)| s.clone()).collect();
                    let call = peers.push_states(to, SyncKind::Replica, batch);
                    let ok = matches!(tokio::time::timeout_at(deadline, call).await, Ok(Ok(_)));
                    if !ok {
                        tracing::debug!(peer = %to, keys = chunk.len(), "synchronous replica not acknowledged");
                    }
                    (chunk, ok)
                })
        });
        for (chunk, ok) in futures::future::join_all(calls).await {
            if ok {
                for (i, _) in chunk {
                    acked[*i] = true;
                }
            }
        }
        let confirmed = acked.iter().filter(|&&a| a).count() as u64;
        let metrics = &self.shared.metrics.cluster;
        metrics.sync_replica("confirmed", confirmed);
        metrics.sync_replica("unconfirmed", keys.len() as u64 - confirmed);
        acked
    }
}

/// Where a key's synchronous copy goes under a view.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// This node does not own the key (the ring moved since it decided):
    /// its transfer carries the state; the answer waits for nothing and is
    /// not confirmed.
    NotOwner,
    /// The only member: no replica exists.
    Alone,
    Peer(Arc<str>),
}

fn holder_of(t: &Topology, k: &[u8], me: &str) -> Holder {
    match t.ring.owner(k) {
        Some(o) if &*o.node_id == me => match t.ring.successor(k) {
            None => Holder::Alone,
            // A holder that cannot merge states (protocol 1) is no replica.
            Some(m) if m.protocol < 2 => Holder::NotOwner,
            Some(m) => Holder::Peer(m.node_id.clone()),
        },
        _ => Holder::NotOwner,
    }
}
