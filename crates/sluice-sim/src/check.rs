//! The checker: what every run must hold, per key, over the whole history.
//!
//! Keys never refill during a run, so every exact answer says how much of
//! the key's limit was spent, and the count only grows. The one documented
//! loss is a crash's replication lag: what the dead owner admitted before
//! its last changes reached a replica (a pause past `away_after` counts as
//! a death: peers decide the node's keys from replicas meanwhile). [`lag`] bounds it per crash and key
//! — the admissions that owner answered, and the calls that failed (they
//! may have counted), from `LAG` before the crash, reaching back over any
//! fault that could hold its replication up (a peer paused or down, its
//! links cut, slowed or lossy) — and every bound below allows exactly
//! that much, no more:
//!
//! 1. **No rollback.** An exact answer sent after another exact answer of
//!    the same key came back shows no more remaining than it, beyond the
//!    lag of crashes between the two.
//! 2. **No over-admission by exact answers.** Exact admissions ≤ limit +
//!    the key's lag; for `deny` keys, every admission counts (a `deny` key
//!    is never decided on a lease).
//! 3. **Nothing admitted is lost.** After traffic stopped, the key's final
//!    exact count covers every exact admission, less the lag.
//! 4. **Liveness.** After the last heal, every key answers exactly through
//!    every node within [`LIVENESS`], and no call fails from then on.

use std::fmt::Write as _;

use crate::history::{Call, History};
use crate::schedule::{Fault, Proto, Schedule};
use crate::workload::{KEYS, Key, LIVENESS, Unreachable, keys};

/// An owner replicates a change within this long (ms), with no fault in
/// the way: as soon as a change waits, then every `replicate_interval`
/// (20 ms) while changes come — plus the simulated network.
pub const LAG: u64 = 100;

/// A broken invariant.
#[derive(Debug)]
pub struct Violation {
    pub key: Option<usize>,
    pub what: String,
}

/// Check `history` against the invariants; empty when the run passed.
pub fn check(s: &Schedule, history: &History) -> Vec<Violation> {
    let keys = keys(s.seed);
    let mut out = Vec::new();
    let mut by_key: Vec<Vec<&Call>> = vec![Vec::new(); KEYS];
    for c in &history.calls {
        by_key[c.key].push(c);
    }
    for (k, calls) in by_key.iter_mut().enumerate() {
        calls.sort_by_key(|c| (c.sent, c.done));
        check_key(s, k, keys[k], calls, &mut out);
    }
    out
}

fn ms(t: u64) -> u64 {
    t * 1_000_000
}

/// A pause at least this long (ms) makes a node give up its keys:
/// `away_after` at the defaults (gossip every 200 ms, φ 10). Its peers
/// declare it dead a little later and decide its keys from replicas.
pub const AWAY: u64 = 400;

/// The deaths of a run, (node, at ns): crashes, and pauses long enough
/// that the node gave up its keys — to its peers the same as a crash, so
/// they lose the same lag.
fn crashes(s: &Schedule) -> Vec<(usize, u64)> {
    s.faults
        .iter()
        .filter_map(|f| match f {
            Fault::Crash { node, at, .. } => Some((*node, ms(*at))),
            Fault::Pause { node, at, span } if *span >= AWAY => Some((*node, ms(*at))),
            _ => None,
        })
        .collect()
}

/// Whether fault `f` could hold up `node`'s replication.
fn holds_up(f: &Fault, node: usize) -> bool {
    match f {
        Fault::Pause { node: n, .. } | Fault::Crash { node: n, .. } => *n != node,
        Fault::Leave { .. } | Fault::ClockStep { .. } => false,
        Fault::Cut {
            from, to, proto, ..
        } => (*from == node || *to == node) && *proto != Proto::Udp,
        Fault::Slow { .. } | Fault::Loss { .. } => true,
    }
}

/// From when a crash of `node` at `at` may lose admissions (ns).
fn lag_start(s: &Schedule, node: usize, at: u64) -> u64 {
    let mut from = at.saturating_sub(ms(LAG));
    loop {
        let earlier = s
            .faults
            .iter()
            .filter(|f| holds_up(f, node) && ms(f.at()) < at && ms(f.end()) + ms(LAG) >= from)
            .map(|f| ms(f.at()).saturating_sub(ms(LAG)))
            .min()
            .unwrap_or(from)
            .min(from);
        if earlier == from {
            return from;
        }
        from = earlier;
    }
}

/// What a crash of `node` at `at` may lose of one key: its exact
/// admissions answered as owner since the lag began, and the key's failed
/// calls meanwhile (they may have counted).
fn lag(s: &Schedule, calls: &[&Call], node: usize, at: u64) -> u64 {
    let from = lag_start(s, node, at);
    let owner = format!("n{node}");
    calls
        .iter()
        .filter(|c| c.done >= from && c.sent <= at)
        .filter(|c| {
            (c.admitted() && c.exact().is_some() && c.owner() == Some(owner.as_str()))
                || (c.failed() && c.hits > 0)
        })
        .count() as u64
}

fn check_key(s: &Schedule, k: usize, key: Key, calls: &[&Call], out: &mut Vec<Violation>) {
    let crashes = crashes(s);
    let lags: Vec<(u64, u64)> = crashes
        .iter()
        .map(|&(n, at)| (at, lag(s, calls, n, at)))
        .collect();
    let lag_between = |from: u64, to: u64| -> u64 {
        lags.iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, l)| l)
            .sum()
    };
    let total_lag: u64 = lags.iter().map(|(_, l)| l).sum();
    let limit = key.limit as i64;
    // 1. No rollback.
    let exact: Vec<(&Call, i64)> = calls
        .iter()
        .filter_map(|c| c.exact().map(|(r, _)| (*c, r)))
        .collect();
    for (i, &(b, rb)) in exact.iter().enumerate() {
        let worst = exact[..i]
            .iter()
            .filter(|(a, _)| a.done < b.sent)
            .map(|&(a, ra)| (a, ra, ra + lag_between(a.sent, b.sent) as i64))
            .min_by_key(|&(_, _, allowed)| allowed);
        if let Some((a, ra, allowed)) = worst
            && rb > allowed
        {
            out.push(Violation {
                key: Some(k),
                what: format!(
                    "rollback: an exact answer showed remaining {rb} after one that showed {ra} (allowed {allowed} with the crash lag)\n  earlier: {a}\n  later:   {b}\n{}",
                    around(calls, a.sent, b.done)
                ),
            });
            break;
        }
    }
    // 2. Over-admission.
    let exact_admitted = calls
        .iter()
        .filter(|c| c.admitted() && c.exact().is_some())
        .count() as i64;
    let admitted = calls.iter().filter(|c| c.admitted()).count() as i64;
    let counted = if key.unreachable == Unreachable::Deny {
        admitted
    } else {
        exact_admitted
    };
    if counted > limit + total_lag as i64 {
        out.push(Violation {
            key: Some(k),
            what: format!(
                "over-admission: {counted} admitted ({exact_admitted} exact) of a limit of {limit} ({:?}; crash lag {total_lag})",
                key.unreachable
            ),
        });
    }
    // 3. Nothing admitted is lost.
    let finals: Vec<&&Call> = calls
        .iter()
        .filter(|c| c.hits == 0 && c.sent >= ms(s.end + 1_000) && c.exact().is_some())
        .collect();
    match finals.last().and_then(|c| c.exact()) {
        None => out.push(Violation {
            key: Some(k),
            what: "no exact final count after traffic stopped".into(),
        }),
        Some((remaining, _)) => {
            let consumed = limit - remaining;
            let owed = exact_admitted.min(limit) - total_lag as i64;
            if consumed < owed {
                out.push(Violation {
                    key: Some(k),
                    what: format!(
                        "lost admissions: the final count shows {consumed} spent, but {exact_admitted} exact admissions were answered (limit {limit}, crash lag {total_lag})\n{}",
                        tail(calls, 40)
                    ),
                });
            }
        }
    }
    // 4. Liveness.
    let window = ms(s.heal)..=ms(s.heal + LIVENESS);
    for node in 0..s.nodes {
        let live = calls.iter().any(|c| {
            c.node == node && c.hits == 0 && window.contains(&c.sent) && c.exact().is_some()
        });
        if !live {
            let tried: Vec<String> = calls
                .iter()
                .filter(|c| c.node == node && c.hits == 0 && window.contains(&c.sent))
                .rev()
                .take(3)
                .map(|c| format!("  {c}"))
                .collect();
            out.push(Violation {
                key: Some(k),
                what: format!(
                    "liveness: no exact answer through n{node} within {LIVENESS} ms of the last heal; last tries:\n{}",
                    tried.join("\n")
                ),
            });
        }
    }
    if let Some(c) = calls
        .iter()
        .find(|c| c.failed() && c.sent >= ms(s.heal + LIVENESS))
    {
        out.push(Violation {
            key: Some(k),
            what: format!("a call failed after the cluster healed: {c}"),
        });
    }
}

/// The key's calls from `from` to `to` (ns), for a report: the last 40
/// (the first ones are the earlier answer's, and the later answer's are
/// what explains it).
fn around(calls: &[&Call], from: u64, to: u64) -> String {
    let between: Vec<_> = calls
        .iter()
        .filter(|c| c.done >= from && c.sent <= to)
        .collect();
    let skip = between.len().saturating_sub(40);
    let mut s = format!("  the key's calls between them ({skip} earlier not shown):\n");
    for c in &between[skip..] {
        let _ = writeln!(s, "    {c}");
    }
    s
}

fn tail(calls: &[&Call], n: usize) -> String {
    let mut s = String::from("  the key's last calls:\n");
    for c in calls
        .iter()
        .rev()
        .take(n)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        let _ = writeln!(s, "    {c}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Outcome, Status};

    fn schedule(faults: Vec<Fault>) -> Schedule {
        Schedule {
            seed: 1,
            nodes: 3,
            late: Vec::new(),
            skew: Vec::new(),
            faults,
            heal: 38_000,
            end: 50_000,
        }
    }

    fn answer(key: usize, sent_ms: u64, hits: u64, remaining: i64, owner: &str) -> Call {
        Call {
            key,
            node: 0,
            hits,
            sent: ms(sent_ms),
            done: ms(sent_ms) + 4_000_000,
            outcome: Outcome::Answer {
                status: if hits > 0 {
                    Status::Under
                } else {
                    Status::Over
                },
                reason: 1,
                remaining,
                approximate: false,
                owner: owner.into(),
                path: 1,
            },
        }
    }

    /// Key 0's violations, by their first words.
    fn kinds(s: &Schedule, calls: Vec<Call>) -> Vec<String> {
        let limit = keys(s.seed)[0].limit as i64;
        let mut calls = calls;
        // Make the history otherwise whole: liveness probes through every
        // node and a final count matching what was admitted.
        let admitted = calls.iter().filter(|c| c.hits > 0).count() as i64;
        for n in 0..s.nodes {
            let mut c = answer(0, s.heal + 2_000, 0, limit - admitted, "n1");
            c.node = n;
            calls.push(c);
        }
        calls.push(answer(0, s.end + 2_000, 0, limit - admitted, "n1"));
        let history = History { calls };
        check(s, &history)
            .into_iter()
            .filter(|v| v.key == Some(0))
            .map(|v| v.what.split(':').next().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn a_monotone_history_passes() {
        let s = schedule(Vec::new());
        let limit = keys(1)[0].limit as i64;
        let calls = (0..5)
            .map(|i| answer(0, 10_000 + i * 100, 1, limit - 1 - i as i64, "n1"))
            .collect();
        assert_eq!(kinds(&s, calls), Vec::<String>::new());
    }

    #[test]
    fn a_rollback_is_caught_unless_a_crash_lag_covers_it() {
        let limit = keys(1)[0].limit as i64;
        // Two admissions by n1, then an answer from n2 as if neither
        // had happened.
        let calls = vec![
            answer(0, 10_000, 1, limit - 1, "n1"),
            answer(0, 10_050, 1, limit - 2, "n1"),
            answer(0, 12_000, 1, limit - 1, "n2"),
        ];
        let found = kinds(&schedule(Vec::new()), calls.clone());
        assert!(found.contains(&"rollback".to_string()), "{found:?}");
        // n1 killed right after its admissions: the lag covers them.
        let crashed = schedule(vec![Fault::Crash {
            node: 1,
            at: 10_060,
            down: 1_000,
        }]);
        assert!(!kinds(&crashed, calls).contains(&"rollback".to_string()));
    }

    #[test]
    fn over_admission_and_lost_admissions_are_caught() {
        let limit = keys(1)[0].limit as i64;
        let over: Vec<Call> = (0..=limit as u64)
            .map(|i| answer(0, 10_000 + i, 1, 0, "n1"))
            .collect();
        assert!(kinds(&schedule(Vec::new()), over).contains(&"over-admission".to_string()));
        // Three admissions answered, the final count shows one.
        let s = schedule(Vec::new());
        let mut calls: Vec<Call> = (0..3)
            .map(|i| answer(0, 10_000 + i * 10, 1, limit - 1 - i as i64, "n1"))
            .collect();
        for n in 0..s.nodes {
            let mut c = answer(0, s.heal + 2_000, 0, limit - 3, "n1");
            c.node = n;
            calls.push(c);
        }
        calls.push(answer(0, s.end + 2_000, 0, limit - 1, "n1"));
        let lost = check(&s, &History { calls });
        assert!(
            lost.iter()
                .any(|v| v.key == Some(0) && v.what.starts_with("lost admissions")),
            "{lost:?}"
        );
    }

    #[test]
    fn a_key_that_never_answers_exactly_after_the_heal_fails_liveness() {
        let s = schedule(Vec::new());
        let history = History::default();
        let found = check(&s, &history);
        assert!(
            found
                .iter()
                .any(|v| v.key == Some(3) && v.what.starts_with("liveness")),
            "{found:?}"
        );
    }
}
