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
use crate::metrics::Metrics;
use crate::policy::{Policies, Policy};
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
}

impl Limiter {
    pub fn new(
        node_id: &str,
        store: Arc<Store>,
        policies: Policies,
        clock: SharedClock,
        metrics: Arc<Metrics>,
    ) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                node_id: Arc::from(node_id),
                store,
                policies: ArcSwap::from_pointee(policies),
                clock,
                metrics,
            }),
        }
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

    /// Decide one check.
    pub fn check(&self, check: &Check) -> Result<Verdict, ItemError> {
        let policies = self.shared.policies.load();
        let (spec, shadow, label): (Spec, bool, &str) = match &check.limit {
            LimitRef::Inline(spec) => (*spec, false, &check.name),
            LimitRef::Policy(name) => match policies.get(name) {
                Some(Policy {
                    spec, shadow, name, ..
                }) => (*spec, *shadow, name),
                None => {
                    return Err(ItemError::new("policy", format!("unknown policy {name:?}")));
                }
            },
        };
        let now = self.now();
        let decision = key::with_encoded(&check.name, &check.unique_key, |k| {
            self.shared.store.decide(k, &spec, check.request, now)
        });
        let reason = match decision.reason {
            algorithm::Reason::WithinLimit => Reason::WithinLimit,
            _ if shadow => Reason::Shadow,
            algorithm::Reason::LimitExceeded => Reason::LimitExceeded,
            algorithm::Reason::CostExceedsCapacity => Reason::CostExceedsCapacity,
        };
        self.shared.metrics.decisions.count(label, reason);
        Ok(Verdict {
            status: reason.status(),
            reason,
            decision,
            approximate: false,
            owner: self.shared.node_id.clone(),
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
