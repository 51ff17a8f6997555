//! The `Limiter`: the one handle the services call.
//!
//! It ties the store, the policies, the ring and peers, the leases, the
//! clock and the metrics together. Services convert wire messages to
//! [`Check`]s and [`Verdict`]s back; all the business rules (policy
//! resolution, ownership, forwarding, fallback, shadow mode, counting) live
//! here. Cheap to clone: a handle over `Arc<Shared>`.
//!
//! - [`mod@self`]: the handle, the batch entry point, admin operations;
//! - `owner`: deciding keys this node owns, for itself or for an edge;
//! - `fallback`: forwarding to owners, and deciding without them.

mod envoy;
mod fallback;
mod handoff;
mod owner;
mod tiered;
mod types;

pub use envoy::{Descriptor, DescriptorOutcome};
pub use handoff::Handoff;

use std::sync::Arc;

use arc_swap::ArcSwap;

pub use tiered::Ask;
pub use types::{
    Absorb, Check, Forwarded, ItemError, LimitRef, Mode, Path, Reason, ReportOutcome, Status,
    Verdict,
};

use crate::algorithm::{self, Decision, Nanos, Spec};
use crate::clock::SharedClock;
use crate::cluster::membership::ClusterView;
use crate::cluster::peers::Peers;
use crate::cluster::ring::Ring;
use crate::lease::Leases;
use crate::metrics::Metrics;
use crate::policy::{OnOwnerUnreachable, Policies, Policy};
use crate::store::{Store, TopBy, View, key};

/// Local decisions between yields to the runtime within one batch (~0.3 ms
/// of work for new keys).
const YIELD_EVERY: usize = 64;

/// How the limiter behaves in a cluster.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// After a ring change, how long a new owner pulls keys from their
    /// previous owner (and seeds those whose previous owner is gone).
    pub ownership_grace: Nanos,
    /// The peer protocol this node speaks (2; 1 plays the previous version).
    pub protocol: u32,
    /// Tiered mode: how allotments are sized and kept.
    pub tiered: crate::tiered::Terms,
    /// Tiered mode: keys with allotments (as an edge) and ledgers (as an owner).
    pub tiered_max_keys: usize,
}

/// Everything a limiter is built from.
pub struct Parts {
    pub node_id: String,
    pub store: Arc<Store>,
    pub policies: Policies,
    pub clock: SharedClock,
    pub metrics: Arc<Metrics>,
    /// None: a single node that never forwards.
    pub peers: Option<Peers>,
    pub leases: Leases,
    pub settings: ClusterSettings,
    /// Validation bounds for states arriving from peers.
    pub bounds: algorithm::Bounds,
}

/// What the limiter knows of the cluster, swapped whole on each change.
#[derive(Debug, Default)]
struct Topology {
    ring: Arc<Ring>,
    /// The ring before the last change, and when it changed.
    previous: Arc<Ring>,
    changed_at: Nanos,
    /// `N`, the remembered cluster size that sizes leases.
    size: u64,
    /// Seeing fewer than a majority of `N`: every key on leases.
    minority: bool,
    /// When this node entered the ring, while it is still joining (its
    /// ring has only grown since, within the ownership grace period).
    joined_at: Option<Nanos>,
    /// Live members announcing `leaving` (a handful at most): they decide
    /// nothing more, but can still be pulled from.
    leaving: Vec<Arc<str>>,
}

impl Topology {
    fn is_leaving(&self, node_id: &str) -> bool {
        self.leaving.iter().any(|l| **l == *node_id)
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
    /// Envoy descriptor rules, swapped whole on a reload.
    rules: ArcSwap<crate::policy::rules::Rules>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    topology: ArcSwap<Topology>,
    peers: Option<Peers>,
    leases: Leases,
    tiers: tiered::Tiers,
    settings: ClusterSettings,
    bounds: algorithm::Bounds,
}

/// A decision that has to wait (a forward, or a pull first), with its
/// place in the batch.
type Pending<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (usize, Verdict)> + Send + 'a>>;

/// Where a key is decided, in a cluster.
enum Route {
    Here,
    /// Pull its state from the previous owner first.
    PullFirst(owner::PullPlan),
    /// At its owner (or the node that pulled it from this one).
    Forward(Arc<str>),
}

/// A check resolved against the policies: what to decide and how to report it.
struct Resolved<'a> {
    check: &'a Check,
    spec: Spec,
    shadow: bool,
    fallback: OnOwnerUnreachable,
    label: Arc<str>,
    /// Tiered mode (hot keys): allotments at the edges.
    tiered: bool,
}

impl Limiter {
    pub fn new(parts: Parts) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                node_id: Arc::from(parts.node_id.as_str()),
                store: parts.store,
                policies: ArcSwap::from_pointee(parts.policies),
                rules: ArcSwap::from_pointee(crate::policy::rules::Rules::default()),
                clock: parts.clock,
                metrics: parts.metrics,
                topology: ArcSwap::from_pointee(Topology {
                    size: 1,
                    ..Topology::default()
                }),
                peers: parts.peers,
                leases: parts.leases,
                tiers: tiered::Tiers::new(parts.settings.tiered_max_keys, parts.settings.tiered),
                settings: parts.settings,
                bounds: parts.bounds,
            }),
        }
    }

    /// Follow a new cluster view (membership calls this on every change).
    pub fn set_view(&self, view: &ClusterView) {
        let old = self.shared.topology.load_full();
        let ready = view.ring.members().len() as u64;
        let size = view.size as u64;
        let minority = ready * 2 <= size && size > 1;
        let changed = old.ring.epoch() != view.ring.epoch();
        let joined = old.ring.member(&self.shared.node_id).is_none()
            && view.ring.member(&self.shared.node_id).is_some();
        if let Some(peers) = &self.shared.peers {
            peers.sync(&view.ring, &view.live());
        }
        if changed {
            // Keys this node no longer owns go to their new owner with
            // what it promised counted (see `fold_promises`).
            let me = self.shared.node_id.clone();
            self.fold_promises_unless(|k| view.ring.owner(k).is_none_or(|o| o.node_id == me));
            // Allotments are promises of the owner that granted them; a
            // key that moves arrives at its new owner without them (its
            // state travels, its promises do not). Stop spending them: what
            // was spent is still reported, and the next ask goes to the
            // key's owner now. (Seen: 9.6% over on a scale-out without this.)
            self.shared.tiers.forget_allotments();
        }
        // Changes are worth queueing while another node could hold them.
        let has_peer = view
            .ring
            .members()
            .iter()
            .any(|m| m.node_id != self.shared.node_id);
        self.shared
            .store
            .set_replicating(self.shared.settings.protocol >= 2 && has_peer);
        let now = self.now();
        // Still joining: this node entered the ring within the grace
        // period, and since then its ring has only grown.
        let grown = old
            .ring
            .members()
            .iter()
            .all(|m| view.ring.member(&m.node_id).is_some());
        let joined_at = match old.joined_at {
            _ if joined => Some(now),
            Some(at) if grown && now.saturating_sub(at) < self.shared.settings.ownership_grace => {
                Some(at)
            }
            _ => None,
        };
        self.shared.topology.store(Arc::new(Topology {
            ring: view.ring.clone(),
            previous: if changed && joined_at.is_some() {
                // This node is joining: its keys were owned by the others,
                // whatever its own earlier views held — a joiner's first
                // rings can be partial (gossip brings members in one by
                // one), and one that held this node would name it the
                // previous owner of keys it never had (seen: keys started
                // fresh at a new node).
                Arc::new(Ring::new(
                    view.ring
                        .members()
                        .iter()
                        .filter(|m| m.node_id != self.shared.node_id)
                        .cloned(),
                ))
            } else if changed {
                old.ring.clone()
            } else {
                old.previous.clone()
            },
            changed_at: if changed { now } else { old.changed_at },
            joined_at,
            size,
            minority,
            leaving: view
                .members
                .iter()
                .filter(|m| m.state == crate::cluster::membership::Lifecycle::Leaving)
                .map(|m| m.node_id.clone())
                .collect(),
        }));
        self.shared
            .metrics
            .cluster
            .minority
            .set(i64::from(minority));
        if minority != old.minority {
            tracing::warn!(
                ready,
                size,
                minority,
                "majority of the cluster {}",
                if minority {
                    "lost: every key on leases"
                } else {
                    "regained"
                }
            );
        }
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.shared.topology.load().ring.clone()
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

    /// Notified when reports should go before the next interval (a
    /// tiered allotment runs low).
    pub fn report_soon(&self) -> Arc<tokio::sync::Notify> {
        self.shared.tiers.report_soon.clone()
    }

    pub fn leases(&self) -> &Leases {
        &self.shared.leases
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
    /// their owners — forwarded in parallel, one micro-batch per owner —
    /// or on leases when the owners cannot be reached. Invalid items stay
    /// errors; they never fail the batch.
    pub async fn check_batch(
        &self,
        items: Vec<Result<Check, ItemError>>,
    ) -> Vec<Result<Verdict, ItemError>> {
        let policies = self.shared.policies.load_full();
        let topology = self.shared.topology.load_full();
        let mut out: Vec<Option<Result<Verdict, ItemError>>> = vec![None; items.len()];
        let mut remote: Vec<Pending<'_>> = Vec::new();
        // Routing reads the clock once per batch; each decision reads it
        // again, so its own time is exact.
        let now = self.now();
        for (i, item) in items.iter().enumerate() {
            if i % YIELD_EVERY == YIELD_EVERY - 1 {
                // A large batch decides in one task: let the runtime run a
                // small call between its slices, or that call waits for the
                // whole batch (milliseconds, seen under a key flood).
                tokio::task::yield_now().await;
            }
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
            if topology.minority {
                out[i] = Some(Ok(self.fallback(&resolved, &topology, true)));
                continue;
            }
            if self.shared.peers.is_none() {
                // A single node: every key is this node's, and nothing moves.
                out[i] = Some(Ok(self.decide_here(&resolved, &topology)));
                continue;
            }
            // One encoding of the key for all the routing questions.
            let route = key::with_encoded(&resolved.check.name, &resolved.check.unique_key, |k| {
                match topology.ring.owner(k) {
                    Some(owner) if owner.node_id != self.shared.node_id => {
                        Route::Forward(owner.node_id.clone())
                    }
                    _ => match self.placement(k, &topology, now) {
                        owner::Place::Moved(to) => Route::Forward(to),
                        owner::Place::Pull(plan) => Route::PullFirst(plan),
                        owner::Place::Here => Route::Here,
                    },
                }
            });
            match route {
                // Another node owns the key — or pulled it from this one
                // while this ring still names this node: it decides.
                Route::Forward(to) if resolved.tiered => match self.tiered_local(&resolved, to) {
                    Ok(verdict) => out[i] = Some(Ok(verdict)),
                    Err((to, ask)) => {
                        let topology = topology.clone();
                        remote.push(Box::pin(async move {
                            (i, self.tiered_slow(&resolved, to, &topology, ask).await)
                        }))
                    }
                },
                Route::Forward(to) => {
                    let topology = topology.clone();
                    remote.push(Box::pin(async move {
                        (i, self.forward(&resolved, to, &topology).await)
                    }))
                }
                // The key just moved here: pull its state first.
                Route::PullFirst(plan) => {
                    let topology = topology.clone();
                    remote.push(Box::pin(async move {
                        (i, self.pull_then_decide(&resolved, plan, &topology).await)
                    }))
                }
                Route::Here if resolved.tiered => {
                    out[i] = Some(Ok(self.tiered_here(&resolved, &topology)))
                }
                Route::Here => out[i] = Some(Ok(self.decide_here(&resolved, &topology))),
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
        let (spec, shadow, policy_fallback, label, policy_mode) = match &check.limit {
            LimitRef::Inline(spec) => (
                *spec,
                false,
                OnOwnerUnreachable::default(),
                Arc::from(check.name.as_str()),
                Mode::default(),
            ),
            LimitRef::Rule(rule) => match rule.spec {
                Some(spec) => (
                    spec,
                    rule.shadow,
                    rule.on_owner_unreachable,
                    rule.label.clone(),
                    Mode::default(),
                ),
                None => {
                    return Err(ItemError::new(
                        "descriptors",
                        "an unlimited rule has nothing to decide",
                    ));
                }
            },
            LimitRef::Policy(name) => match policies.get(name) {
                Some(Policy {
                    spec,
                    shadow,
                    name,
                    on_owner_unreachable,
                    mode,
                }) => (*spec, *shadow, *on_owner_unreachable, name.clone(), *mode),
                None => return Err(ItemError::new("policy", format!("unknown policy {name:?}"))),
            },
        };
        Ok(Resolved {
            check,
            spec,
            shadow,
            fallback: check.on_owner_unreachable.unwrap_or(policy_fallback),
            label,
            tiered: check.mode.unwrap_or(policy_mode) == Mode::Tiered,
        })
    }

    /// Turn a decision into the edge's verdict, counting it here (at the
    /// edge) so that each decision is counted once.
    fn verdict(
        &self,
        r: &Resolved<'_>,
        decision: Decision,
        owner: Arc<str>,
        approximate: bool,
    ) -> Verdict {
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
            approximate,
            owner,
            label: r.label.clone(),
            window: period_ns(&r.spec),
            path: Path::Owner,
        }
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
        let now = self.now();
        self.shared.store.sweep(now)
    }
}

/// A spec's period in ns (a calendar window counts as its nominal length).
pub(crate) fn period_ns(spec: &Spec) -> Nanos {
    match spec.period() {
        algorithm::Period::Duration(d) => d,
        algorithm::Period::Calendar(u) => {
            let (s, e) = u.bounds(0);
            e - s
        }
    }
}
