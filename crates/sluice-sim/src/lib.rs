//! Sluice under a deterministic simulator.
//!
//! The real node — `Limiter`, `Store`, membership with chitchat's own
//! code, the peer client and server over tonic, the public gRPC API — runs
//! on simulated hosts: a simulated network (`turmoil-net`: TCP and UDP,
//! packet by packet), simulated clocks (each host's tokio runtime, paused
//! and advanced by the simulator), everything on one thread. Sluice reads
//! the world only through its seams (`sluice::clock`, `sluice::net`,
//! `sluice::threads`, the store's hash seed), and the binary fixes the
//! process's randomness from the seed (`main.rs`), so a run is a pure
//! function of its [`schedule::Schedule`]: any failure replays bit for
//! bit.
//!
//! A run ([`sim::run`]): 3–7 nodes, apps calling every node about keys
//! that never refill, faults from the schedule (crashes, pauses, one- and
//! two-way cuts of gRPC and gossip apart, slow and lossy links, clock
//! steps and skew, graceful leaves, late joins, overlapping), then a heal
//! and probes. The checker ([`check`]) asserts per key: no exact answer
//! rolls back beyond the crash lag, no over-admission, nothing admitted is
//! lost, every key exact through every node soon after the heal; and
//! ([`doubt_check`]) a key one of whose holders of record survived a
//! loss is answered exactly again soon after it (never in doubt).

pub mod check;
pub mod doubt_check;
pub mod faults;
pub mod history;
pub mod membership_check;
pub mod schedule;
pub mod shrink;
pub mod sim;
pub mod workload;
pub mod world;

use serde::{Deserialize, Serialize};

/// A run's summary, as the binary prints it (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub seed: u64,
    pub nodes: usize,
    pub faults: usize,
    pub calls: usize,
    pub admitted: usize,
    pub approximate: usize,
    pub failed: usize,
    /// The history's hash: equal for two runs of one schedule.
    pub hash: String,
    pub violations: Vec<String>,
    /// Restarts that listened on another port (their old one still held).
    #[serde(default)]
    pub moved_ports: usize,
    /// (loss, key) pairs the needless-doubt check covered
    /// ([`doubt_check`]).
    #[serde(default)]
    pub doubt_checked: usize,
    /// The operator's resets made, and how many were answered.
    #[serde(default)]
    pub resets: usize,
    #[serde(default)]
    pub resets_answered: usize,
    pub sim_secs: f64,
    pub wall_secs: f64,
    /// What `std::time::Instant` counted over the run on its thread: the
    /// simulated seconds, where the binary runs it (a dependency's own
    /// reading of the machine's clock must not move the history).
    #[serde(default)]
    pub monotonic_secs: f64,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Run `schedule` and check it.
pub fn run(schedule: &schedule::Schedule) -> Report {
    run_with_history(schedule).0
}

/// [`run`], and the history it checked.
pub fn run_with_history(schedule: &schedule::Schedule) -> (Report, history::History) {
    let out = sim::run(schedule);
    let calls = &out.history.calls;
    let mut violations: Vec<String> = out.errors.iter().map(|e| format!("harness: {e}")).collect();
    violations.extend(
        check::check(schedule, &out.history, &out.events)
            .into_iter()
            .map(|v| match v.key {
                Some(k) => format!("key k{k}: {}", v.what),
                None => v.what,
            }),
    );
    let doubts = doubt_check::check(schedule, &out.history, &out.events);
    violations.extend(doubts.violations.into_iter().map(|v| match v.key {
        Some(k) => format!("key k{k}: {}", v.what),
        None => v.what,
    }));
    violations.extend(
        membership_check::check(schedule, &out.events, &out.rings)
            .into_iter()
            .map(|v| v.what),
    );
    let report = Report {
        seed: schedule.seed,
        nodes: schedule.nodes,
        faults: schedule.faults.len(),
        calls: calls.len(),
        admitted: calls.iter().filter(|c| c.admitted()).count(),
        approximate: calls
            .iter()
            .filter(|c| {
                matches!(
                    c.outcome,
                    history::Outcome::Answer {
                        approximate: true,
                        ..
                    }
                )
            })
            .count(),
        failed: calls.iter().filter(|c| c.failed()).count(),
        hash: format!("{:016x}", out.history.hash()),
        violations,
        moved_ports: out.moved_ports,
        doubt_checked: doubts.checked,
        resets: out.history.resets.len(),
        resets_answered: out
            .history
            .resets
            .iter()
            .filter(|r| r.outcome.is_ok())
            .count(),
        sim_secs: (schedule.end + schedule::PROBE_SPAN) as f64 / 1_000.0,
        wall_secs: out.wall,
        monotonic_secs: out.monotonic,
    };
    (report, out.history)
}
