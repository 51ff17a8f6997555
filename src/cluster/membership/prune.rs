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
//! - of all dead generations, at most [`MAX_DEAD`] are kept; beyond it,
//!   the oldest (by generation, a wall-clock birth) go first. This bounds
//!   memory; a fleet that loses more than this many nodes without a leave
//!   within `dead_grace` counts fewer of them in `N` (the wire is bounded
//!   anyway: digests fit half a message, see `vendor/chitchat/PATCHES.md`).
//!
//! A forgotten generation is remembered by chitchat as garbage-collected:
//! a peer that still gossips it does not bring it back. Burials are
//! Sluice's own tombstones (`view.rs`), not chitchat's states: forgetting
//! a state unburies nothing.

use std::collections::{BTreeMap, BTreeSet};

use chitchat::ChitchatId;

/// Generations of one node id kept in gossip: the newest and the one
/// before it (a rejoining node's previous self).
pub const GENERATIONS_PER_ID: usize = 2;

/// Dead generations kept in gossip in all.
pub const MAX_DEAD: usize = 1_024;

/// The dead generations to forget, given every generation known and which
/// of them are dead (pure: see the module's rule).
pub(super) fn to_forget<'a>(
    known: impl Iterator<Item = &'a ChitchatId>,
    dead: &BTreeSet<&'a ChitchatId>,
) -> Vec<ChitchatId> {
    let mut by_id: BTreeMap<&str, Vec<&ChitchatId>> = BTreeMap::new();
    for id in known {
        by_id.entry(&id.node_id).or_default().push(id);
    }
    let mut forget: BTreeSet<&ChitchatId> = BTreeSet::new();
    for gens in by_id.values_mut() {
        gens.sort_by_key(|id| std::cmp::Reverse(id.generation_id));
        forget.extend(
            gens.iter()
                .skip(GENERATIONS_PER_ID)
                .filter(|id| dead.contains(*id)),
        );
    }
    let mut kept_dead: Vec<&ChitchatId> = dead
        .iter()
        .filter(|id| !forget.contains(*id))
        .copied()
        .collect();
    if kept_dead.len() > MAX_DEAD {
        kept_dead.sort_by_key(|id| id.generation_id);
        let over = kept_dead.len() - MAX_DEAD;
        forget.extend(kept_dead.into_iter().take(over));
    }
    forget.into_iter().cloned().collect()
}

/// Applies the rule to `cc`; returns how many generations it forgot.
pub(super) fn prune(cc: &mut chitchat::Chitchat) -> usize {
    let dead: BTreeSet<&ChitchatId> = cc.dead_nodes().collect();
    if dead.is_empty() {
        return 0;
    }
    let forget = to_forget(cc.node_states().keys(), &dead);
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
        let forget = to_forget(known.into_iter(), &dead);
        assert_eq!(forget, (1..=8).map(|g| id("a", g)).collect::<Vec<_>>());
    }

    #[test]
    fn a_live_generation_is_never_forgotten() {
        // An odd order: an older generation alive, newer ones dead.
        let gens: Vec<ChitchatId> = (1..=4).map(|g| id("a", g)).collect();
        let dead: BTreeSet<&ChitchatId> = gens[1..].iter().collect();
        let forget = to_forget(gens.iter(), &dead);
        // 4 and 3 are the newest two; of the older, only the dead one goes.
        assert_eq!(forget, vec![id("a", 2)]);
    }

    #[test]
    fn dead_generations_beyond_the_bound_go_oldest_first() {
        let gens: Vec<ChitchatId> = (0..MAX_DEAD as u64 + 5)
            .map(|i| id(&format!("n{i}"), 100 + i))
            .collect();
        let dead: BTreeSet<&ChitchatId> = gens.iter().collect();
        let forget = to_forget(gens.iter(), &dead);
        assert_eq!(forget.len(), 5);
        let oldest: BTreeSet<ChitchatId> = gens[..5].iter().cloned().collect();
        assert_eq!(forget.into_iter().collect::<BTreeSet<_>>(), oldest);
    }
}
