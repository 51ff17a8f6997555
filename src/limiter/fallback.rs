//! Forwarding to owners, and deciding without them.
//!
//! When an owner answers, the edge remembers its `remaining` (the seed of a
//! future lease). When it cannot be reached — an error, a deadline, an open
//! breaker, a full queue — or this node sees fewer than a majority of the
//! cluster, the edge decides by the key's `on_owner_unreachable`:
//! `local_share` on its `1/N` lease (approximate answers, reported to the
//! owner later), `allow`, or `deny` (`UNAVAILABLE` / `OWNER_UNREACHABLE`).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Absorb, Limiter, Path, Reason, ReportOutcome, Resolved, Topology, Verdict};
use crate::algorithm::{self, Decision};
use crate::cluster;
use crate::lease::Report;
use crate::policy::OnOwnerUnreachable;
use crate::proto::peer as pb;
use crate::store::key;

impl Limiter {
    /// Forward to `owner`, following at most two redirects; fall back when
    /// no owner answers.
    pub(super) async fn forward(&self, r: &Resolved<'_>, owner: Arc<str>, t: &Topology) -> Verdict {
        self.forward_asking(r, owner, t, None).await.0
    }

    /// [`Limiter::forward`], with a tiered-mode ask: the owner's answer may
    /// carry a grant, `(amount, ttl)`.
    pub(super) async fn forward_asking(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
        t: &Topology,
        ask: Option<pb::TieredAsk>,
    ) -> (Verdict, Option<(u64, u64)>) {
        let Some(peers) = &self.shared.peers else {
            return (self.decide_here(r, t), None);
        };
        let deadline = self
            .now()
            .saturating_add(peers.settings().timeout.as_nanos() as u64);
        let mut item = pb::ForwardItem {
            name: r.check.name.clone(),
            unique_key: r.check.unique_key.clone(),
            limit: Some(cluster::wire::limit_to_wire(&r.spec)),
            hits: r.check.request.hits,
            drain_over_limit: r.check.request.drain_over_limit,
            nodelay: r.check.request.nodelay,
            redirected: false,
            deadline_ns: deadline,
            tiered: ask,
        };
        let mut target = owner;
        // The owner, then at most two redirects: one where the owner's ring
        // is newer than this one, one where a node pulled the key from it.
        for _ in 0..3 {
            let result = peers
                .forward(&target, item.clone(), r.check.unbatched)
                .await;
            match result.map(|res| res.result) {
                Ok(Some(pb::forward_result::Result::Decision(d))) => {
                    match cluster::wire::decision_from_wire(&d) {
                        Ok(decision) => {
                            let now = self.now();
                            key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                                self.shared.leases.observe(k, &r.spec, &decision, now)
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
                Ok(Some(pb::forward_result::Result::Redirect(to))) => {
                    if *to.node_id == *self.shared.node_id {
                        // The owner's ring says this node owns the key.
                        return (self.decide_here_pulling(r, t).await, None);
                    }
                    item.redirected = true;
                    target = Arc::from(to.node_id.as_str());
                }
                Ok(other) => {
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

    /// Decide without the owner, as the key's `on_owner_unreachable` says.
    /// `own` keys (minority mode) seed their lease from this node's store.
    pub(super) fn fallback(&self, r: &Resolved<'_>, t: &Topology, minority: bool) -> Verdict {
        let metrics = &self.shared.metrics;
        let now = self.now();
        match r.fallback {
            OnOwnerUnreachable::Deny => {
                metrics.cluster.fallback("deny");
                self.unavailable(r)
            }
            OnOwnerUnreachable::Allow => {
                metrics.cluster.fallback("allow");
                let decision = Decision {
                    reason: algorithm::Reason::WithinLimit,
                    limit: r.spec.limit(),
                    remaining: 0,
                    reset_at: now,
                    retry_after: None,
                    delay: 0,
                };
                let mut v = self.verdict(r, decision, self.self_id(), true);
                v.path = Path::Fallback;
                v
            }
            OnOwnerUnreachable::LocalShare => {
                metrics.cluster.fallback("lease");
                let decision = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                    let leases = &self.shared.leases;
                    if minority
                        && leases.seen_remaining(k, now).is_none()
                        && let Some((_, remaining)) = self.shared.store.remaining(k, now)
                    {
                        // This node owned the key: its own count is the seed.
                        let seen = Decision {
                            reason: algorithm::Reason::WithinLimit,
                            limit: r.spec.limit(),
                            remaining,
                            reset_at: now,
                            retry_after: None,
                            delay: 0,
                        };
                        leases.observe(k, &r.spec, &seen, now);
                    }
                    leases.decide(k, &r.spec, r.check.request, t.size, now)
                });
                let mut v = self.verdict(r, decision, self.self_id(), true);
                v.path = Path::Fallback;
                v
            }
        }
    }

    /// No decision: `UNAVAILABLE` / `OWNER_UNREACHABLE`, never `OVER_LIMIT`.
    fn unavailable(&self, r: &Resolved<'_>) -> Verdict {
        let reason = Reason::OwnerUnreachable;
        self.shared.metrics.decisions.count(&r.label, reason);
        Verdict {
            status: reason.status(),
            reason,
            decision: Decision {
                reason: algorithm::Reason::LimitExceeded,
                limit: r.spec.limit(),
                remaining: 0,
                reset_at: self.now(),
                retry_after: None,
                delay: 0,
            },
            approximate: false,
            owner: self.self_id(),
            label: r.label.clone(),
            window: super::period_ns(&r.spec),
            path: Path::Fallback,
        }
    }

    /// Send what this edge admitted on leases to each key's current owner
    /// (absorbing its own keys here). Unacknowledged reports are resent
    /// unchanged next time; returns how many were acknowledged.
    pub async fn flush_reports(&self) -> usize {
        let (held, reserved) = self.shared.tiers.figures(self.now());
        let m = &self.shared.metrics.cluster;
        m.tiered_held.set(i64::try_from(held).unwrap_or(i64::MAX));
        m.tiered_reserved
            .set(i64::try_from(reserved).unwrap_or(i64::MAX));
        let leases = &self.shared.leases;
        let reports = leases.reports();
        let t = self.shared.topology.load_full();
        let mut acked = 0;
        let mut by_owner: HashMap<Arc<str>, Vec<Report>> = HashMap::new();
        for report in reports {
            match t.ring.owner(&report.key).map(|m| m.node_id.clone()) {
                Some(owner) if owner != self.shared.node_id && !t.minority => {
                    by_owner.entry(owner).or_default().push(report);
                }
                // In a minority this node is not the owner of anything for
                // sure; hold the report until it sees a majority again.
                Some(_) if t.minority => {}
                _ => {
                    let absorb = Absorb {
                        edge: &self.shared.node_id,
                        seq: report.seq,
                        hits: report.hits,
                        at: report.at,
                    };
                    let o = self.absorb_encoded(&report.key, &report.spec, &absorb, &t);
                    if o != ReportOutcome::NotOwner {
                        leases.acknowledge(&report);
                        acked += 1;
                    }
                }
            }
        }
        if let Some(peers) = &self.shared.peers {
            for (owner, reports) in by_owner {
                let items = reports
                    .iter()
                    .filter_map(|rep| {
                        let (name, unique_key) = key::decode(&rep.key)?;
                        Some(pb::ReportItem {
                            name: name.to_string(),
                            unique_key: unique_key.to_string(),
                            limit: Some(cluster::wire::limit_to_wire(&rep.spec)),
                            seq: rep.seq,
                            hits: rep.hits,
                            at_ns: rep.at,
                        })
                    })
                    .collect();
                match peers.report(&owner, items).await {
                    Ok(outcomes) => {
                        for (rep, o) in reports.iter().zip(outcomes) {
                            let applied = o == pb::ReportOutcome::Applied as i32
                                || o == pb::ReportOutcome::Duplicate as i32;
                            if applied {
                                leases.acknowledge(rep);
                                acked += 1;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(peer = %owner, error = %e, "lease report not delivered; will retry")
                    }
                }
            }
        }
        self.shared
            .metrics
            .cluster
            .unreported
            .set(leases.unreported() as i64);
        acked
    }
}
