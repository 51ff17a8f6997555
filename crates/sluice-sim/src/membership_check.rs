//! What the cluster's membership must come to, whatever the schedule
//! (issue 49, "No meltdown"): one cluster at the end, and no node buried
//! for a stall it should have outlasted.
//!
//! - **One ring.** Every fault is over by `heal` and the run goes on 12 s
//!   more: at its end every running node's ring holds every node, at the
//!   same generations everywhere, and no node suspects any.
//! - **Being slow is not being dead.** A node rejoins (a new generation)
//!   only when a majority buried it. A stall shorter than
//!   [`stall_tolerated`] is short of failure detection with room to
//!   spare: a rejoin with no longer stall of that node ending in the 5 s
//!   before it, and no other fault on it (cut, loss, slowness, clock step,
//!   crash) in the 15 s before, is a node buried for being slow.

use std::collections::BTreeSet;

use crate::check::Violation;
use crate::schedule::{Fault, Schedule};
use crate::sim::{Event, Standing};

/// How far back (ms) a fault other than a stall may explain a rejoin:
/// detection, a burial's votes and a rejoin, with room for a loaded
/// cluster.
const EXPLAINS_FOR: u64 = 15_000;

/// How long (ms) after a stall ends the rejoin it caused comes: the node
/// hears its tombstone within a round or two of resuming (the burial
/// itself came during the stall, or just after it).
const STALL_EXPLAINS_FOR: u64 = 5_000;

/// The longest stall (ms) no node may be buried for: one and a half
/// `away_after` (600 ms at the defaults; failure detection is ~0.8 s).
pub fn stall_tolerated() -> u64 {
    let c = sluice::config::ClusterConfig::default();
    let away = sluice::cluster::membership::away_after(c.gossip_interval, c.phi_threshold);
    (away + away / 2).as_millis() as u64
}

pub fn check(s: &Schedule, events: &[(u64, usize, Event)], rings: &[Standing]) -> Vec<Violation> {
    let mut out = Vec::new();
    let everyone: BTreeSet<String> = (0..s.nodes).map(|n| format!("n{n}")).collect();
    // One ring: the same members at the same generations everywhere, every
    // node in it, and nobody suspected (a suspect keeps its place in the
    // ring until buried: a split no majority can settle still lists all).
    let first: Option<BTreeSet<&(String, u64)>> = rings.first().map(|r| r.ring.iter().collect());
    for r in rings {
        let ring: BTreeSet<&(String, u64)> = r.ring.iter().collect();
        let ids: BTreeSet<String> = r.ring.iter().map(|(id, _)| id.clone()).collect();
        if ids != everyone || Some(&ring) != first.as_ref() || !r.suspects.is_empty() {
            out.push(Violation {
                key: None,
                what: format!(
                    "split: n{}'s ring at the end is {:?}, suspecting {:?} (n{}'s: {:?})",
                    r.node, r.ring, r.suspects, rings[0].node, rings[0].ring
                ),
            });
        }
    }
    let tolerated = stall_tolerated();
    for &(at, n, e) in events {
        if e != Event::Rejoined {
            continue;
        }
        let at_ms = at / 1_000_000;
        let explained = s.faults.iter().any(|f| {
            if !f.nodes().contains(&n) || f.at() > at_ms {
                return false;
            }
            match f {
                // A stall explains a rejoin soon after it, if it was long.
                Fault::Pause { span, .. } | Fault::Suspend { span, .. } => {
                    *span >= tolerated && f.end() + STALL_EXPLAINS_FOR >= at_ms
                }
                // An operator's reset or a config reload buries no one.
                Fault::Reset { .. } | Fault::Reload { .. } => false,
                _ => f.end() + EXPLAINS_FOR >= at_ms,
            }
        });
        if !explained {
            out.push(Violation {
                key: None,
                what: format!(
                    "n{n} rejoined at {at_ms} ms with no stall of {tolerated} ms or more on it ending in the {} s before, nor other fault in the {} s before: buried for being slow",
                    STALL_EXPLAINS_FOR / 1_000,
                    EXPLAINS_FOR / 1_000
                ),
            });
        }
    }
    out
}
