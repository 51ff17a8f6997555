//! Deciding without the owner.
//!
//! When the owner cannot be reached — an error, a deadline, an open
//! breaker, a full queue, an owner that cannot answer for the key — or this
//! node sees fewer than a majority of the cluster, or it may own nothing
//! right now, the edge decides by the key's `on_owner_unreachable` — except
//! that a node joining (at start, or rejoining after being away) with no
//! ring to name an owner answers `NOT_READY` for `local_share` keys
//! instead (see `route.rs`): `local_share` on its `1/N` lease
//! (approximate answers, reported to the owner later), `allow`, or `deny`
//! (`UNAVAILABLE` / `OWNER_UNREACHABLE`).

use super::{Limiter, Path, Reason, Resolved, Topology, Verdict};
use crate::algorithm::{self, Decision};
use crate::policy::OnOwnerUnreachable;
use crate::store::key;

impl Limiter {
    /// Decide without the owner, as the key's `on_owner_unreachable` says.
    /// `own` keys (minority mode) seed their lease from this node's store.
    pub(super) fn fallback(&self, r: &Resolved<'_>, t: &Topology, minority: bool) -> Verdict {
        let metrics = &self.shared.metrics;
        let now = self.now();
        match r.fallback {
            OnOwnerUnreachable::Deny => {
                metrics.cluster.fallback("deny");
                self.unavailable(r, Reason::OwnerUnreachable)
            }
            OnOwnerUnreachable::Allow => {
                metrics.cluster.fallback("allow");
                let decision = Decision {
                    reason: algorithm::Outcome::WithinLimit,
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
                        && self.shared.store.holds_own(k)
                        && let Some((_, remaining)) = self.shared.store.remaining(k, now)
                    {
                        // This node owned the key (a copy — after a rejoin,
                        // say — is not its count): its own count is the seed.
                        let seen = Decision {
                            reason: algorithm::Outcome::WithinLimit,
                            limit: r.spec.limit(),
                            remaining,
                            reset_at: now,
                            retry_after: None,
                            delay: 0,
                        };
                        let reset_gen = self.shared.store.reset_gen(k);
                        leases.observe(k, &r.spec, &seen, reset_gen, now);
                    }
                    leases.decide(k, &r.spec, r.check.request, t.size, now)
                });
                let mut v = self.verdict(r, decision, self.self_id(), true);
                v.path = Path::Fallback;
                v
            }
        }
    }

    /// No decision: `UNAVAILABLE` for `reason` (never `OVER_LIMIT`),
    /// nothing consumed.
    pub(super) fn unavailable(&self, r: &Resolved<'_>, reason: Reason) -> Verdict {
        self.shared.metrics.decisions.count(r.label(), reason);
        Verdict {
            status: reason.status(),
            reason,
            decision: Decision {
                reason: algorithm::Outcome::LimitExceeded,
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
}
