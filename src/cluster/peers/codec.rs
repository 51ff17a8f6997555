//! Peer-protocol conversions, shared by the forwarding edge and the peer
//! service: a resolved limit travels whole, and the owner's decision comes
//! back field for field.

use std::sync::Arc;

use crate::algorithm::{self, Bounds, Decision, Period, Spec, State, StateParts};
use crate::lease::Report;
use crate::proto::convert::{
    algorithm_from_wire, algorithm_to_wire, window_from_wire, window_to_wire,
};
use crate::proto::peer as pb;
use crate::store::{Snapshot, key};

use super::types::{Forward, Forwarded, Granted, Outgoing, ReportOutcome, SyncKind};

pub fn limit_to_wire(spec: &Spec) -> pb::Limit {
    let (duration_ns, window) = match spec.period() {
        Period::Duration(d) => (d, 0),
        Period::Calendar(u) => (0, window_to_wire(u) as i32),
    };
    pb::Limit {
        algorithm: algorithm_to_wire(spec.algorithm()) as i32,
        limit: spec.limit(),
        duration_ns,
        window,
        burst: spec.algorithm().is_bucket().then_some(spec.capacity()),
    }
}

/// Validate a forwarded limit as strictly as a client's (a peer is not trusted
/// to send only good input either).
pub fn limit_from_wire(l: &pb::Limit, bounds: &Bounds) -> Result<Spec, String> {
    let algorithm = algorithm_from_wire(l.algorithm)
        .ok_or_else(|| format!("algorithm: unknown algorithm {}", l.algorithm))?;
    let period = match (l.duration_ns, l.window) {
        (d, 0) if d > 0 => Period::Duration(d),
        (0, w) if w != 0 => {
            let Some(Some(unit)) = window_from_wire(w) else {
                return Err(format!("window: unknown calendar window {w}"));
            };
            Period::Calendar(unit)
        }
        _ => return Err("duration_ns: set exactly one of duration_ns and window".into()),
    };
    Spec::with_bounds(algorithm, l.limit, period, l.burst, bounds).map_err(|e| e.to_string())
}

pub fn decision_to_wire(d: &Decision, owner: &str, approximate: bool) -> pb::Decision {
    pb::Decision {
        reason: match d.reason {
            algorithm::Outcome::WithinLimit => 1,
            algorithm::Outcome::LimitExceeded => 2,
            algorithm::Outcome::CostExceedsCapacity => 3,
        },
        limit: d.limit,
        remaining: d.remaining,
        reset_at_ns: d.reset_at,
        retry_after_ns: d.retry_after,
        delay_ns: d.delay,
        owner: owner.to_string(),
        approximate,
        grant: None,
        reset_gen: 0,
    }
}

pub fn decision_from_wire(d: &pb::Decision) -> Result<Decision, String> {
    let reason = match d.reason {
        1 => algorithm::Outcome::WithinLimit,
        2 => algorithm::Outcome::LimitExceeded,
        3 => algorithm::Outcome::CostExceedsCapacity,
        r => return Err(format!("unknown reason {r}")),
    };
    Ok(Decision {
        reason,
        limit: d.limit,
        remaining: d.remaining,
        reset_at: d.reset_at_ns,
        retry_after: d.retry_after_ns,
        delay: d.delay_ns,
    })
}

pub(super) fn forward_to_wire(f: &Forward) -> pb::ForwardItem {
    pb::ForwardItem {
        name: f.name.clone(),
        unique_key: f.unique_key.clone(),
        limit: Some(limit_to_wire(&f.spec)),
        hits: f.hits,
        drain_over_limit: f.drain_over_limit,
        nodelay: f.nodelay,
        redirected: f.redirected,
        deadline_ns: f.deadline_ns,
        tiered: f.tiered.map(|a| pb::TieredAsk {
            demand: a.demand,
            unused: a.unused,
            pace: a.pace,
        }),
        budget_ns: f.budget_ns,
        sync_replica: f.sync_replica,
    }
}

/// An owner's answer to one forwarded item (the owner's id is the caller's
/// to fill in: it knows whom it asked).
pub fn forwarded_to_wire(f: Forwarded, owner: &str) -> pb::forward_result::Result {
    use pb::forward_result::Result as R;
    match f {
        Forwarded::Decided {
            decision,
            approximate,
            grant,
            reset_gen,
        } => {
            let mut d = decision_to_wire(&decision, owner, approximate);
            d.grant = grant.map(|g| pb::Grant {
                amount: g.amount,
                ttl_ns: g.ttl,
                paced: g.paced,
            });
            d.reset_gen = reset_gen;
            R::Decision(d)
        }
        Forwarded::Redirect(node_id) => R::Redirect(pb::Redirect {
            node_id: node_id.to_string(),
        }),
        Forwarded::Expired => R::Expired(pb::Expired {}),
        Forwarded::Unavailable => R::Unavailable(pb::Unavailable {}),
    }
}

/// An owner's answer read back; an item error or a malformed decision is
/// the error (`true`: the owner decided, so it may have counted the hit).
pub(super) fn forwarded_from_wire(r: pb::ForwardResult) -> Result<Forwarded, (bool, String)> {
    use pb::forward_result::Result as R;
    match r.result {
        Some(R::Decision(d)) => Ok(Forwarded::Decided {
            decision: decision_from_wire(&d).map_err(|e| (true, e))?,
            approximate: d.approximate,
            grant: d.grant.map(|g| Granted {
                amount: g.amount,
                ttl: g.ttl_ns,
                paced: g.paced,
            }),
            reset_gen: d.reset_gen,
        }),
        Some(R::Redirect(to)) => Ok(Forwarded::Redirect(Arc::from(to.node_id))),
        Some(R::Expired(_)) => Ok(Forwarded::Expired),
        Some(R::Unavailable(_)) => Ok(Forwarded::Unavailable),
        Some(R::Error(e)) => Err((false, e)),
        // A result kind this build does not know (a newer peer): it may
        // have decided the item.
        None => Err((true, "no result this build reads".into())),
    }
}

/// A report's outcome on the wire, and the sequence it names (`applied`
/// of a duplicate; 0 otherwise).
pub fn outcome_to_wire(o: ReportOutcome) -> (pb::ReportOutcome, u64) {
    match o {
        ReportOutcome::Applied => (pb::ReportOutcome::Applied, 0),
        ReportOutcome::Duplicate { applied } => (pb::ReportOutcome::Duplicate, applied),
        ReportOutcome::NotOwner => (pb::ReportOutcome::NotOwner, 0),
        ReportOutcome::Retry => (pb::ReportOutcome::Retry, 0),
        ReportOutcome::Stale => (pb::ReportOutcome::Stale, 0),
        ReportOutcome::Invalid => (pb::ReportOutcome::Invalid, 0),
    }
}

pub(super) fn outcome_from_wire(o: i32, applied: u64) -> ReportOutcome {
    match pb::ReportOutcome::try_from(o) {
        Ok(pb::ReportOutcome::Applied) => ReportOutcome::Applied,
        Ok(pb::ReportOutcome::Duplicate) => ReportOutcome::Duplicate { applied },
        Ok(pb::ReportOutcome::NotOwner) => ReportOutcome::NotOwner,
        Ok(pb::ReportOutcome::Retry) => ReportOutcome::Retry,
        Ok(pb::ReportOutcome::Stale) => ReportOutcome::Stale,
        // Unknown values included: never taken for a success.
        _ => ReportOutcome::Invalid,
    }
}

/// A lease report on the wire; None if its key bytes are not a key.
pub(super) fn report_to_wire(r: &Report) -> Option<pb::ReportItem> {
    let (name, unique_key) = key::decode(&r.key)?;
    Some(pb::ReportItem {
        name: name.to_string(),
        unique_key: unique_key.to_string(),
        limit: Some(limit_to_wire(&r.spec)),
        seq: r.seq,
        hits: r.hits,
        at_ns: r.at,
        reset_gen: r.reset_gen,
    })
}

pub(super) fn sync_kind_to_wire(k: SyncKind) -> pb::SyncKind {
    match k {
        SyncKind::Replica => pb::SyncKind::Replica,
        SyncKind::Handoff => pb::SyncKind::Handoff,
    }
}

/// A key's state ready for a push; None if the key bytes are not a key.
pub fn outgoing(k: &[u8], s: &Snapshot) -> Option<Outgoing> {
    snapshot_to_wire(k, s).map(Outgoing)
}

/// The state format this build writes and reads.
pub const STATE_FORMAT: u32 = 1;

/// A key's snapshot on the wire; None if the key bytes are not a key.
pub fn snapshot_to_wire(k: &[u8], s: &Snapshot) -> Option<pb::KeyState> {
    use pb::key_state::State as W;
    let (name, unique_key) = key::decode(k)?;
    let state = match s.state.to_parts() {
        StateParts::Meter { used, last } => W::Meter(pb::MeterState {
            used_low: used as u64,
            used_high: (used >> 64) as u64,
            last,
        }),
        StateParts::Gcra { tat } => W::GcraTat(tat),
        StateParts::FixedWindow { start, count } => {
            W::FixedWindow(pb::WindowState { start, count })
        }
        StateParts::SlidingWindowCounter { start, prev, curr } => {
            W::SlidingWindowCounter(pb::SlidingState { start, prev, curr })
        }
        StateParts::SlidingWindowLog { entries } => W::SlidingWindowLog(pb::LogState {
            at: entries.iter().map(|e| e.0).collect(),
            hits: entries.iter().map(|e| e.1).collect(),
        }),
    };
    Some(pb::KeyState {
        name: name.to_string(),
        unique_key: unique_key.to_string(),
        limit: Some(limit_to_wire(&s.spec)),
        reset_gen: s.reset_gen,
        version: s.version,
        format: STATE_FORMAT,
        state: Some(state),
        reports: s
            .reports
            .iter()
            .map(|(edge, seq)| pb::ReportSlot {
                edge: edge.to_string(),
                seq: *seq,
            })
            .collect(),
        copy: false,
    })
}

/// A snapshot from the wire, validated: its encoded key and the snapshot.
pub fn snapshot_from_wire(
    ks: &pb::KeyState,
    bounds: &Bounds,
) -> Result<(Vec<u8>, Snapshot), String> {
    use pb::key_state::State as W;
    if ks.format != STATE_FORMAT {
        return Err(format!(
            "format: state format {} is not {STATE_FORMAT}",
            ks.format
        ));
    }
    if ks.name.is_empty() || ks.unique_key.is_empty() {
        return Err("name and unique_key must not be empty".into());
    }
    let spec = limit_from_wire(ks.limit.as_ref().ok_or("limit: required")?, bounds)?;
    let parts = match ks.state.as_ref().ok_or("state: required")? {
        W::Meter(m) => StateParts::Meter {
            used: u128::from(m.used_low) | (u128::from(m.used_high) << 64),
            last: m.last,
        },
        W::GcraTat(tat) => StateParts::Gcra { tat: *tat },
        W::FixedWindow(w) => StateParts::FixedWindow {
            start: w.start,
            count: w.count,
        },
        W::SlidingWindowCounter(w) => StateParts::SlidingWindowCounter {
            start: w.start,
            prev: w.prev,
            curr: w.curr,
        },
        W::SlidingWindowLog(l) => {
            if l.at.len() != l.hits.len() {
                return Err("state: a log's times and hits differ in length".into());
            }
            StateParts::SlidingWindowLog {
                entries: l.at.iter().copied().zip(l.hits.iter().copied()).collect(),
            }
        }
    };
    let state = State::from_parts(&spec, parts)?;
    Ok((
        key::encode(&ks.name, &ks.unique_key),
        Snapshot {
            spec,
            reset_gen: ks.reset_gen,
            version: ks.version,
            state,
            reports: ks
                .reports
                .iter()
                .map(|r| (Arc::from(r.edge.as_str()), r.seq))
                .collect(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, CalendarUnit};

    #[test]
    fn limits_round_trip() {
        let specs = [
            Spec::new(Algorithm::TokenBucket, 10, Period::Duration(5), Some(20)).unwrap(),
            Spec::new(
                Algorithm::FixedWindow,
                3,
                Period::Calendar(CalendarUnit::Week),
                None,
            )
            .unwrap(),
            Spec::new(Algorithm::SlidingWindowLog, 0, Period::Duration(9), None).unwrap(),
        ];
        for s in specs {
            assert_eq!(
                limit_from_wire(&limit_to_wire(&s), &Bounds::default()),
                Ok(s)
            );
        }
        let bad = pb::Limit {
            duration_ns: 5,
            window: 3,
            ..Default::default()
        };
        assert!(limit_from_wire(&bad, &Bounds::default()).is_err());
    }
}
