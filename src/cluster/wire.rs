//! Peer-protocol conversions, shared by the forwarding edge and the peer
//! service: a resolved limit travels whole, and the owner's decision comes
//! back field for field.

use crate::algorithm::{self, Bounds, Decision, Period, Spec};
use crate::proto::peer as pb;
use crate::proto::v1 as v1pb;
use crate::service::wire::{algorithm_from_wire, algorithm_to_wire, window_to_wire};

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
    let algorithm = algorithm_from_wire(l.algorithm).map_err(|e| e.to_string())?;
    let period = match (l.duration_ns, l.window) {
        (d, 0) if d > 0 => Period::Duration(d),
        (0, w) if w != 0 => {
            let unit = match v1pb::CalendarWindow::try_from(w) {
                Ok(v1pb::CalendarWindow::Minute) => algorithm::CalendarUnit::Minute,
                Ok(v1pb::CalendarWindow::Hour) => algorithm::CalendarUnit::Hour,
                Ok(v1pb::CalendarWindow::Day) => algorithm::CalendarUnit::Day,
                Ok(v1pb::CalendarWindow::Week) => algorithm::CalendarUnit::Week,
                Ok(v1pb::CalendarWindow::Month) => algorithm::CalendarUnit::Month,
                Ok(v1pb::CalendarWindow::Year) => algorithm::CalendarUnit::Year,
                _ => return Err(format!("window: unknown calendar window {w}")),
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
            algorithm::Reason::WithinLimit => 1,
            algorithm::Reason::LimitExceeded => 2,
            algorithm::Reason::CostExceedsCapacity => 3,
        },
        limit: d.limit,
        remaining: d.remaining,
        reset_at_ns: d.reset_at,
        retry_after_ns: d.retry_after,
        delay_ns: d.delay,
        owner: owner.to_string(),
        approximate,
    }
}

pub fn decision_from_wire(d: &pb::Decision) -> Result<Decision, String> {
    let reason = match d.reason {
        1 => algorithm::Reason::WithinLimit,
        2 => algorithm::Reason::LimitExceeded,
        3 => algorithm::Reason::CostExceedsCapacity,
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
