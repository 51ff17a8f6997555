//! The consistent-hash ring: which ready member owns a key.
//!
//! Positions are computed directly, never through `std::hash::Hash` (whose
//! byte stream is an implementation detail), because the key → owner mapping
//! is a wire protocol between nodes of different builds:
//! - a key's position is `xxh3_64(seed 0)` of its encoded bytes
//!   (`store::key`);
//! - virtual node `i` of a member is `xxh3_64(node_id ‖ 0x00 ‖ u32_le(i))`;
//! - the owner is the member of the first virtual node at or after the key's
//!   position, wrapping around.
//!
//! Golden vectors in the tests freeze the mapping.
//!
//! The replica holder is the next distinct member after the owner — in
//! another zone than the owner's when the ring spans zones: every member
//! names one (`cluster.zone`) and there are two or more. A member that
//! names none (unset, or a previous release that knows no zones) turns
//! placement back to the plain successor for the whole ring, so every
//! node, of either release, computes the same holder.
//!
//! Why not the `hashring` crate: not its hashing — its positions *could*
//! match these (any `BuildHasher`, e.g. xxhash-rust's `Xxh3Builder`, and a
//! `Hash` impl that writes exactly the frozen bytes). What it lacks is what
//! the cluster needs: the successor that is a *distinct* member (replicas),
//! and ranges of the ring (which keys a view change moves, for the
//! ownership transfer); and `get_with_replicas` clones the whole ring per
//! call. So the ring is this sorted vector with a binary search, frozen by
//! the golden vectors.

use std::fmt;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

/// Virtual nodes per member. With 4,096, no member of a 3-to-10-node ring
/// owns more than 1.10× its fair share of random keys (measured in a test).
pub const VNODES: u32 = 4_096;

/// A ready member as the ring sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member {
    /// A stable name (not an address that changes on restart).
    pub node_id: Arc<str>,
    /// A restart is a new generation of the same node.
    pub generation: u64,
    /// Where its gRPC server listens.
    pub grpc_addr: String,
    /// The peer protocol it speaks (not part of any position).
    pub protocol: u32,
    /// Its failure domain (`cluster.zone`); empty: none named.
    pub zone: Arc<str>,
}

/// An immutable ring over a set of ready members; rebuilt on every change.
#[derive(Clone, Default)]
pub struct Ring {
    /// `(position, index into members)`, sorted by position.
    points: Vec<(u64, u32)>,
    /// Sorted by node id; one per node id.
    members: Vec<Member>,
    /// Per member, its zone as a number (equal numbers, equal zones);
    /// `None`: it names none.
    zones: Vec<Option<u32>>,
    /// The members that name no zone (by index): while one of them is in
    /// a ring, placement ignores zones.
    unzoned: Vec<usize>,
    /// Every member names a zone, two or more: holders are placed by them.
    spans_zones: bool,
    epoch: u64,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("epoch", &format_args!("{:016x}", self.epoch))
            .field("members", &self.members)
            .finish()
    }
}

/// A key's position on the ring.
pub fn key_position(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// Virtual node `i` of `node_id`.
pub fn vnode_position(node_id: &str, i: u32) -> u64 {
    let mut buf = Vec::with_capacity(node_id.len() + 5);
    buf.extend_from_slice(node_id.as_bytes());
    buf.push(0);
    buf.extend_from_slice(&i.to_le_bytes());
    xxh3_64(&buf)
}

/// The ring epoch of a member set: xxh3 of the sorted `(node_id,
/// generation)` pairs, each encoded `node_id ‖ 0x00 ‖ u64_le(generation)`.
/// Compared only for equality.
pub fn epoch_of<'a>(members: impl IntoIterator<Item = &'a Member>) -> u64 {
    let mut ids: Vec<(&str, u64)> = members
        .into_iter()
        .map(|m| (&*m.node_id, m.generation))
        .collect();
    ids.sort_unstable();
    let mut buf = Vec::new();
    for (id, generation) in ids {
        buf.extend_from_slice(id.as_bytes());
        buf.push(0);
        buf.extend_from_slice(&generation.to_le_bytes());
    }
    xxh3_64(&buf)
}

/// The epoch of a ring over `members` (sorted by node id, one per id).
/// Placement by zones is part of what it names (two rings of one epoch
/// place every copy alike); zone-blind, it is the frozen epoch of the
/// member set.
fn ring_epoch(members: &[Member], spans_zones: bool) -> u64 {
    let epoch = epoch_of(members);
    if !spans_zones {
        return epoch;
    }
    let mut buf = epoch.to_le_bytes().to_vec();
    for m in members {
        buf.extend_from_slice(m.zone.as_bytes());
        buf.push(0);
    }
    xxh3_64(&buf)
}

/// `members` as a ring holds them: sorted by node id, one per id (the
/// newest generation).
fn one_per_id(members: impl IntoIterator<Item = Member>) -> Vec<Member> {
    let mut members: Vec<Member> = members.into_iter().collect();
    members.sort_by(|a, b| {
        a.node_id
            .cmp(&b.node_id)
            .then(b.generation.cmp(&a.generation))
    });
    members.dedup_by(|later, kept| later.node_id == kept.node_id);
    members
}

/// Whether a ring over `members` (as [`one_per_id`] leaves them) places
/// replicas by zone: every member names one, and two or more are named.
fn spans_zones(members: &[Member]) -> bool {
    let first = members.first().map(|m| &m.zone);
    members.iter().all(|m| !m.zone.is_empty()) && members.iter().any(|m| Some(&m.zone) != first)
}

/// The epoch [`Ring::new`] would give a ring over `members`, without
/// building it (no positions: a check of a rebuilt member set).
pub fn epoch_of_ring(members: impl IntoIterator<Item = Member>) -> u64 {
    let members = one_per_id(members);
    ring_epoch(&members, spans_zones(&members))
}

impl Ring {
    /// A ring over `members`. Two entries with one node id (a restart seen
    /// twice) count once: the newer generation.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Ring {
        let members = one_per_id(members);
        let mut points = Vec::with_capacity(members.len() * VNODES as usize);
        for (idx, m) in members.iter().enumerate() {
            for i in 0..VNODES {
                points.push((vnode_position(&m.node_id, i), idx as u32));
            }
        }
        // Ties between two members' virtual nodes (astronomically rare)
        // resolve by node id, the same on every node.
        points.sort_unstable();
        let mut names: Vec<&str> = members.iter().map(|m| &*m.zone).collect();
        names.sort_unstable();
        names.dedup();
        let zones: Vec<Option<u32>> = members
            .iter()
            .map(|m| {
                let named = !m.zone.is_empty();
                named.then(|| names.binary_search(&&*m.zone).unwrap_or(0) as u32)
            })
            .collect();
        let unzoned: Vec<usize> = (0..members.len()).filter(|&i| zones[i].is_none()).collect();
        let spans_zones = unzoned.is_empty() && zones.iter().any(|z| *z != zones[0]);
        debug_assert_eq!(spans_zones, self::spans_zones(&members));
        let epoch = ring_epoch(&members, spans_zones);
        Ring {
            points,
            members,
            zones,
            unzoned,
            spans_zones,
            epoch,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether replicas are placed in another zone than their owner's.
    pub fn spans_zones(&self) -> bool {
        self.spans_zones
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn member(&self, node_id: &str) -> Option<&Member> {
        self.members
            .binary_search_by(|m| (*m.node_id).cmp(node_id))
            .ok()
            .map(|i| &self.members[i])
    }

    /// Index of the first point at or after `pos`, wrapping.
    fn point_at(&self, pos: u64) -> usize {
        match self.points.partition_point(|p| p.0 < pos) {
            i if i == self.points.len() => 0,
            i => i,
        }
    }

    /// The member that owns `key` (encoded bytes), if the ring has any.
    pub fn owner(&self, key: &[u8]) -> Option<&Member> {
        if self.points.is_empty() {
            return None;
        }
        let (_, idx) = self.points[self.point_at(key_position(key))];
        Some(&self.members[idx as usize])
    }

    /// Whether the replica holder must be in another zone than the owner
    /// in this ring without the members `skip` names: every member named
    /// a zone, and two or more are left.
    fn zoned_without(&self, skip: &impl Fn(usize) -> bool) -> Option<&[Option<u32>]> {
        if self.unzoned.iter().any(|&i| !skip(i)) {
            return None;
        }
        let zones = &self.zones[..];
        let mut left = (0..zones.len()).filter(|&i| !skip(i)).map(|i| zones[i]);
        let first = left.next()?;
        left.any(|z| z != first).then_some(zones)
    }

    /// The key's replica holder: the next distinct member after the owner,
    /// in another zone when the ring spans zones (module docs).
    pub fn successor(&self, key: &[u8]) -> Option<&Member> {
        if self.members.len() < 2 {
            return None;
        }
        let (_, holder) = self.holders_without(key, |_| false);
        holder.map(|i| &self.members[i])
    }

    /// The epoch this ring has without the members `skip` names by their
    /// index in [`Ring::members`] — that of `Ring::new` over the rest,
    /// without building it.
    pub fn epoch_without(&self, skip: impl Fn(usize) -> bool) -> u64 {
        let left: Vec<Member> = (0..self.members.len())
            .filter(|&i| !skip(i))
            .map(|i| self.members[i].clone())
            .collect();
        let spans_zones = self.zoned_without(&skip).is_some();
        ring_epoch(&left, spans_zones)
    }

    /// The owner and replica holder `key` had in this ring without the
    /// members `skip` names by their index in [`Ring::members`] (the ring
    /// as it stood after they left: a position depends on the node id
    /// alone, so removing members never moves the others), as indices.
    /// Walks the points from the key's: with fewer than two members left
    /// unskipped, all of them (the caller knows when and need not ask).
    /// The holder is placed by zones as that smaller ring would place it.
    pub fn holders_without(
        &self,
        key: &[u8],
        skip: impl Fn(usize) -> bool,
    ) -> (Option<usize>, Option<usize>) {
        if self.points.is_empty() {
            return (None, None);
        }
        let zones = self.zoned_without(&skip);
        let start = self.point_at(key_position(key));
        let mut owner: Option<usize> = None;
        for k in 0..self.points.len() {
            let idx = self.points[(start + k) % self.points.len()].1 as usize;
            if owner == Some(idx) || skip(idx) {
                continue;
            }
            match owner {
                None => owner = Some(idx),
                Some(o) if zones.is_some_and(|z| z[idx] == z[o]) => {}
                Some(o) => return (Some(o), Some(idx)),
            }
        }
        (owner, None)
    }

    /// Each member's fraction of the hash space, in member order.
    pub fn shares(&self) -> Vec<(Arc<str>, f64)> {
        let mut owned = vec![0u128; self.members.len()];
        for (k, &(pos, _)) in self.points.iter().enumerate() {
            // The arc ending at this point belongs to its member.
            let prev = if k == 0 {
                self.points[self.points.len() - 1].0
            } else {
                self.points[k - 1].0
            };
            let arc = pos.wrapping_sub(prev);
            let arc = if self.points.len() == 1 {
                u64::MAX
            } else {
                arc
            };
            owned[self.points[k].1 as usize] += u128::from(arc);
        }
        let total: u128 = owned.iter().sum::<u128>().max(1);
        self.members
            .iter()
            .zip(owned)
            .map(|(m, o)| (m.node_id.clone(), o as f64 / total as f64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::key;

    fn member(id: &str) -> Member {
        Member {
            node_id: Arc::from(id),
            generation: 1,
            grpc_addr: format!("{id}:8081"),
            protocol: crate::proto::PEER_PROTOCOL_VERSION,
            zone: Arc::from(""),
        }
    }

    /// `id` in zone `zone` ("a@z1").
    fn zoned(spec: &str) -> Member {
        let (id, zone) = spec.split_once('@').unwrap_or((spec, ""));
        Member {
            zone: Arc::from(zone),
            ..member(id)
        }
    }

    fn ring(ids: &[&str]) -> Ring {
        Ring::new(ids.iter().map(|i| member(i)))
    }

    #[test]
    fn the_epoch_without_members_is_that_of_the_ring_of_the_rest() {
        let specs = ["a@z1", "b@z2", "c@z1", "d@z3", "e"];
        for n in 2..=specs.len() {
            let all: Vec<Member> = specs[..n].iter().map(|s| zoned(s)).collect();
            let r = Ring::new(all.clone());
            for skipped in 0..n {
                let rest = r
                    .members()
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != skipped)
                    .map(|(_, m)| m.clone());
                assert_eq!(
                    r.epoch_without(|i| i == skipped),
                    Ring::new(rest).epoch(),
                    "{n} members, the one at {skipped} skipped"
                );
            }
            assert_eq!(r.epoch_without(|_| false), r.epoch());
        }
    }

    /// The mapping is a wire protocol: these vectors must never change.
    #[test]
    fn golden_vectors() {
        assert_eq!(key_position(b""), 0x2d06800538d394c2);
        assert_eq!(
            vnode_position("node-a", 0),
            xxh3_64(b"node-a\x00\x00\x00\x00\x00")
        );
        let r = ring(&["node-a", "node-b", "node-c"]);
        let owners: Vec<&str> = (0..16)
            .map(|i| {
                &*r.owner(&key::encode("api", &format!("user-{i}")))
                    .unwrap()
                    .node_id
            })
            .collect();
        assert_eq!(owners, GOLDEN_OWNERS, "the key → owner mapping changed");
        assert_eq!(r.epoch(), GOLDEN_EPOCH, "{:#x}", r.epoch());
    }

    const GOLDEN_OWNERS: [&str; 16] = [
        "node-c", "node-a", "node-a", "node-c", "node-a", "node-c", "node-a", "node-c", "node-a",
        "node-a", "node-c", "node-c", "node-b", "node-c", "node-a", "node-a",
    ];
    const GOLDEN_EPOCH: u64 = 0xa75d_f2ad_2b74_6567;

    #[test]
    fn balance_within_ten_percent_for_three_to_ten_nodes() {
        let keys: Vec<Vec<u8>> = (0..1_000_000u32)
            .map(|i| key::encode("bench", &format!("{:08x}", i.wrapping_mul(2_654_435_761))))
            .collect();
        for n in 3..=10 {
            let ids: Vec<String> = (0..n).map(|i| format!("sluice-{i}")).collect();
            let r = Ring::new(ids.iter().map(|i| member(i)));
            let mut counts = std::collections::HashMap::new();
            for k in &keys {
                *counts
                    .entry(r.owner(k).unwrap().node_id.clone())
                    .or_insert(0u64) += 1;
            }
            let fair = keys.len() as f64 / n as f64;
            let worst = counts
                .values()
                .map(|&c| c as f64 / fair)
                .fold(0.0, f64::max);
            println!("{n} nodes: the busiest owns {worst:.3}× its fair share");
            assert!(
                worst <= 1.10,
                "{n} nodes: the busiest owns {worst:.3}× its fair share"
            );
        }
    }

    /// A ring without some members, read from the full ring, is the ring
    /// built without them (the regions of doubt read earlier rings so),
    /// zones or not: a smaller ring may span one zone only.
    #[test]
    fn holders_without_members_are_those_of_the_smaller_ring() {
        for specs in [
            ["a", "b", "c", "d", "e"],
            ["a@z1", "b@z2", "c@z1", "d@z2", "e@z2"],
            ["a@z1", "b@z1", "c@z2", "d@z3", "e@z3"],
            // d names no zone: zone-blind until it is skipped.
            ["a@z1", "b@z2", "c@z1", "d", "e@z2"],
        ] {
            let full = Ring::new(specs.iter().map(|s| zoned(s)));
            let id = |m: Option<&Member>| m.map(|m| m.node_id.to_string());
            let at = |i: Option<usize>| i.map(|i| full.members()[i].node_id.to_string());
            for skip in [
                &[][..],
                &["c"][..],
                &["a", "d"][..],
                &["a", "c"][..],
                &["d"][..],
                &["b", "d"][..],
                &["a", "b", "c", "d"][..],
            ] {
                let rest = specs.iter().filter(|s| !skip.contains(&&s[..1]));
                let small = Ring::new(rest.map(|s| zoned(s)));
                for i in 0..2_000 {
                    let k = key::encode("n", &i.to_string());
                    let (owner, holder) =
                        full.holders_without(&k, |m| skip.contains(&&*full.members()[m].node_id));
                    assert_eq!(at(owner), id(small.owner(&k)), "{specs:?} {skip:?} {i}");
                    assert_eq!(
                        at(holder),
                        id(small.successor(&k)),
                        "{specs:?} {skip:?} {i}"
                    );
                }
            }
            let all = full.holders_without(b"k", |_| true);
            assert!(all.0.is_none() && all.1.is_none());
        }
    }

    /// With zones the replica holder is in another zone than the owner,
    /// whenever the ring has one; the owner is where it always was. One
    /// zone only, or a member naming none: the plain successor.
    #[test]
    fn a_replica_goes_to_another_zone_whenever_one_exists() {
        let plain = ring(&["a", "b", "c", "d", "e", "f"]);
        let zones = ["a@z1", "b@z1", "c@z2", "d@z2", "e@z3", "f@z3"];
        let three = Ring::new(zones.iter().map(|s| zoned(s)));
        let one = Ring::new(["a", "b", "c", "d", "e", "f"].map(|i| zoned(&format!("{i}@z"))));
        let mut unnamed = zones.map(zoned);
        unnamed[4].zone = Arc::from("");
        let unnamed = Ring::new(unnamed);
        let mut moved = 0;
        for i in 0..5_000 {
            let k = key::encode("n", &i.to_string());
            let owner = three.owner(&k).unwrap();
            let holder = three.successor(&k).unwrap();
            assert_eq!(owner.node_id, plain.owner(&k).unwrap().node_id);
            assert_ne!(owner.zone, holder.zone, "key {i}");
            let plain_holder = &plain.successor(&k).unwrap().node_id;
            moved += usize::from(holder.node_id != *plain_holder);
            assert_eq!(one.successor(&k).unwrap().node_id, *plain_holder);
            assert_eq!(unnamed.successor(&k).unwrap().node_id, *plain_holder);
        }
        // Two members per zone: the plain successor shares the owner's
        // zone about a fifth of the time.
        assert!((500..2_000).contains(&moved), "{moved} of 5,000 moved");
        assert_ne!(three.epoch(), plain.epoch(), "placement by zones is");
        assert_eq!(one.epoch(), plain.epoch(), "one zone places as none");
        assert_eq!(unnamed.epoch(), plain.epoch());
    }

    #[test]
    fn a_leaving_node_moves_only_its_keys() {
        let before = ring(&["a", "b", "c", "d"]);
        let after = ring(&["a", "b", "d"]);
        for i in 0..10_000 {
            let k = key::encode("n", &i.to_string());
            let (was, now) = (before.owner(&k).unwrap(), after.owner(&k).unwrap());
            if &*was.node_id != "c" {
                assert_eq!(
                    was.node_id, now.node_id,
                    "key {i} moved from {}",
                    was.node_id
                );
            }
        }
    }

    #[test]
    fn epoch_is_the_member_set_and_a_restart_counts_once() {
        let a = ring(&["a", "b"]);
        let b = ring(&["b", "a"]);
        assert_eq!(a.epoch(), b.epoch());
        let mut restarted = member("a");
        restarted.generation = 2;
        let c = Ring::new([member("a"), restarted.clone(), member("b")]);
        assert_eq!(c.members().len(), 2);
        assert_eq!(c.member("a").unwrap().generation, 2);
        assert_ne!(c.epoch(), a.epoch(), "a new generation is a new epoch");
    }

    #[test]
    fn successor_is_another_member() {
        let r = ring(&["a", "b", "c"]);
        for i in 0..1_000 {
            let k = key::encode("n", &i.to_string());
            assert_ne!(
                r.owner(&k).unwrap().node_id,
                r.successor(&k).unwrap().node_id
            );
        }
        assert!(ring(&["a"]).successor(b"k").is_none());
        // The replica holder is exactly who owns the key once its owner is gone.
        for i in 0..1_000 {
            let k = key::encode("n", &i.to_string());
            let owner = r.owner(&k).unwrap().node_id.to_string();
            let rest: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .filter(|m| *m != owner)
                .collect();
            assert_eq!(
                ring(&rest).owner(&k).unwrap().node_id,
                r.successor(&k).unwrap().node_id
            );
        }
        assert!(Ring::default().owner(b"k").is_none());
        let shares: f64 = r.shares().iter().map(|s| s.1).sum();
        assert!((shares - 1.0).abs() < 1e-9);
    }
}
