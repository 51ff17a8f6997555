//! What the cluster's membership must come to, whatever the schedule
//! (issue 49, "No meltdown"): one cluster at the end, and no node buried
//! for a stall it should have outlasted.
//!
//! - **One ring.** Every fault is over by `heal` and the run goes on 12 s
//!   more: at its end every running node's ring holds every node.
//! - **Being slow is not being dead.** A node rejoins (a new generation)
//!   only when a majority buried it. A stall shorter than
//!   [`stall_tolerated`] is short of failure detection with room to
//!   spare: a rejoin with nothing else in the 15 s before it touching that
//!   node — no longer stall, no cut, loss, slowness or clock step — is a
//!   node buried for being slow.

use crate::check::Violation;
use crate::schedule::{Fault, Schedule};
use crate::sim::Event;

/// How far back (ms) a fault may explain a rejoin: detection, a burial's
/// votes and a rejoin, with room for a loaded cluster.
const EXPLAINS_FOR: u64 = 15_000;

/// The longest stall (ms) no node may be buried for: one and a half
/// `away_after` (600 ms at the defaults; failure detection is ~0.8 s).
pub fn stall_tolerated() -> u64 {
    let c = sluice::config::ClusterConfig::default();
    let away = sluice::cluster::membership::away_after(c.gossip_interval, c.phi_threshold);
    (away + away / 2).as_millis() as u64
}

pub fn check(
    s: &Schedule,
    events: &[(u64, usize, Event)],
    rings: &[(usize, Vec<String>)],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut everyone: Vec<String> = (0..s.nodes).map(|n| format!("n{n}")).collect();
    everyone.sort();
    for (n, members) in rings {
        let mut members = members.clone();
        members.sort();
        if members != everyone {
            out.push(Violation {
                key: None,
                what: format!(
                    "split: n{n}'s ring at the end is {members:?}, not all {} nodes",
                    s.nodes
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
            let stall_too_short = match f {
                Fault::Pause { span, .. } | Fault::Suspend { span, .. } => *span < tolerated,
                _ => false,
            };
            f.nodes().contains(&n)
                && !stall_too_short
                && f.at() <= at_ms
                && f.end() + EXPLAINS_FOR >= at_ms
        });
        if !explained {
            out.push(Violation {
                key: None,
                what: format!(
                    "n{n} rejoined at {at_ms} ms with no fault on it in the {} s before but stalls under {tolerated} ms: buried for being slow",
                    EXPLAINS_FOR / 1_000
                ),
            });
        }
    }
    out
}
