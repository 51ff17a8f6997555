//! What a decision answers — its status and the reason for it — named in
//! one place that depends on nothing, so the limiter that decides, the
//! services that put it on the wire and the metrics that count it share
//! one definition without importing each other.

/// The answer's status (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    UnderLimit,
    OverLimit,
    Unavailable,
}

/// Why — a superset of the algorithm's reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    WithinLimit,
    LimitExceeded,
    CostExceedsCapacity,
    OwnerUnreachable,
    Overloaded,
    /// Shadow mode: would have been refused, allowed anyway.
    Shadow,
    /// This node is still joining its cluster and cannot name the key's
    /// owner yet: nothing decided; ask another node.
    NotReady,
}

impl Reason {
    pub const ALL: [Reason; 7] = [
        Reason::WithinLimit,
        Reason::LimitExceeded,
        Reason::CostExceedsCapacity,
        Reason::OwnerUnreachable,
        Reason::Overloaded,
        Reason::Shadow,
        Reason::NotReady,
    ];

    pub fn status(self) -> Status {
        match self {
            Reason::WithinLimit | Reason::Shadow => Status::UnderLimit,
            Reason::LimitExceeded | Reason::CostExceedsCapacity => Status::OverLimit,
            Reason::OwnerUnreachable | Reason::Overloaded | Reason::NotReady => Status::Unavailable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Reason::WithinLimit => "within_limit",
            Reason::LimitExceeded => "limit_exceeded",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::OwnerUnreachable => "owner_unreachable",
            Reason::Overloaded => "overloaded",
            Reason::Shadow => "shadow",
            Reason::NotReady => "not_ready",
        }
    }
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::UnderLimit => "under_limit",
            Status::OverLimit => "over_limit",
            Status::Unavailable => "unavailable",
        }
    }
}
