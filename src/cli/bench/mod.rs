//! `sluice bench`: a load generator for one node or a cluster.
//!
//! Closed loop (`--concurrency` callers, each waiting for its answer) or open
//! loop (`--rate` calls per second on a fixed schedule, whatever the answers
//! do). Open-loop latency is measured from each call's *intended* start, so
//! a stall shows up in the percentiles instead of silently lowering the
//! offered load (coordinated omission). Percentiles come from an HDR
//! histogram; progress prints every second to stderr; `--json` prints the
//! summary as one object.
//!
//! `--target redis` aims the same generator at Redis running a token-bucket
//! Lua script (`redis.rs`): the design Sluice replaces, measured the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

pub(super) mod redis;

use super::{CliResult, connect};
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_client::RateLimiterClient;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// sluice, client (through sluice-client, as an app calls: with
    /// `--mode tiered`, on allotments held in this process), or redis (a
    /// token-bucket Lua script by EVALSHA: the baseline).
    #[arg(long, default_value = "sluice", value_parser = ["sluice", "client", "redis"])]
    target: String,
    /// Node gRPC addresses (or, for redis, one Redis host:port),
    /// comma-separated; calls go round-robin.
    #[arg(long, default_value = "127.0.0.1:8081", value_delimiter = ',')]
    addr: Vec<String>,
    /// How long to run, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Callers in flight (closed loop), or the cap on calls in flight (open loop).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Open loop: calls per second on a fixed schedule. Unset: closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Decisions per Check call.
    #[arg(long, default_value_t = 1)]
    items: usize,
    /// The counters' name (keys are `k0`, `k1`, … under it).
    #[arg(long, default_value = "bench")]
    name: String,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Pad each unique key with zeros to this many bytes (`k0000…42`), as
    /// API keys are; 0: as short as the number (`k42`).
    #[arg(long, default_value_t = 0)]
    key_bytes: usize,
    /// uniform, zipf (exponent --zipf-s), hot (every request one key) or
    /// seq (each key in turn: touches all of them in --keys decisions).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "zipf", "hot", "seq"])]
    dist: String,
    #[arg(long, default_value_t = 1.0)]
    zipf_s: f64,
    /// The limit per key and its period.
    #[arg(long, default_value_t = 1_000)]
    limit: i64,
    #[arg(long, default_value_t = 1_000)]
    duration_ms: i64,
    /// token_bucket, gcra, leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log.
    #[arg(long, default_value = "token_bucket")]
    algorithm: String,
    /// Ask owners to skip forward batching.
    #[arg(long)]
    skip_batching: bool,
    /// exact (every decision by the key's owner) or tiered (local
    /// allotments: the hot-key mode).
    #[arg(long, default_value = "exact", value_parser = ["exact", "tiered"])]
    mode: String,
    /// async (the owner answers at once) or sync (the owner answers once
    /// its replica holder has the decision: a peer round trip more).
    #[arg(long, default_value = "async", value_parser = ["async", "sync"])]
    replication: String,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Key picker for the chosen distribution.
enum Keys {
    Uniform(u64),
    /// Cumulative weights for Zipf over the keys, for binary search.
    Zipf(Vec<f64>),
    Hot,
    Seq(AtomicU64, u64),
}

impl Keys {
    fn new(args: &BenchArgs) -> Keys {
        match args.dist.as_str() {
            "hot" => Keys::Hot,
            "seq" => Keys::Seq(AtomicU64::new(0), args.keys.max(1)),
            "zipf" => {
                let mut acc = 0.0;
                let cdf = (1..=args.keys.max(1))
                    .map(|k| {
                        acc += 1.0 / (k as f64).powf(args.zipf_s);
                        acc
                    })
                    .collect::<Vec<_>>();
                let total = acc;
                Keys::Zipf(cdf.into_iter().map(|c| c / total).collect())
            }
            _ => Keys::Uniform(args.keys.max(1)),
        }
    }

    fn pick(&self, rng: &mut fastrand::Rng) -> u64 {
        match self {
            Keys::Uniform(n) => rng.u64(..*n),
            Keys::Zipf(cdf) => cdf.partition_point(|&c| c < rng.f64()) as u64,
            Keys::Hot => 0,
            Keys::Seq(next, n) => next.fetch_add(1, Ordering::Relaxed) % n,
        }
    }
}

/// Counters shared by the callers.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    decisions: AtomicU64,
    admitted: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
    approximate: AtomicU64,
    errors: AtomicU64,
}

/// Where the calls go.
enum Target {
    Sluice(Vec<RateLimiterClient<Channel>>),
    /// The app library: one decision per call.
    Client(sluice_client::Client),
    /// One connection per caller; a tokio Mutex, as a call holds it across
    /// its round trip (in the closed loop each caller has its own anyway).
    Redis(Vec<tokio::sync::Mutex<redis::Conn>>),
}

/// One decision's outcome, whichever the target.
enum Outcome {
    Admitted,
    Refused,
    Unavailable,
    Error,
}

struct Run {
    args: BenchArgs,
    keys: Keys,
    target: Target,
    tally: Tally,
    /// Latency in microseconds. A std Mutex: held only to record a value.
    latency: Mutex<Histogram<u64>>,
    /// Open loop: how late each call's task started after its intended
    /// start, in microseconds — the generator's own delay, before any
    /// network or server. When it is large, the latency is the generator's.
    late: Mutex<Histogram<u64>>,
    /// The client target: each decision's time in the library, in ns (an
    /// allotment decided in process takes a few µs; the latency histogram
    /// counts whole µs).
    decide_ns: Mutex<Histogram<u64>>,
    /// The same, of the decisions made in process (no call).
    in_process_ns: Mutex<Histogram<u64>>,
    algorithm: i32,
}

impl Run {
    /// The next key: `k<n>`, padded to `--key-bytes`.
    fn unique_key(&self, rng: &mut fastrand::Rng) -> String {
        let n = self.keys.pick(rng);
        format!(
            "k{n:0>width$}",
            width = self.args.key_bytes.saturating_sub(1)
        )
    }

    fn request(&self, rng: &mut fastrand::Rng) -> pb::CheckRequest {
        let requests = (0..self.args.items.max(1))
            .map(|_| pb::RateLimitRequest {
                name: self.args.name.clone(),
                unique_key: self.unique_key(rng),
                limit: self.args.limit,
                duration_ms: Some(self.args.duration_ms),
                algorithm: self.algorithm,
                skip_batching: self.args.skip_batching,
                mode: if self.args.mode == "tiered" {
                    pb::Mode::Tiered
                } else {
                    pb::Mode::Exact
                } as i32,
                replication: if self.args.replication == "sync" {
                    pb::Replication::Sync
                } else {
                    pb::Replication::Async
                } as i32,
                ..Default::default()
            })
            .collect();
        pb::CheckRequest { requests }
    }

    /// Record how late a scheduled call's task started.
    fn record_late(&self, intended: Instant) {
        let micros = intended.elapsed().as_micros() as u64;
        if let Ok(mut h) = self.late.lock() {
            let _ = h.record(micros.max(1));
        }
    }

    /// One call; latency from `intended` (the schedule's start time).
    async fn call(&self, n: u64, intended: Instant, rng: &mut fastrand::Rng) {
        let outcomes = match &self.target {
            Target::Sluice(clients) => self.call_sluice(clients, n, rng).await,
            Target::Client(client) => self.call_client(client, rng).await,
            Target::Redis(conns) => self.call_redis(conns, n, rng).await,
        };
        let micros = intended.elapsed().as_micros() as u64;
        if let Ok(mut h) = self.latency.lock() {
            let _ = h.record(micros.max(1));
        }
        let t = &self.tally;
        t.calls.fetch_add(1, Ordering::Relaxed);
        let Some(outcomes) = outcomes else {
            t.errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        for (outcome, approximate) in outcomes {
            t.decisions.fetch_add(1, Ordering::Relaxed);
            let counter = match outcome {
                Outcome::Admitted => &t.admitted,
                Outcome::Refused => &t.refused,
                Outcome::Unavailable => &t.unavailable,
                Outcome::Error => &t.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if approximate {
                t.approximate.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn call_sluice(
        &self,
        clients: &[RateLimiterClient<Channel>],
        n: u64,
        rng: &mut fastrand::Rng,
    ) -> Option<Vec<(Outcome, bool)>> {
        let mut client = clients[n as usize % clients.len()].clone();
        let answer = client.check(self.request(rng)).await.ok()?;
        Some(
            answer
                .into_inner()
                .responses
                .into_iter()
                .map(|a| {
                    let outcome = match (a.error.is_some(), pb::Status::try_from(a.status)) {
                        (true, _) => Outcome::Error,
                        (_, Ok(pb::Status::UnderLimit)) => Outcome::Admitted,
                        (_, Ok(pb::Status::OverLimit)) => Outcome::Refused,
                        _ => Outcome::Unavailable,
                    };
                    (outcome, a.approximate)
                })
                .collect(),
        )
    }

    async fn call_client(
        &self,
        client: &sluice_client::Client,
        rng: &mut fastrand::Rng,
    ) -> Option<Vec<(Outcome, bool)>> {
        let mut check = sluice_client::Check::inline(
            &self.args.name,
            &self.unique_key(rng),
            u64::try_from(self.args.limit).unwrap_or(0),
            Duration::from_millis(u64::try_from(self.args.duration_ms).unwrap_or(0)),
        );
        if self.args.mode == "tiered" {
            check = check.tiered();
        }
        let started = Instant::now();
        let d = client.check(&check).await;
        let ns = started.elapsed().as_nanos() as u64;
        if let Ok(mut h) = self.decide_ns.lock() {
            let _ = h.record(ns.max(1));
        }
        if d.as_ref().is_ok_and(|d| d.in_process)
            && let Ok(mut h) = self.in_process_ns.lock()
        {
            let _ = h.record(ns.max(1));
        }
        let outcome = match d {
            Err(_) => (Outcome::Error, false),
            Ok(d) => match d.source {
                sluice_client::Source::Unavailable => (Outcome::Unavailable, false),
                sluice_client::Source::Sluice { approximate } if d.allowed => {
                    (Outcome::Admitted, approximate)
                }
                sluice_client::Source::Sluice { approximate } => (Outcome::Refused, approximate),
            },
        };
        Some(vec![outcome])
    }

    async fn call_redis(
        &self,
        conns: &[tokio::sync::Mutex<redis::Conn>],
        n: u64,
        rng: &mut fastrand::Rng,
    ) -> Option<Vec<(Outcome, bool)>> {
        let keys: Vec<String> = (0..self.args.items.max(1))
            .map(|_| format!("{}:{}", self.args.name, self.unique_key(rng)))
            .collect();
        let mut conn = conns[n as usize % conns.len()].lock().await;
        let admitted = conn
            .decide(&keys, self.args.limit, self.args.duration_ms, 1)
            .await
            .ok()?;
        Some(
            admitted
                .into_iter()
                .map(|a| {
                    let outcome = if a {
                        Outcome::Admitted
                    } else {
                        Outcome::Refused
                    };
                    (outcome, false)
                })
                .collect(),
        )
    }
}

pub async fn run(args: BenchArgs) -> CliResult {
    let algorithm =
        pb::Algorithm::from_str_name(&format!("ALGORITHM_{}", args.algorithm.to_uppercase()))
            .ok_or_else(|| format!("--algorithm: unknown algorithm {:?}", args.algorithm))?
            as i32;
    let target = if args.target == "redis" {
        if args.algorithm != "token_bucket" {
            return Err("--algorithm: the redis target runs a token bucket only".into());
        }
        let addr = args.addr.first().ok_or("--addr: one Redis address")?;
        let mut conns = Vec::new();
        for _ in 0..args.concurrency.clamp(1, 1_024) {
            conns.push(tokio::sync::Mutex::new(redis::Conn::connect(addr).await?));
        }
        Target::Redis(conns)
    } else if args.target == "client" {
        if args.items > 1 {
            return Err("--items: the client target decides one check per call".into());
        }
        if args.algorithm != "token_bucket" {
            return Err("--algorithm: the client target sends inline token buckets".into());
        }
        let client = sluice_client::Client::builder(args.addr.iter().cloned())
            .deadline(Duration::from_millis(100))
            .build()
            .map_err(|e| format!("--addr: {e}"))?;
        Target::Client(client)
    } else {
        let mut clients = Vec::new();
        for addr in &args.addr {
            clients.push(RateLimiterClient::new(connect(addr).await?));
        }
        Target::Sluice(clients)
    };
    let run = Arc::new(Run {
        keys: Keys::new(&args),
        target,
        tally: Tally::default(),
        latency: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
        late: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
        decide_ns: Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3)?),
        in_process_ns: Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3)?),
        algorithm,
        args,
    });
    let started = Instant::now();
    let end = started + run.args.duration;
    let progress = tokio::spawn(progress(run.clone(), started, end));
    match run.args.rate {
        None => closed_loop(&run, end).await,
        Some(rate) => open_loop(&run, rate, started, end).await,
    }
    progress.abort();
    let took = started.elapsed();
    if let Target::Client(client) = &run.target {
        // What was spent in process reaches the node before the run ends.
        client.flush_allotments(Duration::from_secs(5)).await;
    }
    report(&run, took);
    Ok(())
}

async fn closed_loop(run: &Arc<Run>, end: Instant) {
    let callers: Vec<_> = (0..run.args.concurrency.max(1))
        .map(|c| {
            let run = run.clone();
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(c as u64);
                let mut n = c as u64;
                while Instant::now() < end {
                    run.call(n, Instant::now(), &mut rng).await;
                    n += 1;
                }
            })
        })
        .collect();
    for c in callers {
        let _ = c.await;
    }
}

async fn open_loop(run: &Arc<Run>, rate: f64, started: Instant, end: Instant) {
    // The schedule runs on its own OS thread with std's sleep (microsecond
    // precision): tokio's timer ticks in milliseconds and would release
    // calls in bursts, adding its own lateness to every latency. A schedule
    // that spun on the runtime instead (yielding while the next call was
    // under 2 ms away) was tried and measured worse: it kept the runtime's
    // one worker from parking on the I/O driver, so responses were read
    // late (benches/README.md, "A cheaper generator").
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(run.args.concurrency.max(1)));
    let runtime = tokio::runtime::Handle::current();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let run = run.clone();
    let scheduler = std::thread::spawn(move || {
        let mut n = 0u64;
        loop {
            let intended = started + interval.mul_f64(n as f64);
            if intended >= end {
                break;
            }
            if let Some(wait) = intended.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let (run, in_flight, done) = (run.clone(), in_flight.clone(), done_tx.clone());
            runtime.spawn(async move {
                run.record_late(intended);
                // Waiting for a permit delays the call but not its intended
                // start, so the wait counts in its latency.
                if let Ok(_permit) = in_flight.acquire_owned().await {
                    let mut rng = fastrand::Rng::with_seed(n);
                    run.call(n, intended, &mut rng).await;
                }
                let _ = done.send(());
            });
            n += 1;
        }
        n
    });
    let scheduled = tokio::task::spawn_blocking(move || scheduler.join().unwrap_or(0))
        .await
        .unwrap_or(0);
    for _ in 0..scheduled {
        if done_rx.recv().await.is_none() {
            break;
        }
    }
}

async fn progress(run: Arc<Run>, started: Instant, end: Instant) {
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while Instant::now() < end {
        tick.tick().await;
        let calls = run.tally.calls.load(Ordering::Relaxed);
        let p99 = run
            .latency
            .lock()
            .map(|h| h.value_at_quantile(0.99))
            .unwrap_or(0);
        eprintln!(
            "[{:>4.0}s] {:>9} calls/s  errors {}  unavailable {}  p99 {} µs",
            started.elapsed().as_secs_f64(),
            calls - last,
            run.tally.errors.load(Ordering::Relaxed),
            run.tally.unavailable.load(Ordering::Relaxed),
            p99
        );
        last = calls;
    }
}

fn report(run: &Run, took: Duration) {
    let t = &run.tally;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let h = run.latency.lock().map(|h| h.clone()).ok();
    let q = |p: f64| h.as_ref().map_or(0, |h| h.value_at_quantile(p));
    let late = run.late.lock().map(|h| h.clone()).ok();
    let late_q = |p: f64| late.as_ref().map_or(0, |h| h.value_at_quantile(p));
    let secs = took.as_secs_f64().max(1e-9);
    let summary = serde_json::json!({
        "target": run.args.target,
        "mode": if run.args.rate.is_some() { "open" } else { "closed" },
        "targets": run.args.addr,
        "seconds": secs,
        "concurrency": run.args.concurrency,
        "offered_rate": run.args.rate,
        "items_per_call": run.args.items,
        "keys": run.args.keys,
        "dist": run.args.dist,
        "calls": get(&t.calls),
        "calls_per_s": get(&t.calls) as f64 / secs,
        "decisions": get(&t.decisions),
        "decisions_per_s": get(&t.decisions) as f64 / secs,
        "admitted": get(&t.admitted),
        "refused": get(&t.refused),
        "unavailable": get(&t.unavailable),
        "approximate": get(&t.approximate),
        "errors": get(&t.errors),
        "latency_us": {
            "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999),
            "max": h.as_ref().map_or(0, |h| h.max()),
        },
        // Open loop: the generator's own delay in starting each call.
        "late_us": { "p50": late_q(0.5), "p99": late_q(0.99), "p999": late_q(0.999) },
    });
    let mut summary = summary;
    if let Target::Client(client) = &run.target {
        let d = run.decide_ns.lock().map(|h| h.clone()).ok();
        let dq = |p: f64| d.as_ref().map_or(0, |h| h.value_at_quantile(p));
        let l = run.in_process_ns.lock().map(|h| h.clone()).ok();
        let lq = |p: f64| l.as_ref().map_or(0, |h| h.value_at_quantile(p));
        let a = client.allotment_stats();
        let get_a = |f: fn(&sluice_client::AllotmentStats) -> &AtomicU64| {
            a.map_or(0, |a| f(a).load(Ordering::Relaxed))
        };
        summary["client"] = serde_json::json!({
            "decide_ns": { "p50": dq(0.5), "p99": dq(0.99), "p999": dq(0.999) },
            "in_process_ns": { "p50": lq(0.5), "p99": lq(0.99), "p999": lq(0.999) },
            "in_process_admitted": get_a(|a| &a.local_admitted),
            "in_process_refused": get_a(|a| &a.local_refused),
            "asks": get_a(|a| &a.asks),
            "grants": get_a(|a| &a.grants),
            "granted_tokens": get_a(|a| &a.granted_tokens),
            "reports_sent": get_a(|a| &a.reports_sent),
            "reports_carried": get_a(|a| &a.reports_carried),
            "reports_applied": get_a(|a| &a.reports_applied),
            "reports_duplicate": get_a(|a| &a.reports_duplicate),
            "unreported_hits": get_a(|a| &a.unreported_hits),
            "rpcs": client.stats().calls.load(Ordering::Relaxed),
        });
    }
    if run.args.json {
        println!("{summary}");
        return;
    }
    println!(
        "{} calls ({} decisions) in {:.1} s: {:.0} calls/s, {:.0} decisions/s",
        get(&t.calls),
        get(&t.decisions),
        secs,
        get(&t.calls) as f64 / secs,
        get(&t.decisions) as f64 / secs
    );
    println!(
        "admitted {}  refused {}  unavailable {}  approximate {}  errors {}",
        get(&t.admitted),
        get(&t.refused),
        get(&t.unavailable),
        get(&t.approximate),
        get(&t.errors)
    );
    println!(
        "latency µs{}: p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        if run.args.rate.is_some() {
            " (from intended start)"
        } else {
            ""
        },
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999),
        h.as_ref().map_or(0, |h| h.max())
    );
    if let Some(c) = summary.get("client") {
        println!("client: {c}");
    }
    if run.args.rate.is_some() {
        println!(
            "the generator's own delay in starting a call, µs: p50 {}  p99 {}  p99.9 {}",
            late_q(0.5),
            late_q(0.99),
            late_q(0.999)
        );
    }
}
