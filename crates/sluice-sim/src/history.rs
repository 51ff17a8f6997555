//! What the apps saw: every call, its answer or its failure, at simulated
//! times — the checker's whole input besides the schedule, and what a
//! run's hash covers.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One `Check` of one key (one item), as its app saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub key: usize,
    /// The node the app asked.
    pub node: usize,
    /// Hits asked (0: a peek).
    pub hits: u64,
    /// Simulated ns.
    pub sent: u64,
    pub done: u64,
    pub outcome: Outcome,
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Answer {
        /// `UNDER_LIMIT`, `OVER_LIMIT`, `UNAVAILABLE`.
        status: Status,
        reason: i32,
        remaining: i64,
        approximate: bool,
        owner: String,
        path: i32,
    },
    /// An error or no answer in time: the call may or may not have been
    /// applied.
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    Under,
    Over,
    Unavailable,
}

impl Call {
    /// An exact, decided answer: `(remaining, admitted)`.
    pub fn exact(&self) -> Option<(i64, bool)> {
        match &self.outcome {
            Outcome::Answer {
                status,
                remaining,
                approximate: false,
                ..
            } if *status != Status::Unavailable => Some((*remaining, *status == Status::Under)),
            _ => None,
        }
    }

    pub fn admitted(&self) -> bool {
        self.hits > 0
            && matches!(
                self.outcome,
                Outcome::Answer {
                    status: Status::Under,
                    ..
                }
            )
    }

    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_))
    }

    pub fn owner(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Answer { owner, .. } => Some(owner),
            Outcome::Failed(_) => None,
        }
    }
}

fn ms(ns: u64) -> String {
    format!(
        "{}.{:03}",
        ns / 1_000_000_000 * 1_000 + ns % 1_000_000_000 / 1_000_000,
        ns / 1_000 % 1_000
    )
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {:>10} ms  done {:>10} ms  via n{}  hits {}  ",
            ms(self.sent),
            ms(self.done),
            self.node,
            self.hits
        )?;
        match &self.outcome {
            Outcome::Answer {
                status,
                remaining,
                approximate,
                owner,
                path,
                reason,
            } => write!(
                f,
                "{status:?} remaining {remaining}{} owner {owner:?} path {path} reason {reason}",
                if *approximate { " APPROX" } else { "" }
            ),
            Outcome::Failed(e) => write!(f, "FAILED {e}"),
        }
    }
}

/// One operator reset of a key (`ResetKey` through `node`), as the
/// operator saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reset {
    pub key: usize,
    pub node: usize,
    /// Simulated ns.
    pub sent: u64,
    pub done: u64,
    /// Whether the key existed at its owner; an error or no answer in
    /// time: the reset may or may not have been made, now or later (a
    /// paused node goes on with it when it resumes; see `check.rs`).
    pub outcome: Result<bool, String>,
}

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {:>10} ms  done {:>10} ms  via n{}  RESET {:?}",
            ms(self.sent),
            ms(self.done),
            self.node,
            self.outcome
        )
    }
}

/// Every call of a run, in completion order, and the operator's resets.
#[derive(Debug, Default)]
pub struct History {
    pub calls: Vec<Call>,
    pub resets: Vec<Reset>,
}

impl History {
    /// A hash of everything the apps saw: two runs of one schedule must
    /// agree on it (the simulation is deterministic).
    pub fn hash(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for c in &self.calls {
            h.update(format!("{c:?}\n").as_bytes());
        }
        for r in &self.resets {
            h.update(format!("{r:?}\n").as_bytes());
        }
        h.digest()
    }
}
