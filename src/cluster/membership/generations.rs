//! Which generation of a node id is its member, and `N`: a node runs one
//! process at a time, and each start (or rejoin) is a newer generation in
//! gossip, so gossip knows several generations of one node — live, dead,
//! leaving, left. These rules read them, one node id at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Lifecycle;
use super::view::MemberInfo;

/// One generation of a node, as gossip knows it (live or dead).
pub(super) struct Generation {
    pub node_id: Arc<str>,
    pub generation: u64,
    /// Its lifecycle as last published (None: not yet published).
    pub state: Option<Lifecycle>,
    /// Live to this node's failure detector, and not buried.
    pub alive: bool,
}

/// The newest generation known of each node id (buried or not).
pub(super) fn newest_generations<'a>(
    known: impl Iterator<Item = (&'a Arc<str>, u64)>,
) -> BTreeMap<&'a str, u64> {
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, g) in known {
        let e = newest.entry(&**id).or_insert(g);
        *e = (*e).max(g);
    }
    newest
}

/// The members, one per node id, from the generations heard (not
/// buried): only a node's newest generation known, and not once it left,
/// nor suspected unless ready (joining, it owned nothing; leaving, it
/// handed off — and no tombstone would ever end its wait). A node runs
/// one process at a time: a newer generation heard means every older one
/// is gone, whatever became of the newer — an older one kept as a member
/// once the newest left put a process killed 17 s before back in every
/// ring (simulator seed 2188 of `--mix any`: n0 crashed and restarted,
/// its old generation's tombstone forgotten; when its new process said
/// `left`, the old generation, ready and suspected, was the member).
///
/// `newest` is over every generation known; `shadowing`, over those not
/// buried or that said they were leaving. Generations are wall-clock
/// starts, so a process started on a clock behind its dead predecessor's
/// is newer though lower: below `newest` but not below `shadowing`, a
/// generation is the member while it is live (not suspected) — never an
/// older dead one (a cold review: a newest crashed and buried hid none).
pub(super) fn one_per_node(
    heard: impl Iterator<Item = MemberInfo>,
    newest: &BTreeMap<&str, u64>,
    shadowing: &BTreeMap<&str, u64>,
) -> BTreeMap<Arc<str>, MemberInfo> {
    let mut members: BTreeMap<Arc<str>, MemberInfo> = BTreeMap::new();
    for m in heard {
        let at_least =
            |map: &BTreeMap<&str, u64>| map.get(&*m.node_id).is_none_or(|&g| m.generation >= g);
        let is_newest = at_least(shadowing) && (at_least(newest) || !m.suspected);
        let gone = m.state == Lifecycle::Left || (m.suspected && m.state != Lifecycle::Ready);
        if is_newest && !gone {
            members.insert(m.node_id.clone(), m);
        }
    }
    members
}

/// `N`: the nodes a limit is shared among, one per node id, judged by its
/// newest generation. One that left or is leaving is not counted; one
/// that is ready is; one that died without leaving is (remembered for the
/// dead grace: a partitioned node must not conclude it is alone); one
/// that is joining is counted only if it is rejoining — an older
/// generation of it did not leave — since it was counted a moment ago and
/// will be again once ready (shares sized by N − 1 meanwhile would
/// over-admit by one node's share). A brand-new node is counted once ready.
pub(super) fn cluster_size(generations: impl Iterator<Item = Generation>) -> usize {
    let mut by_id: BTreeMap<Arc<str>, Vec<Generation>> = BTreeMap::new();
    for g in generations {
        by_id.entry(g.node_id.clone()).or_default().push(g);
    }
    let departed = |g: &Generation| matches!(g.state, Some(Lifecycle::Leaving | Lifecycle::Left));
    let counted = by_id.into_values().filter(|gens| {
        let mut gens: Vec<&Generation> = gens.iter().collect();
        gens.sort_by_key(|g| g.generation);
        let (newest, older) = gens.split_last().expect("grouped from one at least");
        if departed(newest) {
            false
        } else if !newest.alive || newest.state == Some(Lifecycle::Ready) {
            true
        } else {
            older.iter().any(|g| !departed(g))
        }
    });
    counted.count().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::view::test_member;

    fn generation(id: &str, generation: u64, state: Lifecycle, alive: bool) -> Generation {
        Generation {
            node_id: Arc::from(id),
            generation,
            state: Some(state),
            alive,
        }
    }

    /// `N` per node id, by its newest generation: a node rejoining is
    /// counted while it joins (issue 39 item 6: shares were sized by N − 1
    /// for 1–5 s), a node that left after it had once been killed and
    /// rejoined is not (the soak's 5, not 4), a brand-new node is counted
    /// once ready, and one that died without leaving stays counted.
    #[test]
    fn n_counts_each_node_by_its_newest_generation() {
        use Lifecycle::{Joining, Leaving, Left, Ready};
        let n = |gens: Vec<Generation>| cluster_size(gens.into_iter());
        let a = || generation("a", 1, Ready, true);
        // Rejoining: old generation dead (or not yet seen dead), new joining.
        assert_eq!(
            n(vec![
                a(),
                generation("b", 1, Ready, false),
                generation("b", 2, Joining, true)
            ]),
            2
        );
        assert_eq!(
            n(vec![
                a(),
                generation("b", 1, Ready, true),
                generation("b", 2, Joining, true)
            ]),
            2
        );
        // Brand new: not until ready.
        assert_eq!(n(vec![a(), generation("c", 5, Joining, true)]), 1);
        assert_eq!(n(vec![a(), generation("c", 5, Ready, true)]), 2);
        // Killed, rejoined, then left: gone from N.
        for last in [Leaving, Left] {
            let gens = vec![
                a(),
                generation("b", 1, Ready, false),
                generation("b", 2, last, true),
            ];
            assert_eq!(n(gens), 1, "{last:?}");
        }
        // Died without leaving: still counted (its tombstone's grace).
        assert_eq!(n(vec![a(), generation("b", 1, Ready, false)]), 2);
        // Rejoining after a clean leave: a new node, counted once ready.
        assert_eq!(
            n(vec![
                a(),
                generation("b", 1, Left, false),
                generation("b", 2, Joining, true)
            ]),
            1
        );
        assert_eq!(n(vec![]), 1, "never below one");
    }

    fn heard(id: &str, generation: u64, state: Lifecycle, suspected: bool) -> MemberInfo {
        MemberInfo {
            generation,
            suspected,
            ..test_member(id, state)
        }
    }

    /// The members of `heard`, with the buried generations `also_known`;
    /// of those, `buried_quietly` never said they were leaving.
    fn members_of(
        heard: Vec<MemberInfo>,
        also_known: &[(&str, u64)],
        buried_quietly: &[(&str, u64)],
    ) -> Vec<(String, u64)> {
        let ids: Vec<(Arc<str>, u64)> = heard
            .iter()
            .map(|m| (m.node_id.clone(), m.generation))
            .chain(also_known.iter().map(|&(id, g)| (Arc::from(id), g)))
            .collect();
        let newest = newest_generations(ids.iter().map(|(id, g)| (id, *g)));
        // The ones not heard are buried; those below said `left`.
        let shadowing = newest_generations(
            ids.iter()
                .filter(|(id, g)| !buried_quietly.contains(&(&**id, *g)))
                .map(|(id, g)| (id, *g)),
        );
        one_per_node(heard.into_iter(), &newest, &shadowing)
            .into_values()
            .map(|m| (m.node_id.to_string(), m.generation))
            .collect()
    }

    fn members(heard: Vec<MemberInfo>, also_known: &[(&str, u64)]) -> Vec<(String, u64)> {
        members_of(heard, also_known, &[])
    }

    /// A node's older generation is never its member once a newer one is
    /// known — whatever became of the newer one (simulator seed 2188 of
    /// `--mix any`: the newest said `left`, and the generation killed 17 s
    /// before, ready and suspected, was back in every ring).
    #[test]
    fn only_a_nodes_newest_generation_is_its_member() {
        use Lifecycle::{Joining, Leaving, Left, Ready};
        let a = || heard("a", 1, Ready, false);
        let old_b = || heard("b", 1, Ready, true);
        for (newest, expect) in [
            (heard("b", 2, Ready, false), vec![("b", 2)]),
            (heard("b", 2, Joining, false), vec![("b", 2)]),
            (heard("b", 2, Leaving, false), vec![("b", 2)]),
            (heard("b", 2, Left, false), vec![]),
            (heard("b", 2, Leaving, true), vec![]),
            (heard("b", 2, Joining, true), vec![]),
            (heard("b", 2, Ready, true), vec![("b", 2)]),
        ] {
            let state = newest.state;
            for order in [
                vec![a(), old_b(), newest.clone()],
                vec![newest.clone(), old_b(), a()],
            ] {
                let mut want = vec![("a".to_string(), 1)];
                want.extend(expect.iter().map(|&(id, g)| (id.to_string(), g)));
                assert_eq!(members(order, &[]), want, "newest {state:?}");
            }
        }
        // The newest buried after it said it was leaving: the older is not
        // the member either.
        assert_eq!(
            members(vec![a(), old_b()], &[("b", 2)]),
            vec![("a".to_string(), 1)]
        );
        // The newest crashed and buried quietly: an older one dead before
        // it (suspected) is not the member; a live one below it (a start
        // on a clock behind) is.
        assert_eq!(
            members_of(vec![a(), old_b()], &[("b", 2)], &[("b", 2)]),
            vec![("a".to_string(), 1)]
        );
        assert_eq!(
            members_of(
                vec![a(), heard("b", 1, Joining, false)],
                &[("b", 2)],
                &[("b", 2)]
            ),
            vec![("a".to_string(), 1), ("b".to_string(), 1)]
        );
        // Only one generation known: itself, ready and suspected, stays
        // until buried.
        assert_eq!(
            members(vec![a(), old_b()], &[]),
            vec![("a".to_string(), 1), ("b".to_string(), 1)]
        );
    }
}
