//! Fuzz harness bodies, shared by the `cargo fuzz` targets (`fuzz/`) and by
//! the regression test that replays every kept input on stable
//! (`tests/fuzz_regressions.rs`). Each takes arbitrary bytes, must never
//! panic, and asserts the invariants that hold whatever the input.

use prost::Message;

use crate::algorithm::{
    Algorithm, Bounds, CalendarUnit, Cost, Decision, Limited, Nanos, Period, Spec, State,
};
use crate::config::Limits;
use crate::limiter::LimitRef;
use crate::policy::rules::Rules;
use crate::proto::v1 as pb;

/// The fields of a `sluice.v1` request an item error may name.
const REQUEST_FIELDS: [&str; 12] = [
    "name",
    "unique_key",
    "hits",
    "limit",
    "duration_ms",
    "window",
    "burst",
    "algorithm",
    "policy",
    "on_owner_unreachable",
    "mode",
    "replication",
];

/// Times a validated check is decided at: the epoch, a realistic now
/// (2023), and far in the future (year 2116), where window ends and
/// `now + duration` come closest to `u64::MAX`.
const DECIDE_AT: [Nanos; 3] = [0, 1_700_000_000_000_000_000, 1 << 62];

/// Cost validation: any bytes a client could send as a `Check` call.
/// Decoding may fail; a decoded request validates to a check or to an error
/// naming one of the request's fields — never a panic. A check keeps the
/// key bounds (1 to 64 bytes here) and its cost, and an inline limit is
/// then decided as its owner would, twice at each of [`DECIDE_AT`], every
/// decision meeting the invariants of [`algorithm`].
pub fn check_request(data: &[u8]) {
    check_request_decided(data);
}

/// [`check_request`], returning how many items were decided — so a kept
/// input can be shown to reach the algorithms, not only the decoder.
pub fn check_request_decided(data: &[u8]) -> usize {
    let Ok(mut request) = pb::CheckRequest::decode(data) else {
        return 0;
    };
    let limits = Limits {
        max_key_bytes: 64,
        ..Limits::default()
    };
    let mut decided = 0;
    for r in &mut request.requests {
        match crate::service::wire::check_from_wire(r, &limits) {
            Ok(check) => {
                assert!((1..=64).contains(&check.name.len()), "{check:?}");
                assert!((1..=64).contains(&check.unique_key.len()), "{check:?}");
                let hits = r.hits.map_or(1, |h| h as u64);
                assert_eq!(check.request.hits, hits, "the cost is what was sent");
                let LimitRef::Inline(spec) = check.limit else {
                    continue;
                };
                assert_eq!(spec.limit(), r.limit as u64, "the limit is what was sent");
                for now in DECIDE_AT {
                    let mut key = Limited::new(spec, now);
                    let mut last_reset = 0;
                    for _ in 0..2 {
                        let d = key.decide(&spec, check.request, now);
                        decision(&spec, check.request, &d, now, false);
                        assert!(d.reset_at >= last_reset, "{d:?} after {last_reset}");
                        last_reset = d.reset_at;
                    }
                }
                decided += 1;
            }
            Err(e) => {
                assert!(
                    REQUEST_FIELDS.contains(&e.field),
                    "an error names a field of the request: {e:?}"
                );
                assert!(!e.message.is_empty(), "an error says what is wrong");
            }
        }
    }
    decided
}

/// The config parser: any TOML text, loaded over the defaults.
pub fn config_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = crate::policy::from_toml_str(text) {
        assert!(!e.0.is_empty(), "an error says what is wrong");
    }
}

/// The envoyproxy/ratelimit descriptor rules parser: any YAML text.
pub fn rules_text(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut rules = Rules::default();
    if let Err(e) = rules.add(text, &Bounds::default()) {
        assert!(!e.is_empty());
    } else {
        // Lookups on what was just loaded: any entries, any depth.
        let entries: Vec<(&str, &str)> = text
            .split_whitespace()
            .take(8)
            .map(|w| w.split_once(':').unwrap_or((w, "")))
            .collect();
        for domain in text.split_whitespace().take(4) {
            let _ = rules.find(domain, &entries);
        }
    }
}

/// Reads fixed-size numbers off the input, zero when it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }

    fn u64(&mut self) -> u64 {
        let mut v = [0u8; 8];
        for b in &mut v {
            *b = self.u8();
        }
        u64::from_le_bytes(v)
    }

    /// Mostly extremes and small values, sometimes anything.
    fn number(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::MAX - u64::from(self.u8()),
            4 => u64::from(self.u8()),
            5 => 1 << (self.u8() % 64),
            _ => self.u64(),
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Each algorithm's arithmetic: a spec from extreme values, then a run of
/// decisions, absorbed reports, merges and conversions at arbitrary times
/// (never going back: the clock's own rule is tested by the algorithms'
/// tests). Invariants, checked after every step ([`decision`]):
/// - no panic or overflow (the fuzz build checks overflow);
/// - an admission never costs more than the capacity;
/// - `remaining` never exceeds the capacity (a converted state's, the new
///   spec's), and `limit` is the spec's;
/// - `reset_at` is never before `now`, never goes backwards from one
///   decision to the next as time moves on, and is never beyond
///   [`reset_horizon`] (`now` plus one period, as each algorithm counts
///   it) — except for a bucket in debt: reported consumption may exceed
///   the capacity, and the key pays it back first.
pub fn algorithm(data: &[u8]) {
    algorithm_steps(data);
}

/// [`algorithm`], returning how many steps ran (0: the input made no valid
/// spec) — so a kept input can be shown to reach the arithmetic.
pub fn algorithm_steps(data: &[u8]) -> usize {
    let mut b = Bytes(data);
    let algorithm = Algorithm::ALL[usize::from(b.u8()) % Algorithm::ALL.len()];
    let period = if b.u8() % 4 == 0 {
        Period::Calendar(CalendarUnit::ALL[usize::from(b.u8()) % CalendarUnit::ALL.len()])
    } else {
        Period::Duration(b.number())
    };
    let (limit, burst) = (b.number(), b.number());
    let burst = (b.u8() % 2 == 0).then_some(burst);
    let bounds = Bounds {
        max_log_entries: 64,
    };
    let Ok(spec) = Spec::with_bounds(algorithm, limit, period, burst, &bounds) else {
        return 0;
    };
    let mut now: Nanos = b.number() % (1 << 62);
    let mut state = State::fresh(&spec, now);
    let mut other = State::fresh(&spec, now);
    // Reported hits put a bucket in debt: beyond its capacity.
    let mut in_debt = false;
    let mut last_reset = 0;
    let mut steps = 0;
    while !b.is_empty() && steps < 64 {
        steps += 1;
        now = now.saturating_add(b.number() % (1 << 40));
        match b.u8() % 6 {
            0..=2 => {
                let req = Cost {
                    hits: b.number(),
                    drain_over_limit: b.u8() % 2 == 0,
                    nodelay: b.u8() % 2 == 0,
                };
                let d = state.decide(&spec, req, now);
                decision(&spec, req, &d, now, in_debt && algorithm.is_bucket());
                assert!(
                    d.reset_at >= last_reset,
                    "reset_at went back from {last_reset} to {} at {now} ({spec:?})",
                    d.reset_at
                );
                last_reset = d.reset_at;
            }
            3 => {
                let hits = b.number();
                in_debt |= hits > 0;
                state.absorb(&spec, hits, now.saturating_sub(b.number() % (1 << 30)));
            }
            4 => {
                let peer = Cost::hits(b.number());
                let _ = other.decide(&spec, peer, now);
                state.merge(&other, &spec);
            }
            _ => {
                let to = Spec::with_bounds(
                    Algorithm::ALL[usize::from(b.u8()) % Algorithm::ALL.len()],
                    b.number(),
                    Period::Duration(b.number()),
                    None,
                    &bounds,
                );
                if let Ok(to) = to {
                    let converted = state.convert(&spec, &to, now);
                    assert!(converted.remaining(&to, now) <= to.capacity());
                }
            }
        }
        assert!(state.remaining(&spec, now) <= spec.capacity());
        let _ = state.consumed(&spec, now);
        let _ = state.idle_after(&spec);
    }
    steps
}

/// The latest a key decided at `now` is back to fresh, when nothing beyond
/// what it admitted was reported to it: the end of the current window
/// (fixed window); the end of the next one (sliding counter: this window's
/// hits still weigh through the next); one duration after `now` (sliding
/// log: its newest entry is at most `now`); one full refill of the capacity
/// (buckets: `capacity × duration / limit`, which is the duration when
/// `burst = limit`; at once when the limit is 0).
fn reset_horizon(spec: &Spec, now: Nanos) -> Nanos {
    let d = spec.duration();
    match spec.algorithm() {
        Algorithm::FixedWindow => spec.window(now).1,
        Algorithm::SlidingWindowCounter => spec.window(now).0.saturating_add(d).saturating_add(d),
        Algorithm::SlidingWindowLog => now.saturating_add(d),
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
            let refill = match spec.limit() {
                0 => 0,
                l => (u128::from(spec.capacity()) * u128::from(d)).div_ceil(u128::from(l)),
            };
            now.saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
        }
    }
}

/// The invariants of one decision at `now` (see [`algorithm`]); `in_debt`:
/// reported consumption may have put the key past [`reset_horizon`].
fn decision(spec: &Spec, req: Cost, d: &Decision, now: Nanos, in_debt: bool) {
    if d.allowed() {
        assert!(
            req.hits <= spec.capacity(),
            "admitted {} hits above capacity {} ({spec:?})",
            req.hits,
            spec.capacity()
        );
    }
    assert!(d.remaining <= spec.capacity(), "{d:?} for {spec:?}");
    assert_eq!(d.limit, spec.limit());
    assert!(
        d.reset_at >= now,
        "reset_at {} before now {now}: {d:?} for {spec:?}",
        d.reset_at
    );
    if !in_debt {
        let horizon = reset_horizon(spec, now);
        assert!(
            d.reset_at <= horizon,
            "reset_at {} beyond {horizon} (now {now}): {d:?} for {spec:?}",
            d.reset_at
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Outcome;

    const MIN: Nanos = 60_000_000_000;

    fn spec(algorithm: Algorithm, limit: u64, burst: Option<u64>) -> Spec {
        Spec::new(algorithm, limit, Period::Duration(MIN), burst).unwrap()
    }

    fn admitted(remaining: u64, reset_at: Nanos) -> Decision {
        Decision {
            reason: Outcome::WithinLimit,
            limit: 10,
            remaining,
            reset_at,
            retry_after: None,
            delay: 0,
        }
    }

    /// A short fuzz run on stable, from a fixed seed (a failure reproduces):
    /// random bytes through the harnesses, so the invariants are exercised
    /// where `cargo fuzz` does not run — and a too-strict invariant (one the
    /// algorithms rightly break) shows here first.
    #[test]
    fn random_inputs_hold_every_invariant() {
        let mut rng = fastrand::Rng::with_seed(18);
        let mut steps = 0;
        for _ in 0..100_000 {
            let data: Vec<u8> = (0..rng.usize(0..200)).map(|_| rng.u8(..)).collect();
            steps += algorithm_steps(&data);
            check_request(&data);
        }
        assert!(
            steps > 100_000,
            "the run reached the arithmetic: {steps} steps"
        );
    }

    /// The horizon is one period as each algorithm counts it.
    #[test]
    fn the_reset_horizon_is_one_period() {
        let now = 1_700_000_000_000_000_000;
        let window = spec(Algorithm::FixedWindow, 10, None);
        assert_eq!(reset_horizon(&window, now), now - now % MIN + MIN);
        let counter = spec(Algorithm::SlidingWindowCounter, 10, None);
        assert_eq!(reset_horizon(&counter, now), now - now % MIN + 2 * MIN);
        let log = spec(Algorithm::SlidingWindowLog, 10, None);
        assert_eq!(reset_horizon(&log, now), now + MIN);
        let bucket = spec(Algorithm::Gcra, 10, None);
        assert_eq!(reset_horizon(&bucket, now), now + MIN);
        let burst = spec(Algorithm::TokenBucket, 10, Some(25));
        assert_eq!(reset_horizon(&burst, now), now + MIN * 5 / 2);
        let deny = spec(Algorithm::LeakyBucket, 0, Some(5));
        assert_eq!(reset_horizon(&deny, now), now);
    }

    /// Each invariant is asserted: a decision breaking one fails.
    #[test]
    fn a_broken_invariant_fails() {
        let s = spec(Algorithm::TokenBucket, 10, None);
        let now = 1_000 * MIN;
        let one = Cost::hits(1);
        decision(&s, one, &admitted(9, now + MIN), now, false);
        let broken = [
            ("admitted above capacity", Cost::hits(11), admitted(0, now)),
            ("remaining above capacity", one, admitted(11, now)),
            ("reset_at before now", one, admitted(9, now - 1)),
            ("reset_at beyond a period", one, admitted(9, now + MIN + 1)),
        ];
        for (what, req, d) in broken {
            let caught = std::panic::catch_unwind(|| decision(&s, req, &d, now, false));
            assert!(caught.is_err(), "{what} passed");
        }
        // In debt, a bucket may reset beyond one period — not before now.
        decision(&s, one, &admitted(0, now + 5 * MIN), now, true);
        let caught =
            std::panic::catch_unwind(|| decision(&s, one, &admitted(0, now - 1), now, true));
        assert!(caught.is_err());
    }
}
