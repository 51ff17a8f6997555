//! Whether this node reaches a majority of its ring by peer calls.
//!
//! Gossip tells a node it is cut off when it stops hearing a majority
//! (`membership/hearing.rs`). A node whose *outbound* packets are lost —
//! gossip and gRPC alike — still hears every peer (chitchat moves
//! heartbeats on the digests their messages carry), so it never finds
//! itself deaf; the others bury it after failure detection and decide its
//! keys from their replicas while it keeps deciding them as owner, its
//! replication failing. Nothing it admits then reaches anyone: the
//! simulator found this in four of a hundred seeds (119, 151, 176, 197:
//! one node's outbound cut for 3–6 s, counts rolled back, `deny` keys past
//! their limit).
//!
//! Its own calls say it: every call to a majority of the ring fails. A
//! **streak** is a peer's failed calls with no success between them (a
//! refusal is an answer: only an unreachable peer counts, as for the
//! breaker). When at least half the ring's other members have streaks
//! older than `after`, and the latest failure is recent (`fresh`: calls
//! are still failing, not merely none made since), this node owns nothing
//! and decides on leases, as a node cut off by gossip does. A success
//! ends that peer's streak at once.
//!
//! `after` is the gossip rule's deafness threshold (half again
//! `away_after`): short of the others' failure detection, so the node
//! stops owning before they take its keys over, and long enough that a
//! few slow calls on a loaded machine do not fence a healthy node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// No majority of streaks (the value of `since`).
const NONE: u64 = u64::MAX;

/// Streaks of failed calls per peer, and whether they add up to a node
/// cut off. Cheap to read on every decision (two atomic loads).
#[derive(Debug)]
pub struct Reach {
    /// Instants are kept as nanoseconds since this one.
    base: Instant,
    after: u64,
    fresh: u64,
    /// A std Mutex: taken on a failure, on a success that ends a streak,
    /// and on a ring change; never across an await.
    streaks: Mutex<Streaks>,
    /// When the streaks first covered half the ring's other members (the
    /// start of the one that made it half), or [`NONE`].
    since: AtomicU64,
    /// The latest failed call, or 0.
    last_failure: AtomicU64,
    /// Whether any peer has a streak (a success reads this first).
    any: AtomicBool,
    /// A warning is out for this spell.
    warned: AtomicBool,
}

#[derive(Debug, Default)]
struct Streaks {
    /// The ring's other members.
    members: Vec<Arc<str>>,
    /// Each failing peer's streak start.
    start: HashMap<Arc<str>, u64>,
}

impl Reach {
    pub fn new(after: Duration, fresh: Duration) -> Reach {
        Reach {
            base: Instant::now(),
            after: after.as_nanos() as u64,
            fresh: fresh.as_nanos() as u64,
            streaks: Mutex::default(),
            since: AtomicU64::new(NONE),
            last_failure: AtomicU64::new(0),
            any: AtomicBool::new(false),
            warned: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        // At least 1: 0 means "never" in `last_failure`.
        (self.base.elapsed().as_nanos() as u64).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Streaks> {
        self.streaks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ring's other members now: streaks of members gone are dropped.
    pub fn follow(&self, members: impl Iterator<Item = Arc<str>>) {
        let mut s = self.lock();
        s.members = members.collect();
        let Streaks { members, start } = &mut *s;
        start.retain(|id, _| members.contains(id));
        self.settle(&s);
    }

    /// A call to `peer` went out and came back (`reached`: it answered,
    /// even with a refusal) or did not.
    pub fn record(&self, peer: &Arc<str>, reached: bool) {
        self.record_at(peer, reached, self.now())
    }

    /// [`Reach::record`] at `now` (ns since `base`).
    fn record_at(&self, peer: &Arc<str>, reached: bool, now: u64) {
        if reached {
            if !self.any.load(Ordering::Acquire) {
                return;
            }
            let mut s = self.lock();
            if s.start.remove(peer).is_some() {
                self.settle(&s);
            }
            return;
        }
        self.last_failure.store(now.max(1), Ordering::Release);
        let mut s = self.lock();
        if s.members.contains(peer) && !s.start.contains_key(peer) {
            s.start.insert(peer.clone(), now);
            self.settle(&s);
        }
    }

    /// Recompute `since` and `any` from the streaks (under the lock).
    fn settle(&self, s: &Streaks) {
        self.any.store(!s.start.is_empty(), Ordering::Release);
        // The ring with this node: cut off when the members it reaches,
        // itself included, are at most half — as the gossip rule counts.
        let size = s.members.len() + 1;
        let needed = size.div_ceil(2);
        let mut starts: Vec<u64> = s.start.values().copied().collect();
        starts.sort_unstable();
        let since = if size > 1 && starts.len() >= needed {
            starts[needed - 1]
        } else {
            NONE
        };
        self.since.store(since, Ordering::Release);
        if since == NONE {
            self.warned.store(false, Ordering::Relaxed);
        }
    }

    /// Whether this node's calls to a majority of its ring have failed
    /// for `after`, and still fail.
    pub fn cut_off(&self) -> bool {
        self.cut_off_at(self.now())
    }

    /// [`Reach::cut_off`] at `now` (ns since `base`).
    fn cut_off_at(&self, now: u64) -> bool {
        let since = self.since.load(Ordering::Acquire);
        if since == NONE {
            return false;
        }
        let last = self.last_failure.load(Ordering::Acquire);
        let cut = now.saturating_sub(since) >= self.after && now.saturating_sub(last) < self.fresh;
        if cut && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "calls to half the ring or more have failed for a while: owning nothing until one answers (this node's outbound traffic may be lost)"
            );
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test's clock, in ms (read as ns).
    struct Clock(u64);

    impl Clock {
        fn advance(&mut self, ms: u64) {
            self.0 += ms;
        }
        fn now(&self) -> u64 {
            self.0 * 1_000_000
        }
    }

    fn ids(n: usize) -> Vec<Arc<str>> {
        (0..n).map(|i| Arc::from(format!("n{i}"))).collect()
    }

    #[test]
    fn half_the_ring_failing_for_a_while_cuts_this_node_off() {
        let reach = Reach::new(Duration::from_millis(600), Duration::from_secs(3));
        let mut t = Clock(1);
        // This node and three peers.
        let peers = ids(3);
        reach.follow(peers.iter().cloned());
        reach.record_at(&peers[0], false, t.now());
        t.advance(700);
        assert!(
            !reach.cut_off_at(t.now()),
            "one of three peers failing is not half"
        );
        reach.record_at(&peers[1], false, t.now());
        assert!(
            !reach.cut_off_at(t.now()),
            "two failing, but the second only now"
        );
        t.advance(599);
        reach.record_at(&peers[1], false, t.now());
        assert!(!reach.cut_off_at(t.now()), "not yet for `after`");
        t.advance(1);
        assert!(
            reach.cut_off_at(t.now()),
            "two of four (itself included) reached"
        );
        // One answer ends its streak: three of four reached.
        reach.record_at(&peers[0], true, t.now());
        assert!(!reach.cut_off_at(t.now()));
    }

    #[test]
    fn a_success_between_failures_ends_the_streak() {
        let reach = Reach::new(Duration::from_millis(600), Duration::from_secs(3));
        let mut t = Clock(1);
        let peers = ids(3);
        reach.follow(peers.iter().cloned());
        reach.record_at(&peers[1], false, t.now());
        reach.record_at(&peers[0], false, t.now());
        t.advance(500);
        reach.record_at(&peers[0], true, t.now());
        reach.record_at(&peers[0], false, t.now());
        t.advance(500);
        reach.record_at(&peers[0], false, t.now());
        assert!(
            !reach.cut_off_at(t.now()),
            "n0's streak began 500 ms ago, not 1 s"
        );
        t.advance(100);
        assert!(reach.cut_off_at(t.now()));
    }

    #[test]
    fn no_call_failing_lately_is_no_evidence() {
        let reach = Reach::new(Duration::from_millis(600), Duration::from_secs(3));
        let mut t = Clock(1);
        // Two nodes: the one peer is half the ring.
        let peers = ids(1);
        reach.follow(peers.iter().cloned());
        reach.record_at(&peers[0], false, t.now());
        t.advance(1_000);
        assert!(reach.cut_off_at(t.now()));
        // Nothing called since: the node owns again, and the next failed
        // call cuts it off at once (the streak never ended).
        t.advance(3_000);
        assert!(!reach.cut_off_at(t.now()));
        reach.record_at(&peers[0], false, t.now());
        assert!(reach.cut_off_at(t.now()));
    }

    #[test]
    fn members_gone_from_the_ring_take_their_streaks() {
        let reach = Reach::new(Duration::from_millis(600), Duration::from_secs(3));
        let mut t = Clock(1);
        let peers = ids(3);
        reach.follow(peers.iter().cloned());
        reach.record_at(&peers[0], false, t.now());
        reach.record_at(&peers[1], false, t.now());
        t.advance(1_000);
        reach.record_at(&peers[1], false, t.now());
        assert!(reach.cut_off_at(t.now()));
        // Both failing peers buried: the ring is this node and n2.
        reach.follow([peers[2].clone()].into_iter());
        assert!(!reach.cut_off_at(t.now()));
        // A peer not in the ring starts no streak.
        reach.record_at(&peers[0], false, t.now());
        assert!(!reach.cut_off_at(t.now()));
    }
}
