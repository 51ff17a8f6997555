//! Fuzz harness bodies, shared by the `cargo fuzz` targets (`fuzz/`) and by
//! the regression test that replays every kept input on stable
//! (`tests/fuzz_regressions.rs`). Each takes arbitrary bytes, must never
//! panic, and asserts the invariants that hold whatever the input.

use prost::Message;

use crate::algorithm::{
    Algorithm, Bounds, CalendarUnit, Cost, Decision, Nanos, Period, Spec, State,
};
use crate::config::Limits;
use crate::policy::rules::Rules;
use crate::proto::v1 as pb;

/// Cost validation: any bytes a client could send as a `Check` call.
/// Decoding may fail; a decoded request validates to a check or to an error
/// naming a field — never a panic.
pub fn check_request(data: &[u8]) {
    let Ok(request) = pb::CheckRequest::decode(data) else {
        return;
    };
    let limits = Limits {
        max_key_bytes: 64,
        ..Limits::default()
    };
    for r in &request.requests {
        match crate::service::wire::check_from_wire(r, &limits) {
            Ok(check) => {
                assert!(check.name.len() <= 64 && check.unique_key.len() <= 64);
            }
            Err(e) => assert!(!e.field.is_empty(), "an error names its field"),
        }
    }
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
/// decisions, absorbed reports, merges and conversions at arbitrary times.
/// Invariants: no panic or overflow (the fuzz build checks overflow), an
/// admission never costs more than the capacity, `remaining` never exceeds
/// the capacity, time never makes a decision go backwards in `reset_at`
/// beyond `now + period`.
pub fn algorithm(data: &[u8]) {
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
        return;
    };
    let mut now: Nanos = b.number() % (1 << 62);
    let mut state = State::fresh(&spec, now);
    let mut other = State::fresh(&spec, now);
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
                check(&spec, req, &d);
            }
            3 => state.absorb(
                &spec,
                b.number(),
                now.saturating_sub(b.number() % (1 << 30)),
            ),
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
}

fn check(spec: &Spec, req: Cost, d: &Decision) {
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
}
