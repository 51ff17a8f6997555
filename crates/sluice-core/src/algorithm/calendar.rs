//! Calendar windows in UTC: minute, hour, day, ISO week, month, year.
//!
//! Unix time has no leap seconds, so minutes, hours and days are fixed lengths
//! aligned to the epoch. Weeks start on Monday 00:00 UTC (ISO 8601). Months
//! and years have varying lengths and are found through the proleptic
//! Gregorian calendar, converting days since the epoch to a civil date and
//! back (Howard Hinnant's `days_from_civil` / `civil_from_days`, pure integer
//! arithmetic, valid far beyond the range of `u64` nanoseconds).

use super::Nanos;

pub(crate) const NANOS_PER_SECOND: u64 = 1_000_000_000;
pub(crate) const NANOS_PER_MINUTE: u64 = 60 * NANOS_PER_SECOND;
pub(crate) const NANOS_PER_HOUR: u64 = 60 * NANOS_PER_MINUTE;
pub(crate) const NANOS_PER_DAY: u64 = 24 * NANOS_PER_HOUR;
const NANOS_PER_WEEK: u64 = 7 * NANOS_PER_DAY;
/// 1970-01-01 was a Thursday; the first ISO week of the epoch starts on
/// Monday 1970-01-05, four days later.
const FIRST_MONDAY: u64 = 4 * NANOS_PER_DAY;

/// A calendar unit a fixed window can be aligned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CalendarUnit {
    Minute,
    Hour,
    Day,
    /// ISO 8601 week: Monday 00:00 UTC to the next Monday.
    Week,
    Month,
    Year,
}

impl CalendarUnit {
    pub const ALL: [CalendarUnit; 6] = [
        CalendarUnit::Minute,
        CalendarUnit::Hour,
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ];

    /// Parse a unit's name (as in [`CalendarUnit::name`]).
    pub fn from_name(name: &str) -> Option<CalendarUnit> {
        CalendarUnit::ALL.into_iter().find(|u| u.name() == name)
    }

    /// The window `[start, end)` that contains `t`. `end` saturates at
    /// `u64::MAX` for windows that end after the year 2554.
    pub fn bounds(self, t: Nanos) -> (Nanos, Nanos) {
        match self {
            CalendarUnit::Minute => fixed(t, NANOS_PER_MINUTE),
            CalendarUnit::Hour => fixed(t, NANOS_PER_HOUR),
            CalendarUnit::Day => fixed(t, NANOS_PER_DAY),
            CalendarUnit::Week => {
                if t < FIRST_MONDAY {
                    // The week of 1970-01-01 began on Monday 1969-12-29,
                    // before the epoch; clamp its start to the epoch.
                    (0, FIRST_MONDAY)
                } else {
                    let (s, e) = fixed(t - FIRST_MONDAY, NANOS_PER_WEEK);
                    (s + FIRST_MONDAY, e.saturating_add(FIRST_MONDAY))
                }
            }
            CalendarUnit::Month => {
                let (y, m, _) = civil_from_days(days(t));
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (
                    at_day(days_from_civil(y, m, 1)),
                    at_day(days_from_civil(ny, nm, 1)),
                )
            }
            CalendarUnit::Year => {
                let (y, _, _) = civil_from_days(days(t));
                (
                    at_day(days_from_civil(y, 1, 1)),
                    at_day(days_from_civil(y + 1, 1, 1)),
                )
            }
        }
    }

    /// The unit's name as it appears in config and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Minute => "minute",
            CalendarUnit::Hour => "hour",
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }
}

/// A window of fixed length `len` aligned to the epoch.
pub(crate) fn fixed(t: Nanos, len: Nanos) -> (Nanos, Nanos) {
    let start = t - t % len;
    (start, start.saturating_add(len))
}

fn days(t: Nanos) -> i64 {
    // u64::MAX / NANOS_PER_DAY is about 213,503 days: fits an i64.
    (t / NANOS_PER_DAY) as i64
}

fn at_day(days: i64) -> Nanos {
    // Every day this module produces is at or after the epoch.
    u64::try_from(days)
        .ok()
        .and_then(|d| d.checked_mul(NANOS_PER_DAY))
        .unwrap_or(u64::MAX)
}

/// Days since 1970-01-01 of the civil date `y-m-d` (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The civil date `(y, m, d)` of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(days: i64) -> Nanos {
        at_day(days)
    }

    #[test]
    fn civil_round_trip_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(days_from_civil(2026, 11, 29), 20_786);
        for z in -1_000_000..1_000_000i64 {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }

    #[test]
    fn leap_february_and_year_bounds() {
        let t = ns(days_from_civil(2024, 2, 10)) + 5;
        let (s, e) = CalendarUnit::Month.bounds(t);
        assert_eq!(s, ns(days_from_civil(2024, 2, 1)));
        assert_eq!(e - s, 29 * NANOS_PER_DAY);
        let (s, e) = CalendarUnit::Year.bounds(t);
        assert_eq!((e - s) / NANOS_PER_DAY, 366);
        let (s, e) = CalendarUnit::Month.bounds(ns(days_from_civil(2023, 12, 31)));
        assert_eq!(s, ns(days_from_civil(2023, 12, 1)));
        assert_eq!(e, ns(days_from_civil(2024, 1, 1)));
    }

    #[test]
    fn iso_weeks_start_on_monday() {
        // 2026-11-29 is a Sunday: its ISO week began Monday 2026-11-23.
        let t = ns(days_from_civil(2026, 11, 29)) + 23 * NANOS_PER_HOUR;
        let (s, e) = CalendarUnit::Week.bounds(t);
        assert_eq!(s, ns(days_from_civil(2026, 11, 23)));
        assert_eq!(e, ns(days_from_civil(2026, 11, 30)));
        assert_eq!(CalendarUnit::Week.bounds(0), (0, FIRST_MONDAY));
    }

    #[test]
    fn extremes_do_not_panic() {
        for unit in CalendarUnit::ALL {
            let (s, e) = unit.bounds(u64::MAX);
            assert!(s <= e && e == u64::MAX, "{unit:?}");
            let (s, e) = unit.bounds(0);
            assert!(s == 0 && e > 0, "{unit:?}");
        }
    }
}
