//! The limiter's domain types: what services hand it and what it answers.

use std::sync::Arc;

use crate::algorithm::{Decision, Request, Spec};
pub use crate::policy::Mode;
use crate::policy::OnOwnerUnreachable;
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
    pub request: Request,
    /// Forward at once instead of waiting for a batch (latency over throughput).
    pub unbatched: bool,
    /// Overrides the policy's choice when the owner is unreachable.
    pub on_owner_unreachable: Option<OnOwnerUnreachable>,
    /// Overrides the policy's mode.
    pub mode: Option<Mode>,
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

/// What an owner does with a forwarded item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// Decided by this node, the key's owner.
    Decided {
        decision: Decision,
        approximate: bool,
        /// Tiered mode: the asking edge's next allotment, `(amount, ttl)`.
        grant: Option<(u64, crate::algorithm::Nanos)>,
        /// The key's reset generation here (edges report under it).
        reset_gen: u64,
    },
    /// Not the owner by this node's ring: this node is.
    Redirect(Arc<str>),
    /// Arrived past its deadline: dropped, nothing consumed.
    Expired,
    /// This node cannot decide it now (not ready, away, or only a member it
    /// cannot reach could hold the count): nothing consumed; the edge
    /// decides without the owner.
    Unavailable,
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
    /// The limit's name (policy, rule or request name), for headers.
    pub label: Arc<str>,
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

/// What an owner did with an edge's lease report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportOutcome {
    Applied,
    /// Already applied: a retry, not counted again.
    Duplicate,
    /// Not this node's key: the edge sends it to the owner.
    NotOwner,
    /// Not yet: the key is still coming to this node from its previous
    /// holders (or this node may own nothing right now). Resent later; not
    /// a failure.
    Retry,
    /// Spent before the key's last reset: dropped.
    Stale,
}

impl ReportOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ReportOutcome::Applied => "applied",
            ReportOutcome::Duplicate => "duplicate",
            ReportOutcome::NotOwner => "not_owner",
            ReportOutcome::Retry => "retry",
            ReportOutcome::Stale => "stale",
        }
    }

    /// The edge may forget the report.
    pub fn acknowledged(self) -> bool {
        matches!(
            self,
            ReportOutcome::Applied | ReportOutcome::Duplicate | ReportOutcome::Stale
        )
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
