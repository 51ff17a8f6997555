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
//! and the node is **fenced**: it decides nothing as owner until gossip
//! tells whether the cluster declared it dead (then it rejoins as a new
//! member) or not (then it owns its keys again, as the same member) —
//! see `gossip.rs`. Being slow is not being dead: a stall alone never
//! makes a node rejoin.
//!
//! Cheap on the request path: one clock read per batch and two atomic loads.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

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
    /// Owns nothing for now, though ready: back from being away until
    /// gossip says whether it was declared dead, or suspected by nearly
    /// a majority (see `gossip.rs`).
    fenced: AtomicBool,
    /// Owns nothing for now, yet serves (on leases, as a minority does):
    /// it hears no majority, or nearly a majority suspects it.
    cut_off: AtomicBool,
    /// A generation of this node a peer refused a call from as buried
    /// (0: none). Gossip may never bring the tombstone — a node whose
    /// outbound gossip is lost hears no peer's state, only heartbeats —
    /// but a peer call's answer does.
    told_buried: AtomicU64,
    /// The generation this process's counts began at (gossip key `born`):
    /// its first, unless it rejoined past an earlier life of its id (then
    /// the rejoin's — generations between were that other process's).
    born: AtomicU64,
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
            born: AtomicU64::new(generation),
            fenced: AtomicBool::new(false),
            cut_off: AtomicBool::new(false),
            told_buried: AtomicU64::new(0),
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

    /// The generation this process's counts began at: every generation
    /// from it to [`Presence::generation`] is this process.
    pub fn born(&self) -> u64 {
        self.born.load(Ordering::SeqCst)
    }

    pub(super) fn set_born(&self, generation: u64) {
        self.born.store(generation, Ordering::SeqCst);
    }

    /// The gossip loop runs at `now` (a [`Presence::boot`] reading). If its previous
    /// round is older than `away_after`, this node may have been away: it
    /// is fenced *before* the fresh stamp is written (a request reads the
    /// stamp first, then the fence: it never sees a fresh stamp without
    /// the fence). Returns the gap.
    pub(super) fn round(&self, now: u64) -> u64 {
        let gap = now.saturating_sub(self.stamp.load(Ordering::SeqCst));
        if gap >= self.away_after {
            self.fenced.store(true, Ordering::SeqCst);
        }
        self.stamp.store(now, Ordering::SeqCst);
        gap
    }

    /// Fence this node (it owns nothing) or lift the fence.
    pub(super) fn set_fenced(&self, fenced: bool) {
        self.fenced.store(fenced, Ordering::SeqCst);
    }

    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Cut off (see the field), or not.
    pub(super) fn set_cut_off(&self, cut_off: bool) {
        self.cut_off.store(cut_off, Ordering::SeqCst);
    }

    pub fn cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }

    /// A peer refused a call from `generation` of this node as buried: if
    /// it is the current one, the node owns nothing from now and rejoins
    /// at its gossip loop's next round.
    pub fn told_buried(&self, generation: u64) {
        if generation != 0 && generation == self.generation() {
            self.told_buried.store(generation, Ordering::SeqCst);
        }
    }

    /// The current generation was reported buried by a peer.
    pub fn buried_by_word(&self) -> bool {
        let g = self.told_buried.load(Ordering::SeqCst);
        g != 0 && g == self.generation()
    }

    pub fn away_after(&self) -> u64 {
        self.away_after
    }

    /// Whether the gossip loop ran within `away_after` of `now`.
    pub fn present(&self, now: u64) -> bool {
        now.saturating_sub(self.stamp.load(Ordering::SeqCst)) < self.away_after
    }

    /// Ready, present, not fenced, not told buried: serves as a member
    /// (what readiness probes report), on leases if cut off. The stamp
    /// is read before the fence (see [`Presence::round`]).
    fn serving(&self, now: u64) -> bool {
        self.present(now)
            && !self.fenced()
            && !self.buried_by_word()
            && self.lifecycle() == Lifecycle::Ready
    }

    /// Serving and not cut off: may decide keys as their owner.
    pub fn may_own(&self, now: u64) -> bool {
        self.serving(now) && !self.cut_off()
    }

    /// Serving now: what readiness probes report. A node cut off serves
    /// on leases, as a minority always has, rather than leave the load
    /// balancer.
    pub fn is_ready(&self) -> bool {
        self.serving(self.boot())
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
        // Stamped while still joining, then ready, the fence lifted: the
        // real time since `new` never enters the figures (on a loaded
        // machine it can exceed the 1 µs `away_after` of this test).
        let now = p.boot();
        p.round(now);
        p.set_fenced(false);
        p.set_lifecycle(Lifecycle::Ready);
        assert!(p.may_own(now + 999));
        assert!(!p.may_own(now + 1_000), "a stamp as old as away_after");
        assert_eq!(p.round(now + 500), 500);
        assert!(p.may_own(now + 500), "a round within away_after");
        assert_eq!(p.round(now + 5_500), 5_000, "the gap is reported");
        assert!(
            !p.may_own(now + 5_500),
            "back from away: fenced, though the stamp is fresh"
        );
        assert_eq!(p.lifecycle(), Lifecycle::Ready, "slow is not dead");
        p.set_fenced(false);
        assert!(p.may_own(now + 5_500), "the fence lifted: owns again");
        p.told_buried(6);
        assert!(p.may_own(now + 5_500), "another generation's burial");
        p.told_buried(7);
        assert!(!p.may_own(now + 5_500), "told buried: owns nothing");
        assert!(p.buried_by_word());
        p.set_generation(8);
        assert!(!p.buried_by_word(), "a rejoin is a new generation");
        assert!(p.advance(Lifecycle::Ready, Lifecycle::Leaving));
        assert!(!p.advance(Lifecycle::Joining, Lifecycle::Ready));
        assert_eq!(p.lifecycle(), Lifecycle::Leaving);
        assert!(!p.may_own(now + 5_000), "a leaving node owns nothing");
    }
}
