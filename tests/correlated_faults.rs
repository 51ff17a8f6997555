//! Faults that come together, on real `sluice serve` processes (issue 39):
//! an owner killed (-9) while the node holding its replica is paused
//! (SIGSTOP) past failure detection. Before the in-doubt rule a third node
//! answered such keys *exactly* from an old copy it happened to hold — a
//! key answered `remaining 4`, then `remaining 42` — and `deny` keys were
//! admitted past their limit by exact answers. Every assertion is per key.
//! `sync` keys (`deny`, synchronous replication) lose nothing at all: no
//! rollback, never past their limit.
//!
//! Intervals as in `common::procs` (gossip 100 ms, replication 20 ms, dead
//! grace 2 s): failure detection about 1 s, a burial 2 s after it.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::eventually;
use common::procs::{Proc, channel, generation_of, ports, rings_are, spawn};
use common::together::*;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;

/// Five, so the three that no fault touches are a majority: what they
/// refuse is refused for doubt, not for the minority rule.
const IDS: [&str; 5] = ["node-0", "node-1", "node-2", "node-3", "node-4"];
const SURVIVORS: [&str; 3] = ["node-0", "node-1", "node-4"];
/// The owner killed, and the holder of its keys' replicas, paused.
const OWNER: usize = 3;
const HOLDER: usize = 2;
/// How long after the pause the owner is killed: inside failure detection
/// (about 1 s), so the two are lost together.
const KILL_AFTER: Duration = Duration::from_millis(500);

/// `per` keys owned by `IDS[owner]` whose replica `IDS[holder]` holds, on
/// the ring over all five.
fn keys_held_by(prefix: &str, owner: usize, holder: Option<usize>, per: usize) -> Vec<String> {
    let ring = ring_of(&IDS, |_| "");
    keys_where(&ring, prefix, per, |o, h| {
        o == IDS[owner] && holder.is_none_or(|i| h == IDS[i])
    })
}

/// An owner killed while its replica holder is paused past its burial
/// (so it comes back either at its generation or, rejoining, at a newer
/// one: both must end the doubt), `deny` and `local_share` keys a quarter short of their
/// limit: per key, no exact answer counts back beyond what the owner
/// admitted after its holder stopped (the crash's loss, stretched by the
/// pause: nobody else ever received it); `deny` keys admit at most their
/// limit plus that; the keys are in doubt meanwhile (`deny` refused, no
/// exact answer from a stale copy); once both nodes are back every key is
/// exact within 5 s; keys whose owner lived are exact throughout.
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_killed_while_its_replica_holder_is_paused_rolls_nothing_back() {
    let gossip = ports(IDS.len());
    let env = [("SLUICE_CLUSTER__IN_DOUBT_GRACE", GRACE)];
    let mut procs: Vec<Proc> = (0..IDS.len())
        .map(|i| spawn(IDS[i], gossip[i], &gossip, &env))
        .collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &IDS,
        "five ready members",
        SETTLE,
    )
    .await;

    let mut both = keys_held_by("deny", OWNER, Some(HOLDER), 3);
    both.extend(keys_held_by("share", OWNER, Some(HOLDER), 3));
    both.extend(keys_held_by("sync", OWNER, Some(HOLDER), 2));
    let mut untouched = keys_held_by("deny-c", 0, None, 2);
    untouched.extend(keys_held_by("share-c", 1, None, 2));
    // Synchronous keys whose owner and replica holder no fault touches:
    // their owner waits for a live holder, exact throughout.
    untouched.extend(keys_held_by("sync-c", 0, Some(1), 2));
    let keys: Vec<String> = both.iter().chain(&untouched).cloned().collect();

    let mut via = Vec::new();
    for p in &procs[..2] {
        via.push((p.id.clone(), RateLimiterClient::new(channel(p).await)));
    }
    let started = Instant::now();
    let callers = Callers::start(keys.clone(), via);
    callers.until_offered(BEFORE).await;
    let lag = Duration::from_micros(
        procs[OWNER]
            .metric("sluice_replication_lag_microseconds")
            .await as u64,
    );
    let round: Duration = humantime::parse_duration(common::procs::REPLICATE_INTERVAL).unwrap();

    let holder_before = generation_of(&procs[0], IDS[HOLDER]);
    // The holder stops; the owner dies before anyone has noticed.
    assert!(procs[HOLDER].signal("STOP"));
    let paused = Instant::now();
    tokio::time::sleep(KILL_AFTER).await;
    procs[OWNER].child.kill().unwrap();
    procs[OWNER].child.wait().unwrap();
    let killed_at = Instant::now();
    let killed = paused.elapsed();

    // Both leave the survivors' rings (detected, then buried); their keys
    // are in doubt now, and stay so while the callers go on.
    let survivors: Vec<&Proc> = [0, 1, 4].iter().map(|&i| &procs[i]).collect();
    rings_are(
        &survivors,
        &SURVIVORS,
        "both out of the survivors' rings",
        SETTLE,
    )
    .await;
    let both_out = paused.elapsed();
    // Every key of the two is in doubt at its new owner (the callers ask
    // about each every round).
    eventually(
        "the keys of both in doubt",
        Duration::from_secs(5),
        || async { keys_in_doubt(&survivors).await >= both.len() as f64 },
    )
    .await;

    // The holder resumes, the owner restarts (a new process: its counts
    // died with it), and both are back in every ring.
    assert!(procs[HOLDER].signal("CONT"));
    procs[OWNER] = spawn(IDS[OWNER], gossip[OWNER], &gossip, &env);
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &IDS,
        "both back in every ring",
        SETTLE,
    )
    .await;
    let whole = Instant::now();
    let back = paused.elapsed();
    let holder_after = generation_of(&procs[0], IDS[HOLDER]);
    let after = format!(
        "both were back ({back:?} after the pause; holder generation {holder_before:?} -> {holder_after:?})"
    );
    let exact_after = callers.until_exact(&keys, whole, &after).await;
    callers.until_offered(3 * LIMIT).await;
    let record = callers.finish().await;
    // The holder came back: no key was taken from a best copy, anywhere.
    for p in &procs {
        let taken = p.metric("sluice_keys_taken_from_best_copy").await;
        assert_eq!(taken, 0.0, "{}: keys taken from a best copy", p.id);
    }

    // What the owner admitted that its stopped holder never got: nothing
    // of a synchronous key (each exact answer waited for the holder).
    let since = paused - lag - round;
    let lost: BTreeMap<&str, i64> = both
        .iter()
        .map(|k| {
            let lost = if k.starts_with("sync") {
                0
            } else {
                record.lost_with(k, &[IDS[OWNER]], since, killed_at)
            };
            (k.as_str(), lost)
        })
        .collect();
    let rollbacks: BTreeMap<&str, i64> = keys
        .iter()
        .map(|k| (k.as_str(), record.rollback(k)))
        .filter(|(_, r)| *r > 0)
        .collect();
    println!(
        "owner killed {killed:?} into its holder's pause (lag {lag:?} + round {round:?}); both out of the rings at {both_out:?}, back at {back:?}; every key exact {exact_after:?} after (the holder's generation {holder_before:?} -> {holder_after:?}); lost with the owner per key {lost:?}; rollbacks {rollbacks:?}; {}",
        record.tally.summary(LIMIT)
    );

    assert!(record.call_errors.is_empty(), "{:?}", record.call_errors);
    let mut wrong = Vec::new();
    for k in &keys {
        let bound = lost.get(k.as_str()).copied().unwrap_or(0);
        let admitted = record.tally.admitted[k];
        let rollback = record.rollback(k);
        let deny = is_deny(k);
        let unavailable = record.answers[k].iter().filter(|a| a.unavailable).count();
        // `deny` keys are refused while in doubt (so the fault did hit
        // them); `local_share` keys are never refused for it.
        let ok = rollback <= bound
            && (deny || unavailable == 0)
            && if lost.contains_key(k.as_str()) {
                admitted <= LIMIT + bound && (!deny || unavailable > 0)
            } else {
                // Their owner lived: exact throughout.
                admitted == LIMIT && rollback == 0 && record.exact_since(k, started)
            };
        if !ok {
            wrong.push(format!(
                "{k}: admitted {admitted}, rollback {rollback}, bound +{bound}, {unavailable} unavailable; {}",
                record.tally.by_node(k)
            ));
        }
    }
    assert!(wrong.is_empty(), "limit {LIMIT}: {wrong:#?}");
}
