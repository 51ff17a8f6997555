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
}

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

/// As gossiped: a JSON list of `[[[node_id, generation(, zone)], ...], ms]`.
pub fn encode(regions: &[PublishedDoubt]) -> String {
    let list: Vec<(Vec<Lost>, u64)> = regions
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
            (gone, r.remaining.as_millis().min(u64::MAX as u128) as u64)
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// A peer's regions; malformed counts as none, and at most
/// [`MAX_PUBLISHED`] regions of [`MAX_TOMBSTONES`] members are read.
pub fn parse(s: &str) -> Vec<PublishedDoubt> {
    serde_json::from_str::<Vec<(Vec<Lost>, u64)>>(s)
        .unwrap_or_default()
        .into_iter()
        .take(MAX_PUBLISHED)
        .map(|(gone, ms)| {
            let mut r = PublishedDoubt {
                gone: Vec::new(),
                zones: Vec::new(),
                remaining: Duration::from_millis(ms),
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
            r
        })
        .collect()
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
        };
        assert_eq!(parse(&encode(std::slice::from_ref(&r))), vec![r.clone()]);
        assert!(parse("not json").is_empty());
        let many = vec![r; 100];
        assert_eq!(parse(&encode(&many)).len(), MAX_PUBLISHED);
        let wide: Vec<(Vec<(String, u64)>, u64)> =
            vec![((0..1_000).map(|i| (format!("n{i}"), i)).collect(), 1)];
        let wide = parse(&serde_json::to_string(&wide).unwrap());
        assert_eq!(wide[0].gone.len(), MAX_TOMBSTONES);
        // A member naming no zone is sent as before zones were.
        assert_eq!(
            encode(&[PublishedDoubt {
                gone: vec![(Arc::from("a"), 1), (Arc::from("b"), 2)],
                zones: vec![(Arc::from("b"), Arc::from("z"))],
                remaining: Duration::from_millis(5),
            }]),
            r#"[[[["a",1],["b",2,"z"]],5]]"#
        );
    }
}
