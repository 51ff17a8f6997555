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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::load::{Tally, YEAR_MS};
use common::procs::{Proc, channel, generation_of, ports, rings_are, spawn};
use common::{eventually, inline};
use sluice::cluster::ring::{Member, Ring};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::store::key;

const NAME: &str = "together";
const LIMIT: i64 = 60;
/// Spent before the faults: a quarter of the limit left.
const BEFORE: i64 = 45;
/// Five, so the three that no fault touches are a majority: what they
/// refuse is refused for doubt, not for the minority rule.
const IDS: [&str; 5] = ["node-0", "node-1", "node-2", "node-3", "node-4"];
const SURVIVORS: [&str; 3] = ["node-0", "node-1", "node-4"];
/// Longer than the test: a key the holder's return does not resolve
/// stays in doubt (the default, 10 s, could end it by itself within the
/// 5 s this test allows after both are back).
const GRACE: &str = "120s";
/// The owner killed, and the holder of its keys' replicas, paused.
const OWNER: usize = 3;
const HOLDER: usize = 2;
/// How long after the pause the owner is killed: inside failure detection
/// (about 1 s), so the two are lost together.
const KILL_AFTER: Duration = Duration::from_millis(500);
/// One round of checks (one per key) per `PACE` once the keys are spent
/// down to `BEFORE`: what is left (15) lasts about 1.5 s of rounds.
const PACE: Duration = Duration::from_millis(100);
const SETTLE: Duration = Duration::from_secs(30);
/// The figure: once both are back, every key exact within 5 s.
const EXACT_WITHIN: Duration = Duration::from_secs(5);

/// One answer, as the rollback and crash-lag figures need it.
struct Answer {
    at: Instant,
    owner: String,
    admitted: bool,
    exact: bool,
    /// `STATUS_UNAVAILABLE`: how `deny` answers a key in doubt.
    unavailable: bool,
    remaining: i64,
}

/// Everything the callers got, per key.
#[derive(Default)]
struct Record {
    tally: Tally,
    answers: BTreeMap<String, Vec<Answer>>,
    /// Calls that failed (deadline, transport): none are expected.
    call_errors: Vec<String>,
}

impl Record {
    fn record(&mut self, k: &str, via: &str, got: Result<pb::RateLimitResponse, tonic::Status>) {
        match got {
            Ok(a) => {
                self.tally.record_answer(k, via, &a);
                let unavailable = a.status == pb::Status::Unavailable as i32;
                self.answers.entry(k.into()).or_default().push(Answer {
                    at: Instant::now(),
                    owner: a.owner.clone(),
                    admitted: common::under(&a),
                    exact: a.error.is_none() && !a.approximate && !unavailable,
                    unavailable,
                    remaining: a.remaining,
                });
            }
            Err(e) => self.call_errors.push(format!("{k} via {via}: {e}")),
        }
    }

    /// Per key: the most an exact answer's `remaining` rose above the
    /// lowest an earlier exact answer gave (nothing refills: any rise is
    /// a rollback).
    fn rollback(&self, k: &str) -> i64 {
        let mut lowest = i64::MAX;
        let mut worst = 0;
        for a in self
            .answers
            .get(k)
            .into_iter()
            .flatten()
            .filter(|a| a.exact)
        {
            worst = worst.max(a.remaining - lowest);
            lowest = lowest.min(a.remaining);
        }
        worst
    }

    /// Per key: what the killed owner admitted that its paused replica
    /// holder never received — its exact admissions from `since` (the
    /// pause less one replication round and lag) to its death. A crash's documented
    /// loss (its replication lag), here stretched by the pause.
    fn lost_with_the_owner(&self, k: &str, since: Instant, killed: Instant) -> i64 {
        self.lost_with(k, &[IDS[OWNER]], since, killed)
    }

    /// [`Record::lost_with_the_owner`] for owners `killed` at once.
    fn lost_with(&self, k: &str, owners: &[&str], since: Instant, killed: Instant) -> i64 {
        self.answers
            .get(k)
            .into_iter()
            .flatten()
            .filter(|a| {
                a.exact
                    && a.admitted
                    && owners.contains(&&*a.owner)
                    && a.at >= since
                    && a.at <= killed
            })
            .count() as i64
    }

    fn exact_since(&self, k: &str, since: Instant) -> bool {
        self.answers
            .get(k)
            .into_iter()
            .flatten()
            .filter(|a| a.at >= since)
            .all(|a| a.exact)
    }
}

/// The ring over `ids`, each in the zone `zone_of` names (empty: none),
/// as the nodes build it (a pure function of the ids and zones).
fn ring_of(ids: &[&str], zone_of: impl Fn(usize) -> &'static str) -> Ring {
    Ring::new(ids.iter().enumerate().map(|(i, id)| Member {
        node_id: (*id).into(),
        protocol: sluice::proto::PEER_PROTOCOL_VERSION,
        zone: zone_of(i).into(),
        ..Member::default()
    }))
}

/// `per` keys of `ring` whose owner and replica holder (node ids) pass `is`.
fn keys_where(
    ring: &Ring,
    prefix: &str,
    per: usize,
    is: impl Fn(&str, &str) -> bool,
) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|k| {
            let at = key::encode(NAME, k);
            is(
                &ring.owner(&at).unwrap().node_id,
                &ring.successor(&at).unwrap().node_id,
            )
        })
        .take(per)
        .collect()
}

/// `per` keys owned by `IDS[owner]` whose replica `IDS[holder]` holds, on
/// the ring over all five.
fn keys_held_by(prefix: &str, owner: usize, holder: Option<usize>, per: usize) -> Vec<String> {
    let ring = ring_of(&IDS, |_| "");
    keys_where(&ring, prefix, per, |o, h| {
        o == IDS[owner] && holder.is_none_or(|i| h == IDS[i])
    })
}

/// `deny` keys and `sync` keys (`deny` with synchronous replication) are
/// refused when their owner cannot answer; `share` keys decide on a lease.
fn is_deny(k: &str) -> bool {
    k.starts_with("deny") || k.starts_with("sync")
}

fn request(k: &str) -> pb::RateLimitRequest {
    let mode = if is_deny(k) {
        pb::OwnerUnreachable::Deny
    } else {
        pb::OwnerUnreachable::LocalShare
    };
    let replication = if k.starts_with("sync") {
        pb::Replication::Sync
    } else {
        pb::Replication::Async
    };
    pb::RateLimitRequest {
        on_owner_unreachable: mode as i32,
        replication: replication as i32,
        ..inline(NAME, k, LIMIT, YEAR_MS)
    }
}

/// The callers: one check per key per round, round-robin over `via`
/// (the two nodes no fault touches), until `stop`: the first `BEFORE`
/// rounds at once (spending the keys down to a quarter), then one round
/// every `PACE` (so the keys last through the faults).
struct Callers {
    record: Arc<Mutex<Record>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Callers {
    fn start(
        keys: Vec<String>,
        via: Vec<(String, RateLimiterClient<tonic::transport::Channel>)>,
    ) -> Callers {
        let record = Arc::new(Mutex::new(Record::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (record, stop) = (record.clone(), stop.clone());
            tokio::spawn(async move {
                let mut via = via;
                for round in 0usize.. {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    for (i, k) in keys.iter().enumerate() {
                        let n = via.len();
                        let (label, client) = &mut via[(round + i) % n];
                        let sent = Instant::now();
                        let got = common::procs::check(client, vec![request(k)])
                            .await
                            .map(|mut r| r.remove(0));
                        let mut record = record.lock().unwrap();
                        record.tally.latencies.push(sent.elapsed());
                        record.record(k, label, got);
                    }
                    if round + 1 >= BEFORE as usize {
                        tokio::time::sleep(PACE).await;
                    }
                }
            })
        };
        Callers { record, stop, task }
    }

    fn min_offered(&self) -> i64 {
        self.record.lock().unwrap().tally.min_offered()
    }

    async fn until_offered(&self, n: i64) {
        eventually(
            &format!("every key offered {n} times"),
            Duration::from_secs(120),
            || async { self.min_offered() >= n },
        )
        .await;
    }

    async fn finish(self) -> Record {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("callers");
        Arc::try_unwrap(self.record)
            .map_err(|_| "the callers' record still shared")
            .unwrap()
            .into_inner()
            .unwrap()
    }
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
    let in_doubt = || async {
        let mut n = 0.0;
        for p in &survivors {
            n += p.metric("sluice_keys_in_doubt").await;
        }
        n
    };
    eventually(
        "the keys of both in doubt",
        Duration::from_secs(5),
        || async { in_doubt().await >= both.len() as f64 },
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
    // At least two answers (both callers) since `since`, all of them exact.
    let not_exact = |record: &Record, since: Instant| -> Vec<String> {
        keys.iter()
            .filter(|k| {
                record.answers[*k].iter().filter(|a| a.at >= since).count() < 2
                    || !record.exact_since(k, since)
            })
            .map(|k| format!("{k}: {}", record.tally.by_node(k)))
            .collect()
    };
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let wrong = not_exact(
            &callers.record.lock().unwrap(),
            Instant::now() - Duration::from_millis(300),
        );
        if wrong.is_empty() {
            break;
        }
        assert!(
            whole.elapsed() < EXACT_WITHIN,
            "not exact {EXACT_WITHIN:?} after both were back ({back:?} after the pause; holder generation {holder_before:?} -> {holder_after:?}): {wrong:#?}"
        );
    }
    let exact_after = whole.elapsed();
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
                record.lost_with_the_owner(k, since, killed_at)
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

    let not_exact = |record: &Record, since: Instant| -> Vec<String> {
        exact
            .iter()
            .filter(|k| {
                record.answers[*k].iter().filter(|a| a.at >= since).count() < 2
                    || !record.exact_since(k, since)
            })
            .map(|k| format!("{k}: {}", record.tally.by_node(k)))
            .collect()
    };
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let since = Instant::now() - Duration::from_millis(300);
        let wrong = not_exact(&callers.record.lock().unwrap(), since);
        if wrong.is_empty() {
            break;
        }
        assert!(
            settled.elapsed() < EXACT_WITHIN,
            "not exact {EXACT_WITHIN:?} after the survivors' rings settled: {wrong:#?}"
        );
    }
    let exact_after = settled.elapsed();
    // Only the keys asked about are counted (each at its owner); the
    // gauge is refreshed now and then, not per decision.
    let counted = || async {
        let mut n = 0.0;
        for p in &survivors {
            n += p.metric("sluice_keys_in_doubt").await;
        }
        n
    };
    eventually(
        "the zone's keys in doubt",
        Duration::from_secs(5),
        || async { counted().await >= in_doubt.len() as f64 },
    )
    .await;
    callers.until_offered(3 * LIMIT).await;
    let in_doubt_at_end = counted().await;
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
