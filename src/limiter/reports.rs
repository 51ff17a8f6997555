//! Lease spending: an edge reports what it admitted without the owner
//! (fallback leases, tiered allotments), and the owner absorbs it once per
//! `(edge, key, sequence)`.
//!
//! Reports go in chunks bounded by items and bytes (an owner refuses a
//! call above its item bound, and a refusal for size is no sign that it is
//! unreachable). An owner still receiving a key from its previous holders
//! answers "retry" — neither acknowledged nor a failure — so a report never
//! creates a fresh count that the transfer then cannot merge into.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Absorb, Limiter, ReportOutcome, Topology};
use crate::cluster::peers::ForwardError;
use crate::lease::Report;
use crate::store::{Absorbed, key};

/// Reports per call, and the bytes a call may reach.
const CHUNK_ITEMS: usize = 500;
const CHUNK_BYTES: usize = 256 * 1024;

/// What a report round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Reports acknowledged.
    pub acked: usize,
    /// Nothing for the report task to do until something happens: no
    /// spending waits to be reported, and this node holds no allotment,
    /// has promised nothing to edges and passed nothing on to apps. Each
    /// of those changes with time alone (expiries, the sub-grants' sweep,
    /// the gauges the round sets), so while any is held the task keeps
    /// its pace; once none is, only new spending gives it work. What an
    /// owner grants while its node is quiet shows in the gauges within the
    /// task's backstop (`server/tasks.rs`).
    pub quiet: bool,
}

impl Limiter {
    /// Send what this edge admitted on leases to each key's current owner
    /// (absorbing its own keys here). Unacknowledged reports are resent
    /// unchanged next time.
    pub async fn flush_reports(&self) -> Flushed {
        self.settle_doubts();
        let outstanding = self.settle_subgrants();
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
                Some(_) => acked += usize::from(self.absorb_own(&report, &t, false)),
                None => {}
            }
        }
        for (owner, reports) in by_owner {
            for chunk in chunks(&reports) {
                acked += self.send_reports(&owner, chunk).await;
            }
        }
        self.shared
            .metrics
            .cluster
            .unreported
            .set(leases.unreported() as i64);
        Flushed {
            acked,
            quiet: held == 0 && reserved == 0 && outstanding == 0 && leases.nothing_pending(),
        }
    }

    /// Absorb this node's own report of lease spending on a key it owns
    /// (`took`: as [`Limiter::absorb_encoded`]); whether it was.
    fn absorb_own(&self, report: &Report, t: &Topology, took: bool) -> bool {
        let absorb = Absorb {
            edge: &self.shared.node_id,
            seq: report.seq,
            hits: report.hits,
            at: report.at,
            reset_gen: report.reset_gen,
        };
        self.shared.leases.sending(std::slice::from_ref(report));
        let o = self.absorb_encoded(&report.key, &report.spec, &absorb, t, took);
        self.answered(report, o)
    }

    /// What `report`'s owner answered; whether it is acknowledged. A
    /// duplicate answering the report's only sending is a numbering that
    /// restarted low, not a retry: renumbered and resent, never taken for
    /// applied (see `Leases::renumber`).
    fn answered(&self, report: &Report, o: ReportOutcome) -> bool {
        let leases = &self.shared.leases;
        if let ReportOutcome::Duplicate { applied } = o
            && leases.renumber(report, applied)
        {
            return false;
        }
        if o.acknowledged() {
            leases.acknowledge(report, self.now());
        } else if matches!(
            o,
            ReportOutcome::Retry | ReportOutcome::NotOwner | ReportOutcome::Invalid
        ) {
            // Answered, and not applied: not a sending that could have been.
            leases.not_applied(std::slice::from_ref(report));
        }
        o.acknowledged()
    }

    /// Before this node decides `k` as its owner: what it admitted on a
    /// lease for `k` (while `k`'s previous owner was unreachable, say) and
    /// has not absorbed yet is absorbed first — else the count it decides
    /// on lacks that spending until the next report round, and grants it
    /// again. One atomic load when nothing is unreported.
    pub(super) fn absorb_own_first(&self, k: &[u8], t: &Topology) {
        // The report in flight, then one of the hits since (bounded: hits
        // a lease admits meanwhile are that lease's, as any race with it).
        for _ in 0..2 {
            match self.shared.leases.report_for(k) {
                Some(report) if self.absorb_own(&report, t, true) => {}
                _ => return,
            }
        }
    }

    /// Before this edge asks `owner` to decide a key: what it admitted on a
    /// lease for the key and the owner has not acknowledged (`report`, which
    /// must come from [`Leases::report_for`](crate::lease::Leases::report_for):
    /// only its sequence is acknowledged in the table) goes first,
    /// within `deadline`. A new owner after a failover otherwise decides on the
    /// count it took over — without the leases the edges spent while no
    /// owner answered — until the next report round, and grants that
    /// spending again (seen in the container chaos test: +20 per key of a
    /// killed owner). False when the owner did not acknowledge it: the
    /// caller decides on its lease, as for an owner that cannot answer —
    /// which spends only what is left of this edge's share of the count it
    /// last saw (the lease's earlier hits consumed it), so an owner that
    /// answers "retry" for a while (still taking the key over) costs at
    /// most that share, never a new one.
    pub(super) async fn report_first(
        &self,
        report: Report,
        owner: &str,
        deadline: tokio::time::Instant,
    ) -> bool {
        // The report in flight (the flusher's, say), then one of the hits
        // since (bounded: hits a lease admits meanwhile are that lease's,
        // as any race with it). No lookup after the last send: it would
        // cut a report this path never sends (harmless — the flusher
        // resends what is in flight — but an early cut).
        if !self.send_one(owner, &report, deadline).await {
            return false;
        }
        match self.shared.leases.report_for(&report.key) {
            Some(rest) => self.send_one(owner, &rest, deadline).await,
            None => true,
        }
    }

    /// Send one report to `owner` within `deadline`; true if acknowledged.
    /// Cancelled (the deadline, or the caller gone): the report stays in
    /// flight and is resent unchanged; nothing is half-done.
    async fn send_one(&self, owner: &str, report: &Report, deadline: tokio::time::Instant) -> bool {
        let sent = self.send_reports(owner, std::slice::from_ref(report));
        matches!(tokio::time::timeout_at(deadline, sent).await, Ok(1))
    }

    /// One call's worth of reports to `owner`; returns how many it
    /// acknowledged.
    async fn send_reports(&self, owner: &str, reports: &[Report]) -> usize {
        self.shared.leases.sending(reports);
        match self.shared.peers.report(owner, reports).await {
            Ok(outcomes) => reports
                .iter()
                .zip(outcomes)
                .filter(|(rep, o)| self.answered(rep, *o))
                .count(),
            Err(ForwardError::Refused { peer, reason }) => {
                tracing::warn!(%peer, %reason, "lease reports refused; will retry");
                self.shared.leases.not_applied(reports);
                0
            }
            Err(
                e @ (ForwardError::BreakerOpen(_)
                | ForwardError::QueueFull(_)
                | ForwardError::UnknownPeer(_)
                | ForwardError::BadAnswer { .. }),
            ) => {
                // Never sent, or answered with nothing applied.
                tracing::debug!(peer = %owner, error = %e, "lease report not sent; will retry");
                self.shared.leases.not_applied(reports);
                0
            }
            // Unreachable (a deadline, a broken connection) or a malformed
            // answer: it may have been applied, and counts as a sending.
            Err(e) => {
                tracing::debug!(peer = %owner, error = %e, "lease report not delivered; will retry");
                0
            }
        }
    }

    /// Absorb what an edge admitted on leases, once per `(edge, key, seq)`.
    /// Reports for keys this node owns but still lacks are pulled first —
    /// all of them in one pull per member still transferring — so spending
    /// never lands on a fresh count that the transfer cannot merge into;
    /// those that cannot be pulled now are answered "retry".
    pub async fn absorb_reports(
        &self,
        reports: &[(String, String, crate::algorithm::Spec, Absorb<'_>)],
    ) -> Vec<ReportOutcome> {
        let t = self.shared.topology.load_full();
        let may_own = self.may_own();
        let keys: Vec<Vec<u8>> = reports
            .iter()
            .map(|(name, unique_key, _, _)| key::encode(name, unique_key))
            .collect();
        let lacking: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| self.route(k, &t, may_own) == super::route::Route::Lacking)
            .cloned()
            .collect();
        let taken = if lacking.is_empty() {
            None
        } else {
            Some(
                self.take_lacking(&lacking, &t, self.shared.settings.budget * 9 / 10)
                    .await,
            )
        };
        reports
            .iter()
            .zip(&keys)
            .map(|((_, _, spec, report), k)| {
                let took = taken.as_ref().is_some_and(|taken| {
                    !taken.stale && (taken.reached_all || taken.owned.contains(k))
                });
                self.absorb_encoded(k, spec, report, &t, took)
            })
            .collect()
    }

    /// Absorb one report under `t`; `took`: the key, lacking, was just
    /// taken from every member that could hold it.
    pub(super) fn absorb_encoded(
        &self,
        k: &[u8],
        spec: &crate::algorithm::Spec,
        r: &Absorb<'_>,
        t: &Topology,
        took: bool,
    ) -> ReportOutcome {
        if t.minority {
            // Not the owner of anything for sure: acknowledging here could
            // keep the consumption from the key's owner on the other side.
            return ReportOutcome::Retry;
        }
        match self.route(k, t, self.may_own()) {
            super::route::Route::Here => {}
            super::route::Route::Lacking if took => {}
            super::route::Route::Forward(_) => return ReportOutcome::NotOwner,
            // Still coming from its previous holders, or this node cannot
            // own anything right now: later.
            super::route::Route::Lacking | super::route::Route::NoOwner => {
                return ReportOutcome::Retry;
            }
        }
        // Hits spent elsewhere count at this owner's now: only the owner's
        // clock decides. An edge's `at` ahead would move the key's time
        // forward; behind, it would have those hits refill early (or fall
        // into an earlier window). A report that waited (an owner
        // unreachable for a while) so counts as recent: a few hits
        // counted late, the safe side.
        let at = self.now();
        let report = crate::store::Report {
            edge: r.edge,
            seq: r.seq,
            hits: r.hits,
            at,
            reset_gen: r.reset_gen,
        };
        let absorbed = self.fenced(t.view, |fence| {
            self.shared
                .store
                .absorb_report(k, spec, &report, Some(fence))
        });
        let outcome = match absorbed {
            Err(_) => return ReportOutcome::Retry,
            Ok(Absorbed::Applied) => {
                // Reported hits of a tiered allotment are no longer promised.
                self.shared.tiers.reported(k, r.edge, r.hits);
                ReportOutcome::Applied
            }
            Ok(Absorbed::Duplicate { applied }) => ReportOutcome::Duplicate { applied },
            Ok(Absorbed::BeforeReset) => ReportOutcome::Stale,
        };
        self.shared
            .metrics
            .cluster
            .reports
            .get_or_create(&vec![("outcome", outcome.name())])
            .inc();
        outcome
    }
}

/// Split reports into calls of at most [`CHUNK_ITEMS`] items and about
/// [`CHUNK_BYTES`] bytes (at least one report each).
fn chunks(reports: &[Report]) -> Vec<&[Report]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, r) in reports.iter().enumerate() {
        let size = r.key.len() + 64;
        if i > start && (i - start >= CHUNK_ITEMS || bytes + size > CHUNK_BYTES) {
            out.push(&reports[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < reports.len() {
        out.push(&reports[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Period, Spec};

    #[test]
    fn reports_go_in_bounded_chunks() {
        let spec = Spec::new(Algorithm::TokenBucket, 10, Period::Duration(1), None).unwrap();
        let report = |i: usize, len: usize| Report {
            key: Arc::from(key::encode("n", &"k".repeat(len + i % 2))),
            spec,
            seq: i as u64,
            hits: 1,
            at: 0,
            reset_gen: None,
        };
        let many: Vec<Report> = (0..1_234).map(|i| report(i, 4)).collect();
        let sizes: Vec<usize> = chunks(&many).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![500, 500, 234]);
        let big: Vec<Report> = (0..40).map(|i| report(i, 20_000)).collect();
        let by_bytes = chunks(&big);
        assert!(by_bytes.len() > 1, "bytes bound the chunks too");
        assert!(
            by_bytes
                .iter()
                .all(|c| c.iter().map(|r| r.key.len()).sum::<usize>() <= CHUNK_BYTES + 20_100)
        );
        assert_eq!(by_bytes.iter().map(|c| c.len()).sum::<usize>(), 40);
        assert!(chunks(&[]).is_empty());
    }
}
