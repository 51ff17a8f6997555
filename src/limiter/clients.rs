//! Tiered mode inside apps (issue 23): this node passes part of its own
//! allotment of a hot key on to an app (sluice-client), which decides the
//! key in process and reports what it spent. The arithmetic is in
//! `crate::lease::tiered::SubGrants`.
//!
//! The owner never hears of apps. An app's spending is recorded here as
//! this node's own ([`crate::lease::Leases::record`]) and reported to the
//! owner under this node's id, sequence-numbered like every lease report;
//! an app's report is applied once per `(client, sequence)`. So the
//! owner's invariant — consumption plus what it promised never beyond the
//! limit — covers apps' tokens: they are part of this node's allotment.
//!
//! Nothing here awaits while holding a lock, and what an ask changes
//! happens in one synchronous step before its decision (the give-back) and
//! one after (the grant): a caller gone mid-ask leaves either nothing or
//! a whole step done.

use super::tiered::{APPS_CLOSED, APPS_NOT_GRANTING, APPS_OPEN};
use super::{ItemError, Limiter, Verdict};
use crate::algorithm::Nanos;
use crate::store::key;

/// An app's ask answered: the decision on its check, and its sub-grant.
#[derive(Clone, Debug)]
pub struct Allotted {
    pub verdict: Verdict,
    /// Tokens the app may spend without asking (0: none now).
    pub granted: u64,
    /// For this long from when the ask arrived (the app counts it from
    /// when it sent it: it stops first).
    pub expires_in: Nanos,
    /// Tokens more that come due evenly from `paced_after` after the ask
    /// arrived until the end (its share of this node's pace:
    /// [`crate::lease::tiered::Pace`]).
    pub paced: u64,
    /// How long after the ask arrived the pace was lent (the check's own
    /// decision came first, a forward to the owner included).
    pub paced_after: Nanos,
}

/// What an app says with its ask, beside the check.
#[derive(Clone, Copy, Debug, Default)]
pub struct AppAsk {
    /// Hits per second it sees for the key (sizes the grant).
    pub demand: u64,
    /// What it did not spend of its last sub-grant of the key.
    pub unused: u64,
    /// The hits of the key it spent and has not had acknowledged, when it
    /// says (the rest of what it was granted is taken back).
    pub unreported: Option<u64>,
    /// It spends paced tokens as they come due, and has no other ask of
    /// the key in flight: the grant may carry a pace.
    pub pace: bool,
}

/// What became of an app's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientAck {
    /// Applied now; the items that could not be (named by field).
    Applied(Vec<ItemError>),
    /// Applied before: a resend after a lost acknowledgement.
    Duplicate,
    /// Not applied now (allotments are off here, or the table of apps is
    /// full): the app resends it unchanged, to this node.
    Retry,
}

impl ClientAck {
    pub fn name(&self) -> &'static str {
        match self {
            ClientAck::Applied(_) => "applied",
            ClientAck::Duplicate => "duplicate",
            ClientAck::Retry => "retry",
        }
    }
}

impl Limiter {
    /// Decide an app's `check` (as [`Limiter::check_batch_within`] would)
    /// and grant it a share of this node's allotment of the key, if the
    /// key is in tiered mode and this node holds a live allotment of it.
    /// What the app did not spend of its last sub-grant of the key is
    /// taken back first (it goes back to the owner with this node's next
    /// ask), and what it says it no longer holds ([`AppAsk`]).
    pub async fn allot(
        &self,
        check: super::Check,
        client: &str,
        ask: AppAsk,
        budget: Option<std::time::Duration>,
    ) -> Result<Allotted, ItemError> {
        let AppAsk {
            demand,
            unused,
            unreported,
            pace: paced,
        } = ask;
        let tiered = {
            let policies = self.shared.policies.load_full();
            self.resolve(&check, &policies)?.tiered
        };
        let on = tiered && self.shared.tiers.client_allotments_on();
        // A leaving node takes back what apps return but passes nothing on:
        // what it grants now could be spent after its last report.
        let granting = on && self.shared.tiers.apps() == APPS_OPEN;
        let asked_at = self.now();
        if on {
            self.take_back(&check, client, unused, unreported);
        }
        if granting {
            // This node's allotment ends too soon to pass any of it on
            // (sub-grants end a report interval before it): end it now, so
            // this check asks the owner for the next one rather than the
            // app being told "nothing" until it ends.
            key::with_encoded(&check.name, &check.unique_key, |k| {
                let tiers = &self.shared.tiers;
                tiers
                    .allotments()
                    .lapse_within(k, tiers.client_lead(), asked_at)
            });
        }
        let (name, unique_key) = (check.name.clone(), check.unique_key.clone());
        let verdict = self
            .check_batch_within(vec![Ok(check)], budget)
            .await
            .remove(0)?;
        let mut allotted = Allotted {
            verdict,
            granted: 0,
            expires_in: 0,
            paced: 0,
            paced_after: 0,
        };
        if !granting {
            return Ok(allotted);
        }
        let now = self.now();
        // The two locks one after the other, never nested: the sub-grants'
        // periodic walk then never holds up a decision (which takes only
        // the allotments'). The pool may be spent between the look and the
        // take: what could not be taken is not granted.
        let grant = key::with_encoded(&name, &unique_key, |k| {
            let tiers = &self.shared.tiers;
            let pool = tiers.allotments().live(k, now)?;
            let (g, released) = {
                let mut subgrants = tiers.subgrants()?;
                // Checked again under the lock: the node may have begun to
                // leave while this ask was decided.
                if tiers.apps() != APPS_OPEN {
                    return None;
                }
                subgrants.grant(k, client, demand, (pool, paced), now)
            };
            let taken = {
                let mut allotments = tiers.allotments();
                allotments.keep(k, released);
                let taken = allotments.take(k, g.amount, (g.paced, g.expires), now);
                // The pace was lent until the node's allotment ends; the
                // app's ends sooner (by a report interval): what it makes
                // due between goes back to the owner with the next ask,
                // never spent here.
                allotments.keep(k, taken.lent - taken.paced);
                taken
            };
            let short = (g.amount - taken.tokens).saturating_add(g.paced - taken.paced);
            if short > 0
                && let Some(mut subgrants) = tiers.subgrants()
            {
                subgrants.give_back(k, client, short);
            }
            Some((taken, g.expires))
        });
        if let Some((taken, expires)) = grant
            && (taken.tokens > 0 || taken.paced > 0)
        {
            let m = &self.shared.metrics.cluster;
            m.client_grants.inc();
            m.client_granted_tokens
                .inc_by(taken.tokens.saturating_add(taken.paced));
            allotted.granted = taken.tokens;
            allotted.expires_in = expires.saturating_sub(asked_at);
            allotted.paced = taken.paced;
            allotted.paced_after = now.saturating_sub(asked_at);
        }
        Ok(allotted)
    }

    /// An app gives back what it did not spend of `check`'s key, and says
    /// it holds nothing else but `unreported` spent hits: the rest of what
    /// it was granted goes back to the owner with this node's next ask
    /// (never spent here: it may belong to an allotment the owner has
    /// since released).
    fn take_back(&self, check: &super::Check, client: &str, unused: u64, unreported: Option<u64>) {
        key::with_encoded(&check.name, &check.unique_key, |k| {
            let tiers = &self.shared.tiers;
            let back = match tiers.subgrants() {
                Some(mut subgrants) => {
                    let back = subgrants.give_back(k, client, unused);
                    let lost = unreported.map_or(0, |u| subgrants.holds_at_most(k, client, u));
                    back.saturating_add(lost)
                }
                None => 0,
            };
            if back > 0 {
                tiers.allotments().keep(k, back);
            }
        });
    }

    /// An app's report of what it spent: applied once per `seq`, each
    /// item's hits booked as this node's own lease spending (reported to
    /// the key's owner with the node's next report, absorbed here if this
    /// node owns the key).
    ///
    /// Spending is booked whether or not this node knows the app's
    /// sub-grant of the key: it was spent, and a node restarted since it
    /// granted (or that forgot the app) is the only one the app reports
    /// it to. Acknowledging it unbooked would lose it for good. A resend
    /// the node no longer recognises then counts twice — refusing too
    /// much, never admitting too much. Booking needs no privilege a check
    /// lacks (a check spends any key too), and the table it grows is
    /// bounded: a report that would take it past its bound is booked not
    /// at all and answered "retry".
    ///
    /// One synchronous step under the sub-grants' lock, the number marked
    /// applied only once every item is booked: a report is booked whole or
    /// not at all, and a leaving node that closed to apps has none
    /// half-booked.
    pub fn client_report(
        &self,
        client: &str,
        seq: u64,
        items: Vec<Result<super::Check, ItemError>>,
    ) -> ClientAck {
        let now = self.now();
        // Resolved before the lock: grants wait on it.
        let policies = self.shared.policies.load_full();
        let mut errors = Vec::new();
        let mut booked = Vec::with_capacity(items.len());
        for item in items {
            let resolved = item.and_then(|c| {
                let spec = self.resolve(&c, &policies)?.spec;
                Ok((c, spec))
            });
            match resolved {
                Ok((check, spec)) if check.request.hits > 0 => {
                    let k = key::encode(&check.name, &check.unique_key);
                    booked.push((k, spec, check.request.hits));
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        let tiers = &self.shared.tiers;
        let Some(mut subgrants) = tiers.subgrants() else {
            return self.counted(ClientAck::Retry);
        };
        if tiers.apps() == APPS_CLOSED {
            drop(subgrants);
            return self.counted(ClientAck::Retry);
        }
        match subgrants.fresh(client, seq, now) {
            Some(true) => {}
            Some(false) => {
                drop(subgrants);
                return self.counted(ClientAck::Duplicate);
            }
            None => {
                drop(subgrants);
                return self.counted(ClientAck::Retry);
            }
        }
        if !self.shared.leases.record_all(&booked, now) {
            drop(subgrants);
            return self.counted(ClientAck::Retry);
        }
        let mut unknown = 0u64;
        for (k, _, hits) in &booked {
            if !subgrants.reported(k, client, *hits) {
                unknown = unknown.saturating_add(*hits);
            }
        }
        subgrants.applied(client, seq);
        drop(subgrants);
        if unknown > 0 {
            self.shared
                .metrics
                .cluster
                .client_unknown_spent
                .inc_by(unknown);
        }
        self.counted(ClientAck::Applied(errors))
    }

    /// This node is leaving: it passes no more of its allotments to apps.
    /// Their reports, and what they give back, are still taken.
    pub fn stop_granting_to_apps(&self) {
        self.shared.tiers.set_apps(APPS_NOT_GRANTING);
    }

    /// What apps hold of this node's allotments: granted, not yet reported
    /// or given back, and not lapsed past the grace (their last reports
    /// may still come). Releases what lapsed.
    pub fn apps_outstanding(&self) -> u64 {
        self.settle_subgrants()
    }

    /// How long an app may hold a sub-grant given now, and report it late:
    /// a leaving node that stopped granting waits at most this for apps.
    pub fn apps_settle_within(&self) -> std::time::Duration {
        let t = &self.shared.tiers.terms;
        std::time::Duration::from_nanos(t.ttl.saturating_add(t.grace))
    }

    /// Book no more app reports (each is answered "retry"): this node's
    /// last report round is next, and spending booked after it would be
    /// acknowledged and never sent. On return no report is half-booked.
    pub fn close_to_apps(&self) {
        let tiers = &self.shared.tiers;
        let _booking = tiers.subgrants();
        tiers.set_apps(APPS_CLOSED);
    }

    fn counted(&self, ack: ClientAck) -> ClientAck {
        self.shared
            .metrics
            .cluster
            .client_reports
            .get_or_create(&vec![("ack", ack.name())])
            .inc();
        ack
    }

    /// Release apps' sub-grants that lapsed unreported past the grace
    /// (their tokens go back to the owner with this node's next ask), and
    /// set the gauge; returns what apps still hold.
    /// The reporter calls this once per report interval.
    pub(super) fn settle_subgrants(&self) -> u64 {
        let now = self.now();
        let tiers = &self.shared.tiers;
        // The walk holds only the sub-grants' lock: decisions (which take
        // the allotments' lock) go on meanwhile.
        let (released, outstanding) = {
            let Some(mut subgrants) = tiers.subgrants() else {
                return 0;
            };
            let released = subgrants.sweep(now);
            (released, subgrants.outstanding(now))
        };
        if !released.is_empty() {
            let mut allotments = tiers.allotments();
            for (k, tokens) in released {
                allotments.keep(&k, tokens);
            }
        }
        self.shared
            .metrics
            .cluster
            .client_outstanding
            .set(i64::try_from(outstanding).unwrap_or(i64::MAX));
        outstanding
    }
}
