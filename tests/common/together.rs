//! Faults that come together (issue 39), on real `sluice serve`
//! processes: the callers and the per-key record the tests of an owner
//! lost with its replica holder (`correlated_faults.rs`) and of a whole
//! zone lost at once (`zone_faults.rs`) share. One check per key per
//! round; every assertion is per key.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::cluster::ring::{Member, Ring};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::store::key;

use super::load::{Tally, YEAR_MS};
use super::{eventually, inline};

pub const NAME: &str = "together";
pub const LIMIT: i64 = 60;
/// Spent before the faults: a quarter of the limit left.
pub const BEFORE: i64 = 45;
/// Longer than the test: a key the holder's return does not resolve
/// stays in doubt (the default, 10 s, could end it by itself within the
/// 5 s this test allows after both are back).
pub const GRACE: &str = "120s";
/// One round of checks (one per key) per `PACE` once the keys are spent
/// down to `BEFORE`: what is left (15) lasts about 1.5 s of rounds.
pub const PACE: Duration = Duration::from_millis(100);
pub const SETTLE: Duration = Duration::from_secs(30);
/// The figure: once both are back, every key exact within 5 s.
pub const EXACT_WITHIN: Duration = Duration::from_secs(5);

/// One answer, as the rollback and crash-lag figures need it.
pub struct Answer {
    pub at: Instant,
    pub owner: String,
    pub admitted: bool,
    pub exact: bool,
    /// `STATUS_UNAVAILABLE`: how `deny` answers a key in doubt.
    pub unavailable: bool,
    pub remaining: i64,
}

/// Everything the callers got, per key.
#[derive(Default)]
pub struct Record {
    pub tally: Tally,
    pub answers: BTreeMap<String, Vec<Answer>>,
    /// Calls that failed (deadline, transport): none are expected.
    pub call_errors: Vec<String>,
}

impl Record {
    pub fn record(
        &mut self,
        k: &str,
        via: &str,
        got: Result<pb::RateLimitResponse, tonic::Status>,
    ) {
        match got {
            Ok(a) => {
                self.tally.record_answer(k, via, &a);
                let unavailable = a.status == pb::Status::Unavailable as i32;
                self.answers.entry(k.into()).or_default().push(Answer {
                    at: Instant::now(),
                    owner: a.owner.clone(),
                    admitted: super::under(&a),
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
    pub fn rollback(&self, k: &str) -> i64 {
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

    /// Per key: what owners killed at `killed` admitted that no one else
    /// received — their exact admissions from `since` (a replication
    /// round and lag before the fault) to their death. A crash's
    /// documented loss (its replication lag), stretched by any pause of
    /// the holder.
    pub fn lost_with(&self, k: &str, owners: &[&str], since: Instant, killed: Instant) -> i64 {
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

    pub fn exact_since(&self, k: &str, since: Instant) -> bool {
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
pub fn ring_of(ids: &[&str], zone_of: impl Fn(usize) -> &'static str) -> Ring {
    Ring::new(ids.iter().enumerate().map(|(i, id)| Member {
        node_id: (*id).into(),
        protocol: sluice::proto::PEER_PROTOCOL_VERSION,
        zone: zone_of(i).into(),
        ..Member::default()
    }))
}

/// `per` keys of `ring` whose owner and replica holder (node ids) pass `is`.
pub fn keys_where(
    ring: &Ring,
    prefix: &str,
    per: usize,
    is: impl Fn(&str, &str) -> bool,
) -> Vec<String> {
    keys_named(ring, NAME, prefix, per, is)
}

/// The same for keys of the limit `name`.
pub fn keys_named(
    ring: &Ring,
    name: &str,
    prefix: &str,
    per: usize,
    is: impl Fn(&str, &str) -> bool,
) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|k| {
            let at = key::encode(name, k);
            is(
                &ring.owner(&at).unwrap().node_id,
                &ring.successor(&at).unwrap().node_id,
            )
        })
        .take(per)
        .collect()
}

/// `deny` keys and `sync` keys (`deny` with synchronous replication) are
/// refused when their owner cannot answer; `share` keys decide on a lease.
pub fn is_deny(k: &str) -> bool {
    k.starts_with("deny") || k.starts_with("sync")
}

pub fn request(k: &str) -> pb::RateLimitRequest {
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
pub struct Callers {
    pub record: Arc<Mutex<Record>>,
    pub stop: Arc<std::sync::atomic::AtomicBool>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Callers {
    pub fn start(
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
                        let got = super::procs::check(client, vec![request(k)])
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

    pub fn min_offered(&self) -> i64 {
        self.record.lock().unwrap().tally.min_offered()
    }

    pub async fn until_offered(&self, n: i64) {
        eventually(
            &format!("every key offered {n} times"),
            Duration::from_secs(120),
            || async { self.min_offered() >= n },
        )
        .await;
    }

    pub async fn finish(self) -> Record {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.expect("callers");
        Arc::try_unwrap(self.record)
            .map_err(|_| "the callers' record still shared")
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

impl Callers {
    /// Wait until every key of `keys` answers exactly — at least two
    /// answers (both callers) in the last 300 ms, all exact — and return
    /// how long after `from` that was; fail, naming `after` and the keys
    /// not exact, once [`EXACT_WITHIN`] has passed.
    pub async fn until_exact(&self, keys: &[String], from: Instant, after: &str) -> Duration {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let since = Instant::now() - Duration::from_millis(300);
            let wrong: Vec<String> = {
                let record = self.record.lock().unwrap();
                keys.iter()
                    .filter(|k| {
                        record.answers[*k].iter().filter(|a| a.at >= since).count() < 2
                            || !record.exact_since(k, since)
                    })
                    .map(|k| format!("{k}: {}", record.tally.by_node(k)))
                    .collect()
            };
            if wrong.is_empty() {
                return from.elapsed();
            }
            assert!(
                from.elapsed() < EXACT_WITHIN,
                "not exact {EXACT_WITHIN:?} after {after}: {wrong:#?}"
            );
        }
    }
}

/// Keys in doubt at `procs` (the gauge counts the keys asked about, each
/// at its owner; it is refreshed now and then, not per decision).
pub async fn keys_in_doubt(procs: &[&super::procs::Proc]) -> f64 {
    let mut n = 0.0;
    for p in procs {
        n += p.metric("sluice_keys_in_doubt").await;
    }
    n
}
