//! The limiter's side of the regions of doubt: the decision's test, the
//! view change's adoption of its peers' word, the operator's command, the
//! gauges and what this node publishes. The regions themselves are
//! `doubt.rs`'s.

use super::*;

impl crate::limiter::Limiter {
    /// Whether `k`, which this node owns, is in doubt now.
    pub(in crate::limiter) fn in_doubt(&self, k: &[u8]) -> bool {
        let doubts = &self.shared.doubts;
        if !doubts.any() {
            return false;
        }
        let mut ended = Ended::default();
        let catch_up = &self.shared.catch_up;
        let me = Me {
            id: &self.shared.node_id,
            confirmed: &|owner, epoch, since| catch_up.confirmed_since(owner, epoch, since),
        };
        let doubt = doubts.in_doubt(k, self.now(), &mut ended, &me);
        self.doubts_ended(ended);
        doubt
    }

    /// Adopt the regions of doubt the peers this node hears publish, over
    /// losses it holds no region for (it did not see them: restarted, or
    /// new). On every view, before this node owns a key of it: a node
    /// joining reads its peers' word while it waits to turn ready.
    pub(in crate::limiter) fn adopt_doubts(
        &self,
        view: &crate::cluster::membership::ClusterView,
        live: &[Heard],
    ) {
        let me = &*self.shared.node_id;
        let word: Vec<PublishedDoubt> = view
            .members
            .iter()
            .filter(|m| &*m.node_id != me && !m.suspected)
            .flat_map(|m| m.doubts.iter().cloned())
            .collect();
        if word.is_empty() {
            return;
        }
        let me_now = Heard {
            node_id: self.shared.node_id.clone(),
            born: self.shared.presence.born(),
            generation: view.self_generation,
        };
        let adopted = self
            .shared
            .doubts
            .adopt(&word, &view.ring, live, &me_now, self.now());
        if adopted > 0 {
            tracing::warn!(
                regions = adopted,
                "adopted peers' regions of doubt: keys whose owner and replica holder were lost together before this node joined are decided as unreachable until one is back or cluster.in_doubt_grace passes"
            );
        }
    }

    /// End every region of doubt now (the admin command): returns the
    /// regions ended and the keys decided in doubt under them.
    pub fn accept_best_copies(&self) -> (usize, u64) {
        let (regions, ended) = self.shared.doubts.accept_all();
        let keys = ended.taken;
        if regions > 0 {
            tracing::warn!(
                regions,
                keys,
                "an operator accepted the best copies of the keys in doubt"
            );
        }
        self.doubts_ended(ended);
        self.settle_doubts();
        (regions, keys)
    }

    /// Open regions of doubt and the keys decided in doubt under them.
    pub fn doubt_figures(&self) -> (usize, u64) {
        let (keys, regions) = self.shared.doubts.figures();
        (regions, keys)
    }

    /// This node's open regions of doubt, as it publishes them — also
    /// while it sees no majority: a node left with a minority when an
    /// owner and its replica holder went together is often the only one
    /// that saw them go, and a node restarted meanwhile owns keys as soon
    /// as a majority forms again (simulator seed 152: the survivors said
    /// nothing while in a minority, the restarted replica holder owned the
    /// key before their word reached it, and answered it exactly from a
    /// stale copy). A node cut off names live members gone, but an
    /// adopter keeps only the members it does not hear (`Doubts::adopt`),
    /// and a node that rejoins forgets its regions.
    pub fn published_doubts(&self) -> Vec<PublishedDoubt> {
        let catch_up = &self.shared.catch_up;
        let me = Me {
            id: &self.shared.node_id,
            confirmed: &|owner, epoch, since| catch_up.confirmed_since(owner, epoch, since),
        };
        self.shared.doubts.published(self.now(), &me)
    }

    /// Count what regions that ended came to.
    pub(in crate::limiter) fn doubts_ended(&self, ended: Ended) {
        if ended.taken > 0 {
            self.shared
                .metrics
                .cluster
                .taken_from_best_copy
                .inc_by(ended.taken);
            tracing::warn!(
                keys = ended.taken,
                "keys in doubt taken from their best copy: their holders of record did not come back within cluster.in_doubt_grace"
            );
        }
    }

    /// End the regions past their grace, and set the gauges (each report
    /// round).
    pub(in crate::limiter) fn settle_doubts(&self) {
        let ended = self.shared.doubts.settle(self.now());
        self.doubts_ended(ended);
        let (keys, regions) = self.shared.doubts.figures();
        let m = &self.shared.metrics.cluster;
        m.keys_in_doubt.set(i64::try_from(keys).unwrap_or(i64::MAX));
        m.doubt_regions.set(regions as i64);
    }
}
