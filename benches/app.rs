//! What an app pays per decision through its client library (issue 20's
//! "what an app really sees" row): `--tasks` concurrent tasks in one
//! process, each deciding one key at a time in a closed loop, through
//!
//! - `sluice`: `sluice-client` to one address, with `--batching N` (0: one
//!   `Check` call per decision), its calls on a `CheckStream` or, with
//!   `--streams 0`, unary; or
//! - `redis`: redis-rs's `MultiplexedConnection` (one connection, requests
//!   of all tasks pipelined on it automatically) running the token-bucket
//!   Lua script `sluice bench --target redis` runs, by `EVALSHA`.
//!
//! Prints one JSON object: decisions, the measuring window, this process's
//! CPU and the server's (`--server-pid`, from `/proc` at the window's two
//! ends: setup and connection are not counted), closed-loop latency
//! percentiles. `benches/app.py` runs it against both servers, pinned and
//! alternated. Not a criterion bench: it measures two processes.
//!
//! `cargo bench --bench app -- --target sluice --addr 127.0.0.1:8081 --server-pid N`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use sluice_client::{Check, Client, Limit};

struct Args {
    target: String,
    addr: String,
    server_pid: u32,
    tasks: usize,
    seconds: f64,
    keys: u64,
    batching: usize,
    /// `sluice-client`'s `CheckStream` (1, its default) or unary calls (0).
    streams: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        target: "sluice".into(),
        addr: String::new(),
        server_pid: 0,
        tasks: 64,
        seconds: 4.0,
        keys: 10_000,
        batching: 0,
        streams: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // `cargo bench` adds `--bench`; it means nothing here.
        if flag == "--bench" {
            continue;
        }
        let value = it.next().ok_or(format!("{flag}: needs a value"))?;
        let number = |what: &str| -> Result<u64, String> {
            value
                .parse()
                .map_err(|_| format!("{what}: not a whole number: {value:?}"))
        };
        match flag.as_str() {
            "--target" => args.target = value.clone(),
            "--addr" => args.addr = value.clone(),
            "--server-pid" => args.server_pid = number("--server-pid")? as u32,
            "--tasks" => args.tasks = number("--tasks")?.clamp(1, 4_096) as usize,
            "--seconds" => {
                args.seconds = value
                    .parse()
                    .map_err(|_| format!("--seconds: not a number: {value:?}"))?
            }
            "--keys" => args.keys = number("--keys")?.max(1),
            "--batching" => args.batching = number("--batching")? as usize,
            "--streams" => args.streams = number("--streams")? != 0,
            _ => return Err(format!("{flag}: unknown flag")),
        }
    }
    if args.addr.is_empty() || args.server_pid == 0 {
        return Err("--addr and --server-pid are required".into());
    }
    if args.target != "sluice" && args.target != "redis" {
        return Err(format!("--target: sluice or redis, not {:?}", args.target));
    }
    Ok(args)
}

/// utime + stime of `pid`, in seconds; an error when it cannot be read (a
/// server gone is a failed run, never a run that cost nothing).
fn cpu_seconds(pid: &str) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or(format!("/proc/{pid}/stat: no field {i}"))
    };
    // SAFETY: sysconf reads a constant of the running kernel.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// One decision: `Some(admitted)`, or `None` when the target did not decide.
trait Decide: Clone + Send + Sync + 'static {
    fn decide(&self, key: u64) -> impl Future<Output = Option<bool>> + Send;
}

#[derive(Clone)]
struct Sluice(Client);

impl Decide for Sluice {
    async fn decide(&self, key: u64) -> Option<bool> {
        let check = Check {
            name: "bench".into(),
            key: format!("k{key}"),
            hits: 1,
            limit: Limit::Inline {
                limit: 1_000,
                per: Duration::from_secs(1),
            },
            tiered: false,
        };
        let d = self.0.check(&check).await.ok()?;
        matches!(d.source, sluice_client::Source::Sluice { .. }).then_some(d.allowed)
    }
}

#[derive(Clone)]
struct Redis {
    conn: redis::aio::MultiplexedConnection,
    script: Arc<redis::Script>,
}

impl Decide for Redis {
    async fn decide(&self, key: u64) -> Option<bool> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_micros() as u64;
        let mut conn = self.conn.clone();
        let (admitted, _left): (i64, i64) = self
            .script
            .key(format!("bench:k{key}"))
            .arg(now)
            .arg(1_000)
            .arg(1_000_000)
            .arg(1)
            .invoke_async(&mut conn)
            .await
            .ok()?;
        Some(admitted == 1)
    }
}

#[derive(Default)]
struct Tally {
    decided: AtomicU64,
    undecided: AtomicU64,
}

async fn run<D: Decide>(target: D, args: &Args) -> Result<serde_json::Value, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for t in 0..args.tasks {
        let (target, stop, measuring, tally) = (
            target.clone(),
            stop.clone(),
            measuring.clone(),
            tally.clone(),
        );
        let keys = args.keys;
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(t as u64);
            let mut latency = Histogram::<u64>::new(3).expect("3 significant figures");
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let decided = target.decide(rng.u64(0..keys)).await.is_some();
                if !measuring.load(Ordering::Relaxed) {
                    continue;
                }
                let _ = latency.record(start.elapsed().as_micros().max(1) as u64);
                let counter = if decided {
                    &tally.decided
                } else {
                    &tally.undecided
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            latency
        }));
    }
    // A short warm-up (connections made, scripts loaded), then the window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = args.server_pid.to_string();
    let (server0, app0, t0) = (cpu_seconds(&pid)?, cpu_seconds("self")?, Instant::now());
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let (server1, app1, seconds) = (cpu_seconds(&pid)?, cpu_seconds("self")?, t0.elapsed());
    if server1 <= server0 {
        return Err(format!("--server-pid {pid} used no CPU: it is not serving"));
    }
    stop.store(true, Ordering::Relaxed);
    let mut latency = Histogram::<u64>::new(3).expect("3 significant figures");
    for task in tasks {
        if let Ok(h) = task.await {
            let _ = latency.add(h);
        }
    }
    Ok(serde_json::json!({
        "target": args.target,
        "batching": args.batching,
        "streams": args.streams,
        "tasks": args.tasks,
        "seconds": seconds.as_secs_f64(),
        "decisions": tally.decided.load(Ordering::Relaxed),
        "undecided": tally.undecided.load(Ordering::Relaxed),
        "server_cpu_s": server1 - server0,
        "app_cpu_s": app1 - app0,
        "p50_us": latency.value_at_quantile(0.5),
        "p99_us": latency.value_at_quantile(0.99),
        "p999_us": latency.value_at_quantile(0.999),
    }))
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("app bench: {e}");
            std::process::exit(2);
        }
    };
    // An app's runtime: tokio's default, multi-threaded.
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let out = runtime.block_on(async {
        if args.target == "redis" {
            let client = redis::Client::open(format!("redis://{}/", args.addr))
                .map_err(|e| format!("--addr: {e}"))?;
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| format!("--addr {}: {e}", args.addr))?;
            let script = Arc::new(redis::Script::new(sluice::cli::REDIS_TOKEN_BUCKET_SCRIPT));
            run(Redis { conn, script }, &args).await
        } else {
            let mut builder = Client::builder([args.addr.clone()])
                // Throughput, not the fallback: a slow answer still counts.
                .deadline(Duration::from_secs(2));
            builder = builder.batching(args.batching).streams(args.streams);
            let client = builder.build().map_err(|e| format!("--addr: {e}"))?;
            run(Sluice(client), &args).await
        }
    });
    match out {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("app bench: {e}");
            std::process::exit(1);
        }
    }
}
