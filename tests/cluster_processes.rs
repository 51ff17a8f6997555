//! Three real `sluice serve` processes on loopback: they form one cluster
//! (as `sluice cluster status` shows), enforce one limit exactly whichever
//! process is asked, drop a SIGTERMed member within 1 s and a SIGKILLed one
//! within a few seconds (the measured figures are printed).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, free_port, inline, under};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

struct Proc {
    child: Child,
    grpc: String,
    http: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port for a child process to bind, for TCP and UDP
/// alike. Taken below the kernel's ephemeral range (32768 and up), so no
/// port the kernel hands out elsewhere can take it between this check and
/// the child's bind; a counter keeps the tests of this binary, which run in
/// parallel, apart. (Found by CI: two ports picked by binding port 0 and
/// releasing it collided, "Address already in use".)
fn spawn(i: usize, gossip: u16, seeds: &[u16]) -> Proc {
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--node-id",
        &format!("proc-{i}"),
        "--grpc-addr",
        &grpc,
    ])
    .args(["--http-addr", &http])
    .env("SLUICE_CLUSTER__GOSSIP_ADDR", format!("127.0.0.1:{gossip}"))
    .env("SLUICE_CLUSTER__SECRET", "process-test-secret")
    .env("SLUICE_CLUSTER__GOSSIP_INTERVAL", "100ms")
    // Generous for a loaded 2-core CI machine; the default is 10 ms.
    .env("SLUICE_CLUSTER__FORWARD_TIMEOUT", "250ms")
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if !seeds.is_empty() {
        let list: Vec<String> = seeds.iter().map(|s| format!("\"127.0.0.1:{s}\"")).collect();
        cmd.env("SLUICE_CLUSTER__SEEDS", format!("[{}]", list.join(",")));
    }
    Proc {
        child: cmd.spawn().expect("sluice starts"),
        grpc,
        http,
    }
}

/// `sluice cluster status --json` against `addr`.
fn status(addr: &str) -> Option<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["cluster", "status", "--json", "--addr", addr])
        // Admin calls are signed with the cluster secret.
        .env("SLUICE_CLUSTER__SECRET", "process-test-secret")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

fn in_ring(addr: &str) -> Vec<String> {
    status(addr)
        .map(|s| common::ring_ids(&s))
        .unwrap_or_default()
}

async fn rings_are(procs: &[&Proc], want: &[&str], what: &str, within: Duration) -> Duration {
    let started = Instant::now();
    eventually(what, within, || async {
        procs.iter().all(|p| in_ring(&p.grpc) == want)
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_processes_enforce_one_limit() {
    let g0 = free_port();
    let p0 = spawn(0, g0, &[]);
    let p1 = spawn(1, free_port(), &[g0]);
    let p2 = spawn(2, free_port(), &[g0]);
    let all = ["proc-0", "proc-1", "proc-2"];
    rings_are(
        &[&p0, &p1, &p2],
        &all,
        "three ready members",
        Duration::from_secs(30),
    )
    .await;

    // Every member is ready and owns about a third of the key space.
    let s = status(&p1.grpc).unwrap();
    for m in s["members"].as_array().unwrap() {
        assert_eq!(m["state"], "ready", "{m}");
        let share = m["ring_share"].as_f64().unwrap();
        assert!((0.25..0.42).contains(&share), "{m}");
    }
    assert_eq!(s["cluster_size"], 3);

    let mut clients = Vec::new();
    for p in [&p0, &p1, &p2] {
        clients.push(
            RateLimiterClient::connect(format!("http://{}", p.grpc))
                .await
                .unwrap(),
        );
    }
    // 50 per year: real time passes in this test, and a limit per minute
    // would refill a token every 1.2 s of it.
    let year_ms = 365 * 24 * 3_600 * 1_000;
    let mut admitted = 0;
    for i in 0..150 {
        let r = clients[i % 3]
            .check(pb::CheckRequest {
                requests: vec![inline("proc", "one-key", 50, year_ms)],
            })
            .await
            .unwrap()
            .into_inner()
            .responses
            .remove(0);
        assert!(r.error.is_none() && !r.approximate, "{r:?}");
        assert_ne!(r.status, pb::Status::Unavailable as i32, "{r:?}");
        admitted += usize::from(under(&r));
    }
    assert_eq!(admitted, 50, "one limit across three processes");

    // SIGTERM: the member leaves gracefully, out of every ring within 1 s.
    let started = Instant::now();
    let mut p2 = p2;
    let _ = Command::new("kill")
        .args(["-TERM", &p2.child.id().to_string()])
        .status();
    rings_are(
        &[&p0, &p1],
        &["proc-0", "proc-1"],
        "proc-2 gone after SIGTERM",
        Duration::from_secs(5),
    )
    .await;
    let left = started.elapsed();
    println!("SIGTERM: out of every ring after {left:?}");
    assert!(
        left < Duration::from_secs(1),
        "graceful leave took {left:?}"
    );
    let exit = p2.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM exits cleanly: {exit:?}");

    // SIGKILL: found dead by the failure detector.
    let mut p1 = p1;
    let started = Instant::now();
    p1.child.kill().unwrap();
    let took = rings_are(
        &[&p0],
        &["proc-0"],
        "proc-1 gone after SIGKILL",
        Duration::from_secs(30),
    )
    .await;
    println!(
        "SIGKILL: out of the ring after {:?} (gossip every 100 ms)",
        started.elapsed().max(took)
    );
    drop(p0);
}

/// Owner kill -9 under load, `local_share`, keys already at 90% of their
/// limit: no errors, over-admission within 10%.
///
/// Bound: while the dead owner is undetected, each of the N−1 surviving
/// edges spends at most its 1/N lease of the `r` it last saw; the new owner
/// then starts from the `r` it saw itself. So at most (N−1)/N × r over:
/// with r = 10% of the limit, 6.7% ≤ 10%.
#[tokio::test(flavor = "multi_thread")]
async fn owner_kill_9_near_the_limit_over_admits_at_most_ten_percent() {
    let g0 = free_port();
    let procs = [
        spawn(0, g0, &[]),
        spawn(1, free_port(), &[g0]),
        spawn(2, free_port(), &[g0]),
    ];
    let ids = ["proc-0", "proc-1", "proc-2"];
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &ids,
        "three ready members",
        Duration::from_secs(30),
    )
    .await;
    // Keys owned by every node (the ring is a pure function of the ids).
    let keys = common::load::keys_owned_by(&ids, "kill", 3);
    let limit: i64 = 30;
    let year_ms = 365 * 24 * 3_600 * 1_000;
    let mut clients = Vec::new();
    for p in &procs {
        clients.push(
            RateLimiterClient::connect(format!("http://{}", p.grpc))
                .await
                .unwrap(),
        );
    }
    #[derive(Default)]
    struct Tally {
        admitted: std::collections::BTreeMap<String, i64>,
        offered: std::collections::BTreeMap<String, i64>,
        errors: usize,
        approximate: usize,
    }
    impl Tally {
        fn add(&mut self, got: Vec<(String, Result<pb::RateLimitResponse, tonic::Status>)>) {
            for (k, r) in got {
                *self.offered.entry(k.clone()).or_default() += 1;
                match r {
                    Ok(a) if a.error.is_none() && a.status != pb::Status::Unavailable as i32 => {
                        *self.admitted.entry(k).or_default() += i64::from(under(&a));
                        self.approximate += usize::from(a.approximate);
                    }
                    _ => self.errors += 1,
                }
            }
        }
    }
    /// One request per key, round-robin over the first `alive` clients.
    async fn round(
        clients: &[RateLimiterClient<tonic::transport::Channel>],
        keys: &[String],
        alive: usize,
        step: usize,
        year_ms: i64,
    ) -> Vec<(String, Result<pb::RateLimitResponse, tonic::Status>)> {
        let mut got = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let mut c = clients[(step + i) % alive].clone();
            let r = c
                .check(pb::CheckRequest {
                    requests: vec![inline("kill", k, 30, year_ms)],
                })
                .await
                .map(|r| r.into_inner().responses.remove(0));
            got.push((k.clone(), r));
        }
        got
    }
    let mut t = Tally::default();
    // 27 of 30 consumed through every node: 10% left everywhere.
    for step in 0..27 {
        t.add(round(&clients, &keys, 3, step, year_ms).await);
    }
    assert!(t.admitted.values().all(|&a| a == 27), "{:?}", t.admitted);
    // kill -9 the third owner, and keep offering through the survivors
    // while its death is detected and after.
    let mut procs = procs;
    procs[2].child.kill().unwrap();
    let started = Instant::now();
    let mut step = 0;
    while started.elapsed() < Duration::from_secs(4) || t.offered.values().any(|&n| n < 3 * limit) {
        t.add(round(&clients, &keys, 2, step, year_ms).await);
        step += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (admitted, errors, approximate) = (&t.admitted, t.errors, t.approximate);
    let total: i64 = admitted.values().sum();
    let reference = limit * keys.len() as i64;
    let over = total as f64 / reference as f64 - 1.0;
    println!(
        "owner kill -9 at 90%: admitted {total} of reference {reference}: over-admission {:.1}% (bound 10%), {approximate} approximate, {errors} errors; by key {admitted:?}",
        over * 100.0
    );
    assert_eq!(errors, 0);
    assert!(over <= 0.10, "over-admission {over}");
}

async fn channel(p: &Proc) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", p.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn metric(p: &Proc, name: &str) -> f64 {
    let (_, text) = common::http_get(&format!("http://{}/metrics", p.http)).await;
    common::metric_sum(&text, name)
}

/// Three processes that seed each other (so any of them can restart).
async fn three(gossip: [u16; 3]) -> Vec<Proc> {
    let procs: Vec<Proc> = (0..3).map(|i| spawn(i, gossip[i], &gossip)).collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &["proc-0", "proc-1", "proc-2"],
        "three ready members",
        Duration::from_secs(30),
    )
    .await;
    procs
}

/// Rolling restart of all three processes with SIGTERM under load (issue 6,
/// row 1): each leaves — announces `leaving`, hands its keys to their new
/// owners — and comes back, pulling its keys again. Load goes to the
/// processes not terminating, as a load balancer drops a terminating
/// endpoint. No errors, over-admission within 2%.
#[tokio::test(flavor = "multi_thread")]
async fn rolling_restart_with_sigterm_keeps_counts() {
    use common::load::{Load, keys_owned_by};
    const LIMIT: i64 = 200;
    let gossip = [free_port(), free_port(), free_port()];
    let mut procs = three(gossip).await;
    let ids = ["proc-0", "proc-1", "proc-2"];
    let mut targets = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        targets.push((ids[i].to_string(), channel(p).await));
    }
    let keys = keys_owned_by(&ids, "rolling", 3);
    let load = Load::start("rolling", keys, LIMIT, Duration::from_millis(10), targets);
    load.until_offered(LIMIT / 4).await;
    let mut at = Vec::new();
    for i in 0..3 {
        at.push(load.snapshot().min_offered());
        load.drop_target(ids[i]).await;
        let _ = Command::new("kill")
            .args(["-TERM", &procs[i].child.id().to_string()])
            .status();
        let exit = procs[i].child.wait().unwrap();
        assert!(exit.success(), "{} exits cleanly: {exit:?}", ids[i]);
        procs[i] = spawn(i, gossip[i], &gossip);
        rings_are(
            &procs.iter().collect::<Vec<_>>(),
            &ids,
            "the restarted member back in every ring",
            Duration::from_secs(30),
        )
        .await;
        load.add_target(ids[i], channel(&procs[i]).await);
    }
    let tally = load.finish(3 * LIMIT).await;
    let over = tally.over_admission(LIMIT);
    println!(
        "rolling restart via SIGTERM (restarts began at {at:?} offered per key): {}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    assert!(over <= 0.02, "over-admission {over}");
}

/// Owner kill -9 with replicas on, under load mid-way through the keys'
/// limits (issue 6, row 3): the owner's successor holds a replica at most
/// the replication lag behind, and takes over from it. No errors;
/// over-admission within lag × rate on the dead owner's keys, and 5%.
#[tokio::test(flavor = "multi_thread")]
async fn owner_kill_9_with_replicas_loses_at_most_the_lag() {
    use common::load::{Load, keys_owned_by};
    const LIMIT: i64 = 200;
    const KEYS_PER_NODE: usize = 3;
    let gossip = [free_port(), free_port(), free_port()];
    let mut procs = three(gossip).await;
    let ids = ["proc-0", "proc-1", "proc-2"];
    let mut targets = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        targets.push((ids[i].to_string(), channel(p).await));
    }
    let keys = keys_owned_by(&ids, "replica", KEYS_PER_NODE);
    let started = Instant::now();
    let load = Load::start("replica", keys, LIMIT, Duration::from_millis(10), targets);
    load.until_offered(LIMIT / 2).await;
    // Measured just before the kill, from the victim itself.
    let lag = Duration::from_micros(
        metric(&procs[2], "sluice_replication_lag_microseconds").await as u64,
    );
    let rate = load.snapshot().min_offered() as f64 / started.elapsed().as_secs_f64();
    load.drop_target("proc-2").await;
    procs[2].child.kill().unwrap();
    let killed_at = load.snapshot().min_offered();
    let tally = load.finish(3 * LIMIT).await;
    let over = tally.over_admission(LIMIT);
    let admitted: i64 = tally.admitted.values().sum();
    let excess = admitted - LIMIT * tally.offered.len() as i64;
    // Per key of the dead owner: what arrived within the worst lag — the
    // gauge is the last round's; a change waits up to one round
    // (`replicate_interval`, 20 ms) before it is sent — plus the one
    // request a round may be cut in the middle of. (Sampling the gauge
    // alone was flaky: 5 over against a bound of 3 once.)
    let worst = lag + Duration::from_millis(20);
    let bound = KEYS_PER_NODE as f64 * (worst.as_secs_f64() * rate).ceil().max(1.0);
    println!(
        "owner kill -9 with replicas (at {killed_at} offered per key; replication lag {lag:?} (+20 ms round), {rate:.0} requests/s per key, bound {bound:.0} over): {}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    assert!(excess as f64 <= bound, "{excess} over, bound {bound}");
    assert!(over <= 0.05, "over-admission {over}");
}
