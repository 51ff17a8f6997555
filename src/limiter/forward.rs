//! Sending a key to its owner, at most once, and reading the answer.
//!
//! When an owner answers, the edge remembers its `remaining` (the seed of a
//! future lease). A node decides only keys its own ring gives it: an owner
//! whose ring disagrees answers with a redirect, and the edge follows at
//! most three (rings converge in a gossip round or two), pausing briefly
//! when the redirects go in circles, before it decides without the owner.

use std::sync::Arc;

use super::{Limiter, Resolved, Topology, Verdict};
use crate::cluster::peers::{Forward, ForwardError, Forwarded, Granted, TieredAsk};
use crate::policy::OnOwnerUnreachable;
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
    /// carry a grant.
    pub(super) async fn forward_asking(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
        t: &Topology,
        ask: Option<TieredAsk>,
        deadline: tokio::time::Instant,
    ) -> (Verdict, Option<Granted>) {
        let peers = &self.shared.peers;
        let budget = super::route::budget_left(deadline).as_nanos() as u64;
        let mut item = Forward {
            name: r.check.name.clone(),
            unique_key: r.check.unique_key.clone(),
            spec: r.spec,
            hits: r.check.request.hits,
            drain_over_limit: r.check.request.drain_over_limit,
            nodelay: r.check.request.nodelay,
            redirected: false,
            deadline_ns: self.now().saturating_add(budget),
            tiered: ask,
            budget_ns: budget,
            sync_replica: r.sync,
        };
        // What this edge spent on a fallback lease for the key goes to the
        // owner before the key does (`report_first`; a tiered allotment's
        // hits are not waited for: the owner that granted it holds them as
        // promised).
        let unreported = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.shared.leases.report_for(k)
        });
        if let Some(report) = unreported
            && !self.report_first(report, &owner, deadline).await
        {
            return (self.fallback(r, t, false), None);
        }
        let mut target = owner;
        let mut tried: Vec<Arc<str>> = Vec::with_capacity(4);
        // The owner, then at most three redirects. Rings disagree only
        // while a change spreads (a gossip round or two): a redirect back to
        // a node already asked means someone's ring lags — give it a moment
        // (within the caller's budget) before asking again.
        for attempt in 0..4 {
            if tried.contains(&target) {
                let pause = std::time::Duration::from_millis(2 << attempt)
                    .min(super::route::budget_left(deadline) / 4);
                tokio::time::sleep(pause).await;
            }
            tried.push(target.clone());
            if r.sync && !knows_sync(t, &target) {
                // The previous release ignores the flag and answers at once:
                // its exact answer would not be a confirmed one.
                break;
            }
            item.budget_ns = super::route::budget_left(deadline).as_nanos() as u64;
            if item.budget_ns == 0 {
                self.shared.metrics.cluster.late_forwards.inc();
                break;
            }
            // A sync item travels alone: the owner's wait for its replica
            // must not hold up other keys batched with it.
            let call = peers.forward(&target, &item, r.check.unbatched || r.sync);
            let Ok(result) = tokio::time::timeout_at(deadline, call).await else {
                tracing::debug!(peer = %target, "forward: the caller's deadline passed");
                self.shared.metrics.cluster.late_forwards.inc();
                break;
            };
            match result {
                Ok(Forwarded::Decided {
                    decision,
                    approximate,
                    grant,
                    reset_gen,
                }) => {
                    let now = self.now();
                    key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                        self.shared
                            .leases
                            .observe(k, &r.spec, &decision, reset_gen, now)
                    });
                    // The node asked answered: it is the owner.
                    let verdict = self.verdict(r, decision, target, approximate);
                    return (verdict, grant);
                }
                Ok(Forwarded::Redirect(to)) => {
                    item.redirected = true;
                    if *to == *self.shared.node_id {
                        // Its ring names this node; this node's names it.
                        // Whichever lags, follow this node's ring when it
                        // has caught up.
                        tokio::time::sleep(
                            std::time::Duration::from_millis(2 << attempt)
                                .min(super::route::budget_left(deadline) / 4),
                        )
                        .await;
                        match self
                            .ring()
                            .owner(&key::encode(&r.check.name, &r.check.unique_key))
                        {
                            Some(o) if o.node_id != self.shared.node_id => {
                                target = o.node_id.clone();
                            }
                            // This node's ring caught up: it owns the key.
                            _ => return (self.decide_rerouted(r, deadline).await, None),
                        }
                    } else {
                        target = to;
                    }
                }
                Ok(other) => {
                    if other == Forwarded::Expired {
                        self.shared.metrics.cluster.late_forwards.inc();
                    }
                    // An expired or unavailable answer.
                    tracing::debug!(peer = %target, answer = ?other, "forward not decided");
                    break;
                }
                Err(e @ ForwardError::Malformed { .. })
                    if r.fallback == OnOwnerUnreachable::LocalShare && !r.shadow =>
                {
                    // The owner decided, so it may have counted the hit: a
                    // lease decision on top could count it twice.
                    tracing::warn!(error = %e, "forward answered badly");
                    return (self.unavailable(r, super::Reason::OwnerUnreachable), None);
                }
                Err(e @ (ForwardError::Malformed { .. } | ForwardError::BadAnswer { .. })) => {
                    tracing::warn!(error = %e, "forward answered badly");
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

    /// Decide `r` here after the owner's ring named this node and this
    /// node's ring caught up: under the view now current (taking the key
    /// from the members still transferring if it lacks it), or without the
    /// owner if the view moved it elsewhere again.
    async fn decide_rerouted(&self, r: &Resolved<'_>, deadline: tokio::time::Instant) -> Verdict {
        let t = self.shared.topology.load_full();
        if t.minority {
            return self.fallback(r, &t, true);
        }
        let route = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.route(k, &t, self.may_own())
        });
        let decided = match route {
            super::route::Route::Here => self.decide_here_confirmed(r, &t, deadline).await,
            super::route::Route::Lacking => {
                let k = key::encode(&r.check.name, &r.check.unique_key);
                let taken = self
                    .take_lacking(
                        std::slice::from_ref(&k),
                        &t,
                        super::route::budget_left(deadline),
                    )
                    .await;
                let took = !taken.stale && (taken.reached_all || taken.owned.contains(&k));
                if took {
                    self.decide_here_confirmed(r, &t, deadline).await
                } else {
                    None
                }
            }
            _ => None,
        };
        decided.unwrap_or_else(|| self.fallback(r, &t, false))
    }
}

/// Whether `node` speaks protocol 3, whose owners honour `sync_replica` (a
/// member unknown here is taken to: its answer is checked as any other).
fn knows_sync(t: &Topology, node: &str) -> bool {
    t.ring
        .members()
        .iter()
        .find(|m| &*m.node_id == node)
        .is_none_or(|m| m.protocol >= 3)
}
