//! The checker's unit tests: each invariant caught on a history made by
//! hand, and each allowance (a crash's lag, a cut-off node's, a wipe)
//! given exactly where the cluster may lose what it allows.

use super::*;
use crate::history::{Outcome, Reset, Status};
use crate::schedule::{Fault, Proto};

/// Three nodes, the faults given, healed at 38 s, traffic to 50 s.
pub(crate) fn schedule(faults: Vec<Fault>) -> Schedule {
    Schedule {
        seed: 1,
        nodes: 3,
        late: Vec::new(),
        skew: Vec::new(),
        zones: Vec::new(),
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

/// The events a schedule's crashes make (every node up before).
fn events(s: &Schedule) -> Vec<(u64, usize, Event)> {
    s.faults
        .iter()
        .filter_map(|f| match f {
            Fault::Crash { node, at, .. } => Some((ms(*at), *node, Event::Crashed)),
            _ => None,
        })
        .collect()
}

/// Key 0's violations, by their first words.
fn kinds(s: &Schedule, calls: Vec<Call>) -> Vec<String> {
    kinds_of(s, 0, calls)
}

/// Key `k`'s violations, by their first words.
fn kinds_of(s: &Schedule, k: usize, calls: Vec<Call>) -> Vec<String> {
    kinds_after(s, k, calls, &events(s))
}

/// [`kinds_of`], given what the run did to the nodes.
fn kinds_after(
    s: &Schedule,
    k: usize,
    calls: Vec<Call>,
    events: &[(u64, usize, Event)],
) -> Vec<String> {
    let admitted = calls.iter().filter(|c| c.hits > 0).count() as i64;
    verdict(s, k, calls, Vec::new(), events, admitted)
}

/// Key `k`'s violations, by their first words, its history made
/// otherwise whole: liveness probes through every node and a final count,
/// both showing `spent`.
fn verdict(
    s: &Schedule,
    k: usize,
    mut calls: Vec<Call>,
    resets: Vec<Reset>,
    events: &[(u64, usize, Event)],
    spent: i64,
) -> Vec<String> {
    let limit = keys(s.seed)[k].limit as i64;
    for n in 0..s.nodes {
        let mut c = answer(k, s.heal + 2_000, 0, limit - spent, "n1");
        c.node = n;
        calls.push(c);
    }
    calls.push(answer(k, s.end + 2_000, 0, limit - spent, "n1"));
    check(s, &History { calls, resets }, events)
        .into_iter()
        .filter(|v| v.key == Some(k))
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
    // Key 3: `deny`, asynchronous replication.
    let k = 3;
    assert!(!keys(1)[k].sync);
    let limit = keys(1)[k].limit as i64;
    // Two admissions by n1, then an answer from n2 as if neither
    // had happened.
    let calls = vec![
        answer(k, 10_000, 1, limit - 1, "n1"),
        answer(k, 10_050, 1, limit - 2, "n1"),
        answer(k, 12_000, 1, limit - 1, "n2"),
    ];
    let found = kinds_of(&schedule(Vec::new()), k, calls.clone());
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
    // n1 killed right after its admissions: the lag covers them.
    let crashed = schedule(vec![Fault::Crash {
        node: 1,
        at: 10_060,
        down: 1_000,
    }]);
    assert!(!kinds_of(&crashed, k, calls).contains(&"rollback".to_string()));
}

/// A lease's admissions made while the owner could not take their
/// reports land there all at once later, and a crash in the lag after
/// loses them (zones seed 26 of aad3f7a) — but not those answered
/// exactly before the lease began.
#[test]
fn a_crash_may_lose_the_lease_reports_it_took_in_its_lag() {
    let k = 3;
    let limit = keys(1)[k].limit as i64;
    let leased = |sent_ms: u64| {
        let mut c = answer(k, sent_ms, 1, 0, "n2");
        if let Outcome::Answer { approximate, .. } = &mut c.outcome {
            *approximate = true;
        }
        c.node = 2;
        c
    };
    // n1 answers exactly; the key then goes on leases for 5 s; n1 answers
    // exactly again (it took the three leased hits), and is killed; n2
    // answers as if neither those hits nor n1's last admission counted.
    let calls = vec![
        answer(k, 10_000, 1, limit - 1, "n1"),
        leased(11_000),
        leased(12_000),
        leased(13_000),
        answer(k, 15_900, 1, limit - 5, "n1"),
        answer(k, 17_000, 1, limit - 1, "n2"),
    ];
    let crashed = schedule(vec![Fault::Crash {
        node: 1,
        at: 15_950,
        down: 1_000,
    }]);
    assert!(!kinds_of(&crashed, k, calls.clone()).contains(&"rollback".to_string()));
    // n1 answered nothing exactly in its lag: it took no report then.
    let quiet: Vec<Call> = calls
        .iter()
        .filter(|c| c.sent != ms(15_900))
        .cloned()
        .collect();
    let mut quiet = quiet;
    quiet[4] = answer(k, 17_000, 1, limit, "n2");
    assert!(kinds_of(&crashed, k, quiet).contains(&"rollback".to_string()));
    // n2 shows the key as before n1's first admission: that one was
    // exact before the lease, long before the lag — not lost.
    let mut older = calls;
    older[5] = answer(k, 17_000, 1, limit, "n2");
    assert!(kinds_of(&crashed, k, older).contains(&"rollback".to_string()));
}

#[test]
fn a_node_cut_off_loses_its_lag_to_an_owner_that_answers_before_its_fence() {
    let k = 3;
    let limit = keys(1)[k].limit as i64;
    // n1, cut off from everyone at 10 s, answers twice as owner before
    // it finds itself deaf; n2 took the key over before n1's fence and
    // knows neither admission (zone seed 29: 936 ms into the cut).
    let cut: Vec<Fault> = [0, 2]
        .iter()
        .flat_map(|&n| {
            [(1, n), (n, 1)].map(|(from, to)| Fault::Cut {
                from,
                to,
                proto: Proto::Both,
                at: 10_000,
                span: 3_000,
            })
        })
        .collect();
    let taken_over = 10_000 + cut_off_fence() - 50;
    let calls = vec![
        answer(k, 10_000 + 100, 1, limit - 1, "n1"),
        answer(k, 10_000 + 150, 1, limit - 2, "n1"),
        answer(k, taken_over, 1, limit - 1, "n2"),
    ];
    let found = kinds_of(&schedule(cut), k, calls.clone());
    assert!(!found.contains(&"rollback".to_string()), "{found:?}");
    // With no cut, the same answers roll back.
    let found = kinds_of(&schedule(Vec::new()), k, calls);
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
}

#[test]
fn a_node_killed_while_paused_loses_what_it_admitted_before_the_pause() {
    let k = 3;
    let limit = keys(1)[k].limit as i64;
    // n1 admits twice just before a pause that a kill ends 200 ms
    // later (shorter than a pause that gives keys up); n2 takes the
    // key over from a replica without them (seed 499 of `--mix any`).
    let calls = vec![
        answer(k, 9_960, 1, limit - 1, "n1"),
        answer(k, 9_990, 1, limit - 2, "n1"),
        answer(k, 12_000, 1, limit - 1, "n2"),
    ];
    let s = schedule(Vec::new());
    let killed = [
        (ms(10_000), 1, Event::Paused { span: ms(200) }),
        (ms(10_200), 1, Event::Crashed),
    ];
    let found = kinds_after(&s, k, calls.clone(), &killed);
    assert!(!found.contains(&"rollback".to_string()), "{found:?}");
    // Killed when it had been running: the lag reaches back from the
    // kill only.
    let found = kinds_after(&s, k, calls, &killed[1..]);
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
}

#[test]
fn a_synchronous_key_loses_nothing_to_a_crash() {
    // Key 0: `deny`, synchronous replication — its exact answers
    // waited for the replica holder, so no crash excuses a rollback.
    assert!(keys(1)[0].sync);
    let limit = keys(1)[0].limit as i64;
    let calls = vec![
        answer(0, 10_000, 1, limit - 1, "n1"),
        answer(0, 10_050, 1, limit - 2, "n1"),
        answer(0, 12_000, 1, limit - 1, "n2"),
    ];
    let crashed = schedule(vec![Fault::Crash {
        node: 1,
        at: 10_060,
        down: 1_000,
    }]);
    let found = kinds(&crashed, calls);
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
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
    let lost = check(
        &s,
        &History {
            calls,
            resets: Vec::new(),
        },
        &[],
    );
    assert!(
        lost.iter()
            .any(|v| v.key == Some(0) && v.what.starts_with("lost admissions")),
        "{lost:?}"
    );
}

/// Crash events: each node down at `at` and started again at `back` (ms).
fn crashes(downs: &[(usize, u64, u64)]) -> Vec<(u64, usize, Event)> {
    downs
        .iter()
        .flat_map(|&(n, at, back)| [(ms(at), n, Event::Crashed), (ms(back), n, Event::Started)])
        .collect()
}

#[test]
fn a_wipe_is_an_owner_and_its_replica_holder_crashed_together() {
    use sluice::cluster::ring::{Member, Ring};
    let s = schedule(Vec::new());
    let grace = sluice::config::ClusterConfig::default()
        .in_doubt_grace
        .as_nanos() as u64;
    let ring = Ring::new((0..s.nodes).map(|n| Member {
        node_id: format!("n{n}").into(),
        generation: 1,
        grpc_addr: String::new(),
        protocol: 0,
        zone: Default::default(),
    }));
    let holders = |k: usize| {
        let key = sluice::store::key::encode("sim", &format!("k{k}"));
        let id = |m: Option<&Member>| m.map(|m| m.node_id[1..].parse::<usize>().unwrap());
        (
            id(ring.owner(&key)).unwrap(),
            id(ring.successor(&key)).unwrap(),
        )
    };
    // A key held by n0 and n1 (either way round), and one held by
    // neither pair of theirs (n2 owns it or holds its replica).
    let both = (0..100)
        .find(|&k| matches!(holders(k), (0, 1) | (1, 0)))
        .expect("a key of n0 and n1");
    let other = (0..100)
        .find(|&k| holders(k).0 == 2 || holders(k).1 == 2)
        .expect("a key n2 holds");
    // n0 crashed, n1 500 ms later while n0 was still down.
    let together = Faults::of(&s, &crashes(&[(0, 10_000, 12_000), (1, 10_500, 13_000)]));
    assert_eq!(together.wipes(&s, both), vec![ms(10_000) + grace]);
    assert_eq!(together.wipes(&s, other), Vec::<u64>::new());
    // The first node back before the second crash: its new process
    // held nothing yet.
    let back = Faults::of(&s, &crashes(&[(0, 10_000, 10_400), (1, 10_500, 13_000)]));
    assert_eq!(back.wipes(&s, both), vec![ms(10_000) + grace]);
    // n1 crashed and back, not yet rejoined, when n0 and n2 crash: the
    // key's holders are those of the ring without n1 (n0 and n2).
    let chain = Faults::of(
        &s,
        &crashes(&[(1, 6_000, 7_500), (2, 9_000, 12_000), (0, 9_200, 12_000)]),
    );
    assert_eq!(chain.wipes(&s, both), vec![ms(9_000) + grace]);
    // Rejoined by then (REJOIN after it started): n0 and n1 hold it.
    let rejoined = 7_500 + REJOIN;
    let chain = Faults::of(
        &s,
        &crashes(&[
            (1, 6_000, 7_500),
            (2, rejoined, rejoined + 3_000),
            (0, rejoined + 200, rejoined + 3_000),
        ]),
    );
    assert_eq!(chain.wipes(&s, both), Vec::<u64>::new());
    // The second crash beyond the window, the first still down.
    let late = 10_000 + WIPE_WINDOW + 1;
    let far = Faults::of(&s, &crashes(&[(0, 10_000, 20_000), (1, late, 21_000)]));
    assert_eq!(far.wipes(&s, both), Vec::<u64>::new());
    // Unless a lossy link held the re-replication up meanwhile (seed 2280
    // of `--mix any`); the window counts the time it did not.
    let lossy = |span: u64| {
        let s = schedule(vec![Fault::Loss {
            node: 2,
            at: 10_000,
            span,
            percent: 29,
        }]);
        let second = 10_000 + WIPE_WINDOW + 500;
        let f = Faults::of(&s, &crashes(&[(0, 10_000, 20_000), (1, second, 21_000)]));
        f.wipes(&s, both)
    };
    assert_eq!(lossy(3_000), vec![ms(10_000) + grace]);
    assert_eq!(lossy(490), Vec::<u64>::new());
    // A cut that does not touch the survivor's way to the key's new
    // holder (n1 to n2) holds nothing up.
    let cut = schedule(vec![Fault::Cut {
        from: 0,
        to: 2,
        proto: Proto::Tcp,
        at: 10_000,
        span: 3_000,
    }]);
    let second = 10_000 + WIPE_WINDOW + 500;
    let f = Faults::of(&cut, &crashes(&[(0, 10_000, 20_000), (1, second, 21_000)]));
    assert_eq!(f.wipes(&cut, both), Vec::<u64>::new());
    // At the same instant: one pair, counted once.
    let same = Faults::of(&s, &crashes(&[(1, 10_000, 12_000), (0, 10_000, 12_000)]));
    assert_eq!(same.wipes(&s, both), vec![ms(10_000) + grace]);
    // n1 paused past failure detection when n0 and n2 crash: out of the
    // ring by then, like a node down — the key's holders are n0 and n2
    // (seed 2188 of `--mix any`); paused only just, it is still in it.
    let paused = |since: u64| {
        let mut events = crashes(&[(2, 9_000, 12_000), (0, 9_200, 12_000)]);
        events.push((ms(since), 1, Event::Paused { span: ms(6_000) }));
        Faults::of(&s, &events)
    };
    // (And, in both, the cluster n0's and n2's new processes form on
    // their own at 12 s while n1 still sleeps: `formed_apart`.)
    assert_eq!(
        paused(7_000).wipes(&s, both),
        vec![ms(12_000), ms(9_000) + grace]
    );
    assert_eq!(paused(8_990).wipes(&s, both), vec![ms(12_000)]);
    // Back from a pause past failure detection, it rejoined: out of the
    // ring for [`REJOIN`] after (seed 2380 of `--mix any`) — not when it
    // was never buried (no rejoin), nor [`REJOIN`] later.
    let back = |ended: u64, rejoined: bool| {
        let mut events = crashes(&[(2, 9_000, 12_000), (0, 9_200, 12_000)]);
        events.push((ms(ended - 1_000), 1, Event::Paused { span: ms(1_000) }));
        if rejoined {
            events.push((ms(ended + 10), 1, Event::Rejoined));
        }
        Faults::of(&s, &events)
    };
    assert_eq!(back(8_700, true).wipes(&s, both), vec![ms(9_000) + grace]);
    assert_eq!(back(8_700, false).wipes(&s, both), Vec::<u64>::new());
    assert_eq!(
        back(9_000 - REJOIN - 1, true).wipes(&s, both),
        Vec::<u64>::new()
    );
}

/// Every node down at once, or a new process too young to hold a copy:
/// every key starts over at the crash that made it so, with no grace (no
/// node saw the losses). A new process that ran long enough may hold
/// copies; its pauses do not count as running.
#[test]
fn a_total_loss_wipes_every_key_at_once() {
    let s = schedule(Vec::new());
    let young = first_ready() / 1_000_000 - 100;
    // n0 back `young` ms before n1's crash; n2 still down.
    let total = Faults::of(
        &s,
        &crashes(&[
            (0, 10_000, 10_400 - young),
            (2, 10_100, 13_000),
            (1, 10_400, 13_000),
        ]),
    );
    for k in 0..KEYS {
        assert!(total.wipes(&s, k).contains(&ms(10_400)), "key {k}");
    }
    // n0's new process ran long enough: it may hold copies.
    let old = first_ready() / 1_000_000 + 100;
    let ran = Faults::of(
        &s,
        &crashes(&[
            (0, 9_000, 10_400 - old),
            (2, 10_100, 13_000),
            (1, 10_400, 13_000),
        ]),
    );
    assert!(ran.total_losses(&s).is_empty());
    // As long, but paused most of it: it ran too little.
    let mut events = crashes(&[
        (0, 9_000, 10_400 - old),
        (2, 10_100, 13_000),
        (1, 10_400, 13_000),
    ]);
    events.push((ms(10_400 - old + 50), 0, Event::Paused { span: ms(old) }));
    let paused = Faults::of(&s, &events);
    assert_eq!(paused.total_losses(&s), vec![ms(10_400)]);
    // One node up throughout: never a total loss.
    let two = Faults::of(&s, &crashes(&[(0, 10_000, 12_000), (1, 10_100, 13_000)]));
    assert!(two.total_losses(&s).is_empty());
}

/// Seed 2504's shape: n1 left, so n0 alone held every count; n0 paused
/// 6 s; n2 (late) and n1's new process started during the pause. The two
/// form a cluster of their own: every key may start over when the second
/// starts — and not when one of them started before n0 fell asleep (it
/// heard n0), nor when n0 wakes before they could turn ready.
#[test]
fn new_processes_that_never_heard_a_sleeping_cluster_form_their_own() {
    let mut s = schedule(Vec::new());
    s.late = vec![(2, 13_717)];
    let run = |n2_start: u64, pause: (u64, u64)| {
        let events = vec![
            (ms(10_020), 1, Event::Leaving),
            (
                ms(pause.0),
                0,
                Event::Paused {
                    span: ms(pause.1 - pause.0),
                },
            ),
            (ms(n2_start), 2, Event::Started),
            (ms(16_020), 1, Event::Started),
        ];
        let mut s = s.clone();
        s.late = vec![(2, n2_start)];
        Faults::of(&s, &events).formed_apart(&s)
    };
    assert_eq!(run(13_717, (12_670, 18_670)), vec![ms(16_020)]);
    for k in 0..KEYS {
        let f = Faults::of(
            &s,
            &[
                (ms(10_020), 1, Event::Leaving),
                (ms(12_670), 0, Event::Paused { span: ms(6_000) }),
                (ms(13_717), 2, Event::Started),
                (ms(16_020), 1, Event::Started),
            ],
        );
        assert!(f.wipes(&s, k).contains(&ms(16_020)), "key {k}");
    }
    // n2 started before n0 fell asleep: it heard n0, and holds its copies.
    assert!(run(12_000, (12_670, 18_670)).is_empty());
    // n0 wakes before the two could turn ready.
    let woke = 16_020 + first_ready() / 1_000_000 - 1;
    assert!(run(13_717, (12_670, woke)).is_empty());
    // One new process alone waits for a cluster: none forms.
    let alone = Faults::of(
        &s,
        &[
            (ms(10_020), 1, Event::Leaving),
            (ms(12_670), 0, Event::Paused { span: ms(6_000) }),
            (ms(13_717), 2, Event::Started),
        ],
    );
    assert!(alone.formed_apart(&s).is_empty());
    // n1 never left: awake throughout, it holds copies and answers.
    let old = Faults::of(
        &s,
        &[
            (ms(12_670), 0, Event::Paused { span: ms(6_000) }),
            (ms(13_717), 2, Event::Started),
        ],
    );
    assert!(old.formed_apart(&s).is_empty());
}

#[test]
fn a_key_that_never_answers_exactly_after_the_heal_fails_liveness() {
    let s = schedule(Vec::new());
    let history = History::default();
    let found = check(&s, &history, &[]);
    assert!(
        found
            .iter()
            .any(|v| v.key == Some(3) && v.what.starts_with("liveness")),
        "{found:?}"
    );
}

/// An operator's reset of `key`, sent and answered at these ms (`ok`:
/// answered; else failed — it may take effect at any time after).
fn reset(key: usize, sent_ms: u64, done_ms: u64, ok: bool) -> Reset {
    Reset {
        key,
        node: 0,
        sent: ms(sent_ms),
        done: ms(done_ms),
        outcome: if ok {
            Ok(true)
        } else {
            Err("timed out".into())
        },
    }
}

/// Key `k`'s violations with these resets, the history made whole with
/// a final count of `spent` (and liveness probes saying the same).
fn kinds_reset(k: usize, calls: Vec<Call>, resets: Vec<Reset>, spent: i64) -> Vec<String> {
    verdict(&schedule(Vec::new()), k, calls, resets, &[], spent)
}

#[test]
fn a_reset_starts_the_count_over_and_excuses_nothing_outside_it() {
    let k = 3;
    let limit = keys(1)[k].limit as i64;
    let calls = vec![
        answer(k, 10_000, 1, limit - 1, "n1"),
        answer(k, 10_050, 1, limit - 2, "n1"),
        answer(k, 12_000, 1, limit - 1, "n2"),
    ];
    let none = Vec::<String>::new();
    // No reset: a rollback.
    let found = kinds_reset(k, calls.clone(), Vec::new(), 1);
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
    // Reset and answered between them: the count started over.
    let between = vec![reset(k, 11_000, 11_010, true)];
    assert_eq!(kinds_reset(k, calls.clone(), between, 1), none);
    // Still out when the later answer was sent: either side.
    let overlapping = vec![reset(k, 11_000, 12_500, true)];
    assert_eq!(kinds_reset(k, calls.clone(), overlapping, 1), none);
    // Failed: it may have taken effect any time after it was sent, for a
    // while.
    let failed = vec![reset(k, 11_000, 11_400, false)];
    assert_eq!(kinds_reset(k, calls.clone(), failed, 1), none);
    // But not for ever: a rollback long after a failed reset (and no
    // fault to hold it up) is caught.
    let mut late = calls.clone();
    late.push(answer(k, 20_000, 1, limit - 2, "n1"));
    late.push(answer(k, 21_000, 1, limit - 1, "n2"));
    let found = kinds_reset(k, late, vec![reset(k, 11_000, 11_400, false)], 3);
    assert!(found.contains(&"rollback".to_string()), "{found:?}");
    // Sent after both answers, or before both: the rollback stands.
    for late_or_early in [reset(k, 13_000, 13_010, true), reset(k, 9_000, 9_010, true)] {
        let found = kinds_reset(k, calls.clone(), vec![late_or_early], 1);
        assert!(found.contains(&"rollback".to_string()), "{found:?}");
    }
}

#[test]
fn each_reset_lets_the_limit_be_admitted_once_more_and_no_more() {
    let k = 0;
    let limit = keys(1)[k].limit as i64;
    // The limit spent, a reset, the limit spent again (the final count
    // shows the second).
    let spend = |from_ms: u64| -> Vec<Call> {
        (0..limit as u64)
            .map(|i| answer(k, from_ms + i, 1, limit - 1 - i as i64, "n1"))
            .collect()
    };
    let mut twice = spend(10_000);
    twice.extend(spend(20_000));
    let resets = vec![reset(k, 15_000, 15_010, true)];
    assert_eq!(
        kinds_reset(k, twice.clone(), resets.clone(), limit),
        Vec::<String>::new()
    );
    // One more admission than that: over.
    let mut more = twice;
    more.push(answer(k, 30_000, 1, 0, "n1"));
    let found = kinds_reset(k, more, resets, limit);
    assert!(found.contains(&"over-admission".to_string()), "{found:?}");
    // After the reset, the final count must still cover what was
    // admitted since: two admissions, a final count of one.
    let after = vec![
        answer(k, 20_000, 1, limit - 1, "n1"),
        answer(k, 20_010, 1, limit - 2, "n1"),
    ];
    let found = kinds_reset(k, after, vec![reset(k, 15_000, 15_010, true)], 1);
    assert!(found.contains(&"lost admissions".to_string()), "{found:?}");
}

#[test]
fn a_failed_reset_may_land_until_the_faults_that_could_hold_it_end() {
    let r = reset(0, 11_000, 11_400, false);
    let quiet = schedule(Vec::new());
    assert_eq!(reset_until(&quiet, &r), ms(11_400 + RESET_LATE));
    // A pause from before it to 20 s, and a cut that began within the
    // window it opened: the window reaches past the cut's end.
    let held = schedule(vec![
        Fault::Pause {
            node: 2,
            at: 10_000,
            span: 10_000,
        },
        Fault::Cut {
            from: 0,
            to: 1,
            proto: Proto::Tcp,
            at: 21_000,
            span: 3_000,
        },
    ]);
    assert_eq!(reset_until(&held, &r), ms(24_000 + RESET_LATE));
    // An answered one took effect by its answer.
    let answered = reset(0, 11_000, 11_010, true);
    assert_eq!(reset_until(&held, &answered), ms(11_010));
}
