//! The `Limiter`: the one handle the services call.
//!
//! It ties the store, the policies, the clock and the metrics together.
//! Services convert wire messages to [`Check`]s and [`Verdict`]s back; all
//! the business rules (policy resolution, shadow mode, counting) live here.
//! Cheap to clone: a handle over `Arc<Shared>`.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::algorithm::{self, Decision, Nanos, Request, Spec};
use crate::clock::SharedClock;
use crate::cluster;
use crate::cluster::peers::Peers;
use crate::cluster::ring::Ring;
use crate::metrics::Metrics;
use crate::policy::{Policies, Policy};
use crate::proto::peer as pb;
use crate::store::{Store, TopBy, View, key};

/// Which limit a check is against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitRef {
    Inline(Spec),
    Policy(String),
}

/// One validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub unique_key: String,
    pub limit: LimitRef,
    pub request: Request,
    /// Forward at once instead of waiting for a batch (latency over throughput).
    pub unbatched: bool,
}

/// What an owner does with a forwarded item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    Decided(Decision),
    /// Not the owner by this node's ring: this node is.
    Redirect(Arc<str>),
    /// Arrived past its deadline: dropped, nothing consumed.
    Expired,
}

/// The answer's status (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    UnderLimit,
    OverLimit,
    Unavailable,
}

/// Why — a superset of the algorithm's reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    WithinLimit,
    LimitExceeded,
    CostExceedsCapacity,
    OwnerUnreachable,
    Overloaded,
    /// Shadow mode: would have been refused, allowed anyway.
    Shadow,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::WithinLimit,
        Reason::LimitExceeded,
        Reason::CostExceedsCapacity,
        Reason::OwnerUnreachable,
        Reason::Overloaded,
        Reason::Shadow,
    ];

    pub fn status(self) -> Status {
        match self {
            Reason::WithinLimit | Reason::Shadow => Status::UnderLimit,
            Reason::LimitExceeded | Reason::CostExceedsCapacity => Status::OverLimit,
            Reason::OwnerUnreachable | Reason::Overloaded => Status::Unavailable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Reason::WithinLimit => "within_limit",
            Reason::LimitExceeded => "limit_exceeded",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::OwnerUnreachable => "owner_unreachable",
            Reason::Overloaded => "overloaded",
            Reason::Shadow => "shadow",
        }
    }
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::UnderLimit => "under_limit",
            Status::OverLimit => "over_limit",
            Status::Unavailable => "unavailable",
        }
    }
}

/// The answer to one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    pub reason: Reason,
    pub decision: Decision,
    /// Decided on a lease rather than by the owner.
    pub approximate: bool,
    pub owner: Arc<str>,
}

/// A request that could not be decided, naming the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ItemError {
    pub field: &'static str,
    pub message: String,
}

impl ItemError {
    pub fn new(field: &'static str, message: impl Into<String>) -> ItemError {
        ItemError {
            field,
            message: message.into(),
        }
    }
}

#[derive(Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

struct Shared {
    node_id: Arc<str>,
    store: Arc<Store>,
    /// Swapped whole on a config reload; read lock-free per request.
    policies: ArcSwap<Policies>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    /// The current ring; empty means "decide everything here".
    ring: ArcSwap<Ring>,
    peers: Option<Peers>,
}

/// A check resolved against the policies: what to decide and how to report it.
struct Resolved<'a> {
    check: &'a Check,
    spec: Spec,
    shadow: bool,
    label: Arc<str>,
}

impl Limiter {
    pub fn new(
        node_id: &str,
        store: Arc<Store>,
        policies: Policies,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        peers: Option<Peers>,
    ) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                node_id: Arc::from(node_id),
                store,
                policies: ArcSwap::from_pointee(policies),
                clock,
                metrics,
                ring: ArcSwap::from_pointee(Ring::default()),
                peers,
            }),
        }
    }

    /// Follow a new ring (membership calls this on every change).
    pub fn set_ring(&self, ring: Arc<Ring>) {
        if let Some(peers) = &self.shared.peers {
            peers.sync(&ring);
        }
        self.shared.ring.store(ring);
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.shared.ring.load_full()
    }

    pub fn node_id(&self) -> &Arc<str> {
        &self.shared.node_id
    }

    pub fn now(&self) -> Nanos {
        self.shared.clock.now()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Replace the named policies (config reload).
    pub fn set_policies(&self, policies: Policies) {
        self.shared.policies.store(Arc::new(policies));
    }

    pub fn policies(&self) -> Arc<Policies> {
        self.shared.policies.load_full()
    }

    /// Decide one check (see [`Limiter::check_batch`]).
    pub async fn check(&self, check: Check) -> Result<Verdict, ItemError> {
        self.check_batch(vec![Ok(check)]).await.remove(0)
    }

    /// Decide a batch, in order: keys this node owns here, the others at
    /// their owners — forwarded in parallel, one micro-batch per owner.
    /// Invalid items stay errors; they never fail the batch.
    pub async fn check_batch(
        &self,
        items: Vec<Result<Check, ItemError>>,
    ) -> Vec<Result<Verdict, ItemError>> {
        let policies = self.shared.policies.load_full();
        let ring = self.shared.ring.load_full();
        let mut out: Vec<Option<Result<Verdict, ItemError>>> = vec![None; items.len()];
        let mut remote = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let resolved = match item
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|c| self.resolve(c, &policies))
            {
                Ok(r) => r,
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            };
            let owner = key::with_encoded(&resolved.check.name, &resolved.check.unique_key, |k| {
                ring.owner(k).map(|m| m.node_id.clone())
            });
            match owner {
                Some(owner) if owner != self.shared.node_id && self.shared.peers.is_some() => {
                    remote.push(async move { (i, self.forward(&resolved, owner).await) });
                }
                _ => out[i] = Some(Ok(self.decide_here(&resolved))),
            }
        }
        for (i, verdict) in futures::future::join_all(remote).await {
            out[i] = Some(Ok(verdict));
        }
        out.into_iter()
            .map(|v| v.unwrap_or_else(|| Err(ItemError::new("request", "not decided"))))
            .collect()
    }

    fn resolve<'a>(
        &self,
        check: &'a Check,
        policies: &Policies,
    ) -> Result<Resolved<'a>, ItemError> {
        Ok(match &check.limit {
            LimitRef::Inline(spec) => Resolved {
                check,
                spec: *spec,
                shadow: false,
                label: Arc::from(check.name.as_str()),
            },
            LimitRef::Policy(name) => match policies.get(name) {
                Some(Policy {
                    spec, shadow, name, ..
                }) => Resolved {
                    check,
                    spec: *spec,
                    shadow: *shadow,
                    label: name.clone(),
                },
                None => return Err(ItemError::new("policy", format!("unknown policy {name:?}"))),
            },
        })
    }

    /// Decide in this node's store.
    fn decide_here(&self, r: &Resolved<'_>) -> Verdict {
        let now = self.now();
        let decision = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.shared.store.decide(k, &r.spec, r.check.request, now)
        });
        self.verdict(r, decision, self.shared.node_id.clone())
    }

    /// Turn an owner's decision into the edge's verdict, counting it here
    /// (at the edge) so that each decision is counted once.
    fn verdict(&self, r: &Resolved<'_>, decision: Decision, owner: Arc<str>) -> Verdict {
        let reason = match decision.reason {
            algorithm::Reason::WithinLimit => Reason::WithinLimit,
            _ if r.shadow => Reason::Shadow,
            algorithm::Reason::LimitExceeded => Reason::LimitExceeded,
            algorithm::Reason::CostExceedsCapacity => Reason::CostExceedsCapacity,
        };
        self.shared.metrics.decisions.count(&r.label, reason);
        Verdict {
            status: reason.status(),
            reason,
            decision,
            approximate: false,
            owner,
        }
    }

    /// No owner answered. Until leases exist (the fallback issue) the edge
    /// cannot decide for a key it does not own: it answers UNAVAILABLE.
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
            owner: self.shared.node_id.clone(),
        }
    }

    /// Forward to `owner`, following at most one redirect.
    async fn forward(&self, r: &Resolved<'_>, owner: Arc<str>) -> Verdict {
        let Some(peers) = &self.shared.peers else {
            return self.decide_here(r);
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
        };
        let mut target = owner;
        for _ in 0..2 {
            let result = peers
                .forward(&target, item.clone(), r.check.unbatched)
                .await;
            match result.map(|res| res.result) {
                Ok(Some(pb::forward_result::Result::Decision(d))) => {
                    match cluster::wire::decision_from_wire(&d) {
                        Ok(decision) => {
                            return self.verdict(r, decision, Arc::from(d.owner.as_str()));
                        }
                        Err(e) => {
                            tracing::warn!(peer = %target, error = %e, "malformed decision from a peer");
                            break;
                        }
                    }
                }
                Ok(Some(pb::forward_result::Result::Redirect(to))) if !item.redirected => {
                    if *to.node_id == *self.shared.node_id {
                        return self.decide_here(r);
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
        self.unavailable(r)
    }

    /// An owner's side of a forward: decide, redirect once, or drop if late.
    pub fn decide_forwarded(
        &self,
        check: &Check,
        spec: &Spec,
        redirected: bool,
        deadline: Nanos,
    ) -> Forwarded {
        let now = self.now();
        if deadline < now {
            return Forwarded::Expired;
        }
        let ring = self.shared.ring.load();
        key::with_encoded(&check.name, &check.unique_key, |k| {
            if !redirected
                && let Some(owner) = ring.owner(k)
                && owner.node_id != self.shared.node_id
            {
                self.shared.metrics.cluster.redirects.inc();
                return Forwarded::Redirect(owner.node_id.clone());
            }
            Forwarded::Decided(self.shared.store.decide(k, spec, check.request, now))
        })
    }

    /// Reset a key (admin). Returns whether it was in memory.
    pub fn reset(&self, name: &str, unique_key: &str) -> bool {
        let now = self.now();
        key::with_encoded(name, unique_key, |k| self.shared.store.reset(k, now))
    }

    /// Inspect a key (admin).
    pub fn inspect(&self, name: &str, unique_key: &str) -> Option<View> {
        let now = self.now();
        key::with_encoded(name, unique_key, |k| self.shared.store.inspect(k, now))
    }

    /// The top keys (admin): `(name, unique_key, view)`.
    pub fn top(&self, by: TopBy, n: usize) -> Vec<(String, String, View)> {
        self.shared
            .store
            .top(by, n, self.now())
            .into_iter()
            .filter_map(|(k, v)| {
                let (name, key) = key::decode(&k)?;
                Some((name.to_string(), key.to_string(), v))
            })
            .collect()
    }

    /// Forget idle keys now (the background sweeper calls this).
    pub fn sweep(&self) -> usize {
        self.shared.store.sweep(self.now())
    }
}
