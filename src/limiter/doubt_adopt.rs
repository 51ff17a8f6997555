//! Adopting the regions of doubt peers publish (`doubt.rs`): a node that
//! did not see a change — restarted, or new — learns from the nodes that
//! did which keys are in doubt.

use super::*;

impl Doubts {
    /// Adopt the regions peers publish over losses this node holds no
    /// region of its own for (a node that did not see the change:
    /// restarted, or new). `ring` is this node's ring now; `me` this
    /// node: its id, the generation its process started as (`born`) and
    /// its generation now — an older generation than `born` is gone like
    /// any other member, a newer one is this process; `live`, the members
    /// it hears (a process it hears as it was then is not gone here). At
    /// most the grace is adopted; a region that ended here (not one
    /// resolved by its members coming back) is not adopted again. Returns
    /// how many were adopted.
    pub fn adopt(
        &self,
        published: &[PublishedDoubt],
        ring: &Ring,
        live: &[Heard],
        me: &Heard,
        now: Nanos,
    ) -> usize {
        let me_heard = me;
        let (born, now_as) = (me.born, me.generation);
        let me = &*me.node_id;
        let mut regions = self.regions();
        let done = self.done();
        let seen = self.seen();
        let mut count = 0;
        for p in published {
            // Members this node hears as the process they were then are
            // not gone here: a peer's suspicion this node does not share,
            // a loss since resolved, or the stale word of a peer back from
            // a pause that names everyone it stopped hearing. They are
            // left out of the region, not only of the count: a region
            // naming a live member gone covers the keys it owns and holds
            // (a node back from a pause named its live peers gone; a
            // member's brief suspicion made the rest count, and keys whose
            // owner lived were refused as in doubt).
            let is_live = |(id, g): &(Arc<str>, u64)| live.iter().any(|m| m.was(id, *g));
            // The publisher named this node gone at its generation now: it
            // was in that ring as it is, and owned its keys there as it
            // does now. Named at an older generation of this process (it
            // was buried and rejoined since), its keys moved off it
            // meanwhile: it is left out of the ring, as a new node is (a
            // cold review: kept in, it stood as the next holder of a key
            // whose later holders were lost, and answered it exactly from
            // its copy from before the pause).
            let named_me = p.gone.iter().any(|(id, g)| &**id == me && *g == now_as);
            // A member heard as the process it was, under a newer
            // generation, was buried and is back: not gone, but the rings
            // between the losses are rebuilt without it from where it was
            // lost. Heard at the generation named, it was never lost here.
            let back =
                |(id, g): &(Arc<str>, u64)| live.iter().any(|m| m.was(id, *g) && *g < m.generation);
            // A word naming this node's older process (lost before this
            // one started) may go on to name losses this process saw
            // itself, as a member holding current copies of what they
            // left it (`Doubts::seen`): the publisher joined them to its
            // region within the grace. Such a member is not gone here —
            // this process held its keys' counts, current, when it went
            // — but keeps its place in the rebuilt rings, as one back
            // does: rebuilt as gone over this node's old process, they
            // put in doubt keys this process had owned, current, since it
            // joined (simulator seed 1985 of `--mix any`:
            // `rejoined-member-kept-in-doubt.json`). The losses before it
            // started stay: those it did not see.
            let names_old_me = p.gone.iter().any(|(id, g)| &**id == me && *g < born);
            let saw = |g: &(Arc<str>, u64)| names_old_me && seen.contains(g);
            let mut lost: Vec<(Arc<str>, u64)> = Vec::new();
            for g in p.gone.iter().filter(|(id, g)| !(&**id == me && *g >= born)) {
                if (!is_live(g) || back(g)) && !lost.iter().any(|(id, _)| *id == g.0) {
                    lost.push(g.clone());
                }
            }
            let mut gone: Vec<(Arc<str>, u64)> = lost
                .iter()
                .filter(|g| !is_live(g) && !saw(g))
                .cloned()
                .collect();
            gone.sort();
            // Held here already: the same losses, over rings rebuilt
            // from as much (a region whose word names a member back since
            // covers rings one without it cannot).
            let holds = |r: &Region| {
                gone.iter().all(|g| r.gone.contains(g)) && lost.iter().all(|g| r.lost.contains(g))
            };
            // Fewer than two gone here covers nothing — unless a holder
            // was untold: a two-member ring's other member, say.
            // A region held already learns the holders the word names
            // untold: this node may own keys of it whose only live holder
            // of record was one (a zone places a key's new owner apart
            // from its replica holder).
            if let Some(r) = regions.iter_mut().find(|r| !r.of_sources() && holds(r)) {
                if !lost.is_empty() {
                    r.learn_untold(&p.untold);
                }
                continue;
            }
            let full = regions.len() >= MAX_REGIONS;
            let few = gone.len() < 2 && (gone.is_empty() || p.untold.is_empty());
            if full || few || Self::was_done(&done, &gone) {
                continue;
            }
            let rebuilt = rebuild(ring, p, &lost, me_heard, named_me);
            let remaining = (p.remaining.as_nanos().min(u64::MAX as u128) as u64).min(self.grace);
            let until = now.saturating_add(remaining);
            let exact = rebuilt.is_some();
            let previous = rebuilt.unwrap_or_else(|| rebuild::of_losses(p, &gone));
            let mut region = Region::adopted(
                Arc::new(previous),
                gone,
                &lost,
                &p.untold,
                p.ring,
                until,
                self.grace,
            );
            if !exact {
                region.guess();
            }
            regions.push(region);
            count += 1;
        }
        // Adopted regions, or untold holders learned, may cover keys now.
        self.any
            .store(regions.iter().any(Region::can_cover), Ordering::Release);
        count
    }
}
