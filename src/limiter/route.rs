//! Where each key of a batch is decided, and the batch's one pass.
//!
//! A key this node owns is decided here — at once if this node holds its
//! count or the view's transfer is complete, after a pull otherwise; a key
//! another node owns goes to that owner (or, in tiered mode, to this node's
//! allotment first); with no owner this node may ask (not yet ready, away,
//! no ring), the key's `on_owner_unreachable` decides — except that a node
//! still joining answers `NOT_READY` rather than split a lease over a
//! cluster it has not seen.
//!
//! A decision routed under a view this node has since left changes nothing
//! (the store's fence) and is routed again under the new one — at most
//! [`ROUNDS`] times, then it falls back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::confirm::{Held, Here};
use super::{Check, ItemError, Limiter, Resolved, Topology, Verdict, YIELD_EVERY};
use crate::cluster::membership::Lifecycle;
use crate::store::{Fence, key};

/// Routings of one item before it falls back (views changing under it).
pub(super) const ROUNDS: usize = 4;

/// What is left of a deadline, less a margin for the answer's way back (a
/// tenth, at least a millisecond): the budget to hand on.
pub(super) fn budget_left(deadline: tokio::time::Instant) -> std::time::Duration {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    left.saturating_sub((left / 10).max(std::time::Duration::from_millis(1)))
}

/// The least budget a call gets, whatever its caller's deadline.
pub(super) const MIN_BUDGET: std::time::Duration = std::time::Duration::from_millis(10);
/// The most budget a call gets, whatever its caller's deadline.
pub(super) const MAX_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);
// Acknowledged lease spending is kept until no answer given before the
// owner absorbed it can arrive: longer than any forward's budget.
const _: () = assert!(
    MAX_BUDGET.as_nanos() * 2 <= crate::lease::SETTLED_FOR as u128
        && crate::config::MAX_FORWARD_TIMEOUT.as_nanos() * 2 <= crate::lease::SETTLED_FOR as u128
);

/// When a batch given `budget` must be decided by: the caller's deadline
/// less a reserve (a tenth, at least a millisecond, at most 20 ms) for
/// deciding what is still open without the owner and for the answer's way
/// back — a forward that waits out the whole budget answers a caller that
/// has already given up.
pub(super) fn answer_by(budget: std::time::Duration) -> tokio::time::Instant {
    let reserve = (budget / 10).clamp(
        std::time::Duration::from_millis(1),
        std::time::Duration::from_millis(20),
    );
    tokio::time::Instant::now() + budget.saturating_sub(reserve)
}

/// Where a key is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Here, on the count this node holds (or a new one).
    Here,
    /// Here, once its state is taken from the members still transferring.
    Lacking,
    /// At its owner.
    Forward(Arc<str>),
    /// No owner this node may ask or be: not ready, away, or no ring.
    NoOwner,
}

/// A decision that has to wait (a forward), with its place in the batch.
type Pending<'a> = Pin<Box<dyn Future<Output = (usize, Verdict)> + Send + 'a>>;

impl Limiter {
    /// Where `k` is decided under `t`. `may_own`: this node is ready and
    /// present (read once per batch).
    pub(super) fn route(&self, k: &[u8], t: &Topology, may_own: bool) -> Route {
        match t.ring.owner(k) {
            None => Route::NoOwner,
            Some(o) if o.node_id != self.shared.node_id => Route::Forward(o.node_id.clone()),
            Some(_) if !may_own => Route::NoOwner,
            // Its holders of record are gone and its copy here is not
            // provably current: decided as if its owner were unreachable.
            Some(_) if self.in_doubt(k) => Route::NoOwner,
            // Last, as it is the one lookup in the store: nearly every
            // decision is answered by the flag.
            Some(_) if t.incoming.complete() || self.shared.store.holds_own(k) => Route::Here,
            Some(_) => Route::Lacking,
        }
    }

    /// The budget a call gets from its caller's deadline, kept within
    /// bounds a caller cannot move: at least [`MIN_BUDGET`] (or the
    /// configured default, if smaller) — a caller's short deadline says
    /// nothing about the owner, and a lease decided for want of time, with
    /// no fault anywhere, would let a caller sending tiny deadlines to
    /// every edge collect each edge's share on top of the limit — and at
    /// most [`MAX_BUDGET`], so no call holds a permit or a peer batch for
    /// hours. No deadline: the configured default (`forward_timeout`) —
    /// twice that for a batch with a synchronous key, whose decision takes
    /// a forward and a replica's round trip.
    pub(super) fn caller_budget(
        &self,
        asked: Option<std::time::Duration>,
        sync: bool,
    ) -> std::time::Duration {
        let base = self.shared.settings.budget;
        let default = if sync { base * 2 } else { base };
        asked
            .unwrap_or(default)
            .clamp(MIN_BUDGET.min(base), MAX_BUDGET.max(base))
    }

    /// Whether this node may own keys right now.
    pub(super) fn may_own(&self) -> bool {
        self.shared.presence.may_own(self.shared.presence.boot())
    }

    /// After a decision was refused as stale: wait (until `deadline`) for
    /// the routing view to catch up with the store's fence — a view being
    /// adopted bumps the fence just before it swaps the topology.
    pub(super) async fn settle_view(&self, deadline: tokio::time::Instant) {
        let fence = self.shared.store.fence();
        let mut views = self.shared.views.subscribe();
        let _ = tokio::time::timeout_at(deadline, views.wait_for(|v| v.1 >= fence)).await;
    }

    /// Run `f` with the fence of view `view`: what an owner's change must
    /// still hold under the key's lock (the view, and this node's presence).
    pub(super) fn fenced<R>(&self, view: u64, f: impl FnOnce(Fence<'_>) -> R) -> R {
        let present = || self.may_own();
        f(Fence {
            view,
            present: &present,
        })
    }

    /// Decide a batch, in order: keys this node owns here, the others at
    /// their owners — forwarded in parallel, one micro-batch per owner —
    /// or on leases when the owners cannot be reached. Invalid items stay
    /// errors; they never fail the batch.
    pub async fn check_batch(
        &self,
        items: Vec<Result<Check, ItemError>>,
    ) -> Vec<Result<Verdict, ItemError>> {
        self.check_batch_within(items, None).await
    }

    /// [`Limiter::check_batch`] within `budget`: the caller's deadline (its
    /// `grpc-timeout`), or the configured default. Forwards and pulls share
    /// it; nothing waits past it.
    pub async fn check_batch_within(
        &self,
        items: Vec<Result<Check, ItemError>>,
        budget: Option<std::time::Duration>,
    ) -> Vec<Result<Verdict, ItemError>> {
        let policies = self.shared.policies.load_full();
        let mut out: Vec<Option<Result<Verdict, ItemError>>> = vec![None; items.len()];
        let mut todo: Vec<(usize, Resolved<'_>)> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|c| self.resolve(c, &policies))
            {
                Ok(r) => todo.push((i, r)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let sync = todo.iter().any(|(_, r)| r.sync);
        let deadline = answer_by(self.caller_budget(budget, sync));
        for round in 0..ROUNDS {
            if todo.is_empty() {
                break;
            }
            if round > 0 {
                self.settle_view(deadline).await;
            }
            let last = round + 1 == ROUNDS;
            todo = self.round(todo, &mut out, last, deadline).await;
        }
        for (i, r) in todo {
            // Views kept changing under it: decide without the owner.
            let t = self.shared.topology.load_full();
            out[i] = Some(Ok(self.fallback(&r, &t, false)));
        }
        for v in out.iter().flatten().flatten() {
            self.shared.rates.count(v.status, v.path);
        }
        out.into_iter()
            .map(|v| v.unwrap_or_else(|| Err(ItemError::new("request", "not decided"))))
            .collect()
    }

    /// One pass over `todo` under the current view; returns the items to
    /// route again (the view changed under them).
    async fn round<'a>(
        &'a self,
        todo: Vec<(usize, Resolved<'a>)>,
        out: &mut [Option<Result<Verdict, ItemError>>],
        last: bool,
        deadline: tokio::time::Instant,
    ) -> Vec<(usize, Resolved<'a>)> {
        let t = self.shared.topology.load_full();
        let may_own = self.may_own();
        // Still joining: no ring names this node's keys yet, and a lease
        // split over a cluster it has not seen would decide from nothing
        // (`allow`, `deny` and shadow need no count, and keep their say).
        let joining = self.shared.presence.lifecycle() == Lifecycle::Joining;
        let mut remote: Vec<Pending<'a>> = Vec::new();
        let mut lacking: Vec<(usize, Resolved<'a>)> = Vec::new();
        let mut held: Held<'a> = Vec::new();
        let mut again = Vec::new();
        for (n, (i, r)) in todo.into_iter().enumerate() {
            if n % YIELD_EVERY == YIELD_EVERY - 1 {
                // A large batch decides in one task: let the runtime run a
                // small call between its slices, or that call waits for the
                // whole batch (milliseconds, seen under a key flood).
                tokio::task::yield_now().await;
            }
            if t.minority {
                out[i] = Some(Ok(self.fallback(&r, &t, true)));
                continue;
            }
            let route = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                self.route(k, &t, may_own)
            });
            match route {
                Route::Forward(to) if r.tiered => match self.tiered_local(&r, to) {
                    Ok(verdict) => out[i] = Some(Ok(verdict)),
                    Err((to, ask, paced)) => {
                        let t = t.clone();
                        remote.push(Box::pin(async move {
                            let v = self.tiered_slow(&r, to, &t, (ask, paced), deadline).await;
                            (i, v)
                        }))
                    }
                },
                Route::Forward(to) => {
                    let t = t.clone();
                    remote.push(Box::pin(async move {
                        let v = self.forward(&r, to, &t, deadline).await;
                        (i, v)
                    }))
                }
                Route::NoOwner
                    if joining
                        && !r.shadow
                        && r.fallback == crate::policy::OnOwnerUnreachable::LocalShare =>
                {
                    out[i] = Some(Ok(self.unavailable(&r, super::Reason::NotReady)))
                }
                Route::NoOwner => out[i] = Some(Ok(self.fallback(&r, &t, false))),
                Route::Lacking => lacking.push((i, r)),
                Route::Here => match self.decide_here_or_hold(&r, &t) {
                    Ok(Here::Answered(v)) => out[i] = Some(Ok(v)),
                    Ok(Here::Confirm(d)) => held.push((i, r, d)),
                    Err(_) => again.push((i, r)),
                },
            }
        }
        let (forwarded, (taken, confirmed)) = futures::future::join(
            futures::future::join_all(remote),
            futures::future::join(
                self.decide_lacking(lacking, &t, last, deadline),
                self.answer_confirmed(held, deadline),
            ),
        )
        .await;
        let mut held_late: Held<'a> = Vec::new();
        for (i, r, v) in taken {
            match v {
                Some(Here::Answered(v)) => out[i] = Some(Ok(v)),
                Some(Here::Confirm(d)) => held_late.push((i, r, d)),
                None => again.push((i, r)),
            }
        }
        let confirmed_late = self.answer_confirmed(held_late, deadline).await;
        for (i, v) in forwarded.into_iter().chain(confirmed).chain(confirmed_late) {
            out[i] = Some(Ok(v));
        }
        again
    }
}
