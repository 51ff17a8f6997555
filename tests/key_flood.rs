//! A key flood: 10M distinct keys against a node capped at 1M keys.
//!
//! The node is a real process (so its memory is its own, read from
//! /proc), flooded over gRPC in batches while one steady caller keeps
//! checking one key and a warm cohort sits half consumed. Asserted: the
//! node answers every call, keys in memory never exceed the cap, peak
//! memory stays under the stated bound, eviction took the keys closest to
//! fresh (the flood's, 1% consumed) and never the steady key or a warm one,
//! and the steady key was never shed. Its latency, from each check's
//! intended start on a fixed 5 ms schedule, is printed: a benchmark figure
//! (benches/README.md), not an assertion.
//!
//! A second flood is of sliding-log keys, each logging 100 hits, against a
//! node whose byte budget (`limits.max_memory`) is small: asserted, the
//! bytes in memory stay within it, peak memory stays under the budget plus
//! a stated allowance for the rest of the process, and the steady key is
//! never shed or evicted.
//!
//! Ignored by default (about a minute of both cores each); CI runs them as
//! their own stage:
//! `cargo test --release --test key_flood -- --ignored --nocapture`.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{eventually, free_port, inline, under};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const FLOOD_KEYS: u64 = 10_000_000;
const CAP: u64 = 1_000_000;
const BATCH: u64 = 1_000;
const CALLERS: u64 = 4;
const WARM_KEYS: usize = 1_000;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// The steady key starts a tenth used (so it is far from fresh) and its
/// limit lasts 180,000 checks of `STEADY_HITS` — 15 minutes at one check per
/// 5 ms, well past the flood even on a slow machine. (At 200,000 it ran out
/// when the flood took 126 s on a busy machine, and was refused.)
const STEADY_LIMIT: i64 = 2_000_000;
const STEADY_FIRST: i64 = 200_000;
const STEADY_HITS: i64 = 10;
/// Peak resident memory allowed for 1M keys, everything included: issue
/// 21's target (measured 169 MiB: 136 MB of slots, ~10 MB of index, the
/// process's own 13 MiB and the flood's buffers).
const MEMORY_BOUND_MIB: u64 = 192;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmHWM` (peak) and `VmRSS` of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

async fn inspect(admin: &mut common::Admin, name: &str, key: &str) -> Option<pb::KeyState> {
    let r = admin
        .inspect_key(pb::InspectKeyRequest {
            key: Some(pb::KeyRef {
                name: name.into(),
                unique_key: key.into(),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    r.found.then_some(r.state?)
}

/// A node process under test, and where it listens.
struct Node {
    proc: Proc,
    grpc: String,
    http: String,
    admin_addr: std::net::SocketAddr,
    channel: Channel,
}

async fn connect(url: String) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(url).unwrap().connect().await
}

/// Start a node with `env` set (a bound under test), and connect to it.
async fn start_node(env: &[(&str, String)]) -> Node {
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--grpc-addr", &grpc, "--http-addr", &http])
        .env(
            "SLUICE_CLUSTER__GOSSIP_ADDR",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("SLUICE_ADMIN__ADDR", admin_addr.to_string())
        .env("SLUICE_ADMIN__TOKEN", common::ADMIN_TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut proc = Proc(cmd.spawn().expect("sluice starts"));
    // Ready, not merely listening: the gRPC port accepts (in the kernel's
    // backlog) the moment it is bound, before the HTTP port is bound and
    // long before the node turns ready — until then a check is answered
    // UNAVAILABLE (NOT_READY), and the steady caller's first check must be
    // admitted. (Seen in CI: gRPC connected, then `/readyz` was refused.)
    // A refused `/readyz` is a port not bound yet — unless the process died.
    let readyz = format!("http://{http}/readyz");
    eventually("the node ready", Duration::from_secs(20), || {
        if let Some(exit) = proc.0.try_wait().expect("the node's status") {
            panic!("the node exited while starting: {exit}");
        }
        let readyz = readyz.clone();
        async move { matches!(common::try_http_get(&readyz).await, Ok((200, _))) }
    })
    .await;
    let url = format!("http://{grpc}");
    let channel = connect(url).await.unwrap();
    Node {
        proc,
        grpc,
        http,
        admin_addr,
        channel,
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "10M keys, about a minute: CI runs it as its own stage"]
async fn ten_million_keys_against_a_one_million_key_cap() {
    let node = start_node(&[("SLUICE_LIMITS__MAX_KEYS", CAP.to_string())]).await;
    let (pid, channel, http, admin_addr) = (
        node.proc.0.id(),
        node.channel.clone(),
        node.http.clone(),
        node.admin_addr,
    );
    let (baseline_kib, _) = memory_kib(pid);

    // The warm cohort: half of a 100/hour limit consumed each.
    let warm_at = Instant::now();
    let mut client = RateLimiterClient::new(channel.clone());
    let warm: Vec<_> = (0..WARM_KEYS)
        .map(|i| {
            let mut r = inline("warm", &format!("w{i}"), 100, HOUR_MS);
            r.hits = Some(50);
            r
        })
        .collect();
    for chunk in warm.chunks(BATCH as usize) {
        let out = client
            .check(pb::CheckRequest {
                requests: chunk.to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(out.responses.iter().all(under));
    }

    let steady = Steady::start(&node.grpc).await;

    // The flood: 10M distinct keys, 1% of a 100/hour limit each.
    let next = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (next, refused) = (next.clone(), refused.clone());
        let mut client = RateLimiterClient::new(channel.clone());
        callers.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(BATCH, Ordering::Relaxed);
                if first >= FLOOD_KEYS {
                    return;
                }
                let requests = (first..first + BATCH)
                    .map(|i| inline("flood", &format!("f{i}"), 100, HOUR_MS))
                    .collect();
                match client.check(pb::CheckRequest { requests }).await {
                    Ok(r) => {
                        let bad = r.get_ref().responses.iter().filter(|r| !under(r)).count();
                        refused.fetch_add(bad as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        refused.fetch_add(BATCH, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let flood_secs = started.elapsed().as_secs_f64();
    let (mut latencies, shed) = steady.stop();
    let (peak_kib, rss_kib) = memory_kib(pid);

    let (_, metrics) = common::http_get(&format!("http://{http}/metrics")).await;
    let keys = common::metric_sum(&metrics, "sluice_keys");
    let evictions = common::metric_sum(&metrics, "sluice_evictions_total");
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    println!(
        "key flood: {FLOOD_KEYS} keys in {flood_secs:.1} s ({:.0} keys/s), cap {CAP}: \
         keys {keys}, evictions {evictions}; memory peak {} MiB, now {} MiB (baseline {} MiB); \
         steady key: {} checks, latency from intended start p50 {:?}, p99 {:?}, max {:?}, \
         shed {shed}",
        FLOOD_KEYS as f64 / flood_secs,
        peak_kib / 1024,
        rss_kib / 1024,
        baseline_kib / 1024,
        latencies.len(),
        pct(0.50),
        pct(0.99),
        latencies.last().unwrap(),
    );

    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "every flood item was decided"
    );
    assert!(keys <= CAP as f64, "keys in memory {keys} within the cap");
    // Every key past the cap left: evicted, or — where the flood ran
    // slower than a flood key's 36-s refill (under 28k keys/s, a machine
    // busy with other work) — forgotten by the idle sweep once fresh.
    let expired = common::metric_sum(&metrics, "sluice_expired_total");
    assert!(evictions > 0.0, "the flood evicted (evictions {evictions})");
    assert!(
        evictions + expired >= (FLOOD_KEYS + WARM_KEYS as u64 + 1 - CAP) as f64,
        "every key past the cap left (evictions {evictions}, expired {expired})"
    );
    assert!(
        peak_kib / 1024 < MEMORY_BOUND_MIB,
        "peak memory {} MiB within {MEMORY_BOUND_MIB} MiB",
        peak_kib / 1024
    );
    assert_eq!(shed, 0, "the steady key was never shed or refused");
    let mut admin = common::admin_client(admin_addr).await;
    let steady_state = inspect(&mut admin, "steady", "s")
        .await
        .expect("the steady key was never evicted");
    assert_eq!(
        steady_state.hits,
        (STEADY_FIRST + STEADY_HITS * latencies.len() as i64) as u64,
        "the steady key kept every hit (an eviction would have restarted it)"
    );
    for i in 0..WARM_KEYS {
        let state = inspect(&mut admin, "warm", &format!("w{i}"))
            .await
            .unwrap_or_else(|| panic!("warm key w{i} was evicted before fresher keys"));
        // Half used, plus what the real clock refilled since (1 per 36 s).
        let refilled = warm_at.elapsed().as_secs() / 36 + 1;
        assert!(
            (50..=50 + refilled as i64).contains(&state.remaining),
            "w{i}: remaining {}",
            state.remaining
        );
    }
    // The node still answers a new caller.
    assert!(under(
        &client
            .check(pb::CheckRequest {
                requests: vec![inline("after", "k", 1, HOUR_MS)],
            })
            .await
            .unwrap()
            .into_inner()
            .responses[0]
    ));
}

fn steady_check(hits: i64) -> pb::CheckRequest {
    let mut r = inline("steady", "s", STEADY_LIMIT, DAY_MS);
    r.hits = Some(hits);
    pb::CheckRequest { requests: vec![r] }
}

/// The steady caller, on its own connection: 10 hits of 2,000,000 a day
/// every 5 ms, after a first 200,000 (so it is never close to fresh, and
/// never near its limit within the test). On its own thread and runtime,
/// so what is measured is the node, not this process's scheduler busy
/// building the flood's batches.
struct Steady {
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<Duration>, u64)>,
}

impl Steady {
    /// Start it; returns once its first check has landed (before a flood).
    async fn start(grpc: &str) -> Steady {
        let done = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let thread = {
            let done = done.clone();
            let url = format!("http://{grpc}");
            // Named, so a scheduler trace (`perf sched`) can tell it apart.
            std::thread::Builder::new()
                .name("steady".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let mut client = RateLimiterClient::new(connect(url).await.unwrap());
                        let first = client.check(steady_check(STEADY_FIRST)).await.unwrap();
                        assert!(under(&first.get_ref().responses[0]));
                        let _ = started_tx.send(());
                        let (mut latencies, mut shed) = (Vec::new(), 0u64);
                        // One check every 5 ms on a fixed schedule, each timed
                        // from its *intended* start (start + n × 5 ms), as
                        // `sluice bench` does: a check that stalls delays the
                        // ones after it, and timing those from when they finally
                        // went out (or skipping the missed slots) would hide the
                        // stall — the checks that should have been sent during
                        // it would never be timed. Late slots are not skipped:
                        // their checks go at once, and their latency includes
                        // how late they started. std's sleep (microseconds; this
                        // thread has nothing else to run) keeps tokio's
                        // millisecond timer out of the figure.
                        let (schedule, period) = (Instant::now(), Duration::from_millis(5));
                        for n in 0u32.. {
                            if done.load(Ordering::Relaxed) {
                                break;
                            }
                            let intended = schedule + period * n;
                            if let Some(wait) = intended.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                            let r = client.check(steady_check(STEADY_HITS)).await;
                            latencies.push(intended.elapsed());
                            match r {
                                Ok(r) if under(&r.get_ref().responses[0]) => {}
                                _ => shed += 1,
                            }
                        }
                        (latencies, shed)
                    })
                })
                .expect("the steady thread starts")
        };
        tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(20)))
            .await
            .unwrap()
            .expect("the steady caller started");
        Steady { done, thread }
    }

    /// Stop it: its latencies and how many of its checks were not admitted.
    fn stop(self) -> (Vec<Duration>, u64) {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Sliding-log flood keys: each logs `LOG_HITS` hits (one entry each, a
/// 128-slot queue: ~2.4 KB with its entry) of a 10,000 limit — 1% used, so
/// closer to fresh than the steady key (10%) and evicted first.
const LOG_KEYS: u64 = 6_000;
const LOG_HITS: u64 = 100;
const LOG_LIMIT: i64 = 10_000;
/// The byte budget: the 6,000 keys would need ~14 MB, 3.4× it. (40,000
/// keys took 312 s in release: a key of this flood is evicted ~16 times
/// while it fills, each eviction sampling the table; 6,000 keep the stage
/// short and the budget still far exceeded.)
const LOG_BUDGET_MIB: u64 = 4;
/// Peak resident memory allowed beyond the budget: the process at start
/// (~20-30 MiB), the hash table's spare slots, gRPC buffers for the
/// callers' batches, and the allocator's slack.
const LOG_ALLOWANCE_MIB: u64 = 64;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "600k logged hits, about 35 s in release: CI runs it as its own stage"]
async fn sliding_log_flood_stays_within_the_memory_budget() {
    let budget = LOG_BUDGET_MIB << 20;
    let node = start_node(&[("SLUICE_LIMITS__MAX_MEMORY", format!("{LOG_BUDGET_MIB}MiB"))]).await;
    let pid = node.proc.0.id();
    let (baseline_kib, _) = memory_kib(pid);
    let steady = Steady::start(&node.grpc).await;

    // Each batch: 10 keys, 100 checks of one hit each (decided one after
    // another, so each is its own log entry).
    let keys_per_batch = BATCH / LOG_HITS;
    let next = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (next, refused) = (next.clone(), refused.clone());
        let mut client = RateLimiterClient::new(node.channel.clone());
        callers.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(keys_per_batch, Ordering::Relaxed);
                if first >= LOG_KEYS {
                    return;
                }
                let requests = (first..first + keys_per_batch)
                    .flat_map(|i| {
                        let mut r = inline("logflood", &format!("l{i}"), LOG_LIMIT, HOUR_MS);
                        r.algorithm = pb::Algorithm::SlidingWindowLog as i32;
                        std::iter::repeat_n(r, LOG_HITS as usize)
                    })
                    .collect();
                match client.check(pb::CheckRequest { requests }).await {
                    Ok(r) => {
                        let bad = r.get_ref().responses.iter().filter(|r| !under(r)).count();
                        refused.fetch_add(bad as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        refused.fetch_add(BATCH, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for c in callers {
        c.await.unwrap();
    }
    let flood_secs = started.elapsed().as_secs_f64();
    let (latencies, shed) = steady.stop();
    let (peak_kib, rss_kib) = memory_kib(pid);

    let (_, metrics) = common::http_get(&format!("http://{}/metrics", node.http)).await;
    let bytes = common::metric_sum(&metrics, "sluice_memory_bytes");
    let keys = common::metric_sum(&metrics, "sluice_keys");
    let for_memory = common::metric_sum(&metrics, "sluice_memory_evictions_total");
    println!(
        "sliding-log flood: {} hits on {LOG_KEYS} keys in {flood_secs:.1} s, budget {LOG_BUDGET_MIB} MiB: \
         {bytes} bytes in {keys} keys, {for_memory} evicted for memory; memory peak {} MiB, \
         now {} MiB (baseline {} MiB); steady key: {} checks, shed {shed}",
        LOG_KEYS * LOG_HITS,
        peak_kib / 1024,
        rss_kib / 1024,
        baseline_kib / 1024,
        latencies.len(),
    );
    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "every flood hit was admitted"
    );
    assert!(
        bytes > 0.0 && bytes <= budget as f64,
        "bytes in memory {bytes} within the budget {budget}"
    );
    assert!(
        metrics.contains(&format!(
            "sluice_resource_limit{{resource=\"max_memory_bytes\"}} {budget}"
        )),
        "the budget is published"
    );
    // The flood needed ~24x the budget: most of its keys were evicted, and
    // for bytes, not for the key count.
    assert!(
        for_memory >= (LOG_KEYS / 2) as f64,
        "evicted for memory: {for_memory}"
    );
    assert!(
        peak_kib / 1024 < LOG_BUDGET_MIB + LOG_ALLOWANCE_MIB,
        "peak memory {} MiB within the budget {LOG_BUDGET_MIB} MiB + {LOG_ALLOWANCE_MIB} MiB",
        peak_kib / 1024
    );
    assert_eq!(shed, 0, "the steady key was never shed or refused");
    let mut admin = common::admin_client(node.admin_addr).await;
    let steady_state = inspect(&mut admin, "steady", "s")
        .await
        .expect("the steady key was never evicted");
    assert_eq!(
        steady_state.hits,
        (STEADY_FIRST + STEADY_HITS * latencies.len() as i64) as u64,
        "the steady key kept every hit (an eviction would have restarted it)"
    );
}
