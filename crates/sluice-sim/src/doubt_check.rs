//! No needless doubt: a key one of whose holders of record lives is
//! answered exactly again soon after the others are lost.
//!
//! The in-doubt rule trades availability for exactness only when a key
//! may have lost every copy (its owner and its replica holder together);
//! then it is decided in doubt — never exactly — for `in_doubt_grace`
//! (10 s). A key put in doubt when a holder of record survived is a bug of
//! its own, invisible to the other checks (its answers are approximate or
//! refused, never wrong): a real-process test found one (a zone's loss put
//! keys whose replica holder lived in doubt, stop 60) that this checker
//! did not.
//!
//! The check, for a *loss*: one crash or leave, or several at one instant
//! (a zone), with nothing else going on — no other fault, start or rejoin
//! in the [`SETTLED`] before it or during it, a majority left. Per key
//! whose owner or replica holder (in the ring of every node: all were up)
//! is not among the lost: every call of the key asked of a surviving node
//! (started by then: a node that starts late fails calls before)
//! and sent from [`SOON`] after the loss until the window ends (the next
//! fault, a lost node's restart, or the grace) is answered exactly.

use crate::check::{Violation, ms, ring_of};
use crate::history::{Call, History};
use crate::schedule::{Fault, Schedule};
use crate::sim::Event;
use crate::workload::{DEADLINE, KEYS};

/// How long (ms) after a loss a key with a surviving holder of record may
/// be answered otherwise than exactly: failure detection (~0.8 s), a
/// majority's burial (out of the rings 1–1.6 s at the defaults) and a
/// round of the new owner's transfer, with room to spare — well short of
/// the grace a key in doubt waits (10 s).
pub const SOON: u64 = 3_000;

/// How long (ms) the cluster must have stood still before a loss, and
/// after any other fault, for the loss to be checked: a restarted node
/// rejoins and takes its keys and replicas in up to [`crate::check::REJOIN`]
/// (6 s), and every owner has told its holders it caught up.
pub const SETTLED: u64 = 6_000;

/// The losses checked, and the violations found.
pub struct Doubts {
    /// (loss, key) pairs that had a surviving holder of record and calls
    /// to check: how much the check covered (it is vacuous at 0).
    pub checked: usize,
    pub violations: Vec<Violation>,
}

pub fn check(s: &Schedule, history: &History, events: &[(u64, usize, Event)]) -> Doubts {
    let mut out = Doubts {
        checked: 0,
        violations: Vec::new(),
    };
    let grace = sluice::config::ClusterConfig::default()
        .in_doubt_grace
        .as_millis() as u64;
    let mut losses: Vec<u64> = s
        .faults
        .iter()
        .filter(|f| lost_node(f).is_some())
        .map(Fault::at)
        .collect();
    losses.sort_unstable();
    losses.dedup();
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|k| sluice::store::key::encode("sim", &format!("k{k}")))
        .collect();
    for at in losses {
        let lost: Vec<&Fault> = s
            .faults
            .iter()
            .filter(|f| f.at() == at && lost_node(f).is_some())
            .collect();
        let gone: Vec<usize> = lost.iter().filter_map(|f| lost_node(f)).collect();
        // A majority of the nodes started by then (a late one counts from
        // its start: seed 269 of `--mix any` at 862e074, a lone survivor
        // of two in the minority, not in doubt).
        let started = (0..s.nodes).filter(|&n| s.start_of(n) <= at).count();
        if gone.len() * 2 >= started {
            continue;
        }
        // The window: until a lost node is back, the next fault, or the
        // grace — no other fault or start may overlap it or end within
        // `SETTLED` before it.
        let mut until = at + grace;
        until = lost.iter().map(|f| f.end()).fold(until, u64::min);
        let mut quiet = true;
        let others = s.faults.iter().filter(|f| !lost.contains(f));
        let starts = s.late.iter().map(|&(_, t)| (t, t));
        for (from, to) in others.map(|f| (f.at(), f.end())).chain(starts) {
            if from >= at {
                until = until.min(from);
            } else if to + SETTLED > at {
                quiet = false;
            }
        }
        let rejoined = events
            .iter()
            .any(|&(t, _, e)| e == Event::Rejoined && t + ms(SETTLED) > ms(at) && t < ms(until));
        let sources_lost =
            sources_lost_until(s, events, grace).any(|(from, to)| from < at && at < to);
        if !quiet || rejoined || sources_lost || until < at + SOON + 500 {
            continue;
        }
        let ring = ring_of(s, (0..s.nodes).filter(|&n| s.start_of(n) <= at));
        for (k, key) in keys.iter().enumerate() {
            let holders = [ring.owner(key), ring.successor(key)];
            let survives = holders
                .iter()
                .flatten()
                .any(|m| !gone.iter().any(|&g| *m.node_id == *format!("n{g}")));
            if !survives {
                continue;
            }
            let asked: Vec<&Call> = history
                .calls
                .iter()
                .filter(|c| {
                    c.key == k
                        && !gone.contains(&c.node)
                        && c.sent >= ms(s.start_of(c.node))
                        && c.sent >= ms(at + SOON)
                        && c.sent + DEADLINE.as_nanos() as u64 <= ms(until)
                })
                .collect();
            if asked.is_empty() {
                continue;
            }
            out.checked += 1;
            if let Some(c) = asked.iter().find(|c| c.exact().is_none()) {
                let holders: Vec<&str> = holders.iter().flatten().map(|m| &*m.node_id).collect();
                out.violations.push(Violation {
                    key: Some(k),
                    what: format!(
                        "needless doubt: {lost:?} at {at} ms left holder of record {holders:?} alive, yet {} ms later a call was not answered exactly:\n  {c}",
                        c.sent / 1_000_000 - at
                    ),
                });
            }
        }
    }
    out
}

/// When (ms, from–to) a crash may have left keys in doubt on the
/// survivors by the product's lost-source rule (`survives.md`): a node a
/// transfer still waited for, lost before it said `done`, puts in doubt
/// for the grace the keys the waiting node did not hold current that the
/// lost one may have held — its owner or replica holder, the waiting
/// node aside — even where a holder of record lives (which `done` came
/// from a holder that was current, no transfer says). A transfer waits
/// on a ring change: another node's start, crash, pause, leave or rejoin
/// up to [`crate::check::REJOIN`] before the crash. The region opens at
/// the crashed node's burial (within [`crate::check::WIPE_WINDOW`]) and
/// lasts the grace (seed 765 of `--mix any` at aad3f7a: n0 back from a
/// pause as a new member, n3 killed 370 ms later while n0's transfer
/// waited for it; n0 kept two keys whose owner n5 lived in doubt to
/// 23.7 s, past a leave at 20.4 s the check then read as a settled
/// cluster's).
fn sources_lost_until<'a>(
    s: &'a Schedule,
    events: &'a [(u64, usize, Event)],
    grace: u64,
) -> impl Iterator<Item = (u64, u64)> + 'a {
    use crate::check::{REJOIN, WIPE_WINDOW};
    s.faults.iter().filter_map(move |f| {
        let Fault::Crash { node, at, .. } = *f else {
            return None;
        };
        let recent = |t: u64| t < at && t + REJOIN >= at;
        let changed = s
            .faults
            .iter()
            .any(|g| lost_or_away(g).is_some_and(|n| n != node) && recent(g.at()))
            || s.late.iter().any(|&(n, t)| n != node && recent(t))
            || events.iter().any(|&(t, n, e)| {
                n != node && matches!(e, Event::Rejoined | Event::Started) && recent(t / 1_000_000)
            });
        changed.then_some((at, at + WIPE_WINDOW + grace))
    })
}

/// The node a crash, leave or pause takes out of the ring (a pause
/// past failure detection).
fn lost_or_away(f: &Fault) -> Option<usize> {
    match *f {
        Fault::Pause { node, .. } | Fault::Suspend { node, .. } => Some(node),
        _ => lost_node(f),
    }
}

/// The node a crash or a leave takes away.
fn lost_node(f: &Fault) -> Option<usize> {
    match *f {
        Fault::Crash { node, .. } | Fault::Leave { node, .. } => Some(node),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::schedule;
    use crate::history::{Outcome, Status};

    /// A call of key `k` through node 1, sent at `sent_ms`.
    fn call(k: usize, sent_ms: u64, approximate: bool) -> Call {
        Call {
            key: k,
            node: 1,
            hits: 1,
            sent: ms(sent_ms),
            done: ms(sent_ms) + 4_000_000,
            outcome: Outcome::Answer {
                status: Status::Under,
                reason: 1,
                remaining: 5,
                approximate,
                owner: "n1".into(),
                path: 1,
            },
        }
    }

    /// A key whose owner is `owner` and replica holder `holder` in the
    /// ring of three.
    fn key_held(s: &Schedule, owner: usize, holder: usize) -> usize {
        // The ring at the losses below (10 s).
        let ring = ring_of(s, (0..s.nodes).filter(|&n| s.start_of(n) <= 10_000));
        (0..KEYS)
            .find(|&k| {
                let key = sluice::store::key::encode("sim", &format!("k{k}"));
                let is = |m: Option<&sluice::cluster::ring::Member>, n: usize| {
                    m.is_some_and(|m| *m.node_id == *format!("n{n}"))
                };
                is(ring.owner(&key), owner) && is(ring.successor(&key), holder)
            })
            .expect("24 keys over three nodes: every pair holds one")
    }

    fn crash(node: usize, at: u64) -> Fault {
        Fault::Crash {
            node,
            at,
            down: 20_000,
        }
    }

    fn violations(s: &Schedule, calls: Vec<Call>) -> Doubts {
        check(
            s,
            &History {
                calls,
                resets: Vec::new(),
            },
            &[],
        )
    }

    #[test]
    fn a_key_whose_holder_lives_is_exact_soon_after_its_owner_is_lost() {
        let s = schedule(vec![crash(0, 10_000)]);
        let k = key_held(&s, 0, 2);
        // Approximate while its owner is suspected and buried: allowed.
        let early = vec![call(k, 10_500, true), call(k, 12_000, false)];
        let d = violations(&s, [early.clone(), vec![call(k, 14_000, false)]].concat());
        assert_eq!((d.checked, d.violations.len()), (1, 0));
        // Still approximate after `SOON`: in doubt needlessly.
        let d = violations(&s, [early, vec![call(k, 14_000, true)]].concat());
        assert_eq!((d.checked, d.violations.len()), (1, 1));
        assert!(d.violations[0].what.starts_with("needless doubt"));
        // A call that fails is no exact answer either.
        let mut failed = call(k, 15_000, false);
        failed.outcome = Outcome::Failed("deadline".into());
        assert_eq!(violations(&s, vec![failed]).violations.len(), 1);
    }

    #[test]
    fn a_key_that_lost_both_holders_or_a_loss_beside_other_faults_is_not_checked() {
        // Owner and holder lost together: in doubt by rule.
        let s = schedule(vec![crash(0, 10_000), crash(2, 10_000)]);
        let k = key_held(&schedule(Vec::new()), 0, 2);
        let d = violations(&s, vec![call(k, 14_000, true)]);
        // Two of three lost: no majority, nothing checked at all.
        assert_eq!((d.checked, d.violations.len()), (0, 0));
        // Another fault in the settling time before the loss.
        let pause = Fault::Pause {
            node: 1,
            at: 6_000,
            span: 1_000,
        };
        let s = schedule(vec![pause, crash(0, 10_000)]);
        let d = violations(&s, vec![call(k, 14_000, true)]);
        assert_eq!((d.checked, d.violations.len()), (0, 0));
        // The lost node back before `SOON` leaves no window.
        let s = schedule(vec![Fault::Crash {
            node: 0,
            at: 10_000,
            down: 2_000,
        }]);
        let d = violations(&s, vec![call(k, 14_000, true)]);
        assert_eq!((d.checked, d.violations.len()), (0, 0));
        // A node that starts late fails calls before it starts.
        let mut late = schedule(vec![crash(0, 10_000)]);
        late.nodes = 4;
        late.late = vec![(3, 17_000)];
        let k_late = key_held(&late, 0, 2);
        let mut early_call = call(k_late, 14_000, true);
        early_call.node = 3;
        let d = violations(&late, vec![early_call, call(k_late, 14_000, false)]);
        assert_eq!((d.checked, d.violations.len()), (1, 0));
        // A call through the lost node itself is not the survivors'.
        let s = schedule(vec![crash(0, 10_000)]);
        let mut through_lost = call(k, 14_000, true);
        through_lost.node = 0;
        let d = violations(&s, vec![through_lost]);
        assert_eq!((d.checked, d.violations.len()), (0, 0));
    }

    #[test]
    fn a_loss_within_a_lost_sources_grace_is_not_checked_and_one_past_it_is() {
        let k = key_held(&schedule(Vec::new()), 0, 2);
        let restart = Fault::Crash {
            node: 1,
            at: 10_000,
            down: 500,
        };
        // n1 killed with no ring change before it: no transfer waited for
        // it, no region; n0's loss 7 s later is checked.
        let s = schedule(vec![restart.clone(), crash(0, 17_000)]);
        let d = violations(&s, vec![call(k, 21_000, true)]);
        assert_eq!((d.checked, d.violations.len()), (1, 1));
        // n2 paused (a ring change) 2 s before n1 is killed: the
        // transfers of that change may wait for n1, and its loss may keep
        // keys in doubt for the grace — n0's loss within it is not read
        // as a settled cluster's.
        let pause = Fault::Pause {
            node: 2,
            at: 8_000,
            span: 1_000,
        };
        let s = schedule(vec![pause.clone(), restart.clone(), crash(0, 17_000)]);
        let d = violations(&s, vec![call(k, 21_000, true)]);
        assert_eq!((d.checked, d.violations.len()), (0, 0));
        // A loss past that grace (and its burial) is checked again.
        let s = schedule(vec![pause, restart, crash(0, 23_000)]);
        let d = violations(&s, vec![call(k, 27_000, true)]);
        assert_eq!((d.checked, d.violations.len()), (1, 1));
    }

    #[test]
    fn a_whole_zone_lost_checks_every_key_with_a_holder_elsewhere() {
        let mut s = schedule(vec![crash(0, 10_000), crash(3, 10_000)]);
        s.nodes = 6;
        s.zones = (0..6).map(|n| format!("z{}", n % 3)).collect();
        let calls: Vec<Call> = (0..KEYS).map(|k| call(k, 14_000, false)).collect();
        let d = violations(&s, calls);
        // Zones place a key's two copies in two zones: every key keeps one.
        assert_eq!((d.checked, d.violations.len()), (KEYS, 0));
    }
}
