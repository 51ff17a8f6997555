//! Wire ↔ domain conversion for `sluice.v1`, and the validation of every
//! request field at the edge: an invalid item gets an error naming the field,
//! and no counter is touched.

use crate::algorithm::{Algorithm, Bounds, CalendarUnit, Cost, Nanos, Period, Spec};
use crate::config::Limits;
use crate::limiter::{
    Check, ItemError, LimitRef, Mode, Path, Reason, Replication, Status, Verdict,
};
use crate::policy::OnOwnerUnreachable;
use crate::proto::convert;
use crate::proto::v1 as pb;

const NANOS_PER_MS: u64 = 1_000_000;

/// Validate a wire request into a [`Check`]. A valid request gives up its
/// `name` and `unique_key` to the check (moved, not copied: two allocations
/// and copies per decision less); an invalid one is left as it was.
pub fn check_from_wire(r: &mut pb::RateLimitRequest, limits: &Limits) -> Result<Check, ItemError> {
    key_part("name", &r.name, limits.max_key_bytes)?;
    key_part("unique_key", &r.unique_key, limits.max_key_bytes)?;
    let hits = match r.hits {
        None => 1,
        Some(h) => non_negative("hits", h)?,
    };
    let limit = match &r.policy {
        Some(policy) => {
            let inline = [
                ("limit", r.limit != 0),
                ("duration_ms", r.duration_ms.is_some()),
                ("window", r.window != 0),
                ("burst", r.burst.is_some()),
                ("algorithm", r.algorithm != 0),
            ];
            if let Some((field, _)) = inline.iter().find(|(_, set)| *set) {
                return Err(ItemError::new(
                    field,
                    format!("must be unset when policy is given (policy {policy:?} defines it)"),
                ));
            }
            if policy.is_empty() {
                return Err(ItemError::new("policy", "must not be empty when set"));
            }
            LimitRef::Policy(policy.clone())
        }
        None => LimitRef::Inline(inline_spec(r, limits)?),
    };
    let on_owner_unreachable = match pb::OwnerUnreachable::try_from(r.on_owner_unreachable) {
        Ok(pb::OwnerUnreachable::Unspecified) => None,
        Ok(pb::OwnerUnreachable::LocalShare) => Some(OnOwnerUnreachable::LocalShare),
        Ok(pb::OwnerUnreachable::Allow) => Some(OnOwnerUnreachable::Allow),
        Ok(pb::OwnerUnreachable::Deny) => Some(OnOwnerUnreachable::Deny),
        Err(_) => {
            return Err(ItemError::new(
                "on_owner_unreachable",
                format!("unknown value {}", r.on_owner_unreachable),
            ));
        }
    };
    let mode = match pb::Mode::try_from(r.mode) {
        Ok(pb::Mode::Unspecified) => None,
        Ok(pb::Mode::Exact) => Some(Mode::Exact),
        Ok(pb::Mode::Tiered) => Some(Mode::Tiered),
        Err(_) => return Err(ItemError::new("mode", format!("unknown value {}", r.mode))),
    };
    let replication = match pb::Replication::try_from(r.replication) {
        Ok(pb::Replication::Unspecified) => None,
        Ok(pb::Replication::Async) => Some(Replication::Async),
        Ok(pb::Replication::Sync) => Some(Replication::Sync),
        Err(_) => {
            return Err(ItemError::new(
                "replication",
                format!("unknown value {}", r.replication),
            ));
        }
    };
    // Every field is valid: only now is anything taken from the request.
    Ok(Check {
        name: std::mem::take(&mut r.name),
        unique_key: std::mem::take(&mut r.unique_key),
        limit,
        request: Cost {
            hits,
            drain_over_limit: r.drain_over_limit,
            nodelay: r.nodelay,
        },
        unbatched: r.skip_batching,
        on_owner_unreachable,
        mode,
        replication,
    })
}

fn inline_spec(r: &pb::RateLimitRequest, limits: &Limits) -> Result<Spec, ItemError> {
    let limit = non_negative("limit", r.limit)?;
    let burst = r.burst.map(|b| non_negative("burst", b)).transpose()?;
    let algorithm = algorithm_from_wire(r.algorithm)?;
    let window = window_from_wire(r.window)?;
    let period = match (r.duration_ms, window) {
        (Some(_), Some(_)) => {
            return Err(ItemError::new(
                "duration_ms",
                "set either duration_ms or window, not both",
            ));
        }
        (None, None) => {
            return Err(ItemError::new(
                "duration_ms",
                "set duration_ms or a calendar window",
            ));
        }
        (Some(ms), None) => {
            if ms <= 0 {
                return Err(ItemError::new(
                    "duration_ms",
                    format!("must be greater than zero, got {ms}"),
                ));
            }
            Period::Duration((ms as u64).saturating_mul(NANOS_PER_MS))
        }
        (None, Some(unit)) => Period::Calendar(unit),
    };
    let bounds = Bounds {
        max_log_entries: limits.max_log_entries,
    };
    Spec::with_bounds(algorithm, limit, period, burst, &bounds).map_err(|e| {
        // The algorithm names its own fields; the wire calls the duration duration_ms.
        let field = if e.field == "duration" {
            "duration_ms"
        } else {
            e.field
        };
        ItemError::new(field, e.message)
    })
}

fn key_part(field: &'static str, v: &str, max: usize) -> Result<(), ItemError> {
    if v.is_empty() {
        return Err(ItemError::new(field, "must not be empty"));
    }
    if v.len() > max {
        return Err(ItemError::new(
            field,
            format!("must be at most {max} bytes, got {}", v.len()),
        ));
    }
    Ok(())
}

fn non_negative(field: &'static str, v: i64) -> Result<u64, ItemError> {
    u64::try_from(v).map_err(|_| ItemError::new(field, format!("must not be negative, got {v}")))
}

/// The algorithm a wire value names (unspecified: the token bucket).
pub fn algorithm_from_wire(v: i32) -> Result<Algorithm, ItemError> {
    convert::algorithm_from_wire(v)
        .ok_or_else(|| ItemError::new("algorithm", format!("unknown algorithm {v}")))
}

pub use convert::{algorithm_to_wire, window_to_wire};

fn window_from_wire(v: i32) -> Result<Option<CalendarUnit>, ItemError> {
    convert::window_from_wire(v)
        .ok_or_else(|| ItemError::new("window", format!("unknown calendar window {v}")))
}

/// Nanoseconds to whole milliseconds, rounded up (times never arrive early).
pub fn ms_up(ns: u64) -> i64 {
    i64::try_from(ns.div_ceil(NANOS_PER_MS)).unwrap_or(i64::MAX)
}

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The period of a spec in wire form: `(duration_ms, window)`.
pub fn period_to_wire(spec: &Spec) -> (i64, pb::CalendarWindow) {
    match spec.period() {
        Period::Duration(ns) => (ms_up(ns), pb::CalendarWindow::Unspecified),
        Period::Calendar(u) => (0, window_to_wire(u)),
    }
}

/// A verdict as a wire response (request_id and metadata are filled by the caller).
/// A verdict on the wire; `now` is the deciding node's clock, for the
/// relative fields.
pub fn verdict_to_wire(v: &Verdict, now: Nanos) -> pb::RateLimitResponse {
    let d = &v.decision;
    pb::RateLimitResponse {
        status: status_to_wire(v.status) as i32,
        reason: reason_to_wire(v.reason) as i32,
        limit: count(d.limit),
        remaining: count(d.remaining),
        reset_at_ms: ms_up(d.reset_at),
        retry_after_ms: match (v.reason, d.retry_after) {
            (Reason::LimitExceeded, Some(r)) => ms_up(r),
            _ => 0,
        },
        delay_ms: ms_up(d.delay),
        approximate: v.approximate,
        owner: v.owner.to_string(),
        window_ms: ms_up(v.window),
        reset_after_ms: ms_up(d.reset_at.saturating_sub(now)),
        path: match v.path {
            Path::Owner => pb::Path::Owner,
            Path::LocalAllotment => pb::Path::LocalAllotment,
            Path::Slow => pb::Path::Slow,
            Path::Fallback => pb::Path::Fallback,
        } as i32,
        ..Default::default()
    }
}

/// An item shed because the node is saturated.
pub fn overloaded() -> pb::RateLimitResponse {
    pb::RateLimitResponse {
        status: pb::Status::Unavailable as i32,
        reason: pb::Reason::Overloaded as i32,
        ..Default::default()
    }
}

/// An invalid item as a wire response.
pub fn error_to_wire(e: &ItemError) -> pb::RateLimitResponse {
    pb::RateLimitResponse {
        error: Some(pb::Error {
            code: tonic::Code::InvalidArgument as i32,
            field: e.field.to_string(),
            message: e.to_string(),
        }),
        ..Default::default()
    }
}

pub fn status_to_wire(s: Status) -> pb::Status {
    match s {
        Status::UnderLimit => pb::Status::UnderLimit,
        Status::OverLimit => pb::Status::OverLimit,
        Status::Unavailable => pb::Status::Unavailable,
    }
}

pub fn reason_to_wire(r: Reason) -> pb::Reason {
    match r {
        Reason::WithinLimit => pb::Reason::WithinLimit,
        Reason::LimitExceeded => pb::Reason::LimitExceeded,
        Reason::CostExceedsCapacity => pb::Reason::CostExceedsCapacity,
        Reason::OwnerUnreachable => pb::Reason::OwnerUnreachable,
        Reason::Overloaded => pb::Reason::Overloaded,
        Reason::Shadow => pb::Reason::Shadow,
        Reason::NotReady => pb::Reason::NotReady,
    }
}
