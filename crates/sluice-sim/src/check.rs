//! The checker: what every run must hold, per key, over the whole history.
//!
//! Keys never refill during a run, so every exact answer says how much of
//! the key's limit was spent, and the count only grows. The one documented
//! loss is a crash's replication lag: what the dead owner admitted before
//! its last changes reached a replica. A *death* is a crash, or a pause
//! (or sleep) long enough that the node gave its keys up
//! ([`pause_death`]) — its peers decide them from replicas meanwhile —
//! taken from what the run did, not from the schedule (a fault on a node
//! already down did nothing). What a death may lose of a key ([`lost`]):
//! the exact admissions that node answered as owner from [`LAG`] before
//! it, reaching back over anything that held its replication up (another
//! node paused or down, a gRPC cut of its own, a slow or lossy link), and
//! the key's calls meanwhile not answered exactly — failed, refused or
//! from a lease: a forward may have counted at the owner though its answer
//! was lost. A key with
//! synchronous replication loses no admission to a death (its owner
//! answered exactly only once the replica holder had the decision): only
//! its calls not answered exactly are allowed for. Every bound below allows exactly
//! that, each call counted once:
//!
//! 1. **No rollback.** An exact answer sent after another exact answer of
//!    the same key came back shows no more remaining than it, beyond what
//!    the deaths between the two may have lost (calls not answered exactly included:
//!    a lost one can move a later remaining up).
//! 2. **No over-admission by exact answers.** Exact admissions ≤ limit +
//!    the lost admissions; for `deny` keys, every admission counts (a
//!    `deny` key is never decided on a lease).
//! 3. **Nothing admitted is lost.** After traffic stopped, the key's final
//!    exact count covers every exact admission, less the lost ones.
//! 4. **Liveness.** After the last heal, every key answers exactly through
//!    every node within [`LIVENESS`], and no call fails from then on.
//!
//! A node cut off (gRPC) from half its peers or more counts as a death at
//! its fence ([`cut_off_fence`]): what it admitted as owner between the
//! cut and finding itself deaf was never replicated (docs/src/survives.md: the cut-off
//! lag). So does one whose gossip to every peer is lost: buried, its
//! keys taken over from replicas while it owns until it finds itself
//! unheard.
//!
//! With one replica, a key whose owner and replica holder crash together
//! has no surviving copy: it is decided in doubt for `in_doubt_grace`, then
//! from its best copy, the loss counted. The checker allows exactly that
//! ([`Faults::wipes`]): from the end of that grace the key's answers are
//! compared only with later ones — an exact answer that rolls back inside
//! the grace is still a violation. When every node is lost at once (no
//! process that may hold a copy runs), the nodes that start after are a
//! new cluster: every key starts over from that instant, with no grace.
//!
//! An operator's reset of a key (`ResetKey`) starts its count over at its
//! owner somewhere between the reset's sending and its answer — or, if it
//! failed, at any time after its sending until shortly after every fault
//! that could hold it up ended ([`reset_until`]), or never. Two answers are
//! compared only when no reset of the key may fall between them (each
//! wholly before it was sent or wholly after it took effect); each reset
//! lets the limit be admitted once more; and the final count covers the
//! exact admissions sent after the last reset was answered.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use sluice::cluster::ring::{Member, Ring};

use crate::faults::Faults;
pub use crate::faults::{JOIN, LAG, REJOIN, WIPE_WINDOW, cut_off_fence, first_ready, pause_death};

use crate::history::{Call, History, Reset};
use crate::schedule::Fault;
use crate::schedule::Schedule;
use crate::sim::Event;
use crate::workload::{KEYS, Key, LIVENESS, Unreachable, keys};

/// A broken invariant.
#[derive(Debug)]
pub struct Violation {
    pub key: Option<usize>,
    pub what: String,
}

/// Check `history` against the invariants, given what the run did to the
/// nodes (`events`); empty when the run passed.
pub fn check(s: &Schedule, history: &History, events: &[(u64, usize, Event)]) -> Vec<Violation> {
    let keys = keys(s.seed);
    let faults = Faults::of(s, events);
    let mut out = Vec::new();
    let mut by_key: Vec<Vec<&Call>> = vec![Vec::new(); KEYS];
    for c in &history.calls {
        by_key[c.key].push(c);
    }
    for (k, calls) in by_key.iter_mut().enumerate() {
        calls.sort_by_key(|c| (c.sent, c.done));
        let resets: Vec<&Reset> = history.resets.iter().filter(|r| r.key == k).collect();
        check_key(s, &faults, k, keys[k], calls, &resets, &mut out);
    }
    out
}

/// Simulated ms as ns.
pub(crate) fn ms(t: u64) -> u64 {
    t * 1_000_000
}

/// The ring the nodes `up` form (the product's own placement, zones
/// included).
pub(crate) fn ring_of(s: &Schedule, up: impl Iterator<Item = usize>) -> Ring {
    Ring::new(up.map(|n| Member {
        node_id: format!("n{n}").into(),
        generation: 1,
        zone: s.zones.get(n).map_or("", |z| z).into(),
        ..Member::default()
    }))
}

/// What one death may have lost of a key: the exact admissions its node
/// answered as owner since the lag began, and the key's calls answered
/// otherwise meanwhile — failed, refused or from a lease (they may have
/// counted at the owner — they can move a later answer's remaining up,
/// never the admitted count).
struct Lost {
    at: u64,
    /// From when other nodes may decide the key without what was lost.
    since: u64,
    admissions: Vec<usize>,
    failed: Vec<usize>,
    /// A lease's admissions whose reports the dead node may have taken
    /// within its lag.
    leased: Vec<usize>,
}

fn lost(faults: &Faults, calls: &[&Call], (node, at, since): (usize, u64, u64), key: Key) -> Lost {
    let from = faults.lag_start(node, at);
    let owner = format!("n{node}");
    let within = |c: &Call| c.done >= from && c.sent <= at;
    // Whether the dead node answered the key exactly as owner within its
    // lag (and took the reports waiting for it then).
    let answered_in_lag = calls
        .iter()
        .any(|c| within(c) && c.exact().is_some() && c.owner() == Some(owner.as_str()));
    // The key's last exact answer before the lag began.
    let pending = calls
        .iter()
        .filter(|c| c.exact().is_some() && c.done < from)
        .map(|c| c.done)
        .max()
        .unwrap_or(0);
    Lost {
        at,
        since,
        admissions: (0..calls.len())
            .filter(|&i| {
                let c = calls[i];
                // A synchronous key's exact answer waited for its replica:
                // no death loses it.
                !key.sync
                    && within(c)
                    && c.admitted()
                    && c.exact().is_some()
                    && c.owner() == Some(owner.as_str())
            })
            .collect(),
        // A failed call may have counted; so may one asked of another
        // node and not answered exactly: a forward whose answer was lost
        // (the owner's outbound cut) is answered from a lease or refused,
        // yet the owner applied it (seed 119 of `--mix any`). One the dead
        // node answered itself without its count did not reach its count.
        failed: (0..calls.len())
            .filter(|&i| {
                let c = calls[i];
                within(c) && c.hits > 0 && (c.failed() || (c.exact().is_none() && c.node != node))
            })
            .collect(),
        // And a lease's admissions since the key was last answered exactly
        // before the lag began, by any node (the dead one's own edge too),
        // where the dead node answered the key exactly as owner within the
        // lag: their reports wait while the owner is unreachable or the key
        // in doubt, and may all land there — acknowledged, queued for a
        // holder — before that answer (zones seed 26 of aad3f7a: thirteen
        // hits reported at a doubt's end, 148 ms before the owner's crash,
        // its holder paused). Each counts only against an earlier answer
        // sent after it (`check_key`).
        leased: if answered_in_lag {
            (0..calls.len())
                .filter(|&i| {
                    let c = calls[i];
                    c.admitted()
                        && c.exact().is_none()
                        && !c.failed()
                        && c.sent >= pending
                        && c.sent <= at
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// How long (ms) after its operator gave up a reset may still take
/// effect: the node's three tries at the owner, 500 ms each at least
/// (`Limiter::reset`), and a margin.
const RESET_LATE: u64 = 2_000;

/// Until when (ns) reset `r` may take effect: its answer; a failed one
/// [`RESET_LATE`] past its operator giving up — later for as long as any
/// node it may wait on is paused or asleep, or any link it may cross is
/// cut, slow or lossy (a request held there is applied when it gets
/// through), each such fault extending the window by its end.
pub(crate) fn reset_until(s: &Schedule, r: &Reset) -> u64 {
    if r.outcome.is_ok() {
        return r.done;
    }
    let mut until = r.done + ms(RESET_LATE);
    loop {
        let later = s
            .faults
            .iter()
            .filter(|f| {
                matches!(
                    f,
                    Fault::Pause { .. }
                        | Fault::Suspend { .. }
                        | Fault::Cut { .. }
                        | Fault::Slow { .. }
                        | Fault::Loss { .. }
                )
            })
            .filter(|f| ms(f.at()) <= until && ms(f.end()) >= r.sent)
            .map(|f| ms(f.end() + RESET_LATE))
            .fold(until, u64::max);
        if later == until {
            return until;
        }
        until = later;
    }
}

/// Whether no reset of `resets` — each with when it was sent and until
/// when it may take effect — may fall between calls `a` and `b` (both
/// wholly before its sending, or both sent after it may take effect).
fn same_side(resets: &[(u64, u64)], a: &Call, b: &Call) -> bool {
    resets.iter().all(|&(sent, until)| {
        let before = |c: &Call| c.done < sent;
        let after = |c: &Call| c.sent > until;
        (before(a) && before(b)) || (after(a) && after(b))
    })
}

fn check_key(
    s: &Schedule,
    faults: &Faults,
    k: usize,
    key: Key,
    calls: &[&Call],
    resets: &[&Reset],
    out: &mut Vec<Violation>,
) {
    let resets: Vec<(u64, u64)> = resets.iter().map(|r| (r.sent, reset_until(s, r))).collect();
    let losses: Vec<Lost> = faults
        .deaths
        .iter()
        .map(|&death| lost(faults, calls, death, key))
        .collect();
    let lost_admissions: BTreeSet<usize> = losses
        .iter()
        .flat_map(|l| l.admissions.iter().copied())
        .collect();
    let total_lag = lost_admissions.len() as u64;
    let limit = key.limit as i64;
    // Where the key's count may start over from a best copy (both its
    // holders crashed): answers are compared only within one stretch.
    let wipes = faults.wipes(s, k);
    let stretch = |t: u64| wipes.iter().filter(|&&w| w <= t).count();
    // 1. No rollback: for each later answer B, the earlier answers A
    // (done before B was sent), latest first, each allowed what the deaths
    // between them may have lost (counted once).
    let exact: Vec<(&Call, i64)> = calls
        .iter()
        .filter_map(|c| c.exact().map(|(r, _)| (*c, r)))
        .collect();
    'keys: for &(b, rb) in &exact {
        let mut earlier: Vec<(&Call, i64)> = exact
            .iter()
            .filter(|(a, _)| {
                a.done < b.sent && stretch(a.sent) == stretch(b.sent) && same_side(&resets, a, b)
            })
            .copied()
            .collect();
        earlier.sort_by_key(|(a, _)| std::cmp::Reverse(a.sent));
        let mut between: Vec<&Lost> = losses.iter().filter(|l| l.since <= b.sent).collect();
        between.sort_by_key(|l| std::cmp::Reverse(l.at));
        let mut counted = BTreeSet::new();
        let mut next = 0;
        for (a, ra) in earlier {
            while next < between.len() && between[next].at >= a.sent {
                counted.extend(between[next].admissions.iter().copied());
                counted.extend(between[next].failed.iter().copied());
                next += 1;
            }
            // A lease's admissions count against `a` only if made before
            // it was: `a`'s count may have held their reports.
            let leased: BTreeSet<usize> = between[..next]
                .iter()
                .flat_map(|l| l.leased.iter().copied())
                .filter(|&i| calls[i].sent < a.done && !counted.contains(&i))
                .collect();
            let allowed = ra + (counted.len() + leased.len()) as i64;
            if rb > allowed {
                out.push(Violation {
                    key: Some(k),
                    what: format!(
                        "rollback: an exact answer showed remaining {rb} after one that showed {ra} (allowed {allowed} with the crash lag)\n  earlier: {a}\n  later:   {b}\n{}",
                        around(calls, a.sent, b.done)
                    ),
                });
                break 'keys;
            }
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
    // Each wipe, and each reset, may let the limit be admitted once more.
    let wiped = (wipes.len() + resets.len()) as i64;
    if counted > limit * (1 + wiped) + total_lag as i64 {
        out.push(Violation {
            key: Some(k),
            what: format!(
                "over-admission: {counted} admitted ({exact_admitted} exact) of a limit of {limit} ({:?}{}; crash lag {total_lag})",
                key.unreachable,
                if key.sync { ", sync" } else { "" }
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
            // What the last stretch admitted exactly (all, with no wipe
            // and no reset).
            let last = wipes
                .iter()
                .copied()
                .chain(resets.iter().map(|&(_, until)| until))
                .max()
                .unwrap_or(0);
            let exact_admitted = calls
                .iter()
                .filter(|c| c.sent >= last && c.admitted() && c.exact().is_some())
                .count() as i64;
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
#[path = "check_tests.rs"]
pub(crate) mod tests;
