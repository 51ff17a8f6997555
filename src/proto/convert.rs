//! The enum mappers between the wire and the domain, in one place for
//! every edge (the public API, the peer codec, the admin API): a value the
//! wire does not know is `None`, and each edge says which field it was in.

use crate::algorithm::{Algorithm, CalendarUnit};

use super::v1 as pb;

/// The algorithm a wire value names (unspecified: the token bucket).
pub fn algorithm_from_wire(v: i32) -> Option<Algorithm> {
    Some(match pb::Algorithm::try_from(v).ok()? {
        pb::Algorithm::Unspecified | pb::Algorithm::TokenBucket => Algorithm::TokenBucket,
        pb::Algorithm::Gcra => Algorithm::Gcra,
        pb::Algorithm::LeakyBucket => Algorithm::LeakyBucket,
        pb::Algorithm::FixedWindow => Algorithm::FixedWindow,
        pb::Algorithm::SlidingWindowCounter => Algorithm::SlidingWindowCounter,
        pb::Algorithm::SlidingWindowLog => Algorithm::SlidingWindowLog,
    })
}

pub fn algorithm_to_wire(a: Algorithm) -> pb::Algorithm {
    match a {
        Algorithm::TokenBucket => pb::Algorithm::TokenBucket,
        Algorithm::Gcra => pb::Algorithm::Gcra,
        Algorithm::LeakyBucket => pb::Algorithm::LeakyBucket,
        Algorithm::FixedWindow => pb::Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter => pb::Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog => pb::Algorithm::SlidingWindowLog,
    }
}

/// The calendar window a wire value names: `Some(None)` for none (a
/// duration), `None` for a value the wire does not know.
pub fn window_from_wire(v: i32) -> Option<Option<CalendarUnit>> {
    Some(match pb::CalendarWindow::try_from(v).ok()? {
        pb::CalendarWindow::Unspecified => None,
        pb::CalendarWindow::Minute => Some(CalendarUnit::Minute),
        pb::CalendarWindow::Hour => Some(CalendarUnit::Hour),
        pb::CalendarWindow::Day => Some(CalendarUnit::Day),
        pb::CalendarWindow::Week => Some(CalendarUnit::Week),
        pb::CalendarWindow::Month => Some(CalendarUnit::Month),
        pb::CalendarWindow::Year => Some(CalendarUnit::Year),
    })
}

pub fn window_to_wire(u: CalendarUnit) -> pb::CalendarWindow {
    match u {
        CalendarUnit::Minute => pb::CalendarWindow::Minute,
        CalendarUnit::Hour => pb::CalendarWindow::Hour,
        CalendarUnit::Day => pb::CalendarWindow::Day,
        CalendarUnit::Week => pb::CalendarWindow::Week,
        CalendarUnit::Month => pb::CalendarWindow::Month,
        CalendarUnit::Year => pb::CalendarWindow::Year,
    }
}
