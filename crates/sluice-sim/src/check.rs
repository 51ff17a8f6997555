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
//! lag).
//!
//! With one replica, a key whose owner and replica holder crash together
//! has no surviving copy: it is decided in doubt for `in_doubt_grace`, then
//! from its best copy, the loss counted. The checker allows exactly that
//! ([`Faults::wipes`]): from the end of that grace the key's answers are
//! compared only with later ones — an exact answer that rolls back inside
//! the grace is still a violation. When every node is lost at once (no
//! process that may hold a copy runs), the nodes that start after are a
//! new cluster: every key starts over from that instant, with no grace.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use sluice::cluster::ring::{Member, Ring};

use crate::history::{Call, History};
use crate::schedule::{Fault, Proto, Schedule};
use crate::sim::Event;
use crate::workload::{KEYS, Key, LIVENESS, Unreachable, keys};

/// An owner replicates a change within this long (ms), with no fault in
/// the way: as soon as a change waits, then every `replicate_interval`
/// (20 ms) while changes come — plus the simulated network.
pub const LAG: u64 = 100;

/// How long (ms) a node cut off from a majority may go on owning: until
/// it has heard no majority for one and a half `away_after`, read at its
/// gossip rounds (two more of them, for the reading).
pub fn cut_off_fence() -> u64 {
    let c = sluice::config::ClusterConfig::default();
    let away = sluice::cluster::membership::away_after(c.gossip_interval, c.phi_threshold);
    (away + away / 2 + c.gossip_interval * 2).as_millis() as u64
}

/// Two crashes this close (ms) — counting only time a majority was up —
/// can take a key's owner and its replica holder before either
/// re-replicated it: failure detection and a majority's burial (out of
/// the rings in 1–1.6 s at the defaults) and a replication round.
pub const WIPE_WINDOW: u64 = 2_000;

/// How long (ms) a crashed node's new process holds no copy after it
/// started: it joins once its view held still (1–5 s at the defaults),
/// then takes its keys by the transfer and their replicas by
/// re-replication. Longer than [`WIPE_WINDOW`]: a node back within the
/// window holds nothing yet (seed 57 of `--mix zones`: a zone back 150
/// ms before two others crashed still counted as holding its copies).
pub const REJOIN: u64 = 6_000;

/// How long (ms) a crashed node's new process takes to join and vote
/// (1–5 s at the defaults: once its view held still).
pub const JOIN: u64 = 5_000;

/// How long (ns) a new process runs at least before it may hold a copy:
/// once it reached its cluster, its view must hold still for three gossip
/// rounds before it turns ready (`cluster/membership/join.rs`), and only
/// then is it given keys.
pub fn first_ready() -> u64 {
    let c = sluice::config::ClusterConfig::default();
    (c.gossip_interval * 3).as_nanos() as u64
}

/// A pause at least this long (ns) may make a node give up its keys: it
/// rejoins once its gossip loop's last round is `away_after` old (400 ms
/// at the defaults), and that round may have come up to one reading
/// interval (`away_after / 8`) before the pause. Its peers, past failure
/// detection, decide its keys from replicas meanwhile: to them the same
/// as a crash, with the same lag lost.
pub fn pause_death() -> u64 {
    let c = sluice::config::ClusterConfig::default();
    let away = sluice::cluster::membership::away_after(c.gossip_interval, c.phi_threshold);
    let reading = (away / 8).clamp(
        std::time::Duration::from_millis(5),
        std::time::Duration::from_millis(100),
    );
    (away - reading).as_nanos() as u64 - 1_000_000
}

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
        check_key(s, &faults, k, keys[k], calls, &mut out);
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

/// Something that can hold a node's replication up, over `[from, to]` ns.
#[derive(Clone, Copy, Debug)]
enum Hold {
    /// A node paused, asleep or down: every other node's replicas to it.
    Node(usize),
    /// gRPC cut between two nodes (either way): both of them.
    Link(usize, usize),
    /// A slow or lossy node: anyone (it may hold anyone's replicas).
    Any,
}

/// The run's deaths and what held replication up, from the schedule's
/// network faults and the processes' events.
struct Faults {
    /// (node, ns, since ns): crashes, and pauses long enough to give keys
    /// up, at their start; a node cut off, at its fence, `since` its cut
    /// (its peers may take its keys over before the fence: seed 29 of
    /// `--mix zones`, a new owner answered 936 ms into the cut).
    deaths: Vec<(usize, u64, u64)>,
    holds: Vec<(u64, u64, Hold)>,
    /// (node, down, back) ns: crashes, each until the node started again
    /// (a crash that ended a pause: down from the pause — seed 1211 of
    /// `--mix any`, an owner suspended, its holder killed 0.8 s in, the
    /// owner killed 4.5 s later still suspended: both copies gone).
    crashes: Vec<(usize, u64, u64)>,
}

impl Faults {
    fn of(s: &Schedule, events: &[(u64, usize, Event)]) -> Faults {
        let mut events = events.to_vec();
        events.sort_by_key(|&(at, n, _)| (at, n));
        let threshold = pause_death();
        let mut deaths = Vec::new();
        let mut holds = Vec::new();
        let mut crashes = Vec::new();
        let end = ms(s.end);
        for (i, &(at, n, e)) in events.iter().enumerate() {
            match e {
                Event::Crashed => {
                    // Crashed while paused: dead from the pause's start.
                    let since = events[..i]
                        .iter()
                        .find_map(|&(t, m, e)| match e {
                            Event::Paused { span } if m == n && t + span == at => Some(t),
                            _ => None,
                        })
                        .unwrap_or(at);
                    deaths.push((n, since, since));
                    let back = events[i + 1..]
                        .iter()
                        .find(|&&(_, m, e)| m == n && e == Event::Started)
                        .map_or(end, |&(t, _, _)| t);
                    holds.push((at, back, Hold::Node(n)));
                    crashes.push((n, since, back));
                }
                Event::Paused { span } => {
                    if span >= threshold {
                        deaths.push((n, at, at));
                    }
                    holds.push((at, at + span, Hold::Node(n)));
                }
                Event::Started | Event::Leaving | Event::Rejoined => {}
            }
        }
        for f in &s.faults {
            let (from, to) = (ms(f.at()), ms(f.end()));
            match *f {
                Fault::Cut {
                    from: a,
                    to: b,
                    proto,
                    ..
                } if proto != Proto::Udp => holds.push((from, to, Hold::Link(a, b))),
                Fault::Slow { .. } | Fault::Loss { .. } => holds.push((from, to, Hold::Any)),
                _ => {}
            }
        }
        // A node cut off (gRPC, one way or both) from half its peers or
        // more at once keeps owning until it finds itself deaf: what it
        // admitted as owner meanwhile is never replicated — the documented
        // cut-off lag, lost like a crash's. A death at its fence (or the
        // cut's end, if sooner), reaching back over the cut.
        for n in 0..s.nodes {
            let mut starts: Vec<u64> = s
                .faults
                .iter()
                .filter_map(|f| match *f {
                    Fault::Cut {
                        from, proto, at, ..
                    } if from == n && proto != Proto::Udp => Some(at),
                    _ => None,
                })
                .collect();
            starts.sort_unstable();
            starts.dedup();
            for at in starts {
                let cut: Vec<&Fault> = s
                    .faults
                    .iter()
                    .filter(|f| {
                        matches!(**f, Fault::Cut { from, proto, at: t, .. }
                            if from == n && proto != Proto::Udp && t == at)
                    })
                    .collect();
                if cut.len() * 2 >= s.nodes - 1 {
                    let end = cut.iter().map(|f| f.end()).min().unwrap_or(at);
                    deaths.push((n, ms(at + cut_off_fence().min(end - at)), ms(at)));
                }
            }
        }
        deaths.sort_by_key(|&(n, at, _)| (at, n));
        deaths.dedup();
        Faults {
            deaths,
            holds,
            crashes,
        }
    }

    /// When key `k`'s count may have been wiped out with R = 1 (ns): its
    /// owner and its replica holder both crashed, the second within
    /// [`WIPE_WINDOW`] of the first, counting only time a majority was up
    /// (back by then or not: a new process holds no copy until it
    /// rejoined) — no copy of it survives. The cluster then decides it in doubt (never exactly) for
    /// `in_doubt_grace`, and from its best copy after, counting the loss
    /// (`sluice_keys_taken_from_best_copy_total`): the instants returned
    /// are the earliest those graces can end (from the first crash: the
    /// region opens at its suspicion). Holders are taken from the ring of
    /// the nodes up at the first crash.
    fn wipes(&self, s: &Schedule, k: usize) -> Vec<u64> {
        let grace = sluice::config::ClusterConfig::default()
            .in_doubt_grace
            .as_nanos() as u64;
        let key = sluice::store::key::encode("sim", &format!("k{k}"));
        let mut out = Vec::new();
        for &(a, ta, _) in &self.crashes {
            for &(b, tb, _) in &self.crashes {
                // Each pair once (a before b; by node at the same instant).
                let first = ta < tb || (ta == tb && a < b);
                // Back within the window or not, a's new process holds
                // nothing yet ([`REJOIN`]). The window counts only time a
                // majority was up: without one no node is buried, none
                // takes the first one's keys over to re-replicate them
                // (seed 67 of `--mix zones`: a zone lost while a third
                // node was paused, the other holder crashed 2.6 s later).
                if a == b || !first || self.majority_up(s, ta, tb) > ms(WIPE_WINDOW) {
                    continue;
                }
                // The members that can hold a copy at the first crash: a
                // node restarted counts only once it has rejoined — the
                // two crashed aside, which may have held one (seed 1040
                // of `--mix any`: an owner back 4.2 s after an earlier
                // crash answered as owner, then crashed with its holder).
                let up = (0..s.nodes).filter(|&n| {
                    let started = s.late.iter().all(|&(m, at)| m != n || ms(at) <= ta);
                    let down = self
                        .crashes
                        .iter()
                        .any(|&(m, t, back)| m == n && t < ta && back + ms(REJOIN) > ta);
                    started && (!down || n == a || n == b)
                });
                let ring = ring_of(s, up);
                let holders = [ring.owner(&key), ring.successor(&key)];
                let is = |m: Option<&Member>, n: usize| {
                    m.is_some_and(|m| *m.node_id == *format!("n{n}"))
                };
                let both = (is(holders[0], a) && is(holders[1], b))
                    || (is(holders[0], b) && is(holders[1], a));
                if both {
                    // The region opens at the first one's suspicion: its
                    // grace ends no sooner than `ta + grace`.
                    out.push(ta + grace);
                }
            }
        }
        out.extend(self.total_losses(s));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The instants (ns) every copy of every key was gone at once: each
    /// node down, not started yet, or a new process that has not run
    /// [`first_ready`] since it started (pauses not counted) — no process
    /// that may hold a copy runs. The processes that start after are a
    /// new cluster, indistinguishable from a first start, and count from
    /// zero at once: no node saw the losses, so none holds a region of
    /// doubt (seed 2088 of `--mix any`: n0 and n2 crashed 170 ms apart,
    /// n0's new process was suspended 190 ms after it started, n1 crashed
    /// during the suspension). Counts that outlive the whole fleet are
    /// issue 43's snapshots.
    fn total_losses(&self, s: &Schedule) -> Vec<u64> {
        let ready = first_ready();
        let holds_nothing = |n: usize, t: u64| {
            if s.late.iter().any(|&(m, at)| m == n && ms(at) > t) {
                return true;
            }
            // Its latest crash at or before `t`.
            let Some(&(_, _, back)) = self
                .crashes
                .iter()
                .filter(|&&(m, down, _)| m == n && down <= t)
                .max_by_key(|&&(_, down, _)| down)
            else {
                return false;
            };
            if back > t {
                return true;
            }
            let paused: u64 = self
                .holds
                .iter()
                .filter(|&&(f, u, h)| matches!(h, Hold::Node(m) if m == n) && u > back && f < t)
                .map(|&(f, u, _)| u.min(t) - f.max(back))
                .sum();
            (t - back).saturating_sub(paused) < ready
        };
        let mut out: Vec<u64> = self
            .crashes
            .iter()
            .map(|&(_, down, _)| down)
            .filter(|&t| (0..s.nodes).all(|n| holds_nothing(n, t)))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// How long (ns) within `[from, to]` a majority of the nodes was up:
    /// started, not paused, and not down — a crashed node counts again
    /// [`JOIN`] after it started (it votes once it has joined).
    fn majority_up(&self, s: &Schedule, from: u64, to: u64) -> u64 {
        const STEP: u64 = 10_000_000;
        let up = |n: usize, t: u64| {
            let started = s.late.iter().all(|&(m, at)| m != n || ms(at) <= t);
            let crashed = self
                .crashes
                .iter()
                .any(|&(m, down, back)| m == n && down <= t && t < back + ms(JOIN));
            let held = self
                .holds
                .iter()
                .any(|&(f, u, h)| matches!(h, Hold::Node(m) if m == n) && f <= t && t < u);
            started && !crashed && !held
        };
        (from..to)
            .step_by(STEP as usize)
            .filter(|&t| (0..s.nodes).filter(|&n| up(n, t)).count() * 2 > s.nodes)
            .count() as u64
            * STEP
    }

    /// From when a death of `node` at `at` may lose admissions (ns): `LAG`
    /// before it, and `LAG` before any hold of its replication that
    /// overlaps that window, back over overlapping holds.
    fn lag_start(&self, node: usize, at: u64) -> u64 {
        let holds_up = |h: Hold| match h {
            Hold::Node(n) => n != node,
            Hold::Link(a, b) => a == node || b == node,
            Hold::Any => true,
        };
        let mut from = at.saturating_sub(ms(LAG));
        loop {
            let earlier = self
                .holds
                .iter()
                .filter(|&&(f, t, h)| holds_up(h) && f < at && t + ms(LAG) >= from)
                .map(|&(f, _, _)| f.saturating_sub(ms(LAG)))
                .min()
                .unwrap_or(from)
                .min(from);
            if earlier == from {
                return from;
            }
            from = earlier;
        }
    }
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
}

fn lost(faults: &Faults, calls: &[&Call], (node, at, since): (usize, u64, u64), key: Key) -> Lost {
    let from = faults.lag_start(node, at);
    let owner = format!("n{node}");
    let within = |c: &Call| c.done >= from && c.sent <= at;
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
    }
}

fn check_key(
    s: &Schedule,
    faults: &Faults,
    k: usize,
    key: Key,
    calls: &[&Call],
    out: &mut Vec<Violation>,
) {
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
            .filter(|(a, _)| a.done < b.sent && stretch(a.sent) == stretch(b.sent))
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
            let allowed = ra + counted.len() as i64;
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
    // Each wipe may let the limit be admitted once more.
    let wiped = wipes.len() as i64;
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
            // What the last stretch admitted exactly (all, with no wipe).
            let last = wipes.last().copied().unwrap_or(0);
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
