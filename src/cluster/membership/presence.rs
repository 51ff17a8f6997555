//! Whether this node may decide keys as their owner right now.
//!
//! A node owns keys only while it is `ready` **and present**: its gossip
//! loop has run recently. A node that was stopped (a long GC pause, a VM
//! stall, `SIGSTOP`, `docker pause`) past the failure detector's patience has
//! been declared dead by its peers, and another node owns its keys; when it
//! resumes, its own view is stale and its counts are old. Each gossip round
//! stamps a clock that keeps counting while the process (or the machine) is
//! suspended — `CLOCK_BOOTTIME`, unlike `Instant`, which stops across a
//! system suspend — and the request path reads that stamp: a stamp older
//! than half the failure-detection time means "I may have been away",
//! and the node decides nothing as owner until the gossip loop has rejoined
//! it as a new member (`gossip.rs`).
//!
//! Cheap on the request path: one clock read per batch and two atomic loads.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use super::Lifecycle;
use crate::clock::SharedClock;

/// This node's presence: its lifecycle state and its gossip loop's last
/// stamp. Shared by the gossip thread (which writes it) and the limiter and
/// the health endpoints (which read it).
#[derive(Debug)]
pub struct Presence {
    state: AtomicU8,
    /// The boot clock ([`crate::clock::Clock::boot`]) at the gossip loop's
    /// last round.
    stamp: AtomicU64,
    /// A stamp older than this (ns) means the node may have been away.
    away_after: u64,
    /// This run's gossip generation (a rejoin is a new one).
    generation: AtomicU64,
    /// The node's clock: its boot clock stamps the rounds.
    clock: SharedClock,
}

impl Presence {
    pub fn new(away_after: u64, generation: u64, clock: SharedClock) -> Presence {
        Presence {
            state: AtomicU8::new(Lifecycle::Joining as u8),
            stamp: AtomicU64::new(clock.boot()),
            away_after,
            generation: AtomicU64::new(generation),
            clock,
        }
    }

    /// The boot clock now: what rounds are stamped with.
    pub fn boot(&self) -> u64 {
        self.clock.boot()
    }

    pub fn lifecycle(&self) -> Lifecycle {
        match self.state.load(Ordering::SeqCst) {
            x if x == Lifecycle::Ready as u8 => Lifecycle::Ready,
            x if x == Lifecycle::Leaving as u8 => Lifecycle::Leaving,
            x if x == Lifecycle::Left as u8 => Lifecycle::Left,
            _ => Lifecycle::Joining,
        }
    }

    pub(super) fn set_lifecycle(&self, state: Lifecycle) {
        self.state.store(state as u8, Ordering::SeqCst);
    }

    /// A state change that only applies if the state is still `from`
    /// (a rejoin turning ready must not undo a `leaving` set meanwhile).
    pub(super) fn advance(&self, from: Lifecycle, to: Lifecycle) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub(super) fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::SeqCst);
    }

    /// The gossip loop runs at `now` (a [`Presence::boot`] reading). If its previous
    /// round is older than `away_after`, this node may have been away: a
    /// ready node turns `joining` *before* the fresh stamp is written (a
    /// request reads the stamp first, then the state: it never sees a fresh
    /// stamp with the old `ready`). Returns the gap, and the state it had.
    pub(super) fn round(&self, now: u64) -> (u64, Lifecycle) {
        let gap = now.saturating_sub(self.stamp.load(Ordering::SeqCst));
        let was = self.lifecycle();
        if gap >= self.away_after && was == Lifecycle::Ready {
            self.set_lifecycle(Lifecycle::Joining);
        }
        self.stamp.store(now, Ordering::SeqCst);
        (gap, was)
    }

    pub fn away_after(&self) -> u64 {
        self.away_after
    }

    /// Whether the gossip loop ran within `away_after` of `now`.
    pub fn present(&self, now: u64) -> bool {
        now.saturating_sub(self.stamp.load(Ordering::SeqCst)) < self.away_after
    }

    /// Ready and present: may decide keys as their owner. The stamp is read
    /// before the state (see [`Presence::round`]).
    pub fn may_own(&self, now: u64) -> bool {
        self.present(now) && self.lifecycle() == Lifecycle::Ready
    }

    /// [`Presence::may_own`] now: what readiness probes report.
    pub fn is_ready(&self) -> bool {
        self.may_own(self.boot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SystemClock, boot_time};

    #[test]
    fn boot_time_moves_forward() {
        let a = boot_time();
        let b = boot_time();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn a_stale_stamp_means_away() {
        let p = Presence::new(1_000, 7, std::sync::Arc::new(SystemClock::new()));
        assert!(!p.may_own(p.boot()), "joining owns nothing");
        // Stamped while still joining (no transition), then ready: the
        // real time since `new` never enters the figures (on a loaded
        // machine it can exceed the 1 µs `away_after` of this test).
        let now = p.boot();
        assert_eq!(p.round(now).1, Lifecycle::Joining);
        p.set_lifecycle(Lifecycle::Ready);
        assert!(p.may_own(now + 999));
        assert!(!p.may_own(now + 1_000), "a stamp as old as away_after");
        assert_eq!(p.round(now + 500), (500, Lifecycle::Ready));
        assert_eq!(
            p.round(now + 5_500),
            (5_000, Lifecycle::Ready),
            "the gap is reported"
        );
        assert!(
            !p.may_own(now + 5_500),
            "back from away: joining, though the stamp is fresh"
        );
        p.set_lifecycle(Lifecycle::Ready);
        assert!(p.advance(Lifecycle::Ready, Lifecycle::Leaving));
        assert!(!p.advance(Lifecycle::Joining, Lifecycle::Ready));
        assert_eq!(p.lifecycle(), Lifecycle::Leaving);
        assert!(!p.may_own(now + 5_000), "a leaving node owns nothing");
    }
}
