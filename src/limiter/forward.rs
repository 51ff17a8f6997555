//! Sending a key to its owner, at most once, and reading the answer.
//!
//! When an owner answers, the edge remembers its `remaining` (the seed of a
//! future lease). A node decides only keys its own ring gives it: an owner
//! whose ring disagrees answers with a redirect, and the edge follows at
//! most two (rings converge in a gossip round or two) before it decides
//! without the owner.

use std::sync::Arc;

use super::{Limiter, Resolved, Topology, Verdict};
use crate::cluster;
use crate::proto::peer as pb;
use crate::store::key;

impl Limiter {
    /// Forward to `owner`, following at most two redirects; fall back when
    /// no owner answers.
    pub(super) async fn forward(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
        t: &Topology,
        deadline: tokio::time::Instant,
    ) -> Verdict {
        self.forward_asking(r, owner, t, None, deadline).await.0
    }

    /// [`Limiter::forward`], with a tiered-mode ask: the owner's answer may
    /// carry a grant, `(amount, ttl)`.
    pub(super) async fn forward_asking(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
        t: &Topology,
        ask: Option<pb::TieredAsk>,
        deadline: tokio::time::Instant,
    ) -> (Verdict, Option<(u64, u64)>) {
        let peers = &self.shared.peers;
        let budget = super::route::budget_left(deadline).as_nanos() as u64;
        let mut item = pb::ForwardItem {
            name: r.check.name.clone(),
            unique_key: r.check.unique_key.clone(),
            limit: Some(cluster::wire::limit_to_wire(&r.spec)),
            hits: r.check.request.hits,
            drain_over_limit: r.check.request.drain_over_limit,
            nodelay: r.check.request.nodelay,
            redirected: false,
            // For protocol-2 owners, which read an absolute deadline.
            deadline_ns: self.now().saturating_add(budget),
            tiered: ask,
            budget_ns: budget,
        };
        let mut target = owner;
        // The owner, then at most two redirects.
        for _ in 0..3 {
            item.budget_ns = super::route::budget_left(deadline).as_nanos() as u64;
            if item.budget_ns == 0 {
                break;
            }
            let call = peers.forward(&target, item.clone(), r.check.unbatched);
            let Ok(result) = tokio::time::timeout_at(deadline, call).await else {
                tracing::debug!(peer = %target, "forward: the caller's deadline passed");
                break;
            };
            match result.map(|res| res.result) {
                Ok(Some(pb::forward_result::Result::Decision(d))) => {
                    match cluster::wire::decision_from_wire(&d) {
                        Ok(decision) => {
                            let now = self.now();
                            key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                                self.shared
                                    .leases
                                    .observe(k, &r.spec, &decision, d.reset_gen, now)
                            });
                            let grant = d.grant.map(|g| (g.amount, g.ttl_ns));
                            let verdict = self.verdict(
                                r,
                                decision,
                                Arc::from(d.owner.as_str()),
                                d.approximate,
                            );
                            return (verdict, grant);
                        }
                        Err(e) => {
                            tracing::warn!(peer = %target, error = %e, "malformed decision from a peer");
                            break;
                        }
                    }
                }
                Ok(Some(pb::forward_result::Result::Redirect(to)))
                    if *to.node_id != *self.shared.node_id =>
                {
                    item.redirected = true;
                    target = Arc::from(to.node_id.as_str());
                }
                Ok(other) => {
                    // A redirect back here (the rings disagree: this node's
                    // names the other), an expired or unavailable answer.
                    tracing::debug!(peer = %target, answer = ?other, "forward not decided");
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "forward failed");
                    break;
                }
            }
        }
        (self.fallback(r, t, false), None)
    }
}
