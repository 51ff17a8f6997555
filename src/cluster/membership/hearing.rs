//! What this node has heard from its peers lately: whether it hears a
//! majority (else it owns nothing — cut off, it stops deciding before the
//! others could bury it), and, back from being away, whether it has heard
//! a majority since (past what queued up while it was away) — see
//! `gossip.rs`.
//!
//! **Heard means a round trip.** Chitchat moves a member's heartbeat on a
//! mere digest — the first message of a round, which needs nothing from
//! this node — but its key-values only in the replies to this node's own
//! messages. A node whose outbound gossip is lost still sees every
//! heartbeat move, and no state at all: it must not count as hearing
//! anyone. So each member publishes a key, [`TICK`], every gossip round,
//! and a peer is heard when its state's version moves on. (A peer that
//! publishes no tick — the previous release, in a rolling upgrade — is
//! heard by its heartbeat, as before.) Only ready members of the view, at
//! their generation, count: the ones that could vote to bury this node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chitchat::{ChitchatId, Heartbeat, NodeState, Version};

use super::Lifecycle;
use super::view::{ClusterView, TICK};

/// How far a member's state has come, as this node read it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Pulse {
    version: Version,
    heartbeat: Heartbeat,
    ticks: bool,
}

impl Pulse {
    fn of(s: &NodeState) -> Pulse {
        Pulse {
            version: s.max_version(),
            heartbeat: s.heartbeat(),
            ticks: s.get(TICK).is_some(),
        }
    }

    /// `self` came in after `before`: state (or, from a peer that does not
    /// tick, a heartbeat) that needed a round trip.
    fn moved_on(&self, before: &Pulse) -> bool {
        if self.ticks {
            self.version > before.version
        } else {
            self.heartbeat > before.heartbeat
        }
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

/// When each peer was last heard from.
#[derive(Default)]
pub(super) struct Hearing {
    /// Each peer's pulse, and when it last moved on (`None`: not since it
    /// was first read).
    last: BTreeMap<ChitchatId, (Pulse, Option<tokio::time::Instant>)>,
}

impl Hearing {
    pub(super) fn observe(&mut self, cc: &chitchat::Chitchat) {
        let now = tokio::time::Instant::now();
        let me = cc.self_chitchat_id();
        let states = cc.node_states();
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
        match &self.baseline {
            None => {
                self.baseline = Some(peers.map(|(id, s)| (id.clone(), Pulse::of(s))).collect());
            }
            Some(base) => {
                for (id, s) in peers {
                    if base.get(id).is_some_and(|b| Pulse::of(s).moved_on(b)) {
                        self.heard.insert(id.clone());
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
