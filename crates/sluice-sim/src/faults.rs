//! What a run did to its nodes, as the checker reads it: the deaths
//! (crashes, pauses long enough to give keys up, a node cut off at its
//! fence), what held replication up, and when a key's every copy may have
//! been lost (`Faults::wipes`) — with the timing bounds of the node they
//! rest on.

use sluice::cluster::ring::Member;

use crate::check::{ms, ring_of};
use crate::schedule::{Fault, Proto, Schedule};
use crate::sim::Event;

/// An owner replicates a change within this long (ms), with no fault in
/// the way: as soon as a change waits, then every `replicate_interval`
/// (20 ms) while changes come — plus the simulated network.
pub const LAG: u64 = 100;

/// Node `n`'s one-way cuts of a protocol other than `not`, grouped by the
/// instant they began: (start, earliest end) in ms, for each group of at
/// least `peers` cuts.
fn cuts_from(s: &Schedule, n: usize, not: Proto, peers: usize) -> Vec<(u64, u64)> {
    let from_n =
        |f: &Fault| matches!(*f, Fault::Cut { from, proto, .. } if from == n && proto != not);
    let mut starts: Vec<u64> = s
        .faults
        .iter()
        .filter(|f| from_n(f))
        .map(Fault::at)
        .collect();
    starts.sort_unstable();
    starts.dedup();
    starts
        .into_iter()
        .filter_map(|at| {
            let cut: Vec<&Fault> = s
                .faults
                .iter()
                .filter(|f| from_n(f) && f.at() == at)
                .collect();
            (cut.len() >= peers.max(1))
                .then(|| (at, cut.iter().map(|f| f.end()).min().unwrap_or(at)))
        })
        .collect()
}

/// When (ns, from–to) node `n`'s gossip to every peer was lost at once
/// (one-way cuts from it, of gossip or of both): no peer hears it, nor
/// can pass its heartbeats on, and they bury it.
fn silenced(s: &Schedule, n: usize) -> impl Iterator<Item = (u64, u64)> {
    cuts_from(s, n, Proto::Tcp, s.nodes - 1)
        .into_iter()
        .map(|(at, end)| (ms(at), ms(end)))
}

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

/// Something that can hold a node's replication up, over `[from, to]` ns.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Hold {
    /// A node paused, asleep or down: every other node's replicas to it.
    Node(usize),
    /// gRPC cut between two nodes (either way): both of them.
    Link(usize, usize),
    /// A slow or lossy node: anyone's replication may wait on it (it may
    /// hold anyone's replicas).
    Lossy(usize),
}

/// The run's deaths and what held replication up, from the schedule's
/// network faults and the processes' events.
pub(crate) struct Faults {
    /// (node, ns, since ns): crashes, and pauses long enough to give keys
    /// up, at their start; a node cut off, at its fence, `since` its cut
    /// (its peers may take its keys over before the fence: seed 29 of
    /// `--mix zones`, a new owner answered 936 ms into the cut).
    pub(crate) deaths: Vec<(usize, u64, u64)>,
    pub(crate) holds: Vec<(u64, u64, Hold)>,
    /// (node, down, back) ns: crashes, each until the node started again
    /// (a crash that ended a pause: down from the pause — seed 1211 of
    /// `--mix any`, an owner suspended, its holder killed 0.8 s in, the
    /// owner killed 4.5 s later still suspended: both copies gone).
    pub(crate) crashes: Vec<(usize, u64, u64)>,
    /// (node, ns): each process's start, and each leave's first word.
    starts: Vec<(usize, u64)>,
    leaves: Vec<(usize, u64)>,
    /// (node, ns): each rejoin as a new generation (the cluster buried it).
    rejoins: Vec<(usize, u64)>,
    /// (node, from, to) ns: pauses and suspensions.
    pauses: Vec<(usize, u64, u64)>,
}

impl Faults {
    pub(crate) fn of(s: &Schedule, events: &[(u64, usize, Event)]) -> Faults {
        let mut events = events.to_vec();
        events.sort_by_key(|&(at, n, _)| (at, n));
        let threshold = pause_death();
        let mut deaths = Vec::new();
        let mut holds = Vec::new();
        let mut crashes = Vec::new();
        let (mut starts, mut leaves, mut pauses) = (Vec::new(), Vec::new(), Vec::new());
        let mut rejoins = Vec::new();
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
                    pauses.push((n, at, at + span));
                }
                Event::Started => starts.push((n, at)),
                Event::Leaving => leaves.push((n, at)),
                Event::Rejoined => rejoins.push((n, at)),
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
                Fault::Slow { node, .. } | Fault::Loss { node, .. } => {
                    holds.push((from, to, Hold::Lossy(node)))
                }
                _ => {}
            }
        }
        // A node cut off (gRPC, one way or both) from half its peers or
        // more at once keeps owning until it finds itself deaf: what it
        // admitted as owner meanwhile is never replicated — the documented
        // cut-off lag, lost like a crash's. A death at its fence (or the
        // cut's end, if sooner), reaching back over the cut. So is one
        // whose outbound gossip to every peer is lost (below).
        for n in 0..s.nodes {
            // Half its peers or more (`2 × cuts ≥ peers`).
            for (at, end) in cuts_from(s, n, Proto::Udp, s.nodes / 2) {
                deaths.push((n, ms(at + cut_off_fence().min(end - at)), ms(at)));
            }
            // Its gossip to every peer lost (none can pass its heartbeats
            // on): its peers bury it and take its keys over from replicas
            // while it owns until it finds itself unheard.
            for (from, to) in silenced(s, n) {
                let (at, end) = (from / 1_000_000, to / 1_000_000);
                deaths.push((n, ms(at + cut_off_fence().min(end - at)), from));
            }
        }
        deaths.sort_by_key(|&(n, at, _)| (at, n));
        deaths.dedup();
        Faults {
            deaths,
            holds,
            crashes,
            starts,
            leaves,
            pauses,
            rejoins,
        }
    }

    /// When key `k`'s count may have been wiped out with R = 1 (ns): its
    /// owner and its replica holder both crashed, the second within
    /// [`WIPE_WINDOW`] of the first, counting only time a majority was up
    /// and nothing else held replication up (back by then or not: a new process holds no copy until it
    /// rejoined) — no copy of it survives. The cluster then decides it in doubt (never exactly) for
    /// `in_doubt_grace`, and from its best copy after, counting the loss
    /// (`sluice_keys_taken_from_best_copy_total`): the instants returned
    /// are the earliest those graces can end (from the first crash: the
    /// region opens at its suspicion). Holders are taken from the ring of
    /// the nodes up at the first crash.
    pub(crate) fn wipes(&self, s: &Schedule, k: usize) -> Vec<u64> {
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
                if a == b
                    || !first
                    || self.majority_up_when(s, ta, tb, |_| true) > ms(WIPE_WINDOW) * 8
                {
                    continue;
                }
                // The members that can hold a copy at the first crash: a
                // node restarted counts only once it has rejoined — the
                // two crashed aside, which may have held one (seed 1040
                // of `--mix any`: an owner back 4.2 s after an earlier
                // crash answered as owner, then crashed with its holder).
                // Nor does a node paused past failure detection at the
                // first crash: it was out of the ring the keys were decided
                // in by then (seed 2188 of `--mix any`: the owner paused
                // 6 s, the node that took its keys over killed with its
                // new holder 2.1–2.6 s into the pause).
                let up = (0..s.nodes).filter(|&n| {
                    let started = s.late.iter().all(|&(m, at)| m != n || ms(at) <= ta);
                    let down = self
                        .crashes
                        .iter()
                        .any(|&(m, t, back)| m == n && t < ta && back + ms(REJOIN) > ta);
                    // Or back from such a pause less than [`REJOIN`]
                    // before, having rejoined as a new generation (the
                    // cluster buried it): its keys moved off it meanwhile
                    // (seed 2380 of `--mix any` at 022951f: n0 back 274
                    // ms from a 3-s pause, paused again, when the two
                    // holders of its old keys crashed 550 ms apart).
                    let away = self.holds.iter().any(|&(from, to, h)| {
                        let during = from + pause_death() <= ta && ta < to;
                        let rejoined = self
                            .rejoins
                            .iter()
                            .any(|&(m, at)| m == n && from <= at && at <= ta);
                        let rejoining = rejoined && to <= ta && ta < to + ms(REJOIN);
                        matches!(h, Hold::Node(m) if m == n) && (during || rejoining)
                    });
                    // Nor one unheard (its gossip to every peer lost) and
                    // buried for it — detected, with every other node up
                    // to vote — before the first crash: it holds nothing
                    // current until it has rejoined (seed 212 of `--mix
                    // any` at 862e074).
                    let unheard = silenced(s, n).any(|(from, to)| {
                        let buried = from + ms(cut_off_fence());
                        buried <= ta
                            && ta < to + ms(REJOIN)
                            && (0..s.nodes).filter(|&m| m != n).all(|m| {
                                let crashed = self.crashes.iter().any(|&(c, t, back)| {
                                    c == m && t <= buried && buried < back + ms(JOIN)
                                });
                                let held = self.holds.iter().any(|&(f, u, h)| {
                                    matches!(h, Hold::Node(x) if x == m)
                                        && f <= buried
                                        && buried < u
                                });
                                !crashed && !held
                            })
                    });
                    started && (!(down || away || unheard) || n == a || n == b)
                });
                let ring = ring_of(s, up);
                let holders = [ring.owner(&key), ring.successor(&key)];
                let is = |m: Option<&Member>, n: usize| {
                    m.is_some_and(|m| *m.node_id == *format!("n{n}"))
                };
                let both = (is(holders[0], a) && is(holders[1], b))
                    || (is(holders[0], b) && is(holders[1], a));
                if !both {
                    continue;
                }
                // Nor time when something held this key's re-replication
                // up: the survivor, or the key's new holder (its holder
                // in the ring without the first), away, lossy or slow, or
                // the link between them cut — the survivor could not
                // re-replicate the key meanwhile (seed 2280 of `--mix
                // any` at 022951f: the owner's link lossy from 3 s before
                // its holder's crash to 1.2 s after its own, 2,071 ms
                // later). At most eight windows in all.
                let members = ring.members();
                let without_a = ring.holders_without(&key, |i| is(Some(&members[i]), a));
                let new_holder = [without_a.0, without_a.1]
                    .into_iter()
                    .flatten()
                    .map(|i| &members[i])
                    .find(|m| !is(Some(m), b))
                    .and_then(|m| m.node_id[1..].parse::<usize>().ok());
                let held = |t: u64| self.held_for(t, b, new_holder);
                if self.majority_up_when(s, ta, tb, |t| !held(t)) > ms(WIPE_WINDOW) {
                    continue;
                }
                // The region opens at the first one's suspicion: its
                // grace ends no sooner than `ta + grace`.
                out.push(ta + grace);
            }
        }
        out.extend(self.total_losses(s));
        out.extend(self.formed_apart(s));
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
    pub(crate) fn total_losses(&self, s: &Schedule) -> Vec<u64> {
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

    /// The instants (ns) a brand-new cluster may have formed apart from
    /// every process that holds copies: at a process's start, every
    /// process running is either asleep (paused or suspended) until the
    /// ones awake could have turned ready ([`first_ready`] after), or
    /// awake and started after every sleeper fell asleep — it never heard
    /// one, and none can tell it a cluster exists — and at least
    /// `bootstrap_expect` (2) are awake. Those form a new cluster, as a
    /// first start does, and count from zero; the sleepers' counts merge
    /// into theirs when they wake (the larger count kept), so the key may
    /// be admitted up to its limit once more (seed 2504 of `--mix any` at
    /// 022951f: n1 left, so n0 alone held every count; n0 paused 6 s; n2
    /// started 1 s into the pause and n1's new process 3.4 s in; the two
    /// formed a cluster of their own). Nothing in the product can tell a
    /// new node of a cluster none of whose members answers: counts that
    /// outlive that are issue 43's snapshots. A leaver counts as awake
    /// (it may hand its keys on) for [`JOIN`] after its word. Old
    /// processes cut off rather than asleep are not modelled here.
    pub(crate) fn formed_apart(&self, s: &Schedule) -> Vec<u64> {
        let expect = sluice::config::ClusterConfig::default()
            .bootstrap_expect
            .max(2);
        let mut out = Vec::new();
        for &(_, t) in &self.starts {
            let mut awake: Vec<u64> = Vec::new();
            let mut asleep: Vec<(u64, u64)> = Vec::new();
            let mut apart = true;
            for n in 0..s.nodes {
                // Its latest start by `t` (one not late started at 0).
                let late = s.late.iter().find(|&&(m, _)| m == n).map(|&(_, at)| ms(at));
                let Some(start) = self
                    .starts
                    .iter()
                    .filter(|&&(m, at)| m == n && at <= t)
                    .map(|&(_, at)| at)
                    .max()
                    .or_else(|| late.is_none().then_some(0))
                else {
                    continue;
                };
                let down = self
                    .crashes
                    .iter()
                    .any(|&(m, down, back)| m == n && down <= t && t < back);
                let left = self
                    .leaves
                    .iter()
                    .filter(|&&(m, at)| m == n && start <= at && at <= t)
                    .map(|&(_, at)| at)
                    .max();
                if down {
                    continue;
                }
                if let Some(at) = left {
                    if t < at + ms(JOIN) {
                        apart = false;
                    }
                    continue;
                }
                match self
                    .pauses
                    .iter()
                    .find(|&&(m, from, to)| m == n && from <= t && t < to)
                {
                    Some(&(_, from, to)) => asleep.push((from, to)),
                    None => awake.push(start),
                }
            }
            let fell = asleep.iter().map(|&(from, _)| from).max();
            let woke = asleep.iter().map(|&(_, to)| to).min();
            let (Some(fell), Some(woke)) = (fell, woke) else {
                continue;
            };
            if apart
                && awake.len() >= expect
                && awake.iter().all(|&a| a > fell)
                && woke >= t + first_ready()
            {
                out.push(t);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// How long (ns) within `[from, to]`, at instants `also` holds, a
    /// majority of the nodes was up:
    /// started, not paused, and not down — a crashed node counts again
    /// [`JOIN`] after it started (it votes once it has joined).
    fn majority_up_when(
        &self,
        s: &Schedule,
        from: u64,
        to: u64,
        also: impl Fn(u64) -> bool,
    ) -> u64 {
        const STEP: u64 = 10_000_000;
        // Deaf: gossip from every peer cut off (it hears nobody, and
        // nobody can pass it on; its failure detector's word is not
        // taken), and for [`WIPE_WINDOW`] after, while it hears the others
        // again and suspects the dead (chitchat patch 6) — a vote it
        // cannot cast buries no one (seed 212 of `--mix any` at 862e074:
        // a node deaf for 6 s, a crash during it never buried, the owner
        // that alone held the key crashed 2 s after the deafness ended).
        let deaf = |n: usize, t: u64| {
            let cut = s
                .faults
                .iter()
                .filter(|f| {
                    matches!(**f, Fault::Cut { to, proto, .. } if to == n && proto != Proto::Tcp)
                        && ms(f.at()) <= t
                        && t < ms(f.end() + WIPE_WINDOW)
                })
                .count();
            cut + 1 >= s.nodes
        };
        // Unheard (its gossip to every peer lost): its vote reaches no one.
        let unheard = |n: usize, t: u64| {
            silenced(s, n).any(|(from, to)| from <= t && t < to + ms(WIPE_WINDOW))
        };
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
            started && !crashed && !held && !deaf(n, t) && !unheard(n, t)
        };
        (from..to)
            .step_by(STEP as usize)
            .filter(|&t| also(t) && (0..s.nodes).filter(|&n| up(n, t)).count() * 2 > s.nodes)
            .count() as u64
            * STEP
    }

    /// Whether, at `t`, something may hold up the re-replication from
    /// `b` to `h`: either away (paused or down), on a slow or lossy link,
    /// or the gRPC between them cut.
    fn held_for(&self, t: u64, b: usize, h: Option<usize>) -> bool {
        let touches = |n: usize| n == b || Some(n) == h;
        self.holds.iter().any(|&(from, to, hold)| {
            from <= t
                && t < to
                && match hold {
                    Hold::Node(n) | Hold::Lossy(n) => touches(n),
                    Hold::Link(x, y) => (x == b && Some(y) == h) || (y == b && Some(x) == h),
                }
        })
    }

    /// From when a death of `node` at `at` may lose admissions (ns): `LAG`
    /// before it, and `LAG` before any hold of its replication that
    /// overlaps that window, back over overlapping holds.
    pub(crate) fn lag_start(&self, node: usize, at: u64) -> u64 {
        let holds_up = |h: Hold| match h {
            Hold::Node(n) => n != node,
            Hold::Link(a, b) => a == node || b == node,
            Hold::Lossy(_) => true,
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
