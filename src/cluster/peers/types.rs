//! The peer protocol's domain types: what the limiter hands `Peers` and
//! what comes back. The protobuf messages stay inside `cluster::peers`
//! (`codec.rs` converts), so the limiter never builds a wire type.

use std::sync::Arc;

use crate::algorithm::{Decision, Nanos, Spec};
use crate::proto::peer as pb;
use crate::store::Snapshot;

/// Tiered mode: an edge's next allotment as its owner sends it — for `ttl`
/// from when the edge receives it (relative: the two nodes' clocks need
/// not agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// Tokens to spend now.
    pub amount: u64,
    pub ttl: Nanos,
    /// Tokens more that come due evenly over the `ttl`.
    pub paced: u64,
}

impl Granted {
    /// The grant on the receiver's clock, received at `now`.
    pub fn at(self, now: Nanos) -> crate::lease::tiered::Grant {
        crate::lease::tiered::Grant {
            amount: self.amount,
            expires: now.saturating_add(self.ttl),
            paced: self.paced,
        }
    }
}

/// One check sent to its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub name: String,
    pub unique_key: String,
    /// The resolved limit: it travels whole, so owner and edge agree.
    pub spec: Spec,
    pub hits: u64,
    pub drain_over_limit: bool,
    pub nodelay: bool,
    /// Sent again after a redirect (the owner's ring named another node).
    pub redirected: bool,
    /// How long the edge still waits: the owner's only notion of the
    /// deadline (a relative budget, so the two clocks need not agree).
    pub budget_ns: Nanos,
    /// The same deadline as an instant on this node's clock, read only by
    /// protocol-2 owners, which predate budgets.
    pub deadline_ns: Nanos,
    /// Tiered mode: this edge's ask for its next allotment.
    pub tiered: Option<TieredAsk>,
    /// Synchronous replication: the owner answers once its replica holder
    /// acknowledged the decision, else `Unavailable`.
    pub sync_replica: bool,
}

/// An edge's ask for its next tiered allotment of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieredAsk {
    /// What the edge expects to need over the allotment's life.
    pub demand: u64,
    /// What is left of its current allotment (returned to the owner).
    pub unused: u64,
    /// Some(true): the grant may carry a pace, replacing the edge's last
    /// (no other such ask of the edge is in flight); Some(false): sent
    /// while that one is in flight, tokens only; None: an older edge.
    pub pace: Option<bool>,
}

/// Why states are pushed to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncKind {
    /// The owner's copy for its successor.
    Replica,
    /// A key's state for its new owner.
    Handoff,
}

/// A key's state encoded for a push: built once, sized for chunking,
/// sent as is.
#[derive(Clone, Debug)]
pub struct Outgoing(pub(super) pb::KeyState);

impl Outgoing {
    /// Its bytes on the wire.
    pub fn size(&self) -> usize {
        use prost::Message;
        self.0.encoded_len()
    }
}

/// What an owner does with a forwarded item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// Decided by this node, the key's owner.
    Decided {
        decision: Decision,
        approximate: bool,
        /// Tiered mode: the asking edge's next allotment.
        grant: Option<Granted>,
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

/// What an owner did with an edge's lease report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportOutcome {
    Applied,
    /// At or below the last sequence the owner applied from this edge
    /// (`applied`; 0 from an owner that does not say): a retry, not counted
    /// again — or, answering a report's first sending, this edge's
    /// numbering restarted lower (`lease::Leases::renumber`).
    Duplicate {
        applied: u64,
    },
    /// Not this node's key: the edge sends it to the owner.
    NotOwner,
    /// Not yet: the key is still coming to this node from its previous
    /// holders (or this node may own nothing right now). Resent later; not
    /// a failure.
    Retry,
    /// Spent before the key's last reset: dropped.
    Stale,
    /// The owner could not read it (a malformed item): kept and resent,
    /// never taken for a success.
    Invalid,
}

impl ReportOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ReportOutcome::Applied => "applied",
            ReportOutcome::Duplicate { .. } => "duplicate",
            ReportOutcome::NotOwner => "not_owner",
            ReportOutcome::Retry => "retry",
            ReportOutcome::Stale => "stale",
            ReportOutcome::Invalid => "invalid",
        }
    }

    /// The edge may forget the report.
    pub fn acknowledged(self) -> bool {
        matches!(
            self,
            ReportOutcome::Applied | ReportOutcome::Duplicate { .. } | ReportOutcome::Stale
        )
    }
}

/// Why a forward produced no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("peer {0} is not in the ring")]
    UnknownPeer(String),
    #[error("queue to peer {0} is full")]
    QueueFull(String),
    #[error("peer {peer} did not answer: {reason}")]
    Unreachable { peer: String, reason: String },
    #[error("the breaker for peer {0} is open")]
    BreakerOpen(String),
    /// The peer answered, refusing the call for its size or shape: it is
    /// reachable (no breaker failure), the call must change.
    #[error("peer {peer} refused the call: {reason}")]
    Refused { peer: String, reason: String },
    /// The peer answered the item with an error (it counted nothing).
    #[error("peer {peer} refused the item: {reason}")]
    BadAnswer { peer: String, reason: String },
    /// The peer decided the item, but its answer does not read: it may
    /// have counted the hit.
    #[error("peer {peer} sent a malformed decision: {reason}")]
    Malformed { peer: String, reason: String },
}

/// A state received from a peer (a pull or a transfer page).
#[derive(Clone, Debug)]
pub struct Received {
    /// The encoded key.
    pub key: Vec<u8>,
    pub snapshot: Snapshot,
    /// The peer held it as a copy, not as the key's count.
    pub copy: bool,
}

/// What a pull brought.
#[derive(Debug)]
pub enum Pulled {
    /// One per key asked, in order: what the peer held.
    States(Vec<Option<Received>>),
    /// The peer's ring is not the puller's (yet): it took nothing.
    Mismatch,
}

/// One page of a transfer.
#[derive(Debug, Default)]
pub struct TransferPage {
    pub states: Vec<Received>,
    pub next: u64,
    pub done: bool,
    pub mismatch: bool,
    /// The holder's view `next` belongs to.
    pub holder_view: u64,
}

/// A key's owner's answer to a reset.
#[derive(Debug, PartialEq, Eq)]
pub enum ResetAnswer {
    Done {
        existed: bool,
    },
    /// Not the owner by its ring: this node is.
    Redirect(Arc<str>),
}
