//! Deciding keys this node owns — for itself or for an edge that forwarded
//! them — pulling a key's state from its previous owner after a ring change,
//! and absorbing what edges admitted on leases.

use std::sync::Arc;

use super::{Absorb, Forwarded, Limiter, ReportOutcome, Resolved, Topology, Verdict};
use crate::algorithm::{Nanos, Request, Spec};
use crate::cluster::wire;
use crate::proto::peer as pb;
use crate::store::{Outcome, Seed, key};

/// Where a new owner may find a key's state (DESIGN §4).
pub(super) struct PullPlan {
    /// The previous owner, then the previous replica holder.
    from: Vec<Arc<str>>,
}

/// Where a key this node's ring says it owns is decided.
pub(super) enum Place {
    /// Here, on the count this node holds (or a fresh or seeded one).
    Here,
    /// Here, after pulling the key's current state.
    Pull(PullPlan),
    /// At the node that pulled the key from this one: its ring is newer.
    Moved(Arc<str>),
}

impl Limiter {
    /// Whether deciding `k` here should first pull its state, and from
    /// whom: never for a key whose count this node holds as its owner (a
    /// replica or a copy left behind does not count); for a key another
    /// node owns by this node's ring (it was redirected here by a node
    /// whose ring is newer), from that owner or its successor; within the
    /// grace period after a ring change, from the previous owner (or the
    /// previous replica holder). Only from nodes still alive (in the ring,
    /// joining or leaving).
    pub(super) fn pull_plan(&self, k: &[u8], t: &Topology, now: Nanos) -> Option<PullPlan> {
        let peers = self.shared.peers.as_ref()?;
        if self.shared.settings.protocol < 2 {
            return None;
        }
        let me = &self.shared.node_id;
        let ring = match t.ring.owner(k) {
            Some(owner) if owner.node_id != *me => &t.ring,
            _ if now.saturating_sub(t.changed_at) < self.shared.settings.ownership_grace => {
                &t.previous
            }
            _ => return None,
        };
        let previous = ring.owner(k)?;
        // Last, as it is the one lookup in the store: the cheap questions
        // above answer "no" for nearly every decision. A replica, or a copy
        // left here when the key moved away, is pulled over: the previous
        // owner may have counted past it.
        if previous.node_id == *me || self.shared.store.holds_own(k) {
            return None;
        }
        let from: Vec<Arc<str>> = [Some(previous), ring.successor(k)]
            .into_iter()
            .flatten()
            .filter(|m| m.node_id != *me)
            .filter(|m| peers.protocol(&m.node_id).is_some())
            .map(|m| m.node_id.clone())
            .collect();
        (!from.is_empty()).then_some(PullPlan { from })
    }

    /// Where to decide `k`, which this node's ring says it owns. If a node
    /// pulled the key from here, the count is there: callers go to it —
    /// unless it is leaving or gone (the key came back to this node), when
    /// this node pulls the count back first. Otherwise as [`Self::pull_plan`]
    /// says.
    pub(super) fn placement(&self, k: &[u8], t: &Topology, now: Nanos) -> Place {
        if let Some(to) = self.shared.store.moved_to(k, now) {
            let live = self
                .shared
                .peers
                .as_ref()
                .is_some_and(|p| p.protocol(&to).is_some());
            return if live && !t.is_leaving(&to) {
                Place::Moved(to)
            } else {
                Place::Pull(PullPlan { from: vec![to] })
            };
        }
        match self.pull_plan(k, t, now) {
            Some(plan) => Place::Pull(plan),
            None => Place::Here,
        }
    }

    /// Pull `k`'s state from the plan's nodes, first answer wins: with the
    /// `Pull` call from a protocol-2 node, or from a protocol-1 node (which
    /// has no `Pull`) by a forwarded peek — `hits: 0`, marked redirected so
    /// even a leaving node decides it — whose `remaining` seeds the key.
    /// Returns false if no node could be asked (the key may be orphaned).
    pub(super) async fn pull(
        &self,
        name: &str,
        unique_key: &str,
        spec: &Spec,
        plan: &PullPlan,
    ) -> bool {
        let Some(peers) = &self.shared.peers else {
            return false;
        };
        let metrics = &self.shared.metrics.cluster;
        let counted =
            |result: &'static str| metrics.pulls.get_or_create(&vec![("result", result)]).inc();
        for node in &plan.from {
            if peers.protocol(node).unwrap_or(0) < 2 {
                if self.peek(peers, node, name, unique_key, spec).await {
                    counted("peek");
                    return true;
                }
                continue;
            }
            let keys = vec![pb::KeyRef {
                name: name.to_string(),
                unique_key: unique_key.to_string(),
            }];
            match peers.pull(node, keys).await {
                Ok(mut results) => {
                    if let Some(Some(state)) = results.pop() {
                        match wire::snapshot_from_wire(&state, &self.shared.bounds) {
                            Ok((k, snapshot)) => {
                                self.shared.store.merge(&k, snapshot, self.now(), true);
                                counted("state");
                            }
                            Err(e) => {
                                tracing::warn!(peer = %node, error = %e, "pulled an invalid state")
                            }
                        }
                    } else {
                        counted("none");
                    }
                    return true;
                }
                Err(e) => tracing::debug!(peer = %node, error = %e, "pull failed"),
            }
        }
        counted("unreachable");
        false
    }

    /// A protocol-1 pull: ask `node` to decide a zero-cost check and seed
    /// the key from the `remaining` it answers.
    async fn peek(
        &self,
        peers: &crate::cluster::peers::Peers,
        node: &str,
        name: &str,
        unique_key: &str,
        spec: &Spec,
    ) -> bool {
        let deadline = self
            .now()
            .saturating_add(peers.settings().timeout.as_nanos() as u64);
        let item = pb::ForwardItem {
            name: name.to_string(),
            unique_key: unique_key.to_string(),
            limit: Some(wire::limit_to_wire(spec)),
            hits: 0,
            drain_over_limit: false,
            nodelay: false,
            redirected: true,
            tiered: None,
            deadline_ns: deadline,
        };
        let answer = match peers.forward(node, item, true).await {
            Ok(pb::ForwardResult {
                result: Some(pb::forward_result::Result::Decision(d)),
            }) => wire::decision_from_wire(&d),
            other => {
                tracing::debug!(peer = %node, answer = ?other.map(|r| r.result), "peek not decided");
                return false;
            }
        };
        match answer {
            Ok(decision) => {
                let k = key::encode(name, unique_key);
                self.shared
                    .store
                    .observe(&k, spec, decision.remaining, self.now());
                true
            }
            Err(e) => {
                tracing::warn!(peer = %node, error = %e, "malformed peek answer");
                false
            }
        }
    }

    /// How a key this node owns but has no state for starts (DESIGN §4).
    /// Within the grace period after a ring change, if the key's previous
    /// owner is gone (or could not be asked: `orphaned`), its count died with
    /// it: seed from the `remaining` this node last saw (refilled since),
    /// else `⌊capacity / N⌋` — never a full bucket — and answer approximately
    /// for one duration. Otherwise the key is new, and fresh.
    fn seed(
        &self,
        k: &[u8],
        spec: &Spec,
        t: &Topology,
        now: Nanos,
        orphaned: bool,
    ) -> (Seed, Nanos) {
        let grace = self.shared.settings.ownership_grace;
        if now.saturating_sub(t.changed_at) >= grace {
            return (Seed::Fresh, 0);
        }
        let orphaned = orphaned
            || match t.previous.owner(k).map(|m| m.node_id.clone()) {
                Some(p) => p != self.shared.node_id && t.ring.member(&p).is_none(),
                None => false,
            };
        if !orphaned {
            return (Seed::Fresh, 0);
        }
        let remaining = self
            .shared
            .leases
            .seen_remaining(k, now)
            .unwrap_or(spec.capacity() / t.size.max(1));
        let until = now.saturating_add(super::period_ns(spec));
        (
            Seed::Consumed(spec.capacity().saturating_sub(remaining)),
            until,
        )
    }

    /// Decide a key this node owns, in its store.
    pub(super) fn decide_owned(
        &self,
        k: &[u8],
        spec: &Spec,
        req: Request,
        t: &Topology,
        now: Nanos,
        orphaned: bool,
    ) -> Outcome {
        let (seed, until) = self.seed(k, spec, t, now, orphaned);
        self.shared
            .store
            .decide_seeded(k, spec, req, now, seed, until)
    }

    /// Decide here (this node is the owner, or the ring is empty).
    pub(super) fn decide_here(&self, r: &Resolved<'_>, t: &Topology) -> Verdict {
        self.decide_here_after(r, t, false)
    }

    fn decide_here_after(&self, r: &Resolved<'_>, t: &Topology, orphaned: bool) -> Verdict {
        let now = self.now();
        let outcome = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.decide_owned(k, &r.spec, r.check.request, t, now, orphaned)
        });
        self.verdict(
            r,
            outcome.decision,
            self.shared.node_id.clone(),
            outcome.approximate,
        )
    }

    /// Decide here (the owner redirected the caller back to this node),
    /// pulling the key's state first if it just moved here — or from the
    /// node it moved to: the rings disagree, and the count comes here whole.
    pub(super) async fn decide_here_pulling(&self, r: &Resolved<'_>, t: &Topology) -> Verdict {
        let place = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.placement(k, t, self.now())
        });
        match place {
            Place::Pull(plan) => self.pull_then_decide(r, plan, t).await,
            Place::Moved(to) => {
                self.pull_then_decide(r, PullPlan { from: vec![to] }, t)
                    .await
            }
            Place::Here => self.decide_here(r, t),
        }
    }

    /// Pull the key's state, then decide here.
    pub(super) async fn pull_then_decide(
        &self,
        r: &Resolved<'_>,
        plan: PullPlan,
        t: &Topology,
    ) -> Verdict {
        let reached = self
            .pull(&r.check.name, &r.check.unique_key, &r.spec, &plan)
            .await;
        self.decide_here_after(r, t, !reached)
    }

    /// An owner's side of a forward: decide (pulling first if the key just
    /// moved here), redirect once, or drop if late.
    pub async fn decide_forwarded(
        &self,
        check: &super::Check,
        spec: &Spec,
        redirected: bool,
        deadline: Nanos,
        ask: Option<&super::Ask>,
    ) -> Forwarded {
        let now = self.now();
        if deadline < now {
            self.shared.metrics.cluster.shed.inc();
            return Forwarded::Expired;
        }
        let t = self.shared.topology.load_full();
        let (redirect, plan) = key::with_encoded(&check.name, &check.unique_key, |k| {
            match t.ring.owner(k) {
                // A leaving node decides nothing more (a peek changes
                // nothing): its count is on its way to the new owner.
                Some(owner)
                    if owner.node_id != self.shared.node_id
                        && (!redirected
                            || (check.request.hits > 0 && t.is_leaving(&self.shared.node_id))) =>
                {
                    (Some(owner.node_id.clone()), None)
                }
                // Redirected here by a node whose ring names this one.
                Some(owner) if owner.node_id != self.shared.node_id => {
                    (None, self.pull_plan(k, &t, now))
                }
                _ => match self.placement(k, &t, now) {
                    // A new owner pulled the key while this ring still names
                    // this node: send the caller there, even a redirected
                    // one (this node's count is a copy now).
                    Place::Moved(to) => (Some(to), None),
                    Place::Pull(plan) => (None, Some(plan)),
                    Place::Here => (None, None),
                },
            }
        });
        if let Some(owner) = redirect {
            self.shared.metrics.cluster.redirects.inc();
            return Forwarded::Redirect(owner);
        }
        let orphaned = match plan {
            Some(plan) => !self.pull(&check.name, &check.unique_key, spec, &plan).await,
            None => false,
        };
        let now = self.now();
        let (o, grant) = key::with_encoded(&check.name, &check.unique_key, |k| {
            if check.mode == Some(super::Mode::Tiered) {
                self.decide_reserving(k, spec, check.request, &t, now, orphaned, ask)
            } else {
                (
                    self.decide_owned(k, spec, check.request, &t, now, orphaned),
                    None,
                )
            }
        });
        Forwarded::Decided {
            decision: o.decision,
            approximate: o.approximate,
            grant,
        }
    }

    /// Absorb what an edge admitted on a lease, once per `(edge, key, seq)`.
    pub fn absorb_report(
        &self,
        name: &str,
        unique_key: &str,
        spec: &Spec,
        report: &Absorb<'_>,
    ) -> ReportOutcome {
        let t = self.shared.topology.load_full();
        key::with_encoded(name, unique_key, |k| {
            self.absorb_encoded(k, spec, report, &t)
        })
    }

    pub(super) fn absorb_encoded(
        &self,
        k: &[u8],
        spec: &Spec,
        r: &Absorb<'_>,
        t: &Topology,
    ) -> ReportOutcome {
        if let Some(owner) = t.ring.owner(k)
            && owner.node_id != self.shared.node_id
        {
            return ReportOutcome::NotOwner;
        }
        // A key this node has no state for starts as a decision would: an
        // orphaned key from what was seen of it, never from a full bucket.
        let now = self.now();
        let (seed, until) = self.seed(k, spec, t, now, false);
        let applied =
            self.shared
                .store
                .absorb_report(k, spec, (r.edge, r.seq, r.hits, r.at), seed, until);
        let outcome = if applied {
            ReportOutcome::Applied
        } else {
            ReportOutcome::Duplicate
        };
        if applied {
            // Reported hits of a tiered allotment are no longer promised.
            self.shared.tiers.reported(k, r.edge, r.hits);
        }
        let label = if applied { "applied" } else { "duplicate" };
        self.shared
            .metrics
            .cluster
            .reports
            .get_or_create(&vec![("outcome", label)])
            .inc();
        outcome
    }

    pub(super) fn self_id(&self) -> Arc<str> {
        self.shared.node_id.clone()
    }
}
