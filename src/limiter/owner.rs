//! Deciding keys this node owns — for itself or for an edge that forwarded
//! them — and absorbing what edges admitted on leases.

use std::sync::Arc;

use super::{Absorb, Forwarded, Limiter, ReportOutcome, Resolved, Topology, Verdict};
use crate::algorithm::{Nanos, Request, Spec};
use crate::store::{Outcome, Seed, key};

impl Limiter {
    /// How a key this node owns but has no state for starts (DESIGN §4).
    /// Within the grace period after a ring change, if the key's previous
    /// owner is gone, its count died with it: seed from the `remaining` this
    /// node last saw (refilled since), else `⌊capacity / N⌋` — never a full
    /// bucket — and answer approximately for one duration. Otherwise the key
    /// is new, and fresh.
    fn seed(&self, k: &[u8], spec: &Spec, t: &Topology, now: Nanos) -> (Seed, Nanos) {
        let grace = self.shared.settings.ownership_grace;
        if now.saturating_sub(t.changed_at) >= grace {
            return (Seed::Fresh, 0);
        }
        let previous = t.previous.owner(k).map(|m| m.node_id.clone());
        let orphaned = match previous {
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
    fn decide_owned(
        &self,
        k: &[u8],
        spec: &Spec,
        req: Request,
        t: &Topology,
        now: Nanos,
    ) -> Outcome {
        let (seed, until) = self.seed(k, spec, t, now);
        self.shared
            .store
            .decide_seeded(k, spec, req, now, seed, until)
    }

    /// Decide here (this node is the owner, or the ring is empty).
    pub(super) fn decide_here(&self, r: &Resolved<'_>, t: &Topology) -> Verdict {
        let now = self.now();
        let outcome = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.decide_owned(k, &r.spec, r.check.request, t, now)
        });
        self.verdict(
            r,
            outcome.decision,
            self.shared.node_id.clone(),
            outcome.approximate,
        )
    }

    /// An owner's side of a forward: decide, redirect once, or drop if late.
    pub fn decide_forwarded(
        &self,
        check: &super::Check,
        spec: &Spec,
        redirected: bool,
        deadline: Nanos,
    ) -> Forwarded {
        let now = self.now();
        if deadline < now {
            self.shared.metrics.cluster.shed.inc();
            return Forwarded::Expired;
        }
        let t = self.shared.topology.load_full();
        key::with_encoded(&check.name, &check.unique_key, |k| {
            if !redirected
                && let Some(owner) = t.ring.owner(k)
                && owner.node_id != self.shared.node_id
            {
                self.shared.metrics.cluster.redirects.inc();
                return Forwarded::Redirect(owner.node_id.clone());
            }
            let o = self.decide_owned(k, spec, check.request, &t, now);
            Forwarded::Decided {
                decision: o.decision,
                approximate: o.approximate,
            }
        })
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
        let (seed, until) = self.seed(k, spec, t, now);
        let applied =
            self.shared
                .store
                .absorb_report(k, spec, (r.edge, r.seq, r.hits, r.at), seed, until);
        let outcome = if applied {
            ReportOutcome::Applied
        } else {
            ReportOutcome::Duplicate
        };
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
