//! A run's fault schedule: what goes wrong, where and when — drawn from
//! the seed, or read back from a file (a kept regression, a shrunk
//! failure), so a failure replays from its schedule even after the code
//! (and so what a seed draws) has changed.
//!
//! Times are simulated milliseconds from the start of the run. Faults may
//! overlap freely; the simulator applies them in time order to each
//! node's state (`up`, `paused`, `down`), so a pause of a node that is
//! down does nothing, and so on.

use serde::{Deserialize, Serialize};

use crate::workload::KEYS;

/// Which packets a cut drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// gRPC (forwards, replication, transfers, reports) and client calls.
    Tcp,
    /// Gossip.
    Udp,
    Both,
}

impl Proto {
    pub fn drops(self, tcp: bool) -> bool {
        match self {
            Proto::Both => true,
            Proto::Tcp => tcp,
            Proto::Udp => !tcp,
        }
    }
}

/// One fault. `at` and durations in simulated ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// The process is killed (state lost), and started again `down` later.
    Crash { node: usize, at: u64, down: u64 },
    /// The process stops (SIGSTOP): its runtime and clocks' readings
    /// stand still while the others run; its kernel still takes packets.
    Pause { node: usize, at: u64, span: u64 },
    /// The machine sleeps (a VM suspended, a laptop lid): as a pause, but
    /// on waking the monotonic clock (tokio's timers) has not moved while
    /// the boot and wall clocks have — the case presence reads the boot
    /// clock for.
    Suspend { node: usize, at: u64, span: u64 },
    /// Packets of `proto` from `from` to `to` are dropped (one way).
    Cut {
        from: usize,
        to: usize,
        proto: Proto,
        at: u64,
        span: u64,
    },
    /// Every packet to or from `node` waits `delay` ms more (a slow peer).
    Slow {
        node: usize,
        at: u64,
        span: u64,
        delay: u64,
    },
    /// Packets to or from `node` are lost with probability `percent`/100.
    Loss {
        node: usize,
        at: u64,
        span: u64,
        percent: u8,
    },
    /// The node's wall clock steps by `by` ms (NTP, a VM restored).
    ClockStep { node: usize, at: u64, by: i64 },
    /// The node leaves gracefully (SIGTERM) and starts again `down` later.
    Leave { node: usize, at: u64, down: u64 },
    /// An operator resets key `key` through `node` (`ResetKey` on its
    /// admin API: the node resets it at the key's owner).
    Reset { node: usize, at: u64, key: usize },
    /// The node's config file changes and its policies reload (one more
    /// named policy: the policy hash it gossips changes too).
    Reload { node: usize, at: u64 },
}

impl Fault {
    pub fn at(&self) -> u64 {
        match self {
            Fault::Crash { at, .. }
            | Fault::Pause { at, .. }
            | Fault::Suspend { at, .. }
            | Fault::Cut { at, .. }
            | Fault::Slow { at, .. }
            | Fault::Loss { at, .. }
            | Fault::ClockStep { at, .. }
            | Fault::Leave { at, .. }
            | Fault::Reset { at, .. }
            | Fault::Reload { at, .. } => *at,
        }
    }

    /// When the fault ends (a crash or a leave: when the node starts
    /// again).
    pub fn end(&self) -> u64 {
        match self {
            Fault::Crash { at, down, .. } | Fault::Leave { at, down, .. } => at + down,
            Fault::Pause { at, span, .. }
            | Fault::Suspend { at, span, .. }
            | Fault::Cut { at, span, .. }
            | Fault::Slow { at, span, .. }
            | Fault::Loss { at, span, .. } => at + span,
            Fault::ClockStep { at, .. } | Fault::Reset { at, .. } | Fault::Reload { at, .. } => *at,
        }
    }

    /// The nodes it touches.
    pub fn nodes(&self) -> Vec<usize> {
        match self {
            Fault::Cut { from, to, .. } => vec![*from, *to],
            Fault::Crash { node, .. }
            | Fault::Pause { node, .. }
            | Fault::Suspend { node, .. }
            | Fault::Slow { node, .. }
            | Fault::Loss { node, .. }
            | Fault::ClockStep { node, .. }
            | Fault::Leave { node, .. }
            | Fault::Reset { node, .. }
            | Fault::Reload { node, .. } => vec![*node],
        }
    }
}

/// Which faults a drawn schedule may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mix {
    /// Every kind, overlapping freely, and correlated pairs on purpose (a
    /// node paused past failure detection while another is killed).
    Any,
    /// One fault at a time, 3 s apart, of the kinds the cluster is
    /// documented to survive today: no cut that reaches gossip (a node
    /// cut off from gossip one or both ways splits the brain until issue
    /// 39's in-doubt rule lands — kept as regressions instead).
    Single,
    /// CPU stalls only (issue 49): every node paused for 0–2 s, again and
    /// again, 1–6 s apart. The cluster must stay one, and bury no node
    /// for a stall short of failure detection (`membership_check.rs`).
    Stalls,
    /// 5–7 nodes in three zones (`cluster.zone`; node `i` in zone `i % 3`),
    /// every kind of `any`, and a whole zone killed at once a quarter of
    /// the time: a zone takes no key's two copies, so the checker excuses
    /// no reset for it.
    Zones,
}

/// Zones of a [`Mix::Zones`] schedule.
const ZONES: usize = 3;

/// A whole run: the cluster, the faults and the phases.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Seeds the workload, the network's delays and losses, and every
    /// node's randomness.
    pub seed: u64,
    pub nodes: usize,
    /// Nodes that start late (a scale-out mid-traffic), with their start.
    #[serde(default)]
    pub late: Vec<(usize, u64)>,
    /// Each node's wall clock offset at start (ms).
    #[serde(default)]
    pub skew: Vec<i64>,
    /// Each node's zone (`cluster.zone`); none: no zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    pub faults: Vec<Fault>,
    /// Every fault is over and every node up from here on.
    pub heal: u64,
    /// Traffic stops here; the final probes follow.
    pub end: u64,
}

/// How long after the end of traffic the final probes run (ms).
pub const PROBE_SPAN: u64 = 8_000;
/// Faults start after the cluster formed.
const FIRST_FAULT: u64 = 6_000;
/// A pause, partition or slowdown long enough to cross failure detection
/// (about 0.8 s at the defaults), sometimes far longer.
const SPANS: &[u64] = &[300, 900, 1_500, 3_000, 6_000];

impl Schedule {
    /// A schedule drawn from `seed`: 3–7 nodes, a mix of faults over
    /// `secs` simulated seconds (at least 60).
    pub fn generate(seed: u64, secs: u64) -> Schedule {
        Schedule::draw(seed, secs, Mix::Any)
    }

    /// [`Schedule::generate`], of faults from `mix`.
    pub fn draw(seed: u64, secs: u64, mix: Mix) -> Schedule {
        Schedule::draw_sized(seed, secs, mix, None)
    }

    /// [`Schedule::draw`] over `nodes` nodes, if given (at least 2: faults
    /// pair nodes), else 3–7, drawn.
    pub fn draw_sized(seed: u64, secs: u64, mix: Mix, nodes: Option<usize>) -> Schedule {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_fa17);
        let drawn = rng.usize(3..=7);
        let zoned = mix == Mix::Zones;
        let nodes = nodes
            .unwrap_or(if zoned { 5 + drawn % 3 } else { drawn })
            .max(2);
        let zones = match zoned {
            true => (0..nodes).map(|n| format!("z{}", n % ZONES)).collect(),
            false => Vec::new(),
        };
        // The run is `secs` long in all: traffic, then the final probes.
        let end = secs.max(60) * 1_000 - PROBE_SPAN;
        let heal = end - 12_000;
        let mut faults = Vec::new();
        let skew = (0..nodes)
            .map(|_| match rng.u8(0..4) {
                0 => rng.i64(-2_000..=2_000),
                _ => rng.i64(-20..=20),
            })
            .collect();
        let late = if rng.u8(0..4) == 0 {
            vec![(nodes - 1, rng.u64(3_000..FIRST_FAULT + 10_000))]
        } else {
            Vec::new()
        };
        let n = rng.usize(2..=8);
        let latest = heal - 500;
        if mix == Mix::Stalls {
            for node in 0..nodes {
                let mut at = FIRST_FAULT + rng.u64(0..3_000);
                while at < latest {
                    let span = rng.u64(0..=2_000).min(latest - at);
                    faults.push(Fault::Pause { node, at, span });
                    at += span + rng.u64(1_000..6_000);
                }
            }
        }
        // Single: the next fault starts 3 s after the last one ended.
        let mut free_from = FIRST_FAULT;
        while mix != Mix::Stalls && faults.len() < n {
            if mix == Mix::Single && free_from + 1_000 >= latest {
                break;
            }
            let at = match mix {
                Mix::Any | Mix::Zones => rng.u64(FIRST_FAULT..latest),
                Mix::Single => rng.u64(free_from..(free_from + 4_000).min(latest - 500)),
                Mix::Stalls => unreachable!("drawn above"),
            };
            let room = latest - at;
            let span = SPANS[rng.usize(..SPANS.len())].min(room.max(100));
            let node = rng.usize(..nodes);
            let other = (node + rng.usize(1..nodes)) % nodes;
            let proto = match (mix, rng.u8(0..3)) {
                (Mix::Single | Mix::Stalls, _) | (Mix::Any | Mix::Zones, 0) => Proto::Tcp,
                (Mix::Any | Mix::Zones, 1) => Proto::Udp,
                (Mix::Any | Mix::Zones, _) => Proto::Both,
            };
            // 12–15 a zone, 16 an admin reset, 17 a config reload.
            let kind = match mix {
                Mix::Any => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17][rng.usize(..14)],
                Mix::Zones => rng.u8(0..18),
                // No node cut off from every other, no correlated pair.
                Mix::Single => [0, 2, 3, 4, 8, 9, 10, 11, 16, 17][rng.usize(..10)],
                Mix::Stalls => unreachable!("drawn above"),
            };
            let before = faults.len();
            match kind {
                0 | 1 => faults.push(Fault::Crash {
                    node,
                    at,
                    down: span.max(500),
                }),
                2 => faults.push(Fault::Pause { node, at, span }),
                3 => faults.push(Fault::Suspend { node, at, span }),
                4 => faults.push(Fault::Cut {
                    from: node,
                    to: other,
                    proto,
                    at,
                    span,
                }),
                5 => {
                    // A node cut off one way from every other (its
                    // outbound packets lost): the other side of the
                    // one-way gossip split.
                    for to in (0..nodes).filter(|&t| t != node) {
                        faults.push(Fault::Cut {
                            from: node,
                            to,
                            proto,
                            at,
                            span,
                        });
                    }
                }
                6 => {
                    // A node cut off both ways from every other.
                    for to in (0..nodes).filter(|&t| t != node) {
                        for (from, to) in [(node, to), (to, node)] {
                            faults.push(Fault::Cut {
                                from,
                                to,
                                proto,
                                at,
                                span,
                            });
                        }
                    }
                }
                7 => {
                    // The correlated case: one node paused past failure
                    // detection and, meanwhile, another killed.
                    let span = span.max(1_500).min(room.max(100));
                    faults.push(Fault::Pause { node, at, span });
                    faults.push(Fault::Crash {
                        node: other,
                        at: at + rng.u64(span / 3..span * 2 / 3 + 1),
                        down: rng.u64(1_000..4_000),
                    });
                }
                8 => faults.push(Fault::Slow {
                    node,
                    at,
                    span,
                    delay: rng.u64(5..60),
                }),
                9 => faults.push(Fault::Loss {
                    node,
                    at,
                    span,
                    percent: rng.u8(5..50),
                }),
                // Mostly NTP's small corrections; one in four a step past
                // the peer token's window (a VM restored from a snapshot,
                // a clock set by hand): 15 s to 15 min either way.
                10 => faults.push(Fault::ClockStep {
                    node,
                    at,
                    by: if rng.u8(0..4) == 0 {
                        rng.i64(15_000..=900_000) * if rng.bool() { 1 } else { -1 }
                    } else {
                        rng.i64(-3_000..=3_000)
                    },
                }),
                11 => faults.push(Fault::Leave {
                    node,
                    at,
                    down: span.max(1_000),
                }),
                16 => faults.push(Fault::Reset {
                    node,
                    at,
                    key: rng.usize(..KEYS),
                }),
                17 => faults.push(Fault::Reload { node, at }),
                _ => {
                    // A whole zone killed at once (node's), back together.
                    let down = rng.u64(1_000..4_000);
                    for n in (0..nodes).filter(|n| n % ZONES == node % ZONES) {
                        faults.push(Fault::Crash { node: n, at, down });
                    }
                }
            }
            let ended = faults[before..].iter().map(Fault::end).max().unwrap_or(at);
            free_from = ended + 3_000;
        }
        faults.sort_by_key(Fault::at);
        Schedule {
            seed,
            nodes,
            late,
            skew,
            zones,
            faults,
            heal,
            end,
        }
    }

    /// Whether node `n` starts late, and when.
    pub fn start_of(&self, n: usize) -> u64 {
        self.late
            .iter()
            .find(|(l, _)| *l == n)
            .map_or(n as u64 * 150, |(_, t)| *t)
    }
}

/// A kept schedule: a bug the simulator found, what it shows, and what a
/// run of it must do now — fail with that violation while the bug is
/// open (the simulator still finds it), pass once it is fixed (it stays
/// fixed). Files under `regressions/`: schedules, not seeds, since what a
/// seed draws changes with the code.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Regression {
    pub about: String,
    /// The seed whose draw found it; none for a schedule written by hand
    /// (a draw the simulator did not make yet, to show a bug read in code).
    #[serde(default)]
    pub found_by_seed: Option<u64>,
    pub expect: Expect,
    pub schedule: Schedule,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// The run reports, on `key`, a violation whose text starts with
    /// `violation`: `rollback`, `over-admission`, `lost admissions`,
    /// `liveness`, `needless doubt`.
    FailsWith {
        violation: String,
        key: usize,
    },
    Passes,
}

impl Schedule {
    /// A schedule from JSON: a bare schedule, or a [`Regression`]'s.
    pub fn from_json(text: &str) -> Result<Schedule, serde_json::Error> {
        serde_json::from_str::<Regression>(text)
            .map(|r| r.schedule)
            .or_else(|_| serde_json::from_str(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zones schedule names every node's zone (three, round robin) and,
    /// over a few seeds, kills whole zones at once; the other mixes draw
    /// no zones and write none (their files read as before).
    #[test]
    fn zones_schedules_kill_whole_zones_and_others_name_none() {
        let mut whole = 0;
        for seed in 0..40 {
            let s = Schedule::draw(seed, 60, Mix::Zones);
            assert!((5..=7).contains(&s.nodes), "seed {seed}: {} nodes", s.nodes);
            assert_eq!(s.zones.len(), s.nodes);
            assert!((0..s.nodes).all(|n| s.zones[n] == format!("z{}", n % 3)));
            for f in &s.faults {
                let Fault::Crash { node, at, down } = f else {
                    continue;
                };
                let zone: Vec<usize> = (0..s.nodes).filter(|n| n % 3 == node % 3).collect();
                let together = zone.iter().all(|&n| {
                    s.faults.contains(&Fault::Crash {
                        node: n,
                        at: *at,
                        down: *down,
                    })
                });
                whole += usize::from(together && zone[0] == *node);
            }
        }
        assert!(whole >= 10, "{whole} zones killed at once in 40 seeds");
        for mix in [Mix::Any, Mix::Single, Mix::Stalls] {
            let s = Schedule::draw(7, 60, mix);
            assert!(s.zones.is_empty());
            assert!(!serde_json::to_string(&s).unwrap().contains("zones"));
        }
    }
}
