//! The cluster as one node sees it, parsed from chitchat's key-values in
//! one place.
//!
//! **Tombstones.** A member declared dead is never admitted again under the
//! same `(node_id, generation)`: every node gossips the dead pairs its
//! failure detector reports (a bounded list, key `dead`), and a view leaves
//! out any member named in anyone's list. Without this, a node paused past
//! failure detection would come back into every ring as if nothing had
//! happened — with counts its successor has moved on from — and a ring
//! could repeat an earlier one (A → B → A), so a stale mark would pass as
//! current. A node that finds itself in a list rejoins as a new generation
//! (`gossip.rs`).
//!
//! **Burying takes a majority's word.** A node's failure detector only
//! *suspects* a member (key `suspects`, gossiped like the tombstones); the
//! member is buried once a majority of the cluster's size — this node and
//! the ready peers it hears — suspects it. One node's word is not enough:
//! a node cut off from everyone sees its peers die one failure-detector
//! round apart, so for a moment it "sees a majority" and would bury the
//! first to go — making a member of the real majority rejoin when the cut
//! heals, for nothing.
//!
//! **Rings change on burials, not on suspicions.** A suspected member that
//! was ready stays in the ring (flagged `suspected`) until it is buried:
//! no node takes its keys on its own failure detector's word, so a member
//! only slow, or heard by some and not others, is never decided for by
//! two nodes at once. Its keys are unreachable meanwhile (forwards fail,
//! breakers open: leases), and the minority rule counts only the ready
//! members this node hears. The member itself is fenced while nearly a
//! majority suspects it (`self_suspected`), before anyone could bury it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use chitchat::{ChitchatId, NodeState};

use super::Lifecycle;
use super::doubts::PublishedDoubt;
use super::generations::{Generation, cluster_size, newest_generations, one_per_node};
use crate::cluster::ring::{Member, Ring};
use crate::proto::PEER_PROTOCOL_VERSION;

/// Gossip keys.
pub(super) const GRPC_ADDR: &str = "grpc_addr";
pub(super) const STATE: &str = "state";
pub(super) const VERSION: &str = "version";
pub(super) const PROTOCOL: &str = "protocol";
pub(super) const POLICY_HASH: &str = "policy_hash";
pub(super) const DEAD: &str = "dead";
pub(super) const SUSPECTS: &str = "suspects";
pub(super) const DOUBTS: &str = "doubts";
/// The untold holders of those regions (`doubts.rs`).
pub(super) const DOUBTS_UNTOLD: &str = "doubts_untold";
/// The generation the member's process started as (it keeps it through
/// rejoins: a newer generation of the same process still holds its
/// copies). Absent (releases before it): the member's generation.
pub(super) const BORN: &str = "born";
/// Its failure domain (`cluster.zone`); absent: none named.
pub(super) const ZONE: &str = "zone";

/// Tombstones one node gossips at most (the newest generations).
pub const MAX_TOMBSTONES: usize = 64;

/// A dead member: never admitted again.
pub type Tombstone = (Arc<str>, u64);

/// One live member, parsed from its gossip state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub node_id: Arc<str>,
    pub generation: u64,
    /// The generation its process started as (≤ `generation`; less after
    /// it rejoined): see [`BORN`].
    pub born: u64,
    pub gossip_addr: SocketAddr,
    pub grpc_addr: String,
    pub state: Lifecycle,
    pub version: String,
    pub protocol: u32,
    pub policy_hash: String,
    /// Its zone; empty: none named (`ring.rs` places replicas by zone only
    /// when every member names one).
    pub zone: Arc<str>,
    /// This node's failure detector declares it dead; no one buried it
    /// (yet): it keeps its place in the ring, and is not counted reachable.
    pub suspected: bool,
    /// Its open regions of doubt (`doubts.rs`).
    pub doubts: Arc<[PublishedDoubt]>,
}

impl MemberInfo {
    /// Parse a member from its gossip key-values; `None` until it has
    /// published the keys a member needs.
    pub fn parse(id: &ChitchatId, state: &NodeState) -> Option<MemberInfo> {
        Some(MemberInfo {
            node_id: id.node_id.clone(),
            generation: id.generation_id,
            born: state
                .get(BORN)
                .and_then(|b| b.parse().ok())
                .filter(|&b| b <= id.generation_id)
                .unwrap_or(id.generation_id),
            gossip_addr: id.gossip_advertise_addr,
            grpc_addr: state.get(GRPC_ADDR)?.to_string(),
            state: Lifecycle::parse(state.get(STATE)?)?,
            version: state.get(VERSION).unwrap_or_default().to_string(),
            protocol: state.get(PROTOCOL)?.parse().ok()?,
            policy_hash: state.get(POLICY_HASH).unwrap_or_default().to_string(),
            zone: Arc::from(state.get(ZONE).unwrap_or_default()),
            suspected: false,
            doubts: state
                .get(DOUBTS)
                .map(|d| super::doubts::parse(d, state.get(DOUBTS_UNTOLD)))
                .unwrap_or_default()
                .into(),
        })
    }

    /// Ready, and speaking a peer protocol at most one version apart.
    pub fn in_ring(&self) -> bool {
        self.state == Lifecycle::Ready && self.in_protocol()
    }

    /// Speaks a peer protocol at most one version apart from this build's.
    pub fn in_protocol(&self) -> bool {
        self.protocol.abs_diff(PEER_PROTOCOL_VERSION) <= 1
    }

    pub fn as_member(&self) -> Member {
        Member {
            node_id: self.node_id.clone(),
            generation: self.generation,
            grpc_addr: self.grpc_addr.clone(),
            protocol: self.protocol,
            zone: self.zone.clone(),
        }
    }
}

/// The cluster as one node sees it at one moment.
#[derive(Clone, Debug)]
pub struct ClusterView {
    pub self_id: Arc<str>,
    /// This node's generation: a rejoin after being away is a new one.
    pub self_generation: u64,
    /// Members (this node included), by node id: live ones, and ready ones
    /// suspected but not buried.
    pub members: Vec<MemberInfo>,
    /// The ring over the ready members.
    pub ring: Arc<Ring>,
    /// `N`: ready members plus members that died without announcing
    /// `leaving` (remembered for the dead-node grace period), one per node
    /// id. Shares of a limit are sized by it.
    pub size: usize,
    /// Someone declared this node's generation dead: it must rejoin.
    pub self_tombstoned: bool,
    /// A newer generation of this node's id, gone (it left, or was
    /// buried): an earlier life of this id, started on a wall clock since
    /// stepped back. This node must rejoin past it: a departed newer
    /// generation shadows it for good, and peers read generations as ages.
    pub self_outranked: Option<u64>,
    /// Ready peers this node hears whose failure detectors suspect this
    /// node's generation (one short of a majority may bury it).
    pub suspected_by: usize,
    /// Every tombstone this node knows of (its own and its peers'): a
    /// peer call from one of them is refused, and the caller told.
    pub buried: Arc<BTreeSet<Tombstone>>,
}

impl ClusterView {
    /// A one-node view, before gossip has run.
    pub fn alone(self_id: &str, generation: u64) -> ClusterView {
        ClusterView {
            self_id: Arc::from(self_id),
            self_generation: generation,
            members: Vec::new(),
            ring: Arc::new(Ring::default()),
            size: 1,
            self_tombstoned: false,
            self_outranked: None,
            suspected_by: 0,
            buried: Arc::default(),
        }
    }

    /// Every member (ready, joining or leaving; suspected ones too) as a
    /// peer to call.
    pub fn live(&self) -> Vec<Member> {
        self.members.iter().map(MemberInfo::as_member).collect()
    }

    pub fn member(&self, node_id: &str) -> Option<&MemberInfo> {
        self.members.iter().find(|m| &*m.node_id == node_id)
    }

    /// Whether this node sees a majority of the remembered cluster size
    /// (the limiter's minority rule).
    pub fn has_majority(&self) -> bool {
        let ready = self.reachable();
        !(ready * 2 <= self.size && self.size > 1)
    }

    /// Ready members in the ring this node hears (itself included).
    pub fn reachable(&self) -> usize {
        self.members
            .iter()
            .filter(|m| !m.suspected && self.ring.member(&m.node_id).is_some())
            .count()
            .max(usize::from(self.ring.member(&self.self_id).is_some()))
    }

    /// Nearly a majority of the cluster suspects this node: one more
    /// voice and a peer may bury it and take its keys. It owns nothing
    /// meanwhile.
    pub fn self_suspected(&self) -> bool {
        self.suspected_by > 0 && (self.suspected_by + 1) * 2 > self.size
    }

    pub(super) fn same_as(&self, other: &ClusterView) -> bool {
        self.members == other.members
            && self.size == other.size
            && self.self_generation == other.self_generation
            && self.self_tombstoned == other.self_tombstoned
            && self.self_outranked == other.self_outranked
            && self.suspected_by == other.suspected_by
            && self.buried == other.buried
    }
}

/// What a view needs from chitchat's state, read under chitchat's lock
/// ([`Reading::from_chitchat`]). The ring is built from it after the lock
/// is dropped ([`Reading::into_view`]): 4,096 points per member, sorted,
/// would otherwise hold up chitchat's own tasks (gossip rounds, the
/// failure detector) and every caller of the lock meanwhile.
#[derive(Clone, Debug)]
pub(super) struct Reading {
    self_id: Arc<str>,
    self_generation: u64,
    members: Vec<MemberInfo>,
    size: usize,
    self_tombstoned: bool,
    self_outranked: Option<u64>,
    suspected_by: usize,
    buried: BTreeSet<Tombstone>,
}

impl Reading {
    /// Read chitchat's state; `own_dead` are the tombstones this node
    /// gossips (its failure detector's dead members).
    pub(super) fn from_chitchat(
        chitchat: &chitchat::Chitchat,
        own_dead: &BTreeSet<Tombstone>,
    ) -> Reading {
        let self_cc = chitchat.self_chitchat_id();
        let self_id = self_cc.node_id.clone();
        let mut dead: BTreeSet<Tombstone> = own_dead.clone();
        for id in chitchat.live_nodes() {
            if let Some(list) = chitchat.node_state(id).and_then(|s| s.get(DEAD)) {
                dead.extend(parse_tombstones(list));
            }
        }
        let buried = |id: &ChitchatId| dead.contains(&(id.node_id.clone(), id.generation_id));
        // One entry per node id: the newest generation (a restart is not
        // two nodes). Ready members this node suspects stay until buried.
        let live: BTreeSet<&ChitchatId> = chitchat.live_nodes().collect();
        let known: Vec<&ChitchatId> = chitchat.live_nodes().chain(chitchat.dead_nodes()).collect();
        // A buried generation shadows a live older one only if it said it
        // was leaving (`one_per_node`).
        let departed = |id: &ChitchatId| {
            chitchat
                .node_state(id)
                .and_then(|s| s.get(STATE))
                .and_then(Lifecycle::parse)
                .is_some_and(|s| matches!(s, Lifecycle::Leaving | Lifecycle::Left))
        };
        let newest = newest_generations(known.iter().map(|id| (&id.node_id, id.generation_id)));
        let shadowing = newest_generations(
            known
                .iter()
                .filter(|id| !buried(id) || departed(id))
                .map(|id| (&id.node_id, id.generation_id)),
        );
        let heard = known.iter().filter(|id| !buried(id)).filter_map(|id| {
            let mut m = chitchat
                .node_state(id)
                .and_then(|s| MemberInfo::parse(id, s))?;
            m.suspected = !live.contains(id);
            Some(m)
        });
        let members = one_per_node(heard, &newest, &shadowing);
        let generations = chitchat
            .live_nodes()
            .chain(chitchat.dead_nodes())
            .map(|id| Generation {
                node_id: id.node_id.clone(),
                generation: id.generation_id,
                state: chitchat
                    .node_state(id)
                    .and_then(|s| s.get(STATE))
                    .and_then(Lifecycle::parse),
                alive: live.contains(id) && !buried(id),
            });
        let size = cluster_size(generations);
        // The ready peers this node hears that suspect it (their newest
        // generation, one voice each).
        let me = (self_id.clone(), self_cc.generation_id);
        let suspected_by = live
            .iter()
            .filter(|id| {
                members.get(&id.node_id).is_some_and(|m| {
                    m.node_id != self_id
                        && m.generation == id.generation_id
                        && m.state == Lifecycle::Ready
                })
            })
            .filter(|id| {
                chitchat
                    .node_state(id)
                    .and_then(|s| s.get(SUSPECTS))
                    .is_some_and(|list| parse_tombstones(list).contains(&me))
            })
            .count();
        let self_tombstoned = buried(self_cc);
        let self_outranked = known
            .iter()
            .filter(|id| id.node_id == self_id && id.generation_id > self_cc.generation_id)
            .filter(|id| buried(id) || departed(id))
            .map(|id| id.generation_id)
            .max();
        Reading {
            suspected_by,
            self_tombstoned,
            self_outranked,
            buried: dead,
            self_id,
            self_generation: self_cc.generation_id,
            members: members.into_values().collect(),
            size,
        }
    }

    /// The view, with no lock held. The ring is `previous`'s when its
    /// members are the same (the points are sorted only when membership
    /// changed).
    pub(super) fn into_view(self, previous: &ClusterView) -> ClusterView {
        let in_ring: Vec<_> = self
            .members
            .iter()
            .filter(|m| m.in_ring())
            .map(MemberInfo::as_member)
            .collect();
        let ring = if in_ring == previous.ring.members() {
            previous.ring.clone()
        } else {
            Arc::new(Ring::new(in_ring))
        };
        ClusterView {
            self_id: self.self_id,
            self_generation: self.self_generation,
            members: self.members,
            ring,
            size: self.size,
            self_tombstoned: self.self_tombstoned,
            self_outranked: self.self_outranked,
            suspected_by: self.suspected_by,
            buried: if self.buried == *previous.buried {
                previous.buried.clone()
            } else {
                Arc::new(self.buried)
            },
        }
    }
}

/// Which members this node suspects and buries, kept across gossip rounds
/// (and across a rejoin: a burial is the cluster's, not this chitchat's).
#[derive(Debug, Default)]
pub(super) struct Burials {
    /// Members seen live (a member chitchat has only just heard of counts
    /// as "dead" until its second heartbeat: that is no death).
    seen_live: BTreeSet<Tombstone>,
    /// Members this node's failure detector declares dead, as gossiped.
    pub suspects: BTreeSet<Tombstone>,
    /// The tombstones this node gossips.
    pub published: BTreeSet<Tombstone>,
}

impl Burials {
    /// A rejoin starts a new chitchat: it has seen no member live yet. The
    /// members the old one saw live would otherwise be buried the moment
    /// the new one hears of them — a member chitchat has only just heard
    /// of counts as dead until its second heartbeat — and a node back from
    /// a cut would declare the members it came back to dead, making them
    /// rejoin in turn (and leave the cluster unable to reform while a
    /// tombstone and a rejoin chase each other).
    pub fn forget_seen(&mut self) {
        self.seen_live.clear();
    }

    /// This round's suspects — members seen live that chitchat's failure
    /// detector now declares dead — and tombstones: dead members that a
    /// majority of `size` (the cluster size this node remembers) suspects,
    /// counting this node (when ready) and every ready, unburied peer whose
    /// gossiped `suspects` name the member. Only a majority takes a member's keys
    /// over; a node cut off alone decides on leases, and must not make the
    /// majority rejoin when the cut heals. Newest generations first, at
    /// most [`MAX_TOMBSTONES`] of each. Returns whether either set changed.
    ///
    /// `may_suspect` false (this node is back from being away, and its
    /// failure detector has yet to hear its peers again): it suspects no
    /// one and votes for no burial — on waking, every peer looks silent.
    pub fn update(
        &mut self,
        chitchat: &chitchat::Chitchat,
        size: usize,
        may_suspect: bool,
    ) -> bool {
        let pair = |id: &ChitchatId| (id.node_id.clone(), id.generation_id);
        self.seen_live.extend(chitchat.live_nodes().map(pair));
        self.seen_live.retain(|(id, g)| {
            chitchat
                .node_states()
                .keys()
                .any(|c| c.node_id == *id && c.generation_id == *g)
        });
        // A member that announced its departure never comes back under
        // its generation: no tombstone needed (the list is bounded).
        let departed = |id: &ChitchatId| {
            chitchat
                .node_state(id)
                .and_then(|s| s.get(STATE))
                .is_some_and(|s| s == Lifecycle::Leaving.name() || s == Lifecycle::Left.name())
        };
        let known_dead: Vec<Tombstone> = chitchat
            .dead_nodes()
            .filter(|id| !departed(id))
            .map(pair)
            .collect();
        // What this node suspects by its own failure detector (gossiped).
        let suspects = newest(
            known_dead
                .iter()
                .filter(|t| may_suspect && self.seen_live.contains(*t))
                .cloned()
                .collect(),
        );
        let ready = |id: &ChitchatId| {
            chitchat
                .node_state(id)
                .and_then(|s| s.get(STATE))
                .is_some_and(|s| s == Lifecycle::Ready.name())
        };
        // The voices: each ready peer's suspects, from its newest
        // generation only (a restarted peer is one voice), leaving out
        // any peer buried by anyone (a node back from a cut still gossips
        // what it suspected while cut off).
        let self_cc = chitchat.self_chitchat_id();
        let mut voices: BTreeMap<Arc<str>, (u64, Vec<Tombstone>)> = BTreeMap::new();
        if !known_dead.is_empty() {
            let mut buried = self.published.clone();
            for id in chitchat.live_nodes() {
                if let Some(list) = chitchat.node_state(id).and_then(|s| s.get(DEAD)) {
                    buried.extend(parse_tombstones(list));
                }
            }
            for id in chitchat.live_nodes() {
                if id.node_id == self_cc.node_id || buried.contains(&pair(id)) || !ready(id) {
                    continue;
                }
                let Some(list) = chitchat.node_state(id).and_then(|s| s.get(SUSPECTS)) else {
                    continue;
                };
                let newer = voices
                    .get(&id.node_id)
                    .is_none_or(|(g, _)| *g < id.generation_id);
                if newer {
                    voices.insert(
                        id.node_id.clone(),
                        (id.generation_id, parse_tombstones(list)),
                    );
                }
            }
        }
        // This node's own vote: when ready, for a member it saw die — or
        // one it knows only as dead (it joined or rejoined after the
        // death) that a peer saw die; otherwise a majority that took a
        // member's keys over could never bury it.
        let self_ready = ready(self_cc) && may_suspect;
        let corroborated = known_dead.iter().filter(|t| {
            let others = voices
                .iter()
                .filter(|(voter, (_, list))| **voter != t.0 && list.contains(t))
                .count();
            let mine = self_ready && (suspects.contains(*t) || others > 0);
            (usize::from(mine) + others) * 2 > size
        });
        let dead = newest(
            corroborated
                .cloned()
                .chain(self.published.iter().cloned())
                .collect(),
        );
        let changed = dead != self.published || suspects != self.suspects;
        self.published = dead;
        self.suspects = suspects;
        changed
    }
}

/// The newest generations of `list`, at most [`MAX_TOMBSTONES`].
fn newest(mut list: Vec<Tombstone>) -> BTreeSet<Tombstone> {
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    list.dedup();
    list.into_iter().take(MAX_TOMBSTONES).collect()
}

/// Tombstones as gossiped: a JSON list of `[node_id, generation]` (node
/// ids are configuration strings: any separator could occur in one).
pub(super) fn encode_tombstones(dead: &BTreeSet<Tombstone>) -> String {
    let list: Vec<(&str, u64)> = dead.iter().map(|(id, g)| (&**id, *g)).collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// A peer's tombstones; a malformed list counts as none (and at most
/// [`MAX_TOMBSTONES`] are read from one peer).
pub(super) fn parse_tombstones(s: &str) -> Vec<Tombstone> {
    serde_json::from_str::<Vec<(String, u64)>>(s)
        .unwrap_or_default()
        .into_iter()
        .take(MAX_TOMBSTONES)
        .map(|(id, g)| (Arc::from(id.as_str()), g))
        .collect()
}

/// A member as tests build one: generation 1, this build's protocol.
#[cfg(test)]
pub(super) fn test_member(id: &str, state: Lifecycle) -> MemberInfo {
    MemberInfo {
        node_id: Arc::from(id),
        generation: 1,
        born: 1,
        gossip_addr: "127.0.0.1:7946".parse().unwrap(),
        grpc_addr: format!("{id}:50051"),
        state,
        version: String::new(),
        protocol: PEER_PROTOCOL_VERSION,
        policy_hash: String::new(),
        zone: Arc::from(""),
        suspected: false,
        doubts: Arc::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, state: Lifecycle) -> MemberInfo {
        test_member(id, state)
    }

    fn reading(members: Vec<MemberInfo>) -> Reading {
        Reading {
            self_id: Arc::from("a"),
            self_generation: 1,
            members,
            size: 3,
            self_tombstoned: false,
            self_outranked: None,
            suspected_by: 0,
            buried: BTreeSet::new(),
        }
    }

    /// The ring, built outside chitchat's lock from what was read under
    /// it, is the previous view's while the ready members are the same,
    /// and a new one when they change.
    #[test]
    fn the_ring_is_rebuilt_only_when_its_members_change() {
        use Lifecycle::{Joining, Ready};
        let first = reading(vec![member("a", Ready), member("b", Ready)])
            .into_view(&ClusterView::alone("a", 1));
        assert_eq!(first.ring.members().len(), 2);
        assert_eq!(first.size, 3);
        // A member joining changes the view, not the ring.
        let second = reading(vec![
            member("a", Ready),
            member("b", Ready),
            member("c", Joining),
        ])
        .into_view(&first);
        assert!(!second.same_as(&first));
        assert!(Arc::ptr_eq(&first.ring, &second.ring));
        // Ready: in a new ring.
        let third = reading(vec![
            member("a", Ready),
            member("b", Ready),
            member("c", Ready),
        ])
        .into_view(&second);
        assert!(!Arc::ptr_eq(&second.ring, &third.ring));
        assert_eq!(third.ring.members().len(), 3);
        assert_eq!(third.ring.epoch(), Ring::new(third.live()).epoch());
    }

    /// A suspect keeps its place in the ring (no one takes its keys on one
    /// failure detector's word) but not its vote in the minority rule; a
    /// node one voice short of burial owns nothing.
    #[test]
    fn a_suspect_stays_in_the_ring_but_is_not_counted_reachable() {
        use Lifecycle::Ready;
        let mut c = member("c", Ready);
        c.suspected = true;
        let mut b = member("b", Ready);
        b.suspected = true;
        let view = reading(vec![member("a", Ready), b, c]).into_view(&ClusterView::alone("a", 1));
        assert_eq!(view.ring.members().len(), 3, "suspects keep their keys");
        assert_eq!(view.reachable(), 1);
        assert!(!view.has_majority(), "hearing 1 of 3: a minority");
        let mut view = reading(vec![
            member("a", Ready),
            member("b", Ready),
            member("c", Ready),
        ])
        .into_view(&ClusterView::alone("a", 1));
        assert!(view.has_majority());
        assert!(!view.self_suspected());
        view.suspected_by = 1;
        assert!(view.self_suspected(), "of 3, one more voice buries it");
        view.size = 6;
        view.suspected_by = 2;
        assert!(!view.self_suspected(), "of 6, burial takes 4 voices");
        view.suspected_by = 3;
        assert!(view.self_suspected());
    }

    #[test]
    fn tombstones_round_trip_any_node_id() {
        let dead: BTreeSet<Tombstone> = [(Arc::from("a,b;c"), 7), (Arc::from("[\"x\"]"), u64::MAX)]
            .into_iter()
            .collect();
        let parsed: BTreeSet<Tombstone> = parse_tombstones(&encode_tombstones(&dead))
            .into_iter()
            .collect();
        assert_eq!(parsed, dead);
        assert!(parse_tombstones("not json").is_empty());
        let many: Vec<(String, u64)> = (0..1_000).map(|i| (format!("n{i}"), i)).collect();
        let long = serde_json::to_string(&many).unwrap();
        assert_eq!(parse_tombstones(&long).len(), MAX_TOMBSTONES);
    }
}
