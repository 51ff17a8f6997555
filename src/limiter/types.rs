//! The limiter's domain types: what services hand it and what it answers.

use std::sync::Arc;

use crate::algorithm::{Cost, Decision, Spec};
use crate::policy::OnOwnerUnreachable;
pub use crate::policy::{Mode, Replication};
pub use crate::verdict::{Reason, Status};

/// Which limit a check is against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitRef {
    Inline(Spec),
    Policy(String),
    /// An Envoy descriptor rule, already matched.
    Rule(Arc<crate::policy::rules::RuleLimit>),
}

/// One validated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub unique_key: String,
    pub limit: LimitRef,
    pub request: Cost,
    /// Forward at once instead of waiting for a batch (latency over throughput).
    pub unbatched: bool,
    /// Overrides the policy's choice when the owner is unreachable.
    pub on_owner_unreachable: Option<OnOwnerUnreachable>,
    /// Overrides the policy's mode.
    pub mode: Option<Mode>,
    /// Overrides the policy's replication.
    pub replication: Option<Replication>,
}

/// Which path decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The key's owner, here or by a forward.
    Owner,
    /// Tiered mode: this node's allotment, no hop.
    LocalAllotment,
    /// Tiered mode: the allotment ran out; the owner decided and granted.
    Slow,
    /// The owner could not be reached: the fallback.
    Fallback,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Owner => "owner",
            Path::LocalAllotment => "local_allotment",
            Path::Slow => "slow",
            Path::Fallback => "fallback",
        }
    }
}

/// The answer to one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    pub reason: Reason,
    pub decision: Decision,
    /// Decided on a lease rather than by the owner.
    pub approximate: bool,
    pub owner: Arc<str>,
    /// The limit's name for headers: a policy's or a rule's; `None` for an
    /// inline limit, whose name is the request's own `name` (the caller has
    /// it — not copied into every answer: an allocation per decision).
    pub label: Option<Arc<str>>,
    /// The limit's period in ns (a calendar window: its nominal length).
    pub window: crate::algorithm::Nanos,
    /// Which path decided.
    pub path: Path,
}

/// A request that could not be decided, naming the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ItemError {
    pub field: &'static str,
    pub message: String,
}

impl ItemError {
    pub fn new(field: &'static str, message: impl Into<String>) -> ItemError {
        ItemError {
            field,
            message: message.into(),
        }
    }
}

/// One lease report, as the owner absorbs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Absorb<'a> {
    /// The reporting edge's node id.
    pub edge: &'a str,
    /// Grows with every report the edge cuts.
    pub seq: u64,
    pub hits: u64,
    /// When the last of the hits was admitted (the edge's clock).
    pub at: crate::algorithm::Nanos,
    /// The key's reset generation the edge spent under (None from a
    /// protocol-2 edge).
    pub reset_gen: Option<u64>,
}
