//! The store's small public types: how a key starts, the ownership fence,
//! what became of a report, how a merged state is held, what top keys rank
//! by, and the store's own counters. Kept apart so `mod.rs` is the table.

use std::sync::atomic::AtomicU64;

use crate::algorithm::Nanos;

/// How a key not in memory starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    /// Nothing consumed (a key nobody has seen).
    Fresh,
    /// This many whole tokens already consumed, at the decision's time (a
    /// lease on a key its edge never saw starts empty).
    Consumed(u64),
}

/// The view a decision was routed under is no longer this node's (or the
/// node may have been away since): nothing was changed; route it again.
/// See [`Store::set_fence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale;

/// What an owner's change must still hold, checked under the key's lock.
#[derive(Clone, Copy)]
pub struct Fence<'a> {
    /// The view the change was routed under.
    pub view: u64,
    /// Whether this node may still own keys — read under the lock, so a
    /// decision routed before the process was stopped, and made after it
    /// resumed, sees the pause (its gossip loop has not run since).
    pub present: &'a (dyn Fn() -> bool + Sync),
}

impl std::fmt::Debug for Fence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence").field("view", &self.view).finish()
    }
}

/// What became of an edge's report of lease spending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Absorbed {
    Applied,
    /// At or below the last sequence applied from this edge (`applied`):
    /// a retry, not counted again — or, on a report's first sending, an
    /// edge whose numbering restarted lower (see `lease::Leases::renumber`).
    Duplicate {
        applied: u64,
    },
    /// Spent before the key's last reset: dropped.
    BeforeReset,
}

/// How a merged state is held here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holding {
    /// As the key's count: a holder passed its own count on to this node,
    /// the owner, in the ownership transfer.
    Owned,
    /// As a copy (a replica, a handoff, or a holder's own copy): a new entry
    /// is a copy, an existing one stays what it was.
    Copy,
}

/// One report of lease spending, as the owner absorbs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report<'a> {
    pub edge: &'a str,
    pub seq: u64,
    pub hits: u64,
    pub at: Nanos,
    /// The key's reset generation the edge spent under (None: a peer too
    /// old to say, applied as before).
    pub reset_gen: Option<u64>,
}

/// What to rank top keys by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopBy {
    Hits,
    Refusals,
}

/// Counters the store keeps about itself.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Keys evicted, for either bound.
    pub evictions: AtomicU64,
    /// Of `evictions`, those made for the byte budget (the keys were
    /// within `max_keys`).
    pub memory_evictions: AtomicU64,
    /// Of `evictions`, keys that were not back to fresh: each one's count
    /// is gone, and its callers start again from a full limit.
    pub evictions_counting: AtomicU64,
    pub expired: AtomicU64,
}
