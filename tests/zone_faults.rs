//! A whole zone lost at once (issue 39), on real `sluice serve`
//! processes: six nodes in three zones of two, both nodes of one killed
//! (-9) together. With zones set (`cluster.zone`) every key the zone owned
//! has its replica in another zone and loses only its owner's replication
//! lag; without, the keys both of whose holders were in the zone are in
//! doubt. Every assertion is per key.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::eventually;
use common::procs::{Proc, channel, ports, rings_are, spawn};
use common::together::*;
use sluice::cluster::ring::Ring;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::store::key;

/// Six nodes in three zones of two; the zone lost is `ZONED[2]` and `[3]`.
const ZONED: [&str; 6] = ["node-0", "node-1", "node-2", "node-3", "node-4", "node-5"];
const ZONE_OF: [&str; 6] = ["z0", "z0", "z1", "z1", "z2", "z2"];
const ZONE_SURVIVORS: [&str; 4] = ["node-0", "node-1", "node-4", "node-5"];

/// What a zone loss did, per key: the keys the zone owned, what its
/// owners admitted within their last replication lag (a crash's loss),
/// and how long after the survivors' rings settled every key the zone
/// held a copy of elsewhere answered exactly again.
struct ZoneLoss {
    record: Record,
    owned: Vec<String>,
    lost: BTreeMap<String, i64>,
    killed: Instant,
}

/// Kill (-9) both nodes of zone z1 at once, callers on z0 and z2, `deny`,
/// `sync` and `local_share` keys a quarter short of their limit; the zone
/// stays down. `zoned`: every node names its zone. `exact` are the keys
/// that must answer exactly within 5 s of the survivors' rings settling,
/// `in_doubt` those that must stay in doubt (never exact) from the kill on.
async fn lose_a_zone(
    zoned: bool,
    keys_of: impl Fn(&Ring) -> (Vec<String>, Vec<String>),
) -> ZoneLoss {
    let gossip = ports(ZONED.len());
    let mut procs: Vec<Proc> = (0..ZONED.len())
        .map(|i| {
            let zone = ("SLUICE_CLUSTER__ZONE", ZONE_OF[i]);
            let grace = ("SLUICE_CLUSTER__IN_DOUBT_GRACE", GRACE);
            let env: &[(&str, &str)] = if zoned { &[grace, zone] } else { &[grace] };
            spawn(ZONED[i], gossip[i], &gossip, env)
        })
        .collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &ZONED,
        "six ready members",
        SETTLE,
    )
    .await;
    let ring = ring_of(&ZONED, |i| if zoned { ZONE_OF[i] } else { "" });
    let (exact, in_doubt) = keys_of(&ring);
    let in_zone = |id: &str| ["node-2", "node-3"].contains(&id);
    let mut keys: Vec<String> = exact.iter().chain(&in_doubt).cloned().collect();
    keys.extend(keys_where(&ring, "deny-c", 2, |o, _| !in_zone(o)));
    keys.extend(keys_where(&ring, "share-c", 2, |o, _| !in_zone(o)));
    let owned: Vec<String> = keys
        .iter()
        .filter(|k| in_zone(&ring.owner(&key::encode(NAME, k)).unwrap().node_id))
        .cloned()
        .collect();

    let mut via = Vec::new();
    for i in [0, 4] {
        via.push((
            procs[i].id.clone(),
            RateLimiterClient::new(channel(&procs[i]).await),
        ));
    }
    let callers = Callers::start(keys.clone(), via);
    callers.until_offered(BEFORE).await;
    let mut lag = Duration::ZERO;
    for p in &procs[2..4] {
        let us = p.metric("sluice_replication_lag_microseconds").await as u64;
        lag = lag.max(Duration::from_micros(us));
    }
    let round: Duration = humantime::parse_duration(common::procs::REPLICATE_INTERVAL).unwrap();
    for p in &mut procs[2..4] {
        p.child.kill().unwrap();
    }
    let killed = Instant::now();
    for p in &mut procs[2..4] {
        p.child.wait().unwrap();
    }
    let survivors: Vec<&Proc> = [0, 1, 4, 5].iter().map(|&i| &procs[i]).collect();
    rings_are(
        &survivors,
        &ZONE_SURVIVORS,
        "the zone out of the survivors' rings",
        SETTLE,
    )
    .await;
    let settled = Instant::now();

    let exact_after = callers
        .until_exact(&exact, settled, "the survivors' rings settled")
        .await;
    eventually(
        "the zone's keys in doubt",
        Duration::from_secs(5),
        || async { keys_in_doubt(&survivors).await >= in_doubt.len() as f64 },
    )
    .await;
    callers.until_offered(3 * LIMIT).await;
    let in_doubt_at_end = keys_in_doubt(&survivors).await;
    let record = callers.finish().await;
    for p in &survivors {
        let taken = p.metric("sluice_keys_taken_from_best_copy").await;
        assert_eq!(taken, 0.0, "{}: keys taken from a best copy", p.id);
    }
    assert!(
        in_doubt_at_end >= in_doubt.len() as f64 && (in_doubt_at_end == 0.0) == in_doubt.is_empty(),
        "{in_doubt_at_end} keys in doubt at the survivors at the end; {} asked about",
        in_doubt.len()
    );
    let since = killed - lag - round;
    let lost: BTreeMap<String, i64> = owned
        .iter()
        .map(|k| {
            let lost = if k.starts_with("sync") {
                0
            } else {
                record.lost_with(k, &["node-2", "node-3"], since, killed)
            };
            (k.clone(), lost)
        })
        .collect();
    println!(
        "zones {}: a zone of two killed (lag {lag:?} + round {round:?}); the survivors' rings settled {:?} after; every key held elsewhere exact {exact_after:?} after that; {} keys in doubt; lost with the owners per key {lost:?}; rollbacks {:?}; {}",
        if zoned { "on" } else { "off" },
        settled - killed,
        in_doubt.len(),
        keys.iter()
            .map(|k| (k.as_str(), record.rollback(k)))
            .filter(|(_, r)| *r > 0)
            .collect::<BTreeMap<_, _>>(),
        record.tally.summary(LIMIT)
    );
    assert!(record.call_errors.is_empty(), "{:?}", record.call_errors);
    ZoneLoss {
        record,
        owned,
        lost,
        killed,
    }
}

impl ZoneLoss {
    /// Per key: no exact answer counts back beyond what its owner admitted
    /// within its last replication lag; `deny` keys admit at most their
    /// limit plus that; keys the zone did not own are exact throughout.
    fn check(&self) {
        let mut wrong = Vec::new();
        for (k, answers) in &self.record.answers {
            let bound = self.lost.get(k).copied().unwrap_or(0);
            let admitted = self.record.tally.admitted[k];
            let rollback = self.record.rollback(k);
            let ok = rollback <= bound
                && if self.owned.contains(k) {
                    admitted <= LIMIT + bound
                } else {
                    admitted == LIMIT && rollback == 0 && answers.iter().all(|a| a.exact)
                };
            if !ok {
                wrong.push(format!(
                    "{k}: admitted {admitted}, rollback {rollback}, bound +{bound}; {}",
                    self.record.tally.by_node(k)
                ));
            }
        }
        assert!(wrong.is_empty(), "limit {LIMIT}: {wrong:#?}");
    }
}

/// Three zones, replicas in another zone than their owner: a whole zone
/// killed at once loses nothing beyond its owners' replication lag
/// (nothing of a `sync` key), puts no key in doubt, and every key it
/// owned answers exactly again within 5 s of the survivors' rings
/// settling, from its replica in another zone. The keys are ones whose
/// zone-blind replica holder is in the zone too: were placement blind to
/// zones, every one of them would be in doubt.
#[tokio::test(flavor = "multi_thread")]
async fn a_zone_killed_at_once_with_replicas_in_other_zones_loses_nothing() {
    let loss = lose_a_zone(true, |ring| {
        let in_zone = |id: &str| ["node-2", "node-3"].contains(&id);
        // Keys the zone both owns and, zone-blind, holds the replica of:
        // only placement by zone keeps a copy of them elsewhere.
        let blind = ring_of(&ZONED, |_| "");
        let mut owned = Vec::new();
        for kind in ["deny", "share", "sync"] {
            owned.extend(keys_where(&blind, kind, 3, |o, h| in_zone(o) && in_zone(h)));
        }
        for k in &owned {
            let holder = ring.successor(&key::encode(NAME, k)).unwrap();
            assert!(
                !in_zone(&holder.node_id),
                "{k}: a replica in its owner's zone"
            );
        }
        (owned, Vec::new())
    })
    .await;
    loss.check();
}

/// The same loss with zones off: keys whose owner and replica holder were
/// both in the zone are in doubt (`deny` refused, `local_share` on
/// leases, never an exact answer from what is left), the zone's other
/// keys are exact within 5 s from their replicas, and nothing rolls back.
#[tokio::test(flavor = "multi_thread")]
async fn a_zone_killed_at_once_without_zones_puts_its_keys_in_doubt() {
    let in_zone = |id: &str| ["node-2", "node-3"].contains(&id);
    let loss = lose_a_zone(false, |ring| {
        let (mut elsewhere, mut both) = (Vec::new(), Vec::new());
        for kind in ["deny", "share"] {
            elsewhere.extend(keys_where(ring, kind, 2, |o, h| in_zone(o) && !in_zone(h)));
            both.extend(keys_where(ring, &format!("{kind}-z"), 2, |o, h| {
                in_zone(o) && in_zone(h)
            }));
        }
        (elsewhere, both)
    })
    .await;
    loss.check();
    let mut wrong = Vec::new();
    for k in loss.owned.iter().filter(|k| k.contains("-z-")) {
        let answers = &loss.record.answers[k];
        // No survivor answers exactly from what is left.
        let exact_later = answers
            .iter()
            .filter(|a| a.exact && a.at > loss.killed && !in_zone(&a.owner))
            .count();
        let refused = answers.iter().filter(|a| a.unavailable).count();
        if exact_later > 0 || (is_deny(k) && refused == 0) || (!is_deny(k) && refused > 0) {
            wrong.push(format!(
                "{k}: {exact_later} exact answers after doubt began, {refused} refused; {}",
                loss.record.tally.by_node(k)
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
