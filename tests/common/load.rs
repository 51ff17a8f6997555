//! A steady load for ownership-change tests: one request per key per round,
//! spread round-robin over the nodes currently in the target set, while the
//! test changes the cluster underneath. It records what DESIGN §7 needs:
//! per-key offered and admitted counts, client errors, approximate answers.
//!
//! Every key's limit lasts a year and nothing refills, so the exact
//! reference model admits exactly `limit` per key of what was offered: the
//! over-admission is `admitted ÷ (limit × keys) − 1`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::cluster::ring::{Member, Ring};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::store::key;
use tonic::transport::Channel;

use super::{inline, under};

pub const YEAR_MS: i64 = 365 * 24 * 3_600 * 1_000;

/// The callers' deadline in load tests.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_millis(100);

/// What a run of requests got.
#[derive(Default, Debug, Clone)]
pub struct Tally {
    pub admitted: BTreeMap<String, i64>,
    pub offered: BTreeMap<String, i64>,
    /// Admitted per (key, node asked).
    pub admitted_via: BTreeMap<(String, String), i64>,
    /// Admitted on an `approximate` answer, per (key, node asked): what a
    /// node decided without the owner.
    pub approximate_via: BTreeMap<(String, String), i64>,
    pub errors: usize,
    /// `UNAVAILABLE` answers (an error for `Load`, which expects none; a
    /// typed answer for `record_answer`, which counts them here).
    pub unavailable: usize,
    pub approximate: usize,
    /// The first few errors, to say what went wrong.
    pub first_errors: Vec<String>,
    /// Each call's latency from its *intended* start (see [`Schedule`]):
    /// a benchmark figure.
    pub latencies: Vec<Duration>,
    /// Per key, its answers in order as runs of alike ones (owner named,
    /// admitted, approximate; the nodes asked), with the `remaining` each run
    /// went through: the story a failed assertion tells.
    pub runs: BTreeMap<String, Vec<Run>>,
}

/// Consecutive answers for one key that agree on who decided and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub via: String,
    pub owner: String,
    pub admitted: bool,
    pub approximate: bool,
    pub count: u32,
    pub remaining: (i64, i64),
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x {}→{} {}{} r {}..{}",
            self.count,
            self.via,
            self.owner,
            if self.admitted { "ok" } else { "no" },
            if self.approximate { "~" } else { "" },
            self.remaining.0,
            self.remaining.1
        )
    }
}

impl Tally {
    pub fn record(&mut self, k: &str, via: &str, r: Result<pb::RateLimitResponse, tonic::Status>) {
        match r {
            Ok(a) if a.error.is_none() && a.status != pb::Status::Unavailable as i32 => {
                self.record_answer(k, via, &a);
            }
            other => {
                *self.offered.entry(k.into()).or_default() += 1;
                self.errors += 1;
                if self.first_errors.len() < 5 {
                    self.first_errors.push(format!("{k}: {other:?}"));
                }
            }
        }
    }

    /// One answer to a check of `k` sent to `via`.
    pub fn record_answer(&mut self, k: &str, via: &str, a: &pb::RateLimitResponse) {
        *self.offered.entry(k.into()).or_default() += 1;
        if a.error.is_some() {
            self.errors += 1;
            if self.first_errors.len() < 5 {
                self.first_errors.push(format!("{k}: {a:?}"));
            }
        }
        self.unavailable += usize::from(a.status == pb::Status::Unavailable as i32);
        self.approximate += usize::from(a.approximate);
        let admitted = i64::from(under(a));
        let runs = self.runs.entry(k.into()).or_default();
        match runs.last_mut() {
            Some(r)
                if r.owner == a.owner
                    && r.admitted == (admitted > 0)
                    && r.approximate == a.approximate =>
            {
                r.count += 1;
                r.remaining.1 = a.remaining;
                if !r.via.split('+').any(|v| v == via) {
                    r.via = format!("{}+{via}", r.via);
                }
            }
            _ => runs.push(Run {
                via: via.into(),
                owner: a.owner.clone(),
                admitted: admitted > 0,
                approximate: a.approximate,
                count: 1,
                remaining: (a.remaining, a.remaining),
            }),
        }
        *self.admitted.entry(k.into()).or_default() += admitted;
        *self.admitted_via.entry((k.into(), via.into())).or_default() += admitted;
        if a.approximate {
            *self
                .approximate_via
                .entry((k.into(), via.into()))
                .or_default() += admitted;
        }
    }

    /// Per key of `keys`: `via`, deciding without the owner, admitted at
    /// least `at_least` — its share of what it had seen, so a node that
    /// admits nothing when cut off cannot pass a fault test.
    pub fn assert_share(&self, keys: &[String], via: &str, at_least: i64) {
        self.assert_share_by(keys, via, |_, _| at_least);
    }

    /// [`Tally::assert_share`], each key's floor computed from the key and
    /// what `via` admitted of it exactly (through its owner) in the tally.
    pub fn assert_share_by(&self, keys: &[String], via: &str, at_least: impl Fn(&str, i64) -> i64) {
        let short: Vec<String> = keys
            .iter()
            .filter_map(|k| {
                let at = (k.clone(), via.to_string());
                let got = self.approximate_via.get(&at).copied().unwrap_or(0);
                let exact = self.admitted_via.get(&at).copied().unwrap_or(0) - got;
                let floor = at_least(k, exact);
                (got < floor).then(|| format!("{k}: {got} (floor {floor}, {exact} exact)"))
            })
            .collect();
        assert!(
            short.is_empty(),
            "{via} admitted less than its share without the owner: {short:?}"
        );
    }

    /// The 99th percentile of the calls' latencies (from intended start).
    pub fn p99(&self) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        l.get(l.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default()
    }

    pub fn min_offered(&self) -> i64 {
        self.offered.values().copied().min().unwrap_or(0)
    }

    /// Per key: the keys `touched` may admit up to `limit + bound`; every
    /// other key exactly `limit` (the reference, on frozen clocks or limits
    /// that do not refill within the test). Panics naming each key that
    /// does not hold, and unless every key was offered 3× its limit.
    pub fn assert_per_key(&self, limit: i64, touched: impl Fn(&str) -> bool, bound: i64) {
        let mut wrong = Vec::new();
        for (k, &n) in &self.offered {
            assert!(n >= 3 * limit, "{k}: only {n} offered");
            let admitted = self.admitted.get(k).copied().unwrap_or(0);
            let ok = if touched(k) {
                admitted <= limit + bound
            } else {
                admitted == limit
            };
            if !ok {
                wrong.push(format!(
                    "{k} ({}): admitted {admitted} {}",
                    if touched(k) { "touched" } else { "untouched" },
                    self.by_node(k)
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "limit {limit}, touched keys within +{bound}: {wrong:?}"
        );
    }

    /// Where `k`'s admissions came from: per node asked, admitted (of
    /// which on an approximate answer).
    pub fn by_node(&self, k: &str) -> String {
        let parts: Vec<String> = self
            .admitted_via
            .iter()
            .filter(|((key, _), _)| key == k)
            .map(|((_, via), n)| {
                let approx = self
                    .approximate_via
                    .get(&(k.to_string(), via.clone()))
                    .copied()
                    .unwrap_or(0);
                format!("{via} {n} ({approx} approximate)")
            })
            .collect();
        let runs: Vec<String> = self
            .runs
            .get(k)
            .into_iter()
            .flatten()
            .map(Run::to_string)
            .collect();
        format!("[{}] answers: {}", parts.join(", "), runs.join(" | "))
    }

    /// The largest over-admission of one key (admitted − limit).
    pub fn worst(&self, limit: i64) -> i64 {
        self.admitted.values().map(|a| a - limit).max().unwrap_or(0)
    }

    /// Admitted ÷ reference − 1; panics unless every key was offered at
    /// least 3× its limit (DESIGN §7).
    pub fn over_admission(&self, limit: i64) -> f64 {
        for (k, &n) in &self.offered {
            assert!(n >= 3 * limit, "{k}: only {n} offered");
        }
        let admitted: i64 = self.admitted.values().sum();
        admitted as f64 / (limit * self.offered.len() as i64) as f64 - 1.0
    }

    /// The figure line a test prints.
    pub fn summary(&self, limit: i64) -> String {
        let admitted: i64 = self.admitted.values().sum();
        format!(
            "admitted {admitted} of reference {} over {} keys ({} requests): over-admission {:.2}% (worst key {:+}), {} approximate, {} errors, p99 {:?} from intended start",
            limit * self.offered.len() as i64,
            self.offered.len(),
            self.offered.values().sum::<i64>(),
            self.over_admission(limit) * 100.0,
            self.worst(limit),
            self.approximate,
            self.errors,
            self.p99(),
        )
    }
}

/// A fixed schedule for a caller that sends one call at a time: call `n`
/// is intended to start at `start + n × period`.
///
/// Latency is timed from that intended start, not from when the call was
/// actually sent (coordinated omission, as `sluice bench` measures it): a
/// caller stuck in a slow call sends its next ones late, and timing them
/// from when they went out would hide the stall — the calls that should
/// have gone during it would never be timed. A slot already past is not
/// skipped: the call goes at once and its latency includes how late it
/// started. (Waiting uses tokio's timer, 1 ms resolution: a call on time
/// may start up to about a millisecond after its slot, and that counts
/// too, so the figures err high by at most that much.)
pub struct Schedule {
    start: Instant,
    period: Duration,
    n: u32,
}

impl Schedule {
    pub fn new(period: Duration) -> Schedule {
        Schedule {
            start: Instant::now(),
            period,
            n: 0,
        }
    }

    /// Wait for the next call's slot (at once if it has passed); its
    /// intended start, to time the call from.
    pub async fn next(&mut self) -> Instant {
        let intended = self.start + self.period * self.n;
        self.n += 1;
        tokio::time::sleep_until(intended.into()).await;
        intended
    }
}

/// `per` keys owned by each of `ids` on the ring over `ids` (the ring is a
/// pure function of the node ids).
pub fn keys_owned_by(ids: &[&str], name: &str, per: usize) -> Vec<String> {
    let ring = Ring::new(ids.iter().map(|id| Member {
        node_id: (*id).into(),
        generation: 0,
        grpc_addr: String::new(),
        protocol: sluice::proto::PEER_PROTOCOL_VERSION,
        zone: Default::default(),
    }));
    let mut keys = Vec::new();
    for owner in ids {
        keys.extend(
            (0..)
                .map(|i| format!("{owner}-k{i}"))
                .filter(|k| &*ring.owner(&key::encode(name, k)).unwrap().node_id == *owner)
                .take(per),
        );
    }
    keys
}

/// A running load; `finish` stops it once every key has been offered
/// enough.
pub struct Load {
    targets: Arc<Mutex<Vec<(String, Channel)>>>,
    tally: Arc<Mutex<Tally>>,
    stop_at: Arc<std::sync::atomic::AtomicI64>,
    stopped: Arc<AtomicBool>,
    rounds: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Start offering `name`/`keys` at `limit` per year, one round every
    /// `pace` (its calls spread evenly over it, on a [`Schedule`], so each
    /// latency is timed from the call's intended start), to `targets`
    /// (label, channel).
    pub fn start(
        name: &str,
        keys: Vec<String>,
        limit: i64,
        pace: Duration,
        targets: Vec<(String, Channel)>,
    ) -> Load {
        let targets = Arc::new(Mutex::new(targets));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop_at = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
        let stopped = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task = {
            let (targets, tally, stop_at, stopped, rounds) = (
                targets.clone(),
                tally.clone(),
                stop_at.clone(),
                stopped.clone(),
                rounds.clone(),
            );
            let name = name.to_string();
            let mut schedule = Schedule::new(pace / keys.len().max(1) as u32);
            tokio::spawn(async move {
                for round in 0usize.. {
                    if tally.lock().unwrap().min_offered() >= stop_at.load(Ordering::SeqCst) {
                        break;
                    }
                    rounds.store(round, Ordering::SeqCst);
                    let round_targets = targets.lock().unwrap().clone();
                    for (i, k) in keys.iter().enumerate() {
                        let (via, channel) = &round_targets[(round + i) % round_targets.len()];
                        let intended = schedule.next().await;
                        let mut request = tonic::Request::new(pb::CheckRequest {
                            requests: vec![inline(&name, k, limit, YEAR_MS)],
                        });
                        // The callers' explicit deadline.
                        request.set_timeout(DEADLINE);
                        let r = RateLimiterClient::new(channel.clone())
                            .check(request)
                            .await
                            .map(|r| r.into_inner().responses.remove(0));
                        let mut t = tally.lock().unwrap();
                        t.latencies.push(intended.elapsed());
                        t.record(k, via, r);
                    }
                }
                stopped.store(true, Ordering::SeqCst);
            })
        };
        Load {
            targets,
            tally,
            stop_at,
            stopped,
            rounds,
            task,
        }
    }

    /// Stop sending to `label` (a node about to leave, as a load balancer
    /// drops an endpoint that is terminating), once the round in flight,
    /// which may still use it, is over.
    pub async fn drop_target(&self, label: &str) {
        self.targets.lock().unwrap().retain(|(l, _)| l != label);
        let now = self.rounds.load(Ordering::SeqCst);
        super::eventually(
            "the round in flight to end",
            Duration::from_secs(30),
            || async {
                self.rounds.load(Ordering::SeqCst) > now || self.stopped.load(Ordering::SeqCst)
            },
        )
        .await;
    }

    pub fn add_target(&self, label: &str, channel: Channel) {
        self.targets
            .lock()
            .unwrap()
            .push((label.to_string(), channel));
    }

    pub fn snapshot(&self) -> Tally {
        self.tally.lock().unwrap().clone()
    }

    /// Wait until every key has been offered `n` times.
    pub async fn until_offered(&self, n: i64) {
        super::eventually(
            &format!("every key offered {n} times"),
            Duration::from_secs(120),
            || async { self.snapshot().min_offered() >= n || self.stopped.load(Ordering::SeqCst) },
        )
        .await;
    }

    /// Run until every key was offered `n` times, then stop; the tally.
    pub async fn finish(self, n: i64) -> Tally {
        self.stop_at.store(n, Ordering::SeqCst);
        self.task.await.expect("load task");
        Arc::try_unwrap(self.tally)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|a| a.lock().unwrap().clone())
    }
}
