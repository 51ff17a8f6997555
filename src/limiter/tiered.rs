//! Tiered mode in the request path (the arithmetic is in `crate::lease::tiered`).
//!
//! Edge: a tiered check on a key another node owns is first offered to this
//! node's allotment — admitted with no hop while it lasts, the hits queued
//! for the asynchronous report that the lease reports already use (batched,
//! retried unchanged, absorbed once per sequence number). When the allotment
//! cannot cover it, the check goes to the owner with an ask (the slow path):
//! the owner decides it exactly and grants the next allotment.
//!
//! Owner: every tiered decision, its own callers' and edges' slow paths,
//! leaves room for what edges were promised and have not reported
//! (`reserved`), so the key's consumption plus its promises never exceed
//! what the limit leaves.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Limiter, Path, Resolved, Topology, Verdict};
use crate::algorithm::{self, Cost, Decision, Nanos, Spec};
use crate::cluster::peers::Granted;
use crate::lease::tiered::{Allotments, Caps, Ledgers, Local, PACE_UNIT, Pace, SubGrants, Terms};
use crate::store::{Seed, Stale, key};

/// A slow-path ask, as the owner receives it.
#[derive(Clone, Debug)]
pub struct Ask {
    pub edge: String,
    pub demand: u64,
    pub unused: u64,
    /// As [`crate::cluster::peers::TieredAsk::pace`].
    pub pace: Option<bool>,
}

/// A paced ask of one key in flight from this edge ([`Local::Ask`]'s
/// `pace`): dropped — answered, failed, or its caller gone before it was
/// sent — it ends, and another ask of the key may be paced.
pub(super) struct PacedAsk {
    shared: Arc<super::Shared>,
    key: Vec<u8>,
    id: u64,
}

impl Drop for PacedAsk {
    fn drop(&mut self) {
        self.shared.tiers.allotments().ask_done(&self.key, self.id);
    }
}

/// Apps are passed allotments and their reports booked.
pub(super) const APPS_OPEN: u8 = 0;
/// Leaving: no more allotments passed on; reports still booked.
pub(super) const APPS_NOT_GRANTING: u8 = 1;
/// About to stop: reports are answered "retry", never booked unsent.
pub(super) const APPS_CLOSED: u8 = 2;

/// The tiered state of one node: its allotments as an edge, its ledgers as
/// an owner. Both bounded.
pub(super) struct Tiers {
    /// std mutexes: held for a map lookup and some arithmetic, never across
    /// an await.
    allotments: Mutex<Allotments>,
    ledgers: Mutex<Ledgers>,
    /// What this node passed on to apps (None: client allotments are off).
    /// Locked after `allotments` when both are held.
    subgrants: Option<Mutex<SubGrants>>,
    /// How long before this node's allotment its sub-grants end.
    client_lead: Nanos,
    /// What this node does for apps: [`APPS_OPEN`], then, leaving,
    /// [`APPS_NOT_GRANTING`] and [`APPS_CLOSED`] (see `server/shutdown.rs`).
    /// Set to closed under the sub-grants' lock, which a report holds while
    /// it books: once set, no report is half-booked.
    apps: AtomicU8,
    /// Ledgers held: while none, an exact decision skips the lookup.
    ledger_count: AtomicUsize,
    pub(super) terms: Terms,
    /// Wakes the reporter before its interval: an allotment runs low.
    pub(super) report_soon: Arc<tokio::sync::Notify>,
}

impl Tiers {
    pub(super) fn new(max_keys: usize, terms: Terms, clients: Option<(Caps, Nanos)>) -> Tiers {
        Tiers {
            allotments: Mutex::new(Allotments::new(max_keys)),
            ledgers: Mutex::new(Ledgers::new(max_keys, terms)),
            subgrants: clients.map(|(caps, lead)| {
                let caps = Caps {
                    max_keys: caps.max_keys.min(max_keys),
                    ..caps
                };
                Mutex::new(SubGrants::new(caps, terms, lead))
            }),
            ledger_count: AtomicUsize::new(0),
            apps: AtomicU8::new(APPS_OPEN),
            client_lead: clients.map_or(0, |(_, lead)| lead),
            terms,
            report_soon: Arc::new(tokio::sync::Notify::new()),
        }
    }

    pub(super) fn allotments(&self) -> MutexGuard<'_, Allotments> {
        self.allotments.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this node passes allotments on to apps (no lock taken).
    pub(super) fn client_allotments_on(&self) -> bool {
        self.subgrants.is_some()
    }

    /// Where this node stands with apps ([`APPS_OPEN`] and after).
    pub(super) fn apps(&self) -> u8 {
        self.apps.load(Ordering::Acquire)
    }

    /// Move on to `state` (never back).
    pub(super) fn set_apps(&self, state: u8) {
        self.apps.fetch_max(state, Ordering::AcqRel);
    }

    /// How long before this node's allotment of a key its sub-grants end.
    pub(super) fn client_lead(&self) -> Nanos {
        self.client_lead
    }

    /// What this node passed on to apps; None when that is off.
    pub(super) fn subgrants(&self) -> Option<MutexGuard<'_, SubGrants>> {
        self.subgrants
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What this node says its demand for `k` is when it asks: its own
    /// callers', or its apps' (each app measures every check it sees) if
    /// more. Not their sum: an app's asks are this node's callers too, so
    /// the sum would count them twice and tilt the owner's split towards
    /// nodes whose apps ask often rather than towards demand. (Direct
    /// callers beside apps are then under-counted: smaller grants, never
    /// more than the limit.)
    fn asking_demand(&self, k: &[u8], own: u64, now: Nanos) -> u64 {
        own.max(self.subgrants().map_or(0, |s| s.demand(k, now)))
    }

    fn ledgers(&self) -> MutexGuard<'_, Ledgers> {
        self.ledgers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drop every allotment (the ring changed: their grantors may no longer
    /// own their keys).
    pub(super) fn forget_allotments(&self) {
        self.allotments().forget();
    }

    /// Whether `key` has a ledger here: promises an exact decision must
    /// leave room for.
    pub(super) fn has_ledger(&self, key: &[u8]) -> bool {
        self.ledger_count.load(Ordering::Relaxed) > 0 && self.ledgers().contains(key)
    }

    /// Drop every ledger (this node rejoined: what it promised was
    /// folded into counts that are elsewhere now).
    pub(super) fn forget_ledgers(&self) {
        let mut ledgers = self.ledgers();
        ledgers.clear();
        self.ledger_count.store(0, Ordering::Relaxed);
    }

    /// Drop a key's ledger and allotment (an admin reset).
    pub(super) fn forget_key(&self, key: &[u8]) {
        let mut ledgers = self.ledgers();
        ledgers.remove(key);
        self.ledger_count.store(ledgers.len(), Ordering::Relaxed);
        drop(ledgers);
        self.allotments().forget_key(key);
    }

    /// Tokens this edge holds in allotments, and this owner has promised.
    pub(super) fn figures(&self, now: Nanos) -> (u64, u64) {
        let held = self.allotments().held(now);
        let reserved = self.ledgers().reserved(now);
        (held, reserved)
    }

    /// An edge's report was absorbed into the state: those hits are no
    /// longer promised.
    pub(super) fn reported(&self, key: &[u8], edge: &str, hits: u64) {
        self.ledgers().reported(key, edge, hits);
    }
}

impl Limiter {
    fn tiers(&self) -> &Tiers {
        &self.shared.tiers
    }

    /// A key is leaving this owner (a new owner pulls it): its state
    /// travels, its ledger does not, so count what it promised edges and has
    /// not heard about as consumed. The edges' reports of those hits, when
    /// they reach the new owner, count again: an under-count of at most the
    /// promises, once per move, rather than the new owner granting them a
    /// second time (a scale-out test measured +9% over without this).
    /// Fold the promises of every key with a ledger that `keep` rejects
    /// (the ring changed and this node no longer owns it; or this node is
    /// leaving): done before the replicator hands the key off.
    pub(super) fn fold_promises_unless(&self, keep: impl Fn(&[u8]) -> bool) {
        let keys: Vec<Arc<[u8]>> = self
            .tiers()
            .ledgers()
            .keys()
            .filter(|k| !keep(k))
            .cloned()
            .collect();
        for k in keys {
            self.fold_promises(&k);
        }
    }

    pub(super) fn fold_promises(&self, k: &[u8]) {
        let now = self.now();
        let terms = self.tiers().terms;
        let reserved = {
            let mut ledgers = self.tiers().ledgers();
            let removed = ledgers.remove(k);
            self.tiers()
                .ledger_count
                .store(ledgers.len(), Ordering::Relaxed);
            match removed {
                Some(l) => l.reserved(now, &terms),
                None => return,
            }
        };
        if reserved > 0 {
            self.shared.store.fold(k, reserved, now);
        }
    }

    /// An edge's tiered check on a key `owner` owns: decided here from the
    /// allotment, or the ask to send on the slow path.
    pub(super) fn tiered_local(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
    ) -> Result<Verdict, (Arc<str>, crate::cluster::peers::TieredAsk, Option<PacedAsk>)> {
        let now = self.now();
        let hits = r.check.request.hits;
        let (local, paced) = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            let local = self.tiers().allotments().spend(k, hits, now);
            // The ask's end is guaranteed from here, sent or not.
            let paced = match local {
                Local::Ask { pace: Some(id), .. } => Some(PacedAsk {
                    shared: self.shared.clone(),
                    key: k.to_vec(),
                    id,
                }),
                _ => None,
            };
            if let Local::Admitted { low, .. } = local
                && hits > 0
            {
                self.shared.leases.record(k, &r.spec, hits, now);
                if low {
                    // Report soon: the owner counts these before this
                    // node asks for more.
                    self.tiers().report_soon.notify_one();
                }
            }
            (local, paced)
        });
        let m = &self.shared.metrics.cluster;
        match local {
            Local::Admitted { left, .. } => {
                m.tiered_decisions
                    .get_or_create(&vec![("path", Path::LocalAllotment.name())])
                    .inc();
                let decision = Decision {
                    reason: algorithm::Outcome::WithinLimit,
                    limit: r.spec.limit(),
                    remaining: left,
                    reset_at: now.saturating_add(super::period_ns(&r.spec)),
                    retry_after: None,
                    delay: 0,
                };
                // `remaining` is this node's allotment, not the key's.
                let mut v = self.verdict(r, decision, owner, true);
                v.path = Path::LocalAllotment;
                Ok(v)
            }
            Local::Refused { retry_after } => {
                m.tiered_decisions
                    .get_or_create(&vec![("path", Path::LocalAllotment.name())])
                    .inc();
                let decision = Decision {
                    reason: if hits > r.spec.capacity() {
                        algorithm::Outcome::CostExceedsCapacity
                    } else {
                        algorithm::Outcome::LimitExceeded
                    },
                    limit: r.spec.limit(),
                    remaining: 0,
                    reset_at: now.saturating_add(super::period_ns(&r.spec)),
                    retry_after: Some(retry_after),
                    delay: 0,
                };
                let mut v = self.verdict(r, decision, owner, true);
                v.path = Path::LocalAllotment;
                Ok(v)
            }
            Local::Ask {
                demand,
                unused,
                pace,
            } => {
                let demand = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                    self.tiers().asking_demand(k, demand, now)
                });
                let ask = crate::cluster::peers::TieredAsk {
                    demand,
                    unused,
                    pace: Some(pace.is_some()),
                };
                Err((owner, ask, paced))
            }
        }
    }

    /// The slow path: the owner decides exactly and grants the next allotment.
    pub(super) async fn tiered_slow(
        &self,
        r: &Resolved<'_>,
        owner: Arc<str>,
        t: &Topology,
        (ask, paced): (crate::cluster::peers::TieredAsk, Option<PacedAsk>),
        deadline: tokio::time::Instant,
    ) -> Verdict {
        let (mut v, grant) = self.forward_asking(r, owner, t, Some(ask), deadline).await;
        if let Some(grant) = grant {
            let now = self.now();
            let grant = grant.at(now);
            let pace = paced.as_ref().map(|p| p.id);
            key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
                self.tiers().allotments().answered(k, grant, pace, now)
            });
        }
        // The paced ask, if this was one, ends here (answered or not).
        drop(paced);
        if v.path == Path::Owner {
            v.path = Path::Slow;
        }
        self.shared
            .metrics
            .cluster
            .tiered_decisions
            .get_or_create(&vec![("path", v.path.name())])
            .inc();
        v
    }

    /// A tiered check on a key this node owns. The owner is an edge of
    /// itself — its callers spend its own allotment, granted by its own
    /// ledger by the same rule — or it would see every refill first and
    /// take it before any edge asked. What it spends goes into the state at
    /// once (its "report" has no lag).
    pub(super) fn tiered_here(&self, r: &Resolved<'_>, t: &Topology) -> Result<Verdict, Stale> {
        let now = self.now();
        let me = self.shared.node_id.clone();
        let req = r.check.request;
        let decision = key::with_encoded(&r.check.name, &r.check.unique_key, |k| {
            self.absorb_own_first(k, t);
            let local = self.tiers().allotments().spend(k, req.hits, now);
            match local {
                Local::Admitted { .. } => {
                    // Promised tokens: counted as an edge's report is.
                    let d = self.fenced(t.view, |fence| {
                        self.shared
                            .store
                            .decide_promised(k, &r.spec, req, now, Some(fence))
                    })?;
                    if d.reason == algorithm::Outcome::WithinLimit {
                        self.tiers().reported(k, &me, req.hits);
                    }
                    Ok(d)
                }
                Local::Refused { retry_after } => {
                    let peek = Cost { hits: 0, ..req };
                    let mut d = self.decide_unreserved(k, &r.spec, peek, t, now)?;
                    d.reason = algorithm::Outcome::LimitExceeded;
                    d.remaining = 0;
                    d.retry_after = Some(retry_after);
                    Ok(d)
                }
                Local::Ask {
                    demand,
                    unused,
                    pace,
                } => {
                    let ask = Ask {
                        edge: me.to_string(),
                        demand: self.tiers().asking_demand(k, demand, now),
                        unused,
                        pace: Some(pace.is_some()),
                    };
                    let decided = self.decide_reserving(k, &r.spec, req, t, now, Some(&ask));
                    let mut allotments = self.tiers().allotments();
                    if let Ok((_, Some(grant))) = &decided {
                        allotments.answered(k, grant.at(now), pace, now);
                    }
                    // Ended, answered or not (a stale ring is retried as a
                    // new ask).
                    if let Some(id) = pace {
                        allotments.ask_done(k, id);
                    }
                    drop(allotments);
                    Ok(decided?.0)
                }
            }
        })?;
        Ok(self.verdict(r, decision, me, false))
    }

    /// The store's decision, with no regard for promises (the caller has
    /// accounted for them).
    fn decide_unreserved(
        &self,
        k: &[u8],
        spec: &Spec,
        req: Cost,
        t: &Topology,
        now: Nanos,
    ) -> Result<Decision, Stale> {
        self.fenced(t.view, |fence| {
            self.shared
                .store
                .decide_fenced(k, spec, req, now, Seed::Fresh, Some(fence))
        })
    }

    /// The owner's tiered decision: take back what the asking edge did not
    /// spend, decide exactly within what the state leaves after the other
    /// promises, then grant the edge its next allotment. An ask from an
    /// edge just told "nothing" (sent before it heard) is refused without a
    /// grant.
    pub(super) fn decide_reserving(
        &self,
        k: &[u8],
        spec: &Spec,
        req: Cost,
        t: &Topology,
        now: Nanos,
        ask: Option<&Ask>,
    ) -> Result<(Decision, Option<Granted>), Stale> {
        let tiers = self.tiers();
        let mut ledgers = tiers.ledgers();
        // No room (the table is full of ledgers that still matter): decided
        // with nothing reserved here and nothing granted.
        let room = ledgers.open(k, now);
        tiers.ledger_count.store(ledgers.len(), Ordering::Relaxed);
        // An ask sent before the edge heard "nothing": refused, as the edge
        // itself refuses meanwhile.
        let waiting = ask.is_some_and(|a| ledgers.waiting(k, &a.edge, now));
        // The edge's unspent tokens come back with its ask — counted here,
        // applied only once the decision is made: a decision that meets a
        // stale ring is retried with the same ask, and giving back before
        // it would give the same tokens back twice (reserved would then
        // undercount what the edge still holds: over-admission).
        let reserved = match ask {
            Some(a) => ledgers.reserved_of_after(k, &a.edge, a.unused, now),
            None => ledgers.reserved_of(k, now),
        };
        let peek = Cost {
            hits: 0,
            drain_over_limit: false,
            nodelay: true,
        };
        let seen = self.decide_unreserved(k, spec, peek, t, now)?;
        let decision =
            if req.hits > 0 && (waiting || seen.remaining < req.hits.saturating_add(reserved)) {
                // Within the limit, but not within what the promises leave.
                let mut refused = seen;
                refused.reason = if req.hits > spec.capacity() {
                    algorithm::Outcome::CostExceedsCapacity
                } else {
                    algorithm::Outcome::LimitExceeded
                };
                refused.retry_after = None;
                refused
            } else {
                self.decide_unreserved(k, spec, req, t, now)?
            };
        if let Some(ask) = ask {
            ledgers.give_back(k, &ask.edge, ask.unused);
        }
        let grant = match ask {
            Some(ask) if room && !waiting => ledgers
                .grant(
                    k,
                    &ask.edge,
                    ask.demand,
                    decision.remaining,
                    // A paced ask: a share of the refill; an older edge's:
                    // none (it would not spend it), its pace replaced by
                    // none; one sent while its paced one is in flight:
                    // tokens only, its pace left alone.
                    match ask.pace {
                        Some(true) => {
                            let owes = self.shared.store.owed(k, now);
                            Some(refill_pace(
                                spec,
                                (decision.remaining, owes),
                                tiers.terms.ttl,
                            ))
                        }
                        None => Some(Pace::NONE),
                        Some(false) => None,
                    },
                    t.size.max(1),
                    now,
                )
                .map(|g| {
                    let m = &self.shared.metrics.cluster;
                    m.tiered_grants.inc();
                    m.tiered_granted_tokens
                        .inc_by(g.amount.saturating_add(g.paced));
                    Granted {
                        amount: g.amount,
                        ttl: g.expires.saturating_sub(now),
                        paced: g.paced,
                    }
                }),
            _ => None,
        };
        Ok((decision, grant))
    }
}

/// The refill a tiered key's grants may share out as paces ([`Pace`]):
/// buckets refill continuously, `limit` per `duration`; windows refill at
/// their end and get none.
fn refill_pace(spec: &Spec, left: (u64, u64), life: Nanos) -> Pace {
    if !spec.algorithm().is_bucket() || spec.limit() == 0 {
        return Pace::NONE;
    }
    let rate = u128::from(spec.limit()) * PACE_UNIT / u128::from(spec.duration().max(1));
    let rate = u64::try_from(rate).unwrap_or(u64::MAX);
    Pace::for_bucket(rate, left, spec.capacity(), life)
}
