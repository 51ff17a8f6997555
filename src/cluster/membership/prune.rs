//! Dead generations in gossip, bounded.
//!
//! chitchat keeps a dead node's state for `dead_grace` (an hour by
//! default: the size `N` counts a member that died without leaving for
//! that long). Each rejoin leaves one dead generation behind, so a node
//! rejoining in a loop — a fleet starved of CPU — filled every digest with
//! its past until messages no longer fit a datagram (issue "No meltdown").
//!
//! **The rule**, applied every round under chitchat's lock:
//! - of each node id, only the newest [`GENERATIONS_PER_ID`] generations
//!   are kept; older ones that chitchat holds dead are forgotten. The view
//!   reads one member per id (its newest generation) and the size rule
//!   (`view::cluster_size`) reads the newest and whether an older one was
//!   ready, which the one kept before it still tells;
//! - never the newest generation of an id (a member just heard looks dead
//!   to chitchat until its second heartbeat; a crashed member is counted
//!   in `N` by it), nor the newest *ready* one (the view falls back to it
//!   while newer ones are suspected and not yet ready);
//! - of the other dead generations, at most [`MAX_DEAD`] are kept; beyond
//!   it, the oldest (by generation, a wall-clock birth) go first. Memory
//!   is then bounded by two generations per node id; the wire is bounded
//!   anyway (digests fit half a message, `vendor/chitchat/PATCHES.md`).
//!
//! A forgotten generation is remembered by chitchat as garbage-collected:
//! a peer that still gossips it does not bring it back. Burials are
//! Sluice's own tombstones (`view.rs`), not chitchat's states: forgetting
//! a state unburies nothing.

use std::collections::{BTreeMap, BTreeSet};

use chitchat::ChitchatId;

use super::Lifecycle;
use super::view::STATE;

/// Generations of one node id kept in gossip: the newest and the one
/// before it (a rejoining node's previous self).
pub const GENERATIONS_PER_ID: usize = 2;

/// Dead generations kept in gossip in all, beyond the newest of each id
/// (and the newest ready one): a bound on memory. The newest generation
/// of every id is kept, so `N` counts every member that died without
/// leaving, however many.
pub const MAX_DEAD: usize = 1_024;

/// The dead generations to forget, given every generation known, which
/// of them are dead, and which the view may read (`keep`: the newest
/// ready generation of each id — the view falls back to it while newer
/// ones are suspected and not ready). Pure: see the module's rule. The
/// newest generation of an id is never forgotten (chitchat also holds a
/// member dead until its second heartbeat: a new one looks dead).
pub(super) fn to_forget<'a>(
    known: impl Iterator<Item = &'a ChitchatId>,
    dead: &BTreeSet<&'a ChitchatId>,
    keep: &BTreeSet<&'a ChitchatId>,
) -> Vec<ChitchatId> {
    let mut by_id: BTreeMap<&str, Vec<&ChitchatId>> = BTreeMap::new();
    for id in known {
        by_id.entry(&id.node_id).or_default().push(id);
    }
    let mut forget: BTreeSet<&ChitchatId> = BTreeSet::new();
    // Dead generations the bound may take: neither the newest of their id
    // nor kept.
    let mut older: Vec<&ChitchatId> = Vec::new();
    for gens in by_id.values_mut() {
        gens.sort_by_key(|id| std::cmp::Reverse(id.generation_id));
        for (i, id) in gens.iter().enumerate().skip(1) {
            if !dead.contains(*id) || keep.contains(*id) {
                continue;
            }
            if i >= GENERATIONS_PER_ID {
                forget.insert(id);
            } else {
                older.push(id);
            }
        }
    }
    if older.len() > MAX_DEAD {
        older.sort_by_key(|id| id.generation_id);
        let over = older.len() - MAX_DEAD;
        forget.extend(older.into_iter().take(over));
    }
    forget.into_iter().cloned().collect()
}

/// Applies the rule to `cc`; returns how many generations it forgot.
pub(super) fn prune(cc: &mut chitchat::Chitchat) -> usize {
    let dead: BTreeSet<&ChitchatId> = cc.dead_nodes().collect();
    if dead.is_empty() {
        return 0;
    }
    let mut newest_ready: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
    for (id, state) in cc.node_states() {
        if state.get(STATE) == Some(Lifecycle::Ready.name())
            && newest_ready
                .get(&*id.node_id)
                .is_none_or(|n| n.generation_id < id.generation_id)
        {
            newest_ready.insert(&id.node_id, id);
        }
    }
    let keep: BTreeSet<&ChitchatId> = newest_ready.into_values().collect();
    let forget = to_forget(cc.node_states().keys(), &dead, &keep);
    forget.iter().filter(|id| cc.forget_dead_node(id)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: &str, generation: u64) -> ChitchatId {
        ChitchatId::new(node, generation, "127.0.0.1:1".parse().unwrap())
    }

    #[test]
    fn a_node_rejoining_in_a_loop_leaves_two_generations() {
        let gens: Vec<ChitchatId> = (1..=10).map(|g| id("a", g)).collect();
        let other = id("b", 1);
        let known: Vec<&ChitchatId> = gens.iter().chain([&other]).collect();
        // Generations 1..=9 dead, 10 alive; b dead too.
        let dead: BTreeSet<&ChitchatId> = gens[..9].iter().chain([&other]).collect();
        let forget = to_forget(known.into_iter(), &dead, &BTreeSet::new());
        assert_eq!(forget, (1..=8).map(|g| id("a", g)).collect::<Vec<_>>());
    }

    #[test]
    fn a_live_generation_is_never_forgotten() {
        // An odd order: an older generation alive, newer ones dead.
        let gens: Vec<ChitchatId> = (1..=4).map(|g| id("a", g)).collect();
        let dead: BTreeSet<&ChitchatId> = gens[1..].iter().collect();
        let forget = to_forget(gens.iter(), &dead, &BTreeSet::new());
        // 4 and 3 are the newest two; of the older, only the dead one goes.
        assert_eq!(forget, vec![id("a", 2)]);
        // Kept (its newest ready generation): stays.
        let keep: BTreeSet<&ChitchatId> = [&gens[1]].into_iter().collect();
        assert_eq!(to_forget(gens.iter(), &dead, &keep), vec![]);
    }

    #[test]
    fn dead_generations_beyond_the_bound_go_oldest_first() {
        // Each id: a dead older generation and its newest (dead too: a
        // crashed member, or one just heard). Only older ones may go.
        let ids = MAX_DEAD as u64 + 5;
        let older: Vec<ChitchatId> = (0..ids).map(|i| id(&format!("n{i}"), 100 + i)).collect();
        let newest: Vec<ChitchatId> = (0..ids).map(|i| id(&format!("n{i}"), 10_000 + i)).collect();
        let all: Vec<&ChitchatId> = older.iter().chain(&newest).collect();
        let dead: BTreeSet<&ChitchatId> = all.iter().copied().collect();
        let forget = to_forget(all.into_iter(), &dead, &BTreeSet::new());
        let oldest: BTreeSet<ChitchatId> = older[..5].iter().cloned().collect();
        assert_eq!(forget.into_iter().collect::<BTreeSet<_>>(), oldest);
    }
}
