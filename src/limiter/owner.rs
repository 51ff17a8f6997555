//! Deciding keys this node owns — for itself or for an edge that forwarded
//! them — and taking the keys it lacks from the members still transferring
//! (all the lacking keys of a batch in one `Pull` per member).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::confirm::Here;
use super::route::{ROUNDS, Route};
use super::{Ask, Check, Forwarded, Limiter, Mode, Resolved, Topology, Verdict};
use crate::algorithm::{Cost, Decision, Nanos, Spec};
use crate::cluster::peers::Pulled;
use crate::store::{Holding, Seed, Stale, key};

/// One item of an edge's forwarded batch, as the owner receives it.
#[derive(Clone, Debug)]
pub struct ForwardedItem {
    pub check: Check,
    pub spec: Spec,
    /// When the edge stops waiting, on this node's clock.
    pub deadline: Nanos,
    /// Tiered mode: the edge's ask for its next allotment.
    pub ask: Option<Ask>,
}

/// What pulling a batch's lacking keys found.
#[derive(Debug, Default)]
pub(super) struct Taken {
    /// Every member still transferring answered for these keys.
    pub reached_all: bool,
    /// Keys some member handed over as its own count.
    pub owned: HashSet<Vec<u8>>,
    /// The view changed meanwhile: route again.
    pub stale: bool,
}

impl Limiter {
    /// Decide a key this node owns, in its store, under `t`'s view. Any
    /// key with tiered promises outstanding is decided within what they
    /// leave, in exact mode too (a policy reload or a per-request mode must
    /// not admit what was promised).
    pub(super) fn decide_owned(
        &self,
        k: &[u8],
        spec: &Spec,
        req: Cost,
        t: &Topology,
        now: Nanos,
    ) -> Result<Decision, Stale> {
        self.absorb_own_first(k, t);
        if req.hits > 0 && self.shared.tiers.has_ledger(k) {
            return self
                .decide_reserving(k, spec, req, t, now, None)
                .map(|(d, _)| d);
        }
        self.fenced(t.view, |fence| {
            self.shared
                .store
                .decide_fenced(k, spec, req, now, Seed::Fresh, Some(fence))
        })
    }

    /// Decide here, as the key's owner.
    pub(super) fn decide_here(&self, r: &Resolved<'_>, t: &Topology) -> Result<Verdict, Stale> {
        if r.tiered {
            return self.tiered_here(r, t);
        }
        let now = self.now();
        let decision = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.decide_owned(k, &r.spec, r.check.request, t, now)
        })?;
        Ok(self.verdict(r, decision, self.shared.node_id.clone(), false))
    }

    /// Decide keys this node owns but lacks: take them from the members
    /// still transferring, then decide each. An item whose key only an
    /// unreachable member could hold follows `on_owner_unreachable`; one
    /// whose view changed meanwhile comes back `None` (route it again),
    /// unless this is the `last` round.
    pub(super) async fn decide_lacking<'a>(
        &self,
        items: Vec<(usize, Resolved<'a>)>,
        t: &Arc<Topology>,
        last: bool,
        deadline: tokio::time::Instant,
    ) -> Vec<(usize, Resolved<'a>, Option<Here>)> {
        if items.is_empty() {
            return Vec::new();
        }
        let keys: Vec<Vec<u8>> = items
            .iter()
            .map(|(_, r)| key::encode(&r.check.name, &r.check.unique_key))
            .collect();
        let wait = super::route::budget_left(deadline);
        let taken = self.take_lacking(&keys, t, wait).await;
        items
            .into_iter()
            .zip(keys)
            .map(|((i, r), k)| {
                let v = if taken.stale {
                    None
                } else if taken.reached_all
                    || taken.owned.contains(&k)
                    || self.shared.store.holds_own(&k)
                {
                    self.decide_here_or_hold(&r, t).ok()
                } else {
                    Some(Here::Answered(self.fallback(&r, t, false)))
                };
                let v = match v {
                    None if last => Some(Here::Answered(self.fallback(&r, t, false))),
                    v => v,
                };
                (i, r, v)
            })
            .collect()
    }

    /// Pull `keys` (encoded) from every member of `t`'s view that has not
    /// said `done`, in parallel, one call each, waiting at most `wait`.
    pub(super) async fn take_lacking(
        &self,
        keys: &[Vec<u8>],
        t: &Topology,
        wait: Duration,
    ) -> Taken {
        let sources = t.incoming.sources();
        if sources.is_empty() {
            return Taken {
                reached_all: true,
                ..Taken::default()
            };
        }
        let peers = &self.shared.peers;
        let view = (t.ring.epoch(), t.view);
        let calls = sources.iter().map(|(node, protocol_3)| async move {
            let view = protocol_3.then_some(view);
            (node, peers.pull(node, keys, view, wait).await)
        });
        let answers = futures::future::join_all(calls).await;
        let metrics = &self.shared.metrics.cluster;
        let counted =
            |result: &'static str| metrics.pulls.get_or_create(&vec![("result", result)]).inc();
        let _gate = self.shared.gate.read().await;
        if t.incoming.cancelled() {
            return Taken {
                stale: true,
                ..Taken::default()
            };
        }
        let now = self.now();
        let mut taken = Taken {
            reached_all: true,
            ..Taken::default()
        };
        for (node, answer) in answers {
            match answer {
                Ok(Pulled::States(states)) => {
                    for received in states.into_iter().flatten() {
                        counted("state");
                        let holding = if received.copy {
                            Holding::Copy
                        } else {
                            taken.owned.insert(received.key.clone());
                            Holding::Owned
                        };
                        self.fenced(t.view, |fence| {
                            self.shared.store.merge(
                                &received.key,
                                received.snapshot,
                                now,
                                holding,
                                Some(fence),
                            )
                        });
                    }
                }
                Ok(Pulled::Mismatch) => {
                    counted("mismatch");
                    taken.reached_all = false;
                }
                Err(e) => {
                    counted("unreachable");
                    tracing::debug!(peer = %node, error = %e, "pull failed");
                    taken.reached_all = false;
                }
            }
        }
        taken
    }

    /// An owner's side of a forwarded batch, in one pass: late items are
    /// dropped, keys another node owns by this node's ring are redirected
    /// there, lacking keys are taken from the members still transferring
    /// (one pull each for the batch), then every item is decided.
    pub async fn decide_forwarded(&self, items: Vec<ForwardedItem>) -> Vec<Forwarded> {
        let now = self.now();
        let mut out: Vec<Option<Forwarded>> = vec![None; items.len()];
        let mut todo = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if item.deadline < now {
                self.shared.metrics.cluster.shed.inc();
                out[i] = Some(Forwarded::Expired);
            } else {
                todo.push(i);
            }
        }
        // The earliest deadline of the items still to decide (one already
        // expired must not take the others' time to pull).
        let earliest = todo.iter().map(|&i| items[i].deadline).min().unwrap_or(now);
        let settle_by =
            tokio::time::Instant::now() + Duration::from_nanos(earliest.saturating_sub(now));
        for round in 0..ROUNDS {
            if todo.is_empty() {
                break;
            }
            if round > 0 {
                self.settle_view(settle_by).await;
            }
            let last = round + 1 == ROUNDS;
            let t = self.shared.topology.load_full();
            if t.minority {
                // In a minority this node owns nothing for sure: the edge
                // decides on its lease, as it would for an owner it cannot
                // reach.
                for i in todo {
                    out[i] = Some(Forwarded::Unavailable);
                }
                break;
            }
            let may_own = self.may_own();
            let mut lacking = Vec::new();
            let mut again = Vec::new();
            for i in todo {
                let item = &items[i];
                let route = key::with_encoded(&item.check.name, &item.check.unique_key, |k| {
                    self.route(k, &t, may_own)
                });
                match route {
                    Route::Forward(owner) => {
                        self.shared.metrics.cluster.redirects.inc();
                        out[i] = Some(Forwarded::Redirect(owner));
                    }
                    Route::NoOwner => out[i] = Some(Forwarded::Unavailable),
                    Route::Lacking => lacking.push(i),
                    Route::Here => match self.decide_item(item, &t) {
                        Ok(f) => out[i] = Some(f),
                        Err(Stale) => again.push(i),
                    },
                }
            }
            if !lacking.is_empty() {
                let keys: Vec<Vec<u8>> = lacking
                    .iter()
                    .map(|&i| key::encode(&items[i].check.name, &items[i].check.unique_key))
                    .collect();
                // The whole batch answers at once: the pull may take what
                // is left of its earliest deadline, less the way back.
                let deadline = earliest;
                let left = Duration::from_nanos(deadline.saturating_sub(self.now()));
                let wait = left.saturating_sub((left / 10).max(Duration::from_millis(1)));
                let taken = self.take_lacking(&keys, &t, wait).await;
                let now = self.now();
                for (&i, k) in lacking.iter().zip(keys) {
                    if taken.stale {
                        again.push(i);
                    } else if items[i].deadline < now {
                        // The pull took its time: the edge has given up.
                        self.shared.metrics.cluster.shed.inc();
                        out[i] = Some(Forwarded::Expired);
                    } else if taken.reached_all
                        || taken.owned.contains(&k)
                        || self.shared.store.holds_own(&k)
                    {
                        match self.decide_item(&items[i], &t) {
                            Ok(f) => out[i] = Some(f),
                            Err(Stale) => again.push(i),
                        }
                    } else {
                        // Only a member this node cannot reach could hold
                        // the count: the edge decides without it.
                        out[i] = Some(Forwarded::Unavailable);
                    }
                }
            }
            if last {
                for i in again.drain(..) {
                    out[i] = Some(Forwarded::Unavailable);
                }
            }
            todo = again;
        }
        // Synchronous items wait for their replicas at most half of what
        // is left: the answer must reach the edge in time, or the edge
        // counts this node unreachable (its breaker) for a slow holder.
        let confirm_by = tokio::time::Instant::now()
            + settle_by.saturating_duration_since(tokio::time::Instant::now()) / 2;
        self.confirm_forwarded(&items, &mut out, confirm_by).await;
        out.into_iter()
            .map(|f| f.unwrap_or(Forwarded::Unavailable))
            .collect()
    }

    fn decide_item(&self, item: &ForwardedItem, t: &Topology) -> Result<Forwarded, Stale> {
        let now = self.now();
        let (decision, grant) = key::with_encoded(&item.check.name, &item.check.unique_key, |k| {
            if item.check.mode == Some(Mode::Tiered) {
                self.absorb_own_first(k, t);
                self.decide_reserving(k, &item.spec, item.check.request, t, now, item.ask.as_ref())
            } else {
                self.decide_owned(k, &item.spec, item.check.request, t, now)
                    .map(|d| (d, None))
            }
        })?;
        let reset_gen = key::with_encoded(&item.check.name, &item.check.unique_key, |k| {
            self.shared.store.reset_gen(k)
        });
        Ok(Forwarded::Decided {
            decision,
            approximate: false,
            grant,
            reset_gen,
        })
    }

    pub(super) fn self_id(&self) -> Arc<str> {
        self.shared.node_id.clone()
    }
}
