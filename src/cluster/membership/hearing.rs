//! What this node has heard from its peers lately: whether it hears a
//! majority (else it owns nothing — cut off, it stops deciding before the
//! others could bury it), and, back from being away, whether it has heard
//! a majority since (past what queued up while it was away) — see
//! `gossip.rs`.
//!
//! **Heard means a heartbeat that moved on**, as any gossip message
//! reports it (a digest carries every member's): frequent enough that a
//! loaded machine does not cut its nodes off for nothing. It is not proof
//! of a round trip — chitchat moves heartbeats on a digest alone, so a
//! node whose outbound gossip is lost still hears everyone; that node
//! learns it was buried from its next peer call (the burial word, see
//! `gossip.rs`). A version-based tick, which needs a round trip, was
//! tried: within `away_after` it missed under CI's load and cut healthy
//! nodes off. Only ready members of the view, at their generation,
//! count: the ones that could vote to bury this node.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use chitchat::{ChitchatId, Heartbeat, NodeState};

use super::Lifecycle;
use super::view::ClusterView;

/// How far a member's heartbeat has come, as this node read it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Pulse(Heartbeat);

impl Pulse {
    fn of(s: &NodeState) -> Pulse {
        Pulse(s.heartbeat())
    }

    fn moved_on(&self, before: &Pulse) -> bool {
        self.0 > before.0
    }
}

/// Whether `id` is a ready member of `view` at that generation, not this
/// node: a member that could vote to bury it.
fn votes(view: &ClusterView, id: &ChitchatId) -> bool {
    id.node_id != view.self_id
        && view
            .member(&id.node_id)
            .is_some_and(|m| m.generation == id.generation_id && m.state == Lifecycle::Ready)
}

/// This node's own heartbeats kept to date its peers' word of it: this
/// long back, at most this many, one per this gap at most (readings come
/// on events too: a burst must not crowd the span out). A peer's word
/// older than every reading kept dates from before the oldest: the rule
/// fires for any `away_after` under the span (a cold review).
const MINE_KEPT: Duration = Duration::from_secs(30);
const MINE_MAX: usize = 4_096;
const MINE_GAP: Duration = Duration::from_millis(10);

/// When each peer was last heard from, and when this node was last heard
/// by any.
#[derive(Default)]
pub(super) struct Hearing {
    /// Each peer's pulse, and when it last moved on (`None`: not since it
    /// was first read).
    last: BTreeMap<ChitchatId, (Pulse, Option<tokio::time::Instant>)>,
    /// This node's heartbeat as each reading found it, oldest first.
    mine: VecDeque<(tokio::time::Instant, Heartbeat)>,
    /// The highest heartbeat of this node a peer's digest carried.
    heard_me: Heartbeat,
}

impl Hearing {
    pub(super) fn observe(&mut self, cc: &chitchat::Chitchat) {
        let now = tokio::time::Instant::now();
        let me = cc.self_chitchat_id();
        let states = cc.node_states();
        if let Some(s) = states.get(me)
            && self.mine.back().is_none_or(|&(at, h)| {
                h < s.heartbeat() && now.saturating_duration_since(at) >= MINE_GAP
            })
        {
            self.mine.push_back((now, s.heartbeat()));
        }
        while self.mine.len() > MINE_MAX
            || self
                .mine
                .front()
                .is_some_and(|&(at, _)| now.saturating_duration_since(at) > MINE_KEPT)
        {
            self.mine.pop_front();
        }
        self.heard_me = self.heard_me.max(cc.self_heartbeat_heard());
        self.last.retain(|id, _| states.contains_key(id));
        for (id, s) in states.iter().filter(|(id, _)| *id != me) {
            let pulse = Pulse::of(s);
            match self.last.get_mut(id) {
                Some(last) if pulse.moved_on(&last.0) => *last = (pulse, Some(now)),
                Some(_) => {}
                // A member first read is not yet heard from.
                None => {
                    self.last.insert(id.clone(), (pulse, None));
                }
            }
        }
    }

    /// How long since some peer last heard this node, as the digests it
    /// received say: the age of the newest heartbeat of its own any of
    /// them carried (dated by the reading that first found it, so a
    /// round late at most). A digest in answer to this node's own carries
    /// its heartbeat of that moment, so a node heard at all is heard
    /// within a round trip; a node whose outbound gossip is lost hears
    /// its peers (their digests move their heartbeats on) and learns from
    /// the same digests that none of them hears it.
    pub(super) fn unheard_for(&self) -> Duration {
        let now = tokio::time::Instant::now();
        match self.mine.iter().find(|&&(_, h)| h >= self.heard_me) {
            Some(&(at, _)) => now.saturating_duration_since(at),
            // Heard past every reading (or none yet): heard now.
            None => Duration::ZERO,
        }
    }

    /// Ready members of `view` heard from within `d`.
    pub(super) fn within(&self, d: Duration, view: &ClusterView) -> usize {
        let now = tokio::time::Instant::now();
        self.last
            .iter()
            .filter(|(id, _)| votes(view, id))
            .filter(|(_, (_, at))| at.is_some_and(|at| now.saturating_duration_since(at) < d))
            .count()
    }
}

/// A node back from being away: what it must hear before it owns again.
pub(super) struct Returning {
    /// What was read before this (a gossip interval after the return) may
    /// be what queued up while the node was away.
    after: tokio::time::Instant,
    /// Every peer's pulse as first read at or after `after`.
    baseline: Option<BTreeMap<ChitchatId, Pulse>>,
    /// Peers whose state has moved on past the baseline.
    heard: BTreeSet<ChitchatId>,
}

impl Returning {
    pub(super) fn new(after: tokio::time::Instant) -> Returning {
        Returning {
            after,
            baseline: None,
            heard: BTreeSet::new(),
        }
    }

    pub(super) fn observe(&mut self, cc: &chitchat::Chitchat) {
        if tokio::time::Instant::now() < self.after {
            return;
        }
        let me = cc.self_chitchat_id();
        let peers = cc.node_states().iter().filter(|(id, _)| *id != me);
        match &mut self.baseline {
            None => {
                self.baseline = Some(peers.map(|(id, s)| (id.clone(), Pulse::of(s))).collect());
            }
            Some(base) => {
                for (id, s) in peers {
                    match base.get(id) {
                        Some(b) => {
                            if Pulse::of(s).moved_on(b) {
                                self.heard.insert(id.clone());
                            }
                        }
                        // A member first read after the baseline (a peer
                        // restarted meanwhile: a new generation) has its
                        // baseline now. Without it, a node back from a pause
                        // while the peers that could vote were restarting
                        // never heard a majority and owned nothing for good
                        // (simulator seed 101).
                        None => {
                            base.insert(id.clone(), Pulse::of(s));
                        }
                    }
                }
            }
        }
    }

    /// A majority of the view's size heard from since the baseline, this
    /// node included, each a ready member that could have voted to bury
    /// it. A burial takes a majority's votes, so at least one voter was
    /// heard from after the return, its state with it — the tombstone,
    /// if it buried this node (not a proof: the simulator's pauses and
    /// one-way cuts hold it to account).
    pub(super) fn settled(&self, view: &ClusterView) -> bool {
        let heard = self.heard.iter().filter(|id| votes(view, id)).count();
        (heard + 1) * 2 > view.size
    }
}
