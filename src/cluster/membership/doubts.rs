//! Regions of doubt as a node gossips them (key `doubts`).
//!
//! A region of doubt (`limiter/doubt.rs`) is a fact about one change: the
//! owner and the replica holder of some keys went together. The nodes
//! that saw the change know it; a node that was not there — restarted
//! while the other holder of its keys was still down, or new — would own
//! some of those keys with nothing to tell it their counts were lost, and
//! answer them exactly from nothing (`two-of-three-crash.json`). So each
//! node publishes its open regions that can hold a key in doubt — who went
//! together, and how long the region stays open — and a node that holds
//! no region of its own over the same losses adopts them.
//!
//! The time left is a duration, not an instant: two nodes' clocks are
//! never compared. A receiver counts it from when it reads it; the
//! publisher publishes it again every 2 s while a region is open, so a
//! reading is at most that (plus gossip's delay) old, and the doubt only
//! lengthens by as much. A region adopted or ended at a node is never
//! adopted there again.

use std::sync::Arc;
use std::time::Duration;

use super::view::{MAX_TOMBSTONES, Tombstone};

/// Regions one node gossips at most (those with the most time left).
pub const MAX_PUBLISHED: usize = 8;

/// Untold holders one region gossips at most (each a pair of ids): one
/// holder per owner lost untold to it, so about the members one fault
/// takes at once.
pub const MAX_UNTOLD: usize = 16;

/// One open region as gossiped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedDoubt {
    /// Members of the ring before the change lost since, by id and
    /// generation, in the order lost (at most [`MAX_TOMBSTONES`]): those
    /// back since too — the rings between the losses are rebuilt from it;
    /// an adopter leaves out of the gone whom it hears as that process.
    pub gone: Vec<Tombstone>,
    /// The zones of those of `gone` that named one, by id: the rings an
    /// adopter rebuilds place replicas as the publisher's did.
    pub zones: Vec<(Arc<str>, Arc<str>)>,
    /// How long the region stays open from when it was published.
    pub remaining: Duration,
    /// `(holder, owner)`: members of the ring before that its gone owner
    /// never said held its replicas there (`limiter/caught_up.rs`) — the
    /// publisher itself, or as a region it adopted said. An adopter does
    /// not take such a holder for a holder of record of that owner's keys
    /// (simulator seed 816 of `--mix any`: a restarted node took the
    /// untold holder for one, and answered a key exactly from nothing).
    /// At most [`MAX_UNTOLD`].
    pub untold: Vec<(Arc<str>, Arc<str>)>,
    /// The ring before the change, named: its epoch and the newest
    /// generation among its members (0, 0: not named — an earlier word).
    /// An adopter rebuilds that ring from its own and the losses; a
    /// member that joined or rejoined since stands in the rebuild as if
    /// it had been there, and as a live holder of record it hides keys
    /// whose real holders were lost (simulator seed 937 of `--mix any`).
    /// A rebuild whose epoch is not this one is read from the losses
    /// alone (`limiter/doubt.rs`).
    pub ring: RingName,
}

/// A ring as a region's word names it: `(epoch, newest generation)`.
pub type RingName = (u64, u64);

impl PublishedDoubt {
    /// The zone `id` named; empty: none.
    pub fn zone_of(&self, id: &str) -> Arc<str> {
        self.zones
            .iter()
            .find(|(i, _)| &**i == id)
            .map_or_else(|| Arc::from(""), |(_, z)| z.clone())
    }
}

/// One member of `gone` as gossiped: `[node_id, generation]`, or with its
/// zone, `[node_id, generation, zone]`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Lost {
    Zoned(String, u64, String),
    Plain(String, u64),
}

/// As gossiped: a JSON list of `[[[node_id, generation(, zone)], ...], ms,
/// [ring epoch, newest generation]]`. A reader reads each region from its
/// first two elements and what it knows after them (the third came after
/// the first two; a reader without it reads the region as before). Untold
/// holders go under a key of their own ([`encode_untold`]): they came
/// before readers read past two elements.
pub fn encode(regions: &[PublishedDoubt]) -> String {
    let list: Vec<(Vec<Lost>, u64, RingName)> = regions
        .iter()
        .take(MAX_PUBLISHED)
        .map(|r| {
            let gone = r.gone.iter().take(MAX_TOMBSTONES);
            let gone = gone
                .map(|(id, g)| match r.zone_of(id) {
                    z if z.is_empty() => Lost::Plain(id.to_string(), *g),
                    z => Lost::Zoned(id.to_string(), *g, z.to_string()),
                })
                .collect();
            let ms = r.remaining.as_millis().min(u64::MAX as u128) as u64;
            (gone, ms, r.ring)
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// Untold holders as gossiped (key `doubts_untold`): a JSON list of
/// `[[[node_id, generation], ...], [[holder, owner], ...]]`, each naming
/// its region by the losses [`encode`] gives it — the two keys may reach
/// a peer a round apart, so by name, not by place.
pub fn encode_untold(regions: &[PublishedDoubt]) -> String {
    /// A region's losses, and its untold `(holder, owner)` pairs.
    type Named<'a> = (Vec<(&'a str, u64)>, Vec<(&'a str, &'a str)>);
    let list: Vec<Named<'_>> = regions
        .iter()
        .take(MAX_PUBLISHED)
        .filter(|r| !r.untold.is_empty())
        .map(|r| {
            let gone = r.gone.iter().take(MAX_TOMBSTONES);
            let untold = r.untold.iter().take(MAX_UNTOLD);
            (
                gone.map(|(id, g)| (&**id, *g)).collect(),
                untold.map(|(h, o)| (&**h, &**o)).collect(),
            )
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// A peer's regions, with the untold holders `untold` names for them;
/// malformed counts as none, and at most [`MAX_PUBLISHED`] regions of
/// [`MAX_TOMBSTONES`] members and [`MAX_UNTOLD`] untold holders are read.
/// Each region is read from its first three elements (the third may be
/// missing): a later release may add more.
pub fn parse(s: &str, untold: Option<&str>) -> Vec<PublishedDoubt> {
    let mut regions: Vec<PublishedDoubt> = serde_json::from_str::<Vec<Vec<serde_json::Value>>>(s)
        .unwrap_or_default()
        .into_iter()
        .take(MAX_PUBLISHED)
        .filter_map(|entry| {
            let mut entry = entry.into_iter();
            let gone: Vec<Lost> = serde_json::from_value(entry.next()?).ok()?;
            let ms: u64 = serde_json::from_value(entry.next()?).ok()?;
            // Malformed or missing: not named (the rebuild is trusted, as
            // an earlier word's was).
            let ring: RingName = entry
                .next()
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default();
            let mut r = PublishedDoubt {
                gone: Vec::new(),
                zones: Vec::new(),
                remaining: Duration::from_millis(ms),
                untold: Vec::new(),
                ring,
            };
            for lost in gone.into_iter().take(MAX_TOMBSTONES) {
                let (id, g, zone): (Arc<str>, u64, Option<String>) = match lost {
                    Lost::Zoned(id, g, z) => (Arc::from(id.as_str()), g, Some(z)),
                    Lost::Plain(id, g) => (Arc::from(id.as_str()), g, None),
                };
                if let Some(z) = zone.filter(|z| !z.is_empty()) {
                    r.zones.push((id.clone(), Arc::from(z.as_str())));
                }
                r.gone.push((id, g));
            }
            Some(r)
        })
        .collect();
    type Named = (Vec<(String, u64)>, Vec<(String, String)>);
    let named: Vec<Named> = untold
        .and_then(|u| serde_json::from_str(u).ok())
        .unwrap_or_default();
    for (gone, pairs) in named.into_iter().take(MAX_PUBLISHED) {
        let same = |r: &&mut PublishedDoubt| {
            r.gone.len() == gone.len()
                && r.gone
                    .iter()
                    .zip(&gone)
                    .all(|((a, g), (b, h))| **a == **b && g == h)
        };
        if let Some(r) = regions.iter_mut().find(same) {
            r.untold = pairs
                .into_iter()
                .take(MAX_UNTOLD)
                .map(|(h, o)| (Arc::from(h.as_str()), Arc::from(o.as_str())))
                .collect();
        }
    }
    regions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_round_trip_and_stay_bounded() {
        let r = PublishedDoubt {
            gone: vec![(Arc::from("a,\"b"), 7), (Arc::from("c"), u64::MAX)],
            zones: vec![(Arc::from("c"), Arc::from("eu-1a"))],
            remaining: Duration::from_millis(9_500),
            untold: Vec::new(),
            ring: (u64::MAX, 1_767_225_600_000),
        };
        let untold = PublishedDoubt {
            gone: vec![(Arc::from("c"), 3)],
            zones: Vec::new(),
            remaining: Duration::from_millis(100),
            untold: vec![(Arc::from("a"), Arc::from("c"))],
            ring: (0, 0),
        };
        let both = [r.clone(), untold.clone()];
        assert_eq!(
            parse(&encode(&both), Some(&encode_untold(&both))),
            both.to_vec()
        );
        // A reader of two elements reads every region (this release's
        // word to the one before it), and a region sent with two, or
        // with more than this release knows, is read from what it has.
        let sent: Vec<Vec<serde_json::Value>> = serde_json::from_str(&encode(&both)).unwrap();
        for region in sent {
            let first_two = serde_json::Value::Array(region[..2].to_vec());
            let _: (Vec<Lost>, u64) = serde_json::from_value(first_two).unwrap();
        }
        let earlier = parse(r#"[[[["a",1],["b",2]],5]]"#, None);
        assert_eq!(earlier[0].ring, (0, 0), "not named");
        let later = parse(r#"[[[["a",1],["b",2]],5,[7,9],"more"]]"#, None);
        assert_eq!(later[0].ring, (7, 9));
        assert_eq!(
            parse(r#"[[[["a",1],["b",2]],5,"junk"]]"#, None)[0].ring,
            (0, 0)
        );
        // Untold holders name their region by its losses: for another
        // region, or none, they are not read.
        assert!(
            parse(&encode(&both[..1]), Some(&encode_untold(&both)))[0]
                .untold
                .is_empty()
        );
        assert!(parse(&encode(&both), Some("not json"))[1].untold.is_empty());
        assert_eq!(
            parse(&encode(std::slice::from_ref(&r)), None),
            vec![r.clone()]
        );
        assert!(parse("not json", None).is_empty());
        let many = vec![r; 100];
        assert_eq!(parse(&encode(&many), None).len(), MAX_PUBLISHED);
        let wide: Vec<(Vec<(String, u64)>, u64)> =
            vec![((0..1_000).map(|i| (format!("n{i}"), i)).collect(), 1)];
        let wide = parse(&serde_json::to_string(&wide).unwrap(), None);
        assert_eq!(wide[0].gone.len(), MAX_TOMBSTONES);
        // A member naming no zone is sent as before zones were.
        assert_eq!(
            encode(&[PublishedDoubt {
                gone: vec![(Arc::from("a"), 1), (Arc::from("b"), 2)],
                zones: vec![(Arc::from("b"), Arc::from("z"))],
                remaining: Duration::from_millis(5),
                untold: Vec::new(),
                ring: (3, 4),
            }]),
            r#"[[[["a",1],["b",2,"z"]],5,[3,4]]]"#
        );
    }
}
