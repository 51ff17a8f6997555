//! A validated limit: algorithm, limit, period and burst.
//!
//! Validation lives here, once, so that every front end (gRPC, Envoy, config
//! policies) refuses the same bad input with the same field-naming message,
//! and the algorithms can rely on their invariants (a non-zero duration, a
//! sliding log within its bound) without re-checking.

use std::fmt;

use super::Nanos;
use super::calendar::CalendarUnit;

/// The longest duration a limit may have: 100 years. Keeps every
/// `duration × count` product far inside `u128` and every window end inside
/// `u64` nanoseconds.
pub const MAX_DURATION: Nanos = 100 * 365 * 24 * 3_600 * 1_000_000_000;

/// Default bound on the sliding window log's entries per key (DESIGN §3).
pub const DEFAULT_MAX_LOG_ENTRIES: u64 = 10_000;

/// Which decision arithmetic a key uses. Unspecified means token bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    #[default]
    TokenBucket,
    Gcra,
    LeakyBucket,
    FixedWindow,
    SlidingWindowCounter,
    SlidingWindowLog,
}

impl Algorithm {
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ];

    /// The name used in config files, the CLI and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
        }
    }

    /// Parse a config/CLI name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Buckets have a capacity (`burst`) separate from their rate.
    pub fn is_bucket(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How long a limit lasts: a duration, or a calendar window (fixed windows only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    Duration(Nanos),
    Calendar(CalendarUnit),
}

/// Bounds that validation enforces; they come from the node's config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The largest `limit` a sliding window log accepts.
    pub max_log_entries: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_log_entries: DEFAULT_MAX_LOG_ENTRIES,
        }
    }
}

/// Invalid input, naming the field at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

impl SpecError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        SpecError {
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for SpecError {}

/// A validated limit. Construct with [`Spec::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spec {
    algorithm: Algorithm,
    limit: u64,
    period: Period,
    /// Resolved capacity: `burst` for buckets (default = limit), `limit` for
    /// windows; 0 when `limit` is 0 (deny all).
    capacity: u64,
}

impl Spec {
    /// Validate a limit with the default [`Bounds`].
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Period,
        burst: Option<u64>,
    ) -> Result<Spec, SpecError> {
        Spec::with_bounds(algorithm, limit, period, burst, &Bounds::default())
    }

    /// Validate a limit.
    ///
    /// `limit = 0` is valid and denies everything (as envoyproxy/ratelimit's
    /// `requests_per_unit: 0`). `burst` applies to buckets only; unset means
    /// `limit`.
    pub fn with_bounds(
        algorithm: Algorithm,
        limit: u64,
        period: Period,
        burst: Option<u64>,
        bounds: &Bounds,
    ) -> Result<Spec, SpecError> {
        match period {
            Period::Duration(0) => {
                return Err(SpecError::new("duration", "must be greater than zero"));
            }
            Period::Duration(d) if d > MAX_DURATION => {
                return Err(SpecError::new(
                    "duration",
                    format!("must be at most 100 years ({MAX_DURATION} ns), got {d} ns"),
                ));
            }
            Period::Calendar(unit) if algorithm != Algorithm::FixedWindow => {
                return Err(SpecError::new(
                    "window",
                    format!(
                        "a calendar window ({}) needs algorithm fixed_window; {algorithm} takes a duration",
                        unit.name()
                    ),
                ));
            }
            _ => {}
        }
        if algorithm == Algorithm::SlidingWindowLog && limit > bounds.max_log_entries {
            return Err(SpecError::new(
                "limit",
                format!(
                    "sliding_window_log keeps one entry per admitted request, so its limit may be at most {} (got {limit}); use sliding_window_counter for larger limits",
                    bounds.max_log_entries
                ),
            ));
        }
        let capacity = match burst {
            Some(_) if !algorithm.is_bucket() => {
                return Err(SpecError::new(
                    "burst",
                    format!("applies only to token_bucket, gcra and leaky_bucket, not {algorithm}"),
                ));
            }
            Some(0) if limit > 0 => {
                return Err(SpecError::new(
                    "burst",
                    "must be at least 1; leave it unset for the default (= limit)",
                ));
            }
            Some(b) => b,
            None => limit,
        };
        let capacity = if limit == 0 { 0 } else { capacity };
        Ok(Spec {
            algorithm,
            limit,
            period,
            capacity,
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn period(&self) -> Period {
        self.period
    }

    /// The most hits one request can ever be granted: the burst for buckets,
    /// the limit for windows, 0 when the limit is 0.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The duration in nanoseconds. Every algorithm but the fixed window
    /// requires one (enforced by validation), so this is total for them.
    pub fn duration(&self) -> Nanos {
        match self.period {
            Period::Duration(d) => d,
            // Only fixed windows take calendar periods and they never call
            // this; a nominal length keeps the function total regardless.
            Period::Calendar(unit) => {
                let (s, e) = unit.bounds(0);
                e - s
            }
        }
    }

    /// The window `[start, end)` containing `t`, for windowed algorithms.
    pub fn window(&self, t: Nanos) -> (Nanos, Nanos) {
        match self.period {
            Period::Duration(d) => super::calendar::fixed(t, d),
            Period::Calendar(unit) => unit.bounds(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Period = Period::Duration(60_000_000_000);

    #[test]
    fn defaults_resolve() {
        let s = Spec::new(Algorithm::TokenBucket, 10, MIN, None).unwrap();
        assert_eq!(s.capacity(), 10);
        let s = Spec::new(Algorithm::Gcra, 10, MIN, Some(25)).unwrap();
        assert_eq!(s.capacity(), 25);
        let s = Spec::new(Algorithm::FixedWindow, 0, MIN, None).unwrap();
        assert_eq!(s.capacity(), 0);
        let s = Spec::new(Algorithm::LeakyBucket, 0, MIN, Some(5)).unwrap();
        assert_eq!(s.capacity(), 0, "limit 0 denies all whatever the burst");
    }

    #[test]
    fn bad_input_names_the_field() {
        let e = |r: Result<Spec, SpecError>| r.unwrap_err().field;
        assert_eq!(
            e(Spec::new(
                Algorithm::TokenBucket,
                1,
                Period::Duration(0),
                None
            )),
            "duration"
        );
        assert_eq!(
            e(Spec::new(
                Algorithm::TokenBucket,
                1,
                Period::Duration(MAX_DURATION + 1),
                None
            )),
            "duration"
        );
        assert_eq!(
            e(Spec::new(Algorithm::SlidingWindowLog, 10_001, MIN, None)),
            "limit"
        );
        assert_eq!(
            e(Spec::new(Algorithm::FixedWindow, 1, MIN, Some(2))),
            "burst"
        );
        assert_eq!(
            e(Spec::new(Algorithm::TokenBucket, 1, MIN, Some(0))),
            "burst"
        );
        assert_eq!(
            e(Spec::new(
                Algorithm::Gcra,
                1,
                Period::Calendar(CalendarUnit::Month),
                None
            )),
            "window"
        );
        assert!(Spec::new(Algorithm::SlidingWindowLog, 10_000, MIN, None).is_ok());
        let wide = Bounds {
            max_log_entries: 20_000,
        };
        assert!(Spec::with_bounds(Algorithm::SlidingWindowLog, 20_000, MIN, None, &wide).is_ok());
    }

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(Algorithm::from_name("nope"), None);
    }
}
