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
    /// How long the region stays open from when it was published.
    pub remaining: Duration,
}

/// As gossiped: a JSON list of `[[[node_id, generation], ...], ms]`.
pub fn encode(regions: &[PublishedDoubt]) -> String {
    let list: Vec<(Vec<(&str, u64)>, u64)> = regions
        .iter()
        .take(MAX_PUBLISHED)
        .map(|r| {
            let gone = r.gone.iter().take(MAX_TOMBSTONES);
            let gone = gone.map(|(id, g)| (&**id, *g)).collect();
            (gone, r.remaining.as_millis().min(u64::MAX as u128) as u64)
        })
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// A peer's regions; malformed counts as none, and at most
/// [`MAX_PUBLISHED`] regions of [`MAX_TOMBSTONES`] members are read.
pub fn parse(s: &str) -> Vec<PublishedDoubt> {
    serde_json::from_str::<Vec<(Vec<(String, u64)>, u64)>>(s)
        .unwrap_or_default()
        .into_iter()
        .take(MAX_PUBLISHED)
        .map(|(gone, ms)| PublishedDoubt {
            gone: gone
                .into_iter()
                .take(MAX_TOMBSTONES)
                .map(|(id, g)| (Arc::from(id.as_str()), g))
                .collect(),
            remaining: Duration::from_millis(ms),
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
    }
}
